"""What remediation does to a GPU: persistence mode, power limit, reset.

The NVML setters go through the NVML source (`gpuagent.sources.nvml`): they run on the
GPU's own NVML worker under `[sources.nvml] call_timeout_seconds`, like every other NVML
call, so a wedged GPU never stalls the event loop and a setter never runs beside a poll of
the same GPU. This module makes no NVML call itself. A reset runs the configured command
(`nvidia-smi --gpu-reset -i <bus id>` by default); on a simulated node the simulated GPU is
reset instead. While DCGM's host engine holds the GPUs a reset fails, so DCGM lets go of
them first (`DcgmControl.detach_driver`, where this DCGM can) and takes them back after,
whether the reset worked or not.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shlex
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from gpuagent.dcgm.control import DcgmControl
from gpuagent.nvml.errors import GpuLostError, NvmlCallError, NvmlUnavailableError
from gpuagent.nvml.worker import CallTimeoutError
from gpuagent.sources.nvml import active_source

if TYPE_CHECKING:  # the simulator is imported only under --simulate
    from gpuagent.sim import SimulatedNode

log = logging.getLogger(__name__)

# Characters of a reset command's output kept in its result.
_KEEP_OUTPUT = 500
# Processes that hold every GPU's device node open by design; they are not a workload.
_SYSTEM_HOLDERS = frozenset({"nvidia-persistenced", "nv-hostengine", "nvidia-smi"})


class GpuOperationError(Exception):
    pass


class NvmlSetters(Protocol):
    """What the setters need from NVML: `gpuagent.sources.nvml.NvmlSource`."""

    async def set_persistence_mode(self, bus_id: str, enabled: bool = True) -> None: ...

    async def set_power_limit(self, bus_id: str, watts: float) -> None: ...


def nvml_bus_id(bus_id: str) -> str:
    """Canonical "0000:3b:00.0" → NVML's "00000000:3B:00.0"."""
    domain, _, rest = bus_id.partition(":")
    return f"{int(domain, 16):08X}:{rest.upper()}"


class GpuOps:
    def __init__(
        self,
        *,
        reset_command: str,
        timeout: float,
        simulator: SimulatedNode | None = None,
        proc_root: Path = Path("/proc"),
        nvml: Callable[[], NvmlSetters | None] = active_source,
        dcgm: Callable[[], DcgmControl | None] = lambda: None,
    ) -> None:
        """``timeout``: the reset command's; the NVML setters are timed per call by the
        NVML source. ``nvml``: the source the setters go through (the one this process
        opened, by default). ``dcgm``: the DCGM source's control while it is up."""
        self._dcgm = dcgm
        self._reset_command = reset_command
        self._timeout = timeout
        self._simulator = simulator
        self._proc = proc_root
        self._nvml_source = nvml

    async def _nvml(self, setter: Callable[[NvmlSetters], Awaitable[None]]) -> None:
        source = self._nvml_source()
        if source is None:
            raise GpuOperationError("NVML is not available")
        try:
            await setter(source)
        except CallTimeoutError as exc:
            raise GpuOperationError(f"NVML did not answer: {exc}") from None
        except (NvmlCallError, GpuLostError, NvmlUnavailableError) as exc:
            raise GpuOperationError(str(exc)) from None

    async def enable_persistence(self, bus_id: str) -> str:
        await self._nvml(lambda nvml: nvml.set_persistence_mode(bus_id, enabled=True))
        return "persistence mode enabled"

    async def set_power_limit(self, bus_id: str, watts: float) -> str:
        await self._nvml(lambda nvml: nvml.set_power_limit(bus_id, watts))
        return f"power limit set to {watts:.0f} W"

    async def reset(self, bus_id: str, index: int) -> str:
        dcgm = self._dcgm()
        detached = dcgm is not None and await _driver_call(dcgm.detach_driver, "detach")
        try:
            return await self._reset(bus_id, index)
        finally:
            if detached and dcgm is not None:
                await _driver_call(dcgm.attach_driver, "attach")

    async def _reset(self, bus_id: str, index: int) -> str:
        if self._simulator is not None:
            try:
                self._simulator.reset_gpu(index)
            except Exception as exc:  # noqa: BLE001 - the simulator's refusal is the result
                raise GpuOperationError(str(exc)) from None
            return "simulated GPU reset"
        argv = [part.replace("{bus_id}", bus_id) for part in shlex.split(self._reset_command)]
        returncode, text = await self._run(argv)
        if returncode != 0:
            raise GpuOperationError(f"{argv[0]} exited {returncode}: {text}")
        return text or "reset"

    async def _run(self, argv: list[str]) -> tuple[int, str]:
        """Run ``argv`` (no shell) under the timeout: its exit code and the end of its
        output."""
        try:
            process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
            )
        except OSError as exc:
            raise GpuOperationError(f"cannot run {argv[0]}: {exc.strerror or exc}") from None
        try:
            async with asyncio.timeout(self._timeout):
                output, _ = await process.communicate()
        except TimeoutError:
            process.kill()
            await process.wait()
            raise GpuOperationError(
                f"{argv[0]} did not finish within {self._timeout:.0f} s"
            ) from None
        text = output.decode(errors="replace").strip()
        return int(process.returncode or 0), text[-_KEEP_OUTPUT:]

    async def device_holders(self, minor: int | None) -> list[tuple[int, str]]:
        """Processes (pid, name) other than us that hold /dev/nvidia<minor> open.

        NVML lists compute processes; this also finds graphics clients and anything that
        merely opened the device, which a reset would break just the same. The scan reads
        every process's file descriptors (thousands of /proc entries), so it runs on a
        worker thread, off the event loop.
        """
        if minor is None or self._simulator is not None:
            return []
        return await asyncio.to_thread(self._scan_holders, minor)

    def _scan_holders(self, minor: int) -> list[tuple[int, str]]:
        device = f"/dev/nvidia{minor}"
        holders: list[tuple[int, str]] = []
        for entry in self._proc.iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            if _holds(entry, device):
                name = _process_name(entry)  # "?" when it cannot be read
                if name not in _SYSTEM_HOLDERS:
                    holders.append((int(entry.name), name))
        return holders


async def _driver_call(call: Callable[[], Awaitable[bool]], what: str) -> bool:
    """DCGM's detach or attach; whether it was done. A DCGM that cannot (or fails) must not
    stop the reset: without the detach the reset may fail, and that failure is reported."""
    try:
        done = await call()
    except Exception as exc:  # noqa: BLE001 - DCGM's own errors, whatever their type
        log.warning("DCGM could not %s the driver: %s", what, exc)
        return False
    if not done:
        log.info("this DCGM cannot %s the driver; going on without", what)
    return done


def _holds(proc: Path, device: str) -> bool:
    """Whether the process has ``device`` open. A process we are not allowed to inspect
    counts as holding it: a reset must fail closed, never hit a job we could not see."""
    try:
        return any(str(fd.readlink()) == device for fd in (proc / "fd").iterdir())
    except PermissionError:
        return True
    except OSError:
        return False  # the process is gone


def _process_name(proc: Path) -> str:
    try:
        return (proc / "comm").read_text().strip()
    except OSError:
        return "?"
