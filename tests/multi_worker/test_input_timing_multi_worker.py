"""The advice's input timing on 2 workers x 2 logical CPUs: no sample twice, none left out.

Under `MultiWorkerMirroredStrategy` only the chief times the input pipeline
(when `ThroughputLogger`'s efficiency is low). Its timing must not change the
order the chief's data draws next, or the chief and the other worker would
disagree on the permutation from then on.
"""

import os

import pytest
from test_multi_worker_training import (
    LAUNCH_TIMEOUT_S,
    details,
    kill_recorded_workers,
    launch,
    read_json,
)

pytestmark = pytest.mark.timeout(LAUNCH_TIMEOUT_S + 60)

SAMPLES = 192
EPOCHS = 3


def test_every_sample_is_trained_once_per_epoch_when_the_advice_times_the_input(tmp_path):
    out_dir = str(tmp_path)
    try:
        returncode, out, err = launch(
            "mw_train_worker.py",
            "--out-dir",
            out_dir,
            "--log-dir",
            os.path.join(out_dir, "logs"),
            "--epochs",
            str(EPOCHS),
            "--samples",
            str(SAMPLES),
            # Far above what 4 CPU replicas reach: the efficiency is low.
            "--baseline",
            "1e9",
            "--update-freq",
            "1",
        )
    finally:
        kill_recorded_workers(out_dir)
    assert returncode == 0, details(returncode, out, err)
    workers = [read_json(os.path.join(out_dir, f"worker{i}.json")) for i in (0, 1)]

    assert workers[0]["input_timing_calls"] >= 1  # the advice fired on the chief
    assert workers[1]["input_timing_calls"] == 0
    for epoch in map(str, range(EPOCHS)):
        ids_0, ids_1 = (worker["ids_by_epoch"][epoch] for worker in workers)
        assert len(ids_0) == len(set(ids_0)) == SAMPLES // 2, epoch
        assert len(ids_1) == len(set(ids_1)) == SAMPLES // 2, epoch
        assert set(ids_0) | set(ids_1) == set(range(SAMPLES)), epoch
