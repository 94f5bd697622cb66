"""A kernel-log storm: one fatal XID and 100,000 channel teardowns it caused, on a
simulated 8-GPU node, end to end (kernel log → judgement → snapshot).

    .venv/bin/python bench/storm.py [--records N]

One fatal Xid 149 on GPU 2, then N `Xid 45 ... caused by previous Xid 149` lines over the
eight GPUs (seven processes each), written into the kernel-log FIFO of a daemon at the
default 5 s poll as fast as it reads them. Measured: how long until every record is read,
and until the judgement counts them all (GPU 2 CRITICAL with its own XID, the others
warning); /metrics latency idle and during the storm, from the same run; RSS before, at
its peak and after; log lines for the whole storm. Prints a table, writes
bench/results/storm.json; exits 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent / "agent"))

from gpuagent.client import call  # noqa: E402
from report import Row, percentile, report  # noqa: E402
from run import daemon, scrape_latencies  # noqa: E402

ROOT_GPU = 2
PROCESSES = 7
JUDGED_TARGET_SECONDS = 5.0
THROUGHPUT_TARGET = 20_000.0
IDLE_SCRAPES = 300


def storm_lines(buses: list[str], records: int) -> bytes:
    def short(bus: str) -> str:
        return bus.rsplit(".", 1)[0]

    # Stamped now on the kernel's clock (CLOCK_MONOTONIC), a microsecond apart.
    now = int(time.monotonic() * 1e6)
    root = (
        f"3,1,{now},-;NVRM: Xid (PCI:{short(buses[ROOT_GPU])}): 149, pid=900, "
        "name=python3, NETIR_LINK_EVT Fatal XC0 i0 Link 03 (0x00000004 0x0 0x0 0x0 0x0 0x0)"
    )
    lines = [root]
    for n in range(records):
        bus = short(buses[n % len(buses)])
        lines.append(
            f"3,{n + 2},{now + 1 + n},-;NVRM: Xid (PCI:{bus}): 45, pid={1000 + n % PROCESSES}, "
            f"name=python3, Ch {n:08x} caused by previous Xid 149"
        )
    return ("\n".join(lines) + "\n").encode()


def _xid_finding(gpu: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = next(f for f in gpu["findings"] if f["check"] == "xid")
    return found


def judged(status: dict[str, Any], records: int) -> bool:
    """Every record is in the judgement: GPU 2 CRITICAL by its own Xid 149 with its
    teardowns counted on it, every other GPU warning with its teardowns counted."""
    counted = 0
    for gpu in status["gpus"]:
        finding = _xid_finding(gpu)
        evidence = finding["evidence"]
        if gpu["index"] == ROOT_GPU:
            if finding["severity"] != "CRITICAL" or evidence["xid"] != 149:
                return False
            counted += evidence["consequences"] or 0
        elif finding["severity"] == "WARN" and evidence["root_xid"] == 149:
            counted += evidence["count"] or 0
    return counted == records


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    args = parser.parse_args()
    total = args.records + 1
    with daemon(8, interval=5.0) as d:
        assert d.process is not None
        process = psutil.Process(d.process.pid)
        buses = [g["pci_bus_id"] for g in call(d.socket, "status")["gpus"]]
        data = storm_lines(buses, args.records)
        scrape_latencies(d.port, 20)  # warm up
        # Idle latency before and after the storm (the same number of scrapes each), so a
        # hiccup of the machine weighs on both sides of the comparison alike.
        idle = scrape_latencies(d.port, IDLE_SCRAPES)
        rss_before = process.memory_info().rss / 1e6
        log_from = d.log.stat().st_size

        def write() -> None:
            with Path(d.kmsg).open("wb") as fifo:  # blocks while the daemon reads
                fifo.write(data)

        writer = threading.Thread(target=write)
        started = time.perf_counter()
        writer.start()
        during: list[float] = []
        rss_peak = rss_before
        read_seconds = judged_seconds = float("nan")
        deadline = started + 300
        while time.perf_counter() < deadline:
            # Scrapes close together (enough for a p99 of a storm of seconds), and a look
            # at the judgement every tenth of a second.
            for _ in range(10):
                during += scrape_latencies(d.port, 1)
                time.sleep(0.01)
            rss_peak = max(rss_peak, process.memory_info().rss / 1e6)
            status = call(d.socket, "status")
            now = time.perf_counter() - started
            if read_seconds != read_seconds and status["kmsg"]["records_read"] >= total:
                read_seconds = now
            if judged(status, args.records):
                judged_seconds = now
                break
        writer.join()
        time.sleep(11)  # past the next incident report
        rss_after = process.memory_info().rss / 1e6
        idle += scrape_latencies(d.port, IDLE_SCRAPES)
        cpu = process.cpu_times()
        log_lines = d.log.read_bytes()[log_from:].count(b"\n")
    idle_p99, storm_p99 = percentile(idle, 99), percentile(during, 99)
    throughput = total / judged_seconds
    rows = [
        Row("storm records", total, "records"),
        Row("all read", read_seconds, "s"),
        Row(
            "all judged",
            judged_seconds,
            "s",
            f"<= {JUDGED_TARGET_SECONDS:g}",
            judged_seconds <= JUDGED_TARGET_SECONDS,
        ),
        Row(
            "end-to-end throughput",
            throughput,
            "records/s",
            f">= {THROUGHPUT_TARGET:,.0f}",
            throughput >= THROUGHPUT_TARGET,
        ),
        Row("/metrics p99 idle", idle_p99, "ms"),
        Row(
            "/metrics p99 during the storm",
            storm_p99,
            "ms",
            "<= 5x idle",
            storm_p99 <= 5 * idle_p99,
            f"{storm_p99 / idle_p99:.1f}x idle, {len(during)} scrapes",
        ),
        Row("RSS before", rss_before, "MB"),
        Row("RSS peak during", rss_peak, "MB"),
        Row("RSS 10 s after", rss_after, "MB"),
        Row("log lines for the storm", log_lines, "lines", "<= 1000", log_lines <= 1000),
        Row("daemon CPU, whole run", cpu.user + cpu.system, "s"),
    ]
    return report(rows, "storm", digits=1, records=total, cpus=os.cpu_count())


if __name__ == "__main__":
    sys.exit(main())
