"""The engine: updates the memory with the latest poll and runs every enabled check.

The check table below is the single place that names checks; the order of the table is
the display order. Checks are pure: the engine hands each one its view, including the
memory that already holds this poll's samples.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gpuagent.checks.availability import check_availability, no_data
from gpuagent.checks.common import GpuView, Outcome, to_finding
from gpuagent.checks.ecc import check_ecc, remember_sbe
from gpuagent.checks.memory import GpuMemory, HealthMemory
from gpuagent.checks.mig import check_mig
from gpuagent.checks.nvlink import check_nvlink
from gpuagent.checks.nvml import check_nvml
from gpuagent.checks.pcie import check_pcie, remember_link
from gpuagent.checks.persistence import check_persistence
from gpuagent.checks.retired_pages import check_retired_pages
from gpuagent.checks.row_remap import check_row_remap
from gpuagent.checks.thermal import check_thermal
from gpuagent.config import ChecksSection
from gpuagent.model import Finding, GpuReadings, GpuState, NodeHealth, NvmlStatus

AVAILABILITY = "availability"
NVML = "nvml"


@dataclass(frozen=True, slots=True)
class ReadingsCheck:
    """A per-GPU check that needs readings; ``enabled`` picks its switch from the config."""

    name: str
    enabled: Callable[[ChecksSection], bool]
    run: Callable[[GpuView], Outcome]


READINGS_CHECKS: tuple[ReadingsCheck, ...] = (
    # Retired pages and row remapping are ECC's bookkeeping, so the ECC switch covers them.
    ReadingsCheck("ecc", lambda c: c.ecc.enabled, check_ecc),
    ReadingsCheck("retired_pages", lambda c: c.ecc.enabled, check_retired_pages),
    ReadingsCheck("row_remap", lambda c: c.ecc.enabled, check_row_remap),
    ReadingsCheck("thermal", lambda c: c.thermal.enabled, check_thermal),
    ReadingsCheck("pcie", lambda c: c.pcie.enabled, check_pcie),
    ReadingsCheck("persistence", lambda c: c.persistence.enabled, check_persistence),
    ReadingsCheck("mig", lambda c: c.mig.enabled, check_mig),
    ReadingsCheck("nvlink", lambda c: c.nvlink.enabled, check_nvlink),
)

CHECK_NAMES: tuple[str, ...] = (AVAILABILITY, *(c.name for c in READINGS_CHECKS))
NODE_CHECK_NAMES: tuple[str, ...] = (NVML,)


def _remember(
    previous: GpuMemory,
    state: GpuState,
    readings: GpuReadings | None,
    config: ChecksSection,
    now: float,
) -> GpuMemory:
    # A disabled check's memory stays empty: nothing would ever read it.
    memory = previous
    if config.ecc.enabled:
        memory = remember_sbe(memory, readings, config.ecc, now)
    if config.pcie.enabled:
        memory = remember_link(memory, state.identity, readings, config.pcie, now)
    return memory


def _gpu_findings(
    state: GpuState,
    readings: GpuReadings | None,
    config: ChecksSection,
    memory: GpuMemory,
    now: float,
) -> list[Finding]:
    bus_id = state.identity.pci_bus_id
    findings = [to_finding(AVAILABILITY, bus_id, check_availability(state))]
    enabled = [c for c in READINGS_CHECKS if c.enabled(config)]
    if readings is None:
        missing = no_data(state)
        return findings + [to_finding(c.name, bus_id, missing) for c in enabled]
    view = GpuView(state.identity, readings, config, memory, now)
    return findings + [to_finding(c.name, bus_id, c.run(view)) for c in enabled]


def evaluate(
    gpus: tuple[GpuState, ...],
    nvml: NvmlStatus,
    config: ChecksSection,
    memory: HealthMemory,
    now: float,
) -> tuple[NodeHealth, HealthMemory]:
    """Findings for the node and every GPU, plus the memory to pass to the next call.

    ``now`` is monotonic seconds. Findings come node first, then GPU by GPU in the order
    given, each in ``CHECK_NAMES`` order.
    """
    findings = [to_finding(NVML, None, check_nvml(nvml))]
    remembered: dict[str, GpuMemory] = {}
    for state in gpus:
        bus_id = state.identity.pci_bus_id
        # Readings from a GPU NVML does not call healthy are never trusted.
        readings = state.readings if state.status == "ok" else None
        gpu_memory = _remember(memory.for_gpu(bus_id), state, readings, config, now)
        remembered[bus_id] = gpu_memory
        findings.extend(_gpu_findings(state, readings, config, gpu_memory, now))
    # Only GPUs present in this poll are kept, so removed GPUs do not linger.
    return NodeHealth(tuple(findings)), HealthMemory(tuple(remembered.items()))
