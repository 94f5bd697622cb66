"""Integration: the Kubernetes GPU stack check end to end. The real daemon runs under the
simulator (device plugin directory and CDI spec from the scenario and its faults) and
reads its Node from the test API server; findings reach the status, /metrics and
`gpuagent status`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import DaemonProcess, run_cli
from kubernetes_api import NODE, NODE_PATH, FakeApiServer, make_node, serve, write_kubeconfig

pytestmark = pytest.mark.integration

SCENARIO = '[node]\ngpus = 4\nmodel = "NVIDIA H100 80GB HBM3"\n'
GPU = "nvidia.com/gpu"


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with serve(FakeApiServer(make_node(allocatable={GPU: "4"}))) as fake:
        yield fake


def _config(kubeconfig: Path, grace: float = 0.0) -> str:
    return (
        "[checks.kubernetes]\nenabled = true\ninterval_seconds = 0.2\n"
        f"registration_grace_seconds = {grace}\n"
        f'[remediation.cordon.kubernetes]\nkubeconfig = "{kubeconfig}"\nnode_name = "{NODE}"\n'
    )


def _kubernetes(doc: dict[str, Any]) -> dict[str, Any] | None:
    """The node's kubernetes finding in a status document (only problems are listed)."""
    return next((f for f in doc["node"]["findings"] if f["check"] == "kubernetes"), None)


def _severity(severity: str) -> Any:
    def predicate(doc: dict[str, Any]) -> bool:
        finding = _kubernetes(doc)
        return (finding or {}).get("severity", "OK") == severity

    return predicate


def _advertise(api: FakeApiServer, count: int) -> None:
    """What kubelet does once the device plugin reports its devices."""
    api.node["status"]["allocatable"][GPU] = str(count)


def test_a_healthy_stack_is_ok_and_exported(run_daemon, api, tmp_path) -> None:
    daemon: DaemonProcess = run_daemon(
        SCENARIO, config_extra=_config(write_kubeconfig(tmp_path / "kc", api))
    )
    daemon.wait_for(lambda _doc: daemon.metric("gpuagent_kubernetes_gpus_allocatable") == 4)
    assert _kubernetes(daemon.status()) is None  # OK: not among the problems
    assert daemon.metric("gpuagent_node_check_health", check="kubernetes") == 0
    assert daemon.metric("gpuagent_kubernetes_gpus_allocatable", resource=GPU) == 4
    assert daemon.metric("gpuagent_kubernetes_gpus_capacity", resource=GPU) == 4
    assert daemon.metric("gpuagent_kubernetes_gpus_expected", resource=GPU) == 4
    assert daemon.metric("gpuagent_kubernetes_device_plugin_registered") == 1
    assert "gpuagent_cdi_gpus_missing 0.0" in daemon.metrics()
    # Read-only: the Node was only ever read.
    assert {(r.method, r.path) for r in api.requests} == {("GET", NODE_PATH)}


def test_faults_in_findings_metrics_and_status_out(run_daemon, api, tmp_path) -> None:
    daemon: DaemonProcess = run_daemon(
        SCENARIO, config_extra=_config(write_kubeconfig(tmp_path / "kc", api))
    )
    daemon.wait_for(lambda _doc: daemon.metric("gpuagent_kubernetes_gpus_allocatable") == 4)

    # The device plugin's socket goes: nothing can be allocated any more.
    daemon.inject("device_plugin_down", 0)
    doc = daemon.wait_for(_severity("CRITICAL"))
    finding = _kubernetes(doc)
    assert finding is not None
    assert "no device plugin socket" in finding["reason"]
    assert finding["runbook"] == "node-k8s-device-plugin"
    assert finding["action"] == "restart_device_plugin"
    assert daemon.metric("gpuagent_kubernetes_device_plugin_registered") == 0
    assert daemon.metric("gpuagent_node_check_health", check="kubernetes") == 2
    shown = daemon.cli("status", "--socket", str(daemon.socket))
    assert "CRITICAL kubernetes: no device plugin socket" in shown.stdout, shown.stdout
    daemon.inject("clear", 0)
    daemon.wait_for(_severity("OK"))

    # kubelet advertises a GPU fewer than the agent finds healthy ("nvidia.com/gpu: 3").
    _advertise(api, 3)
    doc = daemon.wait_for(_severity("CRITICAL"))
    finding = _kubernetes(doc)
    assert finding is not None
    assert "GPUs healthy but not advertised" in finding["reason"]
    assert finding["runbook"] == "node-k8s-gpus-not-advertised"
    daemon.wait_for(lambda _doc: daemon.metric("gpuagent_kubernetes_gpus_allocatable") == 3)
    _advertise(api, 4)
    daemon.wait_for(_severity("OK"))

    # A GPU the toolkit's CDI spec does not name.
    daemon.inject("cdi_stale", 2)
    doc = daemon.wait_for(_severity("WARN"))
    finding = _kubernetes(doc)
    assert finding is not None
    assert "CDI spec does not name 1 GPU: 2" in finding["reason"]
    assert daemon.metric("gpuagent_cdi_gpus_missing") == 1
    daemon.inject("clear", 2)
    daemon.wait_for(_severity("OK"))

    # A GPU the agent finds lost while the Node still advertises it.
    daemon.inject("gpu_lost", 1)
    doc = daemon.wait_for(_severity("WARN"))
    finding = _kubernetes(doc)
    assert finding is not None
    assert "unhealthy GPU advertised" in finding["reason"]
    assert finding["runbook"] == "node-k8s-unhealthy-gpu-advertised"
    assert daemon.metric("gpuagent_kubernetes_gpus_expected", resource=GPU) == 3


def test_within_the_grace_period_a_missing_plugin_is_a_warning(run_daemon, api, tmp_path) -> None:
    daemon: DaemonProcess = run_daemon(
        SCENARIO, config_extra=_config(write_kubeconfig(tmp_path / "kc", api), grace=3600)
    )
    _advertise(api, 0)
    daemon.inject("device_plugin_down", 3)
    finding = _kubernetes(
        daemon.wait_for(lambda doc: "no device plugin socket" in str(_kubernetes(doc)))
    )
    assert finding is not None
    assert finding["severity"] == "WARN"
    assert "GPUs healthy but not advertised" in finding["reason"]


def test_an_unreachable_api_server_is_unknown_not_critical(run_daemon, api, tmp_path) -> None:
    api.failures[("GET", NODE_PATH)] = 403
    daemon: DaemonProcess = run_daemon(
        SCENARIO, config_extra=_config(write_kubeconfig(tmp_path / "kc", api))
    )
    finding = _kubernetes(daemon.wait_for(_severity("WARN")))
    assert finding is not None
    assert "advertised GPUs unknown" in finding["reason"]
    assert "403" in finding["reason"]
    assert finding["runbook"] == "node-k8s-api"
    sources = {s["name"]: s for s in daemon.status()["sources"]}
    assert sources["kubernetes"]["up"] is False


def test_without_kubernetes_the_check_never_runs(run_daemon) -> None:
    daemon: DaemonProcess = run_daemon(SCENARIO)
    daemon.inject("device_plugin_down", 0)
    daemon.inject("cdi_stale", 1)
    daemon.wait_for(lambda doc: doc["node"]["health"] == "OK")
    text = daemon.metrics()
    assert "gpuagent_kubernetes_" not in text
    assert 'check="kubernetes"' not in text
    assert "kubernetes" not in {s["name"] for s in daemon.status()["sources"]}


def test_a_one_shot_check_reads_the_node_too(api, tmp_path) -> None:
    _advertise(api, 0)
    scenario = tmp_path / "scenario.toml"
    scenario.write_text(SCENARIO)
    config = tmp_path / "config.toml"
    config.write_text(
        "[sources.nvml]\ncall_timeout_seconds = 5\n"
        + _config(write_kubeconfig(tmp_path / "kc", api))
    )
    result = run_cli("check", "--json", "--config", str(config), "--simulate", str(scenario))
    assert "Traceback" not in result.stderr, result.stderr
    finding = _kubernetes(json.loads(result.stdout))
    assert finding is not None
    assert finding["severity"] == "CRITICAL"
    assert "allocatable 0, 4 healthy GPUs want 4" in finding["reason"]


def test_gpus_not_advertised_ask_for_a_cordon_by_default(run_daemon, api, tmp_path) -> None:
    kubeconfig = write_kubeconfig(tmp_path / "kc", api)
    # "auto": the check is on because the cordon goes through Kubernetes.
    extra = _config(kubeconfig).replace("enabled = true\n", "") + (
        '[remediation.cordon]\nbackends = ["kubernetes"]\n'
    )
    daemon: DaemonProcess = run_daemon(SCENARIO, config_extra=extra)
    _advertise(api, 0)
    daemon.wait_for(_severity("CRITICAL"))

    def planned() -> list[dict[str, Any]]:
        actions = daemon.call("actions", {"limit": 100})["actions"]
        return [a for a in actions if a["action"] == "cordon" and a["result"] == "planned"]

    daemon.wait_for(lambda _doc: bool(planned()))
    assert planned()[0]["check"] == "kubernetes"
    # Observe mode (the default): planned and audited, the Node never written.
    assert {r.method for r in api.requests} == {"GET"}
