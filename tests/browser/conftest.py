"""The browser tests run only when asked for by path (`make test-browser`).

`make test` runs `pytest tests`: there they are deselected, since they need
Chromium and Playwright (`make test-browser` installs both) and take minutes.
"""

import os

_HERE = os.path.dirname(os.path.abspath(__file__))


def _asked_for(config):
    for arg in config.args:
        path = os.path.abspath(arg.split("::")[0])
        if path == _HERE or path.startswith(_HERE + os.sep):
            return True
    return False


def pytest_collection_modifyitems(config, items):
    if _asked_for(config):
        return
    deselected = [item for item in items if str(item.path).startswith(_HERE + os.sep)]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = [item for item in items if item not in deselected]
