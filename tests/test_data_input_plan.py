"""The input plan's arithmetic, checked with plain numbers (no strategy)."""

import pytest

from keras_scaling.data import _input_plan


def test_per_replica_batch_gives_global_batch_times_replicas():
    assert _input_plan.resolve_batch_sizes(3, per_replica_batch_size=32) == (32, 96)


def test_global_batch_gives_per_replica_batch():
    assert _input_plan.resolve_batch_sizes(4, global_batch_size=128) == (32, 128)


def test_consistent_batch_sizes_are_accepted_together():
    assert _input_plan.resolve_batch_sizes(2, per_replica_batch_size=16, global_batch_size=32) == (
        16,
        32,
    )


def test_global_batch_not_divisible_by_replicas_names_the_nearest_sizes():
    with pytest.raises(ValueError, match=r"global_batch_size=100 .* 3 replicas.*99 or 102"):
        _input_plan.resolve_batch_sizes(3, global_batch_size=100)


def test_inconsistent_batch_sizes_say_what_the_global_batch_would_be():
    with pytest.raises(ValueError, match=r"16 \* 2 = 32.*only one"):
        _input_plan.resolve_batch_sizes(2, per_replica_batch_size=16, global_batch_size=48)


def test_missing_batch_size_asks_for_one():
    with pytest.raises(ValueError, match="per_replica_batch_size .* or global_batch_size"):
        _input_plan.resolve_batch_sizes(2)


@pytest.mark.parametrize("bad", [0, -8])
def test_batch_size_out_of_range_is_a_value_error(bad):
    with pytest.raises(ValueError, match="per_replica_batch_size must be a positive integer"):
        _input_plan.resolve_batch_sizes(2, per_replica_batch_size=bad)


@pytest.mark.parametrize("bad", [2.5, "32", True, 8.0])
def test_batch_size_of_another_type_is_a_type_error(bad):
    with pytest.raises(TypeError, match="per_replica_batch_size must be a positive integer"):
        _input_plan.resolve_batch_sizes(2, per_replica_batch_size=bad)


def test_unknown_last_batch_lists_the_modes():
    with pytest.raises(ValueError, match="last_batch must be one of 'drop', 'pad', 'partial'"):
        _input_plan.check_last_batch("keep")


def test_partial_last_batch_is_refused_when_shapes_must_be_static():
    with pytest.raises(ValueError, match="TPUs need the same shape"):
        _input_plan.check_last_batch("partial", static_shapes_required=True)


def test_partial_last_batch_is_refused_with_several_workers():
    with pytest.raises(ValueError, match="same number of steps"):
        _input_plan.check_last_batch("partial", num_workers=2)


def test_one_worker_shards_nothing():
    assert _input_plan.choose_shard_mode("auto", 1, num_files=8)[0] == "none"


def test_enough_files_shard_by_file():
    mode, reason, warning = _input_plan.choose_shard_mode("auto", 3, num_files=8)
    assert (mode, warning) == ("file", None)
    assert "8 files >= 3 workers" in reason


def test_too_few_files_fall_back_to_elements_with_a_warning_giving_the_counts():
    mode, _, warning = _input_plan.choose_shard_mode("auto", 3, num_files=2)
    assert mode == "element"
    assert "Only 2 file(s) for 3 workers" in warning


def test_file_sharding_with_too_few_files_is_refused():
    with pytest.raises(ValueError, match="2 files for 3 workers"):
        _input_plan.choose_shard_mode("file", 3, num_files=2)


def test_arrays_shard_by_element():
    assert _input_plan.choose_shard_mode("auto", 2)[0] == "element"


def test_unknown_shard_lists_the_modes():
    with pytest.raises(ValueError, match="shard must be one of 'auto', 'file', 'element'"):
        _input_plan.choose_shard_mode("data", 2)


def test_element_shares_are_disjoint_complete_and_differ_by_at_most_one():
    for num_workers in (2, 3):
        shares = [list(_input_plan.element_share(1001, num_workers, w)) for w in range(num_workers)]
        flat = [position for share in shares for position in share]
        assert sorted(flat) == list(range(1001))
        assert max(map(len, shares)) - min(map(len, shares)) <= 1


def test_files_are_assigned_to_balance_record_counts():
    assert _input_plan.assign_files([5, 3, 3, 2], 2) == [[0, 3], [1, 2]]
    assignment = _input_plan.assign_files([10, 1, 1, 1, 1, 9], 3)
    loads = [sum([10, 1, 1, 1, 1, 9][i] for i in files) for files in assignment]
    assert sorted(loads) == [4, 9, 10]
    assert sorted(i for files in assignment for i in files) == list(range(6))


def test_one_worker_schedules_match_the_docstring_example():
    drop = _input_plan.schedule_epoch([1001], 96, "drop")
    pad = _input_plan.schedule_epoch([1001], 96, "pad")
    partial = _input_plan.schedule_epoch([1001], 96, "partial")
    assert (drop.steps_per_epoch, drop.samples_dropped, drop.samples_padded) == (10, 41, 0)
    assert (pad.steps_per_epoch, pad.samples_dropped, pad.samples_padded) == (11, 0, 55)
    assert (partial.steps_per_epoch, partial.samples_dropped, partial.samples_padded) == (11, 0, 0)
    assert partial.examples_per_worker == (1001,)


@pytest.mark.parametrize("num_workers", [2, 3])
@pytest.mark.parametrize("last_batch", ["drop", "pad"])
def test_every_worker_runs_the_same_steps_and_reads_each_sample_at_most_once(
    num_workers, last_batch
):
    num_examples, global_batch_size = 1001, 8 * 2 * num_workers
    shares = [
        list(_input_plan.element_share(num_examples, num_workers, w)) for w in range(num_workers)
    ]
    schedule = _input_plan.schedule_epoch(list(map(len, shares)), global_batch_size, last_batch)
    per_worker_batch_size = global_batch_size // num_workers
    read = []
    for worker, share in enumerate(shares):
        kept = share[: schedule.examples_per_worker[worker]]
        rows = len(kept) + schedule.padding_per_worker[worker]
        # Each worker yields whole global batches that last num_workers steps.
        assert rows % global_batch_size == 0
        assert rows // per_worker_batch_size == schedule.steps_per_epoch
        read.extend(kept)
    assert len(read) == len(set(read))
    assert len(read) + schedule.samples_dropped == num_examples
    if last_batch == "pad":
        assert sorted(read) == list(range(num_examples))
        assert (
            schedule.samples_padded == schedule.steps_per_epoch * global_batch_size - num_examples
        )


def test_two_worker_schedule_matches_the_docstring_example():
    drop = _input_plan.schedule_epoch([501, 500], 32, "drop")
    pad = _input_plan.schedule_epoch([501, 500], 32, "pad")
    assert (drop.steps_per_epoch, drop.examples_per_worker, drop.samples_dropped) == (
        30,
        (480, 480),
        41,
    )
    assert (pad.steps_per_epoch, pad.padding_per_worker) == (32, (11, 12))


def test_unequal_file_shares_still_give_equal_steps():
    schedule = _input_plan.schedule_epoch([70, 40], 16, "pad")
    assert schedule.steps_per_epoch == 2 * 5
    assert schedule.padding_per_worker == (10, 40)


def test_drop_without_one_full_step_suggests_pad():
    with pytest.raises(ValueError, match="fewer than one global batch of 96.*last_batch='pad'"):
        _input_plan.schedule_epoch([50], 96, "drop")


def test_small_per_replica_batch_warns_on_accelerators_only():
    assert "at least 32" in _input_plan.small_batch_warning(8, "GPU")
    assert _input_plan.small_batch_warning(8, "CPU") is None
    assert _input_plan.small_batch_warning(32, "TPU") is None


def test_plan_reads_as_a_table():
    plan = _input_plan.InputPlan(
        num_examples=1001,
        num_replicas=4,
        num_workers=2,
        worker_index=1,
        per_replica_batch_size=8,
        global_batch_size=32,
        steps_per_epoch=32,
        last_batch="pad",
        shard_mode="element",
        shard_reason="arrays",
        samples_dropped_per_epoch=0,
        samples_padded_per_epoch=23,
        worker_examples=500,
        shuffle=True,
        seed=3,
        strategy="MultiWorkerMirroredStrategy",
    )
    text = str(plan)
    assert "8 per replica x 4 replicas = 32 global" in text
    assert "steps per epoch:  32" in text
    assert "0 dropped, 23 padded per epoch" in text
    assert "this is worker 1" in text and "500 samples, 16 per step" in text
    assert plan.per_worker_batch_size == 16
