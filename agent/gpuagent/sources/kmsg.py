"""The kernel-log source: follows /dev/kmsg (or a FIFO or file) and reports GPU faults.

/dev/kmsg hands out one record per read, starting with the oldest record still in the
ring buffer, so the first pass over it is the "look-back" over the current boot; after
that reads block until the kernel logs more. Both /dev/kmsg and FIFOs are watched with the
event loop's reader callbacks (epoll), so lines are pushed, never polled; a regular file
(used by drills and tests) cannot be epolled and is followed by checking for growth.
Every reader lets the event loop run after a bounded amount of work (``_YIELD_RECORDS``
records or lines, ``_YIELD_BYTES`` bytes), so a flood of kernel records cannot starve the
metrics server or the watchdog; a line is kept unfinished up to ``_MAX_LINE`` bytes.

Records read from /dev/kmsg carry the kernel's sequence number: their event ids are
`kmsg:<boot id>:<seq>`, so a restart that re-reads the buffer produces the same ids
(nothing double-counted), records already seen are dropped, and records skipped because
the kernel overwrote them before we read (EPIPE, or a gap in the sequence) are counted
as lost. Records in a file or FIFO may come from several boots or tools, so there the
sequence number neither drops nor counts anything: their ids are
`kmsg:<boot id>:rec:<seq>:<digest of the record line>`, stable across a re-read and
distinct from the /dev/kmsg form (which the fleet reporter's per-boot cursor relies on).
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
from gpuagent.kernel.parse import (
    canonical_pci,
    decode_line,
    parse_kmsg_record,
    parse_message,
)
from gpuagent.model import GpuEvent, KmsgCounters

log = logging.getLogger(__name__)

DRILL_MARKER = "[gpuagent drill]"
BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")
_READ_SIZE = 64 * 1024
# Work between two yields to the event loop: this many records or lines, or bytes read.
_YIELD_RECORDS = 256
_YIELD_BYTES = 64 * 1024
# The most of an unfinished line kept (the kernel's records are at most ~8 KiB); the rest
# of a longer line is dropped up to its newline and the line counted as unparsed.
_MAX_LINE = 64 * 1024
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
        # Records come from the kernel's own buffer (/dev/kmsg): their sequence numbers
        # are this boot's, so they de-duplicate and show losses. Not so in a file or FIFO.
        self._from_kernel = False
        self._last_seq: int | None = None
        self._plain_lines = 0
        self._read = self._lost = self._unparsed = 0
        self._warned_unparsed = self._warned_long = False
        self._buffer = b""
        self._skipping = False  # dropping the rest of an over-long line

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
                self._from_kernel = True
                await self._follow_records(fd, ready)
            else:
                await self._follow_stream(fd, ready)
        finally:
            os.close(fd)

    # --- /dev/kmsg: one record per read ---------------------------------------------------

    async def _follow_records(self, fd: int, ready: Callable[[], None] | None) -> None:
        records = size = 0  # since the loop last ran
        while True:
            if records >= _YIELD_RECORDS or size >= _YIELD_BYTES:
                records = size = 0
                await asyncio.sleep(0)
            try:
                data = os.read(fd, _READ_SIZE)
            except BlockingIOError:
                if ready is not None:
                    ready()
                    ready = None
                records = size = 0
                await _readable(fd)
                continue
            except OSError as exc:
                if exc.errno != errno.EPIPE:
                    raise
                # The kernel overwrote records before we read them; the gap in sequence
                # numbers on the next record says how many.
                records += 1
                continue
            records += 1
            size += len(data)
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
            await self._take(data)

    # --- regular file: followed like `tail -f` ---------------------------------------------

    async def _follow_file(self, path: Path, ready: Callable[[], None] | None) -> None:
        with path.open("rb") as stream:
            while True:
                data = stream.read(_READ_SIZE)
                if data:
                    await self._take(data)
                    continue
                if ready is not None:
                    ready()
                    ready = None
                await asyncio.sleep(_FILE_FOLLOW_SECONDS)

    async def _take(self, data: bytes) -> None:
        """``feed`` for the readers: the loop runs after every chunk (at most
        ``_READ_SIZE`` bytes) and every ``_YIELD_RECORDS`` lines within it."""
        for count, line in enumerate(self._lines(data), 1):
            self._line(line)
            if count % _YIELD_RECORDS == 0:
                await asyncio.sleep(0)
        await asyncio.sleep(0)

    def feed(self, data: bytes) -> None:
        """Turn a chunk of kernel-log text (records or plain lines) into events; a line
        left incomplete waits for the next chunk."""
        for line in self._lines(data):
            self._line(line)

    def _lines(self, data: bytes) -> list[bytes]:
        """The lines ``data`` completes. At most ``_MAX_LINE`` bytes of an unfinished line
        are kept; a longer line is dropped up to its newline and counted as unparsed."""
        if self._skipping:
            newline = data.find(b"\n")
            if newline < 0:
                return []
            self._skipping = False
            data = data[newline + 1 :]
        *lines, rest = (self._buffer + data).split(b"\n")
        if len(rest) > _MAX_LINE:
            self._too_long()
            self._skipping = True
            rest = b""
        self._buffer = rest
        kept = [line for line in lines if len(line) <= _MAX_LINE]
        for _ in range(len(lines) - len(kept)):  # whole over-long lines: a large feed()
            self._too_long()
        return kept

    def _too_long(self) -> None:
        self._unparsed += 1
        if not self._warned_long:
            self._warned_long = True
            log.warning(
                "kernel log line longer than %d bytes: dropped; further ones are only counted",
                _MAX_LINE,
            )

    def _line(self, line: bytes) -> None:
        if line.startswith(b" ") or not line.strip():
            return  # a record's dictionary continuation line, or a blank line
        if line[:1].isdigit() and b";" in line:
            self._record(line)
        else:
            self._plain(line)

    # --- turning lines into events ----------------------------------------------------------

    def _unparseable(self, raw: bytes) -> None:
        self._unparsed += 1
        if not self._warned_unparsed:
            self._warned_unparsed = True
            # (tests/test_daemon_kernel.py looks for "unparseable kernel log record")
            log.warning(
                "unparseable kernel log record %r; further ones are only counted", raw[:200]
            )

    def _record(self, raw: bytes) -> None:
        record = parse_kmsg_record(raw)
        if record is None:
            self._unparseable(raw)
            return
        if self._from_kernel:
            if self._last_seq is not None:
                if record.sequence <= self._last_seq:
                    return  # already seen (re-read after a reopen)
                self._lost += record.sequence - self._last_seq - 1
            self._last_seq = record.sequence
            event_id = f"kmsg:{self._boot_id}:{record.sequence}"
        else:
            # A file or FIFO may hold records of several boots (or tools) one after the
            # other: a sequence number may repeat or go back, so it drops nothing. The
            # digest of the record line keeps two records of one number apart, and gives
            # the same id when the same file is read again.
            first_line = raw.partition(b"\n")[0].removesuffix(b"\r")
            digest = hashlib.sha1(first_line, usedforsecurity=False).hexdigest()[:12]
            event_id = f"kmsg:{self._boot_id}:rec:{record.sequence}:{digest}"
        self._read += 1
        happened = record.usec / 1e6
        if self._started - happened > self._config.lookback_seconds:
            return
        # The kernel stamps records on the boot-time clock, which CLOCK_MONOTONIC tracks.
        wall = self._wall() - self._clock() + happened
        self._emit(record.message, event_id, happened, wall, bare=True)

    def _plain(self, raw: bytes) -> None:
        message = decode_line(raw)
        if message is None:
            self._unparseable(raw)
            return
        self._read += 1
        self._plain_lines += 1
        digest = hashlib.sha1(message.encode(), usedforsecurity=False).hexdigest()[:12]
        event_id = f"kmsg:{self._boot_id}:line:{self._plain_lines}:{digest}"
        self._emit(message, event_id, self._clock(), self._wall())

    def _emit(
        self, message: str, event_id: str, monotonic: float, wall: float, *, bare: bool = False
    ) -> None:
        parsed = parse_message(message, bare=bare)
        if parsed.kind not in _FAULT_KINDS:
            return
        line = parsed.text if bare else message.strip()  # a bare message's text is it stripped
        drill = line.endswith(DRILL_MARKER)
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
                line=line,
                pid=parsed.pid,
                process=parsed.process,
                aer_severity=parsed.aer_severity,
                gpc=parsed.gpc,
                tpc=parsed.tpc,
                sm=parsed.sm,
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
