"""Builders shared by the checks tests (this module holds no tests itself)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from gpuagent.checks import HealthMemory, evaluate
from gpuagent.config import ChecksSection
from gpuagent.model import (
    Finding,
    GpuIdentity,
    GpuReadings,
    GpuState,
    GpuStatus,
    NodeHealth,
    NvmlStatus,
)

BUS = "0000:18:00.0"
OTHER_BUS = "0000:2a:00.0"
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
) -> tuple[NodeHealth, HealthMemory]:
    return evaluate(tuple(gpus), nvml, config, memory or HealthMemory(), now)


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
