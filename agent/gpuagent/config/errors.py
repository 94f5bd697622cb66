"""Configuration errors, and where in the file a key is (for the messages)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path


class ConfigError(ValueError):
    """An invalid configuration: ``key`` is dotted ("sources.nvml.interval_seconds").

    One error is one problem. Loading collects every problem in a file and raises them
    together (`ConfigError.of`): ``problems`` lists them, ``key``, ``line`` and ``problem``
    are the first one's, and ``str()`` shows each on a line of its own. ``file`` is set
    where the problem is in a fragment of config.d rather than in the file that was named
    (whose name the caller prints), and ``line`` is then that fragment's.
    """

    def __init__(
        self, message: str, *, key: str = "", line: int | None = None, file: Path | None = None
    ) -> None:
        self.key = key
        self.line = line
        self.file = file
        self.problem = message
        self.problems: tuple[ConfigError, ...] = (self,)
        place = [str(file)] if file is not None else []
        place += [f"line {line}"] if line is not None else []
        where = ", ".join(place)
        if key and where:
            prefix = f"{key} ({where}): "
        else:
            prefix = f"{key or where}: " if key or where else ""
        super().__init__(prefix + message)

    @classmethod
    def of(cls, problems: Sequence[ConfigError]) -> ConfigError:
        """One error for ``problems`` (at least one), in the order of their files (the named
        one first, then the fragments by name) and lines."""
        flat = [single for problem in problems for single in problem.problems]
        if not flat:
            raise ValueError("ConfigError.of needs at least one problem")
        ordered = sorted(
            flat, key=lambda p: (p.file is not None, str(p.file or ""), p.line is None, p.line or 0)
        )
        if len(ordered) == 1:
            return ordered[0]
        first = ordered[0]
        error = cls(first.problem, key=first.key, line=first.line, file=first.file)
        error.problems = tuple(ordered)
        lines = "".join(f"\n  {problem}" for problem in ordered)
        error.args = (f"{len(ordered)} problems:{lines}",)
        return error


_HEADER_RE = re.compile(r"^\s*\[\[?\s*([^\]]+?)\s*\]\]?\s*(#.*)?$")
_KEY_RE = re.compile(r"^\s*([A-Za-z0-9_\-\"'.]+?)\s*=")


def find_line(text: str, dotted: str) -> int | None:
    """Line (1-based) where ``dotted`` is set or its table opens; None if not found.

    TOML parsers do not report positions, so this walks table headers and key lines,
    which covers the plain files people write.
    """
    target = dotted.split(".")
    table: list[str] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        header = _HEADER_RE.match(raw)
        if header:
            table = [p.strip().strip("\"'") for p in header.group(1).split(".")]
            if table == target:
                return number
            continue
        key = _KEY_RE.match(raw)
        if key:
            path = table + [p.strip().strip("\"'") for p in key.group(1).split(".")]
            if path == target or path == target[: len(path)]:
                return number
    return None


def nth_line(text: str, key: str, value: int) -> int | None:
    """The line of the last ``key = value`` (an entry of an array of tables), else the key's."""
    name = key.rsplit(".", 1)[-1]
    pattern = re.compile(rf"^\s*{re.escape(name)}\s*=\s*{value}\s*(#.*)?$")
    lines = [n for n, raw in enumerate(text.splitlines(), start=1) if pattern.match(raw)]
    return lines[-1] if lines else find_line(text, key)
