"""Service state from systemd: `systemctl show` for the NVIDIA services, off the loop.

Where systemd is not the init system (a container, a chroot), or systemctl cannot answer
in time, every service is "unknown": the checks never call an unknown service failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from pathlib import Path

from gpuagent.inventory.model import IMEX, SERVICES, Service, ServiceState

log = logging.getLogger(__name__)

# sd_booted(3): this directory exists only when systemd is PID 1.
SYSTEMD_RUNTIME = Path("/run/systemd/system")
_TIMEOUT_SECONDS = 5.0
_STATES: dict[str, ServiceState] = {
    "active": "active",
    "reloading": "active",
    "activating": "activating",
    "deactivating": "deactivating",
    "inactive": "inactive",
    "failed": "failed",
}


def parse_show(output: str, names: tuple[str, ...]) -> tuple[Service, ...]:
    """`systemctl show -p Id,LoadState,ActiveState,NRestarts UNIT...` → one Service per
    name.

    systemctl prints one block of KEY=VALUE lines per unit, in the order asked, separated
    by blank lines. A unit whose LoadState is not-found is not installed; one that is
    masked reports ActiveState inactive, but is "masked", as deliberate as that. NRestarts
    (systemd 235 and later) counts the unit's automatic restarts since it was last started
    by hand or reset.
    """
    blocks = [block for block in output.strip().split("\n\n") if block.strip()]
    states: list[Service] = []
    for index, name in enumerate(names):
        fields: dict[str, str] = {}
        if index < len(blocks):
            for line in blocks[index].splitlines():
                key, _, value = line.partition("=")
                fields[key.strip()] = value.strip()
        state: ServiceState
        if fields.get("LoadState") == "not-found":
            state = "not_installed"
        elif fields.get("LoadState") == "masked":
            state = "masked"
        else:
            state = _STATES.get(fields.get("ActiveState", ""), "unknown")
        restarts = fields.get("NRestarts", "")
        states.append(Service(name, state, int(restarts) if restarts.isdigit() else None))
    return tuple(states)


def _unknown(names: tuple[str, ...]) -> tuple[Service, ...]:
    return tuple(Service(name, "unknown") for name in names)


async def read_services(
    systemctl: str,
    names: tuple[str, ...] = SERVICES,
    *,
    runtime_dir: Path = SYSTEMD_RUNTIME,
    limit_seconds: float = _TIMEOUT_SECONDS,
) -> tuple[Service, ...]:
    if not await asyncio.to_thread(runtime_dir.is_dir):
        return _unknown(names)
    units = [f"{name}.service" for name in names]
    try:
        process = await asyncio.create_subprocess_exec(
            systemctl,
            "show",
            "--property=Id,LoadState,ActiveState,NRestarts",
            "--",
            *units,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
        )
    except OSError as exc:
        log.warning("cannot run %s: %s", systemctl, exc)
        return _unknown(names)
    try:
        async with asyncio.timeout(limit_seconds):
            stdout, _ = await process.communicate()
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()
        log.warning("%s show took longer than %.0f s", systemctl, limit_seconds)
        return _unknown(names)
    if process.returncode != 0:
        return _unknown(names)
    return parse_show(stdout.decode(errors="replace"), names)


class ImexReadiness:
    """Asks a running IMEX daemon whether it is ready: `nvidia-imex-ctl -q` ("Query the
    status of the IMEX daemon once and return", NVIDIA's IMEX guide) prints READY when it
    is, something else when it is not. It answers only where the daemon's command service
    is on (IMEX_CMD_ENABLED in its config.cfg): anything else (no tool, no answer, an exit
    status other than 0) is no answer, said once, never "not ready"."""

    def __init__(self, command: str, *, limit_seconds: float = _TIMEOUT_SECONDS) -> None:
        self.command = command
        self.limit_seconds = limit_seconds
        self._why_not: str | None = None

    async def add_to(self, services: tuple[Service, ...]) -> tuple[Service, ...]:
        """``services`` with the IMEX daemon's readiness, when it runs."""
        if not any(s.name == IMEX and s.state == "active" for s in services):
            return services
        readiness = await self.ask()
        return tuple(
            dataclasses.replace(s, readiness=readiness) if s.name == IMEX else s for s in services
        )

    async def ask(self) -> str | None:
        try:
            process = await asyncio.create_subprocess_exec(
                self.command,
                "-q",
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
            )
        except OSError as exc:
            self._no_answer(f"cannot run {self.command}: {exc}")
            return None
        try:
            async with asyncio.timeout(self.limit_seconds):
                output, _ = await process.communicate()
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
            self._no_answer(f"{self.command} -q took longer than {self.limit_seconds:g} s")
            return None
        text = " ".join(output.decode(errors="replace").split())[:200]
        if process.returncode != 0:
            self._no_answer(f"{self.command} -q exited {process.returncode}: {text}")
            return None
        if self._why_not is not None:
            log.info("%s answers again", self.command)
            self._why_not = None
        return text

    def _no_answer(self, why: str) -> None:
        if self._why_not is None:
            log.warning("IMEX readiness unknown: %s (is its command service enabled?)", why)
        self._why_not = why
