"""What remediation and the diagnostic command need from DCGM, whoever provides it."""

from __future__ import annotations

from typing import Protocol

from gpuagent.model import DiagResult


class DiagUnavailableError(Exception):
    """The diagnostic cannot run here at all (no DCGM, host engine down, ...)."""


class DcgmControl(Protocol):
    """Implemented by the DCGM source (`gpuagent.dcgm.source`) over the bindings.

    Every method runs its DCGM calls off the event loop, under a timeout.
    """

    async def run_diag(
        self, level: int, gpu_ids: tuple[int, ...], limit_seconds: float
    ) -> DiagResult:
        """Run DCGM's diagnostic at ``level`` (1-3) on ``gpu_ids`` (DCGM GPU ids, which
        are NVML indices; empty: every GPU) for at most ``limit_seconds`` (the call
        runs on a thread: it is bounded there, not by cancelling the caller). Raises
        DiagUnavailableError when it cannot run, TimeoutError when it ran past the
        limit; a diagnostic that ran and failed is a DiagResult that did not pass."""
        ...

    async def detach_driver(self) -> bool:
        """Let go of the GPUs before a reset (dcgmDetachDriver). False: this DCGM
        version cannot, and the reset goes ahead without it."""
        ...

    async def attach_driver(self) -> bool:
        """Take the GPUs back after a reset (dcgmAttachDriver). False: cannot."""
        ...
