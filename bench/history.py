"""What the aggregator's history costs at 10,000 nodes: the recorder's work per state
report, and writing its rows into the fleet store (SQLite on disk, the write-behind batch
path the aggregator uses).

    .venv/bin/python bench/history.py [--nodes N] [--minutes M]

Each node reports every 30 s for M simulated minutes (default 30) with a real 8-GPU status
document from the simulator; 1 % of the nodes lose a GPU half-way. Measured: recorder time
per report, rows written, store write time per row, and the database bytes per row, from
which a node's week (a sample every 300 s, `history_interval_seconds`) is extrapolated.
Prints a table, writes bench/results/history.json.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent / "agent"))

from gpuagent.aggregator.history import HistoryRecorder, HistoryRow  # noqa: E402
from gpuagent.aggregator.records import NodeRecord, from_online_state  # noqa: E402
from gpuagent.aggregator.store import FleetStore  # noqa: E402
from report import Row, report  # noqa: E402

INTERVAL = 300.0
REPORT_EVERY = 30.0
WEEK = 7 * 86400.0
RECORDER_TARGET_US = 50.0  # per report: a small share of the ~1 ms an ingest costs


def status_template() -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "gpuagent", "check", "--json", "--simulate",
         str(BENCH.parent / "scenarios" / "h100-healthy.toml")],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    doc: dict[str, Any] = json.loads(out.stdout)
    return doc


def message(node: str, when: float, status: dict[str, Any]) -> dict[str, Any]:
    return {
        "schema": 1, "type": "state", "id": f"{node}:state:{when}", "node": node,
        "cluster": "bench", "time": when, "online": True, "agent_version": "0.1.0",
        "status": status,
    }  # fmt: skip


def failed(status: dict[str, Any]) -> dict[str, Any]:
    gpus = [dict(g) for g in status["gpus"]]
    finding = {"check": "availability", "severity": "CRITICAL", "reason": "GPU lost"}
    gpus[3] = {**gpus[3], "health": "CRITICAL", "findings": [finding]}
    return {**status, "node": {**status["node"], "health": "CRITICAL"}, "gpus": gpus}


async def run(nodes: int, minutes: int) -> list[Row]:
    template = status_template()
    broken = failed(template)
    recorder = HistoryRecorder(INTERVAL)
    previous: dict[str, NodeRecord] = {}
    rows: list[HistoryRow] = []
    reports = 0
    spent = 0.0
    start = 1_795_000_000.0
    steps = int(minutes * 60 / REPORT_EVERY)
    for step in range(steps):
        now = start + step * REPORT_EVERY
        for i in range(nodes):
            node = f"node-{i:05d}"
            status = broken if i % 100 == 0 and step >= steps // 2 else template
            msg = message(node, now, status)
            record = dataclasses.replace(from_online_state(msg, "", now), document="")
            began = time.perf_counter()
            rows += recorder.rows(previous.get(node), record, status)
            spent += time.perf_counter() - began
            previous[node] = record
            reports += 1
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "fleet.sqlite"
        store = FleetStore(path, retention_seconds=WEEK, max_events=1_000_000)
        await store.open()
        began = time.perf_counter()
        for chunk in range(0, len(rows), 5000):  # the writer's batches
            store.queue_history(rows[chunk : chunk + 5000])
            await store.flush()
        written = time.perf_counter() - began
        await store.close()
        size = path.stat().st_size
    per_report_us = spent / reports * 1e6
    bytes_per_row = size / len(rows)
    samples_per_week = WEEK / INTERVAL
    return [
        Row("state reports", reports, "reports", reference=f"{nodes} nodes, {minutes} min"),
        Row("history rows", len(rows), "rows", reference="samples and transitions"),
        Row(
            "recorder per report",
            per_report_us,
            "µs",
            f"≤ {RECORDER_TARGET_US:g}",
            per_report_us <= RECORDER_TARGET_US,
        ),
        Row("store write per row", written / len(rows) * 1e6, "µs", reference="SQLite, batches"),
        Row("samples per second", nodes / INTERVAL, "rows/s", reference=f"{nodes} nodes"),
        Row("database per row", bytes_per_row, "bytes", reference="8-GPU sample"),
        Row(
            "a node's week",
            samples_per_week * bytes_per_row / 1e6,
            "MB",
            reference=f"{samples_per_week:.0f} samples",
        ),
        Row(
            "the fleet's week",
            nodes * samples_per_week * bytes_per_row / 1e9,
            "GB",
            reference=f"{nodes} nodes",
        ),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--minutes", type=int, default=30)
    args = parser.parse_args()
    rows = asyncio.run(run(args.nodes, args.minutes))
    return report(rows, "history", digits=2, nodes=args.nodes, minutes=args.minutes)


if __name__ == "__main__":
    sys.exit(main())
