"""What the reporter has to deliver: messages in memory, then in the on-disk spool, until
the aggregator acknowledges them.

A message is added in memory and moved to the spool right after (a burst in one
transaction, on the disk thread). While the spool cannot be opened (a read-only state
directory) or written (a full disk), messages stay in memory, bounded, and are delivered
from there all the same: an agent with a broken disk still reports, it only loses what it
holds in memory if it is killed before the disk is back. Whichever holds a message, it is
sent, waits for the aggregator's acknowledgement, and is sent again if none comes.

Kernel-log records already spooled are not spooled again when a restarted agent re-reads
the kernel's buffer: the newest record spooled is kept per boot, as a cursor.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections import deque
from dataclasses import dataclass, field

from gpuagent.fleet.spool import SpoolError, ThreadedSpool

log = logging.getLogger(__name__)

MEMORY_LIMIT = 10_000  # messages held in memory while the spool cannot take them
OPEN_RETRY_SECONDS = 30.0  # a spool that could not be opened is tried again this often
# A kernel record's message id: node, boot id, sequence number.
_KMSG_ID = re.compile(r"^[^:]+:kmsg:([^:]+):(\d+)$")


@dataclass(slots=True)
class _Held:
    """A message held in memory."""

    id: str
    channel: str
    payload: bytes
    sent: float | None = None


@dataclass(frozen=True, slots=True)
class Pending:
    """A message to send: from the spool (its row ``seq``) or from memory (``seq`` None)."""

    id: str
    channel: str
    payload: bytes
    seq: int | None = None


@dataclass
class _Cursors:
    """The newest kernel record spooled, per boot id."""

    spooled: dict[str, int] = field(default_factory=dict)

    def newer(self, message_id: str) -> bool:
        record = _KMSG_ID.match(message_id)
        return record is None or int(record.group(2)) > self.spooled.get(record.group(1), 0)

    def advance(self, message_id: str) -> str | None:
        """The boot whose cursor this spooled message moves, if any."""
        record = _KMSG_ID.match(message_id)
        if record is None:
            return None
        boot, sequence = record.group(1), int(record.group(2))
        if sequence <= self.spooled.get(boot, 0):
            return None
        self.spooled[boot] = sequence
        return boot


class Outbox:
    def __init__(self, spool: ThreadedSpool, *, resend_after: float) -> None:
        self.spool = spool
        self.resend_after = resend_after
        self._memory: deque[_Held] = deque()
        self._cursors = _Cursors()
        self._flush_lock = asyncio.Lock()
        self._open_lock = asyncio.Lock()
        self.dropped = 0  # from memory, past MEMORY_LIMIT
        self._dropping = False  # this episode of an unwritable spool has dropped
        self._failing = False
        self.retry_seconds = OPEN_RETRY_SECONDS
        self._next_open = 0.0  # monotonic time of the next try to open the spool

    # --- counters ----------------------------------------------------------------------

    @property
    def depth(self) -> int:
        return self.spool.depth + len(self._memory)

    @property
    def awaiting_ack(self) -> int:
        return self.spool.awaiting_ack + sum(1 for m in self._memory if m.sent is not None)

    @property
    def error(self) -> str:
        """Why the spool cannot be used, while it cannot; empty otherwise."""
        return self.spool.error if self._failing or not self.spool.ready else ""

    # --- in ----------------------------------------------------------------------------

    async def open(self) -> bool:
        """Open the spool (again) if it is not open; whether it is."""
        async with self._open_lock:
            if self.spool.ready:
                return True
            if time.monotonic() < self._next_open:
                return False
            self._next_open = time.monotonic() + self.retry_seconds
            if await self.spool.open():
                with contextlib.suppress(SpoolError):  # unknown: records may go twice
                    self._cursors.spooled.update(await self.spool.cursors("kmsg:"))
                log.info("MQTT spool open: %s", self.spool.path)
                return True
        if not self._failing:
            log.error(
                "MQTT spool unusable (%s): holding messages in memory (at most %d) and "
                "trying again",
                self.spool.error,
                MEMORY_LIMIT,
            )
            self._failing = True
        return False

    def add(self, message_id: str, channel: str, payload: bytes) -> None:
        self._memory.append(_Held(message_id, channel, payload))
        self._bound()

    async def flush(self) -> None:
        """Move what memory holds into the spool, in one transaction; while the spool
        cannot take it, it stays in memory (and is sent from there)."""
        async with self._flush_lock:
            if not self._memory or not await self.open():
                return
            held = [m for m in self._memory if self._cursors.newer(m.id)]
            count = len(self._memory)
            try:
                await self.spool.put([(m.id, m.channel, m.payload) for m in held])
            except SpoolError as exc:
                if not self._failing:
                    log.warning("MQTT spool not writable (%s): holding messages in memory", exc)
                    self.spool.error = str(exc)
                self._failing = True
                return
            self._failing = self._dropping = False
            for _ in range(count):  # what arrived during the write stays for the next
                self._memory.popleft()
            for boot in {b for m in held if (b := self._cursors.advance(m.id))}:
                try:
                    await self.spool.set_cursor(f"kmsg:{boot}", self._cursors.spooled[boot])
                except SpoolError:
                    break  # a restart sends these records again; the aggregator drops copies

    def _bound(self) -> None:
        # The spool takes a burst right after it comes; only a spool that cannot (or a
        # disk so slow it keeps up with nothing) lets memory fill.
        if len(self._memory) <= MEMORY_LIMIT:
            return
        if not self._dropping:
            log.warning(
                "MQTT spool still not writable: dropping the oldest of the %d messages held "
                "in memory",
                MEMORY_LIMIT,
            )
            self._dropping = True
        while len(self._memory) > MEMORY_LIMIT:
            self._memory.popleft()
            self.dropped += 1

    # --- out ---------------------------------------------------------------------------

    async def due(self, limit: int = 100) -> list[Pending]:
        """What to send now, oldest first: never sent, or sent and not acknowledged in
        time; from the spool, then (only while the spool cannot take them: a working one
        gets them in a moment, and would send them a second time) from memory."""
        pending: list[Pending] = []
        if self.spool.ready:
            try:
                rows = await self.spool.due(self.resend_after, limit)
            except SpoolError:
                rows = []
            pending = [Pending(r.id, r.channel, r.payload, r.seq) for r in rows]
        if self.spool.ready and not self._failing:
            return pending
        now = time.time()
        for held in self._memory:
            if len(pending) >= limit:
                break
            if held.sent is None or (self.resend_after and held.sent + self.resend_after <= now):
                pending.append(Pending(held.id, held.channel, held.payload))
        return pending

    async def sent(self, messages: list[Pending]) -> None:
        """The broker has these; they wait for the aggregator's acknowledgement."""
        seqs = [m.seq for m in messages if m.seq is not None]
        if seqs:
            await self.spool.mark_sent(seqs)
        ids = {m.id for m in messages if m.seq is None}
        now = time.time()
        for held in self._memory:
            if held.id in ids:
                held.sent = now

    async def done(self, messages: list[Pending]) -> None:
        """These are finished with (refused for good, or acknowledged by the broker with
        end-to-end acknowledgements off)."""
        seqs = [m.seq for m in messages if m.seq is not None]
        if seqs:
            await self.spool.remove(seqs)
        self._forget({m.id for m in messages if m.seq is None})

    async def acknowledge(self, ids: list[str]) -> int:
        """The aggregator stored these; how many were still held."""
        before = len(self._memory)
        self._forget(set(ids))
        removed = before - len(self._memory)
        if self.spool.ready:
            try:
                removed += await self.spool.acknowledge(ids)
            except SpoolError as exc:  # they are sent again, and acknowledged again
                log.warning("MQTT spool: acknowledged messages not removed: %s", exc)
        return removed

    def _forget(self, ids: set[str]) -> None:
        if ids:
            self._memory = deque(m for m in self._memory if m.id not in ids)

    async def connected(self) -> None:
        """A new connection: age the spool (an outage ages messages without writing any),
        and send everything not acknowledged again (the broker at the other end may have
        restarted without it)."""
        for held in self._memory:
            held.sent = None
        if await self.open():
            try:
                await self.spool.expire()
                await self.spool.resend_all()
            except SpoolError as exc:
                log.warning("MQTT spool: %s", exc)

    async def next_due(self) -> float | None:
        """Seconds until something sent and not acknowledged is due again."""
        waits = [
            held.sent + self.resend_after - time.time()
            for held in self._memory
            if held.sent is not None
        ]
        if self.spool.ready:
            try:
                spooled = await self.spool.next_due(self.resend_after)
            except SpoolError:
                spooled = None
            if spooled is not None:
                waits.append(spooled)
        return max(0.0, min(waits)) if waits else None
