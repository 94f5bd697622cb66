"""Joining host facts and the latest NVML poll into one inventory (pure)."""

from __future__ import annotations

import pynvml

from gpuagent.inventory.model import GpuInventory, HostFacts, NodeInventory
from gpuagent.model import GpuState, NvmlStatus

_USER_CLOCKS = pynvml.nvmlClocksEventReasonApplicationsClocksSetting


def _gpu(state: GpuState) -> GpuInventory:
    ident = state.identity
    # Modes and settings only from a GPU that answered: nothing stale.
    r = state.readings if state.status == "ok" else None
    reasons = None if r is None else r.clock_event_reasons
    return GpuInventory(
        index=ident.index,
        pci_bus_id=ident.pci_bus_id,
        uuid=ident.uuid,
        model=ident.name,
        serial=ident.serial,
        vbios_version=ident.vbios_version,
        inforom_version=ident.inforom_version,
        gsp_firmware_version=ident.gsp_firmware_version,
        power_default_limit_w=ident.power_default_limit_w,
        applications_clock_default_mhz=ident.applications_clock_default_mhz,
        ecc_current=None if r is None else r.ecc_enabled,
        ecc_pending=None if r is None else r.ecc_enabled_pending,
        mig_current=None if r is None else r.mig_mode_current,
        mig_pending=None if r is None else r.mig_mode_pending,
        mig_instances=None if r is None else r.mig_instances,
        persistence=None if r is None else r.persistence_mode,
        power_limit_w=None if r is None else r.power_limit_w,
        power_requested_limit_w=None if r is None else r.power_requested_limit_w,
        compute_mode=None if r is None else r.compute_mode,
        applications_clock_mhz=None if r is None else r.applications_clock_mhz,
        clocks_set_by_user=None if reasons is None else bool(reasons & _USER_CLOCKS),
        fabric_state=None if r is None else r.fabric_state,
        fabric_ok=None if r is None else r.fabric_ok,
    )


def build_inventory(
    host: HostFacts,
    nvml: NvmlStatus,
    gpus: tuple[GpuState, ...],
    agent_version: str,
    expected_gpus: int = 0,
) -> NodeInventory:
    return NodeInventory(
        host=host,
        agent_version=agent_version,
        nvml_ok=nvml.ok,
        driver_version=nvml.driver_version,
        nvml_version=nvml.nvml_version,
        cuda_driver_version=nvml.cuda_driver_version,
        # Every GPU NVML counts, even one lost before it could be identified ("unknown-N").
        gpus=tuple(_gpu(g) for g in gpus),
        expected_gpus=expected_gpus,
    )
