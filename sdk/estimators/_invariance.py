""":class:`capgate.estimators.NuisanceProjection`: make a linear probe blind to edits that should not
move its estimate."""

from __future__ import annotations

import copy
import math

import numpy as np
import numpy.typing as npt

from capgate._util.validate import FloatArray, check_positive_int
from capgate.estimators._common import as_matrix, check_fitted
from capgate.estimators._convex import zscore
from capgate.estimators._linear_probe import LinearProbe
from capgate.estimators.base import Params


class NuisanceProjection(Params):
    """Removes from features the directions that label-irrelevant edits move them along.

    Text claiming the task is easy ("you know this one") moves the reader's hidden state without
    changing what the target can do. From paired features of queries without and with such edits,
    the projection learns those directions; a probe fitted on projected features is folded back
    (:meth:`fold`) into one that reads raw features at no run-time cost, whose estimate no edit
    shifting them within that span can change. Features are z-scored with the statistics of the training
    features given to :meth:`fit`; the edit shifts ``(edited - clean) / scale`` are decomposed by
    SVD (uncentred, so the mean shift counts), and the leading directions that together carry
    ``energy`` of their squared norm (at most ``max_directions``) are projected out.

    Args:
        energy: Share of the shifts' squared norm the removed directions must capture, in (0, 1].
        max_directions: Most directions removed.

    Attributes:
        mean_: Feature means of the training features.
        scale_: Their standard deviations (a constant column's replaced by 1).
        components_: Removed directions in z-scored space, orthonormal rows ``(r, dim)``.
        energy_: Share of the shifts' squared norm they capture.
        n_features_in_: Feature width.

    Examples:
        >>> rng = np.random.default_rng(0)
        >>> X = rng.normal(size=(200, 6))
        >>> shift = np.array([0.0, 0.0, 3.0, 0.0, 0.0, 0.0])  # what an "it's easy" edit adds
        >>> proj = NuisanceProjection().fit(X, X[:50], X[:50] + shift)
        >>> proj.components_.shape, bool(np.allclose(proj.transform(X + shift), proj.transform(X)))
        ((1, 6), True)
    """

    mean_: FloatArray | None
    scale_: FloatArray | None
    components_: FloatArray | None

    def __init__(self, *, energy: float = 0.9, max_directions: int = 32) -> None:
        self.energy = energy
        self.max_directions = max_directions
        self.mean_ = None
        self.scale_ = None
        self.components_ = None

    def fit(self, X: npt.ArrayLike, clean: npt.ArrayLike, edited: npt.ArrayLike) -> NuisanceProjection:
        """Learn the directions from paired features; ``X`` (training features) sets the z-scoring.

        Args:
            X: Training features ``(n, dim)`` (the data the probe will be fitted on).
            clean: Features of queries as they are ``(m, dim)``.
            edited: Features of the same queries with an edit each, row for row ``(m, dim)``.

        Returns:
            ``self``.

        Raises:
            ValueError: Bad settings, non-finite or wrongly shaped arrays (named), or edits that do
                not move the features at all.
        """
        if not (isinstance(self.energy, int | float) and math.isfinite(self.energy) and 0 < self.energy <= 1):
            raise ValueError(f"`energy` must be in (0, 1]; got {self.energy!r}")
        check_positive_int("max_directions", self.max_directions)
        train = as_matrix(X, name="X")
        before = as_matrix(clean, name="clean")
        after = as_matrix(edited, name="edited")
        dim = train.shape[1]
        for name, array in (("clean", before), ("edited", after)):
            if array.shape[1] != dim:
                raise ValueError(f"`{name}` has {array.shape[1]} features but `X` has {dim}")
        if before.shape != after.shape:
            raise ValueError(
                f"`clean` and `edited` must pair row for row; got shapes {before.shape} and {after.shape}"
            )
        mean, scale = zscore(train)
        shifts = (after - before) / scale
        _, singular, vt = np.linalg.svd(shifts, full_matrices=False)
        power = singular**2
        total = float(power.sum())
        if total <= 0:
            raise ValueError("the edits do not move the features: `edited` equals `clean`")
        captured = np.cumsum(power) / total
        r = min(int(np.searchsorted(captured, self.energy - 1e-12) + 1), self.max_directions, len(power))
        self.mean_, self.scale_ = mean, scale
        self.components_ = vt[:r]
        self.energy_ = float(captured[r - 1])
        self.n_features_in_ = dim
        return self

    def transform(self, X: npt.ArrayLike) -> FloatArray:
        """Z-scored features with the removed directions projected out, ``(n, dim)``."""
        check_fitted(self, "components_")
        assert self.mean_ is not None
        assert self.scale_ is not None
        assert self.components_ is not None
        array = as_matrix(X, name="X")
        if array.shape[1] != self.n_features_in_:
            raise ValueError(
                f"X has {array.shape[1]} features but the projection was fitted on {self.n_features_in_}"
            )
        z = (array - self.mean_) / self.scale_
        projected: FloatArray = z - (z @ self.components_.T) @ self.components_
        return projected

    def fold(self, probe: LinearProbe) -> LinearProbe:
        """A copy of ``probe`` (fitted on :meth:`transform` output) that reads raw features instead.

        Its predictions on raw ``X`` equal ``probe``'s on ``transform(X)``, and its weights are
        orthogonal (in z-scored space) to every removed direction. The copy records the
        projection in ``training_["nuisance_projection"]``.

        Raises:
            NotFittedError: The projection or the probe is not fitted.
            ValueError: The probe was fitted on another width.
        """
        check_fitted(self, "components_")
        check_fitted(probe, "coef_")
        assert self.mean_ is not None
        assert self.scale_ is not None
        assert self.components_ is not None
        assert probe.coef_ is not None
        assert probe.intercept_ is not None
        if probe.n_features_in_ != self.n_features_in_:
            raise ValueError(
                f"the probe reads {probe.n_features_in_} features "
                f"but the projection has {self.n_features_in_}"
            )
        w = probe.coef_.astype(np.float64)
        b = float(probe.intercept_)
        if probe.mean_ is not None and probe.scale_ is not None:
            # logit = w · (z' − m') / s' + b  with  z' = P z:  fold the probe's own z-scoring in.
            w = w / probe.scale_
            b = b - float(w @ probe.mean_)
        v = w - self.components_.T @ (self.components_ @ w)  # P w: P is symmetric
        folded = copy.deepcopy(probe)
        folded.mean_, folded.scale_ = self.mean_.copy(), self.scale_.copy()
        folded.coef_ = v.astype(np.float32)
        folded.intercept_ = b
        folded.training_ = {
            **(probe.training_ or {}),
            "nuisance_projection": {"directions": int(self.components_.shape[0]), "energy": self.energy_},
        }
        return folded
