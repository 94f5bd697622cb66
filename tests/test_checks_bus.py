"""bus: fallen off the bus (kernel log) and removed or unbound (udev)."""

from __future__ import annotations

import pytest

from gpuagent.model import EventKind, GpuEvent, Severity
from test_checks_support import BOOT_WALL, BUS, OTHER_BUS, check_events, event, kernel_event

# Real lines (tests/data/kmsg_corpus.tsv): the driver's two wordings.
FALLEN = "[6781741.548783] NVRM: GPU 0000:91:00.0: GPU has fallen off the bus."
FALLEN_OLD = (
    "Jan 18 11:38:05 localhost kernel: [ 269.516977] NVRM: GPU at 0000:01:00.0 has fallen off "
    "the bus."
)


def udev(kind: EventKind, at: float) -> GpuEvent:
    return event(kind, f"udev: {kind} 0000:18:00.0 (nvidia)", at=at)


def fallen(line: str = FALLEN, at: float = 0.0, gpu: str | None = BUS) -> GpuEvent:
    found = kernel_event(line, at=at, gpu=gpu)
    assert found.kind == "fallen_off_bus"
    return found


@pytest.mark.parametrize("line", [FALLEN, FALLEN_OLD])
def test_fallen_off_the_bus_is_critical_at_once(line: str) -> None:
    found = check_events("bus", fallen(line, at=5.0), now=5.0)
    assert (found.severity, found.reason, found.action, found.runbook) == (
        Severity.CRITICAL,
        "GPU has fallen off the bus",
        "drain_and_reboot",
        "gpu-fallen-off-bus",
    )
    evidence = found.evidence_dict()
    assert (evidence["fallen_off_bus_line"], evidence["fallen_off_bus_time"]) == (
        line,
        BOOT_WALL + 5.0,
    )


def test_fallen_off_the_bus_stays_while_retained_even_after_a_re_add() -> None:
    # Only a reboot really brings such a GPU back; udev re-adding it does not clear it.
    found = check_events("bus", fallen(at=0.0), udev("gpu_added", 10.0), now=80_000.0)
    assert found.severity is Severity.CRITICAL
    assert "2 kernel messages" in check_events("bus", fallen(), fallen(at=1.0)).reason


@pytest.mark.parametrize(
    ("story", "severity", "reason"),
    [
        pytest.param((), Severity.OK, "no fall off the bus or removal reported", id="nothing"),
        pytest.param(
            ("gpu_removed",),
            Severity.CRITICAL,
            "GPU removed from the PCI bus (udev)",
            id="removed",
        ),
        pytest.param(
            ("driver_unbound",),
            Severity.CRITICAL,
            "NVIDIA driver unbound from the GPU (udev)",
            id="unbound",
        ),
        pytest.param(
            ("gpu_removed", "gpu_added"),
            Severity.OK,
            "no fall off the bus or removal reported (last udev report: gpu_added)",
            id="re-added",
        ),
        pytest.param(
            ("driver_unbound", "driver_bound"),
            Severity.OK,
            "no fall off the bus or removal reported (last udev report: driver_bound)",
            id="re-bound",
        ),
        pytest.param(
            ("gpu_added", "driver_bound", "gpu_removed"),
            Severity.CRITICAL,
            "GPU removed from the PCI bus (udev)",
            id="removed-after-add",
        ),
        pytest.param(
            ("gpu_removed", "gpu_added", "driver_bound", "driver_unbound"),
            Severity.CRITICAL,
            "NVIDIA driver unbound from the GPU (udev)",
            id="unbound-again",
        ),
    ],
)
def test_the_newest_udev_report_decides(
    story: tuple[EventKind, ...], severity: Severity, reason: str
) -> None:
    events = [udev(kind, at=float(n)) for n, kind in enumerate(story)]
    found = check_events("bus", *events, now=100.0)
    assert (found.severity, found.reason) == (severity, reason)
    if severity is Severity.CRITICAL:
        assert (found.action, found.runbook) == ("drain_and_reboot", "gpu-removed")
        assert found.evidence_dict()["udev_last"] == story[-1]


def test_other_devices_and_unnamed_lines_do_not_count() -> None:
    # The driver's two-line wording names the GPU only in its first line.
    unnamed = kernel_event(
        "               NVRM: fallen off the bus and is not responding to commands.", gpu=None
    )
    assert check_events("bus", fallen(gpu=OTHER_BUS), unnamed).severity is Severity.OK
