"""Fleet correlation benchmark: the real aggregator, its store on disk, fed kernel records
of NVLink-domain cascades, with an empty store and with a large history.

    scripts/bench             (runs this after the aggregator benchmark)
    .venv/bin/python bench/correlation.py [--quick] [--seconds S] [--rate EVENTS_S]
        [--history-events N] [--history-incidents N] [--history-samples N] [--profile]

The fleet: 560 GB200 NVL72 racks (NVLink domains of 18 four-GPU compute trays, 10,080
nodes in 4 clusters), each node's state report a real status document of the simulator's
GB200 tray with its rack's NVLink domain (cluster UUID, clique 32766), platform place and
Slurm job. Kernel records are built as a node builds them (the line parsed by the agent's
kernel-log parser, `schema.kernel_event_message`): 95 % are cascades, a fatal Xid 149
link-down on one GPU of a rack and, over the next ~5 s, Xid 145, 45 ("caused by previous
Xid 145") and 154 on every other GPU of the rack (214 records a cascade); 5 % are
unrelated single-GPU faults (Xid 13, 31, 43, 48, 79, 94, 119) on the trays of the racks
no cascade is in. Each node also reports its state every 30 s (336 reports/s).

Everything runs in this process on one core (CPU 1; mosquitto on CPU 0): the real
`Aggregator` (SQLite file, writer, correlation tick every 0.5 s, HTTP, its MQTT consumer
connected to a local mosquitto), and a feeder task in the same event loop that hands each
message to `Ingest.handle` and its answers to `Consumer.send_when_written`, as the
consumer does with a delivered message (so the acknowledgements to nodes are published
after each commit, as in service). The broker's delivery and paho's decoding are not in
it: per message they cost the same with correlation on or off.

1. Capacity per core, correlation off and on, in alternating rounds, each run in a fresh
   process (its payloads built and frozen, then a fresh aggregator with every node's state
   report stored first, so no run inherits the heap or the collector's generations of
   another): the messages of the schedule below handed over as fast as the loop takes
   them; messages per CPU-second of the process (every thread: the writer, the tick, the
   acknowledgements), the feeder's own cost (measured with a no-op handler) taken out.
   The drop is the median of the rounds' (off first in every other round).
2. Offered load, empty store, correlation off and then on: `--rate` (1,000) kernel
   events/s plus the state reports, on a fixed schedule (open loop) for `--seconds` (60)
   plus the last cascades' tail. Per message, the time from when it was due to when
   `Ingest.handle` returned: a message that waits behind a batch, a tick, a garbage
   collection or the acknowledgements counts its wait. Measured over the steady part
   (after the first cascades' records have all begun). Capacity per core is derived from
   the CPU each message took here too, the cascades at their own pace (a growing
   incident's document is rewritten as the correlator paces it, several times while its
   records come; at saturation the same records come faster, between fewer ticks). With
   correlation on, every tick of the real service (`Aggregator._correlate`:
   `Correlator.tick`, then each changed incident's JSON queued for the store) is timed,
   and every incident version's commit: the delay from its last member's message
   reaching the aggregator to the row holding it committed. At the end the incidents
   are read back with the store's `incidents()` and each cascade checked: one incident,
   its root the Xid 149 GPU, 214 records on 72 GPUs.
3. The same, after loading a history into the SQLite file with bulk SQL inserts (events,
   incidents and history samples of 10,080 nodes spread over 30 days; the retention
   settings raised to keep all of it), compared with 2.

The benchmark's own payloads are frozen out of the garbage collector (`gc.freeze`) before
any aggregator starts: a real aggregator does not hold them. The aggregator's full
collections (generation 2) are timed: each stops the event loop while it runs.

Prints a table; writes bench/results/correlation.json. Exits 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import cProfile
import dataclasses
import gc
import json
import logging
import math
import os
import pstats
import random
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "agent"))

from aggregator import mosquitto_config, pin, pin_threads  # noqa: E402 - bench/ is on the path
from gpuagent.aggregator.correlate import Correlator  # noqa: E402
from gpuagent.aggregator.history import HistoryRecorder  # noqa: E402
from gpuagent.aggregator.ingest import Outgoing  # noqa: E402
from gpuagent.aggregator.records import from_online_state  # noqa: E402
from gpuagent.aggregator.service import Aggregator  # noqa: E402
from gpuagent.aggregator.store import FleetStore  # noqa: E402
from gpuagent.config import AggregatorSection, CorrelationSection, MqttConnection  # noqa: E402
from gpuagent.fleet import schema  # noqa: E402
from gpuagent.kernel.parse import canonical_pci, parse_message  # noqa: E402
from gpuagent.model import GpuEvent  # noqa: E402
from report import Row, free_port, percentile, report  # noqa: E402

PREFIX = "gpuagent/v1"
CLUSTERS = 4
DOMAINS = 560  # GB200 NVL72 racks
TRAYS = 18  # compute trays (nodes) per rack
GPUS = 4  # GPUs per tray
NODES = DOMAINS * TRAYS
# Cascades go round the first CASCADE_DOMAINS racks (a rack's next one comes long after its
# incident closed); unrelated faults fall on the trays of the others.
CASCADE_DOMAINS = 400
CLIQUE = 32766  # the GB200/GB300 racks' sentinel clique: the cluster UUID tells them apart
STATE_INTERVAL = 30.0
UNRELATED_SHARE = 0.05
# A cascade's consequences come within this long of its root record.
CASCADE_SPREAD = 5.0
RECORDS_PER_CASCADE = 1 + (TRAYS * GPUS - 1) * 3

# Targets (docs/benchmarks.md).
EVENT_RATE_TARGET = 1000.0
LATENCY_P99_TARGET_MS = 50.0
PUBLISH_TARGET_S = 10.0
CAPACITY_DROP_TARGET_PCT = 10.0

AGGREGATOR_CPU = 1
INFRA_CPU = 0
# A feeder burst: messages handed over before it lets the loop run (the writer's
# callbacks, the tick, the acknowledgements), as paho hands over one socket read's.
BURST = 32
DAY = 86400.0
HISTORY_DAYS = 30

# Real kernel lines (tests/test_aggregator_correlate.py: ../shared/data/kmsg_corpus.tsv
# and the public NVL72 incident), the GPU's PCI address filled in.
LINK_DOWN = "NVRM: Xid (PCI:{pci}): 149, pid={pid}, name=python3, NETIR_LINK_EVT Fatal XC0 i0 Link 14 (0x00000001 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)"  # noqa: E501
DOWNSTREAM = "NVRM: Xid (PCI:{pci}): 145, pid={pid}, name=python3, RLW_TAGSTATE Fatal XC0 i0 Link 03 (0x00000004 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)"  # noqa: E501
TEARDOWN = "NVRM: Xid (PCI:{pci}): 45, pid={pid}, name=python3, Ch 00000008, errorString CTX SWITCH TIMEOUT, caused by previous Xid 145"  # noqa: E501
RECOVERY = "NVRM: Xid (PCI:{pci}): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)"  # noqa: E501
UNRELATED = (
    "NVRM: Xid (PCI:{pci}): 13, pid={pid}, name=python3, Graphics SM Warp Exception on (GPC 7, TPC 7, SM 0): Illegal Instruction Parameter",  # noqa: E501
    "NVRM: Xid (PCI:{pci}): 31, pid={pid}, name=python3, Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_8 faulted @ 0x73ac_1c000000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_WRITE",  # noqa: E501
    "NVRM: Xid (PCI:{pci}): 43, pid={pid}, name=python3, Ch 00000010",
    "NVRM: Xid (PCI:{pci}): 48, pid={pid}, name=python3, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 6, subpartition 0.",  # noqa: E501
    "NVRM: Xid (PCI:{pci}): 79, pid={pid}, name=python3, GPU has fallen off the bus.",
    "NVRM: Xid (PCI:{pci}): 94, pid={pid}, name=python3, Contained: SM (0x1). RST: No, D-RST: No",
    "NVRM: Xid (PCI:{pci}): 119, pid={pid}, name=python3, Timeout after 6s of waiting for RPC response from GPU2 GSP! Expected function 76 (GSP_RM_CONTROL) (0x20803032 0x58c).",  # noqa: E501
)

# Payloads are encoded once with this stand-in time, replaced as they are handed over.
STAND_IN = 1234567.125
STAND_IN_BYTES = b'"time":1234567.125'


def stamp(payload: bytes, when: float, count: int = -1) -> bytes:
    return payload.replace(STAND_IN_BYTES, b'"time":' + repr(when).encode(), count)


class GcWatch:
    """Every collection of the cyclic garbage collector: (start, seconds, generation); a
    full one (generation 2) stops the event loop for as long as it takes."""

    def __init__(self) -> None:
        self.pauses: list[tuple[float, float, int]] = []
        self._start = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        now = time.perf_counter()
        if phase == "start":
            self._start = now
        else:
            self.pauses.append((self._start, now - self._start, int(info["generation"])))

    def full(self, start: float, end: float) -> list[float]:
        """The full collections that began between ``start`` and ``end``: their seconds."""
        return [d for t, d, g in self.pauses if g == 2 and start <= t < end]


GC = GcWatch()


# --- the fleet ----------------------------------------------------------------------------


def cluster_of(domain: int) -> str:
    return f"c{domain % CLUSTERS}"


def node_name(domain: int, tray: int) -> str:
    return f"gb{domain:03d}-{tray:02d}"


def cluster_uuid(domain: int) -> str:
    return f"{domain:08x}-0000-4000-8000-{0xB200 + domain:012x}"


def nvlink_domain(domain: int) -> str:
    return f"{cluster_uuid(domain)}/{CLIQUE}"


def tray_template() -> dict[str, Any]:
    """A real status document: the simulator's GB200 compute tray, checked once."""
    with tempfile.TemporaryDirectory() as scratch:
        scenario = Path(scratch) / "gb200.toml"
        scenario.write_text(
            '[node]\ngpus = 4\nmodel = "NVIDIA GB200"\nfabric_state = "completed"\n'
            f'fabric_cluster_uuid = "{cluster_uuid(0)}"\nfabric_clique_id = {CLIQUE}\nseed = 0\n'
        )
        out = subprocess.run(
            [sys.executable, "-m", "gpuagent", "check", "--json", "--simulate", str(scenario)],
            capture_output=True, text=True, check=False, timeout=120,
        )  # fmt: skip
    document: dict[str, Any] = json.loads(out.stdout)
    return document


def tray_status(template: dict[str, Any], domain: int, tray: int) -> dict[str, Any]:
    """The tray's status document: its name, rack place, NVLink domain and the rack's job."""
    status = copy.deepcopy(template)
    node = node_name(domain, tray)
    status["node"].update(name=node, cluster=cluster_of(domain), labels={"rack": f"r{domain}"})
    for g, gpu in enumerate(status["gpus"]):
        gpu["uuid"] = f"GPU-{domain:08x}-{tray:04x}-4000-8000-{g:012x}"
        gpu["serial"] = f"18212240{domain:03d}{tray:02d}{g}"
        gpu["platform"] = {"chassis_serial": f"1821224{domain:06d}", "slot_number": tray,
                           "tray_index": tray, "host_id": 1, "module_id": g + 1}  # fmt: skip
        gpu["fabric"] = {"state": "completed", "ok": True, "cluster_uuid": cluster_uuid(domain),
                         "clique_id": CLIQUE, "nvlink_domain": nvlink_domain(domain)}  # fmt: skip
        gpu["workloads"] = [{"hpc_job": str(700_000 + domain)}]
    return status


@dataclass
class Fleet:
    template: dict[str, Any]
    buses: list[str] = field(init=False)
    # Every node's state report (topic, payload with the stand-in time), by node number.
    states: list[tuple[str, bytes]] = field(init=False)

    def __post_init__(self) -> None:
        self.buses = [g["pci_bus_id"] for g in self.template["gpus"]]
        self.states = []
        for n in range(NODES):
            domain, tray = divmod(n, TRAYS)
            node, cluster = node_name(domain, tray), cluster_of(domain)
            message = schema.envelope("state", f"{node}:state:0", node, cluster, STAND_IN)
            status = tray_status(self.template, domain, tray)
            message.update(online=True, agent_version="0.1.0", status=status)
            self.states.append((f"{PREFIX}/{cluster}/{node}/state", schema.encode(message)))


def kernel_payload(domain: int, tray: int, bus: str, line: str, seq: int) -> tuple[str, bytes]:
    """A kernel record as the node's agent sends it: the line parsed, the event built."""
    node, cluster = node_name(domain, tray), cluster_of(domain)
    text = line.format(pci=bus[:-2], pid=8000 + tray)
    parsed = parse_message(text, bare=True)
    event = GpuEvent(
        event_id=f"kmsg:{domain:08x}-{tray:04x}-boot:{seq}",
        source="kmsg",
        kind=parsed.kind,
        gpu=canonical_pci(parsed.pci) if parsed.pci else None,
        time=STAND_IN,
        monotonic=0.0,
        pci=parsed.pci,
        code=parsed.code,
        line=parsed.text,
        pid=parsed.pid,
        process=parsed.process,
        aer_severity=parsed.aer_severity,
    )
    message = schema.kernel_event_message(node, cluster, event)
    return f"{PREFIX}/{cluster}/{node}/events", schema.encode(message)


@dataclass(frozen=True, slots=True)
class Message:
    due: float  # seconds from the schedule's start
    topic: str
    payload: bytes
    event: bool  # a kernel record (else a state report)


@dataclass(frozen=True, slots=True)
class Cascade:
    domain: int
    start: float
    root_node: str
    root_gpu: str


@dataclass
class Schedule:
    messages: list[Message]
    cascades: list[Cascade]
    seconds: float  # the whole schedule
    steady: tuple[float, float]  # the part at the full offered rate


def schedule(fleet: Fleet, seconds: float, event_rate: float, seed: int = 1) -> Schedule:
    """``event_rate`` kernel records/s (cascades, unrelated faults) and every node's state
    every STATE_INTERVAL, over ``seconds`` plus the last cascades' tail."""
    rng = random.Random(seed)
    seq = [0] * NODES
    out: list[Message] = []

    def record(at: float, domain: int, tray: int, gpu: int, line: str) -> None:
        n = domain * TRAYS + tray
        seq[n] += 1
        topic, payload = kernel_payload(domain, tray, fleet.buses[gpu], line, seq[n])
        out.append(Message(at, topic, payload, event=True))

    cascade_rate = event_rate * (1 - UNRELATED_SHARE) / RECORDS_PER_CASCADE
    # A rack's next cascade must come after its last one's incident closed (the default
    # join window, 30 s), or the two would be one incident.
    if CASCADE_DOMAINS / cascade_rate < 30.0 + CASCADE_SPREAD + 1.0:
        raise SystemExit(f"--rate {event_rate:g}: more cascades than racks to put them in")
    cascades = []
    total = seconds + CASCADE_SPREAD + 0.5
    for k in range(int(seconds * cascade_rate)):
        start = k / cascade_rate
        domain = k % CASCADE_DOMAINS
        root_tray, root_gpu = rng.randrange(TRAYS), rng.randrange(GPUS)
        record(start, domain, root_tray, root_gpu, LINK_DOWN)
        cascades.append(Cascade(domain, start, node_name(domain, root_tray), fleet.buses[root_gpu]))
        for tray in range(TRAYS):
            for gpu in range(GPUS):
                if (tray, gpu) == (root_tray, root_gpu):
                    continue
                at = start + 0.3 + rng.uniform(0.0, CASCADE_SPREAD - 0.5)
                for delay, line in ((0.0, DOWNSTREAM), (0.02, TEARDOWN), (0.05, RECOVERY)):
                    record(at + delay, domain, tray, gpu, line)
    unrelated_rate = event_rate * UNRELATED_SHARE
    for k in range(int(total * unrelated_rate)):
        domain = rng.randrange(CASCADE_DOMAINS, DOMAINS)
        line = rng.choice(UNRELATED)
        record(k / unrelated_rate, domain, rng.randrange(TRAYS), rng.randrange(GPUS), line)
    state_rate = NODES / STATE_INTERVAL
    for k in range(int(total * state_rate)):
        topic, payload = fleet.states[k % NODES]
        out.append(Message(k / state_rate, topic, payload, event=False))
    out.sort(key=lambda m: m.due)
    return Schedule(out, cascades, total, (CASCADE_SPREAD + 0.5, seconds))


# --- the aggregator -----------------------------------------------------------------------


@dataclass
class Retention:
    """How long the store keeps what it has: raised for a loaded history, so that it stays."""

    events_seconds: float = 7 * DAY
    max_events: int = 1_000_000
    history_seconds: float = 7 * DAY
    incidents_seconds: float = 7 * DAY


def aggregator_config(
    work: Path, database: Path, mqtt_port: int, *, correlation: bool, retention: Retention
) -> AggregatorSection:
    token = work / "command-token"
    token.write_text("bench-token\n")
    return AggregatorSection(
        listen=f"127.0.0.1:{free_port()}",
        database=str(database),
        share_group="",
        command_token_file=str(token),
        events_retention_seconds=retention.events_seconds,
        max_events=retention.max_events,
        history_retention_seconds=retention.history_seconds,
        broker=MqttConnection(
            host="127.0.0.1", port=mqtt_port, tls=False, client_id=f"bench-{database.stem}"
        ),
        correlation=CorrelationSection(
            enabled=correlation, retention_seconds=retention.incidents_seconds
        ),
    )


@contextlib.asynccontextmanager
async def aggregator(config: AggregatorSection) -> AsyncIterator[Aggregator]:
    agg = Aggregator(config)
    await agg.start()
    try:
        deadline = time.monotonic() + 30
        while not agg.state.connected:
            if time.monotonic() > deadline:
                raise RuntimeError("the aggregator did not connect to mosquitto")
            await asyncio.sleep(0.05)
        yield agg
    finally:
        await agg.close()


async def committed(agg: Aggregator) -> None:
    """Until everything queued so far is committed."""
    done = asyncio.Event()
    agg.store.after_write(done.set)
    await done.wait()


async def prime(agg: Aggregator, fleet: Fleet) -> None:
    """Every node's state report, once (not measured)."""
    handle, send = agg.ingest.handle, agg.consumer.send_when_written
    base = time.time() - 1.0
    for n, (topic, payload) in enumerate(fleet.states):
        send(handle(topic, stamp(payload, base, 1)))
        if n % BURST == BURST - 1:
            await asyncio.sleep(0)
    await committed(agg)


def time_ticks(correlator: Correlator, passes: list[tuple[float, int]]) -> None:
    """Time every pass of the service's tick: `Correlator.tick`, then each changed
    incident's JSON queued (the service iterates what `tick` returns; the pass ends when it
    has taken the last one)."""
    original = correlator.tick

    def tick(now: float) -> Iterator[Any]:
        began = time.perf_counter()
        changed = original(now)

        def each() -> Iterator[Any]:
            yield from changed
            passes.append((time.perf_counter() - began, len(changed)))

        return each()

    setattr(correlator, "tick", tick)  # noqa: B010 - a measuring wrapper on this instance


@dataclass
class Version:
    """One write of an incident's row: what it held, when it was queued and committed."""

    id: str
    domain: str
    records: int
    gpus: int
    last_time: float  # wall clock: its last member's message reached the aggregator
    root: tuple[str, str] | None
    committed: float | None = None  # wall clock


def track_versions(agg: Aggregator, versions: list[Version]) -> None:
    store = agg.store
    original = store.queue_incident

    def queue_incident(doc: dict[str, Any]) -> None:
        original(doc)
        root = doc["root"]
        version = Version(
            doc["id"],
            doc["domain"],
            doc["counts"]["records"],
            doc["counts"]["gpus"],
            doc["last_time"],
            None if root is None else (root["node"], root["gpu"]),
        )
        versions.append(version)

        def written() -> None:
            version.committed = time.time()

        store.after_write(written)

    setattr(store, "queue_incident", queue_incident)  # noqa: B010 - as time_ticks


# --- capacity -----------------------------------------------------------------------------


async def saturate(
    agg: Aggregator | None, messages: list[Message], profile: cProfile.Profile | None = None
) -> tuple[float, float]:
    """Hand every message over as fast as the loop takes them; (CPU seconds of the process,
    wall seconds) until all is committed. None: the feeder alone (a no-op handler)."""

    def nothing(_topic: str, _payload: bytes) -> list[Outgoing]:
        return []

    def drop(_outgoing: list[Outgoing]) -> None:
        pass

    handle = agg.ingest.handle if agg is not None else nothing
    send = agg.consumer.send_when_written if agg is not None else drop
    if profile is not None:
        profile.enable()
    cpu, wall = time.process_time(), time.perf_counter()
    clock = time.time
    for k, m in enumerate(messages):
        send(handle(m.topic, stamp(m.payload, clock(), -1 if m.event else 1)))
        if k % BURST == BURST - 1:
            await asyncio.sleep(0)
    if agg is not None:
        await committed(agg)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    if profile is not None:
        profile.disable()
    return cpu, wall


@dataclass
class Capacity:
    off: list[float] = field(default_factory=list)  # messages per CPU-second, each round
    on: list[float] = field(default_factory=list)
    feeder_us: list[float] = field(default_factory=list)  # each run's
    messages: int = 0
    wall_on: list[float] = field(default_factory=list)  # messages/s (wall), on one core
    gc_off: list[float] = field(default_factory=list)  # full collections' seconds, each round
    gc_on: list[float] = field(default_factory=list)


async def capacity_run(
    work: Path, fleet: Fleet, messages: list[Message], mqtt_port: int, correlation: bool,
    profile: cProfile.Profile | None,
) -> dict[str, float]:  # fmt: skip
    """One run, in a fresh process (`--capacity-run`): the feeder alone, then a fresh
    aggregator with every node's state report stored first, given every message."""
    cpu, _ = await saturate(None, messages)
    feeder_us = cpu / len(messages) * 1e6
    database = work / "capacity.sqlite"
    config = aggregator_config(
        work, database, mqtt_port, correlation=correlation, retention=Retention()
    )
    async with aggregator(config) as agg:
        await prime(agg, fleet)
        await asyncio.sleep(0.6)  # a tick and a few batches: settled
        began = time.perf_counter()
        cpu, wall = await saturate(agg, messages, profile)
    own = cpu - feeder_us * 1e-6 * len(messages)
    return {
        "rate": len(messages) / own,
        "wall_rate": len(messages) / wall,
        "gc_full": sum(GC.full(began, time.perf_counter())),
        "feeder_us": feeder_us,
        "messages": len(messages),
    }


async def capacity(work: Path, setup: Setup, mqtt_port: int) -> Capacity:
    """Rounds of correlation off and on, each run in a process of its own: a run does not
    inherit the heap (or the collector's generations) another left behind."""
    result = Capacity()
    template = work / "template.json"
    for r in range(setup.rounds):
        # Which of a round's two runs comes first alternates.
        for correlation in (False, True) if r % 2 == 0 else (True, False):
            mode = "on" if correlation else "off"
            out = work / f"capacity-{r}-{mode}.json"
            profile = setup.profile and correlation and r == setup.rounds - 1
            await asyncio.to_thread(
                subprocess.run,
                [sys.executable, __file__, "--capacity-run", mode, str(template), str(out),
                 str(mqtt_port), "--seconds", str(setup.seconds), "--rate", str(setup.rate),
                 *(["--profile"] if profile else [])],
                check=True, timeout=600,
            )  # fmt: skip
            run = json.loads(out.read_text())
            (result.on if correlation else result.off).append(run["rate"])
            (result.gc_on if correlation else result.gc_off).append(run["gc_full"])
            if correlation:
                result.wall_on.append(run["wall_rate"])
            result.feeder_us.append(run["feeder_us"])
            result.messages = int(run["messages"])
            print(
                f"  capacity round {r + 1}/{setup.rounds}, correlation {mode}:"
                f" {run['rate']:,.0f} msg per CPU-second",
                flush=True,
            )
    return result


def run_capacity(mode: str, template: Path, out: Path, mqtt_port: int, setup: Setup) -> int:
    """The process of one capacity run: its payloads built and frozen out of the garbage
    collector, then `capacity_run`; the result written to ``out``."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    sys.setswitchinterval(0.0005)
    pin_threads(os.getpid(), AGGREGATOR_CPU)
    fleet = Fleet(json.loads(template.read_text()))
    plan = schedule(fleet, setup.seconds, setup.rate)
    gc.collect()
    gc.freeze()
    profile = cProfile.Profile() if setup.profile else None
    with tempfile.TemporaryDirectory(prefix="gpuagent-capacity-") as work:
        result = asyncio.run(
            capacity_run(Path(work), fleet, plan.messages, mqtt_port, mode == "on", profile)
        )
    out.write_text(json.dumps(result))
    if profile is not None:
        print("\nprofile: one capacity round with correlation on (the event loop's thread)")
        pstats.Stats(profile).sort_stats("tottime").print_stats(30)
    return 0


# --- offered load -------------------------------------------------------------------------


@dataclass
class Load:
    label: str
    events: list[float] = field(default_factory=list)  # seconds, due to handled
    states: list[float] = field(default_factory=list)
    stored: list[float] = field(default_factory=list)  # a sample of events: due to committed
    offered_events: int = 0  # in the steady window
    handled_events: int = 0  # handled within the steady window
    steady_seconds: float = 0.0
    max_lag: float = 0.0
    cpu_pct: float = 0.0
    ticks: list[tuple[float, int]] = field(default_factory=list)
    versions: list[Version] = field(default_factory=list)
    read_back: list[dict[str, Any]] = field(default_factory=list)
    cascades: list[Cascade] = field(default_factory=list)
    rss_mb: float = 0.0
    load_average: float = 0.0
    all_events: int = 0
    full_gcs: list[float] = field(default_factory=list)  # in the steady window: seconds
    steady_messages: int = 0  # events and state reports due in the steady window
    correlation: bool = True
    cpu_first: float | None = None  # process CPU seconds as the steady window began
    cpu_last: float | None = None

    def note(
        self, m: Message, done: float, steady: tuple[float, float], store: FleetStore,
        begin: float,
    ) -> None:  # fmt: skip
        """A message handed over: ``done`` seconds after the schedule's start."""
        first, last = steady
        lag = done - m.due
        self.max_lag = max(self.max_lag, lag)
        if not first <= m.due < last:
            self.all_events += m.event
            return
        self.steady_messages += 1
        if not m.event:
            self.states.append(lag)
            return
        self.all_events += 1
        self.events.append(lag)
        self.offered_events += 1
        self.handled_events += done < last
        if self.offered_events % 10 == 0:  # a sample: when it is committed

            def written(due: float = m.due) -> None:
                self.stored.append(time.perf_counter() - begin - due)

            store.after_write(written)

    def mark_cpu(self, now: float, steady: tuple[float, float]) -> None:
        if self.cpu_first is None and now >= steady[0]:
            self.cpu_first = time.process_time()
        if self.cpu_last is None and now >= steady[1]:
            self.cpu_last = time.process_time()


async def offer(agg: Aggregator, plan: Schedule, result: Load) -> None:
    """Hand each message over when it is due (open loop)."""
    handle, send = agg.ingest.handle, agg.consumer.send_when_written
    perf = time.perf_counter
    begin, begin_wall = perf() + 0.2, time.time() + 0.2
    messages = plan.messages
    n, i = len(messages), 0
    while i < n:
        now = perf() - begin
        burst = 0
        while i < n and messages[i].due <= now and burst < BURST:
            m = messages[i]
            send(handle(m.topic, stamp(m.payload, begin_wall + m.due, -1 if m.event else 1)))
            result.note(m, perf() - begin, plan.steady, agg.store, begin)
            i += 1
            burst += 1
        result.mark_cpu(now, plan.steady)
        if i < n:
            wait = 0.0 if burst == BURST else max(0.0, messages[i].due - (perf() - begin))
            await asyncio.sleep(wait)
    first, last = plan.steady
    result.steady_seconds = last - first
    result.full_gcs = GC.full(begin + first, begin + last)
    if result.cpu_first is not None and result.cpu_last is not None:
        result.cpu_pct = (result.cpu_last - result.cpu_first) / (last - first) * 100


async def offered_load(
    label: str, work: Path, database: Path, fleet: Fleet, plan: Schedule, mqtt_port: int,
    retention: Retention, *, correlation: bool = True,
) -> Load:  # fmt: skip
    result = Load(label, cascades=plan.cascades, load_average=os.getloadavg()[0])
    result.correlation = correlation
    config = aggregator_config(
        work, database, mqtt_port, correlation=correlation, retention=retention
    )
    async with aggregator(config) as agg:
        await prime(agg, fleet)
        await asyncio.sleep(0.6)
        if agg.correlator is not None:
            time_ticks(agg.correlator, result.ticks)
            track_versions(agg, result.versions)
        began = time.time()
        await offer(agg, plan, result)
        # The last records' incidents: the next tick, then their batch.
        await asyncio.sleep(1.5)
        await committed(agg)
        if agg.correlator is not None:
            result.read_back = await agg.store.incidents(since=began - 1, limit=1_000_000)
        result.rss_mb = psutil.Process().memory_info().rss / 1e6
    print(f"  {label}: {result.cpu_pct:.0f} % of a core, event handling p99 "
          f"{ms(result.events, 99):.1f} ms", flush=True)  # fmt: skip
    return result


# --- a large history, loaded with bulk SQL ------------------------------------------------


def printf_format(text: str, conversions: dict[str, str]) -> tuple[str, list[str]]:
    """``text`` as a printf format: each @@name@@ replaced by its conversion; the names in
    the order they come."""
    order: list[str] = []

    def sub(match: re.Match[str]) -> str:
        order.append(match[1])
        return conversions[match[1]]

    return re.sub(r"@@(\w+)@@", sub, text.replace("%", "%%")), order


def incident_templates(fleet: Fleet) -> tuple[str, str]:
    """Two real incident documents, closed: a rack's cascade (72 GPUs) and one GPU's own
    fault; their id and times left as @@markers@@."""
    correlator = Correlator(join_window_seconds=30.0, settle_seconds=10.0)
    for n in range(TRAYS * 2):
        status = tray_status(fleet.template, n // TRAYS, n % TRAYS)
        correlator.observe_state(cluster_of(n // TRAYS), node_name(n // TRAYS, n % TRAYS),
                                 from_online_state(
                                     {"cluster": "", "node": "", "time": 0.0, "status": status},
                                     "", 0.0))  # fmt: skip
    plan = schedule(fleet, 0.3, 1000.0)  # one cascade, in rack 0
    t = 1_790_000_000.0
    for m in plan.messages:
        if m.event and "gb000-" in m.topic:
            message = json.loads(stamp(m.payload, t + m.due))
            data = message["data"]
            correlator.observe_record(message["cluster"], message["node"], data, t + m.due)
    _, payload = kernel_payload(1, 3, fleet.buses[2], UNRELATED[3], 1)
    message = json.loads(stamp(payload, t))
    correlator.observe_record(message["cluster"], message["node"], message["data"], t)
    docs = [i.json() for i in correlator.tick(t + 100.0)]
    docs.sort(key=lambda d: -d["counts"]["gpus"])
    out = []
    for doc in docs:
        doc.update(id="@@id@@", first_time="@@first@@", last_time="@@last@@",
                   closed_at="@@closed@@")  # fmt: skip
        text = json.dumps(doc, separators=(",", ":"))
        out.append(re.sub(r'"(@@\w+@@)"', r"\1", text))
    return out[0], out[1]


_SERIES = "WITH RECURSIVE c(x) AS (SELECT 0 UNION ALL SELECT x + 1 FROM c WHERE x + 1 < :n)"
# Row x of n: the node (in id order: cluster, then node name), its row number, a time.
_NODE_OF = (
    "(x / :per_node) AS k, (x % :per_node) AS s, "
    ":now - :span + ((x * 2654435761) % :n) * (:span / :n) AS t"
)


def _node_columns() -> str:
    # k: the node in id order: block of its cluster, then its rack and tray in that cluster.
    per_cluster = NODES // CLUSTERS
    domain = f"((k % {per_cluster}) / {TRAYS}) * {CLUSTERS} + k / {per_cluster}"
    return (
        f"'c' || (k / {per_cluster}) AS cl, "
        f"printf('gb%03d-%02d', {domain}, (k % {per_cluster}) % {TRAYS}) AS nd"
    )


@dataclass
class History:
    events: int = 0
    incidents: int = 0
    samples: int = 0
    seconds: float = 0.0
    bytes: int = 0


def load_history(path: Path, fleet: Fleet, events: int, incidents: int, samples: int) -> History:
    """Events, incidents and history samples of every node over HISTORY_DAYS, written with
    bulk INSERT ... SELECT (a recursive series) into the store's tables, in key order, the
    secondary indexes dropped meanwhile and built again after."""
    began = time.perf_counter()
    now = time.time() - 120.0
    span = HISTORY_DAYS * DAY - 3600.0  # all of it younger than the retention
    # The store's schema, as a fresh aggregator makes it.
    store = FleetStore(path, retention_seconds=1e9, max_events=10**9)
    asyncio.run(store.open())
    asyncio.run(store.close())
    _, event_payload = kernel_payload(1, 2, fleet.buses[1], UNRELATED[0], 1)
    event_text = event_payload.decode().replace(STAND_IN_BYTES.decode(), '"time":@@time@@')
    # The message's names as markers: node, cluster and message id.
    event_text = event_text.replace(node_name(1, 2), "@@node@@").replace('"c1"', '"@@cl@@"')
    event_text = event_text.replace("kmsg:00000001-0002-boot:1", "@@eid@@")
    cascade_doc, single_doc = incident_templates(fleet)
    sample_text = _sample_template(fleet)
    loaded: dict[str, int] = {}
    db = sqlite3.connect(path, isolation_level=None)
    try:
        # No journal while loading (the file is thrown away if it fails); WAL again after,
        # as the store keeps it.
        db.execute("PRAGMA journal_mode=OFF")
        db.execute("PRAGMA synchronous=OFF")
        db.execute("PRAGMA cache_size=-524288")
        tables = [
            ("events", events, ["events_by_time", "events_by_node"], _events_sql(event_text)),
            ("incidents", incidents, ["incidents_by_time"],
             _incidents_sql(cascade_doc, single_doc)),
            ("history", samples, ["history_by_time", "history_by_node"], _samples_sql(sample_text)),
        ]  # fmt: skip
        for table, wanted, indexes, (sql, args) in tables:
            if wanted <= 0:
                continue
            per_node = max(1, wanted // NODES)
            n = per_node * NODES if wanted >= NODES else wanted  # whole nodes
            loaded[table] = n
            definitions = [
                db.execute("SELECT sql FROM sqlite_master WHERE name = ?", (i,)).fetchone()[0]
                for i in indexes
            ]
            for index in indexes:
                db.execute(f"DROP INDEX {index}")
            db.execute("BEGIN")
            db.execute(sql, {"n": n, "per_node": per_node, "now": now, "span": span, **args})
            db.execute("COMMIT")
            for definition in definitions:
                db.execute(definition)
            print(
                f"  loaded {n:,} {table} rows ({time.perf_counter() - began:.0f} s)",
                file=sys.stderr,
            )
        db.execute("PRAGMA journal_mode=WAL")
    finally:
        db.close()
    return History(
        events=loaded.get("events", 0),
        incidents=loaded.get("incidents", 0),
        samples=loaded.get("history", 0),
        seconds=time.perf_counter() - began,
        bytes=path.stat().st_size,
    )


def load_in_subprocess(path: Path, events: int, incidents: int, samples: int) -> History:
    """`load_history` in a process of its own: its page cache does not stay in the
    aggregator's memory."""
    out = subprocess.run(
        [sys.executable, __file__, "--load-history", str(path), str(events), str(incidents),
         str(samples)],
        stdout=subprocess.PIPE, text=True, check=True,
    )  # fmt: skip
    return History(**json.loads(out.stdout.splitlines()[-1]))


def _events_sql(text: str) -> tuple[str, dict[str, Any]]:
    fmt, order = printf_format(text, {"node": "%s", "cl": "%s", "eid": "%s", "time": "%.6f"})
    exprs = {"node": "nd", "cl": "cl", "eid": "eid", "time": "t"}
    sql = (
        f"{_SERIES}, r AS (SELECT {_NODE_OF} FROM c), "
        f"q AS (SELECT *, {_node_columns()}, printf('kmsg:%08x-hist:%08d', k, s) AS eid FROM r) "
        "INSERT INTO events (id, cluster, node, time, category, body) "
        "SELECT cl || '/' || nd || '/' || nd || ':' || eid, cl, nd, t, 'kernel', "
        f"printf(:fmt, {', '.join(exprs[name] for name in order)}) FROM q"
    )
    return sql, {"fmt": fmt}


def _incidents_sql(cascade: str, single: str) -> tuple[str, dict[str, Any]]:
    conversions = {"id": '"%s"', "first": "%.6f", "last": "%.6f", "closed": "%.6f"}
    exprs = {"id": "id", "first": "t", "last": "t + 5.0", "closed": "t + 35.0"}
    bodies = []
    for name, text in (("cascade", cascade), ("single", single)):
        fmt, order = printf_format(text, conversions)
        bodies.append((name, fmt, ", ".join(exprs[o] for o in order)))
    # One in 50 a rack's cascade, the rest one GPU's fault.
    body = (
        f"CASE WHEN x % 50 = 0 THEN printf(:{bodies[0][0]}, {bodies[0][2]}) "
        f"ELSE printf(:{bodies[1][0]}, {bodies[1][2]}) END"
    )
    domain = f"'nvlink:' || printf('%08x-0000-4000-8000-%012x', x % {DOMAINS}, 45568 + x % {DOMAINS}) || '/{CLIQUE}'"  # noqa: E501
    sql = (
        f"{_SERIES}, r AS (SELECT x, {_NODE_OF} FROM c), "
        "q AS (SELECT *, printf('fi-%012x', x) AS id FROM r) "
        "INSERT INTO incidents (id, cluster, domain, state, first_time, time, body) "
        f"SELECT id, 'c' || (x % {CLUSTERS}), {domain}, 'closed', t, t + 35.0, {body} FROM q"
    )
    return sql, {bodies[0][0]: bodies[0][1], bodies[1][0]: bodies[1][1]}


def _sample_template(fleet: Fleet) -> str:
    status = tray_status(fleet.template, 1, 2)
    message = schema.envelope("state", "s", node_name(1, 2), cluster_of(1), 1_790_000_000.0)
    message.update(online=True, agent_version="0.1.0", status=status)
    record = from_online_state(message, "", 1_790_000_000.0)
    rows = HistoryRecorder(300.0).rows(None, record, status)
    body = next(r[5] for r in rows if r[4] == "sample")
    return body.replace("1790000000.0", "@@time@@")


def _samples_sql(text: str) -> tuple[str, dict[str, Any]]:
    fmt, order = printf_format(text, {"time": "%.6f"})
    sql = (
        f"{_SERIES}, r AS (SELECT {_NODE_OF} FROM c), "
        # A node's samples in time order, so that the ids (which name the time) are too.
        f"q AS (SELECT k, s, {_node_columns()}, "
        ":now - :span + s * (:span / :per_node) + (k % 97) AS t FROM r) "
        "INSERT INTO history (id, cluster, node, time, kind, body) "
        "SELECT cl || '/' || nd || '/sample/' || printf('%.6f', t) || '/', cl, nd, t, 'sample', "
        f"printf(:fmt, {', '.join('t' for _ in order)}) FROM q"
    )
    return sql, {"fmt": fmt}


# --- the results --------------------------------------------------------------------------


def ms(samples: list[float], pct: float) -> float:
    return percentile(samples, pct) * 1000 if samples else math.nan


def publish_delays(load: Load) -> tuple[list[float], int]:
    """Per incident: from its last member's message reaching the aggregator to the first
    committed row holding every record it got; and how many never got one committed."""
    final: dict[str, int] = {}
    for v in load.versions:
        final[v.id] = max(final.get(v.id, 0), v.records)
    delays: dict[str, float] = {}
    for v in load.versions:
        if v.records == final[v.id] and v.committed is not None and v.id not in delays:
            delays[v.id] = v.committed - v.last_time
    return list(delays.values()), len(final) - len(delays)


def cascades_right(load: Load) -> tuple[int, int]:
    """(cascades whose incident, read back from the store, is one with the Xid 149 GPU as
    root and every record, of the cascades)."""
    by_domain: dict[str, list[dict[str, Any]]] = {}
    for doc in load.read_back:
        by_domain.setdefault(doc["domain"], []).append(doc)
    right = 0
    for cascade in load.cascades:
        docs = by_domain.get(f"nvlink:{nvlink_domain(cascade.domain)}", [])
        if len(docs) != 1:
            continue
        doc = docs[0]
        root = doc["root"] or {}
        right += (
            (root.get("node"), root.get("gpu")) == (cascade.root_node, cascade.root_gpu)
            and doc["counts"] == {"gpus": TRAYS * GPUS, "nodes": TRAYS,
                                  "records": RECORDS_PER_CASCADE}
        )  # fmt: skip
    return right, len(load.cascades)


def load_rows(load: Load, rate: float) -> list[Row]:
    tag = load.label
    offered = load.offered_events / load.steady_seconds
    processed = load.handled_events / load.steady_seconds
    kept_up = processed >= 0.99 * offered and offered >= 0.98 * rate and load.max_lag < 1.0
    p99 = ms(load.events, 99)
    rows = [
        Row(f"{tag}: kernel events offered", offered, "events/s",
            reference=f"+ {NODES / STATE_INTERVAL:.0f} state reports/s, "
            f"{load.steady_seconds:.0f} s steady"),
        Row(f"{tag}: kernel events handled", processed, "events/s", f"≥ {rate:,.0f}", kept_up,
            reference=f"max lag {load.max_lag * 1000:.1f} ms"),
        Row(f"{tag}: event handling p50", ms(load.events, 50), "ms"),
        Row(f"{tag}: event handling p99", p99, "ms", f"≤ {LATENCY_P99_TARGET_MS:g}",
            p99 <= LATENCY_P99_TARGET_MS, reference=f"max {ms(load.events, 100):.1f} ms"),
        Row(f"{tag}: state report handling p50", ms(load.states, 50), "ms",
            reference=f"p99 {ms(load.states, 99):.1f} ms"),
        Row(f"{tag}: event stored (committed) p50", ms(load.stored, 50), "ms",
            reference=f"p99 {ms(load.stored, 99):.1f} ms, 1 event in 10"),
        Row(f"{tag}: aggregator CPU", load.cpu_pct, "% of a core",
            reference=f"RSS {load.rss_mb:.0f} MB, load average {load.load_average:.1f}"),
        Row(f"{tag}: full GC pauses", len(load.full_gcs), "in window",
            reference="each " + (", ".join(f"{d * 1000:.0f}" for d in load.full_gcs) or "-")
            + " ms"),
    ]  # fmt: skip
    if not load.correlation:  # the reference run: its figures only
        return [dataclasses.replace(r, target="", ok=None) for r in rows]
    ticks = [t for t, _ in load.ticks]
    changed = [c for _, c in load.ticks]
    delays, unpublished = publish_delays(load)
    right, cascades = cascades_right(load)
    tick_share = sum(ticks) / load.all_events * 1e6 if load.all_events else math.nan
    published = bool(delays) and not unpublished and max(delays) <= PUBLISH_TARGET_S
    return [
        *rows,
        Row(f"{tag}: tick (close + incident JSON) p50", ms(ticks, 50), "ms",
            reference=f"p99 {ms(ticks, 99):.1f}, max {ms(ticks, 100):.1f} ms; "
            f"{statistics_median(changed):.0f} incidents changed per tick"),
        Row(f"{tag}: tick, amortised per event", tick_share, "µs"),
        Row(f"{tag}: incident published p50", ms(delays, 50) / 1000, "s",
            reference=f"p99 {ms(delays, 99) / 1000:.2f} s, {len(delays)} incidents"),
        Row(f"{tag}: incident published max", max(delays) if delays else math.inf, "s",
            f"≤ {PUBLISH_TARGET_S:g}", published, reference=f"{unpublished} never committed"),
        Row(f"{tag}: cascades joined right", right, "cascades", f"{cascades}",
            right == cascades, reference="one incident, root Xid 149, 214 records, 72 GPUs"),
    ]  # fmt: skip


def at_load_rows(off: Load, on: Load, feeder_us: float) -> list[Row]:
    """Capacity per core derived from the CPU each message took at the offered load."""

    def per_core(load: Load) -> float:
        cpu = load.cpu_pct / 100 * load.steady_seconds - feeder_us * 1e-6 * load.steady_messages
        return load.steady_messages / cpu if cpu > 0 else math.nan

    a, b = per_core(off), per_core(on)
    drop = (1 - b / a) * 100
    return [
        Row("at the offered load: capacity per core, off", a, "msg/CPU-s",
            reference=f"{off.cpu_pct:.1f} % of a core for {off.steady_messages:,} messages"),
        Row("at the offered load: capacity per core, on", b, "msg/CPU-s",
            reference=f"{on.cpu_pct:.1f} % of a core"),
        Row("at the offered load: drop with correlation", drop, "%",
            reference="one off and one on run, the cascades at their own pace"),
    ]  # fmt: skip


def statistics_median(values: list[int]) -> float:
    return median([float(v) for v in values]) if values else 0.0


def median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def capacity_rows(c: Capacity) -> list[Row]:
    # Each round's off and on ran one after the other: their ratio is the least disturbed
    # by whatever else the host did meanwhile.
    drops = [(1 - on / off) * 100 for off, on in zip(c.off, c.on, strict=True)]
    drop = median(drops)

    def rounds(values: list[float]) -> str:
        return ", ".join(f"{x:,.0f}" for x in values)

    def gcs(values: list[float]) -> str:
        return ", ".join(f"{x * 1000:.0f}" for x in values)

    return [
        Row("capacity per core, correlation off", median(c.off), "msg/CPU-s",
            reference=f"rounds {rounds(c.off)}; full GCs {gcs(c.gc_off)} ms"),
        Row("capacity per core, correlation on", median(c.on), "msg/CPU-s",
            reference=f"rounds {rounds(c.on)}; full GCs {gcs(c.gc_on)} ms; "
            f"wall {median(c.wall_on):,.0f} msg/s on one core"),
        Row("capacity drop with correlation", drop, "%", f"≤ {CAPACITY_DROP_TARGET_PCT:g}",
            drop <= CAPACITY_DROP_TARGET_PCT,
            reference=f"median of the rounds' {', '.join(f'{d:.1f}' for d in drops)} %; "
            f"{c.messages:,} messages a round, the feeder's {median(c.feeder_us):.1f} µs/msg "
            "taken out; each run in a fresh process"),
    ]  # fmt: skip


def history_rows(h: History) -> list[Row]:
    return [
        Row("history loaded: events", h.events, "rows", reference=f"{HISTORY_DAYS} days"),
        Row("history loaded: incidents", h.incidents, "rows", reference="1 in 50 a rack's"),
        Row("history loaded: history samples", h.samples, "rows"),
        Row("history loaded: database", h.bytes / 1e9, "GB", reference=f"in {h.seconds:.0f} s"),
    ]


def comparison_rows(empty: Load, loaded: Load) -> list[Row]:
    rows = []
    for pct in (50, 99):
        a, b = ms(empty.events, pct), ms(loaded.events, pct)
        rows.append(
            Row(f"event handling p{pct}, loaded - empty", b - a, "ms",
                reference=f"{a:.2f} → {b:.2f} ms")
        )  # fmt: skip
    return rows


# --- the run ------------------------------------------------------------------------------


@dataclass
class Setup:
    seconds: float
    rate: float
    rounds: int
    history_events: int
    history_incidents: int
    history_samples: int
    profile: bool


async def measure(setup: Setup, work: Path, fleet: Fleet, mqtt_port: int) -> list[Row]:
    plan = schedule(fleet, setup.seconds, setup.rate)
    events = sum(m.event for m in plan.messages)
    print(f"  schedule: {len(plan.messages):,} messages ({events:,} kernel events, "
          f"{len(plan.cascades)} cascades) over {plan.seconds:.0f} s", flush=True)  # fmt: skip
    (work / "template.json").write_text(json.dumps(fleet.template))
    cap = await capacity(work, setup, mqtt_port)
    # The benchmark's own payloads are no garbage the aggregator's collector should walk.
    gc.collect()
    gc.freeze()
    off = await offered_load(
        "correlation off", work, work / "off.sqlite", fleet, plan, mqtt_port, Retention(),
        correlation=False,
    )  # fmt: skip
    empty = await offered_load(
        "empty store", work, work / "empty.sqlite", fleet, plan, mqtt_port, Retention()
    )
    loaded_path = work / "loaded.sqlite"
    history = await asyncio.to_thread(
        load_in_subprocess, loaded_path, setup.history_events, setup.history_incidents,
        setup.history_samples,
    )  # fmt: skip
    keep = HISTORY_DAYS * DAY + DAY
    retention = Retention(keep, max(1_000_000, 2 * history.events), keep, keep)
    loaded = await offered_load(
        "history loaded", work, loaded_path, fleet, plan, mqtt_port, retention
    )
    return [
        *capacity_rows(cap),
        *at_load_rows(off, empty, median(cap.feeder_us)),
        *load_rows(off, setup.rate),
        *load_rows(empty, setup.rate),
        *history_rows(history),
        *load_rows(loaded, setup.rate),
        *comparison_rows(empty, loaded),
    ]


def run(setup: Setup) -> int:
    mosquitto = shutil.which("mosquitto", path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")
    if mosquitto is None:
        print("bench/correlation.py: mosquitto is not installed", file=sys.stderr)
        return 1
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    # As the aggregator's command line does: the GIL back to the event loop quickly.
    sys.setswitchinterval(0.0005)
    print("correlation benchmark: building the fleet's payloads", flush=True)
    fleet = Fleet(tray_template())
    with contextlib.ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="gpuagent-corrbench-")))
        mqtt_port = free_port()
        config = mosquitto_config(work, mqtt_port)
        broker = subprocess.Popen(
            [mosquitto, "-c", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        stack.callback(broker.wait, timeout=10)
        stack.callback(broker.terminate)
        pin(broker.pid, INFRA_CPU)
        pin_threads(os.getpid(), AGGREGATOR_CPU)  # threads started from now on inherit it
        time.sleep(0.5)
        rows = asyncio.run(measure(setup, work, fleet, mqtt_port))
    return report(
        rows, "correlation", digits=2, **dataclasses.asdict(setup),
        nodes=NODES, domains=DOMAINS,
    )  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="shorter windows, less history")
    parser.add_argument("--seconds", type=float, help="offered-load window (default 60, quick 15)")
    parser.add_argument("--rate", type=float, default=EVENT_RATE_TARGET, help="kernel events/s")
    parser.add_argument("--history-events", type=int)
    parser.add_argument("--history-incidents", type=int)
    parser.add_argument("--history-samples", type=int)
    parser.add_argument(
        "--profile", action="store_true", help="profile a capacity round, correlation on"
    )
    parser.add_argument("--load-history", nargs=4, help=argparse.SUPPRESS)
    parser.add_argument("--capacity-run", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.load_history:  # the loader's own process (load_in_subprocess)
        path, *counts = args.load_history
        fleet = Fleet(tray_template())
        history = load_history(Path(path), fleet, *(int(c) for c in counts))
        print(json.dumps(dataclasses.asdict(history)))
        return 0
    quick = args.quick

    def pick(value: float | None, full: float, short: float) -> float:
        return float(value) if value is not None else (short if quick else full)

    setup = Setup(
        seconds=pick(args.seconds, 60, 15),
        rate=args.rate,
        rounds=2 if quick else 4,
        history_events=int(pick(args.history_events, 5_000_000, 1_000_000)),
        history_incidents=int(pick(args.history_incidents, 1_000_000, 200_000)),
        history_samples=int(pick(args.history_samples, 3_000_000, 500_000)),
        profile=args.profile,
    )
    if args.capacity_run:  # one capacity run's own process (`capacity`)
        mode, template, out, port = args.capacity_run
        return run_capacity(mode, Path(template), Path(out), int(port), setup)
    return run(setup)


if __name__ == "__main__":
    sys.exit(main())
