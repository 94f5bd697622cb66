"""Each node's history in the aggregator: health transitions and trend samples from its
state reports, bounded per node, stored with the fleet, pruned, and served by the API."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import aggregator_support as msg
from gpuagent.aggregator.history import TRANSITIONS_PER_HOUR, HistoryRecorder
from gpuagent.aggregator.records import from_online_state, with_offline
from gpuagent.fleet import schema
from test_aggregator_http import Rig, running

NOW = 1_795_000_000.0


def _report(node: str, when: float, gpus: list[dict[str, Any]], health: str = "OK") -> Any:
    message = msg.state(node, health=health, gpus=gpus, when=when)
    return message, from_online_state(message, json.dumps(message), when)


def _gpu(index: int, health: str = "OK", **values: Any) -> dict[str, Any]:
    doc = msg.gpu_doc(
        index, health, [msg.finding("ecc", health, "2 DBEs")] if health != "OK" else []
    )
    return {**doc, "temperature_c": 40.0 + index, "power_w": 100.0, **values}


def _bodies(rows: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
    return [json.loads(row[5]) for row in rows]


def test_transitions_and_samples_from_reports() -> None:
    recorder = HistoryRecorder(interval=300.0)
    message, first = _report("n1", NOW, [_gpu(0), _gpu(1)])
    rows = _bodies(recorder.rows(None, first, message["status"]))
    # The node's first health, and a sample of each GPU; healthy GPUs start quietly.
    assert [(r["kind"], r.get("gpu"), r["health"]) for r in rows] == [
        ("transition", None, "OK"),
        ("sample", None, "OK"),
    ]
    assert rows[1]["gpus"] == {
        "index": [0, 1],
        "health": ["OK", "OK"],
        "temperature_c": [40.0, 41.0],
        "power_w": [100.0, 100.0],
        "utilization_gpu_pct": [None, None],
        "ecc_dbe_volatile": [None, None],
        "xid_events": [0, 0],
    }
    # Ten seconds on, nothing changed: nothing written.
    message, same = _report("n1", NOW + 10, [_gpu(0), _gpu(1)])
    assert recorder.rows(first, same, message["status"]) == []
    # GPU 1 fails: the node and the GPU change, with the reason; no sample before 300 s.
    xid = {
        "check": "xid",
        "severity": "CRITICAL",
        "reason": "Xid 79",
        "evidence": {"xid_events": 3},
    }
    failing = {**_gpu(1, "CRITICAL"), "findings": [xid]}
    message, bad = _report("n1", NOW + 20, [_gpu(0), failing], "CRITICAL")
    rows = _bodies(recorder.rows(same, bad, message["status"]))
    assert [(r["kind"], r["gpu"], r["previous"], r["health"]) for r in rows] == [
        ("transition", None, "OK", "CRITICAL"),
        ("transition", 1, "OK", "CRITICAL"),
    ]
    assert rows[1]["reason"] == "Xid 79"
    message, later = _report("n1", NOW + 300, [_gpu(0), failing], "CRITICAL")
    (sample,) = _bodies(recorder.rows(bad, later, message["status"]))
    assert sample["kind"] == "sample"
    assert sample["gpus"]["xid_events"] == [0, 3]
    # Offline: a transition to OFFLINE, from what it last said.
    gone = with_offline(msg.offline("n1"), later, NOW + 400)
    (offline,) = _bodies(recorder.offline(later, gone))
    assert (offline["health"], offline["previous"]) == ("OFFLINE", "CRITICAL")


def test_a_flapping_node_writes_a_bounded_number_of_rows() -> None:
    recorder = HistoryRecorder(interval=300.0)
    previous = None
    written = 0
    for second in range(3600):  # a report a second for an hour, health flapping each time
        health = "CRITICAL" if second % 2 else "OK"
        message, record = _report("n1", NOW + second, [_gpu(0, health)], health)
        written += len(recorder.rows(previous, record, message["status"]))
        previous = record
    # One sample per 300 s, and the transitions capped per hour.
    assert written <= TRANSITIONS_PER_HOUR + 3600 // 300
    assert written >= TRANSITIONS_PER_HOUR


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    async with running(tmp_path, history_interval_seconds=60.0) as started:
        yield started


async def test_the_api_serves_a_nodes_history_and_pruning_keeps_its_window(rig: Rig) -> None:
    now = rig.agg.ingest.clock()
    rig.send("state", msg.state("n1", gpus=[_gpu(0)], when=now - 120))
    rig.send("state", msg.state("n1", health="CRITICAL", gpus=[_gpu(0, "CRITICAL")], when=now))
    await rig.agg.store.flush()
    status, doc = await rig.get("/api/v1/history/n1")
    assert status == 200, doc
    assert (doc["node"], doc["cluster"]) == ("n1", "c1")
    assert [(t["gpu"], t["health"]) for t in doc["transitions"]] == [
        (None, "OK"), (None, "CRITICAL"), (0, "CRITICAL")
    ]  # fmt: skip
    assert [s["gpus"]["health"] for s in doc["samples"]] == [["OK"], ["CRITICAL"]]
    assert doc["samples"][0]["gpus"]["temperature_c"] == [40.0]
    # Since a time: only what came after it.
    _, recent = await rig.get(f"/api/v1/history/n1?since={now - 60}")
    assert [s["time"] for s in recent["samples"]] == [now]
    assert (await rig.get("/api/v1/history/nobody"))[0] == 404
    assert (await rig.get("/api/v1/history/n1?since=soon"))[0] == 400
    # Pruned by its own retention (a week by default): now + 8 days leaves nothing.
    await rig.agg.store.prune(now + 8 * 86400)
    _, pruned = await rig.get(f"/api/v1/history/n1?since={now - 3600}")
    assert (pruned["transitions"], pruned["samples"]) == ([], [])
    assert await rig.agg.store.count("history") == 0


def test_history_rows_are_what_the_store_inserts() -> None:
    from gpuagent.aggregator import store  # noqa: PLC0415

    message, record = _report("n1", NOW, [_gpu(0)])
    (row, *_) = HistoryRecorder(60.0).rows(None, record, message["status"])
    assert store._INSERT["history"].count("?") == len(row)
    assert schema.dumps(json.loads(row[5]))
