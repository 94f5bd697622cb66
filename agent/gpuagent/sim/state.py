"""The shared state of a simulated node, and the rules every NVML call goes through.

One condition variable guards everything. Calls that must wait (a hung GPU, an event set
with nothing queued) wait on it, which releases the lock, so other GPUs keep answering.
Scheduled faults are applied lazily: each call first applies whatever has come due.
"""

from __future__ import annotations

import ctypes
import math
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from gpuagent.model import IbDevice
from gpuagent.sim import codes, hardware
from gpuagent.sim.events import EventSet
from gpuagent.sim.faults import KINDS, ParamValue
from gpuagent.sim.gpu import Placement, SimGpu, SimGpuInstance
from gpuagent.sim.infiniband import device as hca_device
from gpuagent.sim.infiniband import write_sysfs
from gpuagent.sim.proctable import write_process_table
from gpuagent.sim.replay import replayed_gpu
from gpuagent.sim.scenario import NodeHardware, NodeSpec, Scenario

INIT_ERROR_CODES: dict[str, int] = {
    "driver_not_loaded": codes.ERROR_DRIVER_NOT_LOADED,
    "library_not_found": codes.ERROR_LIBRARY_NOT_FOUND,
    "version_mismatch": codes.ERROR_LIB_RM_VERSION_MISMATCH,
    "no_permission": codes.ERROR_NO_PERMISSION,
    # nvmlInit blocks first (`wait_out_init_hang`), then fails with this.
    "timeout": codes.ERROR_TIMEOUT,
    # A code the agent has no class for.
    "other": codes.ERROR_UNKNOWN,
}
# How long a "timeout" nvmlInit blocks, on the node's clock: past any sensible call
# timeout of the agent, yet bounded, so abandoned init calls end and their threads go.
INIT_HANG_SECONDS = 60.0
# Longest single wait, so waiters notice a test clock moving and faults coming due.
_WAIT_SLICE_SECONDS = 0.1


def _placement(spec: NodeSpec, index: int) -> Placement:
    """Where GPU ``index`` of the node sits: the node's chassis, slot, tray and host; its
    module id counts from 1, as nvidia-smi's "Module Id" on a tray. Its peers are behind
    NVSwitches: every model that answers platform info is switch connected."""
    return Placement(
        chassis_serial=spec.chassis_serial.encode(),
        slot_number=spec.slot_number,
        tray_index=spec.tray_index,
        host_id=spec.host_id,
        module_id=index + 1,
    )


class NodeState:
    def __init__(
        self, scenario: Scenario, resolved: NodeHardware, clock: Callable[[], float]
    ) -> None:
        spec = scenario.node
        self.spec = spec
        self.hardware = resolved
        self.clock = clock
        self.start = clock()
        self.cond = threading.Condition(threading.Lock())
        self.gpus = self._replayed(scenario) if scenario.capture else self._built(spec, resolved)
        self.by_address = {ctypes.addressof(g.device): g for g in self.gpus}
        self.schedule = sorted(scenario.faults, key=lambda f: f.at)
        self.schedule_position = 0
        self.next_due = self.schedule[0].at if self.schedule else math.inf
        self.init_count = 0
        self.init_error = INIT_ERROR_CODES[spec.init_error] if spec.init_error else None
        self.counts: dict[str, int] = {}
        self.per_device = [0] * len(self.gpus)
        # NVML CPU charged to the callers so far (ms), when the scenario models call costs,
        # and the CPU the simulator itself spent answering those calls (ms).
        self.charged_ms = 0.0
        self.simulator_ms = 0.0
        self.event_sets: dict[int, EventSet] = {}
        # Where the host files are served (`SimulatedNode.serve_host_files`); None: not.
        self.host_root: Path | None = None

    @staticmethod
    def _built(spec: NodeSpec, resolved: NodeHardware) -> list[SimGpu]:
        """The node's GPUs from its model and node keys (a replay's come from its capture,
        fabric state included)."""
        gpus = [
            SimGpu(
                hardware.make_identity(spec.seed, index, bus, device),
                profile=resolved.profile,
                name=resolved.name,
                driver_major=spec.driver_major,
                nvlinks=resolved.nvlinks,
                ecc=resolved.ecc,
                persistence=spec.persistence,
                mig_mode=spec.mig_mode,
                mig_profiles=tuple(spec.mig_profiles),
                compute_mode=codes.COMPUTE_MODES[spec.compute_mode],
            )
            for index, (bus, device) in enumerate(resolved.profile.slots(spec.gpus))
        ]
        uuid = hardware.fabric_uuid_bytes(resolved.fabric_cluster_uuid)
        for gpu in gpus:
            gpu.fabric_state = codes.FABRIC_STATES[spec.fabric_state]
            gpu.fabric_cluster_uuid, gpu.fabric_clique_id = uuid, resolved.fabric_clique_id
            if resolved.profile.platform_info:
                gpu.platform = _placement(spec, gpu.index)
        return gpus

    @staticmethod
    def _replayed(scenario: Scenario) -> list[SimGpu]:
        capture, spec = scenario.capture, scenario.node
        assert capture is not None
        return [replayed_gpu(gpu, index, spec) for index, gpu in enumerate(capture.gpus)]

    def elapsed(self) -> float:
        return self.clock() - self.start

    def tick(self) -> float:
        """Apply the scenario faults that have come due (lock held); the elapsed time."""
        now = self.elapsed()
        if now >= self.next_due:
            self.apply_due(now)
        return now

    # --- faults (lock held) -------------------------------------------------------------

    def apply_due(self, now: float) -> None:
        while self.schedule_position < len(self.schedule):
            fault = self.schedule[self.schedule_position]
            if fault.at > now:
                self.next_due = fault.at
                return
            self.schedule_position += 1
            self.apply(fault.kind, self.gpus[fault.gpu], fault.param_dict(), fault.at, now)
        self.next_due = math.inf

    def apply(
        self, kind: str, gpu: SimGpu, params: Mapping[str, ParamValue], at: float, now: float
    ) -> None:
        # Energy and throttle time so far accrued at the old state. A scheduled fault
        # applied late still changes the state from its own time: nothing read the GPU
        # in between, since every call applies the faults due first.
        gpu.settle(min(at, now))
        was_busy = gpu.readings.busy()
        for event_type, data in KINDS[kind].apply(gpu, params, at):
            for event_set in self.event_sets.values():
                event_set.offer(gpu, event_type, data)
        gpu.readings = gpu.readings.after_fault(kind)
        if gpu.readings.busy() != was_busy:
            gpu.load_step = (at, was_busy)
        if self.host_root is not None:
            self.write_host_files(self.host_root)
        self.cond.notify_all()  # waiters re-check: a hang may be over, an event queued

    # --- the host's view (lock held) ----------------------------------------------------

    def infiniband(self) -> tuple[IbDevice, ...]:
        """The HCA beside each of the first `ib_hcas` GPUs, with the `ib_*` faults applied."""
        spec = self.spec
        return tuple(
            hca_device(gpu.index, gpu.hca, spec.ib_rate_gbps, spec.ib_link_layer)
            for gpu in self.gpus[: spec.ib_hcas]
        )

    def write_host_files(self, root: Path) -> None:
        """``root``/proc: the running processes; ``root``/sys: the RDMA devices."""
        write_process_table(root / "proc", self.gpus)
        write_sysfs(root / "sys", self.infiniband())

    # --- call gates (lock held) ---------------------------------------------------------

    def gpu_for_handle(self, handle: Any) -> SimGpu | None:
        try:
            return self.by_address.get(ctypes.addressof(handle.contents))
        except (AttributeError, TypeError, ValueError):  # not a device handle, or NULL
            return None

    def mig_for_handle(self, handle: Any) -> tuple[SimGpu, SimGpuInstance] | None:
        """The GPU and GPU instance of a MIG device handle; None for any other pointer,
        or for a MIG device whose instance has since been destroyed (a stale handle)."""
        try:
            address = ctypes.addressof(handle.contents)
        except (AttributeError, TypeError, ValueError):
            return None
        for gpu in self.gpus:
            for instance in gpu.mig_instances:
                if ctypes.addressof(instance.device) == address:
                    return gpu, instance
        return None

    def gate(self, gpu: SimGpu, now: float) -> tuple[int, float]:
        """Return code and time after honouring the GPU's fault state: hang, then lost."""
        if gpu.hang_until > now:
            now = self._wait_out_hang(gpu, now)
        if gpu.lost:
            return codes.ERROR_GPU_IS_LOST, now
        return codes.SUCCESS, now

    def _wait_out_hang(self, gpu: SimGpu, now: float) -> float:
        while gpu.hang_until > now and not gpu.lost:
            self.cond.wait(min(gpu.hang_until - now, _WAIT_SLICE_SECONDS))
            now = self.tick()
        return now

    def wait_out_init_hang(self, now: float) -> None:
        """A blocking nvmlInit (init error "timeout"): wait, without holding the lock, until
        the init error is changed or INIT_HANG_SECONDS have passed on the node's clock."""
        until = now + INIT_HANG_SECONDS
        while self.init_error == codes.ERROR_TIMEOUT and now < until:
            self.cond.wait(min(until - now, _WAIT_SLICE_SECONDS))
            now = self.elapsed()

    def wait_event(
        self, event_set: EventSet, timeout_seconds: float
    ) -> tuple[SimGpu, int, int] | int:
        """The next queued event, or an NVML error code (timeout, lost GPU, freed set)."""
        deadline = time.monotonic() + timeout_seconds
        while True:
            if event_set.queue:
                return event_set.queue.popleft()
            if event_set.freed:
                return codes.ERROR_INVALID_ARGUMENT
            if any(self.gpus[index].lost for index in event_set.masks):
                return codes.ERROR_GPU_IS_LOST
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return codes.ERROR_TIMEOUT
            now = self.elapsed()
            until_due = max(self.next_due - now, 0.0)
            self.cond.wait(min(remaining, until_due, _WAIT_SLICE_SECONDS))
            self.tick()

    def event_set_for(self, pointer: Any) -> EventSet | None:
        try:
            return self.event_sets.get(ctypes.addressof(pointer.contents))
        except (AttributeError, TypeError, ValueError):
            return None
