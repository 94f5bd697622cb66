"""The container image (`make image`, scripts/build-image): built from Debian packages with
mmdebstrap and podman, it runs the agent on a simulated node and serves /metrics.

The image is built once per session (about a minute: the rootfs comes from the apt mirror)
and removed afterwards. Needs root (mmdebstrap's root mode, podman as root) and the Debian
packages mmdebstrap, podman and runc; scripts/test installs them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import REPO, deadline_in, free_port, require, require_that

TAG = f"localhost/gpuagent:pytest-{os.getpid()}"
SCENARIO = REPO / "scenarios" / "h100-healthy.toml"


def _run_options() -> list[str]:
    """podman options that work on the hosts the suite runs on, not only on a default one.

    - podman's default rlimits (nofile and nproc of 1048576) need CAP_SYS_RESOURCE where the
      host's hard limit is lower, and a VM may withhold it; the agent needs 4096 descriptors
      (LimitNOFILE= of the systemd unit), so both are set to that.
    - crun refuses hosts with cgroup v1 and v2 mounted side by side ("hybrid mode"); runc
      runs there, so it is used where the unified hierarchy sits beside the v1 ones.
    """
    options = ["--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096"]
    if Path("/sys/fs/cgroup/unified").is_dir():
        runc = require("runc", "runs the image on a cgroup hybrid host (Debian package runc)")
        options = ["--runtime", runc, *options]
    return options


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    require_that(os.geteuid() == 0, "building the image needs root (mmdebstrap --mode=root)")
    require("mmdebstrap", "builds the image's rootfs (Debian package mmdebstrap)")
    podman = require("podman", "builds and runs the image (Debian package podman)")
    started = time.monotonic()
    # Its own work directory: the checkout's build/image (`make image`) stays as it was.
    workdir = tmp_path_factory.mktemp("image")
    build = subprocess.run(
        [str(REPO / "scripts" / "build-image"), TAG],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
        env={**os.environ, "GPUAGENT_IMAGE_BUILD_DIR": str(workdir)},
    )
    assert build.returncode == 0, f"build-image failed:\n{build.stdout}\n{build.stderr}"
    print(f"image {TAG} built in {time.monotonic() - started:.0f} s")
    try:
        yield TAG
    finally:
        subprocess.run([podman, "rmi", "--force", TAG], capture_output=True, check=False)
        shutil.rmtree(workdir, ignore_errors=True)


def _podman(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["podman", *args], capture_output=True, text=True, check=False, timeout=timeout
    )


def _get(url: str, deadline: float) -> str:
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return str(response.read().decode())
        except OSError as exc:
            last = exc
            time.sleep(0.3)
    pytest.fail(f"no answer from {url}: {last}")


def test_image_is_debian_only_and_non_root(image: str) -> None:
    inspect = _podman(
        "image", "inspect", "--format", "{{.Config.User}} {{json .Config.Entrypoint}}", image
    )
    assert inspect.returncode == 0, inspect.stderr
    assert inspect.stdout.strip() == '10001:10001 ["/opt/gpuagent/bin/gpuagent"]'
    # One layer: the rootfs mmdebstrap made. A registry base image would add its own.
    layers = _podman("image", "inspect", "--format", "{{len .RootFS.Layers}}", image)
    assert layers.stdout.strip() == "1"
    listing = _podman(
        "run", "--rm", "--network=none", *_run_options(), "--entrypoint", "/bin/sh", image,
        "-c", "id -u; test ! -e /opt/gpuagent/bin/pip && echo no-pip; "
        "dpkg-query -W -f '${Package}\\n' python3.11 ca-certificates; cat /etc/debian_version",
    )  # fmt: skip
    assert listing.returncode == 0, listing.stderr
    lines = listing.stdout.split()
    assert lines[:2] == ["10001", "no-pip"]
    assert sorted(lines[2:4]) == ["ca-certificates", "python3.11"]
    assert lines[4].startswith("12.")


def test_image_runs_the_agent_on_a_simulated_node(image: str, tmp_path: Path) -> None:
    port = free_port()
    # The image's own configuration with a free port: the host's network, so /metrics is
    # fetched from outside the container the way Prometheus does.
    config = tmp_path / "config.toml"
    image_config = (REPO / "deploy" / "kubernetes" / "image" / "config.toml").read_text()
    assert 'listen = "0.0.0.0:19400"' in image_config
    config.write_text(image_config.replace("0.0.0.0:19400", f"127.0.0.1:{port}"))
    config.chmod(0o644)
    name = f"gpuagent-pytest-{os.getpid()}"
    started = _podman(
        "run", "--detach", "--name", name, "--network=host", *_run_options(),
        "--volume", f"{config}:/etc/gpuagent/config.toml:ro",
        "--volume", f"{SCENARIO}:/scenario.toml:ro",
        image, "run", "--config", "/etc/gpuagent/config.toml", "--simulate", "/scenario.toml",
        "--node-name", "gpu-node-17",
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    try:
        # /metrics answers from the start; the GPUs' series come with the first poll.
        deadline = deadline_in(30)
        while True:
            metrics = _get(f"http://127.0.0.1:{port}/metrics", deadline)
            temps = [
                line for line in metrics.splitlines() if line.startswith("DCGM_FI_DEV_GPU_TEMP{")
            ]
            if len(temps) == 8 or time.monotonic() > deadline:
                break
            time.sleep(0.3)
        assert len(temps) == 8
        assert "gpuagent_build_info{" in metrics
        status = _podman("exec", name, "gpuagent", "status", "--json")
        assert status.returncode == 0, status.stderr
        assert '"gpu-node-17"' in status.stdout
        # As the image's user, not root.
        whoami = _podman("exec", name, "id", "-u")
        assert whoami.stdout.strip() == "10001"
    finally:
        logs = _podman("logs", name)
        _podman("rm", "--force", "--time", "10", name)
        print(logs.stdout[-3000:], logs.stderr[-3000:])


def test_image_runs_the_fleet_side_too(image: str) -> None:
    """The fleet manifests run the aggregator (PostgreSQL through Debian's libpq) and the
    MQTT identity step from this image."""
    probe = _podman(
        "run", "--rm", "--network=none", *_run_options(),
        "--entrypoint", "/opt/gpuagent/bin/python", image, "-c",
        "import psycopg, cryptography; print(psycopg.pq.version() > 0, psycopg.pq.__impl__)",
    )  # fmt: skip
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.split()[0] == "True"
    for command in (["gpuagent-aggregator", "--version"], ["gpuagent", "mqtt-identity", "-h"]):
        ran = _podman(
            "run", "--rm", "--network=none", *_run_options(),
            "--entrypoint", f"/opt/gpuagent/bin/{command[0]}", image, *command[1:],
        )  # fmt: skip
        assert ran.returncode == 0, ran.stderr


def test_the_arm64_image_has_every_wheel_pinned(tmp_path: Path) -> None:
    """`make image ARCH=arm64` downloads the closure for aarch64 with the hashes pinned in
    deb/requirements.txt and deb/aggregator-requirements.txt; a missing or wrong hash fails
    here rather than in a build on an arm64 machine. (The arm64 rootfs itself needs an
    arm64 machine or emulation.)"""
    download = subprocess.run(
        [
            sys.executable, "-m", "pip", "download", "-q",
            "--disable-pip-version-check", "--no-deps", "--only-binary=:all:",
            "--python-version", "3.11", "--implementation", "cp",
            "--abi", "cp311", "--abi", "abi3", "--abi", "none",
            "--platform", "manylinux_2_28_aarch64", "--platform", "manylinux_2_17_aarch64",
            "--platform", "manylinux2014_aarch64", "--platform", "any",
            "--require-hashes", "-r", str(REPO / "deb" / "requirements.txt"),
            "-r", str(REPO / "deb" / "aggregator-requirements.txt"),
            "-d", str(tmp_path),
        ],
        capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    assert download.returncode == 0, download.stderr[-3000:]
    wheels = [p.name for p in tmp_path.glob("*.whl")]
    compiled = [w for w in wheels if not w.endswith("-none-any.whl")]
    assert compiled, wheels
    assert all("aarch64" in w for w in compiled), compiled
