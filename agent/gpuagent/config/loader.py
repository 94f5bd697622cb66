"""Loading: TOML text → the schema's dataclasses, checking every key on the way.

Unknown keys, wrong types, values outside a key's declared range (see
`gpuagent.config.ranges`), bad names and cross-key contradictions are all collected, each
naming its dotted key and, where the key appears in the file, its line; one `ConfigError`
then carries them all, so `gpuagent config check` lists every problem in a file at once.
A TOML syntax error stops parsing, so it is reported alone.

A configuration file ``NAME.toml`` may have fragments beside it, ``NAME.d/*.toml``, read
in name order and merged over it: tables merge key by key, any other value (an array, an
array of tables included) is replaced whole by the later file's. A problem with a value
that came from a fragment names that fragment and its line.
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, NamedTuple, TypeVar

from gpuagent.config.errors import ConfigError, find_line
from gpuagent.config.ranges import range_of
from gpuagent.config.rules import check_consistency, check_value
from gpuagent.config.schema import Config

T = TypeVar("T")


def load_config(path: Path | None) -> Config:
    """Load and validate ``path`` with its fragments merged over it; None gives the
    defaults."""
    if path is None:
        return Config()
    main = _Document(None, read_text(path))
    fragments = [_Document(file, read_text(file)) for file in fragments_of(path)]
    return _parse_merged([main, *fragments])


def fragments_of(path: Path) -> list[Path]:
    """The fragments of configuration file ``path``: ``<stem>.d/*.toml`` beside it, in name
    order (hidden files left out: editors' and ConfigMap volumes' own entries); none when
    the directory is absent."""
    directory = path.parent / f"{path.stem}.d"
    try:
        entries = sorted(directory.iterdir(), key=lambda entry: entry.name)
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise ConfigError(f"cannot read {directory}: {exc.strerror}") from None
    return [
        entry
        for entry in entries
        if entry.suffix == ".toml" and not entry.name.startswith(".") and entry.is_file()
    ]


def read_text(path: Path) -> str:
    """A configuration-like file's text, or a ConfigError saying why it can't be had."""
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path} is not UTF-8 text") from None


def parse_config(text: str) -> Config:
    """The configuration ``text`` describes; a ConfigError listing every problem in it."""
    return _parse_merged([_Document(None, text)])


class _Document(NamedTuple):
    path: Path | None  # None: the file the caller named (it prints the name)
    text: str


def _parse_merged(documents: Sequence[_Document]) -> Config:
    """The configuration of the first document with the others merged over it, each
    problem placed in the document its value came from."""
    tables = []
    for document in documents:
        try:
            tables.append(parse_toml(document.text))
        except ConfigError as exc:
            raise ConfigError(exc.problem, line=exc.line, file=document.path) from None
    merged: dict[str, Any] = {}
    for table in tables:
        merged = _merge(merged, table)
    main = documents[0].text
    problems: list[ConfigError] = []
    config = _build(Config, merged, main, "", problems)
    if config is not None:
        invalid = {problem.key for problem in problems}
        problems += check_consistency(config, main, invalid)
    if problems or config is None:
        raise ConfigError.of([_placed(p, documents, tables) for p in problems])
    return config


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``over`` merged over ``base``: tables key by key, anything else replaced."""
    merged = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _placed(
    problem: ConfigError, documents: Sequence[_Document], tables: Sequence[dict[str, Any]]
) -> ConfigError:
    """``problem`` (its line found in the first document) in the document that set its key
    last: for a key no document sets (a required one missing), the one that set the
    nearest table around it."""
    parts = problem.key.split(".") if problem.key else []
    for length in range(len(parts), 0, -1):
        for index in reversed(range(len(documents))):
            if _sets(tables[index], parts[:length]):
                if index == 0:
                    return problem
                document = documents[index]
                line = find_line(document.text, problem.key) or find_line(
                    document.text, ".".join(parts[:length])
                )
                return ConfigError(problem.problem, key=problem.key, line=line, file=document.path)
    return problem


def _sets(table: dict[str, Any], parts: list[str]) -> bool:
    """Whether ``table`` sets the dotted key ``parts``; a key within an array of tables is
    set where the array is (the array is one value, replaced whole)."""
    node: Any = table
    for part in parts:
        if isinstance(node, list):
            return True
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def parse_toml(text: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        line_match = re.search(r"line (\d+)", str(exc))
        message = re.sub(r"\s*\(at line \d+, column \d+\)", "", str(exc))
        line = int(line_match.group(1)) if line_match else None
        raise ConfigError(f"invalid TOML: {message}", line=line) from None


def build_dataclass(cls: type[T], data: dict[str, Any], text: str, prefix: str = "") -> T:
    """Build dataclass ``cls`` from a TOML table; a ConfigError listing every unknown key,
    wrong type and out-of-range value in it."""
    problems: list[ConfigError] = []
    built = _build(cls, data, text, prefix, problems)
    if problems or built is None:
        raise ConfigError.of(problems)
    return built


class _DroppedError(Exception):
    """A table that could not be built; its problems are already collected."""


def _build(
    cls: type[T], data: dict[str, Any], text: str, prefix: str, problems: list[ConfigError]
) -> T | None:
    """``cls`` from ``data``, adding each problem to ``problems``; a key with a problem keeps
    its default. None when a required key is missing or invalid."""
    hints = typing.get_type_hints(cls, include_extras=True)
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    names = {f.name for f in fields}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if key not in names:
            known = ", ".join(sorted(names))
            problems.append(
                ConfigError(
                    f"unknown key (known here: {known})", key=dotted, line=find_line(text, dotted)
                )
            )
            continue
        try:
            converted = _convert(hints[key], value, dotted, text, problems)
        except ConfigError as exc:
            problems.append(exc)
            continue
        except _DroppedError:
            continue
        problem = check_value(dotted, converted)
        if problem:
            problems.append(ConfigError(problem, key=dotted, line=find_line(text, dotted)))
            continue
        kwargs[key] = converted
    required = [
        f.name
        for f in fields
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    for name in required:
        if name not in data:
            table = prefix.rstrip(".")
            problems.append(
                ConfigError(
                    "missing required key", key=f"{prefix}{name}", line=find_line(text, table)
                )
            )
    if any(name not in kwargs for name in required):
        return None
    return cls(**kwargs)


def _convert(  # noqa: PLR0911, PLR0912, C901
    hint: Any, value: Any, key: str, text: str, problems: list[ConfigError]
) -> Any:
    """``value`` as ``hint`` says; ConfigError for a wrong type or a value out of range."""

    def fail(expected: str) -> ConfigError:
        shown = f"{type(value).__name__} {value!r}"
        return ConfigError(f"expected {expected}, got {shown}", key=key, line=find_line(text, key))

    origin = typing.get_origin(hint)
    if origin is typing.Annotated:
        converted = _convert(typing.get_args(hint)[0], value, key, text, problems)
        bounds = range_of(hint)
        problem = bounds.problem(converted) if bounds is not None else None
        if problem:
            raise ConfigError(problem, key=key, line=find_line(text, key))
        return converted
    if dataclasses.is_dataclass(hint):
        if not isinstance(value, dict):
            raise fail("a table")
        built = _build(typing.cast("type[Any]", hint), value, text, f"{key}.", problems)
        if built is None:
            raise _DroppedError
        return built
    if origin is Literal:
        choices = typing.get_args(hint)
        # By type as well as value: to Python 1 == True, but `1` is no `true` in TOML.
        if not any(type(value) is type(c) and value == c for c in choices):
            raise fail("one of " + ", ".join(repr(c) for c in choices))
        return value
    if origin in (types.UnionType, typing.Union):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return _convert(args[0], value, key, text, problems)
    if origin is dict:  # dict[str, str]: a table of strings (e.g. agent.labels)
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            raise fail("a table of strings")
        return dict(value)
    if origin is list:
        if not isinstance(value, list):
            raise fail("a list")
        return _convert_list(typing.get_args(hint)[0], value, key, text, problems)
    if hint is bool:
        if not isinstance(value, bool):
            raise fail("true or false")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise fail("an integer")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise fail("a number")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise fail("a string")
        return value
    if hint is Path:
        if not isinstance(value, str) or not value:
            raise fail("a non-empty path string")
        return Path(value)
    raise fail(str(hint))  # pragma: no cover - a schema type this loader does not know


def _convert_list(
    item: Any, value: list[Any], key: str, text: str, problems: list[ConfigError]
) -> list[Any]:
    """A list of ``item``: the first bad plain value is the key's problem; each table's
    problems are collected, and the tables that could be built are kept (so cross-key
    rules still see them)."""
    items = []
    for entry in value:
        try:
            items.append(_convert(item, entry, key, text, problems))
        except _DroppedError:
            continue
    return items
