"""The state store: one immutable snapshot, swapped whole.

Readers (scrapes on the metrics thread, API requests) take `current` and never see half an
update; writers publish a complete new snapshot.
"""

from __future__ import annotations

import asyncio

from gpuagent.model import NodeSnapshot


class SnapshotStore:
    def __init__(self) -> None:
        self._current: NodeSnapshot | None = None
        self._updated = asyncio.Event()

    @property
    def current(self) -> NodeSnapshot | None:
        return self._current

    def publish(self, snapshot: NodeSnapshot) -> None:
        self._current = snapshot
        self._updated.set()
        self._updated.clear()

    async def next_update(self) -> NodeSnapshot:
        await self._updated.wait()
        assert self._current is not None
        return self._current
