"""Workload attribution: Slurm cgroups, the kubelet's pod-resources API (a real gRPC server
in the test process), owners attached to GPUs, and their labels on /metrics."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import grpc
import pytest

from gpuagent.attribution.kubelet import KubeletClient
from gpuagent.attribution.owners import DeviceOwner, device_on_gpu, device_uuid
from gpuagent.attribution.slurm import SlurmStep, parse_cgroup
from gpuagent.attribution.source import TRACKER, AttributionSource, with_owner_evidence
from gpuagent.config import Config
from gpuagent.config.schema import AttributionSection
from gpuagent.model import (
    Finding,
    GpuProcess,
    GpuState,
    MigDevice,
    NodeHealth,
    Severity,
    Workload,
)
from gpuagent.render import render_status
from gpuagent.sources.procfs import ProcessTable
from gpuagent.statusview import status_document
from gpuagent.supervisor import SourceTracker
from kubelet_podresources import FakeKubelet
from test_metrics_support import ok_gpu, readings, samples, snapshot

GPU0 = "GPU-00000000-0000-0000-0000-000000000000"
GPU1 = "GPU-00000000-0000-0000-0000-000000000001"
MIG0 = "MIG-5c89852c-d268-5bcb-a7f9-6b9d3a4f8d9a"

# --- Slurm: the job in /proc/<pid>/cgroup -------------------------------------------------

CGROUP_V1_STEP = """\
12:hugetlb:/
11:memory:/slurm/uid_1000/job_4242/step_0/task_0
10:devices:/slurm/uid_1000/job_4242/step_0
9:pids:/system.slice/slurmd.service
4:cpuset:/slurm/uid_1000/job_4242/step_0
3:freezer:/slurm/uid_1000/job_4242/step_0
1:name=systemd:/system.slice/slurmd.service
0::/system.slice/slurmd.service
"""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # cgroup v2 (cgroup/v2 plugin): slurmstepd's scope, the step, the user's tasks.
        ("0::/system.slice/slurmstepd.scope/job_42/step_0/user/task_0\n", SlurmStep("42", "0")),
        (
            "0::/system.slice/slurmstepd.scope/job_1234/step_batch/user/task_0\n",
            SlurmStep("1234", "batch"),
        ),
        # slurmstepd itself, in the step's own leaf.
        ("0::/system.slice/slurmstepd.scope/job_7/step_extern/slurm\n", SlurmStep("7", "extern")),
        # cgroup v1: one line per hierarchy; only the controllers Slurm constrains say so.
        (CGROUP_V1_STEP, SlurmStep("4242", "0")),
        ("5:freezer:/slurm/uid_1000/job_42/step_interactive\n", SlurmStep("42", "interactive")),
        # Several slurmd on one host: /slurm_<node>.
        ("7:devices:/slurm_node07/uid_0/job_99/step_0/task_1\n", SlurmStep("99", "0")),
        # The job's own cgroup, before any step.
        ("0::/system.slice/slurmstepd.scope/job_5\n", SlurmStep("5", None)),
        # Not in a job: a login session, slurmd itself, a Kubernetes container.
        ("0::/user.slice/user-1000.slice/session-3.scope\n", None),
        ("0::/system.slice/slurmd.service\n", None),
        (
            (
                "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1b2c.slice/"
                "cri-containerd-4f1d.scope\n"
            ),
            None,
        ),
        # A job_<n> component outside Slurm's tree is someone else's name.
        ("0::/user.slice/job_42/step_0\n", None),
        ("", None),
        ("garbage\n", None),
    ],
)
def test_cgroup_parser_reads_slurm_layouts(text: str, expected: SlurmStep | None) -> None:
    assert parse_cgroup(text) == expected


def _entry(root: Path, pid: int, cgroup: str | None) -> None:
    entry = root / str(pid)
    entry.mkdir()
    (entry / "status").write_text("Name:\tpython3\nUid:\t0\t0\t0\t0\n")
    if cgroup is not None:
        (entry / "cgroup").write_text(cgroup)


def test_process_table_reads_the_job_only_with_slurm_on(tmp_path: Path) -> None:
    _entry(tmp_path, 10, "0::/system.slice/slurmstepd.scope/job_42/step_0/user/task_0\n")
    _entry(tmp_path, 11, "0::/user.slice/user-0.slice/session-1.scope\n")
    _entry(tmp_path, 12, None)  # no cgroup file (an old kernel, a racing exit): no job
    on = ProcessTable(tmp_path, slurm=True)
    assert [on.describe(GpuProcess(p, "x", 1.0)).job for p in (10, 11, 12)] == ["42", None, None]
    off = ProcessTable(tmp_path)
    assert off.describe(GpuProcess(10, "x", 1.0)).job is None


def test_a_real_process_cgroup_parses_without_error() -> None:
    # This very process: whatever the host's layout, a cgroup file parses to a job or None.
    text = Path(f"/proc/{os.getpid()}/cgroup").read_text()
    found = parse_cgroup(text)
    assert found is None or found.job.isdigit()


# --- Kubernetes: the kubelet's pod-resources API ------------------------------------------


@pytest.fixture
def kubelet(tmp_path: Path) -> Iterator[FakeKubelet]:
    server = FakeKubelet(tmp_path / "kubelet.sock").start()
    yield server
    server.stop()


def test_device_ids_map_to_nvml_uuids() -> None:
    assert device_uuid(GPU0) == GPU0
    assert device_uuid(f"{GPU0}::3") == GPU0  # a time-slicing replica
    assert device_uuid(MIG0) == MIG0


def test_client_lists_gpus_of_each_container_from_a_real_grpc_server(
    kubelet: FakeKubelet,
) -> None:
    kubelet.allocations = [
        ("train-0", "ml", "trainer", "nvidia.com/gpu", (GPU0,)),
        # Time-slicing: two replicas of GPU 1 to one container, one to another pod.
        ("infer-a", "serve", "server", "nvidia.com/gpu", (f"{GPU1}::0", f"{GPU1}::1")),
        ("infer-b", "serve", "server", "nvidia.com/gpu", (f"{GPU1}::2",)),
        ("mig-job", "ml", "worker", "nvidia.com/mig-1g.10gb", (MIG0,)),
        # Another device plugin's devices are not GPUs.
        ("net", "kube-system", "rdma", "rdma/hca", ("mlx5_0",)),
    ]
    client = KubeletClient(str(kubelet.socket), timeout=5.0)
    try:
        owners = client.list()
    finally:
        client.close()
    assert owners == (
        DeviceOwner(GPU0, "train-0", "ml", "trainer", "nvidia.com/gpu"),
        DeviceOwner(GPU1, "infer-a", "serve", "server", "nvidia.com/gpu"),
        DeviceOwner(GPU1, "infer-b", "serve", "server", "nvidia.com/gpu"),
        DeviceOwner(MIG0, "mig-job", "ml", "worker", "nvidia.com/mig-1g.10gb"),
    )


def test_client_fails_on_no_socket_and_on_an_error_status(
    tmp_path: Path, kubelet: FakeKubelet
) -> None:
    missing = KubeletClient(str(tmp_path / "absent.sock"), timeout=0.5)
    with pytest.raises(grpc.RpcError):
        missing.list()
    missing.close()
    kubelet.failing = True
    client = KubeletClient(str(kubelet.socket), timeout=2.0)
    with pytest.raises(grpc.RpcError) as raised:
        client.list()
    client.close()
    assert raised.value.code() == grpc.StatusCode.UNAVAILABLE


# --- owners attached to GPUs ----------------------------------------------------------------


def _source(**attribution: object) -> AttributionSource:
    config = Config(attribution=AttributionSection(**attribution))  # type: ignore[arg-type]
    return AttributionSource(config, {}, lambda: None)


def _gpus(*processes: tuple[GpuProcess, ...]) -> tuple[GpuState, ...]:
    return tuple(ok_gpu(i, replace(readings(i), processes=p)) for i, p in enumerate(processes))


def test_kubernetes_owners_attach_by_uuid_with_every_sharer_shown() -> None:
    source = _source(kubernetes=True)
    source.owners = (
        DeviceOwner(GPU0, "train-0", "ml", "trainer", "nvidia.com/gpu"),
        DeviceOwner(GPU1, "infer-a", "serve", "server", "nvidia.com/gpu"),
        DeviceOwner(GPU1, "infer-b", "serve", "server", "nvidia.com/gpu"),
        # Drivers before 470 named a MIG device after its GPU.
        DeviceOwner(f"MIG-{GPU0}/1/0", "mig-job", "ml", "worker", "nvidia.com/mig-1g.10gb"),
    )
    gpu0, gpu1, gpu2 = source.attach(_gpus((), (), ()))
    assert gpu0.workloads == (
        Workload(pod="train-0", namespace="ml", container="trainer"),
        Workload(pod="mig-job", namespace="ml", container="worker", device=f"MIG-{GPU0}/1/0"),
    )
    assert gpu1.workloads == (
        Workload(pod="infer-a", namespace="serve", container="server"),
        Workload(pod="infer-b", namespace="serve", container="server"),
    )
    assert gpu2.workloads == ()


MIG1 = "MIG-0b7e1d2c-3a4f-5e6d-8c9b-0a1f2e3d4c5b"


@pytest.mark.parametrize(
    ("device", "gpu", "migs", "expected"),
    [
        (GPU0, GPU0, (), ""),  # the whole GPU
        (GPU0, GPU1, (), None),
        (MIG0, GPU0, (MIG0, MIG1), MIG0),  # one of the GPU's MIG devices
        (MIG1, GPU0, (MIG0, MIG1), MIG1),
        (MIG0, GPU1, (MIG1,), None),  # another GPU's MIG device
        (MIG0, GPU0, (), None),  # MIG devices not known (yet): not guessed
        (f"MIG-{GPU0}/1/0", GPU0, (), f"MIG-{GPU0}/1/0"),  # drivers before 470
        (f"MIG-{GPU0}/1/0", GPU1, (MIG0,), None),
        (GPU0.replace("GPU-", "MIG-"), GPU0, (), None),  # a MIG UUID is not its GPU's
    ],
)
def test_devices_match_their_gpu_or_its_mig_devices(
    device: str, gpu: str, migs: tuple[str, ...], expected: str | None
) -> None:
    assert device_on_gpu(device, gpu, frozenset(migs)) == expected


def test_mig_device_owners_attach_to_the_gpu_listing_the_device() -> None:
    source = _source(kubernetes=True)
    source.owners = (
        DeviceOwner(MIG0, "a", "ml", "worker", "nvidia.com/mig-1g.10gb"),
        DeviceOwner(MIG1, "b", "ml", "worker", "nvidia.com/mig-3g.40gb"),
        DeviceOwner(GPU0, "whole", "ml", "worker", "nvidia.com/gpu"),
    )
    gpus = _gpus((), ())
    migs = (MigDevice(MIG0, 1, 0), MigDevice(MIG1, 2, 0))
    gpu1 = replace(gpus[1], readings=replace(readings(1), mig_devices=migs))
    gpu0, gpu1 = source.attach((gpus[0], gpu1))
    assert gpu0.workloads == (Workload(pod="whole", namespace="ml", container="worker"),)
    assert gpu1.workloads == (
        Workload(pod="a", namespace="ml", container="worker", device=MIG0),
        Workload(pod="b", namespace="ml", container="worker", device=MIG1),
    )


def test_unknown_owners_attach_nothing() -> None:
    source = _source(kubernetes=True)
    assert source.owners is None
    assert all(g.workloads == () for g in source.attach(_gpus((), ())))


def test_slurm_jobs_come_from_the_gpus_processes() -> None:
    source = _source(slurm=True)
    gpu0, gpu1 = source.attach(
        _gpus(
            (
                GpuProcess(10, "a", 1.0, job="117"),
                GpuProcess(11, "b", 1.0, job="42"),
                GpuProcess(12, "c", 1.0, job="42"),
            ),
            (GpuProcess(13, "d", 1.0),),
        )
    )
    assert gpu0.workloads == (Workload(hpc_job="42"), Workload(hpc_job="117"))
    assert gpu1.workloads == ()


async def test_a_new_process_asks_the_kubelet_again_and_failures_mark_owners_unknown(
    kubelet: FakeKubelet,
) -> None:
    trackers: dict[str, SourceTracker] = {}
    config = Config(
        attribution=AttributionSection(
            kubernetes=True, pod_resources_socket=str(kubelet.socket), interval_seconds=3600
        )
    )
    source = AttributionSource(config, trackers, lambda: None)
    kubelet.allocations = [("train-0", "ml", "trainer", "nvidia.com/gpu", (GPU0,))]
    task = asyncio.create_task(source.loop())
    try:
        async with asyncio.timeout(10):
            while source.owners is None:
                await asyncio.sleep(0.02)
        assert trackers[TRACKER].status.up
        assert kubelet.calls == 1
        source.attach(_gpus(()))
        # The interval is an hour: only the new process makes it ask again.
        kubelet.failing = True
        source.attach(_gpus((GpuProcess(10, "train.py", 1.0),)))
        async with asyncio.timeout(10):
            while source.owners is not None:
                await asyncio.sleep(0.02)
        status = trackers[TRACKER].status
        assert not status.up
        assert status.last_error is not None
        assert "kubelet is restarting" in status.last_error
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


# --- /metrics and status ----------------------------------------------------------------------

K8S_LABELS = ("pod", "namespace", "container")


def test_attribution_labels_follow_dcgm_exporter_one_series_per_owner() -> None:
    owned = replace(
        ok_gpu(0),
        workloads=(
            Workload(pod="infer-b", namespace="serve", container="server"),
            Workload(pod="infer-a", namespace="serve", container="server"),
        ),
    )
    snap = snapshot(gpus=(owned, ok_gpu(1)), attribution_labels=K8S_LABELS)
    temp = samples(snap)["DCGM_FI_DEV_GPU_TEMP"]
    assert sorted((s.labels["gpu"], s.labels["pod"], s.labels["namespace"]) for s in temp) == [
        ("0", "infer-a", "serve"),
        ("0", "infer-b", "serve"),
        ("1", "", ""),  # nobody's: empty, which PromQL reads as absent
    ]
    assert {s.labels["container"] for s in temp} == {"server", ""}
    # The agent's own per-GPU families keep their labels.
    assert "pod" not in samples(snap)["gpuagent_gpu_up"][0].labels


def test_hpc_job_label_and_attribution_off_leaves_labels_unchanged() -> None:
    jobbed = replace(ok_gpu(0), workloads=(Workload(hpc_job="42"),))
    on = samples(snapshot(gpus=(jobbed,), attribution_labels=("hpc_job",)))
    assert [s.labels["hpc_job"] for s in on["DCGM_FI_DEV_GPU_TEMP"]] == ["42"]
    off = samples(snapshot(gpus=(jobbed,)))
    labels = off["DCGM_FI_DEV_GPU_TEMP"][0].labels
    assert set(labels) == {
        "gpu",
        "UUID",
        "pci_bus_id",
        "device",
        "modelName",
        "Hostname",
        "DCGM_FI_DRIVER_VERSION",
    }


def test_status_document_shows_owners_and_jobs() -> None:
    gpu = replace(
        ok_gpu(
            0,
            replace(
                readings(0), processes=(GpuProcess(10, "a", 1.0, alive=True, user="bob", job="42"),)
            ),
        ),
        workloads=(
            Workload(pod="p", namespace="n", container="c", device=MIG0),
            Workload(hpc_job="42"),
        ),
    )
    doc = status_document(snapshot(gpus=(gpu,)))
    assert doc["gpus"][0]["workloads"] == [
        {"pod": "p", "namespace": "n", "container": "c", "device": MIG0},
        {"hpc_job": "42"},
    ]
    assert doc["gpus"][0]["processes"][0]["job"] == "42"


def test_problems_on_owned_gpus_name_their_owners() -> None:
    owned = replace(
        ok_gpu(0),
        workloads=(
            Workload(pod="p", namespace="n", container="c", device=MIG0),
            Workload(hpc_job="42"),
        ),
    )
    bad = Finding(
        check="ecc", severity=Severity.CRITICAL, reason="x", gpu=owned.identity.pci_bus_id
    )
    fine = replace(bad, severity=Severity.OK)
    other = replace(bad, gpu=ok_gpu(1).identity.pci_bus_id)
    health = with_owner_evidence(NodeHealth((bad, fine, other)), (owned, ok_gpu(1)))
    assert health.findings[0].evidence_dict() == {"workloads": f"pod n/p (c) on {MIG0}; job 42"}
    assert health.findings[1:] == (fine, other)


def test_status_table_lists_owners_only_when_there_are_some() -> None:
    gpu = replace(
        ok_gpu(0),
        workloads=(
            Workload(pod="p", namespace="n", container="c", device=MIG0),
            Workload(pod="q", namespace="n", container="c", hpc_job="42"),
        ),
    )
    table = render_status(status_document(snapshot(gpus=(gpu, ok_gpu(1)))), now=0.0)
    assert f"Workloads:\n  GPU 0 on {MIG0}: pod n/p (c)\n  GPU 0: pod n/q (c), job 42\n" in table
    assert "Workloads:" not in render_status(status_document(snapshot()), now=0.0)


def test_the_daemon_does_not_load_grpc_unless_kubernetes_attribution_is_on() -> None:
    probe = "import sys, gpuagent.daemon; print(sorted(m for m in sys.modules if 'grpc' in m))"
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"
