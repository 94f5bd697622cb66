"""The contract every cordon backend keeps."""

from __future__ import annotations

from typing import Protocol

from gpuagent.remediation.types import CordonRequest, CordonResult, CordonState

# Every backend marks what it did with this, so it only ever undoes its own cordon.
REASON_PREFIX = "gpuagent: "


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
