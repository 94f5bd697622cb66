"""Cordon backend that runs a site's own program with the request as JSON on stdin.

The program is started directly (argv split like a shell would, but no shell), in its own
process group so that a timeout kills it together with anything it started. Protocol:
docs/remediation-command.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import signal
from dataclasses import dataclass
from typing import Any, Literal

from gpuagent.remediation.backend import BackendConfigError
from gpuagent.remediation.types import CordonRequest, CordonResult, CordonState

PROTOCOL_VERSION = 1
# After a kill, the pipes are drained for at most this long.
KILL_GRACE_SECONDS = 5.0
# A detail is one line in the audit trail, not the program's whole output.
DETAIL_LIMIT = 500

Action = Literal["cordon", "uncordon", "state"]


class CommandBackendError(RuntimeError):
    """The program could not tell the node's state (raised by ``state()`` only)."""


@dataclass(frozen=True, slots=True)
class _Outcome:
    """How one run of the program ended."""

    ok: bool
    answer: dict[str, Any]  # the JSON object it printed, or {}
    detail: str  # its words, or why it failed


class CommandBackend:
    name = "command"

    def __init__(
        self, program: str, *, timeout: float = 30.0, node: str = "", cluster: str = ""
    ) -> None:
        try:
            self._argv = shlex.split(program)
        except ValueError as exc:
            raise BackendConfigError(f"remediation.cordon.command: {exc}: {program!r}") from exc
        if not self._argv:
            raise BackendConfigError("remediation.cordon.command: no program given")
        self._timeout = timeout
        # Only the "state" document needs these: cordon and uncordon carry their own.
        self._node = node
        self._cluster = cluster
        # One program at a time: a site's tool need not cope with a cordon and an uncordon
        # of the same node racing each other.
        self._lock = asyncio.Lock()

    # --- the contract ------------------------------------------------------------------

    async def cordon(self, request: CordonRequest) -> CordonResult:
        return await self._change("cordon", request)

    async def uncordon(self, request: CordonRequest) -> CordonResult:
        return await self._change("uncordon", request)

    async def state(self) -> CordonState:
        request = CordonRequest(self._node, self._cluster, reason="", request_id="")
        outcome = await self._run(_document("state", request))
        if not outcome.ok:
            raise CommandBackendError(outcome.detail)
        answer = outcome.answer
        cordoned = answer.get("cordoned")
        if not isinstance(cordoned, bool):
            raise CommandBackendError(
                f"{self._argv[0]}: state: no JSON object with a boolean 'cordoned' on stdout"
                + (f" ({outcome.detail})" if outcome.detail else "")
            )
        known = {"cordoned", "owned", "reason", "changed", "detail"}
        return CordonState(
            cordoned=cordoned,
            owned=answer.get("owned") is True,
            reason=_string(answer.get("reason")),
            extra=tuple((k, _text(v)) for k, v in answer.items() if k not in known),
        )

    # --- running the program -----------------------------------------------------------

    async def _change(self, action: Action, request: CordonRequest) -> CordonResult:
        outcome = await self._run(_document(action, request))
        if not outcome.ok:
            return CordonResult(ok=False, changed=False, detail=outcome.detail)
        # A program that does not say whether it changed anything is taken to have acted.
        changed = outcome.answer.get("changed")
        return CordonResult(
            ok=True, changed=changed if isinstance(changed, bool) else True, detail=outcome.detail
        )

    async def _run(self, document: bytes) -> _Outcome:
        async with self._lock:
            return await self._run_alone(document)

    async def _run_alone(self, document: bytes) -> _Outcome:
        try:
            process = await asyncio.create_subprocess_exec(
                *self._argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,  # its own process group, killed as a whole
            )
        except OSError as exc:
            return _failure(f"cannot run {self._argv[0]}: {exc.strerror or exc}")
        try:
            stdout, stderr = await asyncio.wait_for(process.communicate(document), self._timeout)
        except TimeoutError:
            await _kill(process)
            return _failure(f"{self._argv[0]} did not finish within {self._timeout:g} s; killed")
        except asyncio.CancelledError:
            # The agent is stopping: no program is left running behind it.
            await _kill(process)
            raise
        return self._outcome(process.returncode, stdout, stderr)

    def _outcome(self, returncode: int | None, stdout: bytes, stderr: bytes) -> _Outcome:
        answer, words = _parse(stdout.decode("utf-8", "replace"))
        if returncode == 0:
            return _Outcome(ok=True, answer=answer, detail=words)
        if returncode is not None and returncode < 0:
            ended = f"was killed by {_signal_name(-returncode)}"
        else:
            ended = f"exited with status {returncode}"
        said = words or _last_line(stderr.decode("utf-8", "replace"))
        return _failure(f"{self._argv[0]} {ended}" + (f": {said}" if said else ""))


def _failure(detail: str) -> _Outcome:
    return _Outcome(ok=False, answer={}, detail=detail)


def _document(action: Action, request: CordonRequest) -> bytes:
    document = {
        "version": PROTOCOL_VERSION,
        "action": action,
        "node": request.node,
        "cluster": request.cluster,
        "reason": request.reason,
        "request_id": request.request_id,
        "gpus": list(request.gpus),
        "findings": [
            {"gpu": gpu, "check": check, "reason": reason}
            for gpu, check, reason in request.findings
        ],
    }
    return (json.dumps(document) + "\n").encode()


def _parse(stdout: str) -> tuple[dict[str, Any], str]:
    """The program's answer: a JSON object (the whole output, or its last line, so that it
    may log before answering), else its text as the detail."""
    text = stdout.strip()
    lines = text.splitlines()
    for candidate in (text, lines[-1] if lines else ""):
        try:
            answer = json.loads(candidate)
        except ValueError:
            continue
        if isinstance(answer, dict):
            return answer, _clip(_string(answer.get("detail")))
    return {}, _clip(text.replace("\n", "; "))


async def _kill(process: asyncio.subprocess.Process) -> None:
    """Kill the program's process group, then drain its pipes so nothing is left open."""
    with contextlib.suppress(ProcessLookupError):  # it may have ended on its own meanwhile
        os.killpg(process.pid, signal.SIGKILL)
    try:
        await asyncio.wait_for(process.communicate(), KILL_GRACE_SECONDS)
    except TimeoutError:
        # Something outside the group still holds the pipes; the process itself is gone.
        await process.wait()


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _last_line(text: str) -> str:
    lines = text.strip().splitlines()
    return _clip(lines[-1]) if lines else ""


def _clip(text: str) -> str:
    return text if len(text) <= DETAIL_LIMIT else text[: DETAIL_LIMIT - 1] + "…"


def _string(value: object) -> str:
    return value if isinstance(value, str) else ""


def _text(value: object) -> str:
    return value if isinstance(value, str) else json.dumps(value)
