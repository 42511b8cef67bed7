"""On PYTHONPATH, makes `import matplotlib` fail in each process, as without the extra `plot`."""

import sys

sys.modules["matplotlib"] = None
