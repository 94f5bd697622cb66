"""Cordon backend for Slurm: drain and resume the node with ``scontrol``.

A drain carries the reason ``gpuagent: <why>``; that prefix is the ownership mark, so the
agent only ever resumes a node it drained itself, and leaves a drain (or a DOWN) that
someone else set alone. ``scontrol`` runs without a shell, with a timeout, and what it
says on failure ends up in the result's detail. See docs/remediation-backends.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass

from gpuagent.remediation.backend import REASON_PREFIX
from gpuagent.remediation.types import CordonRequest, CordonResult, CordonState

# Node state flags that take a node out of scheduling. scontrol prints DRAIN as a flag
# (IDLE+DRAIN, MIXED+DRAIN); DRAINED and DRAINING are how sinfo and older releases say it.
_DRAIN_FLAGS = frozenset({"DRAIN", "DRAINED", "DRAINING", "FAIL"})
# A DOWN node is out of scheduling too. Draining it would overwrite its reason and make
# the drain ours, so we would later resume a node an operator (or Slurm) put down.
_DOWN_STATES = frozenset({"DOWN"})
# scontrol appends " [user@time]" to the first line of a reason that has a timestamp.
_REASON_STAMP = re.compile(r" \[(?P<user>[^\]@\s]*)@(?P<time>[^\]\s]+)\]")
# Fields newer releases print after Reason= (a reason without a stamp ends at one of them).
_AFTER_REASON = re.compile(r" +(?:Comment|Extra|InstanceId|InstanceType|ReservationName)=")
_STATE_FIELD = re.compile(r"(?:^|\s)State=(\S+)")
_REASON_FIELD = re.compile(r"(?:^|\s)Reason=")
# Slurm keeps long reasons, but they are read in `sinfo -R` columns and audit lines.
_MAX_REASON = 240
# What is kept of scontrol's output in a detail.
_MAX_OUTPUT = 500


class SlurmBackendError(RuntimeError):
    """The node's state could not be read (raised by ``state()`` only)."""


@dataclass(frozen=True, slots=True)
class _Outcome:
    """One scontrol run: ``error`` is None when it exited 0, else why it failed."""

    stdout: str
    error: str | None


def parse_node_state(text: str) -> CordonState:
    """Parse ``scontrol show node NODE --oneliner``.

    ``reason`` is the reason as Slurm shows it (without the `` [user@time]`` stamp), also
    for someone else's drain; ``extra`` has the raw state and, when given, who set the
    reason and when. Raises ValueError for text that is not a node line.
    """
    line = next((ln for ln in text.splitlines() if ln.startswith("NodeName=")), "")
    state_match = _STATE_FIELD.search(line)
    if state_match is None:
        raise ValueError(f"no node State= in scontrol output: {_clip(text)!r}")
    raw_state = state_match.group(1)
    words = _state_words(raw_state)
    reason, user, time = _parse_reason(line)
    cordoned = bool(_DRAIN_FLAGS.intersection(words)) or words[0] in _DOWN_STATES
    extra = [("state", raw_state)]
    if user:
        extra.append(("reason_user", user))
    if time:
        extra.append(("reason_time", time))
    return CordonState(
        cordoned=cordoned,
        owned=cordoned and reason.startswith(REASON_PREFIX),
        reason=reason,
        extra=tuple(extra),
    )


def _state_words(raw_state: str) -> list[str]:
    """``IDLE+DRAIN`` → ``["IDLE", "DRAIN"]`` (without sinfo-style suffixes like ``*``)."""
    return [word.strip("*~#!%$@^-") for word in raw_state.upper().split("+")]


def _parse_reason(line: str) -> tuple[str, str, str]:
    """(reason, user, time) from a node line; empty strings where there is none."""
    field = _REASON_FIELD.search(line)
    if field is None:
        return "", "", ""
    rest = line[field.end() :]
    # The reason may hold spaces, so it ends at the first stamp, or, without one, at a
    # field printed after it.
    stamp = _REASON_STAMP.search(rest)
    if stamp is not None:
        return rest[: stamp.start()].strip(), stamp.group("user"), stamp.group("time")
    after = _AFTER_REASON.search(rest)
    return (rest[: after.start()] if after else rest).strip(), "", ""


def sanitise_reason(reason: str) -> str:
    """One line, no double quotes, bounded length.

    scontrol strips a double quote at the end of a Reason= value, and a newline would make
    ``scontrol show node`` print the rest of the reason as a continuation line.
    """
    one_line = " ".join(reason.replace('"', "'").split())
    if len(one_line) > _MAX_REASON:
        one_line = one_line[: _MAX_REASON - 3].rstrip() + "..."
    return one_line or "unhealthy GPU"


class SlurmBackend:
    name = "slurm"

    def __init__(
        self,
        node: str,
        *,
        scontrol: str = "scontrol",
        timeout: float = 30.0,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self._node = node
        self._scontrol = scontrol
        self._timeout = timeout
        # Added to the agent's environment (e.g. SLURM_CONF for a cluster of its own).
        self._env = {**os.environ, **env} if env is not None else None
        # Reading the state and then changing it is one step: no cordon and uncordon of
        # this backend interleave.
        self._lock = asyncio.Lock()

    # --- the contract ------------------------------------------------------------------

    async def state(self) -> CordonState:
        state, error = await self._read_state(self._deadline())
        if state is None:
            raise SlurmBackendError(error)
        return state

    async def cordon(self, request: CordonRequest) -> CordonResult:
        async with self._lock:
            deadline = self._deadline()
            current, error = await self._read_state(deadline)
            if current is None:
                return CordonResult(ok=False, changed=False, detail=error)
            if current.owned:
                return CordonResult(
                    ok=True, changed=False, detail=f"already drained: {current.reason}"
                )
            if current.cordoned:
                return CordonResult(
                    ok=True,
                    changed=False,
                    detail=f"left alone: {_whose(current)}",
                )
            reason = REASON_PREFIX + sanitise_reason(request.reason)
            outcome = await self._update(deadline, "State=DRAIN", f"Reason={reason}")
            if outcome.error is not None:
                return CordonResult(ok=False, changed=False, detail=outcome.error)
            return CordonResult(ok=True, changed=True, detail=f"drained: {reason}")

    async def uncordon(self, request: CordonRequest) -> CordonResult:  # noqa: ARG002 - the contract's signature
        async with self._lock:
            deadline = self._deadline()
            current, error = await self._read_state(deadline)
            if current is None:
                return CordonResult(ok=False, changed=False, detail=error)
            if not current.cordoned:
                return CordonResult(ok=True, changed=False, detail="not drained")
            if not current.owned:
                return CordonResult(
                    ok=False,
                    changed=False,
                    detail=f"not resumed: {_whose(current)}",
                )
            outcome = await self._update(deadline, "State=RESUME")
            if outcome.error is not None:
                return CordonResult(ok=False, changed=False, detail=outcome.error)
            return CordonResult(ok=True, changed=True, detail=f"resumed (was: {current.reason})")

    # --- scontrol ----------------------------------------------------------------------

    def _deadline(self) -> float:
        """One state read or cordon or uncordon, all its scontrol runs together, gets
        ``timeout`` seconds (counted from when it holds the lock)."""
        return asyncio.get_running_loop().time() + self._timeout

    async def _read_state(self, deadline: float) -> tuple[CordonState | None, str]:
        """The node's state, or None and why it could not be read."""
        outcome = await self._run(deadline, "show", "node", self._node, "--oneliner")
        if outcome.error is not None:
            return None, outcome.error
        try:
            return parse_node_state(outcome.stdout), ""
        except ValueError as exc:
            return None, f"scontrol show node {self._node}: {exc}"

    async def _update(self, deadline: float, *fields: str) -> _Outcome:
        return await self._run(deadline, "update", f"NodeName={self._node}", *fields)

    async def _run(self, deadline: float, *args: str) -> _Outcome:
        """Run scontrol; never raises for a missing program, a failure or a timeout."""
        what = f"scontrol {' '.join(args[:3])}"
        try:
            process = await asyncio.create_subprocess_exec(
                self._scontrol,
                *args,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=self._env,
                # Its own process group, so a timeout kills whatever it started as well.
                start_new_session=True,
            )
        except OSError as exc:  # not found, not executable
            return _Outcome("", f"{what}: cannot run {self._scontrol!r}: {exc.strerror or exc}")
        try:
            left = max(deadline - asyncio.get_running_loop().time(), 0.0)
            stdout, stderr = await asyncio.wait_for(process.communicate(), left)
        except TimeoutError:
            await _kill(process)
            return _Outcome("", f"{what}: no answer within the {self._timeout:g} s limit (killed)")
        except asyncio.CancelledError:
            await _kill(process)
            raise
        out, err = stdout.decode(errors="replace"), stderr.decode(errors="replace")
        if process.returncode != 0:
            # scontrol says some failures on stdout ("Node x not found"), some on stderr.
            said = _clip(" ".join(f"{err} {out}".split())) or "no output"
            return _Outcome(out, f"{what}: exit status {process.returncode}: {said}")
        return _Outcome(out, None)


async def _kill(process: asyncio.subprocess.Process) -> None:
    """Kill scontrol's process group, then reap it and close its pipes (a transport left
    open warns when it is collected)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    await process.communicate()


def _whose(state: CordonState) -> str:
    """Names someone else's drain or DOWN: ``drained by root at 2024-05-01T10:00:00, not by
    gpuagent: maintenance``."""
    extra = dict(state.extra)
    kind = "drained" if _DRAIN_FLAGS.intersection(_state_words(extra.get("state", ""))) else "down"
    by = f" by {extra['reason_user']}" if "reason_user" in extra else ""
    at = f" at {extra['reason_time']}" if "reason_time" in extra else ""
    return f"{kind}{by}{at}, not by gpuagent: {state.reason or '(no reason given)'}"


def _clip(text: str) -> str:
    text = text.strip()
    return text if len(text) <= _MAX_OUTPUT else text[: _MAX_OUTPUT - 3] + "..."
