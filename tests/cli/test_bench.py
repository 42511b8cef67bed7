"""`keras-scaling bench`: the sweep plan, bad input, and a real sweep on 2 logical CPUs.

The sweep runs the command line as a subprocess, as a user would; each
replica count trains in a child process of its own, so this pytest process
needs no logical CPUs.
"""

import json
import os
import subprocess
import sys
import textwrap

import chart_readback
import numpy as np
import pytest

from keras_scaling.cli import _sweep_plan
from keras_scaling.cli._errors import UsageError
from keras_scaling.throughput._dashboard import flops_text_of

_TIMEOUT_S = 300

# The tests that read the charts back in this process.
pytestmark = pytest.mark.usefixtures("matplotlib_importable")


def _bench(*args, cwd=None, python_options=(), env=None):
    return subprocess.run(
        [sys.executable, *python_options, "-m", "keras_scaling", "bench", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=_TIMEOUT_S,
        cwd=cwd,
        env={**(env or os.environ), "TF_CPP_MIN_LOG_LEVEL": "2"},
    )


# The sweep plan.


def test_default_counts_are_one_then_powers_of_two_then_all_devices():
    assert _sweep_plan.default_replica_counts(1) == (1,)
    assert _sweep_plan.default_replica_counts(2) == (1, 2)
    assert _sweep_plan.default_replica_counts(8) == (1, 2, 4, 8)
    assert _sweep_plan.default_replica_counts(6) == (1, 2, 4, 6)


def test_replica_list_is_parsed_sorted_and_deduplicated():
    assert _sweep_plan.parse_replica_counts("4, 1,2,2") == (1, 2, 4)
    with pytest.raises(UsageError, match="got 0"):
        _sweep_plan.parse_replica_counts("0,1")
    with pytest.raises(UsageError, match="'1,two'"):
        _sweep_plan.parse_replica_counts("1,two")


def test_weak_scaling_grows_the_global_batch_and_strong_scaling_splits_it():
    weak = _sweep_plan.plan_batches((1, 2, 4), per_replica_batch_size=64)
    strong = _sweep_plan.plan_batches((1, 2, 4), global_batch_size=256)

    assert [(p.per_replica_batch_size, p.global_batch_size) for p in weak] == [
        (64, 64),
        (64, 128),
        (64, 256),
    ]
    assert [(p.per_replica_batch_size, p.global_batch_size) for p in strong] == [
        (256, 256),
        (128, 256),
        (64, 256),
    ]
    with pytest.raises(UsageError, match="does not divide by 4 replicas"):
        _sweep_plan.plan_batches((1, 2, 4), global_batch_size=250)


def test_each_replica_gets_the_same_share_of_the_cores_in_every_run():
    threads = _sweep_plan.plan_cpu_threads((1, 2, 4), cores=8)

    assert threads.intra_op_threads() == 2
    assert [threads.inter_op_threads(n) for n in (1, 2, 4)] == [1, 2, 4]
    assert not threads.oversubscribed
    assert "N x 2 of the 8 cores" in threads.describe()


def test_more_replicas_than_cores_is_flagged_not_meaningful():
    threads = _sweep_plan.plan_cpu_threads((1, 2, 4), cores=2)

    assert threads.intra_op_threads() == 1
    assert threads.oversubscribed
    assert "not meaningful" in threads.describe()


# Models and their synthetic data.


def test_a_model_the_bench_compiles_gets_sgd_and_mean_squared_error():
    import keras

    from keras_scaling.cli import _models

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    _models.compile_for_bench(model, "my.models:build", steps_per_execution=1)
    x, y = _models.synthetic_data(model, 8)

    assert isinstance(model.optimizer, keras.optimizers.SGD)
    assert model.loss == "mean_squared_error"
    assert x.shape == (8, 3) and y.shape == (8, 2) and y.dtype == "float32"


@pytest.mark.parametrize(
    "loss, expected",
    [("sparse_categorical_crossentropy", "labels"), ("categorical_crossentropy", "one_hot")],
)
def test_synthetic_targets_follow_the_loss_of_a_compiled_model(loss, expected):
    import keras
    import numpy as np

    from keras_scaling.cli import _models

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(5, activation="softmax")])
    model.compile(optimizer="sgd", loss=loss)
    _models.compile_for_bench(model, "my.models:build", steps_per_execution=1)
    _, y = _models.synthetic_data(model, 64)

    assert model.loss == loss  # a compiled model is trained as compiled
    if expected == "labels":
        assert y.shape == (64,) and set(np.unique(y)) <= set(range(5))
    else:
        assert y.shape == (64, 5) and (y.sum(axis=1) == 1).all()


def test_a_model_without_known_input_shapes_is_refused():
    import keras

    from keras_scaling.cli import _models

    model = keras.Sequential([keras.layers.Dense(2)])

    with pytest.raises(UsageError, match="no defined inputs.*pass --data package.module:function"):
        _models.synthetic_data(model, 8)


# Bad input: a message naming the problem, exit status 2, no traceback.


@pytest.mark.parametrize(
    "args, message",
    [
        (["--model", "nosuch"], "neither a preset (mlp, cnn, resnet50)"),
        (["--model", "no_such_module_here:build"], "cannot import module"),
        (["--model", "json:no_such_function"], "has no attribute 'no_such_function'"),
        (["--cpu-devices", "2", "--replicas", "1,4"], "asks for 4 replicas but there are 2"),
        (["--per-replica-batch", "0"], "--per-replica-batch must hold positive integers, got 0"),
        (["--per-replica-batch", "16,x"], "--per-replica-batch must be a comma-separated list"),
        (
            ["--peak-flops", "fast"],
            "--peak-flops must be a positive number (FLOPs/sec of one replica), 'auto', 'measure' or None, got 'fast'",
        ),
        (["--peak-flops=-1e12"], "--peak-flops must be a positive number"),
        (["--global-batch", "-8"], "--global-batch: must be a positive integer"),
        (["--steps", "0"], "--steps: must be a positive integer"),
        (["--cpu-devices", "2", "--global-batch", "33"], "does not divide by 2 replicas"),
        (["--cpu-devices", "2", "--replicas", "1,x"], "--replicas must be a comma-separated"),
    ],
)
def test_bad_input_exits_2_with_a_message(tmp_path, capsys, args, message):
    # In this process: each message is checked before any replica runs.
    from keras_scaling.cli import main

    status = main(["bench", *map(str, args), "--logdir", str(tmp_path / "logs")])

    assert status == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "logs").exists()


def test_bad_input_to_the_command_exits_2_without_a_traceback(tmp_path):
    result = _bench("--model", "nosuch", "--logdir", tmp_path / "logs")

    assert result.returncode == 2, result.stdout + result.stderr
    assert "neither a preset (mlp, cnn, resnet50)" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_model_function_that_returns_no_model_exits_2(tmp_path):
    (tmp_path / "not_a_model.py").write_text("def build():\n    return None\n")

    result = _bench(
        "--cpu-devices",
        "1",
        "--model",
        "not_a_model:build",
        "--steps",
        "2",
        "--logdir",
        tmp_path / "logs",
        cwd=tmp_path,
    )

    assert result.returncode == 2, result.stdout + result.stderr
    assert "returned NoneType, not a keras.Model" in result.stderr
    assert "Traceback" not in result.stderr


# keras is imported in build(): the command imports this module to check
# --model, and an import at the top would load TensorFlow in the command's own
# process too, besides the run's.
_UNKNOWN_LENGTH_MODEL = textwrap.dedent(
    """
    def build():
        import keras

        # Token ids of any length, as every keras-hub backbone takes them.
        tokens = keras.Input((None,), dtype="int32")
        x = keras.layers.Embedding(100, 8)(tokens)
        x = keras.layers.GlobalAveragePooling1D()(x)
        return keras.Model(tokens, keras.layers.Dense(1)(x))


    def load():
        import numpy as np

        return np.ones((64, 12), "int32"), np.ones((64, 1), "float32")
    """
)


def test_a_model_with_unknown_input_dimensions_exits_2_naming_data_as_the_fix(tmp_path):
    (tmp_path / "text_model.py").write_text(_UNKNOWN_LENGTH_MODEL)

    result = _bench(
        "--cpu-devices", 1, "--model", "text_model:build", "--steps", 2,
        "--logdir", tmp_path / "logs",
        cwd=tmp_path,
    )  # fmt: skip

    assert result.returncode == 2, result.stdout + result.stderr
    assert "have unknown dimensions (None, None)" in result.stderr
    assert "pass --data package.module:function" in result.stderr
    assert "keras.Input a full shape" not in result.stderr
    assert "Traceback" not in result.stderr


def test_a_failing_replica_count_is_named_with_its_stderr_tail(tmp_path):
    (tmp_path / "broken_model.py").write_text(
        textwrap.dedent(
            """
            def build():
                raise RuntimeError("this model cannot be built")
            """
        )
    )

    result = _bench(
        "--cpu-devices",
        "2",
        "--replicas",
        "2",
        "--model",
        "broken_model:build",
        "--steps",
        "2",
        "--logdir",
        tmp_path / "logs",
        cwd=tmp_path,
    )

    assert result.returncode == 1
    assert "the run with 2 replica(s) failed" in result.stderr
    assert "RuntimeError: this model cannot be built" in result.stderr


def test_too_few_steps_to_measure_exits_2_asking_for_more(tmp_path):
    result = _bench(
        "--cpu-devices",
        "1",
        "--steps",
        "3",
        "--per-replica-batch",
        "8",
        "--logdir",
        tmp_path / "logs",
    )

    assert result.returncode == 2, result.stdout + result.stderr
    assert "the run with 1 replica(s) gave no throughput figure" in result.stderr
    assert "pass more --steps than 3" in result.stderr
    assert "Traceback" not in result.stderr


def test_an_earlier_bench_in_logdir_is_not_overwritten_without_asking(tmp_path):
    (tmp_path / "replicas_1").mkdir()

    result = _bench("--cpu-devices", "1", "--logdir", tmp_path)

    assert result.returncode == 2
    assert "already holds bench results (replicas_1)" in result.stderr
    assert "--overwrite" in result.stderr


# A real sweep: 1 and 2 replicas on 2 logical CPUs.


@pytest.fixture(scope="module")
def sweep(tmp_path_factory, env_with_matplotlib):
    log_dir = tmp_path_factory.mktemp("bench") / "logs"
    result = _bench(
        "--cpu-devices",
        "2",
        "--replicas",
        "1,2",
        "--model",
        "mlp",
        "--per-replica-batch",
        "32",
        "--steps",
        "30",
        "--logdir",
        log_dir,
        # Lists on stderr the modules that the command's own process imports.
        python_options=("-X", "importtime"),
        env=env_with_matplotlib,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return log_dir, result


def test_only_the_runs_load_tensorflow_not_the_command_that_starts_them(sweep):
    log_dir, result = sweep
    imported = [
        line.rsplit("|", 1)[1].strip()
        for line in result.stderr.splitlines()
        if line.startswith("import time:")
    ]
    assert "keras_scaling.cli.bench" in imported
    assert "tensorflow" not in imported
    assert (log_dir / "replicas_2" / "throughput.json").exists()


def _table_lines(stdout):
    return [line for line in stdout.splitlines() if line.startswith("|")]


def _cells(line):
    return [cell.strip() for cell in line.strip("|").split("|")]


def _read_json(path):
    with open(path) as file:
        return json.load(file)


def test_sweep_prints_the_table_with_a_row_per_replica_count(sweep):
    log_dir, result = sweep
    lines = _table_lines(result.stdout)

    assert _cells(lines[0]) == [
        "replicas",
        "global batch",
        "samples/sec",
        "speedup",
        "efficiency",
        "ideal",
        "model FLOP/s",
        "MFU",
        "run",
    ]
    assert [_cells(line)[0] for line in lines[2:]] == ["1", "2"]
    assert [_cells(line)[1] for line in lines[2:]] == ["32", "64"]
    assert _cells(lines[2])[3:6] == ["1.00x", "1.00", "1x"]
    assert (_cells(lines[3])[5], _cells(lines[3])[-1]) == ("2x", "replicas_2")
    assert "CPU thread pools: each replica has 1 intra-op thread" in result.stdout
    assert f"tensorboard --logdir {log_dir}" in result.stdout


def test_speedup_is_samples_per_sec_over_the_one_replica_run_of_the_sweep(sweep):
    log_dir, _ = sweep
    scaling = _read_json(log_dir / "scaling.json")
    one = _read_json(log_dir / "replicas_1" / "throughput.json")["samples_per_sec"]
    two = _read_json(log_dir / "replicas_2" / "throughput.json")

    rows = scaling["rows"]
    assert [row["replicas"] for row in rows] == [1, 2]
    assert [row["samples_per_sec"] for row in rows] == [one, two["samples_per_sec"]]
    assert rows[0]["speedup"] == 1.0
    assert rows[1]["speedup"] == pytest.approx(two["samples_per_sec"] / one, rel=1e-12)
    assert rows[1]["efficiency"] == pytest.approx(rows[1]["speedup"] / 2, rel=1e-12)
    assert [row["ideal_speedup"] for row in rows] == [1, 2]
    assert scaling["baseline_samples_per_sec"] == one
    # ThroughputLogger in the 2-replica run used the same baseline.
    assert two["baseline_samples_per_sec"] == pytest.approx(one, rel=1e-12)
    assert two["speedup"] == pytest.approx(rows[1]["speedup"], rel=1e-9)


def test_tflops_column_is_the_counted_flops_times_samples_per_sec(sweep):
    from keras_scaling.cli import _models
    from keras_scaling.mfu import flops

    log_dir, result = sweep
    model = _models.build_model("mlp")
    _models.compile_for_bench(model, "mlp", 1)
    counted = flops.training_flops_per_sample(model)
    rows = _read_json(log_dir / "scaling.json")["rows"]
    two = _read_json(log_dir / "replicas_2" / "throughput.json")
    assert two["flops_source"] == "counted"
    assert two["flops_per_sample"] == pytest.approx(counted, rel=0.01)
    for line, row in zip(_table_lines(result.stdout)[2:], rows):
        assert row["tflops_per_sec"] == pytest.approx(
            two["flops_per_sample"] * row["samples_per_sec"] / 1e12, rel=1e-9
        )
        # With an SI prefix; no MFU: no CPU peak.
        assert _cells(line)[6:8] == [flops_text_of(row["tflops_per_sec"] * 1e12, "/s"), "-"]


def test_printed_figures_match_scaling_json(sweep):
    log_dir, result = sweep
    rows = _read_json(log_dir / "scaling.json")["rows"]

    for line, row in zip(_table_lines(result.stdout)[2:], rows):
        cells = _cells(line)
        assert cells[2] == f"{row['samples_per_sec']:.1f}"
        assert cells[3] == f"{row['speedup']:.2f}x"
        assert cells[4] == f"{row['efficiency']:.2f}"


def test_sweep_writes_a_png_plot(sweep):
    from PIL import Image

    log_dir, _ = sweep
    png = (log_dir / "scaling.png").read_bytes()

    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    with Image.open(log_dir / "scaling.png") as image:
        pixels = np.asarray(image.convert("RGB"), dtype=np.float64) / 255
    assert pixels.shape == (480, 640, 3)
    assert pixels.std() > 0.05  # not a blank canvas


def test_the_sweeps_plot_is_the_chart_of_the_figures_in_scaling_json(sweep):
    from keras_scaling.cli import _plot, _speedup_table

    log_dir, _ = sweep
    scaling = _read_json(log_dir / "scaling.json")
    rows = [_speedup_table.Row(**row) for row in scaling["rows"]]

    rendered = chart_readback.render(_plot.scaling_chart(rows, scaling["title"]))

    # The same chart gives the same bytes: scaling.png plots these points.
    assert rendered.png == (log_dir / "scaling.png").read_bytes()
    measured = next(line for line in rendered.lines if line.label == "measured")
    assert measured.points == tuple((row["replicas"], row["speedup"]) for row in scaling["rows"])


def _rendered_scaling_chart():
    from keras_scaling.cli import _plot

    # Perfect scaling up to 8 replicas: the last label sits at the top right.
    rows = [_row(replicas, 32, 1.0) for replicas in (1, 2, 4, 8)]
    return chart_readback.render(_plot.scaling_chart(rows, "mlp, weak scaling on 8 logical CPU(s)"))


def _inside(box, bounds):
    return (
        bounds[0] <= box[0] and box[2] <= bounds[2] and bounds[1] <= box[1] and box[3] <= bounds[3]
    )


def test_efficiency_labels_stay_inside_the_axes():
    rendered = _rendered_scaling_chart()
    labels = [text for text in rendered.texts if text.role == "point label"]

    assert [text.text for text in labels] == ["1.00"] * 4
    for text in labels:
        assert _inside(text.box, rendered.axes_box), text


def test_no_text_of_the_plot_is_clipped_by_the_image():
    from keras_scaling.cli import _plot

    rendered = _rendered_scaling_chart()

    roles = {text.role for text in rendered.texts}
    assert roles == {"title", "x label", "y label", "x tick", "y tick", "point label", "legend"}
    for text in rendered.texts:
        assert _inside(text.box, (0, 0, _plot.WIDTH_PX, _plot.HEIGHT_PX)), text


def test_the_legend_and_tick_labels_keep_clear_of_each_other_and_of_the_axis_labels():
    rendered = _rendered_scaling_chart()
    texts = [text for text in rendered.texts if text.role != "point label"]

    for index, text in enumerate(texts):
        for other in texts[index + 1 :]:
            overlap = (
                text.box[0] < other.box[2]
                and other.box[0] < text.box[2]
                and text.box[1] < other.box[3]
                and other.box[1] < text.box[3]
            )
            assert not overlap, (text, other)


def test_plot_text_stays_readable_in_a_card_half_the_image_width():
    rendered = _rendered_scaling_chart()

    # TensorBoard's image card shows the 640-pixel image about 300 pixels wide:
    # at half size, text set at 16 pixels or more, digits at least 6 pixels high.
    assert min(text.size_px for text in rendered.texts) / 2 >= 8
    assert min(text.box[3] - text.box[1] for text in rendered.texts) / 2 >= 6


def test_plot_and_table_are_in_the_summary_run_of_tensorboard(sweep):
    from keras_scaling.summaries import _tensorboard

    log_dir, result = sweep
    summaries = _tensorboard.read_summaries(log_dir / "summary")

    plugins = {tag: points[0].plugin for tag, points in summaries.items()}
    assert plugins == {"scaling/speedup_vs_replicas": "images", "scaling/table": "text"}
    (table,) = summaries["scaling/table"]
    assert "\n".join(_table_lines(result.stdout)) in table.value
    (image,) = summaries["scaling/speedup_vs_replicas"]
    assert image.value == (log_dir / "scaling.png").read_bytes()


def test_bench_runs_are_named_for_what_they_hold(sweep):
    log_dir, _ = sweep
    runs = sorted(
        os.path.relpath(directory, log_dir)
        for directory, _, files in os.walk(log_dir)
        if any(name.startswith("events.out.tfevents.") for name in files)
    )

    assert runs == ["replicas_1/scaling", "replicas_2/scaling", "summary"]
    assert not (log_dir / "train").exists()


def test_each_run_writes_one_event_file_per_run_directory(sweep):
    log_dir, _ = sweep
    for run in ("replicas_1/scaling", "replicas_2/scaling", "summary"):
        files = os.listdir(log_dir / run)
        assert len(files) == 1, f"{run}: {files}"


def test_each_replica_count_logs_its_throughput_in_its_own_run(sweep):
    from keras_scaling.summaries import _tensorboard

    log_dir, _ = sweep
    for run in ("replicas_1", "replicas_2"):
        scalars = _tensorboard.read_scalars(_tensorboard.run_dir(log_dir / run))
        assert scalars["throughput/samples_per_sec"], run
        assert "scaling/speedup" in scalars, run


def test_report_on_the_sweep_reproduces_its_table(sweep, env_with_matplotlib):
    log_dir, result = sweep
    report = subprocess.run(
        [
            sys.executable,
            "-m",
            "keras_scaling",
            "report",
            str(log_dir),
            "--output",
            str(log_dir / "report.png"),
        ],
        capture_output=True,
        text=True,
        timeout=_TIMEOUT_S,
        env=env_with_matplotlib,
    )

    assert report.returncode == 0, report.stderr
    assert _table_lines(report.stdout) == _table_lines(result.stdout)
    assert (log_dir / "report.png").read_bytes().startswith(b"\x89PNG")


def test_batch_list_is_parsed_sorted_and_deduplicated():
    assert _sweep_plan.parse_batch_sizes("64,16,64") == (16, 64)


def _row(replicas, batch, efficiency):
    from keras_scaling.cli import _speedup_table

    return _speedup_table.Row(
        run="r",
        replicas=replicas,
        per_replica_batch_size=batch,
        global_batch_size=batch * replicas,
        samples_per_sec=1.0,
        speedup=efficiency * replicas,
        efficiency=efficiency,
        ideal_speedup=replicas,
    )


def test_smallest_efficient_batch_is_read_at_the_largest_replica_count():
    from keras_scaling.cli import _speedup_table

    rows = [
        _row(1, 16, 1.0),
        _row(2, 16, 0.95),
        _row(4, 16, 0.7),
        _row(2, 32, 0.97),
        _row(4, 32, 0.91),
        _row(4, 64, 0.96),
    ]
    assert _speedup_table.smallest_efficient_batch(rows) == (32, 4)
    assert _speedup_table.smallest_efficient_batch(rows[:3]) == (None, 4)


@pytest.fixture(scope="module")
def batch_sweep(tmp_path_factory, env_with_matplotlib):
    log_dir = tmp_path_factory.mktemp("batch_sweep") / "logs"
    result = _bench(
        "--cpu-devices",
        "2",
        "--replicas",
        "2",
        "--model",
        "mlp",
        "--per-replica-batch",
        "8,32",
        "--steps",
        "30",
        "--peak-flops",
        "measure",
        "--logdir",
        log_dir,
        env=env_with_matplotlib,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return log_dir, result


def test_batch_sweep_prints_a_table_per_batch_and_the_efficient_batch_line(batch_sweep):
    from keras_scaling.cli import _speedup_table

    log_dir, result = batch_sweep
    assert "Per-replica batch 8:" in result.stdout
    assert "Per-replica batch 32:" in result.stdout
    scaling = _read_json(log_dir / "scaling.json")
    assert scaling["per_replica_batches"] == [8, 32]
    rows = [_speedup_table.Row(**row) for row in scaling["rows"]]
    assert [row.run for row in rows] == ["batch_8/replicas_2", "batch_32/replicas_2"]
    batch, _ = _speedup_table.smallest_efficient_batch(rows)
    assert scaling["smallest_efficient_per_replica_batch"] == batch
    if batch is None:
        assert (
            "No per-replica batch up to 32 reaches an efficiency of 0.90 at 2 replicas"
            in result.stdout
        )
    else:
        assert f"reaching an efficiency of 0.90 at 2 replicas: {batch}." in result.stdout


def test_batch_sweep_with_measured_peak_has_mfu(batch_sweep):
    log_dir, result = batch_sweep
    for batch in (8, 32):
        record = _read_json(log_dir / f"batch_{batch}" / "replicas_2" / "throughput.json")
        assert record["peak_source"].startswith("measured: 2048x2048 float32 matmul")
        assert record["mfu"] == pytest.approx(
            record["flops_per_sample"]
            * record["samples_per_sec"]
            / (record["peak_flops_per_replica"] * 2)
        )
    mfu_cells = [_cells(line)[7] for line in _table_lines(result.stdout) if "replicas_2" in line]
    # A fraction, as efficiency is.
    assert len(mfu_cells) == 2 and all(0 < float(cell) < 1 for cell in mfu_cells)


def test_batch_sweep_writes_the_efficiency_plot_also_to_tensorboard(batch_sweep):
    from keras_scaling.summaries import _tensorboard

    log_dir, _ = batch_sweep
    png = (log_dir / "efficiency.png").read_bytes()
    summaries = _tensorboard.read_summaries(log_dir / "summary")
    (image,) = summaries["scaling/efficiency_vs_per_replica_batch"]
    assert image.value == png


def test_overwrite_removes_only_what_an_earlier_bench_wrote(tmp_path):
    from keras_scaling.cli import bench

    (tmp_path / "replicas_1").mkdir()
    (tmp_path / "replicas_1" / "throughput.json").write_text("{}")
    (tmp_path / "scaling.json").write_text("{}")
    for run in ("summary", "train"):  # train: the summary run of earlier versions
        (tmp_path / run).mkdir()
        (tmp_path / run / "old_events").write_text("")
    (tmp_path / "notes.txt").write_text("mine")

    bench._prepare_log_dir(tmp_path, overwrite=True)

    assert sorted(os.listdir(tmp_path)) == ["notes.txt", "summary"]
    assert os.listdir(tmp_path / "summary") == []


@pytest.mark.parametrize("run", ["summary", "train"])
def test_a_run_directory_without_a_bench_is_not_an_earlier_bench(tmp_path, run):
    from keras_scaling.cli import bench

    (tmp_path / run).mkdir()
    (tmp_path / run / "events").write_text("")

    bench._prepare_log_dir(tmp_path, overwrite=False)

    assert os.listdir(tmp_path / run) == ["events"]


# Without matplotlib (no `keras-scaling[plot]`): everything but the charts.


@pytest.fixture(scope="module")
def sweep_without_matplotlib(tmp_path_factory, env_without_matplotlib):
    # Also the run of the model whose input length is unknown, given its data
    # by --data: the two do not touch each other, and share the runs' start-up.
    root = tmp_path_factory.mktemp("without_matplotlib")
    (root / "text_model.py").write_text(_UNKNOWN_LENGTH_MODEL)
    log_dir = root / "logs"
    result = _bench(
        "--cpu-devices", 1, "--replicas", 1,
        "--model", "text_model:build", "--data", "text_model:load",
        "--per-replica-batch", "8,16", "--steps", 10, "--logdir", log_dir,
        cwd=root,
        env=env_without_matplotlib,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    return log_dir, result


def test_the_same_model_with_data_given_by_data_runs(sweep_without_matplotlib):
    log_dir, result = sweep_without_matplotlib

    assert "Bench: model text_model:build" in result.stdout
    assert "samples/sec" in result.stdout
    rows = _read_json(log_dir / "scaling.json")["rows"]
    assert [row["per_replica_batch_size"] for row in rows] == [8, 16]
    assert all(row["samples_per_sec"] > 0 for row in rows)


def test_without_matplotlib_bench_says_once_how_to_get_the_charts(sweep_without_matplotlib):
    log_dir, result = sweep_without_matplotlib

    assert result.stdout.count("pip install 'keras-scaling[plot]'") == 1
    assert "No charts (scaling.png, efficiency.png): matplotlib cannot be imported" in (
        result.stdout
    )
    assert "Traceback" not in result.stderr
    assert f"Wrote {log_dir / 'scaling.json'}." in result.stdout
    assert not (log_dir / "scaling.png").exists() and not (log_dir / "efficiency.png").exists()


def test_without_matplotlib_bench_writes_the_table_json_and_tensorboard_summaries(
    sweep_without_matplotlib,
):
    from keras_scaling.summaries import _tensorboard

    log_dir, result = sweep_without_matplotlib
    rows = _read_json(log_dir / "scaling.json")["rows"]

    assert [(row["per_replica_batch_size"], row["replicas"]) for row in rows] == [(8, 1), (16, 1)]
    assert all(row["samples_per_sec"] > 0 for row in rows)
    for line, row in zip(_table_lines(result.stdout)[2::3], rows):
        assert _cells(line)[2] == f"{row['samples_per_sec']:.1f}"
    summary = _tensorboard.read_summaries(log_dir / "summary")
    assert {tag: points[0].plugin for tag, points in summary.items()} == {"scaling/table": "text"}
    for batch in (8, 16):
        scalars = _tensorboard.read_summaries(log_dir / f"batch_{batch}" / "replicas_1" / "scaling")
        assert [point.value > 0 for point in scalars["throughput/samples_per_sec"]][-1:] == [True]
