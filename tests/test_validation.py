"""canopy.validation: one argument order (value, name) and one rule: the wrong kind of value is
a TypeError, a value of the right kind out of range a ValueError; both name the parameter."""

from __future__ import annotations

import math

import numpy as np
import pytest

from canopy.validation import (
    check_count,
    check_nonnegative,
    check_number,
    check_open_unit,
    check_positive,
)


@pytest.mark.parametrize("check", [check_positive, check_nonnegative, check_open_unit,
                                   lambda v, n: check_number(v, n, low=0, high=1)])
@pytest.mark.parametrize("wrong_kind", ["0.5", True, None, [1], np.bool_(True)])
def test_the_wrong_kind_is_a_type_error_naming_the_parameter(check, wrong_kind):
    with pytest.raises(TypeError, match="speed"):
        check(wrong_kind, "speed")


@pytest.mark.parametrize("check, bad, words", [
    (check_positive, 0.0, "speed must be a finite number > 0"),
    (check_positive, math.inf, "> 0"), (check_nonnegative, -1e-9, ">= 0"),
    (check_open_unit, 1.0, "in (0, 1)"), (check_open_unit, math.nan, "in (0, 1)"),
    (lambda v, n: check_number(v, n, high=2), 3, "<= 2"),
])
def test_out_of_range_is_a_value_error_naming_the_bound(check, bad, words):
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        check(bad, "speed")


def test_good_values_come_back_typed():
    assert check_positive(np.float32(2.5), "x") == 2.5 and check_positive(None, "x",
                                                                           allow_none=True) is None
    assert check_open_unit(0.5, "x") == 0.5 and check_nonnegative(0, "x") == 0.0
    assert check_count(np.int64(3), "n") == 3 and type(check_count(3, "n")) is int
    with pytest.raises(TypeError, match="n must be an int"):
        check_count(3.0, "n")
    with pytest.raises(ValueError, match="n must be >= 4"):
        check_count(3, "n", low=4)
