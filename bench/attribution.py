"""Workload attribution's cost: the simulated 8-GPU node of bench/run.py with attribution
off, then on (a kubelet serving two time-sliced pods per GPU, every GPU process in a Slurm
job), measuring /metrics scrape latency and daemon CPU.

    .venv/bin/python bench/attribution.py [--quick]

Prints a table and writes bench/results/attribution.json; exits 1 when a target is missed
(the same as bench/run.py's: scrape p99 < 5 ms, daemon CPU < 2 % of a core, with it on).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent / "agent"))
sys.path.insert(0, str(BENCH.parent / "tests"))  # the kubelet stand-in the tests use

from gpuagent.client import call  # noqa: E402
from kubelet_podresources import FakeKubelet  # noqa: E402
from report import Row, percentile, report  # noqa: E402
from run import Daemon, scrape_latencies  # noqa: E402

GPUS = 8


class FileKubelet(FakeKubelet):
    """The kubelet stand-in serving the allocations a JSON file holds, re-read per call,
    and counting calls in another file: it runs in a process of its own, so its threads
    do not compete with the benchmark's scrapes for this process's GIL."""

    def __init__(self, socket: Path, allocations: Path, calls: Path) -> None:
        super().__init__(socket)
        self._allocations = allocations
        self._calls = calls

    def response(self) -> Any:
        self.allocations = [
            (pod, namespace, container, resource, tuple(ids))
            for pod, namespace, container, resource, ids in json.loads(
                self._allocations.read_text()
            )
        ]
        self._calls.write_text(str(self.calls))
        return super().response()


def serve_kubelet(workdir: Path) -> None:
    kubelet = FileKubelet(
        workdir / "kubelet.sock", workdir / "allocations.json", workdir / "calls"
    ).start()
    signal.sigwait({signal.SIGTERM})
    kubelet.stop()


class KubeletProcess:
    def __init__(self, workdir: Path) -> None:
        self.socket = workdir / "kubelet.sock"
        self._allocations = workdir / "allocations.json"
        self._calls = workdir / "calls"
        self._allocations.write_text("[]")
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        self._process = subprocess.Popen(
            [sys.executable, __file__, "--serve-kubelet", str(workdir)]
        )
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        deadline = time.monotonic() + 10
        while not self.socket.exists():
            if time.monotonic() > deadline:
                raise RuntimeError("the kubelet stand-in did not start")
            time.sleep(0.05)

    @property
    def calls(self) -> int:
        return int(self._calls.read_text()) if self._calls.exists() else 0

    def allocate(self, allocations: list[tuple[str, str, str, str, tuple[str, ...]]]) -> None:
        self._allocations.write_text(json.dumps(allocations))

    def stop(self) -> None:
        self._process.terminate()
        self._process.wait(10)


@contextlib.contextmanager
def node(*, attribution: bool, kubelet_interval: float) -> Iterator[tuple[Daemon, KubeletProcess]]:
    with tempfile.TemporaryDirectory(prefix="gpuagent-bench-attr-") as tmp:
        workdir = Path(tmp)
        kubelet = KubeletProcess(workdir)
        d = Daemon(workdir, GPUS, interval=1.0)
        try:
            if attribution:
                scenario = workdir / f"node-{GPUS}.toml"
                # Every training process in a Slurm job of its own.
                scenario.write_text(
                    scenario.read_text().replace(
                        'name = "train.py"\n', 'name = "train.py"\njob = 4242\n'
                    )
                )
                with (workdir / "config.toml").open("a") as config:
                    config.write(
                        "[attribution]\nkubernetes = true\nslurm = true\n"
                        f'pod_resources_socket = "{kubelet.socket}"\n'
                        f"interval_seconds = {kubelet_interval}\n"
                    )
            d.start()
            if attribution:
                uuids = [g["uuid"] for g in call(d.socket, "status")["gpus"]]
                kubelet.allocate(
                    [
                        (f"pod-{i}-{r}", "bench", "worker", "nvidia.com/gpu", (f"{uuid}::{r}",))
                        for i, uuid in enumerate(uuids)
                        for r in range(2)
                    ]
                )
                deadline = time.monotonic() + 30
                while not all(g["workloads"] for g in call(d.socket, "status")["gpus"]):
                    if time.monotonic() > deadline:
                        raise RuntimeError("the owners never showed in the status")
                    time.sleep(0.2)
            yield d, kubelet
        finally:
            d.stop()
            kubelet.stop()


def measure(
    rows: list[Row], *, attribution: bool, scrapes: int, seconds: float, interval: float = 10.0
) -> None:
    label = f"on, kubelet every {interval:g} s" if attribution else "off"
    with node(attribution=attribution, kubelet_interval=interval) as (d, kubelet):
        assert d.process is not None
        scrape_latencies(d.port, 20)
        samples = scrape_latencies(d.port, scrapes)
        proc = psutil.Process(d.process.pid)
        time.sleep(2)
        calls_before = kubelet.calls
        cpu_before = sum(proc.cpu_times()[:2])
        wall_before = time.perf_counter()
        time.sleep(seconds)
        cpu = (sum(proc.cpu_times()[:2]) - cpu_before) / (time.perf_counter() - wall_before)
        calls = kubelet.calls - calls_before
    p99 = percentile(samples, 99)
    rows.append(Row(f"scrape p50, attribution {label}", percentile(samples, 50), "ms"))
    rows.append(Row(f"scrape p99, attribution {label}", p99, "ms", "< 5", p99 < 5))
    rows.append(
        Row(f"daemon CPU, attribution {label}", cpu * 100, "% of a core", "< 2", cpu < 0.02)
    )
    if attribution:
        rows.append(Row(f"kubelet List calls per second, {label}", calls / seconds, "calls/s"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10 s CPU window, 200 scrapes")
    parser.add_argument("--serve-kubelet", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_kubelet is not None:
        serve_kubelet(args.serve_kubelet)
        return 0
    scrapes = 200 if args.quick else 1000
    seconds = 10.0 if args.quick else 60.0
    rows: list[Row] = []
    measure(rows, attribution=False, scrapes=scrapes, seconds=seconds)
    measure(rows, attribution=True, scrapes=scrapes, seconds=seconds)
    # Ten times the default: what the kubelet calls themselves cost.
    measure(rows, attribution=True, scrapes=scrapes, seconds=seconds, interval=1.0)
    return report(rows, "attribution", digits=3, quick=args.quick)


if __name__ == "__main__":
    sys.exit(main())
