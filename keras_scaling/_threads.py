"""Running a function outside the training strategy's scope."""

import threading


def run_outside_strategy(function, name):
    """Returns `function()` run in a thread of its own, under the default strategy, re-raising its error.

    A strategy's scope and its all-reduce groups are thread-local.
    """
    result = {}

    def run():
        try:
            result["value"] = function()
        except BaseException as error:
            result["error"] = error

    thread = threading.Thread(target=run, name=f"keras_scaling-{name}")
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]
    return result["value"]
