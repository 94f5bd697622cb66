"""What a fleet rule costs to judge one fact, with an empty store and with 30 days of
history of 10,000 nodes: the real `FleetRules` reading the real fleet store (SQLite on
disk) through its windowed queries.

    .venv/bin/python bench/fleetrules.py [--quick] [--facts N]

The history: 10,000 nodes of 8 GPUs over 30 days, in `gpu_history` by bulk SQL inserts:
each GPU 10 CRITICAL onsets and 10 recoveries and 15 Xid 13s (on random GPCs and TPCs),
each node 20 remediation attempts: 3.0 million facts. Then `--facts` (2,000) new facts of
each kind (a GPU turning CRITICAL, an attempt, an Xid 13) on random GPUs and nodes are
stored and judged one at a time, as the aggregator does once their batch is committed;
each judgement is timed, from the call to its findings (its reads included). The same
runs on an empty store. Prints a table; writes bench/results/fleetrules.json. Exits 1 when
a target is missed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent / "agent"))

from gpuagent.aggregator.facts import Fact, FactKind  # noqa: E402
from gpuagent.aggregator.fleetrules import FleetRules  # noqa: E402
from gpuagent.aggregator.store import FleetStore  # noqa: E402
from gpuagent.config import RulesSection  # noqa: E402
from report import Row, percentile, report  # noqa: E402

DAY = 86400.0
DAYS = 30
NODES, GPUS = 10_000, 8
P99_TARGET_MS = 50.0
# Facts of each GPU and node over the history (see the docstring).
PER_GPU = {"critical": 10, "recovered": 10, "xid13": 15}
PER_NODE = {"action": 20}


def node_name(n: int) -> str:
    return f"gpu-{n:05d}"


def gpu_uuid(n: int, g: int) -> str:
    return f"GPU-{n:05d}-{g}"


def detail(kind: str, rng: random.Random) -> dict[str, Any]:
    if kind == "xid13":
        return {"gpc": rng.randrange(8), "tpc": rng.randrange(9), "sm": 0, "pci_bus_id": "x"}
    if kind == "action":
        return {"action": "reset_gpu", "result": "succeeded", "target": "0000:18:00.0"}
    return {"index": 0, "pci_bus_id": "0000:18:00.0", "check": "xid", "reason": "Xid 79"}


def load_history(path: Path, nodes: int, now: float, rng: random.Random) -> int:
    """Bulk facts over the last DAYS days; the row count."""
    db = sqlite3.connect(path)
    rows = 0

    def batch() -> Any:
        for n in range(nodes):
            node = node_name(n)
            for kind, count in PER_NODE.items():
                for k in range(count):
                    t = now - rng.random() * DAYS * DAY
                    yield (f"h/{node}/{kind}/{k}", "c", node, "", t, kind,
                           json.dumps(detail(kind, rng)))  # fmt: skip
            for g in range(GPUS):
                uuid = gpu_uuid(n, g)
                for kind, count in PER_GPU.items():
                    for k in range(count):
                        t = now - rng.random() * DAYS * DAY
                        yield (f"h/{uuid}/{kind}/{k}", "c", node, uuid, t, kind,
                               json.dumps(detail(kind, rng)))  # fmt: skip

    with db:
        for row in batch():
            db.execute(
                "INSERT INTO gpu_history (id, cluster, node, gpu, time, kind, body) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                row,
            )
            rows += 1
    db.close()
    return rows


async def judge_all(store: FleetStore, facts: list[Fact]) -> tuple[list[float], int]:
    """Store the facts and judge each once its batch is written: seconds per judgement."""
    rules = FleetRules(RulesSection(), store.read_rows)
    seconds, found = [], 0
    for fact in facts:
        store.queue_facts([fact])
        await store.flush()
        began = time.perf_counter()
        found += len(await rules.judge(fact))
        seconds.append(time.perf_counter() - began)
    return seconds, found


def new_facts(count: int, nodes: int, now: float, rng: random.Random) -> list[Fact]:
    facts = []
    kinds: tuple[FactKind, ...] = ("critical", "action", "xid13")
    for i in range(count):
        for kind in kinds:
            n, g = rng.randrange(nodes), rng.randrange(GPUS)
            node = node_name(n)
            gpu = "" if kind == "action" else gpu_uuid(n, g)
            facts.append(
                Fact(
                    f"new/{i}/{kind}/{n}/{g}",
                    "c",
                    node,
                    gpu,
                    now + i * 0.01,
                    kind,
                    detail(kind, rng),
                )
            )
    return facts


async def measure(path: Path, facts: list[Fact]) -> tuple[list[float], int]:
    store = FleetStore(path, retention_seconds=40 * DAY, max_events=10_000_000)
    await store.open()
    try:
        return await judge_all(store, facts)
    finally:
        await store.close()


def ms(samples: list[float], pct: float) -> float:
    return percentile(samples, pct) * 1000


async def run(nodes: int, count: int) -> list[Row]:
    rng = random.Random(7)
    now = time.time()
    with tempfile.TemporaryDirectory(prefix="gpuagent-rulesbench-") as tmp:
        empty, loaded = Path(tmp) / "empty.sqlite", Path(tmp) / "loaded.sqlite"
        for path in (empty, loaded):  # the schema, migrated
            store = FleetStore(path, retention_seconds=40 * DAY, max_events=10_000_000)
            await store.open()
            await store.close()
        began = time.perf_counter()
        rows = load_history(loaded, nodes, now, rng)
        load_seconds = time.perf_counter() - began
        print(f"  history: {rows:,} facts in {load_seconds:.0f} s", flush=True)
        facts = new_facts(count, nodes, now, rng)
        on_empty, _ = await measure(empty, facts)
        on_loaded, found = await measure(loaded, facts)
        size = loaded.stat().st_size
    by_kind: dict[str, list[float]] = {}
    for fact, seconds in zip(facts, on_loaded, strict=True):
        by_kind.setdefault(fact.kind, []).append(seconds)
    table = [
        Row("history loaded: facts", rows, "rows", reference=f"{DAYS} days, {nodes:,} nodes"),
        Row("history loaded: database", size / 1e9, "GB"),
        Row("judgement p50, empty store", ms(on_empty, 50), "ms"),
        Row("judgement p99, empty store", ms(on_empty, 99), "ms"),
        Row("judgement p50, history loaded", ms(on_loaded, 50), "ms"),
        Row(
            "judgement p99, history loaded",
            ms(on_loaded, 99),
            "ms",
            f"≤ {P99_TARGET_MS:g}",
            ms(on_loaded, 99) <= P99_TARGET_MS,
            reference=f"{len(facts):,} facts, {found} findings raised",
        ),
    ]
    for kind, samples in sorted(by_kind.items()):
        table.append(Row(f"  {kind}: p99, history loaded", ms(samples, 99), "ms",
                         reference=f"p50 {ms(samples, 50):.2f} ms"))  # fmt: skip
    return table


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1,000 nodes, 500 facts a kind")
    parser.add_argument("--facts", type=int, help="new facts of each kind (default 2,000)")
    args = parser.parse_args()
    nodes = 1_000 if args.quick else NODES
    count = args.facts or (500 if args.quick else 2_000)
    rows = asyncio.run(run(nodes, count))
    return report(rows, "fleetrules", digits=2, nodes=nodes, facts_per_kind=count, days=DAYS)


if __name__ == "__main__":
    sys.exit(main())
