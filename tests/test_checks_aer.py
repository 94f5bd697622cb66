"""aer: PCIe AER reports from the kernel and AER totals from sysfs, GPU and bridges."""

from __future__ import annotations

from typing import Any

import pytest

from gpuagent.checks import HealthMemory
from gpuagent.config import AerCheck
from gpuagent.kernel.parse import canonical_pci, parse_message
from gpuagent.model import Finding, GpuEvent, PciePath, Severity
from test_checks_support import (
    BOOT_WALL,
    BUS,
    OTHER_BUS,
    ROOT_PORT,
    SWITCH_DOWN,
    SWITCH_UP,
    finding,
    gen5_x16,
    gpu,
    gpu_path,
    kernel_event,
    run,
    with_checks,
)

# Real lines (tests/data/kmsg_corpus.tsv).
FATAL = (
    "[  +0.000004] pcieport 0000:00:03.0: PCIe Bus Error: severity=Uncorrected (Fatal), "
    "type=Transaction Layer, (Requester ID)"
)
CORRECTED = (
    "Sep 19 16:18:02 bubz kernel: [68183.615810] pcieport 0000:00:03.1: PCIe Bus Error: "
    "severity=Correctable, type=Data Link Layer, (Transmitter ID)"
)
ANNOUNCEMENT = "[  253.765953] pcieport 0000:00:1c.0: AER: Corrected error received: 0000:00:1c.0"
DETAIL = (
    "[  253.765976] pcieport 0000:00:1c.0:   device [8086:9d10] error status/mask=00002001/00002000"
)
# The root port's announcement of a non-fatal error, in the kernel's wording.
NONFATAL = "pcieport 0000:00:03.0: AER: Uncorrected (Non-Fatal) error received: 0000:03:00.0"

PATH = gpu_path(gen5_x16(SWITCH_DOWN), gen5_x16(SWITCH_UP), gen5_x16(ROOT_PORT))


def aer(line: str, *, gpu: str = BUS, at: float = 0.0) -> GpuEvent:
    found = kernel_event(line, gpu=gpu, at=at)
    assert found.kind == "aer"
    return found


def check(
    *events: GpuEvent,
    now: float = 0.0,
    path: PciePath | None = PATH,
    config: AerCheck | None = None,
) -> Finding:
    health, _ = run(
        gpu(),
        now=now,
        events=events,
        pcie=() if path is None else (path,),
        config=with_checks(aer=config or AerCheck()),
    )
    return finding(health, "aer")


@pytest.mark.parametrize(
    ("line", "device", "where"),
    [
        pytest.param(FATAL, BUS, "the GPU", id="fatal-on-the-gpu"),
        pytest.param(FATAL, ROOT_PORT, f"bridge {ROOT_PORT}", id="fatal-on-the-root-port"),
        pytest.param(NONFATAL, SWITCH_UP, f"bridge {SWITCH_UP}", id="nonfatal-on-the-switch"),
    ],
)
def test_uncorrectable_report_is_critical(line: str, device: str, where: str) -> None:
    found = check(aer(line, gpu=device, at=3.0), now=80_000.0)  # retained: still CRITICAL
    severity = "fatal" if "(Fatal)" in line else "nonfatal"
    assert (found.severity, found.action, found.runbook) == (
        Severity.CRITICAL,
        "drain_and_reboot",
        "gpu-aer-uncorrectable",
    )
    assert found.reason == (
        f"1 uncorrectable PCIe error report in the kernel log (last: {severity} on {where})"
    )
    evidence = found.evidence_dict()
    assert (evidence["line"], evidence["time"], evidence["device"]) == (
        line,
        BOOT_WALL + 3.0,
        device,
    )


def test_reports_of_other_devices_do_not_count() -> None:
    # Another GPU's report, and a bridge that is not above this GPU.
    elsewhere = (aer(FATAL, gpu=OTHER_BUS), aer(FATAL, gpu="0000:00:03.0"))
    assert check(*elsewhere).severity is Severity.OK


def test_without_sysfs_only_the_gpus_own_reports_count() -> None:
    assert check(aer(FATAL, gpu=ROOT_PORT), path=None).severity is Severity.OK
    assert check(aer(FATAL), path=None).severity is Severity.CRITICAL


@pytest.mark.parametrize(
    ("reports", "severity"),
    [
        pytest.param(60, Severity.OK, id="at-the-limit"),
        pytest.param(61, Severity.WARN, id="above-the-limit"),
    ],
)
def test_corrected_report_rate(reports: int, severity: Severity) -> None:
    # Within ten minutes, counted against the whole hour: 61 in 10 min is 61 per hour.
    events = [aer(CORRECTED, gpu=ROOT_PORT, at=n * 10.0) for n in range(reports)]
    found = check(*events, now=600.0)
    assert found.severity is severity
    assert found.evidence_dict()["corrected_events_in_window"] == reports
    assert found.evidence_dict()["corrected_events_rate_per_hour"] == pytest.approx(reports)
    if severity is Severity.WARN:
        assert found.reason == "61 corrected PCIe errors per hour, above 60"
        assert (found.action, found.runbook) == ("reseat_or_replace", "gpu-aer-corrected-rate")


def test_announcements_and_detail_lines_are_not_counted_again() -> None:
    # Each corrected error prints an announcement, the report and detail lines: one error.
    events = [
        aer(line, gpu=ROOT_PORT, at=n * 10.0)
        for n in range(61)
        for line in (ANNOUNCEMENT, CORRECTED, DETAIL)
    ]
    assert check(*events, now=700.0).evidence_dict()["corrected_events_in_window"] == 61


def test_corrected_reports_leave_the_window() -> None:
    events = [aer(CORRECTED, at=n * 1.0) for n in range(100)]
    assert check(*events, now=3650.0).evidence_dict()["corrected_events_in_window"] == 50
    assert check(*events, now=3650.0).severity is Severity.OK


def test_corrected_rate_and_window_are_configurable() -> None:
    events = [aer(CORRECTED, at=n * 1.0) for n in range(11)]
    strict = AerCheck(corrected_rate_per_hour=10.0)
    assert check(*events, now=20.0, config=strict).severity is Severity.WARN
    # Over a two-hour window, 11 errors are 5.5 per hour.
    relaxed = AerCheck(corrected_rate_per_hour=10.0, rate_window_seconds=7200.0)
    assert check(*events, now=20.0, config=relaxed).severity is Severity.OK


# --- sysfs totals ----------------------------------------------------------------------------


def sysfs_path(**root: Any) -> PciePath:
    """PATH with AER totals on the GPU (all zero) and the root port (``root``)."""
    totals = {"aer_correctable": 0, "aer_nonfatal": 0, "aer_fatal": 0}
    return gpu_path(
        gen5_x16(SWITCH_DOWN),
        gen5_x16(SWITCH_UP),
        gen5_x16(ROOT_PORT, **{**totals, **root}),
        device=gen5_x16(BUS, role="gpu", **totals),
    )


def sysfs_series(steps: list[tuple[float, PciePath]]) -> list[Finding]:
    memory, out = HealthMemory(), []
    for now, path in steps:
        health, memory = run(gpu(), memory=memory, now=now, pcie=(path,))
        out.append(finding(health, "aer"))
    return out


@pytest.mark.parametrize(
    ("counts", "severity", "per_hour"),
    [
        pytest.param([0], Severity.OK, None, id="one-sample"),
        pytest.param([0, 60], Severity.OK, 60.0, id="at-the-limit"),
        pytest.param([0, 61], Severity.WARN, 61.0, id="above-the-limit"),
        pytest.param([1000, 5, 6], Severity.OK, 1.0, id="counter-reset-starts-over"),
    ],
)
def test_sysfs_corrected_rate(counts: list[int], severity: Severity, per_hour: float) -> None:
    steps = [(n * 600.0, sysfs_path(aer_correctable=c)) for n, c in enumerate(counts)]
    last = sysfs_series(steps)[-1]
    assert last.severity is severity
    assert last.evidence_dict()["corrected_sysfs_rate_per_hour"] == pytest.approx(per_hour)


def test_a_function_that_stops_reporting_starts_a_new_series() -> None:
    silent_gpu = gen5_x16(BUS, role="gpu")  # no AER counters this time
    partial = gpu_path(
        gen5_x16(SWITCH_DOWN),
        gen5_x16(SWITCH_UP),
        gen5_x16(ROOT_PORT, aer_correctable=500, aer_nonfatal=0, aer_fatal=0),
        device=silent_gpu,
    )
    found = sysfs_series([(0.0, sysfs_path(aer_correctable=0)), (60.0, partial)])[-1]
    assert found.evidence_dict()["corrected_sysfs_rate_per_hour"] is None


@pytest.mark.parametrize(
    ("totals", "severity"),
    [
        pytest.param([(3, 0)], Severity.OK, id="errors-before-we-watched"),
        pytest.param([(3, 0), (3, 0)], Severity.OK, id="no-new-errors"),
        pytest.param([(3, 0), (4, 0)], Severity.CRITICAL, id="new-nonfatal"),
        pytest.param([(0, 0), (0, 1)], Severity.CRITICAL, id="new-fatal"),
        pytest.param([(3, 0), (4, 0), (4, 0)], Severity.CRITICAL, id="stays-until-reset"),
        pytest.param([(3, 0), (4, 0), (0, 0)], Severity.OK, id="counter-reset-clears"),
        pytest.param([(0, 0), (None, None), (1, 0)], Severity.CRITICAL, id="missed-read"),
    ],
)
def test_sysfs_uncorrectable_seen_while_watching(
    totals: list[tuple[int | None, int | None]], severity: Severity
) -> None:
    steps = [
        (n * 30.0, sysfs_path(aer_nonfatal=nonfatal, aer_fatal=fatal))
        for n, (nonfatal, fatal) in enumerate(totals)
    ]
    last = sysfs_series(steps)[-1]
    assert last.severity is severity
    if severity is Severity.CRITICAL:
        assert (
            last.reason == f"1 new uncorrectable PCIe error in sysfs AER (1 on bridge {ROOT_PORT})"
        )
        assert last.evidence_dict()["uncorrectable_new_in_sysfs"] == 1


def test_no_sysfs_data_this_time_keeps_the_baseline() -> None:
    memory = HealthMemory()
    for now, paths in (
        (0.0, (sysfs_path(aer_nonfatal=2),)),
        (30.0, ()),
        (60.0, (sysfs_path(aer_nonfatal=2),)),
    ):
        health, memory = run(gpu(), memory=memory, now=now, pcie=paths)
    assert finding(health, "aer").severity is Severity.OK
    assert dict(memory.for_gpu(BUS).aer_uncorrectable_baseline)[ROOT_PORT] == 2


def test_ok_reason_and_evidence() -> None:
    found = check(now=0.0)
    assert (found.severity, found.reason) == (
        Severity.OK,
        "no uncorrectable PCIe errors; corrected error rate normal",
    )
    evidence = found.evidence_dict()
    assert (evidence["functions"], evidence["corrected_rate_limit_per_hour"]) == (4, 60.0)
    assert evidence["line"] is None


@pytest.mark.parametrize(
    "line",
    [
        pytest.param(
            f"pcieport {ROOT_PORT}: AER: Uncorrected (Fatal) error received: {BUS}",
            id="received",
        ),
        pytest.param(
            f"pcieport {ROOT_PORT}: AER: Uncorrectable (Fatal) error message received from {BUS}",
            id="message-received-from",
        ),
        pytest.param(
            f"pcieport {ROOT_PORT}: AER: Uncorrected (Fatal) error received: id=1800",
            id="old-id-form",
        ),
    ],
)
def test_a_root_ports_announcement_is_blamed_on_the_gpu_it_names(line: str) -> None:
    # The event names the device the kernel-log source takes from the line.
    parsed = parse_message(line)
    device = canonical_pci(parsed.pci) if parsed.pci else None
    assert device == BUS
    found = check(aer(line, gpu=device, at=3.0), now=10.0)
    assert found.severity is Severity.CRITICAL
    assert found.reason == (
        "1 uncorrectable PCIe error report in the kernel log (last: fatal on the GPU)"
    )
    assert found.evidence_dict()["device"] == BUS
