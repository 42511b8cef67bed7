"""`explain`'s record per replica count, its text and `explain.json` (docs/reference/explain-json.md), from `_measure`'s dict."""

import dataclasses

from keras_scaling.explain import _split

SCHEMA_VERSION = 1
FILE_NAME = "explain.json"


@dataclasses.dataclass(frozen=True)
class Explanation:
    """The `Split` at one replica count, its `Verdict` and `explain.json`'s `record`; `str()`: the table and verdict."""

    split: object
    verdict: object
    record: dict

    def __str__(self):
        return format_report([self])


def explanation(measurements, *, mfu=None, mfu_reason=None, efficient_per_replica_batch=None):
    """The `Explanation` of `_measure.measure`'s figures at one replica count."""
    timings = {
        name: _split.timing(values, zero_allowed=name == "input_wait")
        for name, values in measurements["variants"].items()
    }
    global_batch_size = measurements["global_batch_size"]
    pipeline = measurements.get("pipeline_samples_per_sec")
    split = _split.split_step(
        real=timings["real"],
        resident=timings["resident"],
        resident_amortized=timings["resident_amortized"],
        one_replica=timings["one_replica"],
        steps_per_execution=measurements["steps_per_execution"],
        amortized=measurements["amortized_steps_per_execution"],
        input_wait=timings.get("input_wait"),
        pipeline_batch_s=global_batch_size / pipeline if pipeline else None,
    )
    resident_s = timings["resident"].median_s
    training_samples_per_sec = global_batch_size / resident_s
    host_cpu_replicas = measurements.get("host_cpu_replicas", False)
    result = _split.verdict(
        split,
        num_replicas=measurements["num_replicas"],
        global_batch_size=global_batch_size,
        pipeline_samples_per_sec=pipeline,
        training_samples_per_sec=training_samples_per_sec,
        mfu=mfu,
        mfu_reason=mfu_reason,
        efficient_per_replica_batch=efficient_per_replica_batch,
        per_replica_batch_size=measurements["per_replica_batch_size"],
        host_cpu_replicas=host_cpu_replicas,
        cpu_cores=measurements.get("cpu_cores"),
        compute_dtype=measurements.get("compute_dtype"),
    )
    result = dataclasses.replace(result, notes=tuple(measurements.get("notes", ())) + result.notes)
    advised = _split.advised_steps_per_execution(split)
    implied_input_share = (
        _split.implied_input_share(pipeline, global_batch_size, resident_s) if pipeline else None
    )
    record = {
        "replicas": measurements["num_replicas"],
        "workers": measurements["num_workers"],
        "device_kind": measurements["device_kind"],
        "per_replica_batch_size": measurements["per_replica_batch_size"],
        "global_batch_size": global_batch_size,
        "steps_per_execution": split.steps_per_execution,
        "amortized_steps_per_execution": split.amortized_steps_per_execution,
        "steps": measurements["steps"],
        "rounds": measurements["rounds"],
        "step_ms": split.step_s * 1e3,
        "parts": {
            part.name: {
                "ms": part.time_s * 1e3,
                "share": part.share,
                "noise_ms": part.noise_s * 1e3,
                "saved_ms": part.saved_s * 1e3,
            }
            for part in split.parts
        },
        "rest_ms": split.rest_s * 1e3,
        "input_free_step_ms": split.input_free_step_s * 1e3,
        "pipeline_batch_ms": split.pipeline_batch_s * 1e3 if pipeline else None,
        "rest_share": split.rest_share,
        "host_per_call_ms": split.host_per_call_s * 1e3,
        "host_share_at_amortized": split.host_share_at(split.amortized_steps_per_execution),
        "advised_steps_per_execution": advised,
        "host_share_at_advised": split.host_share_at(advised),
        "pipeline_samples_per_sec": pipeline,
        "training_samples_per_sec": training_samples_per_sec,
        "implied_input_share": implied_input_share,
        "mfu": mfu,
        "mfu_reason": mfu_reason,
        "host_cpu_replicas": host_cpu_replicas,
        "cpu_cores": measurements.get("cpu_cores"),
        "compute_dtype": measurements.get("compute_dtype"),
        "verdict": {**dataclasses.asdict(result), "notes": list(result.notes)},
        "variants": {name: timing.to_json() for name, timing in timings.items()},
    }
    return Explanation(split=split, verdict=result, record=record)


def verdict_lines(explanation):
    """The verdict of one count: its sentence, how sure, and its notes."""
    record, verdict = explanation.record, explanation.verdict
    lines = [f"{record['replicas']} replica(s): {verdict.text} ({verdict.confidence})"]
    if pipeline := record["pipeline_samples_per_sec"]:
        training = f"training takes {record['training_samples_per_sec']:,.0f} samples/s"
        lines.append(
            f"  input pipeline alone: {pipeline:,.0f} samples/s; {training} with the input free"
        )
    return lines + [f"  note: {note}" for note in verdict.notes]


def format_report(explanations, markdown=False):
    """The table of the split per replica count, then each count's verdict (`markdown`: fenced, bulleted)."""
    table = _split.format_table([(item.record["replicas"], item.split) for item in explanations])
    verdicts = [line for item in explanations for line in verdict_lines(item)]
    if markdown:
        return "\n".join(["```", table, "```", ""] + [f"- {line.strip()}" for line in verdicts])
    return "\n".join([table, ""] + verdicts)


def to_json(explanations, **setup):
    """The content of `explain.json`: the setup and one record per replica count."""
    return {"schema_version": SCHEMA_VERSION, **setup, "counts": [e.record for e in explanations]}
