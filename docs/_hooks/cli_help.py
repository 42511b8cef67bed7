"""mkdocs hook: replaces `<!-- cli-help: COMMAND -->` by `keras-scaling COMMAND --help`.

The command-line reference is generated from the parser itself, so it cannot
drift from the program.
"""

import contextlib
import io
import os
import re

_MARKER = re.compile(r"^<!-- cli-help: *([a-z-]*) *-->$", re.MULTILINE)
# A fixed width, so the page does not depend on the terminal that builds it.
_COLUMNS = "88"


def _help(command):
    os.environ["COLUMNS"] = _COLUMNS
    from keras_scaling.cli import main

    output = io.StringIO()
    argv = [command, "--help"] if command else ["--help"]
    with contextlib.redirect_stdout(output):
        status = main(argv)
    if status != 0:
        raise RuntimeError(f"keras-scaling {' '.join(argv)} exited with {status}")
    return output.getvalue().rstrip()


def on_page_markdown(markdown, page, config, files):
    return _MARKER.sub(lambda match: f"```text\n{_help(match.group(1))}\n```", markdown)
