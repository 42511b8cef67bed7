"""The arithmetic of explain: made-up variant timings in, the split and the verdict out."""

import pytest

from keras_scaling.explain import _split


def _timings(real, resident, amortized, one_replica, noise=0.0):
    def t(ms):
        return _split.timing([ms / 1e3, (ms + noise) / 1e3, (ms + 2 * noise) / 1e3])

    return dict(
        real=t(real),
        resident=t(resident),
        resident_amortized=t(amortized),
        one_replica=t(one_replica),
    )


def _split_of(
    real, resident, amortized, one_replica, noise=0.0, s=1, k=4, wait=None, pipeline=None
):
    """A split of made-up medians in ms; `wait` the input wait, `pipeline` its batch time."""
    return _split.split_step(
        **_timings(real, resident, amortized, one_replica, noise),
        steps_per_execution=s,
        amortized=k,
        input_wait=None if wait is None else _split.timing([wait / 1e3], zero_allowed=True),
        pipeline_batch_s=None if pipeline is None else pipeline / 1e3,
    )


def _ms(split, name):
    return round(split.part(name).time_s * 1e3, 6)


def test_parts_are_the_differences_of_the_variants_and_add_up_to_the_step():
    split = _split_of(real=10, resident=6, amortized=4, one_replica=3)
    assert _ms(split, "input") == 4
    assert _ms(split, "host") == pytest.approx(2 / 0.75)
    assert _ms(split, "synchronization") == 1
    assert _ms(split, "compute") == pytest.approx(3 - (2 / 0.75) / 4)
    assert split.rest_s == pytest.approx(0, abs=1e-12)
    assert sum(part.share for part in split.parts) == pytest.approx(1)


def test_a_difference_noise_made_negative_counts_as_zero_and_shows_in_the_rest():
    split = _split_of(real=5, resident=6, amortized=4, one_replica=3)
    assert _ms(split, "input") == 0
    assert split.rest_s == pytest.approx(-1e-3)


def test_host_per_call_scales_with_the_models_steps_per_execution():
    split = _split_of(real=10, resident=6, amortized=4, one_replica=3, s=2, k=8)
    host_per_call_ms = (6 - 4) / (1 / 2 - 1 / 8)
    assert split.host_per_call_s * 1e3 == pytest.approx(host_per_call_ms)
    assert _ms(split, "host") == pytest.approx(host_per_call_ms / 2)


def test_amortized_must_exceed_the_models_steps_per_execution():
    with pytest.raises(ValueError, match="amortized steps_per_execution must exceed 4"):
        _split_of(10, 6, 4, 3, s=4, k=4)


def test_timing_refuses_non_positive_step_times():
    with pytest.raises(ValueError, match="positive seconds"):
        _split.timing([0.01, 0.0])


def test_a_wait_may_be_zero_but_not_negative():
    assert _split.timing([0.0, 0.001], zero_allowed=True).median_s == 0.0005
    with pytest.raises(ValueError, match="seconds >= 0"):
        _split.timing([-0.001], zero_allowed=True)


def test_the_step_and_its_parts_count_the_median_round_not_the_fastest():
    # A round that drew batches buffered while other variants ran is the
    # fastest; the median of three is not fooled by it.
    real = _split.timing([0.004, 0.012, 0.013])
    resident = _split.timing([0.007, 0.007, 0.008])
    split = _split.split_step(
        real=real,
        resident=resident,
        resident_amortized=resident,
        one_replica=resident,
        steps_per_execution=1,
        amortized=4,
    )
    assert split.step_s == 0.012
    assert _ms(split, "input") == pytest.approx(5)


def test_the_input_part_is_the_measured_wait_and_the_parts_add_up_to_the_step():
    split = _split_of(real=12.7, resident=7.5, amortized=7.5, one_replica=7.5, wait=5.2)
    assert _ms(split, "input") == pytest.approx(5.2)
    assert split.rest_s == pytest.approx(0, abs=1e-9)
    assert split.input_free_step_s == pytest.approx(0.0075)


def test_freeing_compute_saves_nothing_when_the_pipeline_is_slower_than_training():
    # 12 ms to make a batch, 7.5 ms to train on it: the step is the pipeline's.
    split = _split_of(
        real=12.7, resident=7.5, amortized=7.5, one_replica=7.5, wait=5.2, pipeline=12
    )
    assert split.part("compute").time_s > split.part("input").time_s
    assert split.part("compute").saved_s == 0
    assert split.part("input").saved_s * 1e3 == pytest.approx(5.2)


def test_freeing_a_part_of_training_saves_it_up_to_its_lead_over_the_pipeline():
    # Training takes 12.5 ms, the pipeline 3 ms a batch: compute (11.5 ms)
    # can shorten the step by 12.5 - 3 ms before the step waits for data.
    split = _split_of(
        real=12.5, resident=12.5, amortized=12.5, one_replica=12.5, wait=0, pipeline=3
    )
    assert split.part("compute").saved_s * 1e3 == pytest.approx(9.5)
    assert split.part("input").saved_s == 0


def test_host_share_falls_with_more_steps_per_execution():
    split = _split_of(real=10, resident=10, amortized=3, one_replica=3, k=8)
    assert split.host_share_at(1) > split.host_share_at(8) > split.host_share_at(64)
    assert split.host_share_at(1) == pytest.approx(split.part("host").share)


def test_advised_steps_per_execution_brings_the_host_share_under_five_percent():
    split = _split_of(real=10, resident=10, amortized=3, one_replica=3, k=8)
    advised = _split.advised_steps_per_execution(split)
    assert split.host_share_at(advised) <= 0.05
    assert split.host_share_at(advised // 2) > 0.05


def test_implied_input_share_is_what_a_slower_pipeline_adds_to_the_step():
    # 64 samples at 3,200 samples/s: 20 ms a batch; training alone takes 5 ms.
    assert _split.implied_input_share(3200, 64, 0.005) == pytest.approx(0.75)
    assert _split.implied_input_share(64_000, 64, 0.005) == 0


def _verdict(split, **kwargs):
    arguments = dict(num_replicas=2, global_batch_size=64, per_replica_batch_size=32)
    arguments.update(kwargs)
    return _split.verdict(split, **arguments)


def test_largest_part_input_is_input_bound_with_both_rates():
    split = _split_of(real=20, resident=5, amortized=4, one_replica=3)
    verdict = _verdict(split, pipeline_samples_per_sec=3200, training_samples_per_sec=12800)
    assert verdict.bound == "input"
    assert "3,200 samples/s" in verdict.text and "12,800" in verdict.text
    assert "parallel `map`" in verdict.text


def test_input_slower_than_training_is_input_bound_though_compute_is_the_larger_part():
    split = _split_of(
        real=12.7, resident=7.5, amortized=7.5, one_replica=7.5, wait=5.2, pipeline=12
    )
    verdict = _verdict(
        split, pipeline_samples_per_sec=64 / 0.012, training_samples_per_sec=64 / 0.0075
    )
    assert verdict.bound == "input", verdict
    assert verdict.confidence == "clear", verdict
    assert any("compute is also" in note and "0.00 ms shorter" in note for note in verdict.notes)


def test_a_resident_step_that_contradicts_the_wait_makes_the_verdict_uncertain():
    # The run waits 5 ms per step, but on a resident batch it is no faster.
    split = _split_of(real=12, resident=12, amortized=12, one_replica=7, wait=5, pipeline=12)
    verdict = _verdict(split)
    assert verdict.bound == "input"
    assert verdict.confidence == "uncertain"
    assert any("the two measurements disagree" in note for note in verdict.notes)


def test_a_pipeline_faster_alone_than_training_but_waited_for_is_noted():
    split = _split_of(real=12.7, resident=7.5, amortized=7.5, one_replica=7.5, wait=5.2, pipeline=4)
    verdict = _verdict(split, pipeline_samples_per_sec=16000, training_samples_per_sec=8533)
    assert verdict.bound == "input"
    assert any("beside training the pipeline slows down" in note for note in verdict.notes)


def test_largest_part_synchronization_names_the_efficient_batch_of_a_sweep():
    split = _split_of(real=10, resident=10, amortized=9.5, one_replica=2)
    verdict = _verdict(split, efficient_per_replica_batch=256)
    assert verdict.bound == "synchronization"
    assert "is 256, from the sweep" in verdict.text


def test_largest_part_host_gives_the_measured_and_the_advised_host_share():
    split = _split_of(real=10, resident=10, amortized=3, one_replica=2.5, k=16)
    verdict = _verdict(split)
    assert verdict.bound == "host"
    assert f"from {split.part('host').share * 100:.0f}%" in verdict.text
    assert "steps_per_execution=16 took" in verdict.text


def test_largest_part_compute_is_good_and_gives_mfu():
    split = _split_of(real=10, resident=10, amortized=9.8, one_replica=9.7, k=64)
    verdict = _verdict(split, mfu=0.41)
    assert verdict.bound == "compute"
    assert "MFU 41%; mixed precision would help" in verdict.text


@pytest.mark.parametrize("mfu", [None, 0.41])
def test_a_compute_bound_model_in_mixed_precision_is_not_advised_mixed_precision(mfu):
    split = _split_of(real=10, resident=10, amortized=9.8, one_replica=9.7, k=64)
    verdict = _verdict(split, mfu=mfu, compute_dtype="float16")
    assert verdict.bound == "compute"
    assert "mixed precision" not in verdict.text
    assert "it computes in float16 already" in verdict.text


def test_parts_within_noise_make_the_verdict_uncertain_and_name_both():
    split = _split_of(real=10, resident=5.2, amortized=4.8, one_replica=4.8, noise=1.0)
    verdict = _verdict(split)
    assert verdict.confidence == "uncertain"
    assert "within noise of each other" in verdict.notes[0]


def test_parts_far_apart_make_the_verdict_clear():
    split = _split_of(real=20, resident=5, amortized=4, one_replica=3, noise=0.1)
    assert _verdict(split).confidence == "clear"


def test_logical_cpu_replicas_get_the_shared_cores_note():
    split = _split_of(real=20, resident=5, amortized=4, one_replica=3)
    notes = _verdict(split, host_cpu_replicas=True, cpu_cores=2).notes
    assert any("share its 2 cores" in note and "synchronization" in note for note in notes)


def test_table_has_a_row_per_replica_count():
    split = _split_of(real=20, resident=5, amortized=4, one_replica=3)
    lines = _split.format_table([(1, split), (2, split)]).splitlines()
    assert len(lines) == 4
    assert lines[2].split()[0] == "1" and lines[3].split()[0] == "2"
