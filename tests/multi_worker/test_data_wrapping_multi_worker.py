"""The data people already have, on 2 workers x 2 logical CPUs (4 replicas).

One `keras-scaling launch` job (`mw_data_wrapping_worker.py`, beside this
file) reads every source of `tests/workers/data_wrapping_sources.py` for one
epoch through the strategy and trains on it with `fit`; each test checks one
property over both workers' reports.
"""

import json
import os
import sys

import pytest
from test_multi_worker_training import LAUNCH_TIMEOUT_S, details, launch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "workers"))
import data_wrapping_sources as sources  # noqa: E402

pytestmark = pytest.mark.timeout(LAUNCH_TIMEOUT_S + 60)


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    data_dir = str(tmp_path_factory.mktemp("wrapping_data"))
    out_dir = str(tmp_path_factory.mktemp("wrapping_workers"))
    sources.write_all(data_dir)
    returncode, out, err = launch("mw_data_wrapping_worker.py", out_dir, data_dir)
    assert returncode == 0, details(returncode, out, err)
    found = []
    for index in range(2):
        with open(os.path.join(out_dir, f"worker{index}.json")) as file:
            found.append(json.load(file))
    return found


def _per_source(reports, name):
    return [report["sources"][name] for report in reports]


@pytest.mark.parametrize("name", list(sources.SOURCES))
def test_every_sample_once_per_epoch_across_two_workers(reports, name):
    ids = [set(result["ids"]) for result in _per_source(reports, name)]
    assert not ids[0] & ids[1], "a sample was read by both workers"
    all_ids = [value for result in _per_source(reports, name) for value in result["ids"]]
    assert sorted(all_ids) == list(range(sources.SOURCES[name][0]))


@pytest.mark.parametrize("name", list(sources.SOURCES))
def test_global_batch_is_split_over_four_replicas(reports, name):
    for result in _per_source(reports, name):
        assert result["per_replica_batch_size"] == sources.SOURCE_BATCH_SIZE
        assert result["global_batch_size"] == 4 * sources.SOURCE_BATCH_SIZE
        assert result["replica_batch_sizes"] == [sources.SOURCE_BATCH_SIZE]


@pytest.mark.parametrize("name", list(sources.SOURCES))
def test_every_worker_runs_the_same_planned_steps(reports, name):
    results = _per_source(reports, name)
    planned = results[0]["planned_steps"]
    assert [result["steps"] for result in results] == [planned, planned]
    assert [result["planned_steps"] for result in results] == [planned, planned]


@pytest.mark.parametrize("name", list(sources.SOURCES))
def test_fit_trains_on_two_workers(reports, name):
    for result in _per_source(reports, name):
        assert result["fit_steps"] == result["fit_planned_steps"] > 0
        assert result["loss"] == result["loss"]  # not NaN


def test_files_and_items_are_split_by_source(reports):
    modes = {
        name: {result["shard_mode"] for result in _per_source(reports, name)}
        for name in sources.SOURCES
    }
    assert modes["image_dataset_from_directory"] == {"file"}
    assert modes["text_dataset_from_directory"] == {"file"}
    assert modes["py_dataset"] == {"item"}
    assert modes["batched_pipeline"] == {"element"}


def test_each_worker_begins_and_ends_its_py_dataset_epochs_in_pairs(reports):
    # One fit epoch per worker, each on its own PyDataset. Under this strategy
    # the model is built from a first batch read beforehand; on data this
    # small that read is a whole pass, so it can count as one more epoch.
    for result in _per_source(reports, "py_dataset"):
        assert result["epochs_begun"] == result["epochs_ended"] in (1, 2)
