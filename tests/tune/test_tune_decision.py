"""The pure core of tune: the keep/reject rule, the budget arithmetic and the candidates, on made-up numbers."""

import pytest

from keras_scaling.tune import _candidates, _decision


def _comparison(incumbent, candidate):
    return _decision.Comparison(tuple(incumbent), tuple(candidate))


def test_a_gain_well_beyond_the_noise_is_kept():
    decision = _decision.decide(_comparison([100, 110, 90], [210, 264, 234]))
    assert decision.kept
    assert "+1" in decision.reason  # +140%


def test_a_gain_within_the_noise_is_not_kept():
    comparison = _comparison([100, 100, 100], [90, 105, 110])
    assert comparison.ratio == pytest.approx(1.05)
    assert comparison.noise == pytest.approx(0.10)
    decision = _decision.decide(comparison)
    assert not decision.kept
    assert "within the noise" in decision.reason


def test_a_slower_candidate_is_never_kept():
    decision = _decision.decide(_comparison([100, 100, 100], [80, 81, 79]))
    assert not decision.kept
    assert decision.reason.startswith("slower")


def test_a_sure_but_tiny_gain_is_not_worth_a_change():
    decision = _decision.decide(_comparison([100, 100, 100], [101.5, 101.5, 101.5]))
    assert not decision.kept
    assert decision.reason == "+1.5% is below the 2% worth a change"


def test_a_gain_just_below_a_bound_is_not_shown_as_reaching_it():
    below_floor = _decision.decide(_comparison([100, 100, 100], [101.9, 101.9, 101.9]))
    assert below_floor.reason == "+1.9% is below the 2% worth a change"
    within_noise = _decision.decide(_comparison([100, 100, 100], [100.0, 102.9, 106.0]))
    assert within_noise.reason == "+2.9% is within the noise (3.0%)"


def test_a_sure_small_gain_is_kept_for_a_knob_but_not_for_the_best_against_the_start():
    comparison = _comparison([100, 100, 100], [104, 104.5, 104])
    assert _decision.decide(comparison).kept
    overall = _decision.decide(comparison, _decision.MIN_GAIN_OVERALL)
    assert not overall.kept
    assert "below the 5% worth a change" in overall.reason


def test_one_disturbed_round_of_five_does_not_decide():
    comparison = _comparison([100] * 5, [150, 150, 150, 150, 40])
    assert comparison.ratio == pytest.approx(1.5)
    assert comparison.noise == pytest.approx(0.0)  # 0.4 and one 1.5 left out
    assert _decision.decide(comparison).kept


def test_rounds_pair_up_in_the_order_they_ran():
    comparison = _comparison([100, 200], [200, 200])
    assert comparison.ratios == (2.0, 1.0)


@pytest.mark.parametrize(
    "incumbent, candidate",
    [((), ()), ((100,), (100, 100)), ((100, 0), (100, 100)), ((100,), (float("nan"),))],
)
def test_a_comparison_refuses_missing_or_non_positive_rates(incumbent, candidate):
    with pytest.raises(ValueError):
        _comparison(incumbent, candidate)


def test_a_gain_or_loss_twice_the_noise_is_clear_after_min_rounds():
    assert _decision.is_clear(_comparison([100, 100, 100], [190, 200, 210]))
    assert _decision.is_clear(_comparison([100, 100, 100], [50, 52, 54]))
    assert not _decision.is_clear(_comparison([100, 100], [190, 200]))
    assert not _decision.is_clear(_comparison([100, 100, 100], [102, 110, 118]))


def test_the_budget_gives_at_most_max_rounds_and_none_below_min_rounds():
    assert _decision.rounds_affordable(30, 4, 5) == _decision.MAX_ROUNDS
    assert _decision.rounds_affordable(5 + 4 * 3, 4, 5) == 3
    assert _decision.rounds_affordable(5 + 4 * 3 - 0.1, 4, 5) == 0
    assert _decision.rounds_affordable(100, 4, 5, reserve_s=90) == 0


def test_a_round_is_a_whole_number_of_calls():
    assert _decision.steps_per_round(0.002, 0.5, 16) == 256
    assert _decision.steps_per_round(1.0, 0.5, 8) == 8


def test_allow_takes_names_or_a_comma_separated_string():
    assert _candidates.parse_allow("batch,precision") == (
        "per_replica_batch_size",
        "mixed_precision",
    )
    assert _candidates.parse_allow(["batch"]) == ("per_replica_batch_size",)
    assert _candidates.parse_allow(()) == ()


def test_an_unknown_knob_in_allow_is_named_with_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown knob 'speed'.*batch, precision"):
        _candidates.parse_allow("batch,speed")


@pytest.mark.parametrize(
    "bound, first",
    [("host", "steps_per_execution"), ("input", "cache"), ("compute", "jit_compile")],
)
def test_the_remedy_of_the_bound_comes_first(bound, first):
    assert _candidates.knob_order(bound)[0] == first


def test_knobs_that_change_training_come_only_when_allowed():
    assert "per_replica_batch_size" not in _candidates.knob_order("synchronization")
    allowed = _candidates.parse_allow("batch")
    assert _candidates.knob_order("synchronization", allowed)[0] == "per_replica_batch_size"


def test_the_steps_per_execution_ladder_starts_at_the_advice():
    settings = {"compile": {"steps_per_execution": 1}, "data": {}, "strategy": {}}
    values = _candidates.values_to_try(
        "steps_per_execution", settings, advised_steps_per_execution=8
    )
    assert values == (8, 32, _candidates.LARGEST_STEPS_PER_EXECUTION)


def test_without_advice_the_steps_per_execution_ladder_goes_by_fours_to_the_largest():
    settings = {"compile": {"steps_per_execution": 1}, "data": {}, "strategy": {}}
    assert _candidates.values_to_try("steps_per_execution", settings) == (4, 16, 64)
    settings["compile"]["steps_per_execution"] = 16
    assert _candidates.values_to_try("steps_per_execution", settings) == (64,)


def test_advice_of_a_small_step_still_starts_the_ladder_at_four_times_the_current():
    settings = {"compile": {"steps_per_execution": 1}, "data": {}, "strategy": {}}
    values = _candidates.values_to_try(
        "steps_per_execution", settings, advised_steps_per_execution=2
    )
    assert values == (4, 16, 64)


def test_advice_beyond_the_largest_steps_per_execution_tries_the_largest():
    settings = {"compile": {"steps_per_execution": 1}, "data": {}, "strategy": {}}
    values = _candidates.values_to_try(
        "steps_per_execution", settings, advised_steps_per_execution=1024
    )
    assert values == (_candidates.LARGEST_STEPS_PER_EXECUTION,)


def test_xla_is_not_tried_on_several_logical_cpus():
    context = _candidates.Context(device_kind="CPU", local_replicas=2, pipeline_built=True)
    assert "XLA" in _candidates.reason_not_tried("jit_compile", context)
    one = _candidates.Context(device_kind="CPU", local_replicas=1, pipeline_built=True)
    assert _candidates.reason_not_tried("jit_compile", one) is None


def test_data_knobs_need_a_pipeline_tune_builds():
    context = _candidates.Context(device_kind="GPU", local_replicas=2, pipeline_built=False)
    assert "global batches" in _candidates.reason_not_tried("cache", context)
    shuffled = _candidates.Context(
        device_kind="GPU", local_replicas=2, pipeline_built=True, arrays=True
    )
    assert "memory already" in _candidates.reason_not_tried("cache", shuffled)


def test_a_cache_of_arrays_is_tried_unshuffled_when_their_copy_fits_in_half_the_free_memory():
    def context(array_bytes, free_bytes):
        return _candidates.Context(
            device_kind="CPU",
            local_replicas=2,
            pipeline_built=True,
            arrays=True,
            shuffled=False,
            array_bytes=array_bytes,
            free_bytes=free_bytes,
        )

    assert _candidates.reason_not_tried("cache", context(2**30, 2**31)) is None
    assert _candidates.reason_not_tried("cache", context(2**30, None)) is None
    reason = _candidates.reason_not_tried("cache", context(2**30 + 1, 2**31))
    assert reason == (
        "a copy of the arrays (1.0 GiB) would take more than half the free memory (2.0 GiB)"
    )


def test_a_larger_batch_states_the_learning_rate_scaling():
    settings = {"compile": {}, "data": {"per_replica_batch_size": 64}, "strategy": {}}
    assert "scale the learning rate by 2" in _candidates.describe_change(
        "per_replica_batch_size", 128, settings
    )


@pytest.mark.parametrize("bytes_per_pack", [0, 1, 41, 161, 641, 10**6])
def test_pack_count_is_the_number_of_packs_tensorflow_groups_the_gradients_into(bytes_per_pack):
    import tensorflow as tf
    from tensorflow.python.distribute import cross_device_utils

    sizes = (2048, 256, 256, 4, 4096, 36)
    gradients = [tf.zeros((size // 4,)) for size in sizes]
    # The all-reduce across workers packs the gradients last first.
    packs = cross_device_utils.group_by_size(gradients[::-1], bytes_per_pack)
    assert _candidates.pack_count(sizes, bytes_per_pack) == len(packs)


def test_bytes_per_pack_is_tried_at_the_sizes_that_split_the_gradients_otherwise():
    context = _candidates.Context(
        device_kind="CPU",
        local_replicas=2,
        pipeline_built=True,
        workers=2,
        communication_settable=True,
        gradient_sizes=(2048, 256, 256, 4),
    )
    settings = {"compile": {}, "data": {}, "strategy": {}}
    # A quarter (641 bytes) leaves one pack, a sixty-fourth the same 3 as a sixteenth.
    assert _candidates.values_to_try("bytes_per_pack", settings, context) == (161,)
    settings["strategy"]["bytes_per_pack"] = 161
    assert _candidates.values_to_try("bytes_per_pack", settings, context) == (0,)
    assert _candidates.reason_not_tried("bytes_per_pack", context) is None


def test_the_communication_across_workers_is_tried_on_gpus_only_against_what_auto_picks():
    def context(kind):
        return _candidates.Context(
            device_kind=kind, local_replicas=1, pipeline_built=True, workers=2,
            communication_settable=True,
        )  # fmt: skip

    settings = {"compile": {}, "data": {}, "strategy": {}}
    assert _candidates.reason_not_tried("communication", context("GPU")) is None
    assert _candidates.values_to_try("communication", settings, context("GPU")) == ("ring",)
    settings["strategy"]["communication"] = "ring"
    assert _candidates.values_to_try("communication", settings, context("GPU")) == ("nccl",)
    assert "NCCL needs GPUs" in _candidates.reason_not_tried("communication", context("CPU"))
    assert "waiting in the all-reduce" in _candidates.reason_not_tried(
        "jit_compile", context("GPU")
    )
