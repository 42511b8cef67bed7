"""Counting a training sample's FLOPs: how long it takes, and how close it is to the arithmetic.

Run: `python benchmarks/flops_count.py [--repeats N]`

For the `mlp`, `cnn` and `resnet50` presets of `keras-scaling bench`
(`keras_scaling/cli/_models.py`), `keras_scaling.flops.training_flops_per_sample`
counts the FLOPs of one training sample (forward, loss, gradients) `--repeats`
times on a fresh model each round; the median and spread (min-max) of the
time to count are printed. For the MLP and the CNN the count is divided by
the analytic count written out below (matrix multiplies and convolutions:
forward, weight gradients, input gradients of every layer but the first;
bias adds and bias gradients), so a ratio near 1.00 says the count is right. The CPU time of
the counting process is printed beside the wall-clock time: when other
processes share the cores, it tells the cost of counting from the wait.

Goals: counting ResNet50 takes under 5 seconds; ratios within 3% (MLP) and
5% (CNN). Counting happens once, before the first measured step, so it adds
nothing to ThroughputLogger's cost per step (see throughput_overhead.py).
"""

import argparse
import statistics
import time


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="counts per model")
    return parser.parse_args(argv)


def _dense(sizes, first_needs_input_gradient=False):
    """Forward, weight and bias gradients of each layer; input gradients but the first's."""
    total = 0
    for index, (fan_in, fan_out) in enumerate(zip(sizes, sizes[1:])):
        total += 2 * (2 * fan_in * fan_out + fan_out)
        if index > 0 or first_needs_input_gradient:
            total += 2 * fan_in * fan_out
    return total


def _conv(output_elements, window, first):
    """Forward and filter gradient; the input gradient unless the layer is first."""
    macs = 2 * output_elements * window
    return (2 if first else 3) * macs + 2 * output_elements  # + bias add and gradient


ANALYTIC_FLOPS_PER_SAMPLE = {
    "mlp": _dense([784, 512, 512, 10]),
    "cnn": (
        _conv(30 * 30 * 32, 3 * 3 * 3, first=True)
        + _conv(13 * 13 * 64, 3 * 3 * 32, first=False)
        + _dense([2304, 128, 10], first_needs_input_gradient=True)
    ),
}


def main(argv=None):
    args = parse_args(argv)
    from keras_scaling.cli import _models
    from keras_scaling.mfu import flops

    print(
        f"{'model':10} {'count (MFLOPs/sample)':>22} {'analytic':>10} {'ratio':>7} "
        f"{'time to count (s): median':>27} {'spread':>15} {'CPU time (s)':>13}"
    )
    for preset in _models.PRESETS:
        times_s, cpu_times_s = [], []
        counted = None
        for _ in range(args.repeats):
            model = _models.build_model(preset)
            _models.compile_for_bench(model, preset, 1)
            start_s, start_cpu_s = time.perf_counter(), time.process_time()
            counted = flops.training_flops_per_sample(model)
            times_s.append(time.perf_counter() - start_s)
            cpu_times_s.append(time.process_time() - start_cpu_s)
        analytic = ANALYTIC_FLOPS_PER_SAMPLE.get(preset)
        ratio = f"{counted / analytic:.3f}" if analytic else "-"
        analytic_text = f"{analytic / 1e6:.2f}" if analytic else "-"
        print(
            f"{preset:10} {counted / 1e6:>22.2f} {analytic_text:>10} {ratio:>7} "
            f"{statistics.median(times_s):>27.2f} "
            f"{min(times_s):>7.2f}-{max(times_s):<7.2f} "
            f"{statistics.median(cpu_times_s):>13.2f}"
        )


if __name__ == "__main__":
    main()
