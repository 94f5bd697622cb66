"""The kernel-log source over a FIFO, a regular file and kmsg-format records."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from gpuagent.config import KmsgSourceSection
from gpuagent.model import GpuEvent
from gpuagent.sources.kmsg import DRILL_MARKER, KmsgSource

XID_79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus."
XID_13 = "NVRM: Xid (PCI:0000:5d:00): 13, pid='<unknown>', name=<unknown>, Graphics Exception"


class Harness:
    def __init__(self, path: Path, lookback: float = 86400.0, now: float = 1000.0) -> None:
        self.events: list[GpuEvent] = []
        self.ready = asyncio.Event()
        self.source = KmsgSource(
            KmsgSourceSection(path=path, lookback_seconds=lookback),
            self.events.append,
            boot_id="boot-1",
            clock=lambda: now,
            wall_clock=lambda: 1_700_000_000.0 + now,
        )

    async def wait_for(self, count: int) -> list[GpuEvent]:
        async with asyncio.timeout(5):
            while len(self.events) < count:
                await asyncio.sleep(0.01)
        return self.events


@contextlib.asynccontextmanager
async def following(harness: Harness) -> AsyncIterator[Harness]:
    task = asyncio.create_task(harness.source.run(harness.ready.set))
    try:
        async with asyncio.timeout(5):
            await harness.ready.wait()
        yield harness
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "kmsg.fifo"
    os.mkfifo(path)
    return path


def writer(path: Path) -> Callable[[str], None]:
    def write(text: str) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)

    return write


async def test_fifo_lines_become_events(tmp_path: Path) -> None:
    path = fifo(tmp_path)
    async with following(Harness(path)) as h:
        write = writer(path)
        write(f"[  12.5] {XID_79}\nsome unrelated line\n")
        write(f"Jul 09 10:42:47 node kernel: {XID_13}\n")
        events = await h.wait_for(2)
    assert [(e.kind, e.code, e.gpu) for e in events] == [
        ("xid", 79, "0000:3b:00.0"),
        ("xid", 13, "0000:5d:00.0"),
    ]
    assert events[0].pid == 1234
    assert events[0].process == "python3"
    assert events[0].source == "kmsg"
    assert h.source.counters.records_read == 3


async def test_a_line_split_across_writes_is_one_line(tmp_path: Path) -> None:
    path = fifo(tmp_path)
    async with following(Harness(path)) as h:
        write = writer(path)
        write(XID_79[:20])
        await asyncio.sleep(0.05)
        write(XID_79[20:] + "\n")
        (event,) = await h.wait_for(1)
    assert event.code == 79


async def test_kmsg_records_sequence_gaps_duplicates_and_lookback(tmp_path: Path) -> None:
    path = fifo(tmp_path)
    # Agent "now" is 1000 s after boot; look back 100 s.
    async with following(Harness(path, lookback=100.0, now=1000.0)) as h:
        write = writer(path)
        write(f"3,10,850000000,-;{XID_13}\n")  # 150 s before start: skipped
        write(f"3,11,950000000,-;{XID_79}\n SUBSYSTEM=pci\n DEVICE=+pci:0000:3b:00.0\n")
        write(f"3,11,950000000,-;{XID_79}\n")  # re-read after a reopen: same seq, dropped
        write(f"3,15,960000000,-;{XID_13}\n")  # 12..14 were overwritten before we read them
        write("3,x,y,-;garbage\n")
        events = await h.wait_for(2)
        await asyncio.sleep(0.05)
    assert [e.event_id for e in events] == ["kmsg:boot-1:11", "kmsg:boot-1:15"]
    assert events[0].monotonic == pytest.approx(950.0)
    assert events[0].time == pytest.approx(1_700_000_000.0 + 950.0)
    counters = h.source.counters
    assert counters.records_lost == 3
    assert counters.lines_unparsed == 1


async def test_regular_file_is_followed(tmp_path: Path) -> None:
    path = tmp_path / "kern.log"
    path.write_text(f"{XID_13}\n")
    async with following(Harness(path)) as h:
        await h.wait_for(1)
        with path.open("a") as stream:
            stream.write(f"{XID_79} {DRILL_MARKER}\n")
        events = await h.wait_for(2)
    assert events[1].source == "drill"
    assert events[1].code == 79


async def test_missing_path_raises_for_the_supervisor(tmp_path: Path) -> None:
    harness = Harness(tmp_path / "absent")
    with pytest.raises(FileNotFoundError):
        await harness.source.run()


@pytest.mark.skipif(not os.access("/dev/kmsg", os.R_OK), reason="no readable /dev/kmsg here")
async def test_real_dev_kmsg_reads_the_boot_buffer() -> None:
    harness = Harness(Path("/dev/kmsg"))
    async with following(harness):
        pass
    assert harness.source.counters.records_read > 0
