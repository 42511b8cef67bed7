"""What the extra `keras-scaling[plot]` costs: `import keras` with matplotlib installed, and drawing the charts.

Run: `python benchmarks/matplotlib_cost.py [--rounds N] [--quick]`

Keras imports `matplotlib.pyplot` whenever matplotlib can be imported
(`keras.src.visualization`), so installing matplotlib for the bench's
charts costs every process that imports Keras: each training worker, each
bench run. Each round starts a fresh Python that runs `import keras`, in
alternating order:

- "hidden": matplotlib made unimportable (`sys.modules["matplotlib"] = None`),
  as on a machine without the extra;
- "installed": matplotlib importable, as with the extra.

It prints the median CPU time (user + system) of each, with the spread over
rounds, and their difference: what the extra adds to every `import keras`.
Then it times drawing the charts of a bench over 4 replica counts and 2
per-replica batches (`scaling.png` and `efficiency.png`) in this process,
the first draw (matplotlib's import included) and the later ones.
"""

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time

VARIANTS = {
    "hidden": "import sys; sys.modules['matplotlib'] = None; import keras",
    "installed": "import keras",
}


def child_cpu_s(code):
    """CPU seconds (user + system) of a fresh Python running `code`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(
        [sys.executable, "-c", code],
        check=True,
        capture_output=True,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def spread(values):
    median = statistics.median(values)
    return f"{(min(values) / median - 1) * 100:+.0f}%..{(max(values) / median - 1) * 100:+.0f}%"


def bench_rows():
    from keras_scaling.cli import _speedup_table

    rows = []
    for batch, efficiencies in ((8, (1, 0.6, 0.4, 0.3)), (32, (1, 0.95, 0.8, 0.7))):
        for replicas, efficiency in zip((1, 2, 4, 8), efficiencies):
            rows.append(
                _speedup_table.Row(
                    run=f"batch_{batch}/replicas_{replicas}",
                    replicas=replicas,
                    per_replica_batch_size=batch,
                    global_batch_size=batch * replicas,
                    samples_per_sec=1000.0 * replicas * efficiency,
                    speedup=replicas * efficiency,
                    efficiency=efficiency,
                    ideal_speedup=float(replicas),
                )
            )
    return rows


def draw_charts_s(rows):
    from keras_scaling.cli import _plot

    start_s = time.perf_counter()
    _plot.scaling_plot_png(rows, "mlp, weak scaling on 8 GPU(s)", by_batch=True)
    _plot.efficiency_plot_png(rows, "mlp, weak scaling on 8 GPU(s)")
    return time.perf_counter() - start_s


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--quick", action="store_true", help="3 rounds")
    args = parser.parse_args(argv)
    rounds = 3 if args.quick else args.rounds
    names = list(VARIANTS)
    child_cpu_s(VARIANTS["installed"])  # warm-up: file caches, matplotlib's font cache
    cpu = {name: [] for name in names}
    for round_index in range(rounds):
        for name in names if round_index % 2 == 0 else names[::-1]:
            cpu[name].append(child_cpu_s(VARIANTS[name]))
    print(f"import keras in a fresh process, CPU time, {rounds} alternating rounds")
    for name in names:
        print(f"  {name:<9} median {statistics.median(cpu[name]):.2f} s ({spread(cpu[name])})")
    differences = [installed - hidden for hidden, installed in zip(cpu["hidden"], cpu["installed"])]
    print(
        f"  installed - hidden: median {statistics.median(differences):+.2f} s "
        f"(rounds: {min(differences):+.2f} s .. {max(differences):+.2f} s)"
    )
    rows = bench_rows()
    first_s = draw_charts_s(rows)
    later_s = [draw_charts_s(rows) for _ in range(rounds)]
    print("drawing scaling.png and efficiency.png (4 replica counts x 2 per-replica batches)")
    print(f"  first, matplotlib's import included: {first_s:.2f} s")
    print(f"  later: median {statistics.median(later_s):.3f} s ({spread(later_s)})")


if __name__ == "__main__":
    sys.exit(main())
