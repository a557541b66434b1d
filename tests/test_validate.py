"""The shared input checks in ``capgate._util.validate``."""

from __future__ import annotations

import pytest

from capgate._util.validate import check_choice
from capgate.estimators import ConstantPrior
from capgate.estimators.guarded import InjectionGuard


def test_check_choice_accepts_a_choice_and_names_the_setting_and_the_choices_otherwise() -> None:
    check_choice("mode", "b", ("a", "b"))
    with pytest.raises(ValueError, match=r"^`mode` must be 'a' or 'b'; got 'c'$"):
        check_choice("mode", "c", ("a", "b"))
    with pytest.raises(ValueError, match=r"^`loss` must be 'auto', 'sampled' or 'expected'; got None$"):
        check_choice("loss", None, ("auto", "sampled", "expected"))
    with pytest.raises(ValueError, match=r"^`kind` must be 'only'; got 'other'$"):
        check_choice("kind", "other", ("only",))


def test_an_estimator_setting_outside_its_choices_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"`on_claim` must be 'degrade' or 'strip'; got 'drop'"):
        InjectionGuard(ConstantPrior.from_mean(0.5, n_train=1), on_claim="drop")  # type: ignore[arg-type]
