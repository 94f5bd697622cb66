"""The fleet page rendered by a real headless browser (its script fetches the API)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import aggregator_support as msg
from conftest import free_port, require
from fleet_support import chromium, dump_dom
from gpuagent.aggregator.service import Aggregator
from gpuagent.fleet import schema


async def test_the_page_shows_unhealthy_first_then_offline_and_drift(tmp_path: Path) -> None:
    browser = chromium()
    port = free_port()
    agg = Aggregator(msg.config(tmp_path, port=port))
    await agg.start()
    fp = {"driver": "550.54", "kernel": "6.1"}

    def send(channel: str, message: dict) -> None:
        agg.ingest.handle(msg.topic(message["node"], channel), schema.encode(message))

    try:
        send("state", msg.state("ok-node", fingerprint=fp))
        send("state", msg.state("ok-node-2", fingerprint=fp))
        send("state", msg.state("lost-node", fingerprint=fp))
        send("state", msg.offline("lost-node"))
        gpu = msg.gpu_doc(2, "CRITICAL", [msg.finding("xid", "CRITICAL", "XID 79 <b>bus</b>")])
        drifted = {**fp, "driver": "535.1"}
        send("state", msg.state("bad-node", health="CRITICAL", gpus=[gpu], fingerprint=drifted))
        dom = await dump_dom(browser, f"http://127.0.0.1:{port}/", tmp_path)
    finally:
        await agg.close()
    assert 'data-loaded="1"' in dom, dom[-2000:]
    order = re.findall(r'<tr class="node" data-node="([^"]+)"', dom)
    assert order == ["bad-node", "lost-node", "ok-node", "ok-node-2"]
    # Node text is shown as text, never interpreted as markup.
    assert "XID 79 &lt;b&gt;bus&lt;/b&gt;" in dom
    assert "offline (connection lost)" in dom
    assert "4 nodes" in dom
    assert "1 critical" in dom
    drift = dom[dom.index('id="drift"') :]
    assert "fp-550.54-6.1 (majority)" in drift
    assert "Drifted: bad-node (fp-535.1-6.1: driver)" in drift


def test_the_pages_script_parses() -> None:
    """A syntax error would leave the page blank in every browser; node finds it at once."""
    from gpuagent.aggregator import page  # noqa: PLC0415

    node = require("node", "checks the fleet page's script (Node.js)")
    script = max(re.findall(r"<script[^>]*>(.*?)</script>", page.render(), re.DOTALL), key=len)
    checked = subprocess.run(
        [node, "--check", "-"], input=script, capture_output=True, text=True, check=False
    )
    assert checked.returncode == 0, checked.stderr
