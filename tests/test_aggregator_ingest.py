"""Messages in: state, offline, events, duplicates, rejections, cordon requests, replies."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import aggregator_support as msg
from gpuagent.aggregator.budget import CordonBudget
from gpuagent.aggregator.ingest import Ingest
from gpuagent.aggregator.state import FleetState
from gpuagent.aggregator.store import FleetStore
from gpuagent.config import CordonBudgetSection
from gpuagent.fleet import schema


class Rig:
    def __init__(self, tmp_path: Path) -> None:
        self.clock = msg.FakeClock()
        self.state = FleetState()
        self.store = FleetStore(tmp_path / "fleet.sqlite", retention_seconds=3600, max_events=100)
        self.budget = CordonBudget(CordonBudgetSection(2, 100.0, 600.0))
        self.ingest = Ingest(
            self.state, self.store, self.budget, msg.PREFIX, stale_after=120, clock=self.clock
        )

    def send(
        self, channel: str, message: dict, *, topic_node: str | None = None, cluster: str = "c1"
    ):
        node = topic_node or message["node"]
        return self.ingest.handle(msg.topic(node, channel, cluster), schema.encode(message))


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    r = Rig(tmp_path)
    await r.store.open()
    yield r
    await r.store.close()


async def test_state_builds_the_node_record(rig: Rig) -> None:
    bad = msg.gpu_doc(1, "CRITICAL", [msg.finding("xid", "CRITICAL", "XID 79: fallen off the bus")])
    rig.send("state", msg.state("n1", health="CRITICAL", gpus=[msg.gpu_doc(0), bad], version="9.9"))
    record = rig.state.nodes[("c1", "n1")]
    assert (record.online, record.health, record.agent_version) == (True, "CRITICAL", "9.9")
    assert [g.health for g in record.gpus] == ["OK", "CRITICAL"]
    assert record.gpus[1].findings[0]["reason"] == "XID 79: fallen off the bus"
    assert record.fingerprint_id == "unknown"
    await rig.store.flush()
    assert await rig.store.count("nodes") == 1


async def test_last_will_marks_the_node_offline_and_keeps_what_it_reported(rig: Rig) -> None:
    rig.send("state", msg.state("n1", health="WARN"))
    rig.send("state", msg.offline("n1"))
    record = rig.state.nodes[("c1", "n1")]
    assert (record.online, record.reason, record.health) == (False, "connection lost", "WARN")
    # The offline id repeats each time; the node comes back and goes away again.
    rig.clock.now += 10
    rig.send("state", msg.state("n1", when=rig.clock.now))
    assert rig.state.nodes[("c1", "n1")].online
    rig.send("state", msg.offline("n1", "shutdown"))
    assert rig.state.nodes[("c1", "n1")].reason == "shutdown"


async def test_an_older_report_does_not_roll_a_node_back(rig: Rig) -> None:
    now = rig.clock.now
    rig.send("state", msg.state("n1", health="CRITICAL", when=now))
    rig.send("state", msg.state("n1", health="OK", when=now - 30))
    assert rig.state.nodes[("c1", "n1")].health == "CRITICAL"
    rig.send("state", msg.offline("n1"))
    rig.send("state", msg.state("n1", when=now))  # a late copy of the last report
    assert not rig.state.nodes[("c1", "n1")].online


async def test_a_node_clock_running_ahead_still_goes_stale(rig: Rig) -> None:
    rig.send("state", msg.state("n1", when=rig.clock.now + 3600))
    record = rig.state.nodes[("c1", "n1")]
    assert record.last_seen == rig.clock.now
    assert record.is_stale(rig.clock.now + 121, 120)


async def test_duplicates_are_stored_and_counted_once(rig: Rig) -> None:
    event = msg.event("n1", "n1:boot1:42")
    for _ in range(3):
        rig.send("events", event)
    rig.send("events", msg.event("n1"))
    assert rig.state.counters.events["kernel"] == 2
    assert rig.state.counters.duplicates["event"] == 2
    await rig.store.flush()
    assert await rig.store.count("events") == 2
    stored = await rig.store.events(node="n1", since=None, limit=10)
    assert {e["id"] for e in stored} >= {"n1:boot1:42"}


async def test_a_duplicate_older_than_the_memory_window_is_still_stored_once(rig: Rig) -> None:
    rig.state.seen = type(rig.state.seen)(capacity=2)
    first = msg.event("n1", "n1:old")
    rig.send("events", first)
    for _ in range(3):
        rig.send("events", msg.event("n1"))
    rig.send("events", first)
    await rig.store.flush()
    assert await rig.store.count("events") == 4


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"{not json", "malformed"),
        (b"[1, 2]", "malformed"),
        (b"x" * (schema.MAX_PAYLOAD_BYTES + 1), "oversized"),
        (json.dumps({"schema": 2, "type": "state"}).encode(), "schema"),
        (json.dumps({"schema": 1, "type": "selfie"}).encode(), "unknown_type"),
        (json.dumps({"schema": 1, "type": "state", "id": "x"}).encode(), "invalid"),
        (b"\xff\xfe\x00garbage", "malformed"),
    ],
)
async def test_bad_payloads_are_counted_by_reason(rig: Rig, payload: bytes, reason: str) -> None:
    assert rig.ingest.handle(msg.topic("n1", "events"), payload) == []
    assert rig.state.counters.rejected == {reason: 1}
    assert rig.state.counters.received == {}


async def test_foreign_and_misplaced_messages_are_rejected(rig: Rig) -> None:
    rig.send("state", msg.state("n2"), topic_node="n1")  # n1 speaking for n2
    rig.send("state", msg.state("n1", cluster="c2"), topic_node="n1")  # wrong cluster
    rig.send("events", msg.state("n1"))  # a state report on the events channel
    rig.ingest.handle("gpuagent/v1/c1/n1/extra/state", schema.encode(msg.state("n1")))
    assert rig.state.counters.rejected == {"foreign": 2, "invalid": 2}
    assert rig.state.nodes == {}


async def test_rejections_are_logged_once_per_reason(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="gpuagent.aggregator.ingest"):
        for _ in range(5):
            rig.ingest.handle(msg.topic("n1", "events"), b"{")
        rig.ingest.handle(msg.topic("n1", "events"), b"x" * (schema.MAX_PAYLOAD_BYTES + 1))
    assert len(caplog.records) == 2
    assert rig.state.counters.rejected == {"malformed": 5, "oversized": 1}


async def test_a_state_document_of_the_wrong_shape_gives_unknown_not_an_error(rig: Rig) -> None:
    message = msg.state("n1")
    message["status"] = {"node": "nope", "gpus": [1, "x", {"findings": 7}]}
    rig.send("state", message)
    record = rig.state.nodes[("c1", "n1")]
    assert record.health == "UNKNOWN"
    assert [g.findings for g in record.gpus] == [()]


async def test_cordon_requests_are_decided_stored_and_answered(rig: Rig) -> None:
    for i in range(5):
        rig.send("state", msg.state(f"n{i}"))
    answers = [rig.send("actions", msg.cordon_request(f"n{i}")) for i in range(5)]
    decisions = [json.loads(a[0].payload) for a in answers]
    assert [a[0].topic for a in answers] == [msg.topic(f"n{i}", "cmd") for i in range(5)]
    assert [d["decision"] for d in decisions] == ["approved"] * 2 + ["denied"] * 3
    assert all(schema.decode(a[0].payload)["type"] == "cordon_decision" for a in answers)
    assert decisions[3]["retry_after_seconds"] == pytest.approx(600.0)
    assert rig.state.counters.decisions == {("c1", "approved"): 2, ("c1", "denied"): 3}
    await rig.store.flush()
    rows = await rig.store.cordons()
    assert sorted(r.decision for r in rows) == ["approved"] * 2 + ["denied"] * 3


async def test_a_resent_cordon_request_gets_the_same_answer(rig: Rig) -> None:
    request = msg.cordon_request("n1")
    first = rig.send("actions", request)
    second = rig.send("actions", request)
    assert first == second
    assert rig.state.counters.decisions == {("c1", "approved"): 1}


async def test_replies_are_kept_per_node(rig: Rig) -> None:
    rig.send("state", msg.state("n1"))
    for i in range(12):
        rig.send("replies", msg.reply("n1", f"cmd{i}"))
    replies = rig.state.replies[("c1", "n1")]
    assert [r["command_id"] for r in replies][-1] == "cmd11"
    assert len(replies) == 10
    await rig.store.flush()
    assert await rig.store.count("replies") == 12


@pytest.mark.parametrize(
    "when",
    ["NaN", "Infinity", "-Infinity", "1e999", "1" + "0" * 400],
    ids=["nan", "inf", "-inf", "1e999", "10**400"],
)
@pytest.mark.parametrize("channel", ["state", "events"])
async def test_a_time_that_is_no_finite_number_is_rejected_not_raised(
    rig: Rig, channel: str, when: str
) -> None:
    message = msg.state("n1") if channel == "state" else msg.event("n1")
    # Python's JSON reads all of these: NaN, infinities, and integers of any length.
    payload = schema.encode(message).replace(
        f'"time":{message["time"]!r}'.encode(), f'"time":{when}'.encode()
    )
    assert f'"time":{when}'.encode() in payload
    assert rig.ingest.handle(msg.topic("n1", channel), payload) == []
    assert sum(rig.state.counters.rejected.values()) == 1
    assert rig.state.counters.received == {}
    assert rig.state.nodes == {}
    assert rig.store.pending() == 0


async def test_a_row_the_database_refuses_costs_only_itself(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    # n5's ids hold lone surrogates: valid JSON, valid Python text, but no UTF-8 exists
    # for them, so SQLite cannot store the row. They share a batch with n6's rows.
    rig.send("events", msg.event("n5", "n5:\udc80:1"))
    rig.send("state", msg.state("n6", health="WARN"))
    rig.send("events", msg.event("n6", "n6:boot:1"))
    action = schema.envelope("action", "n6:audit:1", "n6", "c1")
    action["record"] = {"action": "cordon"}
    rig.send("actions", action)
    rig.send("actions", msg.cordon_request("n6"))
    rig.send("events", msg.event("n5", "n5:\udc80:2"))
    with caplog.at_level(logging.ERROR, logger="gpuagent.aggregator.store"):
        await rig.store.flush()
    assert [e["id"] for e in await rig.store.events(node=None, since=None, limit=10)] == [
        "n6:boot:1"
    ]
    assert [a["id"] for a in await rig.store.actions(node="n6", limit=10)] == ["n6:audit:1"]
    assert [r.node for r in await rig.store.cordons()] == ["n6"]
    assert [(r.node, r.health) for r in await rig.store.load_nodes()] == [("n6", "WARN")]
    assert (rig.store.write_errors, rig.store.rows_dropped) == (1, {"events": 2})
    (logged,) = caplog.records  # once per reason, not once per row
    assert "UnicodeEncodeError" in logged.getMessage()
    # A later batch of good rows goes in whole.
    rig.send("events", msg.event("n6", "n6:boot:2"))
    await rig.store.flush()
    assert await rig.store.count("events") == 2
    assert rig.store.write_errors == 1


@pytest.mark.parametrize("window", [200_000, 0], ids=["memory window", "database only"])
async def test_a_node_cannot_pass_its_message_off_as_anothers(rig: Rig, window: int) -> None:
    """Ids are the nodes' own, and audit ids are predictable: de-duplication is per node
    (and cluster), in memory and in the database alike."""
    rig.state.seen = type(rig.state.seen)(capacity=window)
    forged = schema.envelope("action", "n6:audit:1", "n5", "c1")
    forged["record"] = {"action": "forged"}
    rig.send("actions", forged)
    real = schema.envelope("action", "n6:audit:1", "n6", "c1")
    real["record"] = {"action": "cordon"}
    rig.send("actions", real)
    rig.send("actions", real)  # a real duplicate is still stored once
    # The same node name in two clusters, and the same (kernel-log) event id.
    for cluster in ("a", "b"):
        rig.send("events", msg.event("n1", "n1:kmsg:boot:1", cluster=cluster), cluster=cluster)
    await rig.store.flush()
    assert [a["record"]["action"] for a in await rig.store.actions(node="n6", limit=10)] == [
        "cordon"
    ]
    assert await rig.store.count("actions") == 2
    stored = await rig.store.events(node="n1", since=None, limit=10)
    assert sorted(e["cluster"] for e in stored) == ["a", "b"]
    if window:
        assert rig.state.counters.duplicates == {"action": 1}


async def test_a_node_cannot_take_over_anothers_cordon_request(rig: Rig) -> None:
    real = msg.cordon_request("n6")
    forged = {**real, "node": "n5"}
    (to_n5,) = rig.send("actions", forged)
    (to_n6,) = rig.send("actions", real)
    answer = schema.decode(to_n6.payload)
    assert (to_n6.topic, answer["node"], answer["request_id"]) == (
        msg.topic("n6", "cmd"),
        "n6",
        real["id"],
    )
    assert to_n5.topic == msg.topic("n5", "cmd")
    await rig.store.flush()
    rows = await rig.store.cordons()
    assert sorted((r.node, r.request_id) for r in rows) == [("n5", real["id"]), ("n6", real["id"])]


async def test_an_aggregator_that_is_not_the_arbiter_decides_no_cordon(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    rig.budget.config = CordonBudgetSection(2, 100.0, 600.0, arbiter=False)
    rig.send("state", msg.state("n1"))
    with caplog.at_level(logging.WARNING, logger="gpuagent.aggregator.ingest"):
        for node in ("n1", "n2"):
            assert rig.send("actions", msg.cordon_request(node)) == []
    assert rig.state.counters.decisions == {}
    assert rig.budget.remaining("c1", 2, rig.clock.now) == 2
    await rig.store.flush()
    assert await rig.store.count("cordons") == 0
    (logged,) = caplog.records
    assert "not the cordon arbiter" in logged.getMessage()
