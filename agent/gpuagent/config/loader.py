"""Loading: TOML text → the schema's dataclasses, checking every key on the way.

Unknown keys, wrong types, values outside a key's declared range (see
`gpuagent.config.ranges`), bad names and cross-key contradictions are all collected, each
naming its dotted key and, where the key appears in the file, its line; one `ConfigError`
then carries them all, so `gpuagent config check` lists every problem in a file at once.
A TOML syntax error stops parsing, so it is reported alone.
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
import types
import typing
from pathlib import Path
from typing import Any, Literal, TypeVar

from gpuagent.config.errors import ConfigError, find_line
from gpuagent.config.ranges import range_of
from gpuagent.config.rules import check_consistency, check_value
from gpuagent.config.schema import Config

T = TypeVar("T")


def load_config(path: Path | None) -> Config:
    """Load and validate ``path``; None gives the defaults."""
    if path is None:
        return Config()
    return parse_config(read_text(path))


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
    data = parse_toml(text)
    problems: list[ConfigError] = []
    config = _build(Config, data, text, "", problems)
    if config is not None:
        invalid = {problem.key for problem in problems}
        problems += check_consistency(config, text, invalid)
    if problems or config is None:
        raise ConfigError.of(problems)
    return config


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
