"""Saved formats: a file's header read as the pydantic model that declares it, with one rule for
what a bad one raises (a :class:`~capgate.errors.DataError` naming the file and the field)."""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from capgate._util.jsonl import data_error_from_validation

HeaderT = TypeVar("HeaderT", bound=BaseModel)


def read_saved(
    model: type[HeaderT], payload: object, path: str | Path, *, line: int | None = None
) -> HeaderT:
    """``payload`` (a saved file's parsed header, or its record on ``line``) validated as ``model``.

    Raises:
        DataError: A field is missing, of the wrong type or out of range; the message names
            ``path``, the line if given, and the field.

    Examples:
        >>> from pydantic import BaseModel
        >>> class Header(BaseModel):
        ...     n: int
        >>> read_saved(Header, {}, "x.npz")
        Traceback (most recent call last):
        ...
        capgate.errors.DataError: x.npz: field 'n': Field required
    """
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        raise data_error_from_validation(exc, path=path, line=line) from None
