"""``bus``: the GPU fell off the bus (kernel log) or left the PCI bus or its driver (udev).

Both are CRITICAL at once: nothing can run on the GPU. udev reports tell a story in
order, so the newest of them decides: a GPU added (or bound) again after its removal is
back. "Fallen off the bus" lines stay CRITICAL for as long as the event log keeps them:
only a reboot really brings such a GPU back, and the reboot starts a new kernel log.
"""

from __future__ import annotations

from gpuagent.checks.common import EventView, Evidence, Outcome, Problem, plural
from gpuagent.checks.eventindex import UDEV, latest
from gpuagent.checks.vocabulary import Action, Runbook
from gpuagent.model import GpuEvent, Severity

_GONE = {
    "gpu_removed": "GPU removed from the PCI bus (udev)",
    "driver_unbound": "NVIDIA driver unbound from the GPU (udev)",
}


def _fallen_problem(fallen: list[GpuEvent]) -> Problem | None:
    if not fallen:
        return None
    times_seen = f" ({plural(len(fallen), 'kernel message')})" if len(fallen) > 1 else ""
    return Problem(
        Severity.CRITICAL,
        f"GPU has fallen off the bus{times_seen}",
        Action.DRAIN_AND_REBOOT,
        Runbook.GPU_FALLEN_OFF_BUS,
    )


def _udev_problem(last: GpuEvent | None) -> Problem | None:
    reason = None if last is None else _GONE.get(last.kind)
    if reason is None:
        return None
    return Problem(Severity.CRITICAL, reason, Action.DRAIN_AND_REBOOT, Runbook.GPU_REMOVED)


def check_bus(view: EventView) -> Outcome:
    fallen = list(view.events.for_device(view.bus_id, "fallen_off_bus"))
    last_udev = latest(view.events.for_device(view.bus_id, UDEV))
    last_fallen = latest(fallen)
    evidence: Evidence = (
        ("fallen_off_bus_events", len(fallen)),
        ("fallen_off_bus_line", None if last_fallen is None else last_fallen.line),
        ("fallen_off_bus_time", None if last_fallen is None else last_fallen.time),
        ("udev_last", None if last_udev is None else last_udev.kind),
        ("udev_line", None if last_udev is None else last_udev.line),
        ("udev_time", None if last_udev is None else last_udev.time),
    )
    found = (_fallen_problem(fallen), _udev_problem(last_udev))
    problems = tuple(p for p in found if p is not None)
    ok = "no fall off the bus or removal reported"
    if last_udev is not None:
        ok = f"{ok} (last udev report: {last_udev.kind})"
    return Outcome(ok, evidence, problems)
