"""The consumer's promises, checked without a broker: a message is acknowledged only once
its rows are committed, and a cordon decision is sent only once its row is."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import AsyncIterator
from contextlib import closing
from pathlib import Path
from typing import Any

import aiomqtt
import pytest

import aggregator_support as msg
from conftest import free_port
from fleet_support import until
from gpuagent.aggregator.service import Aggregator
from gpuagent.fleet import schema


def committed(database: Path, table: str) -> int:
    """Rows of ``table`` another connection sees: only what was committed."""
    with closing(sqlite3.connect(database)) as db:
        (count,) = db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()
    return int(count)


class Session:
    """Stands in for the paho client of one MQTT session: records acknowledgements, with
    what the database held when each was made."""

    def __init__(self, database: Path) -> None:
        self.database = database
        self.acks: list[tuple[int, int, int, int]] = []
        # Acknowledgements to nodes (QoS 0, through paho), with the events committed then.
        self.published: list[tuple[str, dict[str, Any], int]] = []

    def publish(self, topic: str, payload: bytes, qos: int) -> None:
        assert qos == 0
        self.published.append((topic, schema.decode(payload), committed(self.database, "events")))

    def ack(self, mid: int, qos: int) -> None:
        self.acks.append(
            (mid, qos, committed(self.database, "events"), committed(self.database, "nodes"))
        )


class Client:
    """Stands in for the aiomqtt client: records publishes, with the cordon rows committed
    when each was made."""

    def __init__(self, database: Path) -> None:
        self.database = database
        self.published: list[tuple[str, dict[str, Any], int]] = []

    async def publish(self, topic: str, payload: bytes, qos: int, **_: Any) -> None:
        self.published.append((topic, schema.decode(payload), committed(self.database, "cordons")))


class Rig:
    def __init__(self, tmp_path: Path) -> None:
        self.agg = Aggregator(msg.config(tmp_path, port=free_port()))
        self.database = self.agg.config.database
        self.session = Session(self.database)
        self.client = Client(self.database)
        self.mids = iter(range(1, 1000))

    def attach(self, session: Session) -> None:
        # As a connected session would be; the consumer's own loop is not started.
        self.agg.consumer._paho = session  # type: ignore[assignment]
        self.agg.consumer._client = self.client  # type: ignore[assignment]

    def deliver(self, channel: str, message: dict[str, Any] | bytes, qos: int = 1) -> int:
        mid = next(self.mids)
        payload = message if isinstance(message, bytes) else schema.encode(message)
        node = "n1" if isinstance(message, bytes) else message["node"]
        topic = msg.topic(node, channel)
        self.agg.consumer._deliver(
            aiomqtt.Message(topic, payload, qos=qos, retain=False, mid=mid, properties=None)
        )
        return mid


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    r = Rig(tmp_path)
    await r.agg.store.open()
    r.attach(r.session)
    yield r
    await r.agg.store.close()


async def test_a_message_is_acknowledged_only_once_its_rows_are_committed(rig: Rig) -> None:
    mids = [rig.deliver("events", msg.event("n1")) for _ in range(3)]
    mids.append(rig.deliver("state", msg.state("n1")))
    mids.append(rig.deliver("events", b"{garbage"))  # rejected: acknowledged all the same
    rig.deliver("events", msg.event("n1"), qos=0)  # nothing to acknowledge at QoS 0
    assert rig.session.acks == []
    # Four events, the node, and the node's first history (its health, a sample).
    assert rig.agg.store.pending() == 7
    await rig.agg.store.flush()
    # In the order received (MQTT wants PUBACKs in that order), each once all 4 events and
    # the node were committed.
    assert rig.session.acks == [(mid, 1, 4, 1) for mid in mids]


async def test_a_cordon_decision_is_sent_only_once_its_row_is_committed(rig: Rig) -> None:
    rig.deliver("state", msg.state("n1"))
    request = msg.cordon_request("n1")
    rig.deliver("actions", request)
    await asyncio.sleep(0.05)
    assert rig.client.published == []  # decided, but not written yet: not sent
    await rig.agg.store.flush()
    await until(lambda: len(rig.client.published) == 1)
    ((topic, decision, rows_then),) = rig.client.published
    assert (topic, decision["request_id"], decision["decision"]) == (
        msg.topic("n1", "cmd"),
        request["id"],
        "approved",
    )
    assert rows_then == 1
    # A re-sent request gets the same decision, also only after a commit.
    rig.deliver("actions", request)
    await rig.agg.store.flush()
    await until(lambda: len(rig.client.published) == 2)
    assert rig.client.published[1][1] == decision


async def test_a_decision_whose_row_the_database_refuses_is_not_sent(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    request = msg.cordon_request("n1")
    request["id"] = "n1:\udc80"  # no UTF-8 for it: SQLite cannot store the row
    with caplog.at_level(logging.ERROR):
        first = rig.deliver("actions", request)
        await rig.agg.store.flush()
        second = rig.deliver("actions", request)  # a re-sent copy
        await rig.agg.store.flush()
        await asyncio.sleep(0.05)
    assert rig.client.published == []
    assert [ack[0] for ack in rig.session.acks] == [first, second]
    assert committed(rig.database, "cordons") == 0
    assert "not sending to gpuagent/v1/c1/n1/cmd" in caplog.text


async def test_a_message_of_an_earlier_session_is_not_acknowledged_on_a_later_one(
    rig: Rig,
) -> None:
    rig.deliver("events", msg.event("n1"))
    later = Session(rig.database)
    rig.attach(later)  # reconnected before the commit: the broker sends it again
    await rig.agg.store.flush()
    assert (rig.session.acks, later.acks) == ([], [])
    mid = rig.deliver("events", msg.event("n1"))
    await rig.agg.store.flush()
    assert [ack[0] for ack in later.acks] == [mid]


async def test_nodes_hear_which_of_their_messages_are_stored_once_committed(rig: Rig) -> None:
    """End to end: a node's spool drops a message only when the aggregator says it stored
    it; one acknowledgement per node per commit, duplicates acknowledged again (the node
    missed the first), state reports and rejected messages never."""
    events = [msg.event("n1") for _ in range(3)]
    for event in events:
        rig.deliver("events", event)
    other = msg.event("n2")
    rig.deliver("events", other)
    rig.deliver("replies", msg.reply("n1", "cmd-7"))
    rig.deliver("state", msg.state("n1"))
    rig.deliver("events", b"{garbage")
    await asyncio.sleep(0.05)
    assert rig.session.published == []  # not committed yet: nothing acknowledged
    await rig.agg.store.flush()
    await until(lambda: len(rig.session.published) == 2)
    assert all(events_then == 4 for _, _, events_then in rig.session.published)
    acks = {topic: message for topic, message, _ in rig.session.published}
    assert acks[msg.topic("n1", "cmd")]["type"] == "ack"
    assert acks[msg.topic("n1", "cmd")]["ids"] == [
        *(e["id"] for e in events),
        "n1:reply:cmd-7",
    ]
    assert acks[msg.topic("n2", "cmd")]["ids"] == [other["id"]]
    assert rig.agg.state.counters.acknowledged == 5
    # The node sends one again (it missed our acknowledgement): acknowledged again.
    rig.deliver("events", events[0])
    await rig.agg.store.flush()
    await until(lambda: len(rig.session.published) == 3)
    assert rig.session.published[2][1]["ids"] == [events[0]["id"]]
