"""The fleet page as a console, in headless Chromium: the fleet table's filters, sorting
and per-kind counts, offline nodes shown as unknown, a node's page, the fleet incidents, the
cordon budget, the fleet rule findings, planned maintenance, a phone-sized screen, and the
time to serve and render a 10,000-node fleet. Screenshots go
to page_support.SCREENSHOTS."""

from __future__ import annotations

import calendar
import json
import re
import time
from pathlib import Path
from typing import Any

import aiohttp

import aggregator_support as msg
from conftest import free_port
from fleet_support import chromium, until
from gpuagent.aggregator.fleetrules import RuleFinding
from gpuagent.aggregator.records import from_online_state
from gpuagent.aggregator.service import Aggregator
from gpuagent.config import CorrelationSection
from gpuagent.fleet import schema
from page_support import Browser, browser, elapsed_ms

GRAFANA = "https://grafana.example/d/gpuagent?var-cluster={cluster}&var-node={node}&var-gpu={gpu}"
DOCS = "https://gpuagent.example/docs/"
A100 = "NVIDIA A100-SXM4-80GB"
HOSTILE = "XID 79 <img src=x onerror=\"document.title='pwned'\">"

ROWS = "[...document.querySelectorAll('#nodes tbody tr')].map(r => r.dataset.node)"
# Worst first: CRITICAL, then the nodes we know nothing current of (offline, stale), WARN, OK.
WORST_FIRST = [
    "bad-node", "lost-node", "stale-node", "bad-node-2", "warn-node", "ok-node", "ok-node-2"
]  # fmt: skip
UUID = "GPU-3f1c0a2e-77d4-4b1e-9a0c-1d2e3f4a5b6c"
# A reason and a detail longer than any screen, without a space to break at.
LONG = "reset-refused-" + "x" * 600
RESET_X3 = "reset_gpu \N{MULTIPLICATION SIGN}3"  # the record's count: 3 refusals in one


def xid(reason: str = "XID 79: GPU has fallen off the bus") -> dict[str, Any]:
    finding = msg.finding("xid", "CRITICAL", reason)
    finding.update(
        action="reset_gpu", runbook="gpu-xid-reset-required", evidence={"xid": 79, "pid": 7}
    )
    return finding


def warn(check: str, reason: str) -> dict[str, Any]:
    return msg.finding(check, "WARN", reason)


def dbe() -> dict[str, Any]:
    finding = msg.finding("ecc", "CRITICAL", "2 uncorrected ECC errors since the last reset")
    finding.update(
        action="drain_and_reset",
        runbook="gpu-ecc-dbe",
        evidence={"ecc_dbe_volatile": 2, "retired_pages_pending": True, "threshold": None},
    )
    return finding


def checked_gpu() -> dict[str, Any]:
    """GPU 2 of bad-node as the agent reports it: what is checked before a reset."""
    gpu = msg.gpu_doc(2, "CRITICAL", [xid(HOSTILE), dbe()])
    gpu.update(
        uuid=UUID,
        serial="1650923000123",
        status="ok",
        workloads=[{"namespace": "ml", "pod": "trainer-0", "container": "main"},
                   {"hpc_job": "4242"}],
        processes=[{"pid": 4100, "name": "train.py", "used_mib": 61234.4, "user": "alice",
                    "alive": True, "job": "4242"}],
        temperature_c=71.0, power_w=512.3, power_limit_w=700.0,
        ecc_enabled=True, ecc_sbe_volatile=0, ecc_dbe_volatile=2, ecc_sbe_aggregate=1234,
        ecc_dbe_aggregate=None,
        retired_pages_sbe=1, retired_pages_dbe=2, retired_pages_pending=True,
        remapped_rows_correctable=0, remapped_rows_uncorrectable=1, row_remap_pending=True,
        row_remap_failure=False,
        pcie_generation=4, pcie_max_generation=5, pcie_width=16, pcie_max_width=16,
        pcie_replay_count=17,
        sm_clock_mhz=1410, sm_clock_max_mhz=1980, memory_clock_mhz=2619, performance_state=0,
        clock_event_reasons=["sw_thermal", "hw_slowdown"],
        nvlink={"up": [True, False, None], "effective_ber": [0.0, 3.5e-9], "symbol_ber": [],
                "crc_flit_errors": 0, "crc_data_errors": 12, "replay_errors": None,
                "recovery_errors": 1},
    )  # fmt: skip
    return gpu


def fleet_messages(now: float) -> list[tuple[str, dict[str, Any]]]:
    gpu = checked_gpu()
    a100 = msg.gpu_doc(0, "WARN", [warn("thermal", "GPU 0 at 91 C")])
    a100["model"] = A100
    lost = msg.gpu_doc(0, "WARN", [warn("ecc", "LOST-WARN-REASON")])
    stale = msg.gpu_doc(0, "WARN", [warn("ecc", "STALE-WARN-REASON")])
    h100 = {"driver": "550.54", "kernel": "6.1"}
    return [
        # Reported an hour ago and again now: its finding is an hour old.
        ("state", msg.state("bad-node", health="CRITICAL", gpus=[gpu], when=now - 3600)),
        ("state", cordoned(msg.state("bad-node", health="CRITICAL", gpus=[gpu], fingerprint=h100))),
        ("state", msg.state("bad-node-2", health="WARN", gpus=[msg.gpu_doc(1, "WARN", [xid()])])),
        (
            "state",
            msg.state(
                "warn-node",
                cluster="c2",
                health="WARN",
                gpus=[a100],
                fingerprint={"driver": "535.1", "kernel": "6.1"},
            ),
        ),
        ("state", msg.state("ok-node", fingerprint=h100)),
        ("state", cordoned(msg.state("ok-node-2", cluster="c2"))),
        ("state", msg.state("lost-node", health="WARN", gpus=[lost])),
        ("state", msg.offline("lost-node")),
        ("state", msg.state("stale-node", health="WARN", gpus=[stale], when=now - 960)),
        ("events", msg.event("bad-node")),
        # A storm on GPU 2 (0000:1a:00.0), as the agent reports an incident that grew.
        (
            "events",
            {
                **msg.event("bad-node", when=now - 30),
                "data": {
                    "kind": "xid",
                    "code": 45,
                    "gpu": "0000:1a:00.0",
                    "process": "train.py",
                    "pid": 4100,
                    "line": "NVRM: Xid (PCI:0000:1a:00): 45, pid=4100",
                    "incident": {"count": 400, "first_time": now - 60},
                },
            },
        ),
        ("actions", _action("bad-node")),
        ("actions", _refused_reset("bad-node", now)),
        ("actions", msg.cordon_request("bad-node")),
        ("replies", msg.reply("bad-node", "cmd-1")),
    ]


def _action(node: str) -> dict[str, Any]:
    message = schema.envelope("action", f"{node}:audit:1", node, "c1")
    # A cordon GPU 2 asked for, as the agent audits it: the GPUs in its evidence, the
    # fleet budget's decision in its detail.
    message["record"] = {
        "action": "cordon",
        "target": node,
        "result": "done",
        "reason": "GPU 0000:1a:00.0: XID 79 (xid)",
        "evidence": {"checks": "xid", "gpus": "0000:1a:00.0", "findings": 1},
        "detail": "approved: 1 of 2 nodes in the window",
    }
    return message


def cordoned(message: dict[str, Any]) -> dict[str, Any]:
    message["status"]["remediation"] = {"mode": "enforce", "cordoned_by_us": True}
    return message


def _refused_reset(node: str, now: float) -> dict[str, Any]:
    """A reset of GPU 2 refused three times over (first 5 s ago, last 1 s ago), with a
    reason and detail too long for any screen."""
    message = schema.envelope("action", f"{node}:audit:2", node, "c1", now - 5)
    message["record"] = {
        "action": "reset_gpu",
        "target": "0000:1a:00.0",
        "result": "refused",
        "reason": LONG,
        "evidence": {"checks": "xid", "processes": 1},
        "detail": "a process holds the GPU: " + LONG,
        "count": 3,
        "last_seen": now - 1,
    }
    return message


def utc_seconds(shown: str) -> int:
    """A time as the page writes it ("2026-12-03 11:12:28 UTC"), in Unix seconds."""
    return calendar.timegm(time.strptime(shown, "%Y-%m-%d %H:%M:%S UTC"))


async def rows(tab: Browser, expected: list[str]) -> None:
    """Until the node table shows exactly ``expected``, in order."""
    want = json.dumps(expected, separators=(",", ":"))
    try:
        await tab.wait_for(f"JSON.stringify({ROWS}) === {json.dumps(want)}")
    except AssertionError:
        raise AssertionError(f"rows {await tab.evaluate(ROWS)}, expected {expected}") from None


async def text(tab: Browser, selector: str) -> str:
    return str(await tab.evaluate(f"document.querySelector({json.dumps(selector)}).innerText"))


async def row_text(tab: Browser, node: str) -> str:
    return await text(tab, f'#nodes tr[data-node="{node}"]')


async def cells(tab: Browser, table: str) -> list[dict[str, str]]:
    """The rows of one of the page's tables (after its head), each cell by its column."""
    return list(
        await tab.evaluate(
            f"[...document.querySelectorAll({json.dumps('#' + table + ' tr')})].slice(1)"
            ".map(r => Object.fromEntries([...r.cells].map(c => [c.dataset.label, c.innerText])))"
        )
    )


async def terms(tab: Browser, dl: str) -> dict[str, str]:
    """A definition list of the page, term to value."""
    return dict(
        await tab.evaluate(
            f"[...document.querySelectorAll({json.dumps('#' + dl + ' dt')})]"
            ".map(t => [t.innerText, t.nextElementSibling.innerText])"
        )
    )


async def fits(tab: Browser, element_id: str) -> bool:
    """Whether the element's box (its table's scrolling wrapper) holds it without
    scrolling sideways, inside the window."""
    return bool(
        await tab.evaluate(
            f"(() => {{ const t = document.getElementById({json.dumps(element_id)});"
            " const box = t.parentElement;"
            " return box.scrollWidth <= box.clientWidth"
            " && t.getBoundingClientRect().right <= window.innerWidth; })()"
        )
    )


async def test_the_console(tmp_path: Path) -> None:
    port = free_port()
    config = msg.config(tmp_path, port=port, grafana_url_template=GRAFANA, runbook_base_url=DOCS)
    agg = Aggregator(config)
    await agg.start()
    sent: list[dict[str, Any]] = []

    async def publish(out: Any) -> None:
        sent.append(schema.decode(out.payload))

    object.__setattr__(agg.api, "publish", publish)  # no broker here: capture instead
    base = f"http://127.0.0.1:{port}/"
    try:
        for channel, message in fleet_messages(time.time()):
            agg.ingest.handle(
                msg.topic(message["node"], channel, message["cluster"]), schema.encode(message)
            )
        async with browser(chromium(), tmp_path) as tab:
            await fleet_table(tab, base)
            await node_page(tab, base)
            await acknowledge(tab, base, sent)
            await phone(tab, base)
    finally:
        await agg.close()


async def acknowledge(tab: Browser, base: str, sent: list[dict[str, Any]]) -> None:
    """The GPU page's Acknowledge form sends the allowlisted `ack` command with the token
    typed in; a wrong token sends nothing and says why."""
    await tab.open(base + "#gpu/c1/bad-node/2")
    await tab.wait_for(
        "document.body.dataset.view === 'gpu' && !!document.getElementById('findings')"
    )
    assert await tab.evaluate("document.getElementById('ack-form').hidden") is False
    options = "[...document.querySelectorAll('#ack-check option')].map(o => o.value)"
    assert await tab.evaluate(options) == ["", "xid", "ecc"]
    fill = (
        "document.getElementById('ack-check').value = 'xid';"
        "document.getElementById('ack-reason').value = 'reseated, DCGM level 3 passed';"
        "document.getElementById('ack-token').value = %s;"
        "document.querySelector('#ack-form button').click(); true"
    )
    await tab.evaluate(fill % json.dumps("wrong"))
    await tab.wait_for("document.getElementById('ack-result').textContent.startsWith('Not sent')")
    assert "HTTP 401" in await text(tab, "#ack-result")
    assert sent == []
    await tab.evaluate(fill % json.dumps(msg.COMMAND_TOKEN))
    await tab.wait_for("document.getElementById('ack-result').textContent.startsWith('Sent')")
    [command] = sent
    assert (command["node"], command["command"]) == ("bad-node", "ack")
    assert command["args"] == {
        "gpu": "0000:1a:00.0",
        "check": "xid",
        "reason": "reseated, DCGM level 3 passed",
        "by": "console",
    }
    assert command["id"] in await text(tab, "#ack-result")
    # The node view hides the form.
    await tab.open(base + "#node/c1/bad-node")
    await tab.wait_for("document.body.dataset.view === 'node'")
    assert await tab.evaluate("document.getElementById('ack-form').hidden") is True


async def fleet_table(tab: Browser, base: str) -> None:
    await tab.open(base)
    await rows(tab, WORST_FIRST)
    # Node text is text: the reason's markup is shown, never run.
    assert HOSTILE in await row_text(tab, "bad-node")
    assert await tab.evaluate("document.querySelectorAll('img').length") == 0
    assert await tab.evaluate("document.title") == "gpuagent fleet"
    # Offline and stale nodes: health unknown, how long ago they were seen, nothing of the
    # WARN they last reported.
    for node, state in (("lost-node", "offline (connection lost)"), ("stale-node", "stale")):
        row = await row_text(tab, node)
        assert "UNKNOWN" in row, row
        assert state in row, row
        assert "WARN" not in row, row
        assert "ago" in row, row
    assert "16 min ago" in await row_text(tab, "stale-node")
    # The cordoned column: what the node's agent says of itself.
    cordons = await tab.evaluate(
        "Object.fromEntries([...document.querySelectorAll('#nodes tbody tr')].map(r =>"
        " [r.dataset.node, r.querySelector('td.cordon-state').innerText]))"
    )
    cordoned_nodes = ("bad-node", "ok-node-2")
    assert cordons == {n: "cordoned" if n in cordoned_nodes else "no" for n in WORST_FIRST}
    # A finding's age; nodes per finding kind, online nodes only.
    assert "60 min" in await row_text(tab, "bad-node")
    kinds = await text(tab, "#kinds")
    assert "2 nodes with xid 79 (2 started today)" in kinds
    assert "1 node with thermal (1 started today)" in kinds
    assert "1 node with ecc (1 started today)" in kinds  # not the offline or stale node's
    # A kind's count lists its nodes.
    await tab.evaluate("document.querySelector('#kinds a').click()")
    await rows(tab, ["bad-node", "bad-node-2"])
    assert await tab.evaluate("location.hash") == "#fleet?kind=xid+79"
    assert "Only nodes with xid 79" in await text(tab, "#kind")
    await tab.evaluate("location.hash = '#fleet'")
    await rows(tab, WORST_FIRST)
    # Cordoned nodes first, by its header.
    await tab.evaluate("document.querySelector('button[data-sort=cordoned]').click()")
    await rows(tab, ["bad-node", "ok-node-2", *(n for n in WORST_FIRST if n not in cordoned_nodes)])
    assert "sort=cordoned" in await tab.evaluate("location.hash")
    await tab.evaluate("location.hash = '#fleet'")
    await rows(tab, WORST_FIRST)
    # A search by what an RMA ticket names a GPU by says which GPU it is.
    for query, by in (("1650923000123", "serial"), (UUID[:13].lower(), "UUID"),
                      ("00000000:1A:00.0", "bus id")):  # fmt: skip
        await tab.evaluate(f"location.hash = {json.dumps('#fleet?q=' + query)}")
        await rows(tab, ["bad-node"])
        said = f"GPU 2 (GPU-3f1c0a2e…) on bad-node, by {by}"
        try:
            await tab.wait_for(
                f"document.getElementById('matched').innerText.includes({json.dumps(said)})"
            )
        except AssertionError:
            raise AssertionError(await text(tab, "#matched")) from None
        matched = await text(tab, "#matched")
        assert "1 of 7 nodes match" in matched, matched
        assert await tab.evaluate("document.querySelector('#matched li a').hash") == (
            "#gpu/c1/bad-node/2"
        )
    await tab.evaluate("location.hash = '#fleet?q=fallen off'")
    await rows(tab, ["bad-node-2"])
    assert await tab.evaluate("document.querySelector('#matched li')") is None
    await tab.evaluate("location.hash = '#fleet'")
    await rows(tab, WORST_FIRST)
    assert "7 nodes" in await text(tab, "#summary")
    assert "Drifted: warn-node" not in await text(tab, "#drift")  # one node per cluster: c2
    await tab.screenshot("fleet-desktop")

    # Filters, as a person uses them: the table follows, and so does the URL.
    await tab.evaluate(
        "(() => { const s = document.querySelector('#filters [name=health]');"
        " s.value = 'WARN'; s.dispatchEvent(new Event('input', {bubbles: true})); })()"
    )
    await rows(tab, ["bad-node-2", "warn-node"])
    assert "health=WARN" in await tab.evaluate("location.hash")
    assert "2 of 7 nodes match" in await text(tab, "#matched")
    await tab.screenshot("fleet-filtered")
    for fragment, expected in (
        ("cluster=c2", ["warn-node", "ok-node-2"]),
        ("health=UNKNOWN", ["lost-node", "stale-node"]),
        (f"model={A100}", ["warn-node"]),
        ("driver=535.1", ["warn-node"]),
        ("q=fallen off", ["bad-node-2"]),
        ("cluster=c1&health=OK", ["ok-node"]),
    ):
        await tab.evaluate(f"location.hash = {json.dumps('#fleet?' + fragment)}")
        await rows(tab, expected)
    options = await tab.evaluate(
        "[...document.querySelectorAll('#filters [name=model] option')].map(o => o.value)"
    )
    assert options == ["", A100, "NVIDIA H100 80GB HBM3"]

    # Sorting: a header sorts by it, a second click reverses.
    await tab.evaluate("location.hash = '#fleet'")
    await rows(tab, WORST_FIRST)
    by_name = sorted(
        ["bad-node", "bad-node-2", "warn-node", "lost-node", "stale-node", "ok-node", "ok-node-2"]
    )
    await tab.evaluate("document.querySelector('button[data-sort=name]').click()")
    await rows(tab, by_name)
    await tab.evaluate("document.querySelector('button[data-sort=name]').click()")
    await rows(tab, by_name[::-1])
    assert "order=desc" in await tab.evaluate("location.hash")
    await tab.evaluate("location.hash = '#fleet?sort=finding_age'")
    # Oldest finding first (the stale node's dates from its report 16 min ago), nodes
    # without findings last.
    await tab.wait_for(f"{ROWS}.slice(0, 2).join() === 'bad-node,stale-node'")
    assert (await tab.evaluate(ROWS))[-2:] == ["ok-node", "ok-node-2"]


async def node_page(tab: Browser, base: str) -> None:
    await tab.evaluate("document.querySelector('#nodes tr[data-node=\"bad-node\"] a').click()")
    await tab.wait_for("document.body.dataset.view === 'node'")
    assert await tab.evaluate("location.hash") == "#node/c1/bad-node"
    # Events, actions and cordon decisions are written behind: the page shows them as they
    # land.
    await tab.wait_for(
        "!!document.getElementById('events') && !!document.getElementById('actions')"
    )
    gpus = await text(tab, "#gpus")
    for shown in (UUID, "1650923000123", "0000:1a:00.0", "pod ml/trainer-0 container main"):
        assert shown in gpus, gpus
    findings = await text(tab, "#findings")
    assert HOSTILE in findings
    assert "reset_gpu" in findings
    assert "60 min ago" in findings
    runbooks = await tab.evaluate("[...document.querySelectorAll('#findings a')].map(a => a.href)")
    assert runbooks == [DOCS + "checks.md#gpu-xid-reset-required", DOCS + "checks.md#gpu-ecc-dbe"]
    grafana = await tab.evaluate(
        "[...document.querySelectorAll('#node-view a')].map(a => a.href)"
        ".filter(h => h.startsWith('https://grafana'))"
    )
    assert grafana[:2] == [
        "https://grafana.example/d/gpuagent?var-cluster=c1&var-node=bad-node&var-gpu=All",
        "https://grafana.example/d/gpuagent?var-cluster=c1&var-node=bad-node&var-gpu=2",
    ]
    assert "xid" in await text(tab, "#events")
    await tab.wait_for(
        "document.getElementById('actions').innerText.includes('cordon decision')"
        " && document.getElementById('actions').innerText.includes('reset_gpu')"
    )
    # The actions as a table: time, action, GPU, outcome, reason; long text wraps.
    assert await tab.evaluate(
        "[...document.querySelectorAll('#actions th')].map(h => h.innerText)"
    ) == ["time", "action", "GPU", "outcome", "reason"]
    actions = {row["action"]: row for row in await cells(tab, "actions")}
    assert set(actions) == {"cordon", RESET_X3, "cordon decision"}
    cordon = actions["cordon"]
    assert cordon["time"].endswith(" UTC"), cordon
    assert (cordon["GPU"], cordon["outcome"]) == (
        "GPU 2 (0000:1a:00.0)",
        "done (approved: 1 of 2 nodes in the window)",
    ), cordon
    assert cordon["reason"].startswith("GPU 0000:1a:00.0: XID 79 (xid)"), cordon
    assert "gpus=0000:1a:00.0" in cordon["reason"], cordon  # its evidence, under it
    reset = actions[RESET_X3]
    assert reset["GPU"] == "GPU 2 (0000:1a:00.0)", reset
    # Its latest time, and its first: 4 s apart.
    shown = re.fullmatch(r"(.+ UTC) \(first (.+ UTC)\)", reset["time"])
    assert shown is not None, reset
    assert utc_seconds(shown[1]) - utc_seconds(shown[2]) == 4, reset
    assert reset["outcome"].startswith("refused (a process holds the GPU: reset-refused-x"), reset
    assert reset["reason"].replace("\n", "").startswith(LONG), reset
    assert actions["cordon decision"]["GPU"] == "node", actions
    assert actions["cordon decision"]["outcome"].startswith("approved"), actions
    assert await fits(tab, "actions")
    assert "done" in await text(tab, "#replies")
    assert await tab.evaluate("document.querySelectorAll('img').length") == 0
    # The last day: a health strip per GPU (and the node), from the aggregator's history.
    strips = await tab.evaluate(
        "[...document.querySelectorAll('#history tr')].slice(1)"
        ".map(r => [r.cells[0].innerText, r.cells[1].querySelectorAll('svg rect').length,"
        " r.cells[1].querySelector('svg title').textContent])"
    )
    assert strips[0][0] == "node"
    assert strips[0][1] >= 1, strips
    assert strips[1][0].startswith("GPU "), strips
    # The health now shows however recent its change (a few pixels of a day's 240), and
    # nothing is drawn before the node was first heard from.
    now = await tab.evaluate(
        "[...document.querySelectorAll('#history tr')].slice(1).map(r => {"
        " const rects = [...r.cells[1].querySelectorAll('svg rect')];"
        " const last = rects[rects.length - 1];"
        " return [Number(rects[0].getAttribute('x')), Number(last.getAttribute('width')),"
        " last.getAttribute('fill')]; })"
    )
    assert all(width >= 3 for _, width, _ in now), now
    assert now[0][2] == "#c62828", now  # the node is CRITICAL now
    assert all(x > 200 for x, _, _ in now), now  # first heard from minutes ago
    await tab.screenshot("node-desktop")

    # GPU 2's own page, from its row: identity, its findings with their evidence and what
    # clears each, what is checked before a reset, its last day, its events in words (the
    # storm as one line with its count).
    await tab.evaluate("document.querySelector('#gpus a[href^=\"#gpu/\"]').click()")
    await tab.wait_for("document.body.dataset.view === 'gpu'")
    assert await tab.evaluate("location.hash") == "#gpu/c1/bad-node/2"
    await gpu_page(tab)
    assert await tab.evaluate("document.querySelectorAll('#history svg').length") >= 1
    await tab.wait_for("!!document.getElementById('events')")
    gpu_events = await text(tab, "#events")
    assert "xid 45 on 0000:1a:00.0 (train.py, pid 4100) [400 records since" in gpu_events
    assert "0000:18:00.0" not in gpu_events  # another GPU's event
    # The cordon this GPU asked for, with the fleet budget's decision, and its reset; not
    # the node's own cordon request and decision.
    await tab.wait_for("!!document.getElementById('actions')")
    gpu_actions = {row["action"]: row for row in await cells(tab, "actions")}
    assert set(gpu_actions) == {"cordon", RESET_X3}, gpu_actions
    assert gpu_actions["cordon"]["outcome"] == "done (approved: 1 of 2 nodes in the window)"
    assert await fits(tab, "actions")
    assert await fits(tab, "findings")
    await tab.screenshot("gpu-desktop")

    # A GPU whose report carries none of it: every value "—", none 0.
    await tab.evaluate("location.hash = '#gpu/c1/bad-node-2/1'")
    await tab.wait_for("document.title.startsWith('GPU 1 · bad-node-2')")
    for table in ("ecc", "pcie"):
        for row in await cells(tab, table):
            values = list(row.values())[1:]
            assert all(v in ("—", "") for v in values), (table, row)
    for dl in ("memory", "clocks", "jobs"):
        assert set((await terms(tab, dl)).values()) == {"—"}, dl
    assert (
        await tab.evaluate(
            "[...document.querySelectorAll('#node-view h2')].find(h => h.innerText === 'NVLink')"
            ".nextElementSibling.innerText"
        )
        == "— (not in the node's report)"
    )
    assert "Processes: —" in await text(tab, "#node-view")
    assert "XID 79" in await text(tab, "#findings")
    await tab.screenshot("gpu-not-reported")

    # An offline node's page: health unknown, its last report marked as such.
    await tab.evaluate("location.hash = '#node/c1/lost-node'")
    await tab.wait_for("document.title.startsWith('lost-node')")
    view = await text(tab, "#node-view")
    assert "Health unknown: the node is offline (connection lost)" in view
    assert "UNKNOWN" in view
    await tab.screenshot("node-offline")
    await tab.evaluate("location.hash = '#node/c1/no-such-node'")
    await tab.wait_for("document.getElementById('error').innerText.includes('HTTP 404')")


async def gpu_page(tab: Browser) -> None:
    """GPU 2 of bad-node (`checked_gpu`), as an SRE reads it before a reset."""
    ident = await text(tab, "#node-view dl")
    for shown in (UUID, "1650923000123", "0000:1a:00.0"):
        assert shown in ident, ident
    # Each finding with its evidence, what clears it, its runbook and real onset.
    findings = await cells(tab, "findings")
    assert [f["check"] for f in findings] == ["xid", "ecc"], findings
    for shown, sent in zip(findings, checked_gpu()["findings"], strict=True):
        assert shown["reason"] == sent["reason"], shown
        for name, value in sent["evidence"].items():
            word = {True: "yes", None: "—"}.get(value, value)
            assert f"{name}: {word}" in shown["evidence"].split("\n"), (name, shown)
        assert shown["runbook"] == sent["runbook"], shown
        assert "60 min ago" in shown["started"], shown
    assert HOSTILE in findings[0]["reason"]
    assert findings[0]["to clear it"] == (
        "Reset the GPU (nvidia-smi -r -i <gpu>) once no process uses it; no reboot needed."
    )
    assert findings[1]["to clear it"] == "Drain the GPU's jobs now, then reset the GPU."
    assert await tab.evaluate("document.querySelector('#findings code').innerText") == (
        "nvidia-smi -r -i <gpu>"
    )
    # Memory: ECC counts volatile and lifetime, retired pages, remapped rows.
    assert await cells(tab, "ecc") == [
        {
            "ECC errors": "corrected (single-bit)",
            "volatile (since the last reset)": "0",
            "aggregate (lifetime)": "1234",
        },
        {
            "ECC errors": "uncorrected (double-bit)",
            "volatile (since the last reset)": "2",
            "aggregate (lifetime)": "—",  # not reported, not 0
        },
    ]
    assert await terms(tab, "memory") == {
        "ECC mode": "on",
        "retired pages": "1 single-bit, 2 double-bit",
        "retirement pending": "yes",
        "remapped rows": "0 correctable, 1 uncorrectable",
        "row remap pending": "yes",
        "row remap failure": "no",
    }
    # PCIe: current against max (a link trained down stands out) and replays.
    assert await cells(tab, "pcie") == [
        {"PCIe": "generation", "current": "4", "max": "5"},
        {"PCIe": "width", "current": "x16", "max": "x16"},
        {"PCIe": "replay counter", "current": "17", "max": ""},
    ]
    assert (
        await tab.evaluate("document.querySelector('#pcie tr:nth-child(2) span').className")
        == "WARN"
    )
    assert (
        await tab.evaluate("document.querySelector('#pcie tr:nth-child(3) span').className") == ""
    )
    # NVLink: each link's state and bit-error rates, the counters over all links.
    assert await cells(tab, "nvlink") == [
        {"link": "0", "state": "up", "effective BER": "0", "symbol BER": "—"},
        {"link": "1", "state": "down", "effective BER": "3.5e-9", "symbol BER": "—"},
        {"link": "2", "state": "—", "effective BER": "—", "symbol BER": "—"},
    ]
    assert await terms(tab, "nvlink-errors") == {
        "CRC flit errors": "0",
        "CRC data errors": "12",
        "replay errors": "—",
        "recovery errors": "1",
    }
    assert await terms(tab, "clocks") == {
        "SM clock": "1410 MHz (max 1980 MHz)",
        "memory clock": "2619 MHz",
        "performance state": "P0",
        "throttle reasons": "sw_thermal, hw_slowdown",
        "temperature": "71 °C",
        "power": "512.3 W (limit 700 W)",
    }
    # Who runs on it: the pod, the Slurm job, the processes.
    assert await terms(tab, "jobs") == {"job or pod": "pod ml/trainer-0 container main; job 4242"}
    assert await cells(tab, "processes") == [
        {
            "pid": "4100",
            "process": "train.py",
            "user": "alice",
            "memory": "61234 MiB",
            "Slurm job": "4242",
            "running": "yes",
        }
    ]


async def phone(tab: Browser, base: str) -> None:
    """On a phone the body never scrolls sideways: wide tables scroll inside themselves."""
    await tab.viewport(390, 844, mobile=True)
    overflow = "document.documentElement.scrollWidth - window.innerWidth"
    await tab.open(base)
    await rows(tab, WORST_FIRST)
    assert await tab.evaluate("window.innerWidth") == 390
    assert await tab.evaluate(overflow) <= 0
    await tab.screenshot("fleet-phone")
    await tab.evaluate("location.hash = '#node/c1/bad-node'")
    await tab.wait_for("document.body.dataset.view === 'node' && !!document.getElementById('gpus')")
    assert await tab.evaluate(overflow) <= 0
    # Each GPU is a card of labelled values, not a table row cut off at the screen's edge.
    card = await tab.evaluate(
        "(() => { const row = document.querySelector('#gpus tr:nth-child(2)');"
        " const cells = [...row.querySelectorAll('td')];"
        " return {display: [...new Set(cells.map(td => getComputedStyle(td).display))],"
        " labelled: Object.fromEntries(cells.map(td => [td.dataset.label, td.innerText])),"
        " right: row.getBoundingClientRect().right,"
        " head: getComputedStyle(document.querySelector('#gpus tr')).display}; })()"
    )
    assert card["display"] == ["block"], card
    assert card["head"] == "none", card
    assert card["right"] <= 390, card
    assert card["labelled"]["UUID"] == UUID, card
    assert card["labelled"]["workload"] == "pod ml/trainer-0 container main; job 4242", card
    assert await fits(tab, "actions")
    await tab.screenshot("node-phone")
    await tab.evaluate("location.hash = '#gpu/c1/bad-node/2'")
    await tab.wait_for(
        "document.body.dataset.view === 'gpu' && !!document.getElementById('nvlink')"
    )
    assert await tab.evaluate(overflow) <= 0
    assert await fits(tab, "findings")
    await tab.screenshot("gpu-phone")


# One NVL72-style domain of three trays (cluster UUID / clique id), and a second domain.
DOMAIN = "1b6a4c1e-0000-4000-8000-00000000000a/7"
OTHER_DOMAIN = "1b6a4c1e-0000-4000-8000-00000000000b/7"
# Real GB200 lines: the link that went down, and what the other GPUs of the job log.
LINK_DOWN = (
    "NVRM: Xid (PCI:{pci}): 149, pid=8123, name=python3, NETIR_LINK_EVT Fatal XC0 i0 Link 14 "
    "(0x00000001 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)"
)
DOWNSTREAM = (
    "NVRM: Xid (PCI:{pci}): 145, pid=8123, name=python3, RLW_TAGSTATE Fatal XC0 i0 Link 03 "
    "(0x00000004 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)"
)


def tray(node: str, domain: str, when: float) -> dict[str, Any]:
    """A node's state report: two GPUs in the NVLink domain ``domain``."""
    gpus = [msg.gpu_doc(i) for i in range(2)]
    uuid, clique = domain.split("/")
    for gpu in gpus:
        gpu["fabric"] = {
            "state": "completed",
            "cluster_uuid": uuid,
            "clique_id": int(clique),
            "nvlink_domain": domain,
        }
    return msg.state(node, gpus=gpus, when=when)


def kernel(node: str, index: int, code: int, line: str, when: float) -> dict[str, Any]:
    """A kernel record of GPU ``index`` as the agent sends it."""
    bus = msg.gpu_doc(index)["pci_bus_id"]
    message = msg.event(node, when=when)
    message["data"] = {
        "id": f"boot-1:{node}:{index}:{code}",
        "source": "kmsg",
        "kind": "xid",
        "code": code,
        "gpu": bus,
        "pci": bus,
        "time": when,
        "line": line.format(pci=bus.rsplit(".", 1)[0]),
    }
    return message


def rack_incidents(start: float) -> list[tuple[str, dict[str, Any]]]:
    """GPU 0 of tray-a loses NVLink 14 and every GPU of tray-b and tray-c logs Xid 145;
    tray-a asks to be cordoned (the root: approved) and so does tray-b (a consequence:
    denied). Then two links of tray-x, in another domain, go down at once: no GPU is the
    root."""
    messages = [("state", tray(node, DOMAIN, start)) for node in ("tray-a", "tray-b", "tray-c")]
    messages.append(("state", tray("tray-x", OTHER_DOMAIN, start)))
    messages.append(("events", kernel("tray-a", 0, 149, LINK_DOWN, start + 0.1)))
    messages += [
        ("events", kernel(node, index, 145, DOWNSTREAM, start + 0.5 + n))
        for n, node in enumerate(("tray-b", "tray-c"))
        for index in range(2)
    ]
    messages.append(("actions", msg.cordon_request("tray-a")))
    messages.append(("actions", msg.cordon_request("tray-b")))
    messages += [("events", kernel("tray-x", i, 149, LINK_DOWN, start + 10)) for i in range(2)]
    return messages


INCIDENT_ROWS = "[...document.querySelectorAll('#incidents tbody tr')]"


async def test_fleet_incidents_in_the_console(tmp_path: Path) -> None:
    """The Incidents view names each incident's root (or says there is none), its members,
    age and cordon decisions; a row shows its members; a node's page links to the
    incidents it is in."""
    port = free_port()
    # Cordon requests decided at once (no settling), so the test need not wait for it.
    config = msg.config(
        tmp_path,
        port=port,
        max_nodes=3,
        correlation=CorrelationSection(settle_seconds=0.0),
    )
    # The aggregator's clock runs 10 min behind: the incidents started 10 min ago, and
    # putting it forward 5 min closes them (5 min ago).
    offset = [-600.0]
    agg = Aggregator(config, clock=lambda: time.time() + offset[0])
    await agg.start()
    base = f"http://127.0.0.1:{port}/"

    async def written(state: str) -> list[dict[str, Any]]:
        found = await agg.store.incidents(since=0.0, limit=10)
        done = len(found) == 2 and all(i["state"] == state for i in found)
        return found if done and any(i["denied"] for i in found) else []

    try:
        for channel, message in rack_incidents(agg.clock()):
            agg.ingest.handle(
                msg.topic(message["node"], channel, message["cluster"]), schema.encode(message)
            )
        # Written by the correlation task (every 0.5 s), then by the store's writer.
        await until(lambda: _truthy(written("open")), 10)
        incidents = {i["domain"]: i for i in await written("open")}
        rack, other = incidents[f"nvlink:{DOMAIN}"], incidents[f"nvlink:{OTHER_DOMAIN}"]
        assert (rack["root"]["node"], rack["approved"], rack["denied"]) == (
            "tray-a",
            ["tray-a"],
            ["tray-b"],
        )
        async with browser(chromium(), tmp_path) as tab:
            await tab.open(base + "#incidents")
            await tab.wait_for(f"{INCIDENT_ROWS}.length === 2")
            assert await tab.evaluate("document.body.dataset.view") == "incidents"
            # The latest first; open ones marked.
            order = await tab.evaluate(f"{INCIDENT_ROWS}.map(r => r.dataset.incident)")
            assert order == [other["id"], rack["id"]]
            classes = await tab.evaluate(f"{INCIDENT_ROWS}.map(r => r.className)")
            assert all("open" in c.split() for c in classes), classes
            cells = await tab.evaluate(
                f"{INCIDENT_ROWS}.map(r => Object.fromEntries([...r.cells].map((c, i) =>"
                " [document.querySelectorAll('#incidents th')[i].innerText, c.innerText])))"
            )
            assert cells[1] == {
                "state": "open",
                "root": "tray-a GPU 0: Xid 149, link 14",
                "domain": f"nvlink:{DOMAIN}",
                "cluster": "c1",
                "members": "5 GPUs on 3 nodes",
                "age": "10 min",
                "cordons approved": "tray-a",
                "cordons denied": "tray-b",
            }, cells[1]
            assert cells[0]["root"] == "root unknown (domain-level)", cells[0]
            assert cells[0]["members"] == "2 GPUs on 1 node", cells[0]
            root_link = await tab.evaluate(
                f"{INCIDENT_ROWS}[1].querySelector('td:nth-child(2) a').getAttribute('href')"
            )
            assert root_link == "#node/c1/tray-a"
            await tab.screenshot("incidents-desktop")

            # A row shows its members, each with its role.
            await tab.evaluate(f"{INCIDENT_ROWS}[1].cells[4].click()")
            await tab.wait_for("!!document.getElementById('incident-members')")
            assert await tab.evaluate("location.hash") == f"#incidents/{rack['id']}"
            members = await tab.evaluate(
                "[...document.querySelectorAll('#incident-members tr')].slice(1)"
                ".map(r => [r.cells[0].innerText, r.cells[1].innerText, r.cells[4].innerText,"
                " r.cells[5].innerText])"
            )
            assert members == [
                ["tray-a", "GPU 0", "root", "149"],
                ["tray-b", "GPU 0", "consequence", "145"],
                ["tray-b", "GPU 1", "consequence", "145"],
                ["tray-c", "GPU 0", "consequence", "145"],
                ["tray-c", "GPU 1", "consequence", "145"],
            ], members
            detail = await text(tab, "#incident-detail")
            assert "Xid 149, link 14 on tray-a GPU 0" in detail, detail  # its summary
            assert "selected" in await tab.evaluate(f"{INCIDENT_ROWS}[1].className")
            await tab.screenshot("incident-members")

            # A consequence's node page links to its incident.
            await tab.evaluate("location.hash = '#node/c1/tray-b'")
            await tab.wait_for(
                "document.title.startsWith('tray-b') && !!document.getElementById('node-incidents')"
            )
            links = await tab.evaluate(
                "[...document.querySelectorAll('#node-incidents a[href^=\"#incidents/\"]')]"
                ".map(a => [a.getAttribute('href'), a.closest('tr').cells[1].innerText])"
            )
            assert links == [[f"#incidents/{rack['id']}", "consequence"]], links
            assert "tray-a GPU 0: Xid 149, link 14" in await text(tab, "#node-incidents")
            await tab.evaluate("document.querySelector('#node-incidents a').click()")
            await tab.wait_for(f"document.title.startsWith('{rack['id']} · incidents')")
            assert "tray-b" in await text(tab, "#incident-members")
            # A GPU's page: the incidents that GPU is in.
            await tab.evaluate("location.hash = '#gpu/c1/tray-a/0'")
            await tab.wait_for("document.title.startsWith('GPU 0 · tray-a')")
            assert "root" in await text(tab, "#node-incidents")
            await tab.evaluate("location.hash = '#gpu/c1/tray-x/1'")
            await tab.wait_for("document.title.startsWith('GPU 1 · tray-x')")
            assert other["id"] in await text(tab, "#node-incidents")

            # Quiet for the join window: closed, and shown so.
            offset[0] = -300.0
            await until(lambda: _truthy(written("closed")), 10)
            await tab.evaluate("location.hash = '#incidents'")
            await tab.wait_for(
                f"{INCIDENT_ROWS}.length === 2 && {INCIDENT_ROWS}.every(r =>"
                " r.className.split(' ').includes('closed'))"
            )
            ages = await tab.evaluate(f"{INCIDENT_ROWS}.map(r => r.cells[5].innerText)")
            assert ages == ["closed 5 min ago", "closed 5 min ago"], ages
            assert "0 open, 2 closed" in await text(tab, "#incidents-count")
            await tab.screenshot("incidents-closed")
            await tab.viewport(390, 844, mobile=True)
            await tab.evaluate(f"location.hash = '#incidents/{rack['id']}'")
            await tab.wait_for(f"document.title.startsWith('{rack['id']} · incidents')")
            overflow = "document.documentElement.scrollWidth - window.innerWidth"
            assert await tab.evaluate(overflow) <= 0
            await tab.screenshot("incidents-phone")
    finally:
        await agg.close()


async def _truthy(found: Any) -> bool:
    return bool(await found)


RULE_ROWS = "[...document.querySelectorAll('#rules tbody tr')]"


def repeat_offender(now: float) -> RuleFinding:
    """GPU 0 of bad-node CRITICAL again 2 h after it recovered, as the rule raises it."""
    return RuleFinding(
        id=f"repeat_offender/c1/bad-node/GPU-0/critical/{now - 600!r}",
        rule="repeat_offender",
        cluster="c1",
        node="bad-node",
        gpu="GPU-0",
        time=now - 600,
        summary="GPU 0 (GPU-0) on bad-node is CRITICAL again 2.0 h after it recovered: Xid 79",
        recommendation="replace the GPU: a GPU failing again within 7 days of a recovery is "
        "a repeat offender",
        evidence={
            "critical": {"time": now - 600, "index": 0, "check": "xid", "reason": "Xid 79"},
            "recovered": {"time": now - 7800, "node": "bad-node"},
            "previous": {"time": now - 9000, "node": "bad-node", "index": 0},
        },
    )


async def test_rules_and_the_cordon_budget_in_the_console(tmp_path: Path) -> None:
    """The fleet overview shows each cluster's cordon budget, red when spent, with who holds
    its slots and when the first frees; the Rules view lists the open rule findings with the
    command that clears one; a node's page its own."""
    port = free_port()
    agg = Aggregator(msg.config(tmp_path, port=port, max_nodes=2))
    await agg.start()
    base = f"http://127.0.0.1:{port}/"
    try:
        for message in (
            msg.state("bad-node"),
            msg.state("ok-node"),
            msg.state("ok-node-2"),
            msg.state("other-node", cluster="c2"),
            msg.cordon_request("bad-node"),
            msg.cordon_request("ok-node"),
        ):
            channel = "actions" if message["type"] == "cordon_request" else "state"
            agg.ingest.handle(
                msg.topic(message["node"], channel, message["cluster"]), schema.encode(message)
            )
        assert agg.rules is not None
        finding = repeat_offender(agg.clock())
        agg.rules.open[finding.id] = finding
        agg.store.queue_finding(finding)
        await agg.store.flush()
        async with browser(chromium(), tmp_path) as tab:
            await tab.open(base)
            await tab.wait_for("!!document.getElementById('budget-table')")
            budget = await tab.evaluate(
                "[...document.querySelectorAll('#budget-table tr')].slice(1).map(r =>"
                " [r.dataset.cluster, r.className, ...[...r.cells].map(c => c.innerText)])"
            )
            assert [row[:6] for row in budget] == [
                ["c1", "spent", "c1", "2 of 2", "0", "spent"],
                ["c2", "", "c2", "0 of 1", "1", "open"],
            ], budget
            assert "bad-node (frees in 60 min), ok-node (frees in 60 min)" in budget[0][6]
            assert budget[0][7].startswith("in 60 min ("), budget
            assert budget[1][6:] == ["", ""], budget
            colour = await tab.evaluate(
                "getComputedStyle(document.querySelector('#budget-table tr.spent td')).color"
            )
            assert colour == "rgb(176, 0, 32)", colour
            assert "At most 2 nodes and 100 % of a cluster's nodes cordoned within 60 min" in (
                await text(tab, "#budget")
            )
            await tab.screenshot("budget-spent")

            await tab.evaluate("document.querySelector('#views a[data-view=rules]').click()")
            await tab.wait_for(f"document.body.dataset.view === 'rules' && {RULE_ROWS}.length")
            assert await tab.evaluate("location.hash") == "#rules"
            assert await tab.evaluate("document.title") == "rules · gpuagent"
            cells = await tab.evaluate(
                f"{RULE_ROWS}.map(r => Object.fromEntries([...r.cells].map((c, i) =>"
                " [document.querySelectorAll('#rules th')[i].innerText, c.innerText])))"
            )
            assert cells == [
                {
                    "rule": "repeat_offender",
                    "node": "bad-node",
                    "GPU": "GPU 0 GPU-0",
                    "age": "10 min",
                    "summary": finding.summary,
                    "recommendation": finding.recommendation,
                    "evidence": "CRITICAL 3 h ago on bad-node; recovered 2 h ago on bad-node; "
                    "CRITICAL again 10 min ago; no RMA bundle",
                    "to clear it": f"gpuagent-aggregator rules clear '{finding.id}' --reason TEXT",
                }
            ], cells
            href = await tab.evaluate(f"{RULE_ROWS}[0].cells[1].querySelector('a').hash")
            assert href == "#node/c1/bad-node"
            assert "1 open finding" in await text(tab, "#rules-count")
            assert "gpuagent-aggregator rules clear ID --reason TEXT" in (
                await text(tab, "#rules-clear")
            )
            await tab.screenshot("rules-desktop")

            await tab.evaluate(f"{RULE_ROWS}[0].cells[1].querySelector('a').click()")
            await tab.wait_for("!!document.getElementById('node-rules')")
            mine = await text(tab, "#node-rules")
            assert "repeat_offender" in mine
            assert finding.summary in mine
            # The GPU it names shows it on its own page.
            await tab.evaluate("location.hash = '#gpu/c1/bad-node/0'")
            await tab.wait_for("document.title.startsWith('GPU 0 · bad-node')")
            await tab.wait_for("!!document.getElementById('node-rules')")
            assert finding.summary in await text(tab, "#node-rules")
            await tab.evaluate("location.hash = '#node/c1/ok-node'")
            await tab.wait_for("document.title.startsWith('ok-node')")
            await tab.wait_for("!document.getElementById('node-rules')")
            shown = await tab.evaluate(
                "[...document.querySelectorAll('#node-view h2')]"
                ".find(h => h.innerText === 'Fleet rule findings').nextElementSibling.innerText"
            )
            assert shown == "None open.", shown

            # Cleared (as the CLI does, through the API): the view empties.
            async with aiohttp.ClientSession() as session:
                url = f"{base}api/v1/rules/{finding.id}/clear"
                body = {"reason": "GPU replaced", "by": "test"}
                async with session.post(url, json=body, headers=msg.AUTH) as response:
                    assert response.status == 200
            await agg.store.flush()
            await tab.evaluate("location.hash = '#rules'")
            await tab.wait_for(f"{RULE_ROWS}.length === 0")
            assert "No open fleet rule findings." in await text(tab, "#rules-count")
    finally:
        await agg.close()


MAINTENANCE_ROWS = "[...document.querySelectorAll('#maintenance-table tr')].slice(1)"
TAGGED = "document.querySelector('#nodes tr[data-node=\"r7-tray\"] .maintenance')"


async def test_planned_maintenance_in_the_console(tmp_path: Path) -> None:
    """The fleet overview lists the running maintenance windows with the commands that start
    and end one, the node table tags the nodes a window covers, and a covered node's page
    says what the window mutes; once the window ends, all three go."""
    port = free_port()
    agg = Aggregator(msg.config(tmp_path, port=port))
    await agg.start()
    base = f"http://127.0.0.1:{port}/"
    try:
        covered = msg.state("r7-tray")
        covered["status"]["node"]["labels"] = {"rack": "r7"}
        for message in (covered, msg.state("ok-node")):
            agg.ingest.handle(
                msg.topic(message["node"], "state", message["cluster"]), schema.encode(message)
            )
        window = agg.state.maintenance.start(
            "rack=r7", 3 * 3600, cluster="", by="alice", reason="BIOS 1.4 rollout",
            now=agg.clock(),
        )  # fmt: skip
        agg.store.queue_window(window, agg.clock())
        await agg.store.flush()
        async with browser(chromium(), tmp_path) as tab:
            await tab.open(base)
            await tab.wait_for(f"{MAINTENANCE_ROWS}.length === 1")
            cells = await tab.evaluate(
                f"{MAINTENANCE_ROWS}.map(r => [r.dataset.window, ...[...r.cells]"
                ".map(c => c.innerText)])"
            )
            until_cell = cells[0].pop(3)
            assert cells == [
                [
                    window.id,
                    "rack=r7",
                    "all clusters",
                    "alice",
                    "BIOS 1.4 rollout",
                    window.id,
                    f"gpuagent-aggregator maintenance end '{window.id}'",
                ]
            ], cells
            assert until_cell.endswith(" UTC (3 h left)"), until_cell
            howto = await text(tab, "#maintenance")
            assert "gpuagent-aggregator maintenance start --domain NAME=VALUE --for 2h" in howto
            assert "gpuagent-aggregator maintenance end ID" in howto
            assert await tab.evaluate(f"{TAGGED}.title") == f"planned maintenance {window.id}"
            assert (await row_text(tab, "r7-tray")).startswith("r7-tray maintenance")
            assert "maintenance" not in await row_text(tab, "ok-node")
            await tab.screenshot("maintenance-running")

            await tab.evaluate(f"{TAGGED}.previousElementSibling.click()")
            await tab.wait_for("!!document.getElementById('node-maintenance')")
            line = await text(tab, "#node-maintenance")
            assert line.startswith(f"In planned maintenance {window.id} (rack=r7, until "), line
            assert line.endswith(
                " UTC, by alice: BIOS 1.4 rollout): its records open no fleet incident and its "
                "cordon requests are denied."
            ), line
            await tab.evaluate("location.hash = '#gpu/c1/r7-tray/0'")
            await tab.wait_for("document.title.startsWith('GPU 0 · r7-tray')")
            assert await text(tab, "#node-maintenance") == line
            await tab.evaluate("location.hash = '#node/c1/ok-node'")
            await tab.wait_for("document.title.startsWith('ok-node')")
            assert await tab.evaluate("!document.getElementById('node-maintenance')")

            # Ended early (as the CLI does): the line, the tag and the listing go.
            ended = agg.state.maintenance.end(window.id, by="alice", now=agg.clock())
            agg.store.queue_window(ended, agg.clock())
            await agg.store.flush()
            await tab.evaluate("location.hash = '#node/c1/r7-tray'")
            await tab.wait_for("document.title.startsWith('r7-tray')")
            await tab.wait_for("!document.getElementById('node-maintenance')")
            await tab.evaluate("location.hash = '#fleet'")
            await tab.wait_for(f"document.body.dataset.view === 'fleet' && !{TAGGED}")
            await tab.wait_for("!document.getElementById('maintenance-table')")
            assert (await text(tab, "#maintenance")).startswith("None running.")
            assert "maintenance" not in await row_text(tab, "r7-tray")
    finally:
        await agg.close()


FLEET = 10_000


def big_fleet(agg: Aggregator, now: float) -> None:
    """10,000 nodes of 8 GPUs, one in 20 with an XID, straight into the state."""
    for i in range(FLEET):
        name = f"gpu-{i:05d}"
        bad = i % 20 == 0
        gpus = [
            msg.gpu_doc(
                g, "CRITICAL" if bad and g == 3 else "OK", [xid()] if bad and g == 3 else None
            )
            for g in range(8)
        ]
        message = msg.state(
            name,
            cluster=f"c{i % 4}",
            health="CRITICAL" if bad else "OK",
            gpus=gpus,
            when=now,
            fingerprint={"driver": "550.54", "kernel": "6.1"},
        )
        agg.state.put(from_online_state(message, json.dumps(message), now))


async def test_a_10000_node_fleet_serves_and_renders_fast(tmp_path: Path) -> None:
    port = free_port()
    agg = Aggregator(msg.config(tmp_path, port=port))
    await agg.start()
    base = f"http://127.0.0.1:{port}/"
    try:
        big_fleet(agg, time.time())
        async with aiohttp.ClientSession() as session:
            start = time.perf_counter()
            async with session.get(base + "api/v1/fleet?limit=500") as response:
                doc = await response.json()
            serve_ms = elapsed_ms(start)
        assert doc["matched"] == FLEET
        assert len(doc["nodes"]) == 500
        assert doc["kinds"] == [{"kind": "xid 79", "nodes": 500, "today": 500}]
        async with browser(chromium(), tmp_path) as tab:
            start = time.perf_counter()
            await tab.open(base)
            load_ms = elapsed_ms(start)
            render_ms = await tab.evaluate("window.firstRenderMs")
            assert len(await tab.evaluate(ROWS)) == 500
            await tab.screenshot("fleet-10000")
    finally:
        await agg.close()
    print(
        f"\n10,000 nodes: /api/v1/fleet served in {serve_ms:.0f} ms; page rendered "
        f"{render_ms:.0f} ms after navigation ({load_ms:.0f} ms to loaded, as measured here)"
    )
    # Generous bounds for a loaded CI machine; a regression to downloading or drawing the
    # whole fleet takes several times longer.
    assert serve_ms < 2000
    assert render_ms < 5000
