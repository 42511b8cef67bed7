"""Fixtures of the command-line tests."""

import os

import pytest


@pytest.fixture(scope="session")
def env_without_matplotlib(tmp_path_factory):
    """The environment of a subprocess (and its children) where `import matplotlib` fails.

    As on a machine without the extra `keras-scaling[plot]`: Keras, which
    imports matplotlib when it can, carries on without it.
    """
    directory = tmp_path_factory.mktemp("without_matplotlib")
    (directory / "sitecustomize.py").write_text(
        "import sys\n\nsys.modules['matplotlib'] = None  # `import matplotlib` raises\n"
    )
    path = os.pathsep.join(filter(None, [str(directory), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path}
