"""The fastest settings for a model on its devices, by measurement (docs/guides/tune.md).

The package is callable: `keras_scaling.tune(...)` is `tune.tune(...)`.
"""

import dataclasses
import json
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from keras_scaling import _callable_module, _validation

if TYPE_CHECKING:
    import keras
    import tensorflow as tf

__all__ = ["TuneResult", "TunedSettings", "load", "tune"]

DEFAULT_BUDGET_S = 180.0


@dataclasses.dataclass(frozen=True)
class TunedSettings:
    """Settings read from `tune.json`, as the keyword arguments of the calls they go to.

    Args:
        compile_kwargs: for `model.compile`, such as `{"steps_per_execution": 32}`.
        data_kwargs: for `keras_scaling.data.distribute`, such as
            `{"per_replica_batch_size": 128}`; empty when tune was given
            global batches.
        strategy_kwargs: for `keras_scaling.auto_strategy`.
        samples_per_sec: the measured samples/sec of these settings.
        ratio_to_start: their speed over the start's.
        trains_the_same: False when an allowed knob (per-replica batch)
            changed what is trained.
        cpu_kwargs: for `keras_scaling.use_logical_cpus`, first in the
            process (the number of logical CPUs and their thread pools);
            empty unless the devices are logical CPUs.

    Example:

    ```python
    settings = keras_scaling.tune.TunedSettings(
        compile_kwargs={"steps_per_execution": 32},
        data_kwargs={"per_replica_batch_size": 64},
        strategy_kwargs={},
        samples_per_sec=5000.0,
        ratio_to_start=2.5,
        trains_the_same=True,
    )
    settings.compile_kwargs["steps_per_execution"]   # 32
    ```
    """

    compile_kwargs: dict
    data_kwargs: dict
    strategy_kwargs: dict
    samples_per_sec: float | None
    ratio_to_start: float
    trains_the_same: bool
    cpu_kwargs: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class TuneResult:
    """What `tune` found: the best settings, the record of `tune.json`, and its path.

    Args:
        best: the best settings, a `TunedSettings`.
        record: the dict written to `tune.json` (`start`, `best`, `trials`, `notes`).
        path: where `tune.json` was written, or None.

    Example:

    ```python
    settings = keras_scaling.tune.TunedSettings({}, {}, {}, None, 1.0, True)
    result = keras_scaling.tune.TuneResult(best=settings, record={}, path=None)
    result.best.ratio_to_start   # 1.0
    ```
    """

    best: TunedSettings
    record: dict
    path: str | None

    def __str__(self) -> str:
        from keras_scaling.tune import _report

        return _report.text(self.record) if self.record else "TuneResult()"


def _settings_of(record: dict, which: str) -> TunedSettings:
    entry = record[which]
    settings = entry["settings"]
    return TunedSettings(
        compile_kwargs=dict(settings["compile"]),
        data_kwargs=dict(settings["data"]),
        strategy_kwargs=dict(settings["strategy"]),
        samples_per_sec=entry.get("samples_per_sec"),
        ratio_to_start=float(entry.get("ratio_to_start", 1.0)),
        trains_the_same=bool(entry.get("trains_the_same", True)),
        cpu_kwargs=dict(settings.get("cpu", {})),
    )


def load(path: "str | os.PathLike[str]", which: str = "best") -> TunedSettings:
    """Reads the best settings (or the start's) from a `tune.json`.

    Args:
        path: the file, or the log directory that holds `tune.json`.
        which: `"best"` (default) or `"start"`.

    Returns:
        A `TunedSettings`: `compile_kwargs`, `data_kwargs`,
        `strategy_kwargs` and `cpu_kwargs` go to `model.compile`,
        `keras_scaling.data.distribute`, `keras_scaling.auto_strategy` and
        `keras_scaling.use_logical_cpus`.

    Raises:
        FileNotFoundError: no such file.
        ValueError: the file is not a `tune.json`, or `which` is neither
            `"best"` nor `"start"`.

    Example:

    ```python
    import json
    record = {
        "start": {"samples_per_sec": 2000.0,
                  "settings": {"compile": {"steps_per_execution": 1}, "data": {}, "strategy": {}}},
        "best": {"samples_per_sec": 5000.0, "ratio_to_start": 2.5,
                 "settings": {"compile": {"steps_per_execution": 32}, "data": {}, "strategy": {}}},
    }
    with open("tune.json", "w") as file:
        json.dump(record, file)
    tuned = keras_scaling.tune.load("tune.json")
    tuned.compile_kwargs   # {'steps_per_execution': 32}
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse", **tuned.compile_kwargs)
    ```
    """
    from keras_scaling.tune import _report

    which = _validation.one_of(which, "which", ("best", "start"))
    path = os.fspath(path)
    if os.path.isdir(path):
        path = os.path.join(path, _report.FILE_NAME)
    with open(path, encoding="utf-8") as file:
        try:
            record = json.load(file)
        except json.JSONDecodeError as error:
            raise ValueError(
                f"{path} is not JSON ({error}); pass the tune.json tune wrote"
            ) from None
    try:
        return _settings_of(record, which)
    except (KeyError, TypeError) as error:
        raise ValueError(
            f"{path} is not a tune.json: no {which}.settings with compile, data and "
            f"strategy ({error!r} missing); pass the file keras_scaling.tune wrote"
        ) from None


def tune(
    model: "keras.Model",
    data: Any,
    *,
    per_replica_batch_size: int | None = None,
    data_kwargs: dict | None = None,
    strategy: "tf.distribute.Strategy | None" = None,
    budget_s: float = DEFAULT_BUDGET_S,
    allow: str | Sequence[str] = (),
    log_dir: "str | os.PathLike[str] | None" = None,
    verbose: bool = True,
) -> TuneResult:
    """Finds faster settings for training `model` on `data`, by measurement.

    A change is kept only when its median gain over alternating rounds of real
    `model.fit` calls exceeds the noise and 2%, and the best must beat the start
    by the noise and 5% side by side at the end (the tune guide has the knobs).
    The model trains while it is measured and is put back afterwards. On one
    machine only `keras-scaling tune` measures the all-reduce and the CPU
    thread pools, and here `strategy_kwargs` and `cpu_kwargs` stay empty. Under
    `MultiWorkerMirroredStrategy`, call it on every worker alike: each round's
    figures and the clock are the chief's, so every worker takes the same
    decisions; the all-reduce across workers (`communication`, `bytes_per_pack`)
    is searched too, and only the chief writes `log_dir`.

    Args:
        model: a compiled `keras.Model`, built in `strategy`'s scope.
        data: arrays `(x, y)`, a `tf.data.Dataset` of samples or a
            `keras.utils.PyDataset`, with `per_replica_batch_size` (tune
            builds the pipeline with `keras_scaling.data.distribute` and can
            tune it); or a `tf.data.Dataset` of global batches, used as it is.
        per_replica_batch_size: int, samples per replica per step.
        data_kwargs: dict, more arguments of `keras_scaling.data.distribute`
            (such as `shuffle`), kept in the settings.
        strategy: the `tf.distribute.Strategy`; default the model's.
        budget_s: float, seconds for the whole search (default 180).
        allow: knobs that change training, tried only when named here:
            `"batch"` (the per-replica batch).
        log_dir: str, where to write `tune.json` and the TensorBoard run
            `tune` (Text tab); None writes nothing, nor does a worker other
            than the chief.
        verbose: bool, print the trials, the table and the outcome.

    Returns:
        A `TuneResult`: `.best` (a `TunedSettings`), `.record` (the dict of
        `tune.json`) and `.path`.

    Raises:
        ValueError: a model that is not compiled, an unknown knob in
            `allow`, a budget too small to measure one candidate, or data
            that cannot be batched as asked.

    Example:

    ```python
    import numpy as np
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    x, y = np.zeros((512, 8), "float32"), np.zeros((512, 1), "float32")
    result = keras_scaling.tune(
        model, (x, y), per_replica_batch_size=32, budget_s=15, verbose=False
    )
    sorted(result.best.compile_kwargs)   # ['jit_compile', 'steps_per_execution']
    # Usually larger than 1: a tiny model's step is mostly the loop's cost.
    result.best.compile_kwargs["steps_per_execution"]
    ```
    """
    return _tune(**locals())


def _tune(
    model, data, *, per_replica_batch_size, data_kwargs, strategy, budget_s, allow, log_dir,
    verbose, confirm=True, cpu=None,
):  # fmt: skip
    """`tune`; `cpu` is the process's `use_logical_cpus` settings, `confirm=False` leaves the final side by side to the caller."""
    import tensorflow as tf

    from keras_scaling.devices import is_chief
    from keras_scaling.tune import _candidates, _measure, _report, _search

    budget_s = _validation.positive_number(budget_s, "budget_s", unit="seconds")
    verbose = _validation.boolean(verbose, "verbose")
    allowed = _candidates.parse_allow(allow)
    if budget_s < _search.MIN_BUDGET_S:
        raise ValueError(
            f"budget_s must be at least {_search.MIN_BUDGET_S:g} seconds to measure one "
            f"candidate against the start, got {budget_s:g}"
        )
    if not getattr(model, "compiled", False):
        raise ValueError(
            "model must be compiled: call model.compile(optimizer=..., loss=...) "
            "before keras_scaling.tune"
        )
    strategy = strategy or model.distribute_strategy
    data_settings = dict(data_kwargs or {})
    if per_replica_batch_size is not None:
        data_settings["per_replica_batch_size"] = _validation.positive_int(
            per_replica_batch_size, "per_replica_batch_size"
        )
    elif not isinstance(data, tf.data.Dataset):
        raise ValueError(
            "per_replica_batch_size is needed for arrays and PyDataset data: pass "
            "per_replica_batch_size=..., or a tf.data.Dataset of global batches"
        )
    start = {
        "compile": {
            "steps_per_execution": int(model.steps_per_execution or 1),
            "jit_compile": bool(model.jit_compile),
        },
        "data": data_settings,
        "strategy": {},
        "cpu": dict(cpu or {}),
    }
    runner = _measure.Runner(model, strategy, data)
    start["strategy"] = runner.start_strategy_settings()

    def explain_fn(dataset, steps):
        from keras_scaling import explain

        return explain.explain(model, dataset, steps=steps, rounds=2, verbose=False)

    try:
        found = _search.search(runner, start, budget_s, allowed, explain_fn, verbose, confirm)
    finally:
        runner.restore()
    record = {
        "schema_version": _report.SCHEMA_VERSION,
        "replicas": runner.num_replicas,
        "workers": runner.num_workers,
        "device_kind": runner.device_kind,
        "budget_s": budget_s,
        "elapsed_s": found["elapsed_s"],
        "timeline_s": found["timeline"],
        "explain_bound": found["explain_bound"],
        "allow": [name for name, knob in _candidates.ALLOWABLE.items() if knob in allowed],
        **{key: found[key] for key in ("start", "best", "trials", "notes")},
    }
    # Every worker took the same decisions: the chief writes them.
    writes = log_dir is not None and is_chief(strategy)
    path = _report.write(os.fspath(log_dir), record) if writes else None
    result = TuneResult(best=_settings_of(record, "best"), record=record, path=path)
    if verbose:
        print(_report.text(record, path))
    return result


_callable_module.make_callable(__name__, tune)
