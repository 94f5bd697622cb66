"""Aggregator benchmark: simulated nodes, a local mosquitto, one or two aggregators.

Nodes' messages go through the broker into the aggregators, on SQLite or PostgreSQL.

    scripts/bench             (runs this after the node benchmarks: 10,000 nodes, SQLite)
    .venv/bin/python bench/aggregator.py [--quick] [--nodes N] [--rate MSG_S]
        [--database sqlite|postgresql] [--aggregators 1|2] [--refresh SECONDS]
    .venv/bin/python bench/aggregator.py --matrix [--quick]

Time is compressed: every node sends its state report first (a real 8-GPU status
document from the simulator), then a load generator keeps up a fixed offered rate of
state reports (each node every 30 s, as agents do) plus bursts of kernel events, while a
prober publishes a state report with the current time and polls every aggregator's API
until it shows it. Measures the sustained processed messages/s (the aggregators' own
counters), the capacity (offered three times that), publish-to-API latency (to the first
API that shows a report, and to every one: how stale one aggregator's fleet view is),
CPU, RSS and the database's size and write rate. Prints a table; writes
bench/results/aggregator.json for the plain run, else
bench/results/aggregator-<database>-<n>x-<nodes>.json.

CPU pinning (the benchmark host has two cores): the aggregators get CPU 1 (both of them
share it when there are two); mosquitto, the load generator, the prober and PostgreSQL
share CPU 0.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import paho.mqtt.client as paho
import psutil
from paho.mqtt.enums import CallbackAPIVersion

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "agent"))
sys.path.insert(1, str(REPO / "tests"))  # postgres_server: a throwaway PostgreSQL

from gpuagent.aggregator import paho_tables  # noqa: E402
from gpuagent.fleet import schema  # noqa: E402
from report import Row, free_port, percentile, report  # noqa: E402 - bench/ is the script's directory

T = TypeVar("T")

PREFIX = "gpuagent/v1"
NODES = 10_000
CLUSTERS = 4
STATE_INTERVAL = 30.0
# Offered rate: at least 5,000 msg/s (the target), and at large fleets every node's state
# report every STATE_INTERVAL plus this many events/s.
MIN_RATE = 5000.0
EVENT_RATE = 1700.0
# The aggregators get CPU 1; mosquitto, the generator, the prober and PostgreSQL CPU 0.
AGGREGATOR_CPU = 1
INFRA_CPU = 0
# The fleet view that every PostgreSQL aggregator refreshes from the database.
SHARE_GROUP = "gpuagent"
# The aggregators' default refresh_interval_seconds.
DEFAULT_REFRESH = 0.5
# A probe not shown by an API within this long counts as missed.
PROBE_TIMEOUT = 5.0
# (database, aggregators, nodes) run by --matrix, in this order.
MATRIX = (
    ("sqlite", 1, 10_000),
    ("sqlite", 1, 100_000),
    ("postgresql", 1, 10_000),
    ("postgresql", 2, 10_000),
    ("postgresql", 1, 100_000),
    ("postgresql", 2, 100_000),
)


def pin(pid: int, cpu: int) -> None:
    if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) > cpu:
        os.sched_setaffinity(pid, {cpu})


def pin_threads(pid: int, cpu: int) -> None:
    """Every thread of ``pid``: a thread started before the process was pinned keeps the
    CPUs it started with."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            pin(int(task.name), cpu)


def default_rate(nodes: int) -> float:
    return max(MIN_RATE, nodes / STATE_INTERVAL + EVENT_RATE)


def status_template() -> dict[str, Any]:
    """A real status document: the simulated 8-GPU H100 node, checked once."""
    out = subprocess.run(
        [sys.executable, "-m", "gpuagent", "check", "--json", "--simulate",
         str(REPO / "scenarios" / "h100-healthy.toml")],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    document: dict[str, Any] = json.loads(out.stdout)
    return document


def node_name(i: int) -> tuple[str, str]:
    return f"c{i % CLUSTERS}", f"node{i:05d}"


def state_payload(
    template: dict[str, Any], i: int, sequence: int, when: float
) -> tuple[str, bytes]:
    cluster, node = node_name(i)
    status = copy.copy(template)
    driver = "535.104.05" if i % 50 == 0 else "550.54.15"  # 2 % drift
    fingerprint = {"driver": driver, "cuda": "12.4", "kernel": "6.1.0-18", "agent": "0.1.0"}
    status["node"] = dict(
        template["node"],
        name=node,
        cluster=cluster,
        inventory={"fingerprint": fingerprint, "fingerprint_id": driver.replace(".", "")[:8]},
    )
    message = schema.envelope("state", f"{node}:state:{sequence}", node, cluster, when)
    message.update(online=True, agent_version="0.1.0", status=status)
    return f"{PREFIX}/{cluster}/{node}/state", schema.encode(message)


def event_payload(i: int, n: int, when: float) -> tuple[str, bytes]:
    cluster, node = node_name(i)
    message = schema.envelope("event", f"{node}:bench:{n}", node, cluster, when)
    message.update(
        category="kernel",
        data={"source": "kmsg", "kind": "xid", "code": 13, "gpu": "0000:18:00.0", "time": when,
              "line": "NVRM: Xid (PCI:0000:18:00): 13, Graphics Exception"},
    )  # fmt: skip
    return f"{PREFIX}/{cluster}/{node}/events", schema.encode(message)


def _remaining_length(n: int) -> bytes:
    out = bytearray()
    while True:
        n, digit = divmod(n, 128)
        out.append(digit | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _string(text: str) -> bytes:
    raw = text.encode()
    return len(raw).to_bytes(2, "big") + raw


class RawPublisher:
    """QoS 1 PUBLISH packets written straight to the socket (MQTT 3.1.1).

    The load generator shares a core with the broker; a Python MQTT client would spend it
    on its own bookkeeping and measure itself rather than the aggregator. What the
    aggregator receives does not depend on this: the broker delivers to it over its own
    MQTT 5 session. A reader thread counts the broker's PUBACKs.
    """

    def __init__(self, port: int, client_id: str) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        body = _string("MQTT") + bytes([4, 0x02, 0, 60]) + _string(client_id)
        self.sock.sendall(b"\x10" + _remaining_length(len(body)) + body)
        if self.sock.recv(4)[:1] != b"\x20":
            raise RuntimeError("no CONNACK")
        self.acked = 0
        self.sent = 0
        self._mid = 0
        self._buffer: list[bytes] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        pending = b""
        while chunk := self.sock.recv(65536):
            pending += chunk
            # Only PUBACKs come back (4 bytes each: 0x40, 2, packet id).
            self.acked += len(pending) // 4
            pending = pending[len(pending) - len(pending) % 4 :]

    def publish(self, topic: str, payload: bytes, *, retain: bool = False) -> None:
        self._mid = self._mid % 65535 + 1
        body = _string(topic) + self._mid.to_bytes(2, "big") + payload
        header = bytes([0x32 | (1 if retain else 0)]) + _remaining_length(len(body))
        self._buffer.append(header + body)
        self.sent += 1

    def flush(self) -> None:
        self.sock.sendall(b"".join(self._buffer))
        self._buffer.clear()

    def wait_acked(self, backlog: int = 0, timeout: float = 30.0) -> None:
        """Until at most ``backlog`` messages sent are not yet acknowledged by the broker."""
        self.flush()
        deadline = time.monotonic() + timeout
        while self.sent - self.acked > backlog and time.monotonic() < deadline:
            time.sleep(0.01)

    def close(self) -> None:
        self.wait_acked()
        self.sock.sendall(b"\xe0\x00")  # DISCONNECT
        self.sock.close()


def connect(port: int, client_id: str) -> paho.Client:
    paho_tables.install()  # the generator needs paho to be quick as much as the aggregator
    client = paho.Client(CallbackAPIVersion.VERSION2, client_id, protocol=paho.MQTTv5)
    client.max_inflight_messages_set(1000)
    client.max_queued_messages_set(0)
    client.connect("127.0.0.1", port)
    client.loop_start()
    return client


# Payloads are encoded once with this stand-in time, which is replaced as they are sent:
# the generator shares a core with the broker, and must not spend it on JSON.
_STAND_IN = 1234567.125
_STAND_IN_BYTES = b'"time":1234567.125'


def stamp(payload: bytes, when: float) -> bytes:
    return payload.replace(_STAND_IN_BYTES, b'"time":' + repr(when).encode(), 1)


# --- the load generator (a subprocess, on CPU 0 unless --spread) -------------------------


def send_initial(client: RawPublisher, states: list[tuple[str, bytes]]) -> int:
    """Every node's state, once, no faster than the broker takes them."""
    for i, (topic, payload) in enumerate(states):
        client.publish(topic, stamp(payload, time.time()), retain=True)
        if i % 500 == 0:
            client.flush()
            time.sleep(0.05)  # don't outrun the broker's queue for the aggregator
            # At 100,000 nodes, also wait for the broker to have taken most of what was sent.
            client.wait_acked(backlog=5000)
    client.wait_acked()
    return len(states)


def send_load(
    client: RawPublisher,
    states: list[tuple[str, bytes]],
    events: list[tuple[str, bytes]],
    rate: float,
    seconds: float,
) -> tuple[int, int]:
    """``rate`` msg/s for ``seconds``: states, every node every STATE_INTERVAL; events fill
    the rest of the offered rate. (messages, of which states) sent."""
    state_rate = len(states) / STATE_INTERVAL
    first = client.sent  # event ids go on from the last window's
    start = time.monotonic()
    n = 0
    n_states = 0
    while (elapsed := time.monotonic() - start) < seconds:
        due = int(elapsed * rate) - n
        for _ in range(max(0, due)):
            now = time.time()
            if n_states < elapsed * state_rate:
                topic, payload = states[n_states % len(states)]
                n_states += 1
                client.publish(topic, stamp(payload, now), retain=True)
            else:
                topic, payload = events[n % len(events)]
                # A new id per event: the aggregator de-duplicates repeated ids.
                payload = payload.replace(b":bench:", f":bench{first + n}:".encode(), 1)
                client.publish(topic, stamp(payload, now))
            n += 1
        client.flush()
        time.sleep(0.01)
    client.wait_acked()
    return n, n_states


def generate(port: int, nodes: int, template_file: str) -> None:
    """The generator process: builds every payload once (at 100,000 nodes about 0.5 GB
    and a few seconds, so it is kept for every phase), prints "ready", then obeys lines on
    stdin: "initial" (every node's state once) or "load RATE SECONDS" (prints "go" as it
    starts); answers each with a JSON line of what it sent. It runs on the CPUs it
    inherits from the benchmark."""
    template = json.loads(Path(template_file).read_text())
    states = [state_payload(template, i, 0, _STAND_IN) for i in range(nodes)]
    events = [event_payload(i, i, _STAND_IN) for i in range(nodes)]
    client = RawPublisher(port, f"bench-gen-{os.getpid()}")
    print("ready", flush=True)
    for line in sys.stdin:
        command, *args = line.split()
        if command == "initial":
            result = {"sent": send_initial(client, states)}
        elif command == "load":
            print("go", flush=True)
            sent, n_states = send_load(client, states, events, float(args[0]), float(args[1]))
            result = {"sent": sent, "states": n_states}
        else:
            break
        print(json.dumps(result), flush=True)
    client.close()


class Generator:
    """The main process's handle on the generator subprocess."""

    def __init__(self, mqtt_port: int, nodes: int, template_file: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--generate", str(mqtt_port), str(nodes),
             str(template_file)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        self._expect("ready")

    def _send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def _line(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the load generator exited ({self.proc.wait()})")
        return line.strip()

    def _expect(self, word: str) -> None:
        if (line := self._line()) != word:
            raise RuntimeError(f"load generator: expected {word!r}, got {line!r}")

    def initial(self) -> int:
        self._send("initial")
        return int(json.loads(self._line())["sent"])

    def start_load(self, rate: float, seconds: float) -> None:
        self._send(f"load {rate} {seconds}")
        self._expect("go")

    def finish_load(self) -> int:
        return int(json.loads(self._line())["sent"])

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._send("quit")
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


# --- the aggregators ----------------------------------------------------------------------


def scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    totals: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("gpuagent_fleet_") and not line.startswith("#"):
            name = line.split("{")[0].split(" ")[0]
            totals[name] = totals.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return totals


def processed(port: int) -> float:
    totals = scrape(port)
    return totals.get("gpuagent_fleet_messages_received_total", 0.0) + totals.get(
        "gpuagent_fleet_messages_rejected_total", 0.0
    )


@dataclass
class Aggregator:
    proc: subprocess.Popen[bytes]
    api_port: int
    ps: psutil.Process = field(init=False)

    def __post_init__(self) -> None:
        self.ps = psutil.Process(self.proc.pid)

    def processed(self) -> float:
        return processed(self.api_port)

    def cpu_seconds(self) -> float:
        times = self.ps.cpu_times()
        return times.user + times.system

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                scrape(self.api_port)
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"the aggregator on :{self.api_port} did not start "
                        f"(exit {self.proc.poll()})"
                    ) from None
                time.sleep(0.1)
            else:
                return

    def peak_rss(self) -> float:
        """VmHWM, MB."""
        with Path(f"/proc/{self.proc.pid}/status").open() as status:
            return next(int(line.split()[1]) / 1e3 for line in status if line.startswith("VmHWM"))

    def nodes_known(self) -> int:
        url = f"http://127.0.0.1:{self.api_port}/api/v1/nodes?limit=1"
        with urllib.request.urlopen(url, timeout=60) as response:
            return int(json.load(response)["counts"]["nodes"])

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def aggregator_config(
    work: Path, index: int, api_port: int, mqtt_port: int, database: str, setup: Setup
) -> Path:
    """The aggregator's config file: its own HTTP port and MQTT client id; on PostgreSQL
    one share group, so that the broker splits the node messages between them."""
    postgres = database.startswith("postgresql://")
    client_id = "bench-aggregator" if setup.aggregators == 1 else f"bench-aggregator-{index}"
    text = (
        f'[aggregator]\nlisten = "127.0.0.1:{api_port}"\n'
        f'database = "{database}"\nshare_group = "{SHARE_GROUP if postgres else ""}"\n'
        f'[aggregator.broker]\nhost = "127.0.0.1"\nport = {mqtt_port}\ntls = false\n'
        f'client_id = "{client_id}"\n'
    )
    if postgres:
        text += f"[aggregator.postgres]\nrefresh_interval_seconds = {setup.refresh}\n"
    path = work / f"aggregator-{index}.toml"
    path.write_text(text)
    return path


def start_aggregator(config: Path, api_port: int, cpu: int) -> Aggregator:
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuagent.aggregator.cli", "run", "--config", str(config),
         "--log-level", "warning"],
    )  # fmt: skip
    pin(proc.pid, cpu)
    return Aggregator(proc, api_port)


# --- the databases ------------------------------------------------------------------------


class SqliteStore:
    def __init__(self, work: Path) -> None:
        self.path = work / "fleet.sqlite"
        self.url = str(self.path)

    def counters(self) -> dict[str, float]:
        return {}

    def rates(self, before: dict[str, float], after: dict[str, float], dt: float) -> list[Row]:
        del before, after, dt  # SQLite keeps no write counters
        return []

    def size_rows(self) -> list[Row]:
        wal = Path(f"{self.path}-wal")
        return [
            Row("SQLite database file", self.path.stat().st_size / 1e6, "MB"),
            Row("SQLite -wal file", wal.stat().st_size / 1e6 if wal.exists() else 0.0, "MB"),
        ]


class PostgresStore:
    """A throwaway PostgreSQL (fsync on, as in production) with one database, ``fleet``."""

    DATABASE = "fleet"

    def __init__(self, server: Any) -> None:
        self.server = server
        self.url = server.create_database(self.DATABASE)
        pid = int((server.root / "data" / "postmaster.pid").read_text().split()[0])
        self.postmaster = psutil.Process(pid)

    def cpu_seconds(self) -> dict[int, float]:
        """CPU seconds of the server's processes, by pid."""
        out: dict[int, float] = {}
        for proc in [self.postmaster, *self.postmaster.children(recursive=True)]:
            out |= _cpu(proc)
        return out

    def counters(self) -> dict[str, float]:
        rows, wal = self.server.run(
            "SELECT tup_inserted + tup_updated FROM pg_stat_database "
            f"WHERE datname = '{self.DATABASE}';"
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0');"
        )
        # Which tables the writes went to, a large column's TOAST table under its table's
        # name (the aggregator's names contain no "|").
        tables = self.server.run(
            "SELECT coalesce(o.relname || ' (TOAST)', s.relname) || '|' "
            "|| (s.n_tup_ins + s.n_tup_upd + s.n_tup_del) FROM pg_stat_all_tables s "
            "LEFT JOIN pg_class o ON o.reltoastrelid = s.relid "
            "WHERE s.schemaname NOT IN ('pg_catalog', 'information_schema');",
            self.DATABASE,
        )
        by_table = {f"table {t}": float(n) for t, n in (line.split("|") for line in tables)}
        return {"rows": float(rows), "wal": float(wal)} | by_table

    def rates(self, before: dict[str, float], after: dict[str, float], dt: float) -> list[Row]:
        rows = [
            Row("PostgreSQL rows written", (after["rows"] - before["rows"]) / dt, "rows/s"),
            Row("PostgreSQL WAL written", (after["wal"] - before["wal"]) / dt / 1e6, "MB/s"),
        ]
        written = {k: after[k] - before.get(k, 0.0) for k in after if k.startswith("table ")}
        rows += [Row(f"  rows/s, {k}", n / dt, "rows/s") for k, n in sorted(written.items()) if n]
        return rows

    def size_rows(self) -> list[Row]:
        size = self.server.run(f"SELECT pg_database_size('{self.DATABASE}');")[0]
        return [Row("PostgreSQL database size", int(size) / 1e6, "MB")]


Store = SqliteStore | PostgresStore


# --- measuring ----------------------------------------------------------------------------


@dataclass
class Sample:
    when: float
    processed: list[float]
    cpu: list[float]
    cores: list[tuple[float, float]]  # per CPU: (busy, total) seconds
    store: dict[str, float]
    # CPU seconds of what shares CPU 0, by name, then by pid (database connections come
    # and go: only those alive at both ends of a window count).
    helpers: dict[str, dict[int, float]]


def _cpu(proc: psutil.Process) -> dict[int, float]:
    try:
        times = proc.cpu_times()
    except psutil.Error:
        return {}
    return {proc.pid: times.user + times.system}


@dataclass
class Fleet:
    """What a run measures: the aggregators, their database, and the processes that share
    CPU 0 (broker, load generator, the benchmark itself as prober)."""

    aggregators: list[Aggregator]
    store: Store
    helpers: dict[str, psutil.Process] = field(default_factory=dict)

    def processed(self) -> float:
        return sum(a.processed() for a in self.aggregators)

    def sample(self) -> Sample:
        cores = [(sum(t) - t.idle - t.iowait, sum(t)) for t in psutil.cpu_times(percpu=True)]
        helpers = {name: _cpu(proc) for name, proc in self.helpers.items()}
        if isinstance(self.store, PostgresStore):
            helpers["PostgreSQL"] = self.store.cpu_seconds()
        return Sample(
            time.monotonic(),
            [a.processed() for a in self.aggregators],
            [a.cpu_seconds() for a in self.aggregators],
            cores,
            self.store.counters(),
            helpers,
        )


@dataclass
class Window:
    """What happened between two samples, per second."""

    before: Sample
    after: Sample
    sent: int = 0

    @property
    def seconds(self) -> float:
        return self.after.when - self.before.when

    @property
    def rates(self) -> list[float]:
        pairs = zip(self.before.processed, self.after.processed, strict=True)
        return [(b - a) / self.seconds for a, b in pairs]

    @property
    def cpu(self) -> list[float]:
        """Each aggregator's CPU, as a fraction of a core."""
        pairs = zip(self.before.cpu, self.after.cpu, strict=True)
        return [(b - a) / self.seconds for a, b in pairs]

    @property
    def cores(self) -> list[float]:
        """How busy each CPU was, a fraction."""
        pairs = zip(self.before.cores, self.after.cores, strict=True)
        return [(b[0] - a[0]) / max(b[1] - a[1], 1e-9) for a, b in pairs]

    @property
    def helpers(self) -> dict[str, float]:
        """CPU of what shares CPU 0, by name, as a fraction of a core."""
        out = {}
        for name, after in self.after.helpers.items():
            before = self.before.helpers.get(name, {})
            used = sum(s - before[pid] for pid, s in after.items() if pid in before)
            out[name] = used / self.seconds
        return out

    @property
    def per_core(self) -> list[float]:
        """Messages one aggregator handles per CPU-second: what one core would carry."""
        return [r / c if c else 0.0 for r, c in zip(self.rates, self.cpu, strict=True)]


@dataclass
class Probes:
    first: list[float] = field(default_factory=list)
    every: list[float] = field(default_factory=list)
    published: int = 0
    missed: int = 0


def _shows(api_port: int, cluster: str, node: str, sent: float) -> bool:
    url = f"http://127.0.0.1:{api_port}/api/v1/nodes/{node}?cluster={cluster}"
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            seen = json.load(response)["last_seen"]
    except (OSError, ValueError, KeyError):
        return False
    # A database may keep the time to the microsecond only: equal within a millisecond.
    return isinstance(seen, int | float) and abs(seen - sent) < 1e-3


def probe(
    mqtt_port: int,
    api_ports: list[int],
    template: dict[str, Any],
    seconds: float,
    nodes: int,
    jitter: float = 0.0,
) -> Probes:
    """Publish a state with the current time; poll every API until each shows it. The
    first API to show it is the one that consumed it; the last shows how stale the other
    aggregators' fleet view is. Between probes a random pause of up to ``jitter``: a probe
    finishes just after a view refresh, and the next one, sent a fixed time later, would
    always wait nearly a whole refresh interval."""
    client = connect(mqtt_port, "bench-prober")
    probes = Probes()
    end = time.monotonic() + seconds
    k = 0
    while time.monotonic() < end:
        k += 1
        i = nodes + k % 100  # nodes of their own, so no other report hides the probe
        cluster, node = node_name(i)
        sent = time.time()
        topic, payload = state_payload(template, i, k, sent)
        client.publish(topic, payload, qos=1)
        probes.published += 1
        seen: dict[int, float] = {}
        deadline = time.monotonic() + PROBE_TIMEOUT
        while len(seen) < len(api_ports) and time.monotonic() < deadline:
            for port in api_ports:
                if port not in seen and _shows(port, cluster, node, sent):
                    seen[port] = time.time() - sent
            time.sleep(0.02)
        if seen:
            probes.first.append(min(seen.values()))
        if len(seen) == len(api_ports):
            probes.every.append(max(seen.values()))
        else:
            probes.missed += 1
        time.sleep(0.05 + random.uniform(0.0, jitter))
    client.loop_stop()
    client.disconnect()
    return probes


# --- one configuration --------------------------------------------------------------------


@dataclass(frozen=True)
class Setup:
    database: str
    aggregators: int
    nodes: int
    rate: float
    quick: bool
    refresh: float
    # The plain run (scripts/bench) keeps its name: bench/results/aggregator.json.
    plain: bool = False
    # A core for each aggregator, the broker, generator and database floating between them.
    spread: bool = False

    @property
    def aggregator_cpus(self) -> list[int]:
        cores = os.cpu_count() or 1
        if self.spread:
            return [i % cores for i in range(self.aggregators)]
        return [min(AGGREGATOR_CPU, cores - 1)] * self.aggregators

    @property
    def name(self) -> str:
        if self.plain:
            return "aggregator"
        name = f"aggregator-{self.database}-{self.aggregators}x-{self.nodes}"
        if self.refresh != DEFAULT_REFRESH:
            name += f"-refresh{self.refresh:g}"
        return f"{name}-spread" if self.spread else name

    @property
    def window(self) -> float:
        return 12.0 if self.quick else 45.0


@dataclass
class Results:
    first: float = 0.0
    initial_sent: int = 0
    sustained: Window | None = None
    capacity: Window | None = None
    probes: Probes = field(default_factory=Probes)
    store_rates: list[Row] = field(default_factory=list)
    lost: float = 0.0
    total_sent: int = 0
    idle: Window | None = None


def mosquitto_config(work: Path, mqtt_port: int) -> Path:
    path = work / "mosquitto.conf"
    path.write_text(
        f"listener {mqtt_port} 127.0.0.1\nallow_anonymous true\n"
        # A consumer that is briefly behind must not lose QoS 1 messages.
        "max_queued_messages 1000000\nmax_inflight_messages 1000\n"
        + ("user root\n" if os.geteuid() == 0 else "")
    )
    return path


def load_window(
    fleet: Fleet,
    generator: Generator,
    rate: float,
    seconds: float,
    during: Callable[[float], T],
) -> tuple[Window, T]:
    """Offer ``rate`` for ``seconds``; sample after a 1 s ramp and 1 s before the end,
    running ``during(window seconds)`` in between."""
    generator.start_load(rate, seconds)
    time.sleep(1.0)  # ramp
    before = fleet.sample()
    result = during(seconds - 2.0)
    after = fleet.sample()
    return Window(before, after, generator.finish_load()), result


def first_reports(fleet: Fleet, generator: Generator, nodes: int) -> float:
    """Every node's first report; seconds until all are processed."""
    started = time.monotonic()
    generator.initial()
    deadline = time.monotonic() + 600
    while fleet.processed() < nodes:
        if time.monotonic() > deadline:
            raise RuntimeError("the first reports were not all processed within 10 minutes")
        time.sleep(0.5)
    return time.monotonic() - started


def drain(fleet: Fleet, total: int, timeout: float = 120.0) -> float:
    """Wait until everything sent is processed; what is still missing then."""
    deadline = time.monotonic() + timeout
    while (done := fleet.processed()) < total:
        if time.monotonic() > deadline:
            break
        time.sleep(0.5)
    return total - done


def measure(setup: Setup, mqtt_port: int, fleet: Fleet, work: Path) -> Results:
    template = status_template()
    template_file = work / "status.json"
    template_file.write_text(json.dumps(template))
    generator = Generator(mqtt_port, setup.nodes, template_file)
    fleet.helpers["load generator"] = psutil.Process(generator.proc.pid)
    results = Results()
    try:
        results.first = first_reports(fleet, generator, setup.nodes)
        results.initial_sent = setup.nodes
        # The target load, probed for latency.
        ports = [a.api_port for a in fleet.aggregators]
        jitter = setup.refresh if setup.aggregators > 1 else 0.0
        results.sustained, results.probes = load_window(
            fleet, generator, setup.rate, setup.window,
            lambda s: probe(mqtt_port, ports, template, s, setup.nodes, jitter),
        )  # fmt: skip
        w = results.sustained
        results.store_rates = fleet.store.rates(w.before.store, w.after.store, w.seconds)
        # More than it can take, for the capacity.
        results.capacity, _ = load_window(
            fleet, generator, setup.rate * 3, setup.window / 3, time.sleep
        )
    finally:
        del fleet.helpers["load generator"]
        generator.close()
    results.total_sent = (
        results.initial_sent
        + results.sustained.sent
        + results.probes.published
        + results.capacity.sent
    )
    results.lost = drain(fleet, results.total_sent)
    # No load: what keeping the fleet view fresh costs on its own.
    time.sleep(1.0)
    before = fleet.sample()
    time.sleep(5.0)
    results.idle = Window(before, fleet.sample())
    return results


def _labels(n: int) -> list[str]:
    return [""] if n == 1 else [f", aggregator {i + 1}" for i in range(n)]


def latency_rows(setup: Setup, probes: Probes) -> list[Row]:
    def ms(samples: list[float], pct: float) -> float:
        return percentile(samples, pct) * 1000 if samples else float("nan")

    def p99_ok(samples: list[float]) -> bool:
        return bool(samples) and percentile(samples, 99) < 1.0

    if setup.aggregators == 1:
        return [
            Row("publish to API p50", ms(probes.first, 50), "ms"),
            Row("publish to API p99", ms(probes.first, 99), "ms", "< 1000", p99_ok(probes.first)),
            Row("probes", len(probes.first), "samples"),
        ]
    return [
        Row("publish to first API p50", ms(probes.first, 50), "ms"),
        Row("publish to first API p99", ms(probes.first, 99), "ms", "< 1000",
            p99_ok(probes.first)),
        Row("publish to every API p50", ms(probes.every, 50), "ms"),
        Row("publish to every API p99", ms(probes.every, 99), "ms", "< 1000",
            p99_ok(probes.every)),
        Row("publish to every API max", ms(probes.every, 100), "ms"),
        Row("probes", len(probes.every), "samples"),
        Row(f"probes not on every API in {PROBE_TIMEOUT:g} s", probes.missed, "probes", "0",
            probes.missed == 0),
    ]  # fmt: skip


def load_rows(setup: Setup, w: Window, what: str, when: str) -> list[Row]:
    """Processed msg/s and CPU, in total and per aggregator, for one window; ``when``
    names the window in the CPU rows."""
    labels = _labels(setup.aggregators)
    total = sum(w.rates)
    rows = [Row(what, total, "msg/s", f"≥ {setup.rate:.0f}", round(total) >= round(setup.rate))]
    if setup.aggregators > 1:
        rows += [
            Row(f"{what}{label}", r, "msg/s") for label, r in zip(labels, w.rates, strict=True)
        ]
    names = ["aggregator"] if setup.aggregators == 1 else labels
    rows += [
        Row(f"{name.lstrip(', ')} CPU {when}", c * 100, "% of a core")
        for name, c in zip(names, w.cpu, strict=True)
    ]
    # How busy each core was: a core at 100 % that the aggregators do not fill means the
    # broker, the generator or the database was the limit, or, on a shared host, other work.
    cpus = setup.aggregator_cpus
    for core, busy in enumerate(w.cores):
        rows.append(Row(f"CPU {core} busy {when}", busy * 100, "%"))
        mine = sum(c for c, at in zip(w.cpu, cpus, strict=True) if at == core)
        if mine:
            rows.append(Row(f"CPU {core} busy {when}, not aggregators", (busy - mine) * 100, "%"))
    rows += [Row(f"  {name} CPU {when}", c * 100, "% of a core") for name, c in w.helpers.items()]
    return rows


def capacity_rows(setup: Setup, w: Window) -> list[Row]:
    """Per-core figures: with two aggregators on one core, what each would carry on a core of
    its own is the messages it handled per CPU-second it used."""
    labels = _labels(setup.aggregators)
    rows = [
        Row(f"capacity per core, derived{label}", c, "msg/s")
        for label, c in zip(labels, w.per_core, strict=True)
    ]
    if setup.aggregators > 1:
        rows.append(Row("capacity, one core each, derived (sum)", sum(w.per_core), "msg/s"))
    return rows


def memory_rows(setup: Setup, aggregators: list[Aggregator]) -> list[Row]:
    # The 500 MB target is for 10,000 nodes; a larger fleet is held to it scaled.
    limit = 500.0 * max(1.0, setup.nodes / NODES)
    rows = []
    for label, a in zip(_labels(setup.aggregators), aggregators, strict=True):
        rss, hwm = a.ps.memory_info().rss / 1e6, a.peak_rss()
        rows += [
            Row(f"aggregator RSS{label}", rss, "MB", f"< {limit:g}", rss < limit),
            Row(f"aggregator peak RSS{label}", hwm, "MB", f"< {limit:g}", hwm < limit),
        ]
    return rows


def idle_rows(setup: Setup, w: Window | None) -> list[Row]:
    """CPU with no messages: on PostgreSQL, refreshing the fleet view from the database."""
    if w is None:
        return []
    names = ["aggregator"] if setup.aggregators == 1 else _labels(setup.aggregators)
    return [
        Row(f"{name.lstrip(', ')} CPU idle, no load", c * 100, "% of a core")
        for name, c in zip(names, w.cpu, strict=True)
    ]


def result_rows(setup: Setup, results: Results, fleet: Fleet) -> list[Row]:
    assert results.sustained is not None
    assert results.capacity is not None
    sustained, capacity = results.sustained, results.capacity
    rows = [
        Row(f"nodes known{label}", a.nodes_known(), "nodes")
        for label, a in zip(_labels(setup.aggregators), fleet.aggregators, strict=True)
    ]
    rows += [
        Row("first report of every node", results.first, "s"),
        Row("offered load", sustained.sent / setup.window, "msg/s"),
        *load_rows(setup, sustained, "processed, sustained", "at that load"),
        *results.store_rates,
        Row("offered for capacity", capacity.sent / (setup.window / 3), "msg/s"),
        *load_rows(setup, capacity, "capacity (offered 3x that)", "at capacity"),
        *capacity_rows(setup, capacity),
        *idle_rows(setup, results.idle),
        Row("messages lost", results.lost, "msgs", "0", results.lost <= 0),
        *latency_rows(setup, results.probes),
        *fleet.store.size_rows(),
        *memory_rows(setup, fleet.aggregators),
    ]
    return rows


@contextlib.contextmanager
def database(setup: Setup, work: Path) -> Iterator[Store]:
    if setup.database == "sqlite":
        yield SqliteStore(work)
        return
    from postgres_server import throwaway_postgres  # noqa: PLC0415 - only for PostgreSQL

    # fsync on: the write rate and latency are those of a durable database.
    with throwaway_postgres(fsync=True) as server:
        yield PostgresStore(server)


def run(setup: Setup) -> int:
    mosquitto = shutil.which("mosquitto", path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")
    if mosquitto is None:
        print("bench/aggregator.py: mosquitto is not installed", file=sys.stderr)
        return 1
    if not setup.spread:
        # Everything started from here (broker, PostgreSQL, generator) inherits CPU 0; the
        # aggregators are moved to CPU 1.
        pin(0, INFRA_CPU)
    with contextlib.ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="gpuagent-aggbench-")))
        store = stack.enter_context(database(setup, work))
        mqtt_port = free_port()
        broker = subprocess.Popen([mosquitto, "-c", str(mosquitto_config(work, mqtt_port))])
        stack.callback(broker.wait, timeout=10)
        stack.callback(broker.terminate)
        time.sleep(0.5)
        aggregators = []
        for index in range(1, setup.aggregators + 1):
            api_port = free_port()
            config = aggregator_config(work, index, api_port, mqtt_port, store.url, setup)
            cpu = setup.aggregator_cpus[index - 1]
            aggregators.append(start_aggregator(config, api_port, cpu))
            stack.callback(aggregators[-1].stop)
        for a, cpu in zip(aggregators, setup.aggregator_cpus, strict=True):
            a.wait_ready()
            pin_threads(a.proc.pid, cpu)
        fleet = Fleet(
            aggregators,
            store,
            {"mosquitto": psutil.Process(broker.pid), "prober (this process)": psutil.Process()},
        )
        results = measure(setup, mqtt_port, fleet, work)
        rows = result_rows(setup, results, fleet)
    return report(
        rows, setup.name, digits=1, quick=setup.quick, offered_rate=setup.rate,
        nodes=setup.nodes, database=setup.database, aggregators=setup.aggregators,
        refresh_interval_seconds=setup.refresh if setup.database == "postgresql" else None,
        postgres_fsync=True if setup.database == "postgresql" else None,
        pinning={"aggregators": setup.aggregator_cpus,
                 "broker, generator, prober, database": "any" if setup.spread else INFRA_CPU},
        # Every probe, for the distribution behind the percentiles.
        probes_ms={"first_api": [round(x * 1000, 1) for x in results.probes.first],
                   "every_api": [round(x * 1000, 1) for x in results.probes.every]},
    )  # fmt: skip


def matrix(quick: bool, refresh: float) -> int:
    """Every configuration of MATRIX, each in a process of its own; 1 if any failed."""
    status = 0
    for db, n, nodes in MATRIX:
        print(f"\n## {db}, {n} aggregator{'s' if n > 1 else ''}, {nodes:,} nodes", flush=True)
        command = [sys.executable, __file__, "--database", db, "--aggregators", str(n),
                   "--nodes", str(nodes), "--refresh", str(refresh)]  # fmt: skip
        code = subprocess.run([*command, *(["--quick"] if quick else [])], check=False)
        status |= code.returncode != 0
    return status


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a 12 s load window, not 45 s")
    parser.add_argument("--nodes", type=int, help=f"simulated nodes (default {NODES})")
    parser.add_argument(
        "--rate", type=float,
        help=f"offered messages/s (default: the larger of {MIN_RATE:g} and "
        f"nodes/{STATE_INTERVAL:g} + {EVENT_RATE:g})",
    )  # fmt: skip
    parser.add_argument("--database", choices=("sqlite", "postgresql"))
    parser.add_argument("--aggregators", type=int, choices=(1, 2))
    parser.add_argument(
        "--refresh", type=float, default=DEFAULT_REFRESH,
        help="PostgreSQL: each aggregator's fleet view refresh interval, s (default 1)",
    )  # fmt: skip
    parser.add_argument(
        "--spread", action="store_true",
        help="a core for each aggregator; broker, generator and database on any core",
    )  # fmt: skip
    parser.add_argument("--matrix", action="store_true", help="every configuration in turn")
    # The load generator's own process (internal).
    parser.add_argument("--generate", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.generate:
        port, nodes, template_file = args.generate
        generate(int(port), int(nodes), template_file)
        return 0
    if args.matrix:
        return matrix(args.quick, args.refresh)
    nodes = args.nodes or NODES
    setup = Setup(
        database=args.database or "sqlite",
        aggregators=args.aggregators or 1,
        nodes=nodes,
        rate=args.rate or default_rate(nodes),
        quick=args.quick,
        refresh=args.refresh,
        plain=args.nodes is None and args.database is None and args.aggregators is None,
        spread=args.spread,
    )
    if setup.aggregators > 1 and setup.database != "postgresql":
        parser.error("--aggregators 2 needs --database postgresql (they share its database)")
    return run(setup)


if __name__ == "__main__":
    sys.exit(main())
