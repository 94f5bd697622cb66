"""Helpers shared by the fleet tests: waiting on async conditions, an aggregator on a
real broker, the page in headless Chromium, kernel-log faults in bulk."""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

import aggregator_support as msg
from conftest import free_port
from gpuagent.aggregator.service import Aggregator
from gpuagent.config import AggregatorSection
from mqtt_broker import Broker

H100 = '[node]\ngpus = 8\nmodel = "NVIDIA H100 80GB HBM3"\n'


async def until(check: Callable[[], bool | Awaitable[bool]], timeout: float = 5.0) -> float:
    """Seconds until ``check`` holds; fails the test past ``timeout``."""
    start = time.monotonic()
    while True:
        result = check()
        if not isinstance(result, bool):
            result = await result
        if result:
            return time.monotonic() - start
        if time.monotonic() - start > timeout:
            pytest.fail(f"condition not met within {timeout} s")
        await asyncio.sleep(0.02)


@asynccontextmanager
async def aggregator(
    tmp_path: Path, broker: Broker, name: str = "agg", **overrides: Any
) -> AsyncIterator[Aggregator]:
    connection = broker.connection("aggregator", client_id=f"gpuagent-aggregator-{name}")
    config: AggregatorSection = msg.config(
        tmp_path / name, port=free_port(), broker=connection, **overrides
    )
    agg = Aggregator(config)
    await agg.start()
    try:
        await until(lambda: agg.state.connected)
        await asyncio.sleep(0.1)  # subscriptions are made before `connected` is set
        yield agg
    finally:
        await agg.close()


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is required in CI (scripts/test installs it)")
        pytest.skip("chromium is not installed")
    return path


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


def xid_records(first_seq: int, count: int, bus: str) -> list[str]:
    short = bus.rsplit(".", 1)[0]
    return [
        f"3,{seq},{1_000_000 + seq},-;NVRM: Xid (PCI:{short}): 13, pid=7, name=job, "
        "Graphics SM Warp Exception"
        for seq in range(first_seq, first_seq + count)
    ]
