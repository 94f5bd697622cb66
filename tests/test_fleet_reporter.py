"""The MQTT reporter end to end: the real daemon under the simulator against a real
mosquitto on loopback (tests/mqtt_broker.py), watched by a plain MQTT subscriber."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest

from conftest import DaemonProcess, deadline_in, kernel_record
from fleet_support import H100, kernel_events_awaiting_ack, spooled_kernel_events, xid_records
from mqtt_broker import Broker, Listener, Received, wait_out_the_outage

pytestmark = pytest.mark.integration

Run = Callable[..., DaemonProcess]
PREFIX = "gpuagent/v1/default"


@pytest.fixture
def listener(mqtt_broker: Broker) -> Iterator[Listener]:
    watching = Listener(mqtt_broker, "gpuagent/v1/#")
    yield watching
    watching.close()


def _on(channel: str, node: str = "test-node") -> Callable[[Received], bool]:
    return lambda m: m.topic == f"{PREFIX}/{node}/{channel}"


def _states(messages: list[Received], node: str = "test-node") -> list[dict[str, Any]]:
    return [m.payload for m in messages if _on("state", node)(m)]


def _kernel_ids(messages: list[Received]) -> set[str]:
    return {
        m.payload["id"] for m in messages if _on("events")(m) and m.payload["category"] == "kernel"
    }


def _metric(daemon: DaemonProcess, name: str, **labels: str) -> float:
    return daemon.metric(name, **labels)


def test_birth_state_events_and_clean_shutdown(
    run_daemon: Run, mqtt_broker: Broker, listener: Listener
) -> None:
    daemon = run_daemon(H100, config_extra=mqtt_broker.agent_config())
    messages = listener.wait_for(lambda ms: any(s["online"] for s in _states(ms)))
    birth = _states(messages)[-1]
    assert birth["schema"] == 1
    assert birth["type"] == "state"
    assert (birth["node"], birth["cluster"]) == ("test-node", "default")
    assert len(birth["status"]["gpus"]) == 8
    assert birth["status"]["node"]["inventory"]["fingerprint_id"]  # for the fleet's drift view
    late = Listener(mqtt_broker, f"{PREFIX}/+/state", client_id="late-listener")
    try:
        retained = late.wait_for(bool)[0]
        assert retained.retain
        assert retained.payload["online"] is True
    finally:
        late.close()

    daemon.inject("ecc_dbe", 3, count=1)
    bus = daemon.status()["gpus"][3]["pci_bus_id"]

    def dbe_reported(ms: list[Received]) -> bool:
        findings = [m.payload["data"] for m in ms if _on("events")(m)]
        critical = any(f["check"] == "ecc" and f["to"] == "CRITICAL" for f in findings)
        gpus = _states(ms)[-1]["status"]["gpus"] if _states(ms) else []
        return critical and any(g["health"] == "CRITICAL" for g in gpus)

    messages = listener.wait_for(dbe_reported, timeout=10)
    event = next(m.payload for m in messages if _on("events")(m))
    assert event["data"]["gpu"] == bus
    assert event["data"]["from"] == "OK"

    daemon.write_kernel_log(*xid_records(10, 1, bus))
    listener.wait_for(lambda ms: len(_kernel_ids(ms)) == 1)
    assert _metric(daemon, "gpuagent_mqtt_connected") == 1.0
    daemon.wait_for(
        lambda _d: _metric(daemon, "gpuagent_mqtt_published_total", channel="events") >= 2
    )

    assert daemon.stop() == 0
    last = listener.wait_for(lambda ms: not _states(ms)[-1]["online"])
    assert _states(last)[-1]["reason"] == "shutdown"


def test_a_crash_publishes_the_last_will(
    run_daemon: Run, mqtt_broker: Broker, listener: Listener
) -> None:
    daemon = run_daemon(H100, config_extra=mqtt_broker.agent_config())
    listener.wait_for(lambda ms: any(s["online"] for s in _states(ms)))
    daemon.kill()
    messages = listener.wait_for(lambda ms: not _states(ms)[-1]["online"], timeout=10)
    assert _states(messages)[-1]["reason"] == "connection lost"


def test_broker_outage_loses_no_event(
    run_daemon: Run, mqtt_broker: Broker, listener: Listener
) -> None:
    daemon = run_daemon(H100, config_extra=mqtt_broker.agent_config())
    listener.wait_for(lambda ms: any(s["online"] for s in _states(ms)))
    mqtt_broker.save()  # the listener's session survives the crash
    bus = daemon.status()["gpus"][1]["pci_bus_id"]
    log_from = len(daemon.log())
    mqtt_broker.kill()
    daemon.write_kernel_log(*xid_records(100, 500, bus))
    daemon.wait_for(lambda d: d["kmsg"]["records_read"] == 500, timeout=20)
    wait_out_the_outage(daemon, spooled=500, log_from=log_from)
    mqtt_broker.start()
    messages = listener.wait_for(lambda ms: len(_kernel_ids(ms)) == 500, timeout=30)
    ids = _kernel_ids(messages)
    assert len(ids) == 500
    codes = {
        m.payload["data"]["code"]
        for m in messages
        if _on("events")(m) and "code" in m.payload["data"]
    }
    assert codes == {13}
    # All sent; they stay spooled until an aggregator acknowledges storing them (this test
    # runs none: test_fleet_delivery.py does).
    daemon.wait_for(lambda _d: kernel_events_awaiting_ack(daemon, 500))
    assert set(spooled_kernel_events(daemon)) == ids


def test_agent_killed_with_a_full_spool_sends_it_after_restart(
    run_daemon: Run, mqtt_broker: Broker, listener: Listener, tmp_path: Path
) -> None:
    daemon = run_daemon(H100, config_extra=mqtt_broker.agent_config())
    listener.wait_for(lambda ms: any(s["online"] for s in _states(ms)))
    mqtt_broker.save()
    bus = daemon.status()["gpus"][0]["pci_bus_id"]
    mqtt_broker.kill()
    daemon.write_kernel_log(*xid_records(1000, 200, bus))
    daemon.wait_for(lambda _d: _metric(daemon, "gpuagent_mqtt_spool_messages") >= 200)
    daemon.kill()
    mqtt_broker.start()
    restarted = _restart_in(daemon, mqtt_broker)  # the same workdir: the same state_dir
    try:
        messages = listener.wait_for(lambda ms: len(_kernel_ids(ms)) == 200, timeout=30)
        assert len(_kernel_ids(messages)) == 200
    finally:
        restarted.stop()


def _restart_in(daemon: DaemonProcess, broker: Broker) -> DaemonProcess:
    from conftest import start_daemon  # noqa: PLC0415

    return start_daemon(daemon.workdir, H100, config_extra=broker.agent_config())


def _command(node: str, command: str, args: dict[str, Any] | None = None, **env: Any) -> bytes:
    message = {
        "schema": 1,
        "type": "command",
        "id": f"cmd-{command}-{time.monotonic_ns()}",
        "node": node,
        "cluster": "default",
        "time": time.time(),
        "command": command,
        "args": args or {},
    }
    message.update(env)
    return json.dumps(message).encode()


def test_commands_allowlisted_and_bad_ones_counted(
    run_daemon: Run, mqtt_broker: Broker, listener: Listener
) -> None:
    daemon = run_daemon(
        H100, config_extra=mqtt_broker.agent_config(extra="max_command_bytes = 4096\n")
    )
    listener.wait_for(lambda ms: any(s["online"] for s in _states(ms)))
    topic = f"{PREFIX}/test-node/cmd"
    bus = daemon.status()["gpus"][0]["pci_bus_id"]
    for payload in (
        b"{not json",
        b"x" * 5000,
        json.dumps({"schema": 7, "type": "command"}).encode(),
        _command("test-node", "format_disks"),
        _command("other-node", "refresh"),
        _command("test-node", "refresh"),
        _command("test-node", "reset_gpu", {"gpu": bus}),
        _command("test-node", "set_remediation_mode", {"mode": "enforce"}),
        _command("test-node", "run_checks"),
    ):
        listener.publish(topic, payload)

    messages = listener.wait_for(lambda ms: sum(_on("replies")(m) for m in ms) == 4)
    replies = {
        m.payload["command_id"].split("-")[1]: m.payload for m in messages if _on("replies")(m)
    }
    assert replies["refresh"]["ok"] is True
    assert replies["run_checks"]["ok"] is True
    assert "8 GPUs" in replies["run_checks"]["detail"]
    assert replies["reset_gpu"]["ok"] is False
    assert "allow_remote_reset" in replies["reset_gpu"]["detail"]
    assert replies["set_remediation_mode"]["ok"] is True
    daemon.wait_for(lambda d: d["remediation"]["mode"] == "enforce")
    rejected = {
        reason: _metric(daemon, "gpuagent_mqtt_commands_rejected_total", reason=reason)
        for reason in ("malformed", "oversized", "schema", "not_allowed", "foreign")
    }
    assert rejected == dict.fromkeys(rejected, 1.0)
    log = (daemon.workdir / "daemon.log").read_text()
    assert log.count("rejected a command from the broker (malformed)") == 1
    assert daemon.process.poll() is None


def _publish_refused(broker: Broker, identity: str, topic: str) -> bool:
    """Publish as ``identity`` (client certificate) and return whether the broker refused."""
    cert, key = broker.pki.client(identity)
    client = mqtt.Client(
        mqtt.CallbackAPIVersion.VERSION2, client_id=f"acl-{identity}", protocol=mqtt.MQTTv5
    )
    client.tls_set(ca_certs=str(broker.pki.ca_file), certfile=str(cert), keyfile=str(key))
    codes: list[Any] = []
    client.on_publish = lambda _c, _u, _mid, reason, _p: codes.append(reason)
    client.connect("127.0.0.1", broker.tls_port)
    client.loop_start()
    try:
        client.publish(topic, b"{}", qos=1).wait_for_publish(5)
        deadline = deadline_in(5)
        while not codes and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        client.loop_stop()
        client.disconnect()
    assert codes, "no PUBACK"
    return bool(codes[0].is_failure)


@pytest.mark.parametrize(
    ("identity", "topic", "refused"),
    [
        ("node-a", f"{PREFIX}/node-a/events", False),
        ("node-a", f"{PREFIX}/node-b/events", True),
        ("node-a", f"{PREFIX}/node-b/state", True),
        ("node-a", f"{PREFIX}/node-a/cmd", True),
        ("node-a", f"{PREFIX}/node-b/cmd", True),
        ("aggregator", f"{PREFIX}/node-a/cmd", False),
        ("aggregator", f"{PREFIX}/node-a/state", True),
    ],
)
def test_acl_a_node_publishes_only_as_itself(
    mqtt_broker: Broker, identity: str, topic: str, refused: bool
) -> None:
    assert _publish_refused(mqtt_broker, identity, topic) is refused


def test_a_node_speaking_for_another_is_refused_and_counted(
    run_daemon: Run, mqtt_broker: Broker, listener: Listener
) -> None:
    # The certificate says node-a, the configuration says test-node: every publish fails.
    daemon = run_daemon(H100, config_extra=mqtt_broker.agent_config("node-a"))
    daemon.wait_for(
        lambda _d: _metric(daemon, "gpuagent_mqtt_publish_refused_total", channel="state") >= 1
    )
    assert _states(listener.snapshot()) == []
    log = (daemon.workdir / "daemon.log").read_text()
    assert "the MQTT broker refused a publish" in log


def test_tls_identity_matching_the_node_reports(
    run_daemon: Run, mqtt_broker: Broker, listener: Listener
) -> None:
    run_daemon(H100, config_extra=mqtt_broker.agent_config("tls-node"), node_name="tls-node")
    messages = listener.wait_for(lambda ms: bool(_states(ms, "tls-node")))
    assert _states(messages, "tls-node")[-1]["online"] is True


def test_a_growing_rate_publishes_on_identity_changes_not_on_every_poll(
    run_daemon: Run, mqtt_broker: Broker, listener: Listener
) -> None:
    """An SBE rate that grows at every 1 s poll changes the finding's reason each time
    ("12 corrected ECC errors in 83.5 s (about 517 per hour), ..."), not what it is: the
    retained state report goes out when the finding appears, then at its interval (30 s),
    not per poll."""
    growing = "".join(
        f'[[fault]]\ngpu = 0\nkind = "ecc_sbe"\ncount = 40\nat = {second}.0\n'
        for second in range(1, 90)
    )
    daemon = run_daemon(H100 + growing, config_extra=mqtt_broker.agent_config(), interval=1.0)

    def ecc(status: dict[str, Any]) -> dict[str, Any] | None:
        found = [f for f in status["gpus"][0]["findings"] if f["check"] == "ecc"]
        return found[0] if found else None

    def warned(states: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [s for s in states if s["online"] and ecc(s["status"]) is not None]

    listener.wait_for(lambda ms: bool(warned(_states(ms))), timeout=30)
    before = ecc(daemon.status())
    time.sleep(30)  # the window the report rate is measured over: 30 polls
    after = ecc(daemon.status())
    assert before is not None
    assert after is not None
    assert before["reason"] != after["reason"]  # the numbers moved at every poll
    assert before["cause"] == after["cause"] == "gpu-ecc-sbe-rate"
    reports = warned(_states(listener.messages))
    assert 1 <= len(reports) <= 2, [ecc(s["status"]) for s in reports]


def test_a_storm_reaches_the_fleet_as_incidents_not_records(
    run_daemon: Run, mqtt_broker: Broker, listener: Listener
) -> None:
    """2,000 records of one process on one GPU: one event when the incident opens, then one
    carrying its count at the next report (every 10 s), not 2,000 messages."""
    daemon = run_daemon(H100, config_extra=mqtt_broker.agent_config())
    listener.wait_for(lambda ms: any(s["online"] for s in _states(ms)))
    bus = daemon.status()["gpus"][1]["pci_bus_id"].rsplit(".", 1)[0]
    daemon.write_kernel_log(
        *(
            kernel_record(
                n,
                f"NVRM: Xid (PCI:{bus}): 45, pid=77, name=train, Ch {n:08x} "
                "caused by previous Xid 149",
            )
            for n in range(1, 2001)
        )
    )

    def counted(ms: list[Received]) -> list[int]:
        return [
            m.payload["data"]["incident"]["count"]
            for m in ms
            if _on("events")(m) and "incident" in m.payload.get("data", {})
        ]

    messages = listener.wait_for(lambda ms: 2000 in counted(ms), timeout=30)
    kernel = [m for m in messages if _on("events")(m) and m.payload["category"] == "kernel"]
    assert len(kernel) <= 4, [m.payload["id"] for m in kernel]
    update = next(m.payload for m in kernel if "incident" in m.payload["data"])
    assert update["data"]["incident"]["root_xid"] == 149
    assert update["data"]["incident"]["id"] == kernel[0].payload["data"]["id"]
