"""The SNIA steady-state rule on hand-computed series."""

import math

import pytest

from ckptqual.limits.steady import slope, steady_state


def test_slope_is_the_least_squares_fit_by_hand():
    """The one slope the rule and the steady-state figure share: rounds 0..3 of 1, 2, 2, 5 rise 6 / 5 = 1.2 a round."""
    assert slope([1, 2, 2, 5]) == pytest.approx(1.2)
    assert slope([3, 3, 3]) == 0


def test_flat_series_is_steady():
    result = steady_state([2.4] * 5)
    assert result.reached
    assert result.mean == pytest.approx(2.4)
    assert result.range_fraction == 0
    assert result.excursion_fraction == 0


def test_noise_within_bounds_is_steady():
    # mean 101.2; range 108 - 95 = 13 -> 12.85 %; slope -6/10 = -0.6 -> excursion 2.4 / 101.2 = 2.37 %
    result = steady_state([100, 108, 95, 104, 99])
    assert result.reached, result.reason
    assert result.mean == pytest.approx(101.2)
    assert result.range_fraction == pytest.approx(13 / 101.2)
    assert result.excursion_fraction == pytest.approx(2.4 / 101.2)
    assert result.reason.startswith("steady over the last 5 rounds")


def test_clear_trend_fails_on_slope_alone():
    # mean 108; range 16 -> 14.8 % (within 20 %); slope 4 -> excursion 16 / 108 = 14.8 % > 10 %
    result = steady_state([100, 104, 108, 112, 116])
    assert not result.reached
    assert result.range_fraction == pytest.approx(16 / 108)
    assert result.excursion_fraction == pytest.approx(16 / 108)
    assert "slope excursion exceeds 10%" in result.reason
    assert "range exceeds" not in result.reason


def test_big_outlier_fails_on_range_alone():
    # mean 106; range 30 -> 28.3 % > 20 %; symmetric position -> slope 0
    result = steady_state([100, 100, 130, 100, 100])
    assert not result.reached
    assert result.range_fraction == pytest.approx(30 / 106)
    assert result.excursion_fraction == pytest.approx(0)
    assert "range exceeds 20%" in result.reason


def test_range_exactly_at_the_limit_is_steady():
    # mean 100, range 20 -> exactly 20 %; slope (20 - 10) / 10 = 1 -> excursion 4 %
    result = steady_state([90, 110, 100, 100, 100])
    assert result.reached
    assert result.range_fraction == pytest.approx(0.2)
    assert result.excursion_fraction == pytest.approx(0.04)


def test_only_the_last_window_counts():
    ramp_then_flat = [50, 70, 90, 100, 101, 99, 100, 100]
    result = steady_state(ramp_then_flat)
    assert result.reached
    assert result.window == (100.0, 101.0, 99.0, 100.0, 100.0)
    assert not steady_state(ramp_then_flat[:6]).reached


def test_too_short():
    result = steady_state([1.0, 2.0, 3.0])
    assert not result.reached
    assert result.reason == "needs 5 rounds, got 3"
    assert result.mean is None


def test_custom_window_and_fractions():
    assert steady_state([100, 104, 108], window=3, max_slope_excursion_fraction=0.10).reached
    assert not steady_state([100, 104, 108], window=3, max_range_fraction=0.05).reached


@pytest.mark.parametrize("values", [[1, 1, 1, 1, math.nan], [1, 1, 1, 1, 0], [1, 1, 1, 1, -1]])
def test_rejects_values_without_meaning(values):
    with pytest.raises(ValueError, match="positive finite"):
        steady_state(values)


def test_rejects_a_window_too_small_for_a_line():
    with pytest.raises(ValueError, match="at least 2"):
        steady_state([1.0, 1.0], window=1)
