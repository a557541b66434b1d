"""Run any estimator over a labelled JSONL file (one :class:`~capgate.LabelledQuery` per line).

Each row needs a non-empty ``question``; the label fields (``k``/``correct`` or the paper's
``num_samples``/``num_correct``) are validated as :class:`~capgate.LabelledQuery` does. Bad rows
raise :class:`~capgate.DataError` naming the file, line and field before any model call is made.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from capgate._util.validate import check_positive_int
from capgate.core.types import Estimate, LabelledQuery
from capgate.errors import DataError
from capgate.estimators.base import CapabilityEstimator
from capgate.labels.labelled import iter_labelled

__all__ = ["estimate_jsonl"]


def estimate_jsonl(
    estimator: CapabilityEstimator, path: str | Path, *, batch_size: int = 16
) -> Iterator[tuple[LabelledQuery, Estimate]]:
    """Estimate every query of a labelled JSONL file, batch by batch, yielding ``(row, estimate)``.

    The whole file is read first (:func:`capgate.labels.labelled.iter_labelled`; blank lines
    skipped), so a bad row fails before any model call. Pair the usable results with a metric, e.g.
    ``capability_brier([e.p for _, e in pairs], [r.mu_hat for r, _ in pairs])``.

    Examples:
        >>> import json, tempfile
        >>> from capgate import Estimate
        >>> class Half(CapabilityEstimator):
        ...     method = "half"
        ...     def estimate(self, queries):
        ...         return [Estimate(p=0.5, method="half") for _ in queries]
        >>> with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        ...     _ = f.write(json.dumps({"id": "q1", "question": "2+2?", "k": 4, "correct": 3}) + "\\n")
        >>> [(row.mu_hat, est.p) for row, est in estimate_jsonl(Half(), f.name)]
        [(0.75, 0.5)]
        >>> import os; os.remove(f.name)
    """
    check_positive_int("batch_size", batch_size)
    rows: list[LabelledQuery] = []
    for line, row in iter_labelled(path):
        if not row.question or not row.question.strip():
            raise DataError(
                "a non-empty question is needed to estimate", path=path, line=line, field="question"
            )
        rows.append(row)
    for start in range(0, len(rows), batch_size):
        batch = rows[start : start + batch_size]
        estimates = estimator.estimate([row.question or "" for row in batch])
        yield from zip(batch, estimates, strict=True)
