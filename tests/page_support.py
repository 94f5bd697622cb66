"""Headless Chromium driven over the DevTools protocol for the fleet page tests: navigate,
evaluate, resize to a phone and take screenshots, which are kept for people to look at
(GPUAGENT_SCREENSHOTS, default build/test-output/screenshots)."""

from __future__ import annotations

import asyncio
import base64
import itertools
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp

from conftest import deadline_in
from fleet_support import devtools_page

REPO = Path(__file__).resolve().parent.parent
SCREENSHOTS = Path(
    os.environ.get("GPUAGENT_SCREENSHOTS", REPO / "build" / "test-output" / "screenshots")
)


class Browser:
    """One page of a headless Chromium; every call waits for its own answer."""

    def __init__(self, socket: aiohttp.ClientWebSocketResponse) -> None:
        self._socket = socket
        self._ids = itertools.count(1)

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        call = next(self._ids)
        await self._socket.send_json({"id": call, "method": method, "params": params})
        while True:  # events may come in between
            answer = await self._socket.receive_json()
            if answer.get("id") == call:
                if "error" in answer:
                    raise RuntimeError(f"{method}: {answer['error']}")
                result: dict[str, Any] = answer["result"]
                return result

    async def evaluate(self, expression: str) -> Any:
        result = await self.call(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in result:
            raise AssertionError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def wait_for(self, expression: str, timeout: float = 10.0) -> None:
        """Until ``expression`` is true in the page; AssertionError past ``timeout``."""
        deadline = deadline_in(timeout)
        while not await self.evaluate(expression):
            if time.monotonic() > deadline:
                error = await self.evaluate("document.getElementById('error')?.innerText")
                raise AssertionError(f"not within {timeout} s: {expression} (page: {error!r})")
            await asyncio.sleep(0.05)

    async def open(self, url: str) -> None:
        """Load ``url`` afresh and wait for the page's first render."""
        await self.call("Page.navigate", url="about:blank")
        await self.wait_for("location.href === 'about:blank'")
        await self.call("Page.navigate", url=url)
        await self.wait_for("document.body && document.body.dataset.loaded === '1'", 30)

    async def viewport(self, width: int, height: int, *, mobile: bool = False) -> None:
        await self.call(
            "Emulation.setDeviceMetricsOverride",
            width=width,
            height=height,
            deviceScaleFactor=1,
            mobile=mobile,
        )

    async def screenshot(self, name: str) -> Path:
        """A PNG of the whole page, saved as SCREENSHOTS/<name>.png."""
        shot = await self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        path = SCREENSHOTS / f"{name}.png"
        path.write_bytes(base64.b64decode(shot["data"]))
        return path


@asynccontextmanager
async def browser(executable: str, home: Path) -> AsyncIterator[Browser]:
    window = ("--hide-scrollbars", "--window-size=1280,900")
    async with devtools_page(executable, "about:blank", home, *window) as ws:
        tab = Browser(ws)
        await tab.call("Page.enable")
        await tab.viewport(1280, 900)
        yield tab


def elapsed_ms(start: float) -> float:
    return (time.perf_counter() - start) * 1000
