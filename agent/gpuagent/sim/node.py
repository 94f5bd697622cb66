"""SimulatedNode: a GPU node that pynvml talks to instead of the NVIDIA driver."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Self

import pynvml

from gpuagent.inventory.model import IMEX, READY, HostFacts, Service, ServiceState
from gpuagent.k8s.model import DevicePlugin, Toolkit
from gpuagent.model import IbDevice
from gpuagent.sim.faults import FaultError, check_params
from gpuagent.sim.host import host_facts, spec_services
from gpuagent.sim.kubernetes import kubernetes_host
from gpuagent.sim.library import SimulatedLibrary
from gpuagent.sim.replay import unknown_host_facts
from gpuagent.sim.scenario import (
    INIT_ERRORS,
    Fault,
    NodeHardware,
    Scenario,
    check_node,
    hca_problem,
)
from gpuagent.sim.state import INIT_ERROR_CODES, NodeState


class GpuResetError(RuntimeError):
    """A simulated GPU reset that the real driver would refuse."""


class SimulatedNode:
    """A simulated node whose faults follow ``scenario`` on the ``clock`` timeline.

    `install` puts its library beneath pynvml, so the real pynvml wrappers (ctypes
    structs, return codes, NVMLError classes) run against it. Safe to call from several
    threads; a hung GPU blocks only callers that touch that GPU.
    """

    def __init__(self, scenario: Scenario, *, clock: Callable[[], float] = time.monotonic) -> None:
        resolved = check_node(scenario)
        self.scenario = scenario
        # Scenarios built in code get the same checks and defaults as parsed ones.
        faults = tuple(
            self._checked(fault, scenario.node.gpus, scenario.node.ib_hcas, resolved)
            for fault in scenario.faults
        )
        self._state = NodeState(dataclasses.replace(scenario, faults=faults), resolved, clock)
        self._library = SimulatedLibrary(self._state)
        self._previous_library: object = None
        self._installed = False
        # systemd's NRestarts per unit: what a flapping service has been through.
        self._restarts: dict[str, int] = {}

    @property
    def gpu_count(self) -> int:
        return len(self._state.gpus)

    @property
    def library(self) -> SimulatedLibrary:
        return self._library

    @property
    def hardware(self) -> NodeHardware:
        """The node's GPU model, and its node keys resolved against the model."""
        return self._state.hardware

    @property
    def booted_at(self) -> float:
        """When the simulated node booted, on its clock: `[node] uptime_seconds` before the
        simulation started."""
        return self._state.start - self.scenario.node.uptime_seconds

    # --- installing beneath pynvml -----------------------------------------------------

    def install(self) -> None:
        """Make pynvml call this node instead of libnvidia-ml.so.1."""
        if self._installed:
            return
        with pynvml.libLoadLock:
            self._previous_library = pynvml.nvmlLib
            pynvml.nvmlLib = self._library
            pynvml._nvmlGetFunctionPointer_cache.clear()  # noqa: SLF001 - cached old functions
        self._installed = True

    def uninstall(self) -> None:
        """Give pynvml back the library it had before `install`."""
        if not self._installed:
            return
        with pynvml.libLoadLock:
            if pynvml.nvmlLib is self._library:
                pynvml.nvmlLib = self._previous_library
            pynvml._nvmlGetFunctionPointer_cache.clear()  # noqa: SLF001
        self._installed = False

    def __enter__(self) -> Self:
        self.install()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.uninstall()

    # --- faults --------------------------------------------------------------------------

    def inject(self, kind: str, gpu: int, params: Mapping[str, object]) -> None:
        """Apply a fault to GPU ``gpu`` now; ValueError if it is not a valid fault."""
        self._check_gpu(gpu, self.gpu_count, f"cannot inject {kind!r}")
        if (problem := hca_problem(kind, gpu, self.scenario.node.ib_hcas)) is not None:
            raise ValueError(f"cannot inject {kind!r} on GPU {gpu}: {problem}")
        resolved = self._state.hardware
        try:
            checked = check_params(kind, params, profile=resolved.profile, nvlinks=resolved.nvlinks)
        except FaultError as exc:
            raise ValueError(f"cannot inject {kind!r} on GPU {gpu}: {exc}") from None
        state = self._state
        with state.cond:
            now = self._state.tick()
            state.apply(kind, state.gpus[gpu], checked, now, now)

    def set_init_error(self, problem: str | None) -> None:
        """Make later nvmlInit calls fail as ``problem`` (see `INIT_ERRORS`), or succeed."""
        if problem is not None and problem not in INIT_ERROR_CODES:
            raise ValueError(f"unknown init error {problem!r} (known: {', '.join(INIT_ERRORS)})")
        with self._state.cond:
            self._state.init_error = None if problem is None else INIT_ERROR_CODES[problem]
            self._state.cond.notify_all()  # a blocked nvmlInit ("timeout") re-checks

    def reset_gpu(self, index: int) -> None:
        """Model `nvidia-smi -r`: clear volatile ECC counts, apply pending page retirement
        and row remapping, end a hang. Refused (GpuResetError) while processes use the GPU
        or when it has fallen off the bus. Faults that a reset does not repair (heat,
        throttling, a degraded link, a remap failure, persistence off) stay.
        """
        self._check_gpu(index, self.gpu_count, "cannot reset")
        state = self._state
        with state.cond:
            now = self._state.tick()
            gpu = state.gpus[index]
            if gpu.lost:
                raise GpuResetError(
                    f"GPU {index} has fallen off the bus; a reset cannot recover it"
                    " (reboot the node)"
                )
            if gpu.processes:
                pids = ", ".join(str(pid) for pid in gpu.processes)
                raise GpuResetError(f"GPU {index} is in use by processes {pids}")
            gpu.settle(now)
            gpu.reset()
            state.cond.notify_all()  # callers waiting out a hang may go on

    def host_facts(self) -> HostFacts:
        """What sysfs, procfs and systemd would say about this node (for the inventory),
        without the GPUs a `pci_remove` fault took off the bus."""
        if self.scenario.capture is not None:
            return unknown_host_facts()  # a capture holds no sysfs, modules or services
        with self._state.cond:
            self._state.tick()
            off_bus = frozenset(g.index for g in self._state.gpus if not g.on_pci_bus)
        facts = host_facts(self.scenario.node, self._state.hardware.profile, off_bus)
        return dataclasses.replace(facts, services=self.services())

    def services(self) -> tuple[Service, ...]:
        """The NVIDIA services as one `systemctl show` finds them now, the `fabric_manager`
        faults applied (a probe of its own: the daemon probes them between inventory reads)."""
        if self.scenario.capture is not None:
            return unknown_host_facts().services
        with self._state.cond:
            self._state.tick()
            faults = {k: v for g in self._state.gpus for k, v in g.service_faults.items()}
        return tuple(
            self._probed(service, faults.get(service.name))
            for service in spec_services(self.scenario.node)
        )

    def _probed(self, service: Service, fault: str | None) -> Service:
        """A service as one `systemctl show` finds it: a flapping one has been restarted
        again since the last probe and is caught starting or running, in turn."""
        if service.state == "not_installed":
            return service
        restarts = self._restarts.get(service.name, 0)
        if fault == "flapping":
            restarts = self._restarts[service.name] = restarts + 1
            state: ServiceState = "activating" if restarts % 2 else "active"
            return dataclasses.replace(service, state=state, restarts=restarts)
        if fault == "down":
            return dataclasses.replace(service, state="failed", restarts=restarts)
        if service.name == IMEX and service.state == "active":
            # What `nvidia-imex-ctl -q` prints. Only READY is documented; the not-ready
            # answer here stands for whatever else the daemon says.
            readiness = "UNAVAILABLE" if fault == "not_ready" else READY
            return dataclasses.replace(service, restarts=restarts, readiness=readiness)
        return dataclasses.replace(service, restarts=restarts)

    def infiniband(self) -> tuple[IbDevice, ...]:
        """What /sys/class/infiniband would show: the HCA beside each of the first
        `ib_hcas` GPUs, with the `ib_*` faults applied."""
        with self._state.cond:
            self._state.tick()
            return self._state.infiniband()

    def kubernetes_host(self) -> tuple[DevicePlugin, Toolkit]:
        """kubelet's device plugin directory and the container toolkit, as the scenario
        and the `device_plugin_down` and `cdi_stale` faults make them."""
        with self._state.cond:
            self._state.tick()
            return kubernetes_host(self.scenario.node, self._state.gpus)

    # --- introspection -------------------------------------------------------------------

    def call_counts(self) -> dict[str, int]:
        """Calls per NVML C function (e.g. "nvmlDeviceGetHandleByIndex_v2") that were made."""
        with self._state.cond:
            return {name: count for name, count in self._state.counts.items() if count}

    def calls_per_device(self) -> dict[int, int]:
        """Calls that passed each GPU's handle, for every GPU index."""
        with self._state.cond:
            return dict(enumerate(self._state.per_device))

    def charged_cpu_ms(self) -> float:
        """NVML CPU charged to the callers so far (0 unless the scenario sets nvml_costs)."""
        with self._state.cond:
            return self._state.charged_ms

    def simulator_cpu_ms(self) -> float:
        """CPU the simulator spent answering calls while charging them (0 unless the
        scenario sets nvml_costs): on a real node the library's charged cost replaces it."""
        with self._state.cond:
            return self._state.simulator_ms

    def reset_call_counts(self) -> None:
        state = self._state
        with state.cond:
            for name in state.counts:
                state.counts[name] = 0
            state.per_device[:] = [0] * len(state.per_device)
            state.charged_ms = 0.0
            state.simulator_ms = 0.0

    def serve_host_files(self, root: Path) -> None:
        """Keep what procfs and sysfs would show under ``root``, from now on: ``proc/`` the
        running simulated processes (gpuagent.sim.proctable, for `sources.nvml.proc_root`)
        and ``sys/class/infiniband`` the RDMA devices (for the sysfs source)."""
        with self._state.cond:
            self._state.tick()
            self._state.host_root = root
            self._state.write_host_files(root)

    def process_name(self, pid: int) -> str | None:
        """The name of simulated process ``pid`` (NVML itself reports only pids)."""
        with self._state.cond:
            self._state.tick()
            for gpu in self._state.gpus:
                process = gpu.processes.get(pid)
                if process is not None:
                    return process.name
        return None

    def elapsed(self) -> float:
        """Seconds since the node was created, on its clock."""
        return self._state.elapsed()

    # --- helpers -------------------------------------------------------------------------

    @classmethod
    def _checked(cls, fault: Fault, gpus: int, hcas: int, resolved: NodeHardware) -> Fault:
        cls._check_gpu(fault.gpu, gpus, f"fault {fault.kind!r}")
        if (problem := hca_problem(fault.kind, fault.gpu, hcas)) is not None:
            raise ValueError(f"fault {fault.kind!r} on GPU {fault.gpu}: {problem}")
        try:
            params = check_params(
                fault.kind, fault.param_dict(), profile=resolved.profile, nvlinks=resolved.nvlinks
            )
        except FaultError as exc:
            raise ValueError(f"fault {fault.kind!r} on GPU {fault.gpu}: {exc}") from None
        return dataclasses.replace(fault, params=tuple(params.items()))

    @staticmethod
    def _check_gpu(gpu: object, count: int, doing: str) -> None:
        if isinstance(gpu, bool) or not isinstance(gpu, int):
            raise ValueError(f"{doing}: GPU index must be an integer, got {gpu!r}")  # noqa: TRY004
        if not 0 <= gpu < count:
            raise ValueError(f"{doing}: no GPU {gpu} (this node has {count}: 0..{count - 1})")
