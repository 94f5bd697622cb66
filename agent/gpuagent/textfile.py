"""node_exporter textfile output: the /metrics text written to `<dir>/gpuagent.prom`.

Written to a temporary file in the same directory, flushed to disk, and renamed over the
old one, so the collector never reads half a file, and after a crash the name holds the old
file or the new one whole. Writes run on a worker thread (a slow or full disk must
not stall the event loop), at most one at a time and one per `min_interval_seconds`; a
failure is logged once and retried at the next snapshot.
"""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

FILE_NAME = "gpuagent.prom"


def write_atomically(directory: Path, name: str, data: bytes) -> None:
    fd, temporary = tempfile.mkstemp(prefix=f".{name}.", dir=directory)
    try:
        with os.fdopen(fd, "wb") as stream:
            stream.write(data)
            stream.flush()
            # The data reaches the disk before the rename does: without this, a crash soon
            # after can leave the new name on an empty file (delayed allocation).
            os.fsync(stream.fileno())
        Path(temporary).chmod(0o644)  # node_exporter runs as its own user
        Path(temporary).replace(directory / name)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


class TextfileWriter:
    def __init__(
        self,
        directory: Path,
        min_interval: float,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._directory = directory
        self._min_interval = min_interval
        self._clock = clock
        self._last: float | None = None
        self._task: asyncio.Task[None] | None = None
        self._failing = False

    def offer(self, render: Callable[[], bytes]) -> None:
        """Write the current metrics if it is time and no write is in flight."""
        now = self._clock()
        if self._task is not None and not self._task.done():
            return
        if self._last is not None and now - self._last < self._min_interval:
            return
        self._last = now
        self._task = asyncio.get_running_loop().create_task(self._write(render()))

    async def _write(self, data: bytes) -> None:
        try:
            await asyncio.to_thread(write_atomically, self._directory, FILE_NAME, data)
        except OSError as exc:
            if not self._failing:
                log.warning(
                    "cannot write %s/%s: %s (will retry)",
                    self._directory,
                    FILE_NAME,
                    exc.strerror or exc,
                )
            self._failing = True
            self._last = None  # try again at the next snapshot
            return
        if self._failing:
            log.info("writing %s/%s again", self._directory, FILE_NAME)
        self._failing = False
