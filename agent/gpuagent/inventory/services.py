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


async def _run(
    argv: list[str], limit_seconds: float, *, with_stderr: bool = False
) -> tuple[int, str] | str:
    """``argv``'s exit status and output (stdout, and stderr ``with_stderr``), or why there
    is none: it could not be started, or did not end within ``limit_seconds`` (killed)."""
    try:
        process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT if with_stderr else asyncio.subprocess.DEVNULL,
        )
    except OSError as exc:
        return f"cannot run {argv[0]}: {exc}"
    try:
        async with asyncio.timeout(limit_seconds):
            output, _ = await process.communicate()
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()
        return f"{' '.join(argv[:2])} took longer than {limit_seconds:g} s"
    return process.returncode or 0, output.decode(errors="replace")


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
    ran = await _run(
        [systemctl, "show", "--property=Id,LoadState,ActiveState,NRestarts", "--", *units],
        limit_seconds,
    )
    if isinstance(ran, str):
        log.warning("%s", ran)
        return _unknown(names)
    status, output = ran
    return _unknown(names) if status != 0 else parse_show(output, names)


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
        # Its complaint (no command service, say) goes to stderr: kept for the log.
        ran = await _run([self.command, "-q"], self.limit_seconds, with_stderr=True)
        if isinstance(ran, str):
            self._no_answer(ran)
            return None
        status, output = ran
        text = " ".join(output.split())[:200]
        if status != 0:
            self._no_answer(f"{self.command} -q exited {status}: {text}")
            return None
        if self._why_not is not None:
            log.info("%s answers again", self.command)
            self._why_not = None
        return text

    def _no_answer(self, why: str) -> None:
        if self._why_not is None:
            log.warning("IMEX readiness unknown: %s (is its command service enabled?)", why)
        self._why_not = why
