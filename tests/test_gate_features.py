"""Features kept for learning (issue 26 §1, the gate's side): a probe's features ride along with its
estimates, and a gate with ``log_features`` writes each logged decision's reader features to its log
(a non-probe estimator's are computed beside the call, never delaying or failing it)."""

from __future__ import annotations

import json

import numpy as np
from _probe_helpers import CharCountFeaturizer, linear_capability, random_queries, sampled_mu_hat

from capgate import Decision, Estimate
from capgate.estimators import LinearProbe, ProbeEstimator


def _fitted_probe(featurizer: CharCountFeaturizer | None = None) -> ProbeEstimator:
    featurizer = featurizer or CharCountFeaturizer(dim=8, seed=3)
    queries = random_queries(120, seed=1)
    mu = linear_capability(featurizer.transform(queries), seed=2)
    probe = ProbeEstimator(featurizer, LinearProbe(lr=0.05, validation_fraction=None, max_epochs=30))
    return probe.fit(queries, sampled_mu_hat(mu, k=8, seed=4))


# --------------------------------------------------------------------------- the side channel


def test_a_probe_estimate_carries_the_features_it_was_made_from_and_they_are_never_serialized() -> None:
    featurizer = CharCountFeaturizer(dim=8, seed=3)
    probe = _fitted_probe(featurizer)
    queries = ["how many legs has a spider?", "prove that there are infinitely many primes"]
    estimates = probe.estimate(queries)
    expected = featurizer.transform(queries)
    for estimate, row in zip(estimates, expected, strict=True):
        carried = estimate.features()
        assert carried is not None
        assert carried.vector.dtype == np.float32
        np.testing.assert_array_equal(carried.vector, row)
        assert carried.spec == featurizer.spec  # the featurizer's spec, as a dict
        dumped = estimate.model_dump_json()
        assert "features" not in dumped
        assert str(float(row[0]))[:6] not in dumped
        # equality is about the estimate, not what rides along with it
        assert estimate == Estimate.model_validate_json(dumped)
    # each estimate owns its row (a copy), not a view that keeps the batch alive
    assert estimates[0].features().vector.base is None  # type: ignore[union-attr]


def test_a_copied_estimate_keeps_its_features_and_a_plain_one_has_none() -> None:
    estimate = Estimate(p=0.4, method="probe").with_features([0.5, -1.0], {"model_id": "m", "dim": 2})
    moved = estimate.model_copy(update={"p": 0.6, "method": "probe+isotonic"})  # as Recalibrated does
    assert moved.features() is not None
    assert moved.features().vector.tolist() == [0.5, -1.0]  # type: ignore[union-attr]
    assert Estimate(p=0.4, method="verbalized").features() is None


def test_a_degraded_probe_estimate_carries_no_features() -> None:
    class Broken(CharCountFeaturizer):
        def transform(self, queries):  # type: ignore[no-untyped-def]
            out = super().transform(queries)
            out[:] = np.nan
            return out

    probe = _fitted_probe()
    probe.featurizer = Broken(dim=8, seed=3)
    (estimate,) = probe.estimate(["what is 2 + 2?"])
    assert estimate.degraded
    assert estimate.features() is None


# --------------------------------------------------------------------------- decision fields


def test_a_decision_records_its_calibration_version_and_what_it_was_made_beside() -> None:
    estimate = Estimate(p=0.3, method="probe")
    plain = Decision(action="abstain", estimate=estimate, reason="low")
    assert plain.calibration is None
    assert plain.beside is None
    candidate = Decision(
        action="answer",
        estimate=estimate,
        reason="ok",
        shadow=True,
        calibration="cal-0123456789ab",
        beside=plain.id,
    )
    data = json.loads(candidate.model_dump_json())
    assert data["calibration"] == "cal-0123456789ab"
    assert data["beside"] == plain.id
    assert Decision.model_validate(data) == candidate
    # a decision stored before these fields existed still loads
    old = json.loads(plain.model_dump_json())
    del old["calibration"], old["beside"]
    assert Decision.model_validate(old).calibration is None
