"""Helpers shared by the fleet tests: waiting on async conditions, an aggregator on a
real broker, the page in headless Chromium, kernel-log faults in bulk."""

from __future__ import annotations

import asyncio
import contextlib
import io
import itertools
import json
import os
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import aiomqtt
import pytest

import aggregator_support as msg
from conftest import PATIENCE, DaemonProcess, deadline_in, free_port, kernel_record, require
from gpuagent.aggregator.service import Aggregator
from gpuagent.config import AggregatorSection
from gpuagent.fleet import schema
from gpuagent.fleet.connection import client_options
from mqtt_broker import Broker

H100 = '[node]\ngpus = 8\nmodel = "NVIDIA H100 80GB HBM3"\n'
# Agents resend unacknowledged messages after 1 s, 2 s, 4 s ... instead of 30 s, 60 s ...:
# the same path, sooner.
FAST_RESEND = "ack_timeout_seconds = 1.0\n"
Run = Callable[..., DaemonProcess]


def reporting_agent(run_daemon: Run, broker: Broker, name: str) -> DaemonProcess:
    """A simulated 8-GPU H100 node's agent reporting to ``broker`` as ``name``."""
    config = broker.agent_config(name, extra=FAST_RESEND)
    return run_daemon(H100, config_extra=config, node_name=name)


def second_gpu_bus(daemon: DaemonProcess) -> str:
    bus: str = daemon.status()["gpus"][1]["pci_bus_id"]
    return bus


def metric_total(daemon: DaemonProcess, name: str) -> float:
    """The sum of the agent's samples named ``name`` (with or without labels, or one
    labelled series given whole)."""
    total = 0.0
    for line in daemon.metrics().splitlines():
        if line.startswith((name + "{", name + " ")):
            total += float(line.rsplit(" ", 1)[1])
    return total


def spooled_kernel_events(daemon: DaemonProcess) -> dict[str, bool]:
    """The kernel events in the agent's MQTT spool, by id: True once sent (then they wait
    for the aggregator's acknowledgement). Only what the test wrote to the kernel log: the
    spool's totals also move with finding changes the node makes on its own."""
    spool = daemon.workdir / "state" / "mqtt-spool.sqlite"
    with contextlib.closing(sqlite3.connect(f"file:{spool}?mode=ro", uri=True)) as db:
        rows = db.execute("SELECT id, payload, sent FROM outbox WHERE channel = 'events'")
        return {
            id_: sent is not None
            for id_, payload, sent in rows.fetchall()
            if json.loads(payload)["category"] == "kernel"
        }


def kernel_events_awaiting_ack(daemon: DaemonProcess, count: int) -> bool:
    """At least ``count`` kernel events are spooled, every spooled one sent: all the agent
    can do before an aggregator acknowledges them."""
    spooled = spooled_kernel_events(daemon)
    return len(spooled) >= count and all(spooled.values())


def spool_empty(daemon: DaemonProcess) -> bool:
    return metric_total(daemon, "gpuagent_mqtt_spool_messages") == 0


def events_published(daemon: DaemonProcess) -> float:
    """Event publishes the broker acknowledged (first sends and resends)."""
    return metric_total(daemon, 'gpuagent_mqtt_published_total{channel="events"}')


async def until(check: Callable[[], bool | Awaitable[bool]], timeout: float = 5.0) -> float:
    """Seconds until ``check`` holds; fails the test past ``timeout`` (times PATIENCE)."""
    start = time.monotonic()
    deadline = deadline_in(timeout)
    while True:
        result = check()
        if not isinstance(result, bool):
            result = await result
        if result:
            return time.monotonic() - start
        if time.monotonic() > deadline:
            pytest.fail(f"condition not met within {timeout} s (x{PATIENCE})")
        await asyncio.sleep(0.02)


@asynccontextmanager
async def aggregator(
    tmp_path: Path,
    broker: Broker,
    name: str = "agg",
    reconnect_seconds: float = 0.2,
    clock: Callable[[], float] = time.time,
    **overrides: Any,
) -> AsyncIterator[Aggregator]:
    # Each aggregator its own identity (the broker makes it the client id), as in production.
    identity = "aggregator" if name == "agg" else f"aggregator-{name}"
    connection = broker.connection(
        identity,
        client_id=f"gpuagent-aggregator-{name}",
        reconnect_min_seconds=reconnect_seconds,
        reconnect_max_seconds=max(1.0, reconnect_seconds),
    )
    config: AggregatorSection = msg.config(
        tmp_path / name, port=free_port(), broker=connection, **overrides
    )
    agg = Aggregator(config, clock=clock)
    await agg.start()
    try:
        # Set once every subscription is acknowledged (SUBACK): nothing published after
        # this is missed.
        await until(lambda: agg.state.connected)
        yield agg
    finally:
        await agg.close()


@asynccontextmanager
async def node_client(broker: Broker, node: str, **kwargs: Any) -> AsyncIterator[aiomqtt.Client]:
    """A client with ``node``'s certificate, as the node's agent connects."""
    options = client_options(broker.connection(node), client_id=f"test-{node}")
    options.update(clean_start=True, **kwargs)
    async with aiomqtt.Client(**options) as client:
        yield client


async def publish(client: aiomqtt.Client, channel: str, message: dict[str, Any]) -> None:
    topic = msg.topic(message["node"], channel, message["cluster"])
    await client.publish(topic, schema.encode(message), qos=1, retain=channel == "state")


def operator_cli(agg: Aggregator, tmp_path: Path, *argv: str) -> tuple[int, str]:
    """`gpuagent-aggregator ARGV --config F` against ``agg`` (F names its listen address
    and command token): its exit code and what it printed. Blocking: run it in a thread."""
    from gpuagent.aggregator import cli  # noqa: PLC0415

    config = tmp_path / "operator.toml"
    config.write_text(
        f'[aggregator]\nlisten = "{agg.config.listen}"\n'
        f'command_token_file = "{agg.config.command_token_file}"\n'
    )
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli.main([argv[0], "--config", str(config), *argv[1:]])
    return code, out.getvalue()


def chromium() -> str:
    return require(
        "chromium",
        "the fleet page tests (Debian package chromium)",
        alternatives=("chromium-browser",),
    )


async def dump_dom(browser: str, url: str, home: Path) -> str:
    process = await asyncio.create_subprocess_exec(
        browser,
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--virtual-time-budget=3000",
        "--dump-dom",
        url,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
        env={**os.environ, "HOME": str(home)},
    )
    stdout, _ = await asyncio.wait_for(process.communicate(), 60)
    return stdout.decode()


class LivePage:
    """A page open in headless Chromium, read through the DevTools protocol while it runs:
    its timers run in real time (dump_dom's run in virtual time), so a test can watch it
    refresh."""

    def __init__(self, socket: aiohttp.ClientWebSocketResponse) -> None:
        self._socket = socket
        self._ids = itertools.count(1)

    async def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page."""
        call = next(self._ids)
        await self._socket.send_json(
            {
                "id": call,
                "method": "Runtime.evaluate",
                "params": {"expression": expression, "returnByValue": True},
            }
        )
        while True:  # events may come in between
            answer = await self._socket.receive_json()
            if answer.get("id") == call:
                return answer["result"]["result"].get("value")


@asynccontextmanager
async def devtools_page(
    browser: str, url: str, home: Path, *extra_args: str
) -> AsyncIterator[aiohttp.ClientWebSocketResponse]:
    """Headless Chromium on ``url``: the DevTools socket of its one page."""
    profile = home / "chromium-profile"
    process = await asyncio.create_subprocess_exec(
        browser,
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        *extra_args,
        "--remote-debugging-port=0",
        f"--user-data-dir={profile}",
        url,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
        env={**os.environ, "HOME": str(home)},
    )
    try:
        # Chromium writes the port it chose, then a newline and the browser's own path.
        active = profile / "DevToolsActivePort"
        await until(lambda: "\n" in (active.read_text() if active.exists() else ""), 30)
        port = int(active.read_text().split()[0])
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{port}/json/list") as response:
                targets = await response.json()
            (page,) = [t for t in targets if t["type"] == "page"]
            async with session.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                yield ws
    finally:
        process.terminate()
        await process.wait()


@asynccontextmanager
async def live_page(browser: str, url: str, home: Path) -> AsyncIterator[LivePage]:
    async with devtools_page(browser, url, home) as ws:
        yield LivePage(ws)


def xid_records(first_seq: int, count: int, bus: str) -> list[str]:
    """``count`` kernel records of application XIDs, each of its own process: each its
    own incident, so each goes to the fleet (a storm of one process's lines is folded)."""
    short = bus.rsplit(".", 1)[0]
    return [
        kernel_record(
            seq, f"NVRM: Xid (PCI:{short}): 13, pid={seq}, name=job, Graphics SM Warp Exception"
        )
        for seq in range(first_seq, first_seq + count)
    ]
