"""Integration: who is on each GPU, in the real daemon under the simulator. A real gRPC
server in the test process plays the kubelet's pod-resources API; a simulated process in a
Slurm job's cgroup plays the job."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import DaemonProcess, parse_metrics
from gpuagent.sim.hardware import mig_device_uuid
from kubelet_podresources import FakeKubelet

pytestmark = pytest.mark.integration

Run = Callable[..., DaemonProcess]
NODE = '[node]\ngpus = 3\nmodel = "NVIDIA H100 80GB HBM3"\n'
K8S_LABELS = {"pod", "namespace", "container"}


@pytest.fixture
def kubelet(tmp_path: Path) -> Iterator[FakeKubelet]:
    server = FakeKubelet(tmp_path / "kubelet.sock").start()
    yield server
    server.stop()


def _attribution(kubelet: FakeKubelet, *, slurm: bool) -> str:
    return (
        f'[attribution]\nkubernetes = true\npod_resources_socket = "{kubelet.socket}"\n'
        f"slurm = {str(slurm).lower()}\ninterval_seconds = 0.5\ntimeout_seconds = 2.0\n"
    )


def _workloads(doc: dict[str, Any], index: int) -> list[dict[str, str]]:
    return next(g for g in doc["gpus"] if g["index"] == index)["workloads"]


def test_pods_and_jobs_on_each_gpu_end_to_end(run_daemon: Run, kubelet: FakeKubelet) -> None:
    daemon = run_daemon(NODE, config_extra=_attribution(kubelet, slurm=True))
    doc = daemon.wait_for(lambda d: len(d["gpus"]) == 3, timeout=15)
    uuid = {g["index"]: g["uuid"] for g in doc["gpus"]}
    # GPU 0 whole to one pod; GPU 1 time-sliced between two pods (replica IDs).
    kubelet.allocations = [
        ("train-0", "ml", "trainer", "nvidia.com/gpu", (uuid[0],)),
        ("infer-a", "serve", "server", "nvidia.com/gpu", (f"{uuid[1]}::0", f"{uuid[1]}::1")),
        ("infer-b", "serve", "server", "nvidia.com/gpu", (f"{uuid[1]}::2",)),
    ]
    # A process in Slurm job 42 on GPU 2; the new process also has the kubelet asked again.
    daemon.inject("process", 2, pid=4242, name="train.py", used_mib=2048, job=42)
    doc = daemon.wait_for(
        lambda d: bool(_workloads(d, 0)) and len(_workloads(d, 1)) == 2 and _workloads(d, 2),
        timeout=20,
    )
    assert _workloads(doc, 0) == [{"pod": "train-0", "namespace": "ml", "container": "trainer"}]
    assert _workloads(doc, 1) == [
        {"pod": "infer-a", "namespace": "serve", "container": "server"},
        {"pod": "infer-b", "namespace": "serve", "container": "server"},
    ]
    assert _workloads(doc, 2) == [{"hpc_job": "42"}]
    assert next(g for g in doc["gpus"] if g["index"] == 2)["processes"][0]["job"] == "42"
    assert next(s for s in doc["sources"] if s["name"] == "kubelet")["up"]

    # /metrics: dcgm-exporter's labels, one series per pod on the shared GPU.
    temp = "DCGM_FI_DEV_GPU_TEMP"
    assert daemon.metric(temp, gpu="0", pod="train-0", namespace="ml", container="trainer") > 0
    assert daemon.metric(temp, gpu="1", pod="infer-a") > 0
    assert daemon.metric(temp, gpu="1", pod="infer-b") > 0
    assert daemon.metric(temp, gpu="2", pod="", hpc_job="42") > 0

    # A finding on an owned GPU names who was on it (finding JSON, fleet copy, audit).
    daemon.inject("row_remap_failure", 0)
    doc = daemon.wait_for(lambda d: bool(d["gpus"][0]["findings"]), timeout=20)
    finding = doc["gpus"][0]["findings"][0]
    assert finding["evidence"]["workloads"] == "pod ml/train-0 (trainer)"

    # A kernel-log XID on GPU 0 is stamped with who was on it.
    bus = doc["gpus"][0]["pci_bus_id"]
    short = bus.rsplit(".", 1)[0]
    daemon.write_kernel_log(f"[ 1234.6] NVRM: Xid (PCI:{short}): 79, GPU has fallen off the bus.")
    daemon.wait_for(lambda d: any(f["check"] == "xid" for f in d["gpus"][0]["findings"]))
    events = daemon.call("events", {"gpu": bus})["events"]
    assert [(e["kind"], e["workloads"]) for e in events] == [("xid", "pod ml/train-0 (trainer)")]

    table = daemon.cli("status", "--socket", str(daemon.socket)).stdout
    assert "GPU 0: pod ml/train-0 (trainer)" in table
    assert "GPU 2: job 42" in table

    # The kubelet goes away: Kubernetes owners become unknown, the source shows it, the
    # daemon goes on; the Slurm job (from procfs) stays.
    kubelet.failing = True
    doc = daemon.wait_for(lambda d: not _workloads(d, 0), timeout=20)
    assert not next(s for s in doc["sources"] if s["name"] == "kubelet")["up"]
    assert _workloads(doc, 2) == [{"hpc_job": "42"}]


def test_attribution_off_reads_nothing_and_keeps_the_labels(
    run_daemon: Run, kubelet: FakeKubelet
) -> None:
    daemon = run_daemon(NODE)
    daemon.inject("process", 0, pid=4242, name="train.py", used_mib=2048, job=42)
    doc = daemon.wait_for(lambda d: bool(d["gpus"][0]["processes"]), timeout=15)
    assert all(g["workloads"] == [] for g in doc["gpus"])
    assert "job" not in doc["gpus"][0]["processes"][0]
    assert "kubelet" not in {s["name"] for s in doc["sources"]}
    assert kubelet.calls == 0
    families = {f.name: f for f in parse_metrics(daemon.metrics())}
    labels = set(families["DCGM_FI_DEV_GPU_TEMP"].samples[0].labels)
    assert not labels & (K8S_LABELS | {"hpc_job"})


MIG_NODE = (
    '[node]\ngpus = 2\nmodel = "NVIDIA H100 80GB HBM3"\nmig_mode = true\n'
    'mig_profiles = ["3g.40gb", "3g.40gb"]\n'
)


def test_pods_on_mig_devices_by_their_own_uuids_end_to_end(
    run_daemon: Run, kubelet: FakeKubelet
) -> None:
    daemon = run_daemon(MIG_NODE, config_extra=_attribution(kubelet, slurm=False))
    doc = daemon.wait_for(
        lambda d: (
            len(d["gpus"]) == 2 and all(len(g.get("mig_devices", ())) == 2 for g in d["gpus"])
        ),
        timeout=15,
    )
    gpu0 = next(g for g in doc["gpus"] if g["index"] == 0)
    # The UUIDs the driver gives, which name no GPU: the simulator derives them the same way.
    first, second = gpu0["mig_devices"]
    assert [(m["gpu_instance_id"], m["compute_instance_id"]) for m in gpu0["mig_devices"]] == [
        (1, 0),
        (2, 0),
    ]
    assert first["uuid"] == mig_device_uuid(gpu0["uuid"], 1, 0)
    assert second["uuid"] == mig_device_uuid(gpu0["uuid"], 2, 0)
    kubelet.allocations = [
        ("mig-a", "ml", "trainer", "nvidia.com/mig-3g.40gb", (first["uuid"],)),
        ("mig-b", "ml", "trainer", "nvidia.com/mig-3g.40gb", (second["uuid"],)),
    ]
    doc = daemon.wait_for(lambda d: len(_workloads(d, 0)) == 2, timeout=20)
    assert _workloads(doc, 0) == [
        {"pod": "mig-a", "namespace": "ml", "container": "trainer", "device": first["uuid"]},
        {"pod": "mig-b", "namespace": "ml", "container": "trainer", "device": second["uuid"]},
    ]
    assert _workloads(doc, 1) == []  # the other GPU's MIG devices are allocated to nobody

    # /metrics: one series per pod on the MIG GPU, as for a shared whole GPU.
    temp = "DCGM_FI_DEV_GPU_TEMP"
    assert daemon.metric(temp, gpu="0", pod="mig-a", namespace="ml", container="trainer") > 0
    assert daemon.metric(temp, gpu="0", pod="mig-b", namespace="ml", container="trainer") > 0
    assert daemon.metric(temp, gpu="1", pod="mig-a") == 0

    table = daemon.cli("status", "--socket", str(daemon.socket)).stdout
    assert f"GPU 0 on {first['uuid']}: pod ml/mig-a (trainer)" in table
