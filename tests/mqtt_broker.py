"""A real mosquitto on loopback for the fleet tests.

It runs the shipped configuration, deploy/mosquitto/gpuagent.conf (persistence, autosave,
packet and queue limits, and its TLS listener: `require_certificate`,
`use_identity_as_username` and the project's own ACL file, deploy/mosquitto/gpuagent.acl),
with a test CA and free ports of 127.0.0.1, plus a plain listener (anonymous, no ACL).
Certificates are made by the fleet's own PKI (gpuagent.fleet.pki). The broker can be
made to save its database, killed (SIGKILL) and restarted on the same ports and
persistence file, for outage tests.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from conftest import DaemonProcess, deadline_in, free_port, require
from gpuagent.config import MqttConnection
from gpuagent.fleet.pki import Pki as FleetPki

REPO = Path(__file__).resolve().parent.parent
ACL = REPO / "deploy" / "mosquitto" / "gpuagent.acl"
SHIPPED_CONF = REPO / "deploy" / "mosquitto" / "gpuagent.conf"
STARTUP_SECONDS = 10.0
# Further aggregators the tests run beside "aggregator", each added to the ACL as the
# shipped file says: a copy of the aggregator's lines under its own identity.
EXTRA_AGGREGATORS = ("aggregator-a", "aggregator-b")


def shipped_settings() -> tuple[list[str], list[str]]:
    """The settings of the shipped broker configuration, comments left out: (those before
    its listener, those of its listener)."""
    settings = [
        line.strip()
        for line in SHIPPED_CONF.read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    first = next(i for i, line in enumerate(settings) if line.split()[0] == "listener")
    return settings[:first], settings[first + 1 :]


def mosquitto_path() -> str:
    """The mosquitto executable: missing, the test is skipped, or fails under CI."""
    return require(
        "mosquitto", "the MQTT broker tests (Debian package mosquitto; scripts/test installs it)"
    )


@dataclass
class Pki:
    """The fleet's own PKI (`gpuagent-aggregator pki`): a CA that signs the broker's
    certificate and one per client identity, issued on first use."""

    root: Path

    @classmethod
    def create(cls, root: Path) -> Pki:
        FleetPki(root).init(["127.0.0.1", "localhost"])
        return cls(root)

    @property
    def ca_file(self) -> Path:
        return self.root / "ca.crt"

    @property
    def crl_file(self) -> Path:
        return FleetPki(self.root).crl_file

    def client(self, name: str) -> tuple[Path, Path]:
        """(certificate, key) for a client whose CN, and so MQTT user name, is ``name``."""
        crt, key = FleetPki(self.root).client_files(name)
        if not crt.exists():
            FleetPki(self.root).issue(name)
        return crt, key


@dataclass
class Broker:
    root: Path
    pki: Pki
    port: int
    tls_port: int
    process: subprocess.Popen[bytes] | None = None
    # Refuse the client certificates the PKI revoked (mosquitto's crlfile, read at start).
    check_revocation: bool = False

    @property
    def log(self) -> Path:
        return self.root / "mosquitto.log"

    def connection(self, identity: str | None = None, **overrides: object) -> MqttConnection:
        """Settings for the plain listener, or (with ``identity``) the TLS listener with a
        client certificate for that identity."""
        if identity is None:
            base = MqttConnection(host="127.0.0.1", port=self.port, tls=False)
        else:
            cert, key = self.pki.client(identity)
            base = MqttConnection(
                host="127.0.0.1",
                port=self.tls_port,
                tls=True,
                ca_file=str(self.pki.ca_file),
                cert_file=str(cert),
                key_file=str(key),
            )
        fields = {**base.__dict__, "reconnect_min_seconds": 0.2, "reconnect_max_seconds": 1.0}
        fields.update(overrides)
        return MqttConnection(**fields)  # type: ignore[arg-type]

    def agent_config(self, identity: str | None = None, extra: str = "") -> str:
        """An agent's `[outputs.mqtt]` TOML for this broker: the plain listener, or (with
        ``identity``) TLS with that identity's client certificate. ``extra`` goes into
        `[outputs.mqtt]`."""
        head = f'[outputs.mqtt]\nenabled = true\n{extra}[outputs.mqtt.broker]\nhost = "127.0.0.1"\n'
        if identity is None:
            where = f"port = {self.port}\ntls = false\n"
        else:
            cert, key = self.pki.client(identity)
            where = (
                f"port = {self.tls_port}\n"
                f'ca_file = "{self.pki.ca_file}"\ncert_file = "{cert}"\nkey_file = "{key}"\n'
            )
        return head + where + "reconnect_min_seconds = 0.2\nreconnect_max_seconds = 1.0\n"

    def _write_acl(self) -> Path:
        """The shipped ACL, and the aggregator's lines again for each further aggregator."""
        shipped = ACL.read_text()
        lines = shipped.splitlines()
        start = lines.index("user aggregator")
        block = lines[start : lines.index("", start)]
        extra = ["\n".join([f"user {name}", *block[1:]]) for name in EXTRA_AGGREGATORS]
        acl = self.root / "gpuagent.acl"
        acl.write_text("\n\n".join([shipped, *extra]) + "\n")
        return acl

    def _write_config(self) -> Path:
        """The shipped configuration (deploy/mosquitto/gpuagent.conf) with this test's paths
        and ports, and a plain listener beside its TLS one."""
        crt, key = self.root / "pki" / "broker.crt", self.root / "pki" / "broker.key"
        acl = self._write_acl()
        paths = {"cafile": self.pki.ca_file, "certfile": crt, "keyfile": key, "acl_file": acl}
        shared, listener = shipped_settings()
        lines = [
            *shared,
            f"persistence_location {self.root}/",
            f"log_dest file {self.log}",
            "log_type error",
            "log_type warning",
            "log_type notice",
            "log_type subscribe",
            f"listener {self.port} 127.0.0.1",
            "allow_anonymous true",
            f"listener {self.tls_port} 127.0.0.1",
            *(
                f"{name} {paths[name]}" if (name := line.split()[0]) in paths else line
                for line in listener
            ),
            *([f"crlfile {self.pki.crl_file}"] if self.check_revocation else []),
        ]
        if os.geteuid() == 0:
            lines.insert(0, "user root")  # else mosquitto drops to a user that can't read our files
        conf = self.root / "mosquitto.conf"
        conf.write_text("\n".join(lines) + "\n")
        return conf

    def save(self) -> None:
        """Have mosquitto write its database now (SIGUSR1), as its next autosave would, and
        wait until it has: what a crash after this keeps."""
        assert self.process is not None
        database = self.root / "mosquitto.db"
        before = database.stat().st_ino if database.exists() else None
        self.process.send_signal(signal.SIGUSR1)
        deadline = deadline_in(STARTUP_SECONDS)
        # Written to a new file, then renamed over the old one: a new inode.
        while not (database.exists() and database.stat().st_ino != before):
            if time.monotonic() > deadline:
                raise RuntimeError("mosquitto did not save its database")
            time.sleep(0.02)

    def start(self) -> None:
        program = mosquitto_path()
        self.process = subprocess.Popen(
            [program, "-c", str(self._write_config())],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = deadline_in(STARTUP_SECONDS)
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                err = self.process.stderr.read().decode() if self.process.stderr else ""
                log = self.log.read_text() if self.log.exists() else ""
                # Its pipe closed here: a caller may try other ports with a new broker,
                # and a pipe left to the collector fails whichever test is running then.
                self._forget()
                raise RuntimeError(f"mosquitto exited: {err}\n{log}")
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.tls_port), timeout=0.2),
            ):
                return
            time.sleep(0.05)
        self.kill()
        raise RuntimeError("mosquitto did not start listening")

    def kill(self) -> None:
        """SIGKILL: an outage with no goodbye to anyone."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)
        self._forget()

    def _forget(self) -> None:
        if self.process is not None and self.process.stderr is not None:
            self.process.stderr.close()
        self.process = None

    def restart(self) -> None:
        self.kill()
        self.start()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)
        self._forget()


def start_on_free_ports(root: Path, pki: Pki, **options: Any) -> Broker:
    """A broker started on two free ports. A port found free can be taken by another test
    before mosquitto binds it: then two others are tried."""
    for _ in range(2):
        broker = Broker(root, pki, port=free_port(), tls_port=free_port(), **options)
        try:
            broker.start()
        except RuntimeError as exc:
            if "Address already in use" not in str(exc):
                raise
        else:
            return broker
    broker = Broker(root, pki, port=free_port(), tls_port=free_port(), **options)
    broker.start()
    return broker


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki.create(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def mqtt_broker(tmp_path: Path, pki: Pki) -> Iterator[Broker]:
    mosquitto_path()
    root = tmp_path / "broker"
    root.mkdir()
    (root / "pki").mkdir()
    for name in ("broker.crt", "broker.key"):
        shutil.copy(pki.root / name, root / "pki" / name)
    broker = start_on_free_ports(root, pki)
    try:
        yield broker
    finally:
        broker.stop()


@dataclass
class Received:
    topic: str
    payload: dict[str, Any]
    retain: bool


class Listener:
    """A plain MQTT 5 subscriber on a background thread (paho's own loop) that records what
    it gets: tests watch subprocess agents through it. A persistent session, so QoS 1
    messages sent while the broker was down or we were away still arrive."""

    def __init__(self, broker: Broker, *topics: str, client_id: str = "test-listener") -> None:
        self.messages: list[Received] = []
        self._lock = threading.Lock()
        self._topics = topics
        self._client = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5
        )
        self._client.on_connect = self._on_connect
        self._client.on_message = self._on_message
        self._client.reconnect_delay_set(0.2, 1)
        properties = Properties(PacketTypes.CONNECT)
        properties.SessionExpiryInterval = 3600
        self._client.connect("127.0.0.1", broker.port, clean_start=False, properties=properties)
        self._client.loop_start()

    def _on_connect(self, client: mqtt.Client, *_args: Any) -> None:
        for topic in self._topics:
            client.subscribe(topic, qos=1)

    def _on_message(self, _client: mqtt.Client, _userdata: Any, msg: mqtt.MQTTMessage) -> None:
        try:
            payload = json.loads(msg.payload)
        except ValueError:
            payload = {"raw": msg.payload.decode(errors="replace")}
        received = Received(msg.topic, payload, bool(msg.retain))
        with self._lock:
            self.messages.append(received)

    def publish(self, topic: str, payload: bytes, *, retain: bool = False) -> None:
        self._client.publish(topic, payload, qos=1, retain=retain).wait_for_publish(5)

    def snapshot(self) -> list[Received]:
        with self._lock:
            return list(self.messages)

    def wait_for(
        self, predicate: Callable[[list[Received]], bool], timeout: float = 10.0
    ) -> list[Received]:
        deadline = deadline_in(timeout)
        while True:
            messages = self.snapshot()
            if predicate(messages):
                return messages
            if time.monotonic() > deadline:
                shown = "\n".join(f"{m.topic} {str(m.payload)[:200]}" for m in messages[-20:])
                raise AssertionError(f"not received in {timeout} s; last messages:\n{shown}")
            time.sleep(0.05)

    def close(self) -> None:
        self._client.loop_stop()
        self._client.disconnect()


def wait_out_the_outage(daemon: DaemonProcess, spooled: int, log_from: int) -> None:
    """Wait until the agent, its broker killed, has seen the connection go, spooled the
    ``spooled`` messages of the outage, and tried to connect again and been refused (logged
    past ``log_from``): all an outage does to it, however long (its reconnect backoff is at
    most 1 s here), so the broker can come back then."""
    # /metrics is rendered once per snapshot, so both show at the next poll
    daemon.wait_for(lambda _d: daemon.metric("gpuagent_mqtt_spool_messages") >= spooled)
    daemon.wait_for(lambda _d: daemon.metric("gpuagent_mqtt_connected") == 0.0)
    daemon.wait_for_log("MQTT connect failed", after=log_from)
