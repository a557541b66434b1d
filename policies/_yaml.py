"""Policy files: safe YAML loading with every error located by line and field.

It validates as whatever pydantic model it is given (:class:`~capgate.policies.Policy`), so it
imports nothing of the policy model; writing a policy back is :meth:`Policy.to_yaml`.

Errors from pydantic carry a location such as ``('steps', 'plan', 'bands', 1, 'clarify', 'question')``;
the loader walks the same path through the node tree ``yaml.compose`` builds (with ``SafeLoader``)
to find the line, dropping the discriminator tags (``'clarify'``) that exist only in pydantic's view.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from capgate.errors import DataError
from capgate.policies._bands import check_edges
from capgate.policies._base import Loc, PolicyIssueError

Model = TypeVar("Model", bound=BaseModel)


class PolicyError(DataError):
    """A policy file has problems; ``errors`` holds each one with its line and field.

    The exception's own ``path`` / ``line`` / ``field`` are those of the first problem; its text lists
    all of them, one a line.

    Attributes:
        errors: Every problem found, in file order.
    """

    def __init__(self, errors: Sequence[DataError]) -> None:
        if not errors:
            raise ValueError("PolicyError needs at least one error")
        self.errors = tuple(errors)
        first = self.errors[0]
        super().__init__(first.message, path=first.path, line=first.line, field=first.field)

    def _render(self) -> str:
        return "\n".join(str(e) for e in self.errors)


def load_policy_file(path: str | Path, *, model: type[Model]) -> Model:
    """Read and validate a policy file as ``model``; a :class:`PolicyError` lists every problem."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PolicyError([DataError(f"cannot read policy file: {exc}", path=path)]) from None
    return parse_policy(text, source=str(path), model=model)


class _SafeLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` whose bad dates (``2026-13-45``) are located errors, not bare ValueErrors."""

    def construct_yaml_timestamp(self, node: yaml.Node) -> Any:
        try:
            return super().construct_yaml_timestamp(node)  # type: ignore[arg-type]
        except ValueError as exc:
            msg = f"not a valid date: {exc}"
            raise yaml.constructor.ConstructorError(None, None, msg, node.start_mark) from None


_SafeLoader.add_constructor("tag:yaml.org,2002:timestamp", _SafeLoader.construct_yaml_timestamp)


def parse_policy(text: str, *, model: type[Model], source: str = "<string>") -> Model:
    """Validate YAML ``text`` as ``model``, named ``source``; a :class:`PolicyError` lists all problems."""
    try:
        loader = _SafeLoader(text)
    except yaml.reader.ReaderError as exc:  # a control character: refused before parsing
        at = text[: exc.position].count("\n") + 1
        raise PolicyError([DataError(f"not valid YAML: {exc.reason}", path=source, line=at)]) from None
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        problem = " ".join(p for p in (exc.context, exc.problem) if p)
        raise PolicyError([DataError(f"not valid YAML: {problem}", path=source, line=line)]) from None
    except (yaml.YAMLError, ValueError, TypeError, OverflowError, RecursionError) as exc:
        # anything else the constructor raises (a document nested too deep...): still located by file
        msg = f"not valid YAML: {type(exc).__name__}: {exc}"
        raise PolicyError([DataError(msg, path=source)]) from None
    finally:
        loader.dispose()
    if not isinstance(node, yaml.MappingNode) or not isinstance(data, dict):
        got = "an empty file" if data is None else f"a {type(data).__name__}"
        line = node.start_mark.line + 1 if node is not None else 1
        raise PolicyError(
            [DataError(f"a policy file must be a YAML mapping; got {got}", path=source, line=line)]
        )
    errors = list(_duplicate_keys(node, source))
    try:
        policy = model.model_validate(data)
    except ValidationError as exc:
        errors.extend(_located_errors(exc, node, source, model))
        errors.extend(_raw_band_errors(exc, data, node, source))
        policy = None
    if errors:
        errors.sort(key=lambda e: e.line or 0)
        raise PolicyError(errors)
    assert policy is not None
    return policy


def _duplicate_keys(node: yaml.Node, source: str, path: str = "") -> Iterator[DataError]:
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key, value in node.value:
            name = str(key.value)
            line = key.start_mark.line + 1
            field = f"{path}.{name}" if path else name
            if name in seen:
                msg = f"duplicate key {name!r} (first at line {seen[name]}); YAML would keep only the last"
                yield DataError(msg, path=source, line=line, field=field)
            else:
                seen[name] = line
            yield from _duplicate_keys(value, source, field)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            yield from _duplicate_keys(item, source, f"{path}[{i}]")


def _walk(root: yaml.Node, loc: Loc) -> tuple[int, str, yaml.Node | None]:
    """Follow ``loc`` through the YAML nodes: (line, dotted field, node reached or None)."""
    node: yaml.Node | None = root
    line = root.start_mark.line + 1
    field = ""
    for i, part in enumerate(loc):
        is_last = i == len(loc) - 1
        if isinstance(node, yaml.MappingNode) and isinstance(part, str):
            for key, value in node.value:
                if key.value == part:
                    line, node = key.start_mark.line + 1, value
                    field = f"{field}.{part}" if field else part
                    break
            else:
                if is_last:  # a missing or unknown key: the enclosing mapping's line
                    field = f"{field}.{part}" if field else part
                # otherwise a discriminator tag pydantic adds to the path: skip it
            continue
        if isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
            field = f"{field}[{part}]"
            continue
        # the value here is a shorthand (a scalar expanded before validation): stop at it
        node = None
        break
    return line, field, node


def _located_errors(
    exc: ValidationError, root: yaml.Node, source: str, model: type[BaseModel]
) -> Iterator[DataError]:
    for err in exc.errors():
        loc: Loc = tuple(err["loc"])
        ctx, kind = err.get("ctx", {}), err["type"]
        if isinstance(ctx.get("error"), PolicyIssueError):
            for sub, msg in ctx["error"].issues:
                yield _at(root, loc + sub, msg, source)
        elif kind in ("union_tag_invalid", "union_tag_not_found"):
            members = _type_at(loc, model)
            key, tags = (_tags(members) if isinstance(members, list) else None) or ("action", [])
            expected = ", ".join(tags) or str(ctx.get("expected_tags", "")).replace("'", "")
            tag = ctx.get("tag")
            what = f"unknown {key} {tag!r}" if kind == "union_tag_invalid" else f"missing key {key!r}"
            yield _at(root, (*loc, key), f"{what}; expected one of: {expected}", source)
        elif kind == "extra_forbidden":
            allowed = _allowed_keys(loc[:-1], model)
            hint = f" (allowed here: {', '.join(allowed)})" if allowed else ""
            yield _at(root, loc, f"unknown key {loc[-1]!r}{hint}", source)
        elif kind == "missing":
            yield _at(root, loc, f"missing required key {loc[-1]!r}", source)
        else:
            msg = str(err["msg"]).removeprefix("Value error, ")
            value = err.get("input")
            if not isinstance(value, dict | list) and kind != "value_error":
                msg = f"{msg}; got {value!r}"
            yield _at(root, loc, msg, source)


def _raw_band_errors(
    exc: ValidationError, data: dict[str, Any], root: yaml.Node, source: str
) -> Iterator[DataError]:
    """Order/coverage problems of band lists whose items failed validation (so the check never ran)."""
    failed = [tuple(err["loc"]) for err in exc.errors()]
    lists: list[tuple[Loc, Any]] = [(("bands",), data.get("bands"))]
    for table in ("steps", "tools"):
        entries = data.get(table)
        if isinstance(entries, dict):
            for key, entry in entries.items():
                if isinstance(entry, dict):
                    lists.append(((table, key, "bands"), entry.get("bands")))
    for path, raw in lists:
        if not isinstance(raw, list) or not raw or not all(isinstance(b, dict) for b in raw):
            continue
        n = len(path)
        if not any(loc[:n] == path and len(loc) > n and isinstance(loc[n], int) for loc in failed):
            continue
        edges = _raw_edges(raw)
        if edges is None:
            continue  # an edge is itself invalid (already reported): the order cannot be judged
        for sub, msg in check_edges(edges):
            yield _at(root, path + sub, msg, source)


def _raw_edges(raw: list[dict[str, Any]]) -> list[tuple[float | None, float | None]] | None:
    """``(below, at_least)`` of raw bands, or None when some edge is not a number in [0, 1]."""

    def edge(value: Any) -> float | None:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value <= 1.0:
            raise ValueError(value)
        return float(value)

    try:
        return [(edge(band.get("below")), edge(band.get("at_least"))) for band in raw]
    except ValueError:
        return None


def _at(root: yaml.Node, loc: Loc, message: str, source: str) -> DataError:
    line, field, _ = _walk(root, loc)
    return DataError(message, path=source, line=line, field=field or None)


def _allowed_keys(loc: Loc, model: type[BaseModel]) -> list[str]:
    """The keys the model at ``loc`` accepts."""
    current = _type_at(loc, model)
    if isinstance(current, type) and issubclass(current, BaseModel):
        return list(current.model_fields)
    return []


def _type_at(loc: Loc, model: type[BaseModel]) -> Any:
    """The type at ``loc`` (unwrapped; None if not found), following fields, list items, dict values
    and tags."""
    current: Any = model
    for part in loc:
        current = _unwrap(current)
        if isinstance(current, list):  # union of models, selected by tag
            tagged = _tags(current)
            by_tag = dict(zip(tagged[1], current, strict=True)) if tagged is not None else {}
            if part in by_tag:
                current = by_tag[part]
                continue
            return None
        if isinstance(current, type) and issubclass(current, BaseModel) and isinstance(part, str):
            field = current.model_fields.get(part)
            if field is None:
                return None
            current = field.annotation
        elif typing.get_origin(current) in (list, dict):
            current = typing.get_args(current)[-1]
        else:
            return None
    return _unwrap(current)


def _unwrap(tp: Any) -> Any:
    """Strip Annotated and Optional; a union of models becomes a list of them."""
    while True:
        origin = typing.get_origin(tp)
        if origin is typing.Annotated:
            tp = typing.get_args(tp)[0]
        elif origin in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(tp) if a is not type(None)]
            if len(args) == 1:
                tp = args[0]
                continue
            return [_unwrap(a) for a in args]
        else:
            return tp


def _tags(members: list[Any]) -> tuple[str, list[str]] | None:
    """The key that tags a union of models (``action``, a stop rule's ``rule``) and each member's tag:
    the first field that is a one-value Literal in every member; None if there is none."""
    if not all(isinstance(m, type) and issubclass(m, BaseModel) for m in members):
        return None
    for key in members[0].model_fields:
        values: list[str] = []
        for member in members:
            field = member.model_fields.get(key)
            args = typing.get_args(field.annotation) if field is not None else ()
            if field is None or typing.get_origin(field.annotation) is not typing.Literal or len(args) != 1:
                break
            values.append(str(args[0]))
        else:
            return key, values
    return None
