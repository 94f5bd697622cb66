"""The kernel-log source: follows /dev/kmsg (or a FIFO or file) and reports GPU faults.

/dev/kmsg hands out one record per read, starting with the oldest record still in the
ring buffer, so the first pass over it is the "look-back" over the current boot; after
that reads block until the kernel logs more. Both /dev/kmsg and FIFOs are watched with the
event loop's reader callbacks (epoll), so lines are pushed, never polled; a regular file
(used by drills and tests) cannot be epolled and is followed by checking for growth.

Records carry the kernel's sequence number: event ids are `kmsg:<boot id>:<seq>`, so a
restart that re-reads the buffer produces the same ids (nothing double-counted), and
records skipped because the kernel overwrote them before we read (EPIPE, or a gap in the
sequence) are counted as lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import logging
import os
import stat
import time
from collections.abc import Callable
from pathlib import Path

from gpuagent.config import KmsgSourceSection
from gpuagent.kernel.parse import canonical_pci, parse_kmsg_record, parse_message
from gpuagent.model import GpuEvent, KmsgCounters

log = logging.getLogger(__name__)

DRILL_MARKER = "[gpuagent drill]"
BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")
_READ_SIZE = 64 * 1024
_FILE_FOLLOW_SECONDS = 0.1
# Kinds worth an event; informational NVRM lines and everything else are only counted.
_FAULT_KINDS = frozenset(
    {"xid", "sxid", "fallen_off_bus", "aer", "gsp", "driver_mismatch", "crash_dump"}
)


def read_boot_id() -> str:
    try:
        return BOOT_ID_PATH.read_text().strip() or "unknown-boot"
    except OSError:
        return "unknown-boot"


class KmsgSource:
    name = "kmsg"

    def __init__(
        self,
        config: KmsgSourceSection,
        on_event: Callable[[GpuEvent], None],
        *,
        boot_id: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._config = config
        self._on_event = on_event
        self._boot_id = boot_id or read_boot_id()
        self._clock = clock
        self._wall = wall_clock
        self._started = clock()
        self._last_seq: int | None = None
        self._plain_lines = 0
        self._read = self._lost = self._unparsed = 0
        self._warned_unparsed = False
        self._buffer = b""

    @property
    def counters(self) -> KmsgCounters:
        return KmsgCounters(
            records_read=self._read, records_lost=self._lost, lines_unparsed=self._unparsed
        )

    async def run(self, ready: Callable[[], None] | None = None) -> None:
        """Follow the kernel log until cancelled. Raises OSError when it cannot be opened.

        ``ready`` is called once the existing buffer has been read (the look-back).
        """
        path = self._config.path
        mode = path.stat().st_mode
        if stat.S_ISREG(mode):
            await self._follow_file(path, ready)
            return
        # A FIFO is opened read-write so it never reports end-of-file between writers.
        flags = (os.O_RDWR if stat.S_ISFIFO(mode) else os.O_RDONLY) | os.O_NONBLOCK
        fd = os.open(path, flags | os.O_CLOEXEC)
        try:
            if stat.S_ISCHR(mode):
                await self._follow_records(fd, ready)
            else:
                await self._follow_stream(fd, ready)
        finally:
            os.close(fd)

    # --- /dev/kmsg: one record per read ---------------------------------------------------

    async def _follow_records(self, fd: int, ready: Callable[[], None] | None) -> None:
        while True:
            try:
                data = os.read(fd, _READ_SIZE)
            except BlockingIOError:
                if ready is not None:
                    ready()
                    ready = None
                await _readable(fd)
                continue
            except OSError as exc:
                if exc.errno != errno.EPIPE:
                    raise
                # The kernel overwrote records before we read them; the gap in sequence
                # numbers on the next record says how many.
                continue
            self._record(data)

    # --- FIFO: a byte stream of lines -------------------------------------------------------

    async def _follow_stream(self, fd: int, ready: Callable[[], None] | None) -> None:
        if ready is not None:
            ready()
        while True:
            try:
                data = os.read(fd, _READ_SIZE)
            except BlockingIOError:
                await _readable(fd)
                continue
            self.feed(data)

    # --- regular file: followed like `tail -f` ---------------------------------------------

    async def _follow_file(self, path: Path, ready: Callable[[], None] | None) -> None:
        with path.open("rb") as stream:
            while True:
                data = stream.read(_READ_SIZE)
                if data:
                    self.feed(data)
                    continue
                if ready is not None:
                    ready()
                    ready = None
                await asyncio.sleep(_FILE_FOLLOW_SECONDS)

    def feed(self, data: bytes) -> None:
        """Turn a chunk of kernel-log text (records or plain lines) into events; a line
        left incomplete waits for the next chunk."""
        self._buffer += data
        *lines, self._buffer = self._buffer.split(b"\n")
        for line in lines:
            if line.startswith(b" ") or not line.strip():
                continue  # a record's dictionary continuation line, or a blank line
            if line[:1].isdigit() and b";" in line:
                self._record(line)
            else:
                self._plain(line.decode(errors="replace"))

    # --- turning lines into events ----------------------------------------------------------

    def _record(self, raw: bytes) -> None:
        record = parse_kmsg_record(raw)
        if record is None:
            self._unparsed += 1
            if not self._warned_unparsed:
                self._warned_unparsed = True
                log.warning(
                    "unparseable kernel log record %r; further ones are only counted", raw[:200]
                )
            return
        if self._last_seq is not None:
            if record.sequence <= self._last_seq:
                return  # already seen (re-read after a reopen)
            self._lost += record.sequence - self._last_seq - 1
        self._last_seq = record.sequence
        self._read += 1
        happened = record.usec / 1e6
        if self._started - happened > self._config.lookback_seconds:
            return
        # The kernel stamps records on the boot-time clock, which CLOCK_MONOTONIC tracks.
        wall = self._wall() - self._clock() + happened
        self._emit(record.message, f"kmsg:{self._boot_id}:{record.sequence}", happened, wall)

    def _plain(self, message: str) -> None:
        self._read += 1
        self._plain_lines += 1
        digest = hashlib.sha1(message.encode(), usedforsecurity=False).hexdigest()[:12]
        event_id = f"kmsg:{self._boot_id}:line:{self._plain_lines}:{digest}"
        self._emit(message, event_id, self._clock(), self._wall())

    def _emit(self, message: str, event_id: str, monotonic: float, wall: float) -> None:
        parsed = parse_message(message)
        if parsed.kind not in _FAULT_KINDS:
            return
        drill = message.rstrip().endswith(DRILL_MARKER)
        self._on_event(
            GpuEvent(
                event_id=event_id,
                source="drill" if drill else "kmsg",
                kind=parsed.kind,
                gpu=canonical_pci(parsed.pci) if parsed.pci else None,
                time=wall,
                monotonic=monotonic,
                pci=parsed.pci,
                code=parsed.code,
                line=message.strip(),
                pid=parsed.pid,
                process=parsed.process,
                aer_severity=parsed.aer_severity,
            )
        )


async def _readable(fd: int) -> None:
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not waiter.done():
            waiter.set_result(None)

    loop.add_reader(fd, wake)
    try:
        await waiter
    finally:
        with contextlib.suppress(ValueError, OSError):
            loop.remove_reader(fd)
