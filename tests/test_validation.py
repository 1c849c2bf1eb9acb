"""canopy.validation: one argument order (value, name) and one rule: the wrong kind of value is
a TypeError, a value of the right kind out of range a ValueError; both name the parameter."""

from __future__ import annotations

import math

import numpy as np
import pytest

from canopy.validation import (
    check_count,
    check_http_url,
    check_nonnegative,
    check_number,
    check_open_unit,
    check_positive,
    check_text,
    check_whole,
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


def test_a_count_with_a_ceiling_names_its_range():
    assert check_count(5, "k", high=5) == 5
    for bad in (0, 6):
        with pytest.raises(ValueError, match=r"k must be in 1\.\.5"):
            check_count(bad, "k", high=5)
    with pytest.raises(TypeError, match="k must be an int"):
        check_count(True, "k", high=5)


def test_whole_numbers_may_come_as_floats_but_not_as_fractions():
    assert check_whole(1024.0, "m") == 1024 and type(check_whole(np.int32(7), "m")) is int
    for bad in (2.5, 0, -3.0):
        with pytest.raises(ValueError, match="m must be a whole number >= 1"):
            check_whole(bad, "m")
    for wrong_kind in ("8", None, True):
        with pytest.raises(TypeError, match="m must be a number"):
            check_whole(wrong_kind, "m")


def test_text_and_urls():
    assert check_text("x", "model") == "x"
    assert check_http_url("https://h/v1", "base_url") == "https://h/v1"
    with pytest.raises(TypeError, match="model must be a string"):
        check_text(3, "model")
    with pytest.raises(ValueError, match="model must be a non-empty string"):
        check_text("", "model")
    with pytest.raises(TypeError, match="base_url must be a string"):
        check_http_url(b"http://h", "base_url")
    with pytest.raises(ValueError, match="base_url must be an http"):
        check_http_url("ftp://h", "base_url")
