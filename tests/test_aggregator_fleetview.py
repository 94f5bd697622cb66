"""The fleet console's server side: filters, sorting, shown health, finding onsets and
per-kind counts (gpuagent.aggregator.fleetview), /api/v1/fleet, and the page's links."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import aiohttp
import pytest

import aggregator_support as msg
from conftest import free_port
from gpuagent.aggregator import page
from gpuagent.aggregator.fleetview import FleetView, Query, finding_kind, shown_health
from gpuagent.aggregator.records import from_online_state, with_offline
from gpuagent.aggregator.service import Aggregator
from gpuagent.aggregator.state import FleetState
from gpuagent.checks import Action
from gpuagent.config import ConfigError, load_config

NOW = 1_800_000_000.0
STALE = 120.0


def xid(code: int = 79) -> dict[str, Any]:
    finding = msg.finding("xid", "CRITICAL", f"XID {code}")
    finding["evidence"] = {"xid": code}
    return finding


def put(state: FleetState, node: str, when: float = NOW, **kwargs: Any) -> None:
    message = msg.state(node, when=when, **kwargs)
    state.put(from_online_state(message, json.dumps(message), when))


def names(doc: dict[str, Any]) -> list[str]:
    return [n["name"] for n in doc["nodes"]]


@pytest.fixture
def view() -> FleetView:
    state = FleetState()
    put(state, "a", health="CRITICAL", gpus=[msg.gpu_doc(0, "CRITICAL", [xid()])], when=NOW - 600)
    put(state, "a", health="CRITICAL", gpus=[msg.gpu_doc(0, "CRITICAL", [xid()])])
    put(
        state,
        "b",
        cluster="c2",
        health="WARN",
        gpus=[msg.gpu_doc(1, "WARN", [xid(48)])],
        fingerprint={"driver": "535.1"},
    )
    serial = {**msg.gpu_doc(2), "uuid": "GPU-3f1c0a2e-77d4", "serial": "1650923000123"}
    put(state, "c", gpus=[serial], fingerprint={"driver": "550.54"})
    put(state, "old", health="WARN", gpus=[msg.gpu_doc(0, "WARN", [xid()])], when=NOW - 900)
    message = msg.state("gone", health="WARN", gpus=[msg.gpu_doc(0, "WARN", [xid()])], when=NOW)
    record = from_online_state(message, json.dumps(message), NOW)
    state.put(record)
    state.put(with_offline(msg.offline("gone"), record, NOW))
    return FleetView(state, STALE)


def test_offline_and_stale_nodes_show_unknown(view: FleetView) -> None:
    shown = {n["name"]: n["shown_health"] for n in view.fleet(Query(), NOW)["nodes"]}
    assert shown == {"a": "CRITICAL", "b": "WARN", "c": "OK", "old": "UNKNOWN", "gone": "UNKNOWN"}
    gone = view.state.nodes[("c1", "gone")]
    assert gone.health == "WARN"  # remembered, not shown
    assert shown_health(gone, NOW, STALE) == "UNKNOWN"


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        # Worst first: CRITICAL, then what we know nothing current of (offline, stale),
        # then WARN, then OK.
        (Query(), ["a", "gone", "old", "b", "c"]),
        (Query(cluster="c2"), ["b"]),
        (Query(health="UNKNOWN"), ["gone", "old"]),
        (Query(health="OK"), ["c"]),
        (Query(driver="550.54"), ["c"]),
        (Query(model="NVIDIA H100 80GB HBM3", health="WARN"), ["b"]),
        (Query(model="nothing"), []),
        (Query(text="XID 48"), ["b"]),
        (Query(text="GON"), ["gone"]),  # names too, any case
        # A GPU by what an RMA ticket or an alert names it: UUID, serial, bus id in any form.
        (Query(text="gpu-3f1c0a2e"), ["c"]),
        (Query(text="1650923000123"), ["c"]),
        (Query(text="0000:1a:00.0"), ["c"]),
        (Query(text="00000000:1A:00.0"), ["c"]),
        (Query(text="1a:00.0"), ["c"]),
        (Query(kind="xid 48"), ["b"]),
        (Query(kind="xid 79", health="CRITICAL"), ["a"]),
        (Query(sort="name"), ["a", "b", "c", "gone", "old"]),
        (Query(sort="name", descending=True), ["old", "gone", "c", "b", "a"]),
        (Query(sort="last_seen"), ["old", "a", "b", "c", "gone"]),
        (Query(sort="finding_age"), ["old", "a", "b", "gone", "c"]),
        (Query(limit=2), ["a", "gone"]),
    ],
)
def test_filters_and_sorting(view: FleetView, query: Query, expected: list[str]) -> None:
    doc = view.fleet(query, NOW)
    assert names(doc) == expected
    assert doc["matched"] == (len(expected) if query.limit > len(expected) else 5)
    assert doc["counts"]["nodes"] == 5


def test_the_health_order_ranks_unknown_above_warn_and_ok() -> None:
    """Worst first, as whoever is on call reads the table: CRITICAL, offline (we know
    nothing), stale, WARN, UNKNOWN (online, could not judge), OK; by cluster and name
    within each."""
    state = FleetState()
    for node, health in (("ok", "OK"), ("unknown", "UNKNOWN"), ("warn", "WARN")):
        put(state, node, health=health)
    put(state, "crit", health="CRITICAL", cluster="c2")
    put(state, "crit-2", health="CRITICAL")
    put(state, "stale", health="CRITICAL", when=NOW - 10 * STALE)
    for node in ("lost-b", "lost-a"):
        message = msg.state(node, health="OK", when=NOW)
        record = from_online_state(message, json.dumps(message), NOW)
        state.put(with_offline(msg.offline(node), record, NOW))
    view = FleetView(state, STALE)
    expected = ["crit-2", "crit", "lost-a", "lost-b", "stale", "warn", "unknown", "ok"]
    assert names(view.fleet(Query(), NOW)) == expected
    assert names(view.fleet(Query(descending=True), NOW)) == expected[::-1]


def test_cordoned_nodes_sort_first_worst_first(view: FleetView) -> None:
    for node, health in (("cordoned-ok", "OK"), ("cordoned-bad", "CRITICAL")):
        message = msg.state(node, health=health, when=NOW)
        message["status"]["remediation"] = {"cordoned_by_us": True}
        view.state.put(from_online_state(message, json.dumps(message), NOW))
    doc = view.fleet(Query(sort="cordoned"), NOW)
    assert names(doc)[:2] == ["cordoned-bad", "cordoned-ok"]
    assert names(doc)[2:] == ["a", "gone", "old", "b", "c"]
    assert [n["cordoned"] for n in doc["nodes"]] == [True, True] + [False] * 5


@pytest.mark.parametrize(
    ("text", "by"),
    [
        ("gpu-3f1c0a2e", ["UUID"]),
        ("1650923000123", ["serial"]),
        ("0000:1a:00.0", ["bus id"]),
        ("00000000:1A:00.0", ["bus id"]),
        ("1a:00.0", ["bus id"]),
    ],
)
def test_a_search_says_which_gpu_matched(view: FleetView, text: str, by: list[str]) -> None:
    doc = view.fleet(Query(text=text), NOW)
    assert [(n["name"], n["matched_gpus"]) for n in doc["nodes"]] == [
        ("c", [{"index": 2, "uuid": "GPU-3f1c0a2e-77d4", "pci_bus_id": "0000:1a:00.0", "by": by}])
    ]


def test_a_search_by_node_or_reason_names_no_gpu(view: FleetView) -> None:
    doc = view.fleet(Query(text="XID 48"), NOW)
    assert [(n["name"], n["matched_gpus"]) for n in doc["nodes"]] == [("b", [])]
    assert "matched_gpus" not in view.fleet(Query(), NOW)["nodes"][0]


def test_findings_date_from_their_first_report(view: FleetView) -> None:
    rows = {n["name"]: n for n in view.fleet(Query(), NOW)["nodes"]}
    assert rows["a"]["gpus"][0]["findings"][0]["since"] == NOW - 600
    assert rows["b"]["gpus"][0]["findings"][0]["since"] == NOW
    # A finding that clears and comes back starts again.
    put(view.state, "a", gpus=[msg.gpu_doc(0)], when=NOW + 10)
    put(view.state, "a", gpus=[msg.gpu_doc(0, "CRITICAL", [xid()])], when=NOW + 20)
    row = view.row(view.state.nodes[("c1", "a")], NOW + 20)
    assert row["gpus"][0]["findings"][0]["since"] == NOW + 20


def test_a_finding_keeps_its_onset_while_only_its_reasons_numbers_move(view: FleetView) -> None:
    def sbe(rate: int, cause: str | None = "gpu-ecc-sbe-rate") -> dict[str, Any]:
        finding = msg.finding("ecc", "WARN", f"{rate} corrected ECC errors per hour, above 100")
        if cause is not None:
            finding["cause"] = cause
        return finding

    for n, rate in enumerate((253, 260, 271)):
        put(view.state, "e", gpus=[msg.gpu_doc(0, "WARN", [sbe(rate)])], when=NOW + n)
    row = view.row(view.state.nodes[("c1", "e")], NOW + 2)
    assert row["gpus"][0]["findings"][0]["since"] == NOW
    # An agent from before `cause` is keyed on its reason, as it always was.
    for n, rate in enumerate((253, 260)):
        put(view.state, "f", gpus=[msg.gpu_doc(0, "WARN", [sbe(rate, None)])], when=NOW + n)
    row = view.row(view.state.nodes[("c1", "f")], NOW + 1)
    assert row["gpus"][0]["findings"][0]["since"] == NOW + 1


def test_kinds_count_online_nodes_per_finding_kind(view: FleetView) -> None:
    assert view.kinds(NOW) == [
        {"kind": "xid 48", "nodes": 1, "today": 1},
        {"kind": "xid 79", "nodes": 1, "today": 1},
    ]
    put(view.state, "d", gpus=[msg.gpu_doc(0, "CRITICAL", [xid(), xid(79)])])
    assert view.kinds(NOW)[0] == {"kind": "xid 79", "nodes": 2, "today": 2}  # most first
    # Two days on, every node is stale: none counted.
    assert view.kinds(NOW + 2 * 86400) == []
    # Where they still count as fresh (a, d and old): counted, but none started today.
    patient = FleetView(view.state, stale_after=10 * 86400)
    assert patient.kinds(NOW + 2 * 86400)[0] == {"kind": "xid 79", "nodes": 3, "today": 0}
    assert finding_kind({"check": "thermal", "evidence": {"thermal": True}}) == "thermal"
    assert finding_kind({}) == "unknown"


def test_choices_offer_every_cluster_model_and_driver(view: FleetView) -> None:
    assert view.choices() == {
        "clusters": ["c1", "c2"],
        "models": ["NVIDIA H100 80GB HBM3"],
        "drivers": ["535.1", "550.54"],
    }


def test_node_detail_dates_the_status_documents_findings(view: FleetView) -> None:
    doc = view.node(view.state.nodes[("c1", "a")], NOW)
    assert doc["shown_health"] == "CRITICAL"
    assert doc["status"]["gpus"][0]["findings"][0]["since"] == NOW - 600
    assert doc["status"]["gpus"][0]["uuid"] == "GPU-0"


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [({"health": "BAD"}, "health must be one of"), ({"sort": "x"}, "sort must be one of")],
)
def test_a_bad_query_is_refused(kwargs: dict[str, Any], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        Query(**kwargs)


@pytest.mark.parametrize(
    ("links", "problem"),
    [
        ({"grafana_url_template": "javascript:alert(1)"}, "grafana_url_template"),
        ({"runbook_base_url": "ftp://x/"}, "runbook_base_url must be an http"),
        ({"runbook_base_url": "https://x.example/docs"}, "must end with '/'"),
    ],
)
def test_links_must_be_http(links: dict[str, str], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        page.Links(**links)


def test_the_page_carries_its_links_safely() -> None:
    hostile = "https://grafana.example/d?x=</script><script>alert(1)</script>{node}"
    html = page.render(page.Links(grafana_url_template=hostile))
    assert html.count("</script>") == 1
    assert "\\u003c/script\\u003e" in html
    assert "<script>alert" not in html
    assert page.runbook_url("https://d.example/docs/", "gpu-lost") == (
        "https://d.example/docs/checks.md#gpu-lost"
    )
    assert page.runbook_url("", "gpu-lost") == ""


def test_the_page_says_what_each_action_means_as_the_docs_do() -> None:
    """A GPU's page says what clears each finding: the words of the Actions table of
    docs/checks.md, for every action a finding can name."""
    docs = (Path(__file__).resolve().parent.parent / "docs" / "checks.md").read_text()
    section = docs.split("\n## Actions\n", 1)[1].split("\n## ", 1)[0]
    table = dict(re.findall(r"^\| `([a-z_]+)` \| (.+) \|$", section, re.MULTILINE))
    meanings = page.action_meanings()
    assert meanings == table
    assert set(meanings) == {a.value for a in Action}
    shown = json.dumps(meanings["reset_gpu"]).replace("<", "\\u003c").replace(">", "\\u003e")
    assert shown in page.render()


async def test_the_fleet_endpoint(tmp_path: Path) -> None:
    port = free_port()
    agg = Aggregator(msg.config(tmp_path, port=port))
    await agg.start()
    base = f"http://127.0.0.1:{port}/api/v1/"
    try:
        put(agg.state, "a", health="WARN", when=agg.api.clock())
        async with aiohttp.ClientSession() as session:
            async with session.get(base + "fleet?health=WARN&sort=name&order=desc") as r:
                assert r.status == 200
                doc = await r.json()
            assert names(doc) == ["a"]
            for bad in ("sort=x", "health=bad", "limit=0"):
                async with session.get(base + "fleet?" + bad) as r:
                    assert r.status == 400, bad
            async with session.get(base + "fleet/a") as r:
                assert (await r.json())["shown_health"] == "WARN"
            async with session.get(base + "fleet/nope") as r:
                assert r.status == 404
    finally:
        await agg.close()
    assert agg.state.counters.bad_requests["fleet"] == 3


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ('grafana_url_template = "javascript:alert(1)"', "must be an absolute http(s) URL"),
        ('runbook_base_url = "gpuagent.example/docs/"', "must be an absolute http(s) URL"),
        ('runbook_base_url = "https://gpuagent.example/docs"', 'must end with "/"'),
    ],
)
def test_the_configuration_refuses_links_the_page_could_not_use(
    tmp_path: Path, line: str, problem: str
) -> None:
    path = tmp_path / "aggregator.toml"
    path.write_text(f"[aggregator]\n{line}\n")
    with pytest.raises(ConfigError, match=re.escape(problem)):
        load_config(path)


def test_the_configuration_takes_links(tmp_path: Path) -> None:
    path = tmp_path / "aggregator.toml"
    path.write_text(
        '[aggregator]\ngrafana_url_template = "https://g.example/d?n={node}"\n'
        'runbook_base_url = "https://gpuagent.example/docs/"\n'
    )
    section = load_config(path).aggregator
    assert section.grafana_url_template == "https://g.example/d?n={node}"
    assert section.runbook_base_url == "https://gpuagent.example/docs/"


def test_a_node_its_agent_cordoned_says_so_in_the_table() -> None:
    from gpuagent.aggregator.records import from_summary, summary_json  # noqa: PLC0415

    state = FleetState()
    message = msg.state("cordoned-node", health="CRITICAL", when=NOW)
    message["status"]["remediation"] = {"mode": "enforce", "cordoned_by_us": True}
    record = from_online_state(message, json.dumps(message), NOW)
    state.put(record)
    put(state, "free-node")
    rows = {n["name"]: n["cordoned"] for n in FleetView(state, STALE).fleet(Query(), NOW)["nodes"]}
    assert rows == {"cordoned-node": True, "free-node": False}
    # Kept through the shared database's summary, and while the node is offline.
    assert from_summary(record, summary_json(record)).cordoned is True  # type: ignore[union-attr]
    assert with_offline(msg.offline("cordoned-node"), record, NOW + 1).cordoned is True
