"""The Slurm cordon backend: scontrol output parsing, and drain/resume against a real
single-node cluster (munged, slurmctld and slurmd from Debian's packages; see
slurm_cluster.py)."""

from __future__ import annotations

import stat
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuagent.remediation.slurm import (
    SlurmBackend,
    SlurmBackendError,
    parse_node_state,
    sanitise_reason,
)
from gpuagent.remediation.types import CordonRequest
from slurm_cluster import SlurmCluster, require_programs, start_cluster

REQUEST = CordonRequest(
    node="ignored: the backend drains the node it was built for",
    cluster="test",
    reason="GPU 0000:3b:00.0: 1 uncorrectable ECC error (ecc)",
    request_id="test:1",
)
OUR_REASON = "gpuagent: GPU 0000:3b:00.0: 1 uncorrectable ECC error (ecc)"

# --- `scontrol show node NODE --oneliner`, as Slurm 22.05 printed it --------------------

IDLE = (
    "NodeName=gpu-test-01 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=2 CPUTot=2"
    " CPULoad=0.11 AvailableFeatures=(null) ActiveFeatures=(null) Gres=(null)"
    " NodeAddr=127.0.0.1 NodeHostName=vm Version=22.05.8 OS=Linux 6.18.44-fc-v669 #1 SMP"
    " PREEMPT_DYNAMIC @0  RealMemory=1000 AllocMem=0 FreeMem=23711 Sockets=2 Boards=1"
    " State=IDLE ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=gpu"
    "  BootTime=2026-11-22T13:14:21 SlurmdStartTime=2026-11-22T14:52:50"
    " LastBusyTime=2026-11-22T14:52:51 CfgTRES=cpu=2,mem=1000M,billing=2 AllocTRES="
    " CapWatts=n/a CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0"
    " ExtSensorsTemp=n/s"
)
IDLE_DRAIN_OURS = (
    "NodeName=gpu-test-01 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=2 CPUTot=2"
    " CPULoad=0.11 AvailableFeatures=(null) ActiveFeatures=(null) Gres=(null)"
    " NodeAddr=127.0.0.1 NodeHostName=vm Version=22.05.8 OS=Linux 6.18.44-fc-v669 #1 SMP"
    " PREEMPT_DYNAMIC @0  RealMemory=1000 AllocMem=0 FreeMem=23711 Sockets=2 Boards=1"
    " State=IDLE+DRAIN ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A"
    " Partitions=gpu  BootTime=2026-11-22T13:14:21 SlurmdStartTime=2026-11-22T14:52:50"
    " LastBusyTime=2026-11-22T14:52:51 CfgTRES=cpu=2,mem=1000M,billing=2 AllocTRES="
    " CapWatts=n/a CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0"
    " ExtSensorsTemp=n/s Reason=gpuagent: GPU 0000:3b:00.0: 1 uncorrectable ECC error (ecc)"
    " [root@2026-11-22T14:52:56]"
)
MIXED_DRAIN_OURS = (
    "NodeName=gpu-test-01 Arch=x86_64 CoresPerSocket=1  CPUAlloc=1 CPUEfctv=2 CPUTot=2"
    " CPULoad=0.09 AvailableFeatures=(null) ActiveFeatures=(null) Gres=(null)"
    " NodeAddr=127.0.0.1 NodeHostName=vm Version=22.05.8 OS=Linux 6.18.44-fc-v669 #1 SMP"
    " PREEMPT_DYNAMIC @0  RealMemory=1000 AllocMem=1000 FreeMem=23841 Sockets=2 Boards=1"
    " State=MIXED+DRAIN ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A"
    " Partitions=gpu  BootTime=2026-11-22T13:14:20 SlurmdStartTime=2026-11-22T14:52:50"
    " LastBusyTime=2026-11-22T14:53:32 CfgTRES=cpu=2,mem=1000M,billing=2"
    " AllocTRES=cpu=1,mem=1000M CapWatts=n/a CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s"
    " ExtSensorsWatts=0 ExtSensorsTemp=n/s Reason=gpuagent: GPU 0000:3b:00.0: thermal"
    " throttling (thermal) [root@2026-11-22T14:53:48]"
)
DOWN_OPS = (
    "NodeName=gpu-test-01 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=2 CPUTot=2"
    " CPULoad=0.11 AvailableFeatures=(null) ActiveFeatures=(null) Gres=(null)"
    " NodeAddr=127.0.0.1 NodeHostName=vm Version=22.05.8 OS=Linux 6.18.44-fc-v669 #1 SMP"
    " PREEMPT_DYNAMIC @0  RealMemory=1000 AllocMem=0 FreeMem=23711 Sockets=2 Boards=1"
    " State=DOWN+NOT_RESPONDING ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A"
    " Partitions=gpu  BootTime=None SlurmdStartTime=2026-11-22T14:52:50"
    " LastBusyTime=2026-11-22T14:52:56 CfgTRES=cpu=2,mem=1000M,billing=2 AllocTRES="
    " CapWatts=n/a CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0"
    " ExtSensorsTemp=n/s Reason=maintenance by ops [root@2026-11-22T14:52:56]"
)
DOWN_DRAIN = (
    "NodeName=gpu-test-01 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=2 CPUTot=2"
    " CPULoad=0.11 AvailableFeatures=(null) ActiveFeatures=(null) Gres=(null)"
    " NodeAddr=127.0.0.1 NodeHostName=vm Version=22.05.8 OS=Linux 6.18.44-fc-v669 #1 SMP"
    " PREEMPT_DYNAMIC @0  RealMemory=1000 AllocMem=0 FreeMem=23711 Sockets=2 Boards=1"
    " State=DOWN+DRAIN+NOT_RESPONDING ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A"
    " MCS_label=N/A Partitions=gpu  BootTime=None SlurmdStartTime=2026-11-22T14:52:50"
    " LastBusyTime=2026-11-22T14:52:56 CfgTRES=cpu=2,mem=1000M,billing=2 AllocTRES="
    " CapWatts=n/a CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0"
    " ExtSensorsTemp=n/s Reason=both [root@2026-11-22T14:52:56]"
)
OPS_DRAIN = (
    "NodeName=gpuagent-test-node Arch=x86_64 CoresPerSocket=2  CPUAlloc=0 CPUEfctv=2"
    " CPUTot=2 CPULoad=0.41 AvailableFeatures=(null) ActiveFeatures=(null) Gres=(null)"
    " NodeAddr=127.0.0.1 NodeHostName=vm Version=22.05.8 OS=Linux 6.18.44-fc-v669 #1 SMP"
    " PREEMPT_DYNAMIC @0  RealMemory=1 AllocMem=0 FreeMem=23457 Sockets=1 Boards=1"
    " State=IDLE+DRAIN ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A"
    " Partitions=gpu  BootTime=2026-11-22T13:14:21 SlurmdStartTime=2026-11-22T14:58:55"
    " LastBusyTime=2026-11-22T14:58:56 CfgTRES=cpu=2,mem=1M,billing=2 AllocTRES="
    " CapWatts=n/a CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0"
    " ExtSensorsTemp=n/s Reason=maintenance by ops: swap PSU [ticket 42]"
    " [root@2026-11-22T14:58:56]"
)
OPS_DOWN_DRAIN = (
    "NodeName=gpuagent-test-node Arch=x86_64 CoresPerSocket=2  CPUAlloc=0 CPUEfctv=2"
    " CPUTot=2 CPULoad=0.41 AvailableFeatures=(null) ActiveFeatures=(null) Gres=(null)"
    " NodeAddr=127.0.0.1 NodeHostName=vm Version=22.05.8 OS=Linux 6.18.44-fc-v669 #1 SMP"
    " PREEMPT_DYNAMIC @0  RealMemory=1 AllocMem=0 FreeMem=23457 Sockets=1 Boards=1"
    " State=DOWN+DRAIN ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A"
    " Partitions=gpu  BootTime=2026-11-22T13:14:21 SlurmdStartTime=2026-11-22T14:58:55"
    " LastBusyTime=2026-11-22T14:58:56 CfgTRES=cpu=2,mem=1M,billing=2 AllocTRES="
    " CapWatts=n/a CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0"
    " ExtSensorsTemp=n/s Reason=maintenance by ops: swap PSU [ticket 42]"
    " [root@2026-11-22T14:58:56]"
)
RESUMED = (
    "NodeName=gpuagent-test-node Arch=x86_64 CoresPerSocket=2  CPUAlloc=0 CPUEfctv=2"
    " CPUTot=2 CPULoad=0.41 AvailableFeatures=(null) ActiveFeatures=(null) Gres=(null)"
    " NodeAddr=127.0.0.1 NodeHostName=vm Version=22.05.8 OS=Linux 6.18.44-fc-v669 #1 SMP"
    " PREEMPT_DYNAMIC @0  RealMemory=1 AllocMem=0 FreeMem=23457 Sockets=1 Boards=1"
    " State=IDLE+NOT_RESPONDING ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A"
    " Partitions=gpu  BootTime=None SlurmdStartTime=2026-11-22T14:58:55"
    " LastBusyTime=2026-11-22T14:58:56 CfgTRES=cpu=2,mem=1M,billing=2 AllocTRES="
    " CapWatts=n/a CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0"
    " ExtSensorsTemp=n/s"
)
CONF_DRAIN = (
    "NodeName=gpuagent-test-node CoresPerSocket=2  CPUAlloc=0 CPUEfctv=2 CPUTot=2"
    " CPULoad=N/A AvailableFeatures=(null) ActiveFeatures=(null) Gres=(null)"
    " NodeAddr=127.0.0.1 NodeHostName=vm  RealMemory=1 AllocMem=0 FreeMem=N/A Sockets=1"
    " Boards=1 State=UNKNOWN+DRAIN ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A"
    " MCS_label=N/A Partitions=gpu  BootTime=None SlurmdStartTime=None LastBusyTime=Unknown"
    " CfgTRES=cpu=2,mem=1M,billing=2 AllocTRES= CapWatts=n/a CurrentWatts=0 AveWatts=0"
    " ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s Reason=rack 12 power work"
)

# Newer releases print fields such as Comment= after the reason (here without a stamp).
WITH_COMMENT = (
    CONF_DRAIN.replace("Reason=rack 12 power work", "Reason=gpuagent: GPU lost")
    + " Comment=rack 12"
)


@pytest.mark.parametrize(
    ("text", "cordoned", "owned", "reason", "state", "user"),
    [
        (IDLE, False, False, "", "IDLE", None),
        (IDLE_DRAIN_OURS, True, True, OUR_REASON, "IDLE+DRAIN", "root"),
        (
            MIXED_DRAIN_OURS,
            True,
            True,
            "gpuagent: GPU 0000:3b:00.0: thermal throttling (thermal)",
            "MIXED+DRAIN",
            "root",
        ),
        (DOWN_OPS, True, False, "maintenance by ops", "DOWN+NOT_RESPONDING", "root"),
        (
            OPS_DRAIN,
            True,
            False,
            "maintenance by ops: swap PSU [ticket 42]",
            "IDLE+DRAIN",
            "root",
        ),
        (
            OPS_DOWN_DRAIN,
            True,
            False,
            "maintenance by ops: swap PSU [ticket 42]",
            "DOWN+DRAIN",
            "root",
        ),
        (RESUMED, False, False, "", "IDLE+NOT_RESPONDING", None),
        (CONF_DRAIN, True, False, "rack 12 power work", "UNKNOWN+DRAIN", None),
        (WITH_COMMENT, True, True, "gpuagent: GPU lost", "UNKNOWN+DRAIN", None),
    ],
    ids=[
        "idle",
        "idle-drain-ours",
        "mixed-drain-ours",
        "down-theirs",
        "drain-theirs-brackets",
        "down-drain-theirs",
        "resumed-not-responding",
        "drain-from-slurm-conf",
        "comment-after-reason",
    ],
)
def test_parse_node_state(
    text: str, cordoned: bool, owned: bool, reason: str, state: str, user: str | None
) -> None:
    parsed = parse_node_state(text + "\n")
    assert (parsed.cordoned, parsed.owned, parsed.reason) == (cordoned, owned, reason)
    extra = dict(parsed.extra)
    assert extra["state"] == state
    assert extra.get("reason_user") == user


def test_parse_keeps_the_reason_time() -> None:
    assert dict(parse_node_state(IDLE_DRAIN_OURS).extra)["reason_time"] == "2026-11-22T14:52:56"


def test_parse_someone_elses_reason_mentioning_us_is_not_ours() -> None:
    text = OPS_DRAIN.replace("Reason=maintenance", "Reason=ops, not gpuagent: maintenance")
    assert not parse_node_state(text).owned


@pytest.mark.parametrize("text", ["", "Node nope not found\n", "NodeName=x Arch=x86_64\n"])
def test_parse_rejects_what_is_not_a_node(text: str) -> None:
    with pytest.raises(ValueError, match="no node State="):
        parse_node_state(text)


def test_sanitise_reason() -> None:
    assert sanitise_reason('GPU "0"\n  ECC\terror"') == "GPU '0' ECC error'"
    assert sanitise_reason("  \n") == "unhealthy GPU"
    long = sanitise_reason("x" * 1000)
    assert len(long) == 240
    assert long.endswith("...")


# --- scontrol failing in every way but through Slurm --------------------------------------


def fake_scontrol(tmp_path: Path, script: str) -> Path:
    """A stand-in scontrol: a shell script that logs its arguments, one per line."""
    path = tmp_path / "scontrol"
    path.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" >> "{tmp_path}/args"\n{script}\n')
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


async def test_missing_scontrol_is_a_failed_result(tmp_path: Path) -> None:
    backend = SlurmBackend("node1", scontrol=str(tmp_path / "no-scontrol"))
    for result in (await backend.cordon(REQUEST), await backend.uncordon(REQUEST)):
        assert not result.ok
        assert not result.changed
        assert "cannot run" in result.detail
        assert "No such file or directory" in result.detail
    with pytest.raises(SlurmBackendError, match="cannot run"):
        await backend.state()


async def test_a_hanging_scontrol_is_killed(tmp_path: Path) -> None:
    # The child of the script holds the pipes too: the whole process group has to go.
    scontrol = fake_scontrol(tmp_path, "sleep 30 & sleep 30")
    backend = SlurmBackend("node1", scontrol=str(scontrol), timeout=0.5)
    started = time.monotonic()
    result = await backend.cordon(REQUEST)
    assert time.monotonic() - started < 5
    assert not result.ok
    assert result.detail == ("scontrol show node node1: no answer within the 0.5 s limit (killed)")


async def test_one_cordon_shares_one_timeout(tmp_path: Path) -> None:
    scontrol = fake_scontrol(
        tmp_path,
        'if [ "$1" = show ]; then sleep 0.5; echo "NodeName=node1 State=IDLE"; exit 0; fi\n'
        "exec sleep 30",
    )
    backend = SlurmBackend("node1", scontrol=str(scontrol), timeout=1.0)
    started = time.monotonic()
    result = await backend.cordon(REQUEST)
    assert time.monotonic() - started < 2
    assert not result.ok
    assert result.detail == (
        "scontrol update NodeName=node1 State=DRAIN: no answer within the 1 s limit (killed)"
    )


async def test_update_failure_carries_scontrol_stderr(tmp_path: Path) -> None:
    scontrol = fake_scontrol(
        tmp_path,
        'if [ "$1" = show ]; then echo "NodeName=node1 State=IDLE ThreadsPerCore=1"; exit 0; fi\n'
        'echo "slurm_update error: Invalid user id" >&2; exit 1',
    )
    result = await SlurmBackend("node1", scontrol=str(scontrol)).cordon(REQUEST)
    assert not result.ok
    assert not result.changed
    assert "exit status 1: slurm_update error: Invalid user id" in result.detail
    # The reason travels as one argument: no shell, no quoting.
    args = (tmp_path / "args").read_text().splitlines()
    assert args[-4:] == ["update", "NodeName=node1", "State=DRAIN", f"Reason={OUR_REASON}"]


# --- a real cluster --------------------------------------------------------------------


@pytest.fixture(scope="session")
def slurm_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    require_programs()
    cluster = start_cluster(tmp_path_factory.mktemp("slurm"))
    yield cluster
    cluster.stop()


@pytest.fixture
def slurm(slurm_session: SlurmCluster) -> SlurmCluster:
    """The cluster, its node idle and undrained."""
    slurm_session.reset()
    return slurm_session


def backend_for(cluster: SlurmCluster, node: str | None = None) -> SlurmBackend:
    return SlurmBackend(node or cluster.node, env=cluster.env, timeout=15)


async def test_cordon_drains_with_our_reason(slurm: SlurmCluster) -> None:
    backend = backend_for(slurm)
    result = await backend.cordon(REQUEST)
    assert (result.ok, result.changed) == (True, True)
    assert result.detail == f"drained: {OUR_REASON}"
    assert slurm.sinfo() == ("drained", OUR_REASON)
    assert "State=IDLE+DRAIN " in slurm.node_line()
    state = await backend.state()
    assert (state.cordoned, state.owned, state.reason) == (True, True, OUR_REASON)


async def test_cordon_again_changes_nothing(slurm: SlurmCluster) -> None:
    backend = backend_for(slurm)
    assert (await backend.cordon(REQUEST)).changed
    again = await backend.cordon(REQUEST)
    assert (again.ok, again.changed) == (True, False)
    assert again.detail == f"already drained: {OUR_REASON}"
    assert slurm.sinfo() == ("drained", OUR_REASON)


async def test_uncordon_resumes_our_drain(slurm: SlurmCluster) -> None:
    backend = backend_for(slurm)
    await backend.cordon(REQUEST)
    result = await backend.uncordon(REQUEST)
    assert (result.ok, result.changed) == (True, True)
    assert result.detail == f"resumed (was: {OUR_REASON})"
    slurm.wait_for(lambda seen: seen == ("idle", ""))
    state = await backend.state()
    assert (state.cordoned, state.owned, state.reason) == (False, False, "")
    again = await backend.uncordon(REQUEST)
    assert (again.ok, again.changed, again.detail) == (True, False, "not drained")


async def test_reason_is_one_line_without_double_quotes(slurm: SlurmCluster) -> None:
    request = CordonRequest(
        node=slurm.node,
        cluster="test",
        reason='GPU 0000:3b:00.0:\n"fallen off the bus" (bus)',
        request_id="test:2",
    )
    assert (await backend_for(slurm).cordon(request)).changed
    reason = "gpuagent: GPU 0000:3b:00.0: 'fallen off the bus' (bus)"
    assert slurm.sinfo() == ("drained", reason)


async def test_someone_elses_drain_is_left_alone(slurm: SlurmCluster) -> None:
    slurm.scontrol("update", f"NodeName={slurm.node}", "State=DRAIN", "Reason=maintenance by ops")
    backend = backend_for(slurm)

    cordon = await backend.cordon(REQUEST)
    assert (cordon.ok, cordon.changed) == (True, False)
    assert cordon.detail.startswith("left alone: drained by ")
    assert cordon.detail.endswith(", not by gpuagent: maintenance by ops")

    uncordon = await backend.uncordon(REQUEST)
    assert (uncordon.ok, uncordon.changed) == (False, False)
    assert uncordon.detail.startswith("not resumed: drained by ")
    assert uncordon.detail.endswith("maintenance by ops")

    assert slurm.sinfo() == ("drained", "maintenance by ops")
    state = await backend.state()
    assert (state.cordoned, state.owned, state.reason) == (True, False, "maintenance by ops")


async def test_someone_elses_down_is_left_alone(slurm: SlurmCluster) -> None:
    slurm.scontrol("update", f"NodeName={slurm.node}", "State=DOWN", "Reason=PSU swap")
    backend = backend_for(slurm)
    cordon = await backend.cordon(REQUEST)
    assert (cordon.ok, cordon.changed) == (True, False)
    assert cordon.detail.startswith("left alone: down by ")
    uncordon = await backend.uncordon(REQUEST)
    assert (uncordon.ok, uncordon.changed) == (False, False)
    assert "State=DOWN" in slurm.node_line()
    assert slurm.sinfo()[1] == "PSU swap"


async def test_unknown_node_is_a_failed_result(slurm: SlurmCluster) -> None:
    backend = backend_for(slurm, "no-such-node")
    for result in (await backend.cordon(REQUEST), await backend.uncordon(REQUEST)):
        assert (result.ok, result.changed) == (False, False)
        assert result.detail == (
            "scontrol show node no-such-node: exit status 1: Node no-such-node not found"
        )
    with pytest.raises(SlurmBackendError, match="Node no-such-node not found"):
        await backend.state()
    assert slurm.sinfo() == ("idle", "")
