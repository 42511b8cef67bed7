"""Running a function outside the training strategy's scope."""

import threading


def run_outside_strategy(function, name):
    """Calls `function()` in a thread of its own and returns its result.

    TensorFlow's strategy scope and its collective all-reduce groups are
    thread-local, so the function runs under the default strategy, however
    deep in a strategy's scope the caller is. Its exception is re-raised here.
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
