"""The daemon's memory footprint: malloc's arenas and freed pages, and what it imports."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

GLIBC = platform.libc_ver()[0] == "glibc"


def _run(code: str, **env: str) -> str:
    environment = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"} | env
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=environment
    )
    return result.stdout.strip()


@pytest.mark.skipif(not GLIBC, reason="mallopt and malloc_trim are glibc's")
def test_the_arenas_are_capped_unless_the_environment_says_otherwise() -> None:
    # In a child: the cap is process-wide and for good.
    probe = "from gpuagent import heap; print(heap.cap_arenas(), heap.give_back() in (True, False))"
    assert _run(probe) == "True True"
    assert _run(probe, MALLOC_ARENA_MAX="4") == "False True"


def test_the_daemon_imports_only_what_its_configuration_uses() -> None:
    # The Kubernetes watch and output, attribution, psutil (process names on a real host,
    # where a GPU runs a process) and the capture parsers (a replayed host) are imported
    # where a configuration uses them: each costs resident memory for months.
    probe = (
        "import sys, gpuagent.cli, gpuagent.daemon, gpuagent.sim; print(sorted(m for m in "
        "sys.modules if m.split('.')[0] == 'psutil' or m.startswith(('gpuagent.k8s.output',"
        " 'gpuagent.k8s.client', 'gpuagent.node.kubernetes', 'gpuagent.smi',"
        " 'gpuagent.attribution', 'gpuagent.fleet.reporter'))))"
    )
    assert _run(probe) == "[]"
