"""``as_counts`` (``capgate._util.validate``): infinite, NaN and out-of-range counts are refused with
a message naming the value and its index, never a wrapped-round int64 or an empty ``[]``."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from capgate._util.validate import as_correct_and_k, as_counts


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ([1.0, float("inf")], r"`c` must hold whole numbers; got inf at index 1"),
        ([1.0, float("-inf")], r"`c` must hold whole numbers; got -inf at index 1"),
        ([2.0, float("nan")], r"`c` must hold whole numbers; got nan at index 1"),
        ([1.0, 2.5], r"`c` must hold whole numbers; got 2.5 at index 1"),
        ([1.0, 1e19], r"`c` must hold counts within int64's range; got 1e\+19 at index 1"),
        ([-1e19], r"`c` must hold counts within int64's range; got -1e\+19 at index 0"),
        (np.array([3, 2**63], dtype=np.uint64), r"within int64's range; got 9223372036854775808 at index 1"),
    ],
)
def test_as_counts_names_a_value_that_is_no_count(values: object, message: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "invalid value encountered in cast" either
        with pytest.raises(ValueError, match=message):
            as_counts("c", values)  # type: ignore[arg-type]


def test_as_counts_keeps_the_counts_it_accepts() -> None:
    assert as_counts("c", [0.0, 3.0, 2.0**62]).tolist() == [0, 3, 2**62]
    assert as_counts("c", np.array([5, 2**63 - 1], dtype=np.uint64)).tolist() == [5, 2**63 - 1]
    assert as_counts("c", [True, False]).tolist() == [1, 0]
    with pytest.raises(ValueError, match=r"`k` must hold counts within int64's range; got 1e\+19"):
        as_correct_and_k([1], [1e19], 1)
