"""Integration: kernel-log lines, NVML XID events, drills and bus events through the real
daemon on a simulated node, checked in status, the events API and /metrics."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from conftest import DaemonProcess, parse_metrics, start_daemon
from gpuagent.client import ClientError

pytestmark = pytest.mark.integration

H100 = '[node]\ngpus = 8\nmodel = "NVIDIA H100 80GB HBM3"\n'
Run = Callable[..., DaemonProcess]


def _gpu(doc: dict[str, Any], index: int) -> dict[str, Any]:
    return next(g for g in doc["gpus"] if g["index"] == index)


def _finding(doc: dict[str, Any], index: int, check: str) -> dict[str, Any] | None:
    return next((f for f in _gpu(doc, index)["findings"] if f["check"] == check), None)


def _samples(text: str, name: str) -> list[Any]:
    return [s for f in parse_metrics(text) for s in f.samples if s.name == name]


def test_kernel_log_xid_becomes_a_finding_a_metric_and_an_event(run_daemon: Run) -> None:
    daemon = run_daemon(H100)
    bus = _gpu(daemon.status(), 2)["pci_bus_id"]  # 0000:3a:00.0
    short = bus.rsplit(".", 1)[0]
    daemon.write_kernel_log(
        "[ 1234.5] some unrelated driver chatter",
        f"[ 1234.6] NVRM: Xid (PCI:{short}): 79, pid=4242, name=train.py, "
        "GPU has fallen off the bus.",
    )
    doc = daemon.wait_for(lambda d: _finding(d, 2, "xid") is not None, timeout=5)
    finding = _finding(doc, 2, "xid")
    assert finding is not None
    assert finding["severity"] == "CRITICAL"
    assert "reboot" in finding["reason"]
    assert _gpu(doc, 1)["health"] == "OK"
    events = daemon.call("events", {"gpu": bus})["events"]
    assert [(e["kind"], e["code"], e["source"]) for e in events] == [("xid", 79, "kmsg")]
    assert events[0]["process"] == "train.py"
    metrics = daemon.metrics()
    last = {s.labels["gpu"]: s.value for s in _samples(metrics, "DCGM_FI_DEV_XID_ERRORS")}
    assert last["2"] == 79.0
    assert last["0"] == 0.0
    totals = [
        (s.labels["gpu"], s.labels["xid"], s.value)
        for s in _samples(metrics, "gpuagent_xid_errors_total")
    ]
    assert totals == [("2", "79", 1.0)]
    read = _samples(metrics, "gpuagent_kmsg_records_read_total")
    assert read[0].value == 2.0


def test_drill_is_one_event_although_kmsg_and_nvml_both_see_it(run_daemon: Run) -> None:
    daemon = run_daemon(H100)
    result = daemon.cli("inject", "--socket", str(daemon.socket), "xid", "48", "--gpu", "5")
    assert result.returncode == 0, result.stderr
    bus = _gpu(daemon.status(), 5)["pci_bus_id"]
    daemon.wait_for(lambda d: _finding(d, 5, "xid") is not None, timeout=5)
    # Give the second source time to report too; the event log must keep one.
    daemon.call("refresh")
    daemon.call("refresh")
    events = daemon.call("events", {"gpu": bus})["events"]
    assert len(events) == 1
    assert events[0]["code"] == 48
    assert events[0]["source"] in {"drill", "nvml"}
    totals = _samples(daemon.metrics(), "gpuagent_xid_errors_total")
    assert [s.value for s in totals] == [1.0]


def test_a_drill_says_drill_everywhere_and_clear_drills_ends_it(run_daemon: Run) -> None:
    daemon = run_daemon(H100)
    socket = str(daemon.socket)
    result = daemon.cli("inject", "--socket", socket, "xid", "79", "--gpu", "3")
    assert result.returncode == 0, result.stderr
    assert f"wrote to {daemon.kmsg}: NVRM: Xid" in result.stdout

    def drilled(doc: dict[str, Any]) -> bool:
        finding = _finding(doc, 3, "xid")
        return finding is not None and finding["drill"] is True

    doc = daemon.wait_for(drilled, timeout=10)
    finding = _finding(doc, 3, "xid")
    assert finding is not None
    assert finding["severity"] == "CRITICAL"
    assert finding["reason"].startswith("DRILL: Xid 79")
    drills = [
        (s.labels["gpu"], s.labels["check"])
        for s in _samples(daemon.metrics(), "gpuagent_gpu_drill")
    ]
    assert drills == [("3", "xid")]
    # A real fault on another GPU is no drill.
    bus = _gpu(doc, 1)["pci_bus_id"].rsplit(".", 1)[0]
    daemon.write_kernel_log(
        f"NVRM: Xid (PCI:{bus}): 79, pid=1, name=x, GPU has fallen off the bus."
    )
    doc = daemon.wait_for(lambda d: _finding(d, 1, "xid") is not None, timeout=10)
    real = _finding(doc, 1, "xid")
    assert real is not None
    assert (real["drill"], real["reason"].startswith("DRILL")) == (False, False)
    ended = daemon.cli("inject", "--socket", socket, "clear-drills")
    assert ended.returncode == 0, ended.stderr
    assert "drill events forgotten" in ended.stdout
    doc = daemon.wait_for(lambda d: _finding(d, 3, "xid") is None, timeout=10)
    assert _finding(doc, 1, "xid") is not None  # real events stay
    assert _samples(daemon.metrics(), "gpuagent_gpu_drill") == []
    actions = daemon.call("actions", {"limit": 10})["actions"]
    assert [a["action"] for a in actions].count("clear_drills") == 1


def test_a_drill_on_a_node_that_is_not_simulated_needs_yes(tmp_path: Path) -> None:
    daemon = start_daemon(tmp_path / "node", "", simulate=False)
    try:
        params = {"kind": "xid", "gpu": 0, "values": {"code": 79}}
        with pytest.raises(ClientError, match=f"writes a real kernel-log line to {daemon.kmsg}"):
            daemon.call("drill", params)
        # Nothing was written: the first record the daemon reads is the test's own.
        daemon.write_kernel_log("NVRM: Xid (PCI:0000:99:00): 13, pid=1, name=x, Graphics Exception")
        deadline = time.monotonic() + 20
        while daemon.metric("gpuagent_kmsg_records_read_total") < 1:
            assert time.monotonic() < deadline, "the daemon did not read the kernel log"
            time.sleep(0.1)
        assert daemon.metric("gpuagent_kmsg_records_read_total") == 1
        events = daemon.call("events", {"limit": 10})["events"]
        assert [e["source"] for e in events] == ["kmsg"]
        # With --yes it goes on (here to find no GPU 0 on this machine).
        with pytest.raises(ClientError, match="no GPU with index 0"):
            daemon.call("drill", {**params, "yes": True})
    finally:
        daemon.stop()


def test_nvml_xid_event_alone_is_heard(run_daemon: Run) -> None:
    daemon = run_daemon(H100)
    daemon.inject("xid", 6, xid=95)
    doc = daemon.wait_for(lambda d: _finding(d, 6, "xid") is not None, timeout=5)
    finding = _finding(doc, 6, "xid")
    assert finding is not None
    assert finding["severity"] == "CRITICAL"
    events = daemon.call("events", {"gpu": _gpu(doc, 6)["pci_bus_id"]})["events"]
    assert [(e["source"], e["code"]) for e in events] == [("nvml", 95)]


def test_gpu_removed_from_the_bus_is_critical_at_once_and_comes_back(run_daemon: Run) -> None:
    daemon = run_daemon(H100, interval=5.0)  # slow poll: the finding must not wait for it
    daemon.inject("pci_remove", 4)
    doc = daemon.status()
    bus_finding = _finding(doc, 4, "bus")
    assert bus_finding is not None
    assert bus_finding["severity"] == "CRITICAL"
    daemon.inject("pci_add", 4)
    daemon.wait_for(lambda d: _gpu(d, 4)["health"] == "OK", timeout=15)


def test_malformed_kernel_records_are_counted_and_the_daemon_carries_on(run_daemon: Run) -> None:
    daemon = run_daemon(H100)
    daemon.write_kernel_log("3,notanumber,x,-;NVRM: Xid (PCI:0000:18:00): 13, broken")
    # Stamped now (µs since boot): a record older than sources.kmsg.lookback_seconds is
    # history, skipped, on a host up for longer than that.
    now_us = int(time.monotonic() * 1_000_000)
    daemon.write_kernel_log(f"3,5,{now_us},-;NVRM: Xid (PCI:0000:18:00): 13, pid=1, name=a, x")

    def unparsed(_doc: dict[str, Any]) -> bool:
        return _doc["kmsg"]["lines_unparsed"] == 1 and _doc["recent_events"] == 1

    daemon.wait_for(unparsed, timeout=5)
    log = (daemon.workdir / "daemon.log").read_text()
    assert log.count("unparseable kernel log record") == 1


def test_an_operational_event_and_its_xid_line_are_one_event(run_daemon: Run) -> None:
    daemon = run_daemon(
        H100 + 'driver_version = "615.10.01"\n',
        config_extra="[sources.nvml_events]\noperational = true\n",
    )
    bus = _gpu(daemon.status(), 3)["pci_bus_id"]
    short = bus.rsplit(".", 1)[0]
    daemon.inject("operational_event", 3, xid=79)
    daemon.wait_for(lambda d: _finding(d, 3, "xid") is not None, timeout=5)
    daemon.write_kernel_log(
        f"[ 99.1] NVRM: Xid (PCI:{short}): 79, pid=4242, name=train.py, GPU has fallen off the bus."
    )
    # The kernel line's content joins the one event; no second one comes.
    doc = daemon.wait_for(
        lambda d: daemon.call("events", {"gpu": bus})["events"][0]["source"] == "kmsg", timeout=5
    )
    events = daemon.call("events", {"gpu": bus})["events"]
    assert [(e["kind"], e["code"]) for e in events] == [("xid", 79)]
    assert events[0]["id"].startswith("nvml-op:")
    assert events[0]["process"] == "train.py"
    finding = _finding(doc, 3, "xid")
    assert finding is not None
    assert finding["severity"] == "CRITICAL"
