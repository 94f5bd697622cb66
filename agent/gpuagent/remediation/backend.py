"""The contract every cordon backend keeps: the `CordonBackend` protocol, the reason
prefix that marks our own cordons and `BackendConfigError`.

Backends (slurm, kubernetes, command, aggregator) import this module; the factory that
builds the configured ones is `gpuagent.remediation.build`, which imports the backends.
Nothing here imports a backend, so there is no cycle.
"""

from __future__ import annotations

from typing import Protocol

from gpuagent.remediation.types import CordonRequest, CordonResult, CordonState

# Every backend marks what it did with this, so it only ever undoes its own cordon.
REASON_PREFIX = "gpuagent: "


class BackendConfigError(ValueError):
    """A cordon backend's configuration cannot work (raised while building it)."""


class CordonBackend(Protocol):
    name: str

    async def cordon(self, request: CordonRequest) -> CordonResult:
        """Take the node out of scheduling. Idempotent: already cordoned by us → ok,
        changed=False. Cordoned by someone else → leave their state alone (ok=True,
        changed=False, detail says so)."""
        ...

    async def uncordon(self, request: CordonRequest) -> CordonResult:
        """Put the node back, but only if we cordoned it (otherwise ok=False, changed=False
        and the detail says whose cordon it is)."""
        ...

    async def state(self) -> CordonState:
        """The node's current scheduling state as the scheduler sees it."""
        ...
