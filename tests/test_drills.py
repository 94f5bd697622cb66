"""Drill lines parse back to what was drilled."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpuagent.drills import compose_line, write_kernel_line
from gpuagent.kernel.parse import canonical_pci, parse_message
from gpuagent.sources.kmsg import DRILL_MARKER

BUS = "0000:3b:00.0"


@pytest.mark.parametrize(
    ("kind", "values", "expected"),
    [
        ("xid", {"code": 79}, ("xid", 79, None)),
        ("xid", {"code": 13, "pid": 42, "name": "train"}, ("xid", 13, None)),
        ("sxid", {"code": 20034, "fatal": True}, ("sxid", 20034, None)),
        ("fallen_off_bus", {}, ("fallen_off_bus", None, None)),
        ("aer", {"severity": "fatal"}, ("aer", None, "fatal")),
        ("aer", {}, ("aer", None, "corrected")),
    ],
)
def test_drill_lines_parse_back(
    kind: str, values: dict[str, Any], expected: tuple[str, int | None, str | None]
) -> None:
    line = compose_line(kind, BUS, values)
    assert line.endswith(DRILL_MARKER)
    parsed = parse_message(line)
    assert (parsed.kind, parsed.code, parsed.aer_severity) == expected
    assert parsed.pci is not None
    assert canonical_pci(parsed.pci) == BUS


@pytest.mark.parametrize(
    ("kind", "values", "message"),
    [
        ("xid", {}, "code=N"),
        ("xid", {"code": "x"}, "code=N"),
        ("aer", {"severity": "bad"}, "severity"),
        ("nope", {}, "unknown drill"),
    ],
)
def test_bad_drills_are_refused(kind: str, values: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        compose_line(kind, BUS, values)


def test_write_to_a_file_appends_a_line(tmp_path: Path) -> None:
    path = tmp_path / "kern.log"
    path.write_text("")
    write_kernel_line(path, "one")
    write_kernel_line(path, "two")
    assert path.read_text() == "one\ntwo\n"
