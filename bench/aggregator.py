"""Aggregator benchmark: 10,000 simulated nodes through a local mosquitto into one
aggregator pinned to one core.

    scripts/bench             (runs this after the node benchmarks)
    .venv/bin/python bench/aggregator.py [--quick]

Time is compressed: every node sends its state report first (a real 8-GPU status
document from the simulator), then a load generator keeps up a fixed offered rate of
state reports (each node every 30 s, as agents do) plus bursts of kernel events, while a
prober publishes a state report with the current time and polls the API until it shows
it. Measures the aggregator's sustained processed messages/s (its own counters), p99
publish-to-API latency, CPU, and RSS. Prints a table; writes bench/results/aggregator.json.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import paho.mqtt.client as paho
import psutil
from paho.mqtt.enums import CallbackAPIVersion

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "agent"))

from gpuagent.aggregator import paho_tables  # noqa: E402
from gpuagent.fleet import schema  # noqa: E402
from report import Row, free_port, percentile, report  # noqa: E402 - bench/ is the script's directory

PREFIX = "gpuagent/v1"
NODES = 10_000
CLUSTERS = 4
STATE_INTERVAL = 30.0
# The aggregator gets CPU 1; mosquitto, the generator and the prober share CPU 0.
AGGREGATOR_CPU = 1


def pin(pid: int, cpu: int) -> None:
    if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) > cpu:
        os.sched_setaffinity(pid, {cpu})


def status_template() -> dict:
    """A real status document: the simulated 8-GPU H100 node, checked once."""
    out = subprocess.run(
        [sys.executable, "-m", "gpuagent", "check", "--json", "--simulate",
         str(REPO / "scenarios" / "h100-healthy.toml")],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    return json.loads(out.stdout)


def node_name(i: int) -> tuple[str, str]:
    return f"c{i % CLUSTERS}", f"node{i:05d}"


def state_payload(template: dict, i: int, sequence: int, when: float) -> tuple[str, bytes]:
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

    def close(self, timeout: float = 30.0) -> None:
        self.flush()
        deadline = time.monotonic() + timeout
        while self.acked < self.sent and time.monotonic() < deadline:
            time.sleep(0.02)
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


def generate(port: int, rate: float, seconds: float, template_file: str) -> None:
    """Load generator (a subprocess): with ``seconds`` 0, every node's state once; else
    ``rate`` msg/s for ``seconds``. Prints "go" when it starts sending."""
    pin(0, 0)
    template = json.loads(Path(template_file).read_text())
    initial = seconds == 0
    states = [state_payload(template, i, 0, _STAND_IN) for i in range(NODES)]
    events = [event_payload(i, i, _STAND_IN) for i in range(NODES)]
    client = RawPublisher(port, f"bench-gen-{os.getpid()}")
    if initial:
        for i, (topic, payload) in enumerate(states):
            client.publish(topic, stamp(payload, time.time()), retain=True)
            if i % 500 == 0:
                client.flush()
                time.sleep(0.05)  # don't outrun the broker's queue for the aggregator
    print("go", flush=True)
    # States: every node every STATE_INTERVAL; events fill the rest of the offered rate.
    state_rate = NODES / STATE_INTERVAL
    start = time.monotonic()
    n = 0
    n_states = 0
    while (elapsed := time.monotonic() - start) < seconds:
        due = int(elapsed * rate) - n
        for _ in range(max(0, due)):
            now = time.time()
            if n_states < elapsed * state_rate:
                topic, payload = states[n_states % NODES]
                n_states += 1
                client.publish(topic, stamp(payload, now), retain=True)
            else:
                topic, payload = events[n % NODES]
                # A new id per event: the aggregator de-duplicates repeated ids.
                payload = payload.replace(b":bench:", f":bench{n}:".encode(), 1)
                client.publish(topic, stamp(payload, now))
            n += 1
        client.flush()
        time.sleep(0.01)
    client.close()
    print(json.dumps({"sent": n, "states": n_states}), flush=True)


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


def probe(mqtt_port: int, api_port: int, template: dict, seconds: float) -> list[float]:
    """Publish a state with the current time, poll the API until it shows it."""
    client = connect(mqtt_port, "bench-prober")
    latencies = []
    end = time.monotonic() + seconds
    k = 0
    while time.monotonic() < end:
        k += 1
        i = NODES + k % 100  # nodes of their own, so no other report hides the probe
        cluster, node = node_name(i)
        sent = time.time()
        topic, payload = state_payload(template, i, k, sent)
        client.publish(topic, payload, qos=1)
        url = f"http://127.0.0.1:{api_port}/api/v1/nodes/{node}?cluster={cluster}"
        while time.monotonic() < end + 5:
            try:
                with urllib.request.urlopen(url, timeout=5) as response:
                    if json.load(response)["last_seen"] == sent:
                        latencies.append(time.time() - sent)
                        break
            except OSError:
                pass
            time.sleep(0.02)
        time.sleep(0.05)
    client.loop_stop()
    client.disconnect()
    return latencies


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a 10 s load window")
    parser.add_argument("--rate", type=float, default=5000.0, help="offered messages/s")
    parser.add_argument("--generate", nargs=4, metavar=("PORT", "RATE", "SECONDS", "TEMPLATE"))
    args = parser.parse_args()
    if args.generate:
        port, rate, seconds, template_file = args.generate
        generate(int(port), float(rate), float(seconds), template_file)
        return 0
    mosquitto = shutil.which("mosquitto", path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")
    if mosquitto is None:
        print("bench/aggregator.py: mosquitto is not installed", file=sys.stderr)
        return 1
    seconds = 12.0 if args.quick else 45.0
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="gpuagent-aggbench-") as tmp:
        work = Path(tmp)
        mqtt_port, api_port = free_port(), free_port()
        (work / "mosquitto.conf").write_text(
            f"listener {mqtt_port} 127.0.0.1\nallow_anonymous true\n"
            # A consumer that is briefly behind must not lose QoS 1 messages.
            "max_queued_messages 1000000\nmax_inflight_messages 1000\n"
            + ("user root\n" if os.geteuid() == 0 else "")
        )
        (work / "aggregator.toml").write_text(
            f'[aggregator]\nlisten = "127.0.0.1:{api_port}"\n'
            f'database = "{work / "fleet.sqlite"}"\nshare_group = ""\n'
            f'[aggregator.broker]\nhost = "127.0.0.1"\nport = {mqtt_port}\ntls = false\n'
            'client_id = "bench-aggregator"\n'
        )
        broker = subprocess.Popen([mosquitto, "-c", str(work / "mosquitto.conf")])
        pin(broker.pid, 0)
        pin(0, 0)
        time.sleep(0.5)
        aggregator = subprocess.Popen(
            [sys.executable, "-m", "gpuagent.aggregator.cli", "run", "--config",
             str(work / "aggregator.toml"), "--log-level", "warning"],
        )  # fmt: skip
        pin(aggregator.pid, AGGREGATOR_CPU)
        try:
            for _ in range(100):
                try:
                    scrape(api_port)
                    break
                except OSError:
                    time.sleep(0.1)
            template = status_template()
            template_file = work / "status.json"
            template_file.write_text(json.dumps(template))
            proc = psutil.Process(aggregator.pid)
            # Phase 1: every node's first report.
            started = time.monotonic()
            subprocess.run(
                [sys.executable, __file__, "--generate", str(mqtt_port), str(args.rate), "0",
                 str(template_file)],
                check=True, stdout=subprocess.DEVNULL,
            )  # fmt: skip
            while processed(api_port) < NODES:
                time.sleep(0.5)
            first = time.monotonic() - started

            # Phase 2: the target load, probed for latency.
            def run_load(
                rate: float, window: float, probed: bool
            ) -> tuple[float, float, int, list[float]]:
                generator = subprocess.Popen(
                    [sys.executable, __file__, "--generate", str(mqtt_port), str(rate),
                     str(window), str(template_file)],
                    stdout=subprocess.PIPE, text=True,
                )  # fmt: skip
                assert generator.stdout is not None
                assert generator.stdout.readline().strip() == "go"
                time.sleep(1.0)  # ramp
                before, cpu_before, t0 = processed(api_port), proc.cpu_times(), time.monotonic()
                if probed:
                    latencies = probe(mqtt_port, api_port, template, window - 2.0)
                else:
                    latencies = []
                    time.sleep(window - 2.0)
                after, cpu_after, t1 = processed(api_port), proc.cpu_times(), time.monotonic()
                out, _ = generator.communicate(timeout=120)
                sent = int(json.loads(out.strip().splitlines()[-1])["sent"])
                cpu = cpu_after.user + cpu_after.system - cpu_before.user - cpu_before.system
                return (after - before) / (t1 - t0), cpu / (t1 - t0), sent, latencies

            rate, cpu, sent, latencies = run_load(args.rate, seconds, probed=True)
            # Phase 3: more than it can take, for its capacity.
            capacity, capacity_cpu, overload_sent, _ = run_load(
                args.rate * 3, seconds / 3, probed=False
            )
            # Drain: everything sent is processed (nothing lost on the way).
            total_sent = NODES + sent + len(latencies) + overload_sent
            deadline = time.monotonic() + 60
            while processed(api_port) < total_sent and time.monotonic() < deadline:
                time.sleep(0.5)
            final = processed(api_port)
            rss = proc.memory_info().rss / 1e6
            with Path(f"/proc/{aggregator.pid}/status").open() as status:
                hwm = next(
                    int(line.split()[1]) / 1e3 for line in status if line.startswith("VmHWM")
                )
            nodes = json.load(urllib.request.urlopen(f"http://127.0.0.1:{api_port}/api/v1/nodes"))
            rows += [
                Row("nodes known", len(nodes["nodes"]), "nodes"),
                Row("first report of every node", first, "s"),
                Row("offered load", sent / seconds, "msg/s"),
                Row("processed, sustained", rate, "msg/s", "≥ 5000", rate >= 5000),
                Row("aggregator CPU at that load", cpu * 100, "% of a core"),
                Row("capacity (offered 3x that)", capacity, "msg/s", "≥ 5000", capacity >= 5000),
                Row("aggregator CPU at capacity", capacity_cpu * 100, "% of a core"),
                Row("messages lost", total_sent - final, "msgs", "0", final >= total_sent),
                Row("publish to API p50", percentile(latencies, 50) * 1000, "ms"),
                Row("publish to API p99", percentile(latencies, 99) * 1000, "ms", "< 1000",
                    percentile(latencies, 99) < 1.0),
                Row("probes", len(latencies), "samples"),
                Row("aggregator RSS", rss, "MB", "< 500", rss < 500),
                Row("aggregator peak RSS", hwm, "MB", "< 500", hwm < 500),
            ]  # fmt: skip
        finally:
            aggregator.terminate()
            aggregator.wait(timeout=15)
            broker.terminate()
            broker.wait(timeout=10)
    return report(rows, "aggregator", digits=1, quick=args.quick, offered_rate=args.rate)


if __name__ == "__main__":
    sys.exit(main())
