"""/healthz and /readyz: alive means the event loop turns and snapshots are renewed."""

from __future__ import annotations

import asyncio
import threading
import time

from prometheus_client import CollectorRegistry

from conftest import PATIENCE
from gpuagent.metrics import MetricsServer
from gpuagent.metrics.probes import Probes
from test_metrics_server import fetch, url


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_alive_while_the_loop_beats_and_snapshots_come() -> None:
    clock, age = Clock(), [None]
    probes = Probes(60.0, lambda: age[0], 65.0, clock=clock)
    assert probes.live() == (True, "ok")
    assert probes.ready() == (False, "no snapshot yet")  # alive, not ready, at start
    age[0] = 2.0
    assert probes.ready() == (True, "ok")
    clock.now += 61.0
    assert probes.live() == (False, "event loop stalled for 61 s")
    probes.beat()
    assert probes.live() == (True, "ok")
    age[0] = 66.0
    assert probes.live() == (False, "no new snapshot for 66 s")


def test_a_wedged_event_loop_fails_healthz_from_the_metrics_thread() -> None:
    stall = 1.0
    probes = Probes(stall, lambda: 0.5, 10.0)
    server = MetricsServer(CollectorRegistry(auto_describe=False), "127.0.0.1", 0, probes)
    server.start()
    answers: dict[str, tuple[int, bytes]] = {}

    def ask(name: str) -> None:
        status, _headers, body = fetch(url(server, "/healthz"))
        answers[name] = (status, body)

    async def main() -> None:
        beating = asyncio.create_task(probes.run())
        await asyncio.sleep(0.1)
        await asyncio.to_thread(ask, "turning")
        # Wedge the loop (a blocking call on it), and ask from another thread meanwhile.
        asker = threading.Timer(stall + 0.5 * PATIENCE, ask, ("wedged",))
        asker.start()
        time.sleep(stall + 1.0 * PATIENCE)  # the wedge under test: blocks the loop
        asker.join()
        beating.cancel()

    try:
        asyncio.run(main())
    finally:
        server.stop()
    assert answers["turning"] == (200, b"ok\n")
    status, body = answers["wedged"]
    assert status == 503
    assert body.startswith(b"event loop stalled for ")
