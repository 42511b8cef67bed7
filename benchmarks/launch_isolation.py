"""What a private network namespace costs `keras-scaling launch`: start-up and loopback speed.

Launches 2 plain Python workers (no TensorFlow) with `isolation="auto"` (a
private network namespace, where the kernel allows it) and `"off"`, in rounds
that alternate between them, so that a change of machine load affects both
alike. Worker 1 sends `--megabytes` to worker 0 over 127.0.0.1, on the ports
of `TF_CONFIG`, as TensorFlow's collectives would. Prints, per mode, the
median (and min-max) wall time of the whole launch and the loopback
throughput measured by worker 0, and the ratio of `auto` to `off`.

    python benchmarks/launch_isolation.py            # about half a minute
    python benchmarks/launch_isolation.py --quick    # a few seconds
"""

import argparse
import io
import statistics
import sys
import textwrap
import time

from keras_scaling.launch import _isolation, launcher

_WORKER = textwrap.dedent(
    """
    import json, os, socket, sys, time
    config = json.loads(os.environ["TF_CONFIG"])
    index = config["task"]["index"]
    port = int(config["cluster"]["worker"][0].rsplit(":", 1)[1])
    total_bytes = int(sys.argv[1]) * 2**20
    chunk = b"x" * 2**16
    if index == 0:
        server = socket.create_server(("", port))
        connection, _ = server.accept()
        received, start_s = 0, None
        while received < total_bytes:
            data = connection.recv(2**20)
            if start_s is None:
                start_s = time.perf_counter()
            received += len(data)
        print(received / 2**20 / (time.perf_counter() - start_s))
    else:
        deadline = time.monotonic() + 10
        while True:
            try:
                client = socket.create_connection(("127.0.0.1", port))
                break
            except ConnectionRefusedError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.01)
        for _ in range(total_bytes // len(chunk)):
            client.sendall(chunk)
        client.close()
    """
)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=int, default=256, help="sent per launch (default 256)")
    parser.add_argument("--rounds", type=int, default=7, help="default 7")
    parser.add_argument("--quick", action="store_true", help="32 MB, 3 rounds")
    args = parser.parse_args(argv)
    if args.quick:
        args.megabytes, args.rounds = 32, 3
    for name in ("megabytes", "rounds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    return args


def launch_once(mode, megabytes):
    """(wall time of the launch in s, MB/s over loopback) of one launch in `mode`."""
    output = io.StringIO()
    start_s = time.perf_counter()
    result = launcher.launch(
        [sys.executable, "-c", _WORKER, str(megabytes)],
        num_workers=2,
        stdout=output,
        stderr=io.StringIO(),
        isolation=mode,
    )
    elapsed_s = time.perf_counter() - start_s
    if result.exit_code != 0:
        raise SystemExit(f"launch with isolation={mode!r} failed: {result.message}")
    megabytes_per_sec = float(output.getvalue().split("] ", 1)[1])
    return elapsed_s, megabytes_per_sec


def main(argv=None):
    args = parse_args(argv)
    try:
        _isolation.create().close()
    except _isolation.Unavailable as failure:
        print(f"no private network namespace here ({failure}); 'auto' runs without one")
    modes = ("off", "auto")
    for mode in modes:
        launch_once(mode, 1)  # warms the file cache
    wall_s = {mode: [] for mode in modes}
    throughput = {mode: [] for mode in modes}
    for _ in range(args.rounds):
        for mode in modes:
            elapsed_s, megabytes_per_sec = launch_once(mode, args.megabytes)
            wall_s[mode].append(elapsed_s)
            throughput[mode].append(megabytes_per_sec)

    print(f"2 workers, {args.megabytes} MB over 127.0.0.1 per launch, {args.rounds} rounds")
    print(f"{'isolation':>10} {'launch s (min-max)':>24} {'loopback MB/s (min-max)':>30}")
    for mode in modes:
        print(
            f"{mode:>10} {statistics.median(wall_s[mode]):>10.3f} "
            f"({min(wall_s[mode]):.3f}-{max(wall_s[mode]):.3f}) "
            f"{statistics.median(throughput[mode]):>14.0f} "
            f"({min(throughput[mode]):.0f}-{max(throughput[mode]):.0f})"
        )
    print(
        f"auto / off: launch time {statistics.median(wall_s['auto']) / statistics.median(wall_s['off']):.2f}, "
        f"loopback throughput {statistics.median(throughput['auto']) / statistics.median(throughput['off']):.2f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
