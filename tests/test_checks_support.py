"""Builders shared by the checks tests (this module holds no tests itself)."""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any

from gpuagent.checks import HealthMemory, evaluate
from gpuagent.config import ChecksSection
from gpuagent.kernel.parse import parse_message
from gpuagent.model import (
    AerSeverity,
    EventKind,
    Finding,
    GpuEvent,
    GpuIdentity,
    GpuReadings,
    GpuState,
    GpuStatus,
    NodeHealth,
    NvmlStatus,
    PcieLink,
    PciePath,
)

BUS = "0000:18:00.0"
OTHER_BUS = "0000:2a:00.0"
# The PCIe switch above BUS: its downstream port, its upstream port, and the root port.
SWITCH_DOWN = "0000:17:00.0"
SWITCH_UP = "0000:16:00.0"
ROOT_PORT = "0000:15:01.0"
BOOT_WALL = 1_700_000_000.0  # wall clock at monotonic 0 in these tests
# Checks of events and sysfs: they judge a GPU whether or not NVML served readings.
EVENT_CHECKS = frozenset({"bus", "xid", "aer"})
NVML_OK = NvmlStatus(ok=True, driver_version="550.54.15")
DEFAULTS = ChecksSection()


def identity(bus: str = BUS, index: int = 0, **fields: Any) -> GpuIdentity:
    return GpuIdentity(
        index=index, pci_bus_id=bus, uuid=f"GPU-{bus}", name="NVIDIA H100 80GB HBM3", **fields
    )


def gpu(
    status: GpuStatus = "ok",
    *,
    ident: GpuIdentity | None = None,
    error: str | None = None,
    **readings: Any,
) -> GpuState:
    """A GPU in ``status``; readings are only attached when it is "ok", as the sources do."""
    return GpuState(
        identity=ident or identity(),
        status=status,
        readings=GpuReadings(**readings) if status == "ok" else None,
        error=error,
    )


def run(
    *gpus: GpuState,
    config: ChecksSection = DEFAULTS,
    nvml: NvmlStatus = NVML_OK,
    memory: HealthMemory | None = None,
    now: float = 0.0,
    events: tuple[GpuEvent, ...] = (),
    pcie: tuple[PciePath, ...] = (),
    booted_at: float | None = None,
) -> tuple[NodeHealth, HealthMemory]:
    return evaluate(
        tuple(gpus),
        nvml,
        config,
        memory or HealthMemory(),
        now,
        events=events,
        pcie=pcie,
        booted_at=booted_at,
    )


def finding(health: NodeHealth, check: str, bus: str | None = BUS) -> Finding:
    matches = [f for f in health.findings if f.check == check and f.gpu == bus]
    assert len(matches) == 1, f"expected one {check} finding for {bus}, got {matches}"
    return matches[0]


def check_once(check: str, config: ChecksSection = DEFAULTS, **readings: Any) -> Finding:
    """The ``check`` finding for one healthy-status GPU with ``readings``."""
    ident = readings.pop("ident", None)
    health, _ = run(gpu(ident=ident, **readings), config=config)
    return finding(health, check)


def check_series(
    check: str,
    steps: list[tuple[float, dict[str, Any]]],
    config: ChecksSection = DEFAULTS,
    ident: GpuIdentity | None = None,
) -> list[Finding]:
    """The ``check`` finding after each poll of one GPU at (now, readings) steps."""
    memory = HealthMemory()
    out = []
    for now, readings in steps:
        health, memory = run(gpu(ident=ident, **readings), config=config, memory=memory, now=now)
        out.append(finding(health, check))
    return out


def with_checks(**sections: Any) -> ChecksSection:
    return replace(DEFAULTS, **sections)


_EVENT_IDS = itertools.count()


def event(
    kind: EventKind,
    line: str = "",
    *,
    gpu: str | None = BUS,
    code: int | None = None,
    at: float = 0.0,
    pid: int | None = None,
    process: str | None = None,
    aer_severity: AerSeverity | None = None,
) -> GpuEvent:
    """An event as the sources report it, happening at monotonic ``at``."""
    return GpuEvent(
        event_id=f"test:{next(_EVENT_IDS)}",
        source="kmsg",
        kind=kind,
        gpu=gpu,
        time=BOOT_WALL + at,
        monotonic=at,
        pci=gpu,
        code=code,
        line=line,
        pid=pid,
        process=process,
        aer_severity=aer_severity,
    )


def check_events(
    check: str,
    *events: GpuEvent,
    now: float = 0.0,
    config: ChecksSection = DEFAULTS,
    bus: str | None = BUS,
) -> Finding:
    """The ``check`` finding (for GPU ``bus``, or the node) with these events retained."""
    health, _ = run(gpu(), config=config, now=now, events=events)
    return finding(health, check, bus)


def pcie_link(address: str, **fields: Any) -> PcieLink:
    role = fields.pop("role", "bridge")
    return PcieLink(address=address, role=role, **fields)


def gen5_x16(address: str, **fields: Any) -> PcieLink:
    """A function whose link trained at its Gen5 x16 maximum (unless ``fields`` say else)."""
    link = {
        "current_speed_gts": 32.0,
        "max_speed_gts": 32.0,
        "current_width": 16,
        "max_width": 16,
        **fields,
    }
    return pcie_link(address, **link)


def gpu_path(*bridges: PcieLink, device: PcieLink | None = None) -> PciePath:
    """BUS's path: the GPU and the bridges above it, nearest first."""
    return PciePath(device or gen5_x16(BUS, role="gpu"), tuple(bridges))


def kernel_event(line: str, *, gpu: str | None = BUS, at: float = 0.0) -> GpuEvent:
    """The event the kernel-log source makes of ``line`` (read by the real parser), as if
    the line named ``gpu`` and happened at monotonic ``at``."""
    parsed = parse_message(line)
    return event(
        parsed.kind,
        line,
        gpu=gpu,
        code=parsed.code,
        at=at,
        pid=parsed.pid,
        process=parsed.process,
        aer_severity=parsed.aer_severity,
    )
