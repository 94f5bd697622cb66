"""The loop of a thread that runs jobs handed to it, one at a time, in order.

NVML's per-GPU workers and DCGM's worker each own such a thread; what they do around it
(call recording, drains, timeouts) differs, the loop does not.
"""

from __future__ import annotations

import queue
from collections.abc import Callable
from concurrent.futures import Future

Job = tuple[Callable[[], object], Future[object]]


def serve_jobs(jobs: queue.SimpleQueue[Job | None]) -> None:
    """Run each queued job and hand its result or exception to its future, until None."""
    while (item := jobs.get()) is not None:
        job, future = item
        if not future.set_running_or_notify_cancel():
            continue  # cancelled while queued
        try:
            future.set_result(job())
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting side
            future.set_exception(exc)
