"""Integration: the Kubernetes output end to end. The real daemon runs under the simulator,
in observe mode (the default), and writes its Node's conditions and events to the test
API server through the real client library."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import DaemonProcess, deadline_in, kernel_record
from kubernetes_api import (
    EVENTS_PATH,
    READY,
    STATUS_PATH,
    FakeApiServer,
    make_node,
    serve,
    write_kubeconfig,
)

pytestmark = pytest.mark.integration

SCENARIO = '[node]\ngpus = 4\nmodel = "NVIDIA H100 80GB HBM3"\n'
CLASSES = (
    "GpuLost",
    "GpuXidCritical",
    "GpuMemoryErrors",
    "GpuFabricDegraded",
    "GpuDriverProblem",
    "GpuThermalProblem",
    "GpuPcieDegraded",
)
# Someone else's condition on the Node: it must stay exactly as it is.
OTHERS = {
    "type": "example.com/DiskPressureCustom",
    "status": "False",
    "reason": "Fine",
    "message": "not ours",
    "lastHeartbeatTime": "2024-05-01T10:00:00Z",
    "lastTransitionTime": "2024-04-01T10:00:00Z",
}


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    node = make_node()
    node["status"]["conditions"].append(dict(OTHERS))
    with serve(FakeApiServer(node)) as fake:
        yield fake


def _config(kubeconfig: Path) -> str:
    return (
        f'[outputs.kubernetes]\nenabled = true\nkubeconfig = "{kubeconfig}"\n'
        'node_name = "gpu-node-1"\nmin_interval_seconds = 0.2\n'
    )


def _start(run_daemon: Callable[..., DaemonProcess], api: FakeApiServer, tmp: Path) -> Any:
    return run_daemon(SCENARIO, config_extra=_config(write_kubeconfig(tmp / "kc", api)))


def _until(predicate: Callable[[], bool], seconds: float, what: str) -> None:
    deadline = deadline_in(seconds)
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {seconds} s: {what}")
        time.sleep(0.05)


def _status(api: FakeApiServer, kind: str) -> str | None:
    condition = api.condition(kind)
    return None if condition is None else str(condition["status"])


def _events(api: FakeApiServer, reason: str) -> list[Any]:
    return [e for e in list(api.events.values()) if e["reason"] == reason]


def test_a_dbe_sets_and_clears_conditions_one_patch_per_change(run_daemon, api, tmp_path) -> None:
    daemon = _start(run_daemon, api, tmp_path)
    _until(lambda: _status(api, "GpuHealthy") == "True", 10, "GpuHealthy=True")
    assert all(_status(api, kind) == "False" for kind in CLASSES)
    healthy_since = api.condition("GpuHealthy")["lastTransitionTime"]

    # Nothing changes for many polls: nothing is written.
    patches = api.requests_to("PATCH", STATUS_PATH)
    sequence = daemon.status()["sequence"]
    daemon.wait_for(lambda doc: doc["sequence"] >= sequence + 10)
    assert api.requests_to("PATCH", STATUS_PATH) == patches

    # A double-bit error on GPU 1: within a poll, one patch says it in both conditions.
    daemon.inject("ecc_dbe", 1, count=1)
    _until(lambda: _status(api, "GpuMemoryErrors") == "True", 2, "GpuMemoryErrors=True")
    assert _status(api, "GpuHealthy") == "False"
    memory = api.condition("GpuMemoryErrors")
    assert memory["reason"] == "GpuEccDbe"
    assert memory["message"].startswith("GPU 1 (")
    assert "ecc: " in memory["message"]
    assert api.condition("GpuHealthy")["reason"] == "GpuUnhealthy"
    assert _status(api, "GpuXidCritical") == "False"
    sequence = daemon.status()["sequence"]
    daemon.wait_for(lambda doc: doc["sequence"] >= sequence + 10)
    assert api.requests_to("PATCH", STATUS_PATH) == patches + 1

    # The kubelet's condition and someone else's are as they were.
    assert api.condition("Ready") == READY
    assert api.condition(OTHERS["type"]) == OTHERS

    # Cleared: both back, and the summary's transition time moved.
    daemon.inject("clear", 1)
    _until(lambda: _status(api, "GpuMemoryErrors") == "False", 5, "GpuMemoryErrors=False")
    _until(lambda: _status(api, "GpuHealthy") == "True", 5, "GpuHealthy=True again")
    assert api.condition("GpuMemoryErrors")["reason"] == "NoGpuMemoryErrors"
    assert api.condition("GpuHealthy")["lastTransitionTime"] >= healthy_since

    # A GPU lost and back: an event each, and the GpuLost condition set and cleared.
    daemon.inject("gpu_lost", 2)
    _until(lambda: _status(api, "GpuLost") == "True", 5, "GpuLost=True")
    _until(lambda: len(_events(api, "GpuLost")) == 1, 5, "a GpuLost event")
    lost = _events(api, "GpuLost")[0]
    assert lost["type"] == "Warning"
    assert lost["note"].startswith("GPU 2 (")
    assert lost["regarding"] == {
        "apiVersion": "v1",
        "kind": "Node",
        "name": "gpu-node-1",
        "uid": api.node["metadata"]["uid"],
    }
    daemon.inject("clear", 2)
    _until(lambda: _status(api, "GpuLost") == "False", 5, "GpuLost=False")
    _until(lambda: len(_events(api, "GpuRecovered")) == 1, 5, "a GpuRecovered event")
    assert _events(api, "GpuRecovered")[0]["type"] == "Normal"


def test_a_restart_with_the_fault_gone_clears_what_was_left(run_daemon, api, tmp_path) -> None:
    # What an agent that stopped while GPU 1 had a DBE left on the Node.
    left = {
        "lastHeartbeatTime": "2024-05-01T10:00:00Z",
        "lastTransitionTime": "2024-05-01T09:00:00Z",
    }
    api.node["status"]["conditions"] += [
        {"type": "GpuMemoryErrors", "status": "True", "reason": "GpuEccDbe", "message": "old"}
        | left,
        {"type": "GpuHealthy", "status": "False", "reason": "GpuUnhealthy", "message": "old"}
        | left,
    ]
    _start(run_daemon, api, tmp_path)
    _until(lambda: _status(api, "GpuMemoryErrors") == "False", 10, "GpuMemoryErrors cleared")
    _until(lambda: _status(api, "GpuHealthy") == "True", 10, "GpuHealthy=True")
    assert api.condition("GpuMemoryErrors")["lastTransitionTime"] > left["lastTransitionTime"]
    assert api.condition("GpuMemoryErrors")["message"] == "no critical finding"
    # The first write is one patch with every condition; others' are untouched.
    first = next(r for r in api.requests if r.path == STATUS_PATH)
    assert {c["type"] for c in first.body["status"]["conditions"]} == {"GpuHealthy", *CLASSES}
    assert api.condition("Ready") == READY
    assert api.condition(OTHERS["type"]) == OTHERS


def test_an_xid_storm_is_one_event_counted_on(run_daemon, api, tmp_path) -> None:
    daemon = _start(run_daemon, api, tmp_path)
    _until(lambda: _status(api, "GpuHealthy") == "True", 10, "the first write")
    bus = daemon.status()["gpus"][3]["pci_bus_id"]
    short = bus.rsplit(".", 1)[0]
    line = f"NVRM: Xid (PCI:{short}): 13, pid=4100, name=train.py, Graphics Exception: ESR 0x4041b0"
    daemon.write_kernel_log(*(kernel_record(seq, line) for seq in range(1, 401)))

    # One event for the incident; its series counts every record as the incident grows.
    _until(lambda: len(_events(api, "Xid13")) == 1, 5, "the incident's event")
    event = _events(api, "Xid13")[0]
    assert event["type"] == "Warning"
    assert event["note"].startswith(f"{bus}: ")
    assert event["reportingController"] == "gpuagent.io/agent"

    def counted() -> bool:
        return (_events(api, "Xid13")[0].get("series") or {}).get("count") == 400

    _until(counted, 15, "series.count == 400")
    xid_posts = [
        r for r in list(api.requests) if r.method == "POST" and r.body["reason"] == "Xid13"
    ]
    assert len(xid_posts) == 1
    assert api.requests_to("POST", EVENTS_PATH) < 10  # with observe mode's planned actions
    name = event["metadata"]["name"]
    assert api.requests_to("PATCH", f"{EVENTS_PATH}/{name}") <= 3


def test_an_api_server_that_fails_is_retried_and_the_latest_state_written(
    run_daemon, api, tmp_path
) -> None:
    api.failures[("PATCH", STATUS_PATH)] = 500
    # Events refused for good (no RBAC for them): dropped, never holding up the conditions.
    api.failures[("POST", EVENTS_PATH)] = 403
    daemon = _start(run_daemon, api, tmp_path)
    daemon.inject("ecc_dbe", 0, count=1)
    daemon.inject("gpu_lost", 1)

    def down(doc: dict[str, Any]) -> bool:
        source = next((s for s in doc["sources"] if s["name"] == "kubernetes_output"), {})
        return source.get("up") is False and "HTTP 500" in (source.get("last_error") or "")

    daemon.wait_for(down)
    assert api.condition("GpuMemoryErrors") is None
    del api.failures[("PATCH", STATUS_PATH)]
    # Back: what the agent sees now is written (backoff is at most a few seconds here).
    _until(lambda: _status(api, "GpuMemoryErrors") == "True", 20, "GpuMemoryErrors=True")
    assert _status(api, "GpuLost") == "True"
    assert api.events == {}
    daemon.wait_for(
        lambda doc: next(s for s in doc["sources"] if s["name"] == "kubernetes_output")["up"]
    )
