"""Choosing how DCGM's diagnostic runs on this node, and remembering what it found.

Through the DCGM source's bindings (`DcgmControl.run_diag`) while that source is up; else
through `dcgmi` when it is on PATH; else the diagnostic is unavailable
(`DiagUnavailableError`). One diagnostic runs at a time: DCGM refuses a second one while
one is running, and two would stress the same GPUs at once. The latest result of each
level is kept for the snapshot (`NodeSnapshot.diag`) and the metrics.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from collections.abc import Callable

from gpuagent.dcgm import dcgmi
from gpuagent.dcgm.control import DcgmControl, DiagUnavailableError
from gpuagent.model import DiagResult

log = logging.getLogger(__name__)

LEVELS = (1, 2, 3)


class DiagRunner:
    def __init__(
        self,
        *,
        dcgm: Callable[[], DcgmControl | None] = lambda: None,
        timeout: Callable[[int], float] = lambda _level: 300.0,
        which: Callable[[str], str | None] = shutil.which,
    ) -> None:
        """``dcgm``: the DCGM source's control while it is up (None otherwise);
        ``timeout``: seconds each level may run; ``which``: finds dcgmi on PATH."""
        self._dcgm = dcgm
        self._timeout = timeout
        self._which = which
        self._lock = asyncio.Lock()
        self._latest: dict[int, DiagResult] = {}

    @property
    def running(self) -> bool:
        return self._lock.locked()

    def latest(self) -> tuple[DiagResult, ...]:
        """The latest result of each level, oldest first."""
        return tuple(self._latest.values())

    def available(self) -> str | None:
        """How a diagnostic would run now ("bindings", "dcgmi"), or None: it cannot."""
        if self._dcgm() is not None:
            return "bindings"
        return "dcgmi" if self._which("dcgmi") else None

    async def run(self, level: int, gpu_ids: tuple[int, ...] = ()) -> DiagResult:
        """Run the diagnostic at ``level`` on ``gpu_ids`` (DCGM GPU ids = NVML indices;
        empty: every GPU), waiting for one already running to finish first. Raises
        DiagUnavailableError when neither DCGM nor dcgmi can run it."""
        if level not in LEVELS:
            raise ValueError(f"diagnostic level must be 1, 2 or 3, not {level}")
        async with self._lock:
            result = await self._run(level, tuple(sorted(set(gpu_ids))))
        self._latest.pop(level, None)  # re-inserted: the dict stays oldest first
        self._latest[level] = result
        log.log(
            logging.INFO if result.passed else logging.WARNING,
            "DCGM diagnostic level %d on %s via %s: %s",
            level,
            ",".join(map(str, result.gpus)) or "every GPU",
            result.via,
            describe(result),
        )
        return result

    async def _run(self, level: int, gpus: tuple[int, ...]) -> DiagResult:
        timeout = self._timeout(level)
        control = self._dcgm()
        why = "DCGM is not running here"
        if control is not None:
            started = time.time()
            try:
                async with asyncio.timeout(timeout):
                    return await control.run_diag(level, gpus, timeout)
            except DiagUnavailableError as exc:
                why = f"DCGM: {exc}"
            except TimeoutError:
                # It ran and hung: that is a failure, not a reason to try dcgmi as well.
                error = f"DCGM's diagnostic level {level} did not finish within {timeout:g} s"
                return DiagResult(level, gpus, started, time.time(), "bindings", error=error)
        path = self._which("dcgmi")
        if path is None:
            raise DiagUnavailableError(f"{why}, and dcgmi is not installed")
        return await dcgmi.run(path, level, gpus, timeout)


def describe(result: DiagResult) -> str:
    """One line: passed, or what failed."""
    if result.error:
        return f"could not run: {result.error}"
    failed = failed_tests(result)
    return "passed" if not failed else "failed: " + ", ".join(failed)


def failed_tests(result: DiagResult) -> list[str]:
    """The failed tests as "name" or "name (GPU n)", in the order DCGM ran them."""
    names: list[str] = []
    for test in result.failures():
        name = test.name if test.gpu is None else f"{test.name} (GPU {test.gpu})"
        if name not in names:
            names.append(name)
    return names


def result_json(result: DiagResult) -> dict[str, object]:
    """A result as the API, the CLI's --json and the audit trail show it."""
    return {
        "level": result.level,
        "gpus": list(result.gpus),
        "started": result.started,
        "finished": result.finished,
        "via": result.via,
        "passed": result.passed,
        "error": result.error,
        "failed": failed_tests(result),
        "tests": [
            {"name": t.name, "gpu": t.gpu, "outcome": t.outcome, "info": t.info}
            for t in result.tests
        ],
    }
