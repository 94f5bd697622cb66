"""gpuagent benchmarks: runs the real daemon on simulated nodes and measures it.

    scripts/bench              (sets up, then runs this file)
    .venv/bin/python bench/run.py [--quick]

Prints a table and writes bench/results/latest.json. Targets are checked here, never in
unit tests, so a busy machine cannot make the test suite flaky.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import http.client
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parent.parent
GPUAGENT = [sys.executable, "-m", "gpuagent"]
sys.path.insert(0, str(REPO / "agent"))

from gpuagent.client import call  # noqa: E402
from report import Row, free_port, percentile, report  # noqa: E402 - bench/ is the script's directory


class Daemon:
    """The real daemon under the simulator, with a NOTIFY_SOCKET to see READY=1."""

    def __init__(self, workdir: Path, gpus: int, interval: float, profiling: bool = True) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.socket = workdir / "api.sock"
        scenario = workdir / f"node-{gpus}.toml"
        # A busy HGX node: an HCA beside each GPU and a training process on each, so the
        # RDMA sysfs reads and the procfs look-ups of the GPU processes are in the cost.
        jobs = "".join(
            f'[[fault]]\ngpu = {i}\nkind = "process"\npid = {4000 + i}\n'
            f'name = "train.py"\nused_mib = 40000\n'
            for i in range(gpus)
        )
        # Every NVML call charged the CPU it takes on a real H200 (docs/simulation.md), so
        # the CPU figures predict a real node.
        scenario.write_text(
            f'[node]\ngpus = {gpus}\nmodel = "NVIDIA H100 80GB HBM3"\nib_hcas = {gpus}\n'
            f"nvml_costs = true\n{jobs}"
        )
        config = workdir / "config.toml"
        # The kernel log is a FIFO the benchmark can write to; sysfs an empty tree.
        self.kmsg = workdir / "kmsg"
        os.mkfifo(self.kmsg)
        (workdir / "sys" / "bus" / "pci" / "devices").mkdir(parents=True)
        config.write_text(
            f'[agent]\nstate_dir = "{workdir / "state"}"\n'
            f'[api]\nsocket = "{self.socket}"\n'
            f'[metrics]\nlisten = "127.0.0.1:{self.port}"\n'
            f"[sources.nvml]\ninterval_seconds = {interval}\n"
            f"profiling = {str(profiling).lower()}\n"
            f'[sources.kmsg]\npath = "{self.kmsg}"\n'
            f'[sources.sysfs]\nroot = "{workdir / "sys"}"\n'
        )
        self.log = workdir / "daemon.log"
        self.notify_path = workdir / "notify.sock"
        self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.notify.bind(str(self.notify_path))
        self.args = [*GPUAGENT, "run", "--config", str(config), "--simulate", str(scenario)]
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> float:
        """Start and wait for READY=1; returns seconds from exec to READY."""
        env = {**os.environ, "NOTIFY_SOCKET": str(self.notify_path)}
        started = time.perf_counter()
        with self.log.open("wb") as log:  # the daemon's log, for the benchmarks that count it
            self.process = subprocess.Popen(self.args, env=env, stdout=log, stderr=log)
        self.notify.settimeout(30)
        while True:
            message = self.notify.recv(4096).decode()
            if "READY=1" in message:
                return time.perf_counter() - started

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)
        self.notify.close()
        self.notify_path.unlink(missing_ok=True)


@contextlib.contextmanager
def daemon(gpus: int, interval: float, profiling: bool = True) -> Iterator[Daemon]:
    with tempfile.TemporaryDirectory(prefix="gpuagent-bench-") as tmp:
        d = Daemon(Path(tmp), gpus, interval, profiling)
        try:
            d.ready_seconds = d.start()  # type: ignore[attr-defined]
            yield d
        finally:
            d.stop()


def scrape_latencies(port: int, count: int, path: str = "/metrics") -> list[float]:
    samples = []
    for _ in range(count):
        started = time.perf_counter()
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        connection.request("GET", path)
        response = connection.getresponse()
        response.read()
        connection.close()
        if response.status != 200:
            raise RuntimeError(f"scrape failed: HTTP {response.status}")
        samples.append((time.perf_counter() - started) * 1000)
    return samples


def bench_scrapes(rows: list[Row], scrapes: int) -> dict[int, float]:
    p99s = {}
    for gpus in (8, 16):
        with daemon(gpus, interval=1.0) as d:
            scrape_latencies(d.port, 20)  # warm up
            samples = scrape_latencies(d.port, scrapes)
        p50, p99 = percentile(samples, 50), percentile(samples, 99)
        p99s[gpus] = p99
        target = gpus == 8
        rows.append(Row(f"scrape p50, {gpus} GPUs", p50, "ms"))
        rows.append(
            Row(
                f"scrape p99, {gpus} GPUs",
                p99,
                "ms",
                "< 5" if target else "",
                (p99 < 5) if target else None,
            )
        )
    return p99s


# The simulator's GPM entry points: the per-device ones count in calls_per_device too.
GPM_DEVICE_CALLS = ("nvmlGpmQueryDeviceSupport", "nvmlGpmSampleGet", "nvmlGpmMigSampleGet")
GPM_CALLS = (*GPM_DEVICE_CALLS, "nvmlGpmSampleAlloc", "nvmlGpmSampleFree", "nvmlGpmMetricsGet")


def _calls(before: dict[str, Any], after: dict[str, Any], names: tuple[str, ...]) -> int:
    return sum(after["calls"].get(n, 0) - before["calls"].get(n, 0) for n in names)


@dataclasses.dataclass
class CpuWindow:
    measured_pct: float  # the daemon's CPU, the simulator's own work included
    predicted_pct: float  # without the simulator's own work: what a real node would use
    before: dict[str, Any]  # the simulator's counters at the start and the end
    after: dict[str, Any]


def cpu_window(d: Daemon, seconds: float) -> CpuWindow:
    """The daemon's CPU over ``seconds`` (after start-up settles). The simulated library
    runs inside the daemon: its own work answering calls is taken off for the prediction,
    the measured cost of the real library's calls stays (charged, see sim/costs.py)."""
    assert d.process is not None
    proc = psutil.Process(d.process.pid)
    time.sleep(2)  # let start-up work settle
    before = call(d.socket, "simulator")
    cpu_before = sum(proc.cpu_times()[:2])
    wall_before = time.perf_counter()
    time.sleep(seconds)
    cpu_after = sum(proc.cpu_times()[:2])
    wall_after = time.perf_counter()
    after = call(d.socket, "simulator")
    cpu = cpu_after - cpu_before
    simulator = (after["simulator_cpu_ms"] - before["simulator_cpu_ms"]) / 1000
    wall = wall_after - wall_before
    return CpuWindow(cpu / wall * 100, (cpu - simulator) / wall * 100, before, after)


def daemon_cpu(seconds: float, *, profiling: bool, interval: float = 1.0) -> CpuWindow:
    """The CPU of a daemon with 8 GPUs."""
    with daemon(8, interval=interval, profiling=profiling) as d:
        return cpu_window(d, seconds)


def bench_daemon(rows: list[Row], seconds: float) -> float:
    """CPU and peak RSS at a 1 s and the default 5 s poll with 8 GPUs (GPM on, and off for
    comparison), NVML CPU and calls per GPU per poll (GPM's apart), READY."""
    with daemon(8, interval=1.0) as d:
        ready = d.ready_seconds  # type: ignore[attr-defined]
        assert d.process is not None
        window = cpu_window(d, seconds)
        peak_rss_mb = _peak_rss_kib(d.process.pid) / 1024
        status_times = []
        for _ in range(20):
            started = time.perf_counter()
            subprocess.run(
                [str(REPO / ".venv/bin/gpuagent"), "status", "--socket", str(d.socket)],
                check=True,
                stdout=subprocess.DEVNULL,
            )
            status_times.append(time.perf_counter() - started)
    before_calls, after_calls = window.before, window.after
    polls = after_calls["polls"] - before_calls["polls"]
    calls = sum(after_calls["calls_per_device"].values()) - sum(
        before_calls["calls_per_device"].values()
    )
    gpm_device = _calls(before_calls, after_calls, GPM_DEVICE_CALLS)
    per_gpu_poll = (calls - gpm_device) / 8 / max(polls, 1)
    gpm_per_gpu_poll = _calls(before_calls, after_calls, GPM_CALLS) / 8 / max(polls, 1)
    nvml_ms = (after_calls["charged_cpu_ms"] - before_calls["charged_cpu_ms"]) / 8 / max(polls, 1)
    without_gpm = daemon_cpu(seconds, profiling=False)
    default_poll = daemon_cpu(seconds, profiling=True, interval=5.0)
    rows.append(
        Row(
            "daemon CPU, 8 GPUs, 1 s poll, predicted",
            window.predicted_pct,
            "% of a core",
            "<= 2.5",
            window.predicted_pct <= 2.5,
        )
    )
    rows.append(
        Row(
            "daemon CPU, 8 GPUs, 5 s poll (default), predicted",
            default_poll.predicted_pct,
            "% of a core",
            "<= 0.6",
            default_poll.predicted_pct <= 0.6,
        )
    )
    rows.append(
        Row("daemon CPU, 8 GPUs, 1 s poll, simulator included", window.measured_pct, "% of a core")
    )
    rows.append(
        Row(
            "daemon CPU, 8 GPUs, 5 s poll, simulator included",
            default_poll.measured_pct,
            "% of a core",
        )
    )
    rows.append(
        Row(
            "daemon CPU, 8 GPUs, 1 s poll, GPM off, predicted",
            without_gpm.predicted_pct,
            "% of a core",
        )
    )
    rows.append(Row("NVML CPU per GPU per poll, 1 s poll", nvml_ms, "ms", "<= 2.5", nvml_ms <= 2.5))
    rows.append(Row("daemon peak RSS", peak_rss_mb, "MB", "<= 38", peak_rss_mb <= 38))
    rows.append(
        Row(
            "NVML calls per GPU per poll, without GPM",
            per_gpu_poll,
            "calls",
            "<= 12",
            per_gpu_poll <= 12,
        )
    )
    # One sample and one metrics call every profiling_interval_seconds (30 s): 1/15 per poll.
    rows.append(
        Row(
            "GPM calls per GPU per poll, 1 s poll",
            gpm_per_gpu_poll,
            "calls",
            "0.067",
            abs(gpm_per_gpu_poll - 2 / 30) < 0.02,
        )
    )
    readies = [ready]
    for _ in range(4):
        with daemon(8, interval=1.0) as again:
            readies.append(again.ready_seconds)  # type: ignore[attr-defined]
    ready_median = statistics.median(readies)
    rows.append(Row("start to READY (median of 5)", ready_median, "s", "< 2", ready_median < 2))
    status_median = statistics.median(status_times)
    rows.append(
        Row(
            "gpuagent status wall time (median of 20)",
            status_median,
            "s",
            "< 0.5",
            status_median < 0.5,
        )
    )
    return peak_rss_mb


def _peak_rss_kib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return float(line.split()[1])
    return float("nan")


def bench_node_exporter(rows: list[Row], scrapes: int, our_p99: float, our_rss: float) -> None:
    binary = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
    if binary is None:
        rows.append(Row("node_exporter comparison", float("nan"), "", reference="not installed"))
        return
    port = free_port()
    process = subprocess.Popen(
        [binary, f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                scrape_latencies(port, 1)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        scrape_latencies(port, 20)
        samples = scrape_latencies(port, scrapes)
        rss = psutil.Process(process.pid).memory_info().rss / 1e6
        peak_rss = _peak_rss_kib(process.pid) / 1024
    finally:
        process.terminate()
        process.wait(10)
    p99 = percentile(samples, 99)
    rows.append(
        Row("node_exporter scrape p99", p99, "ms", reference=f"ours/theirs = {our_p99 / p99:.2f}")
    )
    rows.append(
        Row(
            "node_exporter peak RSS",
            peak_rss,
            "MB",
            reference=f"ours/theirs = {our_rss / peak_rss:.2f} (current {rss:.1f} MB)",
        )
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10 s daemon window, 200 scrapes")
    args = parser.parse_args()
    scrapes = 200 if args.quick else 1000
    seconds = 10.0 if args.quick else 60.0
    rows: list[Row] = []
    p99s = bench_scrapes(rows, scrapes)
    rss = bench_daemon(rows, seconds)
    bench_node_exporter(rows, scrapes, p99s[8], rss)

    return report(rows, "latest", digits=3, quick=args.quick)


if __name__ == "__main__":
    sys.exit(main())
