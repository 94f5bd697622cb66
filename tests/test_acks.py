"""Acknowledgements: a finding held at OK until its fault comes again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuagent.acks import FILE_NAME, STARTUP_GRACE_SECONDS, AckBook, AckError
from gpuagent.model import Finding, GpuEvent, NodeHealth, Severity

BUS = "0000:3b:00.0"
OTHER = "0000:5d:00.0"
NOW = 1_700_000_000.0


def _finding(
    check: str = "xid",
    severity: Severity = Severity.CRITICAL,
    cause: str = "48",
    gpu: str = BUS,
    reason: str = "Xid 48 (DBE): uncorrectable ECC error, drain and reset required",
) -> Finding:
    return Finding(check, severity, reason, gpu, (("xid", 48),), "drain_and_reset", "", cause)


def _event(
    kind: str = "xid", code: int | None = 48, at: float = NOW + 10, gpu: str = BUS
) -> GpuEvent:
    return GpuEvent(f"kmsg:{kind}:{code}:{at}", "kmsg", kind, gpu, at, 0.0, code=code, line="x")  # type: ignore[arg-type]


def _held(book: AckBook, *findings: Finding) -> list[tuple[str, Severity, str]]:
    health = book.apply(NodeHealth(findings))
    return [(f.check, f.severity, f.reason) for f in health.findings]


def test_an_acknowledged_finding_is_ok_and_says_who_and_why(tmp_path: Path) -> None:
    book = AckBook(tmp_path)
    made = book.add([_finding(), _finding("thermal", Severity.OK, "")], "reseated", "ana", NOW)
    assert [(a.check, a.severity) for a in made] == [("xid", "CRITICAL")]
    [(check, severity, reason)] = _held(book, _finding())
    assert (check, severity) == ("xid", Severity.OK)
    assert reason.startswith("acknowledged by ana: reseated (was CRITICAL: Xid 48 (DBE)")
    held = book.apply(NodeHealth((_finding(),))).findings[0]
    assert held.action == "none"
    assert held.evidence_dict()["acknowledged_reason"] == "reseated"
    # Another GPU's same finding is not acknowledged.
    assert _held(book, _finding(gpu=OTHER))[0][1] is Severity.CRITICAL


def test_worse_lifts_it() -> None:
    book = AckBook(None)
    book.add([_finding(severity=Severity.WARN)], "known", "ana", NOW)
    assert _held(book, _finding(severity=Severity.WARN))[0][1] is Severity.OK
    assert _held(book, _finding(severity=Severity.CRITICAL))[0][1] is Severity.CRITICAL
    # Worse is the fault coming again: back at WARN it is not held any more.
    assert len(book) == 0
    assert _held(book, _finding(severity=Severity.WARN))[0][1] is Severity.WARN


@pytest.mark.parametrize(
    ("check", "event", "again"),
    [
        ("xid", _event("xid", 48), True),
        ("xid", _event("gsp", None), True),
        ("xid", _event("xid", 48, at=NOW - 5), False),  # from before the acknowledgement
        ("xid", _event("xid", 48, gpu=OTHER), False),
        ("xid", _event("aer", None), False),
        ("ecc", _event("xid", 48), True),  # ecc owns Xid 48's fault
        ("ecc", _event("xid", 13), False),
        ("row_remap", _event("xid", 64), True),
        ("aer", _event("aer", None), True),
        ("bus", _event("fallen_off_bus", None), True),
        ("thermal", _event("xid", 48), False),
    ],
)
def test_the_fault_coming_again_lifts_it(check: str, event: GpuEvent, again: bool) -> None:
    book = AckBook(None)
    book.add([_finding(check)], "known", "ana", NOW)
    book.offer_event(event)
    severity = _held(book, _finding(check))[0][1]
    assert severity is (Severity.CRITICAL if again else Severity.OK)


def test_a_finding_that_clears_ends_its_acknowledgement() -> None:
    book = AckBook(None)
    book.add([_finding()], "known", "ana", NOW)
    assert _held(book, _finding("xid", Severity.OK, "")) == [
        ("xid", Severity.OK, _finding(severity=Severity.OK, cause="").reason)
    ]
    assert len(book) == 0
    assert _held(book, _finding())[0][1] is Severity.CRITICAL  # a new fault


def test_after_a_restart_an_acknowledgement_waits_for_its_finding_to_show_again(
    tmp_path: Path,
) -> None:
    AckBook(tmp_path).add([_finding()], "known", "ana", NOW)
    clock = [0.0]
    book = AckBook(tmp_path, clock=lambda: clock[0])
    # The first snapshots after the start, before the kernel log is read again.
    assert _held(book, _finding("thermal", Severity.OK, "")) == [
        ("thermal", Severity.OK, _finding(severity=Severity.OK, cause="").reason)
    ]
    assert len(book) == 1
    clock[0] = 10.0
    assert _held(book, _finding())[0][1] is Severity.OK  # the record read again: held
    assert _held(book, _finding("thermal", Severity.OK, ""))  # then it clears: gone
    assert len(book) == 0
    # One whose finding never shows again is gone once the grace has passed.
    AckBook(tmp_path).add([_finding()], "known", "ana", NOW)
    late = AckBook(tmp_path, clock=lambda: clock[0])
    clock[0] += STARTUP_GRACE_SECONDS + 1
    late.apply(NodeHealth(()))
    assert len(late) == 0


def test_acknowledgements_survive_a_restart_and_a_bad_file_is_no_crash(tmp_path: Path) -> None:
    AckBook(tmp_path).add([_finding()], "known", "ana", NOW)
    saved = json.loads((tmp_path / FILE_NAME).read_text())
    assert saved["acks"][0]["reason"] == "known"
    assert _held(AckBook(tmp_path), _finding())[0][1] is Severity.OK
    (tmp_path / FILE_NAME).write_text("{not json")
    assert len(AckBook(tmp_path)) == 0


def test_an_acknowledgement_needs_a_reason() -> None:
    with pytest.raises(AckError, match="needs a reason"):
        AckBook(None).add([_finding()], "  ", "ana", NOW)


def test_an_unwritable_state_dir_keeps_it_in_memory(tmp_path: Path) -> None:
    book = AckBook(tmp_path / "missing")
    book.add([_finding()], "known", "ana", NOW)
    assert "cannot write" in book.error
    assert _held(book, _finding())[0][1] is Severity.OK
