"""The reporter's logic without a broker: finding transitions, the spool when the disk is
full, command handling, and the aggregator cordon backend."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from pathlib import Path
from typing import Any, Self

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.reasoncodes import ReasonCode

from conftest import PATIENCE
from fleet_support import until
from gpuagent.acks import AckError
from gpuagent.config import MqttConnection, MqttOutput
from gpuagent.fleet import reporter as reporter_module
from gpuagent.fleet import schema
from gpuagent.fleet.commands import CommandRefusedError
from gpuagent.fleet.reporter import Reporter
from gpuagent.fleet.spool import Spool
from gpuagent.model import Finding, GpuEvent, NodeHealth, NodeSnapshot, NvmlStatus, Severity
from gpuagent.remediation.aggregator import AggregatorBackend
from gpuagent.remediation.types import CordonRequest

BUS = "0000:3b:00.0"


class Target:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def refresh(self) -> None:
        self.calls.append("refresh")

    async def run_checks(self) -> str:
        if "slow" in self.calls:
            raise TimeoutError  # checks that did not finish in time
        return "8 GPUs, health OK, 0 problems"

    def set_remediation_mode(self, mode: str) -> str:
        if mode not in ("observe", "enforce"):
            raise ValueError(f"bad mode {mode!r}")
        self.calls.append(f"mode {mode}")
        return f"mode {mode}"

    async def reset_gpu(self, bus_id: str) -> str:
        if bus_id != BUS:
            raise CommandRefusedError(f"no GPU {bus_id}")
        self.calls.append(f"reset {bus_id}")
        return "succeeded"

    async def acknowledge(self, bus_id: str, check: str | None, reason: str, by: str) -> str:
        if bus_id != BUS:
            raise AckError(f"GPU {bus_id} has no finding that is not OK to acknowledge")
        self.calls.append(f"ack {bus_id} {check} {reason!r} by {by}")
        return f"acknowledged {check}"


def _reporter(tmp_path: Path, **config: Any) -> Reporter:
    reporter = Reporter(
        MqttOutput(enabled=True, **config),
        node="n1",
        cluster="c1",
        agent_version="1.0",
        state_dir=tmp_path,
    )
    reporter.target = Target()
    return reporter


def _snapshot(sequence: int, *findings: Finding) -> NodeSnapshot:
    return NodeSnapshot(
        node_name="n1",
        cluster="c1",
        hostname="h",
        sequence=sequence,
        taken_at=1000.0 + sequence,
        nvml=NvmlStatus(ok=True),
        health=NodeHealth(findings),
    )


async def _spooled(reporter: Reporter) -> list[dict[str, Any]]:
    """What the spool holds, once what memory holds went there."""
    assert await reporter.outbox.open()
    await reporter.outbox.flush()
    return [json.loads(m.payload) for m in await reporter.outbox.spool.head(1000)]


async def _settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


async def test_finding_changes_become_events_and_clears_too(tmp_path: Path) -> None:
    reporter = _reporter(tmp_path)
    ok = Finding("ecc", Severity.OK, "no errors", gpu=BUS)
    dbe = Finding("ecc", Severity.CRITICAL, "1 DBE", gpu=BUS, runbook="gpu-ecc-dbe")
    node = Finding("sxid", Severity.WARN, "SXid 12028", runbook="node-sxid")
    reporter.offer_snapshot(_snapshot(1, ok))
    reporter.offer_snapshot(_snapshot(2, ok))  # nothing changed: nothing sent
    reporter.offer_snapshot(_snapshot(3, dbe, node))
    reporter.offer_snapshot(_snapshot(4, dbe))  # the node finding is gone
    await _settle()
    changes = [
        (m["data"]["gpu"], m["data"]["check"], m["data"]["from"], m["data"]["to"])
        for m in await _spooled(reporter)
    ]
    assert changes == [
        (BUS, "ecc", "OK", "CRITICAL"),
        (None, "sxid", "OK", "WARN"),
        (None, "sxid", "WARN", "OK"),
    ]
    first = (await _spooled(reporter))[0]
    assert first["data"]["runbook"] == "gpu-ecc-dbe"
    assert schema.decode(json.dumps(first)) == first


async def test_a_lost_gpu_is_one_finding_change_not_one_per_check(tmp_path: Path) -> None:
    reporter = _reporter(tmp_path)
    thermal = Finding("thermal", Severity.WARN, "84 C", gpu=BUS, runbook="gpu-thermal-slowdown")
    ecc = Finding("ecc", Severity.OK, "no errors", gpu=BUS)
    lost = Finding("availability", Severity.CRITICAL, "lost", gpu=BUS, runbook="gpu-lost")
    masked = [
        Finding(check, Severity.UNKNOWN, "no data: GPU lost", gpu=BUS, masked=True)
        for check in ("thermal", "ecc")
    ]
    reporter.offer_snapshot(_snapshot(1, thermal, ecc))
    reporter.offer_snapshot(_snapshot(2, lost, *masked))
    reporter.offer_snapshot(_snapshot(3, lost, *masked))
    # Back: the thermal WARN it had before it was lost has gone meanwhile.
    reporter.offer_snapshot(_snapshot(4, ecc, Finding("thermal", Severity.OK, "ok", gpu=BUS)))
    await _settle()
    changes = [
        (m["data"]["check"], m["data"]["from"], m["data"]["to"]) for m in await _spooled(reporter)
    ]
    assert changes == [
        ("thermal", "OK", "WARN"),
        ("availability", "OK", "CRITICAL"),
        ("thermal", "WARN", "OK"),
        ("availability", "CRITICAL", "OK"),
    ]


def _read_only(reporter: Reporter, tmp_path: Path) -> sqlite3.Connection:
    """Make the open spool unwritable (as a full disk would); returns the writable one."""
    spool = reporter.outbox.spool._spool
    assert spool is not None
    writable = spool._db
    spool._db = sqlite3.connect(
        f"file:{tmp_path / 'mqtt-spool.sqlite'}?mode=ro",
        uri=True,
        isolation_level=None,
        check_same_thread=False,
    )
    return writable


async def test_a_full_disk_holds_messages_in_memory_until_it_can_write(tmp_path: Path) -> None:
    reporter = _reporter(tmp_path)
    assert await reporter.outbox.open()
    writable = _read_only(reporter, tmp_path)
    event = GpuEvent("kmsg:b:1", "kmsg", "xid", BUS, 1000.0, 5.0, code=79, line="Xid 79")
    reporter.offer_event(event)
    await reporter.outbox.flush()
    assert reporter.status().spool_depth == 1  # in memory
    assert "readonly" in reporter.status().spool_error
    assert await _spooled(reporter) == []
    reporter.outbox.spool._spool._db = writable  # type: ignore[union-attr]
    reporter.offer_event(GpuEvent("kmsg:b:2", "kmsg", "xid", BUS, 1001.0, 6.0, code=13))
    assert [m["id"] for m in await _spooled(reporter)] == ["n1:kmsg:b:1", "n1:kmsg:b:2"]
    assert reporter.status().spool_depth == 2
    assert reporter.status().spool_error == ""


async def test_a_full_disk_does_not_stop_delivery(tmp_path: Path) -> None:
    """While the spool cannot be written, what memory holds is published all the same, and
    leaves memory when the aggregator acknowledges it."""
    reporter = _reporter(tmp_path, ack_timeout_seconds=30.0)
    assert await reporter.outbox.open()
    _read_only(reporter, tmp_path)
    broker = _connect(reporter)
    for sequence in range(1, 501):
        reporter.offer_event(_kernel_event(sequence))
    drain = await _drained(reporter, broker, 500)
    assert len(broker.sent) == 500
    # Marked sent on the spool's disk thread, a moment after the broker had them.
    await until(lambda: reporter.status().awaiting_ack == 500, timeout=2.0)
    assert reporter.status().spool_depth == reporter.status().awaiting_ack == 500
    task = reporter.handle_command(_ack(*(m["id"] for _, m, _ in broker.sent)))
    assert task is not None
    await task
    drain.cancel()
    assert reporter.status().spool_depth == 0
    assert reporter.acknowledged == 500


async def test_a_spool_that_cannot_be_opened_is_tried_again(tmp_path: Path) -> None:
    """A read-only state directory at start: the reporter holds messages in memory, says
    why, and uses the spool once it can be opened."""
    (tmp_path / "mqtt-spool.sqlite").mkdir()  # not a database: it cannot be opened
    reporter = _reporter(tmp_path)
    reporter.outbox.retry_seconds = 0.0
    reporter.offer_event(_kernel_event(1))
    await reporter.outbox.flush()
    assert "cannot open the spool" in reporter.status().spool_error
    assert reporter.status().spool_depth == 1
    (tmp_path / "mqtt-spool.sqlite").rmdir()
    assert [m["id"] for m in await _spooled(reporter)] == ["n1:kmsg:b:1"]
    assert reporter.status().spool_error == ""


def _command(command: str, args: dict[str, Any] | None = None, **envelope: Any) -> bytes:
    message = schema.command_message(f"id-{command}", "n1", "c1", command, args)
    message.update(envelope)
    return schema.encode(message)


async def _handle(reporter: Reporter, *payloads: bytes) -> None:
    tasks = [t for t in map(reporter.handle_command, payloads) if t is not None]
    await asyncio.gather(*tasks)
    await _settle()


async def test_commands_allowlist_and_rejections(tmp_path: Path) -> None:
    reporter = _reporter(tmp_path, max_command_bytes=2048)
    target = reporter.target
    assert isinstance(target, Target)
    await _handle(
        reporter,
        b"[]",
        b"{" * 3000,
        b"[" * 1000 + b"]" * 1000,  # deep enough to exhaust the JSON reader's recursion
        b'{"schema": 1, "type": ["command"]}',
        _command("refresh", time=float("nan")),
        _command("refresh", node="n2"),
        _command("shell", {"cmd": "rm -rf /"}),
        _command("refresh"),
        _command("refresh"),  # the same id again: carried out once
        _command("set_remediation_mode", {"mode": "chaos"}),
        _command("reset_gpu", {"gpu": BUS}),
        _command("run_checks", id="stale", time=1.0),  # queued for a node long away
    )
    assert dict(reporter.rejected_commands) == {
        "malformed": 2,
        "oversized": 1,
        "unknown_type": 1,
        "invalid": 1,
        "foreign": 1,
        "not_allowed": 1,
        "expired": 1,
    }
    assert target.calls == ["refresh"]
    replies = {m["command_id"]: (m["ok"], m["detail"]) for m in await _spooled(reporter)}
    assert replies["id-refresh"] == (True, "refresh requested")
    assert replies["id-set_remediation_mode"] == (False, "bad mode 'chaos'")
    assert replies["id-reset_gpu"][0] is False
    assert "allow_remote_reset" in replies["id-reset_gpu"][1]


async def test_a_command_that_fails_still_gets_a_reply(tmp_path: Path) -> None:
    reporter = _reporter(tmp_path)
    target = reporter.target
    assert isinstance(target, Target)
    target.calls.append("slow")
    await _handle(reporter, _command("run_checks"))
    (reply,) = await _spooled(reporter)
    assert (reply["command_id"], reply["ok"]) == ("id-run_checks", False)
    assert "TimeoutError" in reply["detail"]


async def test_remote_reset_when_allowed_goes_to_the_node(tmp_path: Path) -> None:
    reporter = _reporter(tmp_path, allow_remote_reset=True)
    await _handle(
        reporter,
        _command("reset_gpu", {"gpu": BUS}),
        schema.encode(schema.command_message("x2", "n1", "c1", "reset_gpu", {"gpu": "nope"})),
    )
    replies = {m["command_id"]: (m["ok"], m["detail"]) for m in await _spooled(reporter)}
    assert replies == {"id-reset_gpu": (True, "succeeded"), "x2": (False, "no GPU nope")}


async def test_remote_ack_goes_to_the_node_with_who_asked(tmp_path: Path) -> None:
    reporter = _reporter(tmp_path)
    args = {"gpu": "00000000:3B:00.0", "check": "xid", "reason": "reseated", "by": "ana"}
    await _handle(
        reporter,
        _command("ack", args),
        schema.encode(
            schema.command_message("x2", "n1", "c1", "ack", {"gpu": "0000:5d:00.0", "reason": "r"})
        ),
        schema.encode(schema.command_message("x3", "n1", "c1", "ack", {"gpu": BUS})),
    )
    replies = {m["command_id"]: (m["ok"], m["detail"]) for m in await _spooled(reporter)}
    assert replies == {
        "id-ack": (True, "acknowledged xid"),
        "x2": (False, "GPU 0000:5d:00.0 has no finding that is not OK to acknowledge"),
        "x3": (False, "ack needs args.gpu (a PCI bus id) and args.reason"),
    }
    target = reporter.target
    assert isinstance(target, Target)
    assert target.calls == [f"ack {BUS} xid 'reseated' by ana (aggregator)"]


def _request() -> CordonRequest:
    return CordonRequest(node="n1", cluster="c1", reason="GPU: DBE", request_id="n1:1")


class Broker:
    """Stands in for the aiomqtt client: records publishes; can refuse with a reason code."""

    def __init__(self, reporter: Reporter, *refusals: int) -> None:
        self.reporter = reporter
        self.refusals = list(refusals)
        self.sent: list[tuple[str, dict[str, Any], Any]] = []

    async def publish(self, topic: str, payload: bytes, **options: Any) -> None:
        if self.refusals:
            code = self.refusals.pop(0)
            self.reporter._refused = ReasonCode(PacketTypes.PUBACK, identifier=code)
            return
        self.sent.append((topic, json.loads(payload), options["properties"]))


def _connect(reporter: Reporter, *refusals: int) -> Broker:
    broker = Broker(reporter, *refusals)
    reporter._client = broker  # type: ignore[assignment]
    return broker


async def test_aggregator_backend_follows_the_decision(tmp_path: Path) -> None:
    reporter = _reporter(tmp_path)
    broker = _connect(reporter)
    backend = AggregatorBackend(reporter.ask_aggregator, timeout=2.0)
    for decision, ok in (("denied", False), ("approved", True)):
        task = asyncio.create_task(backend.cordon(_request()))
        await _settle()
        topic, request, properties = broker.sent[-1]
        assert topic == "gpuagent/v1/c1/n1/actions"
        assert request["type"] == "cordon_request"
        assert request["action"] == "cordon"
        # Not spooled, and void once the wait is over: the broker drops it after 2 s.
        assert await _spooled(reporter) == []
        assert properties.MessageExpiryInterval == 2
        answer = schema.cordon_decision_message(
            "n1",
            "c1",
            request["id"],
            decision=decision,  # type: ignore[arg-type]
            reason="2 of 2 nodes cordoned in c1",
            retry_after_seconds=600.0,
        )
        answer["id"] += decision  # a new decision message each time
        reporter.handle_command(schema.encode(answer))
        result = await task
        assert result.ok is ok
    assert result.changed
    assert (await backend.state()).owned
    assert "retry" not in result.detail


@pytest.mark.parametrize("connected", [True, False])
async def test_aggregator_backend_without_an_answer_fails(tmp_path: Path, connected: bool) -> None:
    reporter = _reporter(tmp_path)
    if connected:
        _connect(reporter)
    backend = AggregatorBackend(reporter.ask_aggregator, timeout=0.05)
    result = await backend.cordon(_request())
    assert not result.ok
    assert "no decision" in result.detail
    assert not (await backend.state()).cordoned
    assert await _spooled(reporter) == []  # nothing left to be delivered late


@pytest.mark.parametrize(
    ("code", "published", "retried"),
    [(0x97, 1, True), (0x80, 1, True), (0x87, 0, False), (0x90, 0, False)],
)
async def test_the_spool_keeps_what_the_broker_refused_for_now(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int, published: int, retried: bool
) -> None:
    # "Quota exceeded" or "unspecified error" is tried again; "not authorized" would fail
    # the same way forever and is dropped (and counted).
    monkeypatch.setattr(reporter_module, "_TRANSIENT_RETRY_SECONDS", 0.01)
    reporter = _reporter(tmp_path, ack_timeout_seconds=0)  # the broker's PUBACK ends it
    broker = _connect(reporter, code)
    reporter.offer_event(GpuEvent("kmsg:b:1", "kmsg", "xid", BUS, 1000.0, 5.0, code=79))
    drain = asyncio.create_task(reporter._drain(broker))  # type: ignore[arg-type]
    await until(lambda: reporter.status().spool_depth == 0, timeout=1.0)
    drain.cancel()
    assert reporter.status().spool_depth == 0
    assert len(broker.sent) == published
    assert reporter.refused["events"] == 1
    assert (reporter.published["events"] == 1) is retried


@pytest.mark.parametrize("name", ["a/b", "+", "#", "", "x" * 200])
def test_names_that_would_break_topics_are_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(ValueError, match="name"):
        Reporter(MqttOutput(), node=name, cluster="c", agent_version="1", state_dir=tmp_path)


def _event(**changes: Any) -> bytes:
    message = schema.envelope("event", "e1", "n1", "c1", 1000.0)
    message.update(category="kernel", data={}, **changes)
    return json.dumps(message).encode()


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (_event().replace(b"1000.0", b"NaN"), "malformed"),
        (_event().replace(b"1000.0", b"Infinity"), "malformed"),
        (_event().replace(b"1000.0", b"1" + b"0" * 400), "invalid"),  # overflows a float
        (_event(time=-5.0), "invalid"),
        (_event(type={"a": 1}), "unknown_type"),
        (b'{"a":' * 5000 + b"1" + b"}" * 5000, "malformed"),
    ],
)
def test_decode_refuses_what_would_poison_a_reader(payload: bytes, reason: str) -> None:
    with pytest.raises(schema.PayloadError) as info:
        schema.decode(payload, max_bytes=1 << 20)
    assert info.value.reason == reason


def test_encode_writes_strict_json() -> None:
    message = schema.envelope("event", "e1", "n1", "c1", 1000.0)
    message.update(category="kernel", data={"evidence": [float("nan"), 1.5, float("-inf")]})
    encoded = schema.encode(message)
    assert json.loads(encoded, parse_constant=pytest.fail)["data"] == {
        "evidence": [None, 1.5, None]
    }
    assert schema.decode(encoded)["id"] == "e1"


async def test_no_online_report_after_the_goodbye(tmp_path: Path) -> None:
    reporter = _reporter(tmp_path)
    broker = _connect(reporter)
    reporter.offer_snapshot(_snapshot(1))
    # The state loop woke for a change just as the daemon began to stop.
    late_report = asyncio.create_task(reporter._publish_state(broker))  # type: ignore[arg-type]
    await reporter.shutdown()
    await late_report
    assert [m["online"] for _, m, _ in broker.sent] == [False]


def _kernel_event(sequence: int, boot: str = "b") -> GpuEvent:
    return GpuEvent(f"kmsg:{boot}:{sequence}", "kmsg", "xid", BUS, 1000.0, 5.0, code=79)


def _ack(*ids: str, node: str = "n1") -> bytes:
    return schema.encode(schema.ack_message(node, "c1", list(ids)))


async def _drained(reporter: Reporter, broker: Broker, sends: int) -> asyncio.Task[None]:
    drain = asyncio.create_task(reporter._drain(broker))  # type: ignore[arg-type]
    await until(lambda: len(broker.sent) >= sends, timeout=2.0)
    return drain


async def test_a_message_leaves_the_spool_only_when_the_aggregator_acknowledges_it(
    tmp_path: Path,
) -> None:
    """The broker's PUBACK is not enough (a broker crash or a shared subscription without
    members loses what it acknowledged): the message waits for the aggregator's ack, and
    goes again if none comes in time."""
    # Long enough that a busy machine does not resend before the first check below.
    reporter = _reporter(tmp_path, ack_timeout_seconds=0.2 * PATIENCE)
    broker = _connect(reporter)
    reporter.offer_event(_kernel_event(1))
    reporter.offer_event(_kernel_event(2))
    drain = await _drained(reporter, broker, 2)
    assert [m["id"] for _, m, _ in broker.sent] == ["n1:kmsg:b:1", "n1:kmsg:b:2"]
    # Marked sent on the spool's disk thread, a moment after the broker had them.
    await until(lambda: reporter.status().awaiting_ack == 2, timeout=2.0)
    assert reporter.status().spool_depth == reporter.status().awaiting_ack == 2
    # No acknowledgement: both go again after the timeout, the same ids.
    await until(lambda: len(broker.sent) >= 4, timeout=1.0 + 0.2 * PATIENCE)
    assert [m["id"] for _, m, _ in broker.sent[2:]] == ["n1:kmsg:b:1", "n1:kmsg:b:2"]
    # An acknowledgement addressed to another node is refused; ours removes the message.
    assert reporter.handle_command(_ack("n1:kmsg:b:1", node="n2")) is None
    assert reporter.rejected_commands["foreign"] == 1
    task = reporter.handle_command(_ack("n1:kmsg:b:1", "n1:kmsg:b:unknown"))
    assert task is not None
    await task
    drain.cancel()
    assert [m["id"] for m in await _spooled(reporter)] == ["n1:kmsg:b:2"]
    assert reporter.status().acknowledged == 1


async def test_resends_back_off_and_a_new_connection_sends_everything_again(
    tmp_path: Path,
) -> None:
    ack = 0.1 * PATIENCE  # the fourth send, 7 times this after the first, must not race the cancel
    reporter = _reporter(tmp_path, ack_timeout_seconds=ack)
    broker = _connect(reporter)
    reporter.offer_event(_kernel_event(1))
    drain = await _drained(reporter, broker, 3)
    drain.cancel()
    # Sent at 0, resent after one timeout, then after two more: the wait doubles. (The
    # third send is marked on the spool's disk thread a moment after the broker had it.)
    assert len(broker.sent) == 3

    async def third_send_marked() -> bool:
        due = await reporter.outbox.spool.next_due(ack)
        return due is not None and due > 2 * ack

    await until(third_send_marked, timeout=2.0)
    due = await reporter.outbox.spool.next_due(ack)
    assert due is not None
    assert 2 * ack < due <= 4 * ack  # 4 timeouts after the third send: not 1, not 2
    # A new connection (the broker may have restarted and lost it) sends it at once.
    again = await _drained(reporter, broker, 4)
    again.cancel()
    assert len(broker.sent) == 4


async def test_acknowledgements_do_not_crowd_out_remembered_command_ids(tmp_path: Path) -> None:
    reporter = _reporter(tmp_path)
    command = schema.command_message("cmd-1", "n1", "c1", "refresh")
    task = reporter.handle_command(schema.encode(command))
    assert task is not None
    await task
    for i in range(2000):
        reporter.handle_command(_ack(f"n1:kmsg:b:{i}"))
    assert reporter.handle_command(schema.encode(command)) is None  # still known: once only
    assert reporter.commands["refresh"] == 1


async def test_a_restarted_agent_does_not_spool_kernel_records_it_spooled_before(
    tmp_path: Path,
) -> None:
    """A restart re-reads the kernel's buffer; what the last run spooled is not sent again
    (per boot: a new boot starts its sequence numbers over)."""
    first = _reporter(tmp_path)
    for sequence in range(1, 101):
        first.offer_event(_kernel_event(sequence))
    await _settle()
    assert len(await _spooled(first)) == 100
    await first.outbox.acknowledge([m["id"] for m in await _spooled(first)])
    first.close()

    second = _reporter(tmp_path)
    for sequence in range(1, 103):
        second.offer_event(_kernel_event(sequence))
    second.offer_event(_kernel_event(5, boot="next-boot"))
    await _settle()
    assert [m["id"] for m in await _spooled(second)] == [
        "n1:kmsg:b:101",
        "n1:kmsg:b:102",
        "n1:kmsg:next-boot:5",
    ]


class _SessionRig:
    """The reporter's connection loop on a stand-in client whose connection drops when
    ``lost`` is set."""

    def __init__(self, reporter: Reporter, monkeypatch: pytest.MonkeyPatch) -> None:
        self.lost = asyncio.Event()
        self.sessions = 0
        rig = self

        class Client:
            def __init__(self, **_: Any) -> None:
                self._client = _PahoStub()
                rig.sessions += 1

            async def __aenter__(self) -> Self:
                return self

            async def __aexit__(self, *_: object) -> None:
                return None

            async def subscribe(self, *_: Any, **__: Any) -> None:
                return None

        async def connection_drops(_client: Any) -> None:
            await rig.lost.wait()
            rig.lost.clear()
            raise reporter_module.aiomqtt.MqttError("Disconnected during message iteration")

        async def forever(_client: Any) -> None:
            await asyncio.Event().wait()

        monkeypatch.setattr(reporter_module.aiomqtt, "Client", Client)
        monkeypatch.setattr(reporter, "_drain", connection_drops)
        monkeypatch.setattr(reporter, "_state_loop", forever)
        monkeypatch.setattr(reporter, "_command_loop", forever)
        self.run = asyncio.create_task(reporter.run())

    async def until_sessions(self, count: int) -> None:
        await until(lambda: self.sessions >= count, timeout=3.0)


async def test_a_lost_connection_is_made_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reporter = _reporter(tmp_path, broker=MqttConnection(reconnect_min_seconds=0.01))
    rig = _SessionRig(reporter, monkeypatch)
    await rig.until_sessions(1)
    await asyncio.sleep(0.01)
    rig.lost.set()
    await rig.until_sessions(2)
    rig.run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(rig.run, 2.0)


async def test_cancellation_wins_over_a_connection_lost_at_the_same_moment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGTERM as the connection drops: a task group would raise the connection error,
    not the cancellation, and the reporter would reconnect instead of stopping."""
    reporter = _reporter(tmp_path, broker=MqttConnection(reconnect_min_seconds=0.01))
    rig = _SessionRig(reporter, monkeypatch)
    await rig.until_sessions(1)
    await asyncio.sleep(0.01)
    rig.lost.set()
    await asyncio.sleep(0)  # the failing task is scheduled first, then the SIGTERM
    rig.run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(rig.run, 2.0)
    assert rig.sessions == 1


class _PahoStub:
    on_publish = None
    on_disconnect = None


async def test_a_slow_disk_never_stalls_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each spool commit waits for fsync; here every write takes 0.5 s, as on a failing
    disk. The event loop (scrapes, the API, the watchdog ping) keeps its pace: the spool
    works on the disk thread."""
    write = Spool.put

    def slow_put(self: Spool, messages: list[tuple[str, str, bytes]]) -> int:
        time.sleep(0.5)
        return write(self, messages)

    monkeypatch.setattr(Spool, "put", slow_put)
    reporter = _reporter(tmp_path)
    assert await reporter.outbox.open()
    gaps: list[float] = []
    stop = asyncio.Event()

    async def tick() -> None:
        last = time.monotonic()
        while not stop.is_set():
            await asyncio.sleep(0.01)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    ticker = asyncio.create_task(tick())
    for burst in range(3):
        for sequence in range(burst * 100, burst * 100 + 100):
            reporter.offer_event(_kernel_event(sequence + 1))
        await reporter.outbox.flush()
    stop.set()
    await ticker
    assert len(await _spooled(reporter)) == 300
    assert max(gaps) < 0.25  # on the loop, each write would be a 0.5 s gap
