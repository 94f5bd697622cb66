"""node_exporter textfile output: atomic writes, throttling, a failing directory."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from conftest import DaemonProcess, deadline_in
from gpuagent.textfile import FILE_NAME, TextfileWriter, write_atomically


def test_write_replaces_the_file_whole(tmp_path: Path) -> None:
    write_atomically(tmp_path, "x.prom", b"a 1\n")
    write_atomically(tmp_path, "x.prom", b"a 2\n")
    assert (tmp_path / "x.prom").read_bytes() == b"a 2\n"
    assert [p.name for p in tmp_path.iterdir()] == ["x.prom"]  # no temporary left
    assert (tmp_path / "x.prom").stat().st_mode & 0o777 == 0o644


def test_the_data_is_on_disk_before_the_rename(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "x.prom"
    target.write_bytes(b"old\n")
    synced: list[int] = []
    fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        # Called on the temporary file, whole, while the name still holds the old file.
        assert os.fstat(fd).st_size == len(b"a 1\n")
        assert os.fstat(fd).st_ino != target.stat().st_ino
        assert target.read_bytes() == b"old\n"
        synced.append(fd)
        fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    write_atomically(tmp_path, "x.prom", b"a 1\n")
    assert len(synced) == 1
    assert target.read_bytes() == b"a 1\n"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def _settle() -> None:
    for _ in range(50):
        await asyncio.sleep(0.01)


async def test_writes_are_throttled(tmp_path: Path) -> None:
    clock = Clock()
    writer = TextfileWriter(tmp_path, 5.0, clock=clock)
    writer.offer(lambda: b"a 1\n")
    await _settle()
    writer.offer(lambda: b"a 2\n")  # too soon
    await _settle()
    assert (tmp_path / FILE_NAME).read_bytes() == b"a 1\n"
    clock.now += 5
    writer.offer(lambda: b"a 3\n")
    await _settle()
    assert (tmp_path / FILE_NAME).read_bytes() == b"a 3\n"


async def test_a_failing_directory_is_logged_once_and_retried(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    missing = tmp_path / "missing"
    writer = TextfileWriter(missing, 5.0, clock=Clock())
    for _ in range(3):
        writer.offer(lambda: b"a 1\n")
        await _settle()
    assert len([r for r in caplog.records if "cannot write" in r.message]) == 1
    missing.mkdir()
    writer.offer(lambda: b"a 1\n")  # retried at once after a failure
    await _settle()
    assert (missing / FILE_NAME).read_bytes() == b"a 1\n"


def test_the_daemon_writes_its_metrics_for_node_exporter(
    tmp_path: Path, run_daemon: Callable[..., DaemonProcess]
) -> None:
    directory = tmp_path / "textfile"
    directory.mkdir()
    run_daemon(
        "[node]\ngpus = 2\n",
        config_extra=f'[outputs.textfile]\ndir = "{directory}"\nmin_interval_seconds = 0.1\n',
    )
    path = directory / FILE_NAME
    deadline = deadline_in(10)
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    text = path.read_text()
    assert "DCGM_FI_DEV_GPU_TEMP{" in text
    assert "gpuagent_gpu_health_status{" in text
