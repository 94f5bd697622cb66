"""The Debian packages' pinned dependencies (deb/requirements.txt, the node's;
deb/aggregator-requirements.txt, the aggregator's): a pin both lists hold is the same in
both, the node's list holds nothing only the aggregator needs, and every wheel a build or
image takes, CPython 3.11 (Debian 12) and 3.13 (Debian 13) on x86_64 and aarch64, is there
with its hash (pip downloads it from PyPI and checks it)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
NODE = REPO / "deb" / "requirements.txt"
AGGREGATOR = REPO / "deb" / "aggregator-requirements.txt"


def _pins(path: Path) -> dict[str, tuple[str, frozenset[str]]]:
    """name -> (version, sha256 hashes) of a requirements file."""
    text = re.sub(r"\s*\\\n\s*", " ", path.read_text())
    pins: dict[str, tuple[str, frozenset[str]]] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)==(\S+)((?: --hash=sha256:[0-9a-f]{64})+)", line)
        assert match, line
        name = re.sub(r"[-_.]+", "-", match[1]).lower()
        assert name not in pins, f"{path.name}: {name} pinned twice"
        pins[name] = (match[2], frozenset(re.findall(r"[0-9a-f]{64}", match[3])))
    return pins


def test_the_lists_parse_and_agree_on_what_they_share() -> None:
    node, aggregator = _pins(NODE), _pins(AGGREGATOR)
    assert {"nvidia-ml-py", "kubernetes", "grpcio"} <= node.keys()
    assert {"aiohttp", "psycopg", "psycopg-pool"} <= aggregator.keys()
    shared = node.keys() & aggregator.keys()
    assert {"aiomqtt", "cryptography", "prometheus-client"} <= shared
    for name in shared:
        assert node[name] == aggregator[name], name


def test_the_node_list_holds_nothing_only_the_aggregator_needs() -> None:
    """The agent imports neither aiohttp (only the Kubernetes client's asyncio client
    does, and the package leaves it out) nor psycopg."""
    node = _pins(NODE)
    for name in ("aiohttp", "aiohttp-retry", "yarl", "multidict", "psycopg", "psycopg-pool"):
        assert name not in node, name


@pytest.mark.parametrize("python", ["3.11", "3.13"])
@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_every_wheel_is_pinned_for_each_python_and_machine(
    tmp_path: Path, python: str, machine: str
) -> None:
    abi = "cp" + python.replace(".", "")
    download = subprocess.run(
        [
            sys.executable, "-m", "pip", "download", "-q",
            "--disable-pip-version-check", "--no-deps", "--only-binary=:all:",
            "--python-version", python, "--implementation", "cp",
            "--abi", abi, "--abi", "abi3", "--abi", "none",
            "--platform", f"manylinux_2_28_{machine}", "--platform", f"manylinux_2_17_{machine}",
            "--platform", f"manylinux2014_{machine}", "--platform", "any",
            "--require-hashes", "-r", str(NODE), "-r", str(AGGREGATOR), "-d", str(tmp_path),
        ],
        capture_output=True, text=True, check=False, timeout=600,
    )  # fmt: skip
    assert download.returncode == 0, download.stderr[-3000:]
    wheels = [p.name for p in tmp_path.glob("*.whl")]
    assert len(wheels) == len(_pins(NODE).keys() | _pins(AGGREGATOR).keys())
    compiled = [w for w in wheels if not w.endswith("-none-any.whl")]
    assert compiled, wheels
    for wheel in compiled:
        assert machine in wheel, wheel
        assert f"-{abi}-{abi}-" in wheel or "-abi3-" in wheel, wheel
