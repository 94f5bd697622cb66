"""The Debian package: `make deb` builds it lintian-clean (no errors), and it installs,
runs (with the systemd bindings and a Kubernetes client that cordons), ships its documents
with working links, upgrades keeping a locally edited conffile, and removes keeping state
and purges without leftovers, here and in piuparts' clean chroot; its maintainer scripts
restart the units after an upgrade and stop them on remove.

Installs into this machine's dpkg database, so it runs only as root and only when asked:
GPUAGENT_DEB_TEST=1, which scripts/test sets as root (the build also needs PyPI for the
pinned wheels, piuparts a Debian mirror: GPUAGENT_PIUPARTS_MIRROR, deb.debian.org by
default). Not root, not asked, or missing tools skip it; under CI (.ci/run) each of these
fails it instead: CI runs the suite as root and must build and install the package.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import PATIENCE, require, require_that
from kubernetes_api import NODE, FakeApiServer, make_node, serve, write_kubeconfig

REPO = Path(__file__).resolve().parent.parent
PKG = "gpuagent"
VENV_PYTHON = "/usr/lib/gpuagent/bin/python3"
DOC = Path("/usr/share/doc/gpuagent")
CONF = Path("/etc/gpuagent/config.toml")
STATE = Path("/var/lib/gpuagent/state.txt")
# Where systemd keeps a DynamicUser's StateDirectory, and the link it makes to it.
AGGREGATOR_STATE = Path("/var/lib/private/gpuagent-aggregator")
AGGREGATOR_STATE_LINK = Path("/var/lib/gpuagent-aggregator")
UNITS = ("gpuagent.service", "gpuagent-aggregator.service")
BASE_VERSION = "0.1.0"
UPGRADE_VERSION = "0.1.0+test1"

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True, scope="module")
def _asked_to_as_root() -> None:
    require_that(os.geteuid() == 0, "builds and installs the .deb here: dpkg -i needs root")
    require_that(
        os.environ.get("GPUAGENT_DEB_TEST") == "1",
        "builds and installs the .deb on this machine: set GPUAGENT_DEB_TEST=1 "
        "(scripts/test does as root)",
    )


# A build takes minutes on a quiet machine (the virtualenv, psycopg-c compiled), more on a
# busy one: a generous limit, only against a hang.
def _run(*cmd: str, timeout: float = 300 * PATIENCE) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
        cwd=REPO,
        env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
    )
    assert proc.returncode == 0, (
        f"{' '.join(cmd)}: rc={proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    )
    return proc


def _installed_version() -> str | None:
    proc = subprocess.run(
        ["dpkg-query", "-W", "-f=${Status} ${Version}", PKG],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0 or not proc.stdout.startswith("install ok installed"):
        return None
    return proc.stdout.split()[-1]


def _deb(version: str) -> Path:
    arch = subprocess.run(
        ["dpkg", "--print-architecture"], capture_output=True, text=True, check=True
    ).stdout.strip()
    return REPO / "dist" / f"{PKG}_{version}_{arch}.deb"


def _require(*programs: str) -> None:
    for program in programs:
        require(program, "the Debian package tests (scripts/test installs it)")


@pytest.fixture(scope="module")
def base_deb() -> Iterator[Path]:
    """The package at BASE_VERSION, built once (make deb installs its build dependencies
    and runs lintian --fail-on error), deleted afterwards."""
    _require("dpkg", "make")
    require_that(
        _installed_version() is None,
        f"{PKG} is already installed on this machine; not touching it (remove it first)",
    )
    _run("make", "deb", f"VERSION={BASE_VERSION}")
    deb = _deb(BASE_VERSION)
    assert deb.is_file()
    yield deb
    deb.unlink(missing_ok=True)


# Cordons NODE (argv[1]) through the kubeconfig argv[2] with the installed package.
CORDON = """
import asyncio, sys
from gpuagent.remediation.kubernetes import KubernetesBackend
from gpuagent.remediation.types import CordonRequest

backend = KubernetesBackend(sys.argv[1], kubeconfig=sys.argv[2], timeout=10.0)
try:
    request = CordonRequest(sys.argv[1], "deb", "package test", "deb:1")
    result = asyncio.run(backend.cordon(request))
finally:
    backend.close()
print(result)
sys.exit(0 if result.ok and result.changed else 1)
"""


# psycopg with its C implementation (psycopg-c, built against Debian's libpq) and the pool.
PSYCOPG = """
import psycopg, psycopg_pool
assert psycopg.pq.__impl__ == "c", psycopg.pq.__impl__
assert psycopg.pq.version() > 0
"""


def _check_optional_dependencies(tmp_path: Path) -> None:
    """The private virtualenv has what the optional features need: the systemd bindings
    (journal fields), psycopg's C implementation and pool (the aggregator's PostgreSQL
    store), and a Kubernetes client that cordons through a kubeconfig."""
    _run(VENV_PYTHON, "-I", "-c", "import systemd.journal")
    _run(VENV_PYTHON, "-I", "-c", PSYCOPG)
    with serve(FakeApiServer(make_node())) as fake:
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", fake)
        _run(VENV_PYTHON, "-I", "-c", CORDON, NODE, str(kubeconfig))
    assert fake.node["spec"]["unschedulable"] is True


def _check_documentation() -> None:
    """The units' Documentation= exist, and so does every relative link of the shipped
    documents (they are not compressed, and keep the source tree's layout)."""
    for unit in UNITS:
        text = (Path("/lib/systemd/system") / unit).read_text()
        uris = [
            uri
            for line in text.splitlines()
            if line.startswith("Documentation=")
            for uri in line.partition("=")[2].split()
        ]
        assert any(uri.startswith("man:") for uri in uris), uris
        for uri in uris:
            if uri.startswith("man:"):
                name, _, section = uri.removeprefix("man:").rstrip(")").partition("(")
                page = Path(f"/usr/share/man/man{section}/{name}.{section}.gz")
                assert page.is_file(), uri
            else:
                assert uri.startswith("file://"), uri
                assert Path(uri.removeprefix("file://")).is_file(), uri
    documents = list(DOC.rglob("*.md"))
    assert DOC / "docs" / "operations.md" in documents
    links = 0
    for document in documents:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", document.read_text()):
            if "://" not in target:
                links += 1
                assert (document.parent / target).exists(), f"{document}: {target}"
    assert links > 0
    for deployed in ("prometheus/gpuagent-rules.yml", "grafana/gpuagent.json"):
        assert (DOC / "deploy" / deployed).is_file(), deployed


def _reversioned(deb: Path, version: str, workdir: Path) -> Path:
    """``deb`` as another version: the same files and maintainer scripts, all an upgrade
    exercises, without a second build of the whole virtualenv (minutes)."""
    tree = workdir / "tree"
    _run("dpkg-deb", "-R", str(deb), str(tree))
    control = tree / "DEBIAN" / "control"
    text = control.read_text()
    assert re.search(r"^Version: ", text, re.MULTILINE), text
    control.write_text(re.sub(r"^Version: .*$", f"Version: {version}", text, flags=re.MULTILINE))
    upgrade = workdir / f"{PKG}_{version}.deb"
    _run("dpkg-deb", "--root-owner-group", "-Zgzip", "-z1", "-b", str(tree), str(upgrade))
    shutil.rmtree(tree)
    return upgrade


def test_build_install_upgrade_purge(base_deb: Path, tmp_path: Path) -> None:
    # base_deb passed lintian --fail-on error as it was built (make deb).
    assert not AGGREGATOR_STATE.exists()
    assert not AGGREGATOR_STATE_LINK.is_symlink()
    private_created = not AGGREGATOR_STATE.parent.exists()
    try:
        _run("dpkg", "-i", str(base_deb))
        assert _installed_version() == BASE_VERSION
        assert f"gpuagent {BASE_VERSION}" in _run("gpuagent", "--version").stdout
        _run("/usr/bin/gpuagent", "config", "check", str(CONF))
        _run("/usr/bin/gpuagent-aggregator", "config", "check", "/etc/gpuagent/aggregator.toml")
        _run(
            "/usr/bin/gpuagent",
            "check",
            "--config",
            str(CONF),
            "--simulate",
            str(REPO / "scenarios" / "h100-healthy.toml"),
        )
        _check_optional_dependencies(tmp_path)
        _check_documentation()

        # A local edit of the conffile survives an upgrade.
        text = CONF.read_text()
        assert 'cluster = "default"' in text
        CONF.write_text(text.replace('cluster = "default"', 'cluster = "deb-test"'))
        STATE.parent.mkdir(exist_ok=True)
        STATE.write_text("x")

        upgrade = _reversioned(base_deb, UPGRADE_VERSION, tmp_path)
        _run("dpkg", "-i", "--force-confold", str(upgrade))
        assert _installed_version() == UPGRADE_VERSION
        assert 'cluster = "deb-test"' in CONF.read_text()
        assert "cluster deb-test" in _run("gpuagent", "config", "check", str(CONF)).stdout

        # Remove: the program is gone, configuration and state stay.
        _run("dpkg", "-r", PKG)
        assert not Path("/usr/lib/gpuagent").exists()
        assert not Path("/usr/bin/gpuagent").exists()
        assert CONF.exists()
        assert STATE.read_text() == "x"

        # The aggregator's state, as systemd lays it out for its DynamicUser.
        AGGREGATOR_STATE.mkdir(parents=True)
        (AGGREGATOR_STATE / "fleet.sqlite").write_text("x")
        AGGREGATOR_STATE_LINK.symlink_to("private/gpuagent-aggregator")

        # Purge: nothing of ours is left.
        _run("dpkg", "-P", PKG)
        for path in (
            Path("/usr/lib/gpuagent"),
            Path("/usr/bin/gpuagent"),
            STATE.parent,
            Path("/etc/gpuagent"),
            AGGREGATOR_STATE,
        ):
            assert not path.exists(), f"{path} left after purge"
        assert not AGGREGATOR_STATE_LINK.is_symlink(), f"{AGGREGATOR_STATE_LINK} left after purge"
        assert _installed_version() is None
    finally:
        subprocess.run(["dpkg", "-P", PKG], capture_output=True, check=False)
        if private_created:
            shutil.rmtree(AGGREGATOR_STATE.parent, ignore_errors=True)


def _snippets(script: str) -> list[str]:
    """The parts debhelper added to a maintainer script."""
    return re.findall(
        r"^# Automatically added by .*?$(.*?)^# End automatically added section",
        script,
        re.MULTILINE | re.DOTALL,
    )


def test_maintainer_scripts_restart_on_upgrade_and_stop_on_remove(
    base_deb: Path, tmp_path: Path
) -> None:
    """What the maintainer scripts do with the units (no systemd runs here, so the scripts
    are read): a first install enables nothing, so deb-systemd-invoke starts nothing; an
    upgrade reloads systemd and restarts a unit that is enabled or running; remove stops it."""
    _run("dpkg-deb", "-e", str(base_deb), str(tmp_path))
    scripts = {
        name: (tmp_path / name).read_text() if (tmp_path / name).exists() else ""
        for name in ("preinst", "postinst", "prerm")
    }
    # A unit stopped before an upgrade and never started again (--no-start) is what this
    # guards against: nothing stops a unit before the upgrade, nothing but debhelper starts.
    assert "deb-systemd-invoke stop" not in scripts["preinst"]
    assert "try-restart" not in scripts["postinst"]
    for unit in UNITS:
        quoted = f"'{unit}'"
        stops = [s for s in _snippets(scripts["prerm"]) if f"deb-systemd-invoke stop {quoted}" in s]
        assert len(stops) == 1, scripts["prerm"]
        assert re.search(r'\[ "\$1" = remove \]', stops[0]), stops[0]

        starts = [
            s
            for s in _snippets(scripts["postinst"])
            if f"deb-systemd-invoke $_dh_action {quoted}" in s
        ]
        assert len(starts) == 1, scripts["postinst"]
        start = starts[0]
        assert re.search(r'if \[ -n "\$2" \]; then\s+_dh_action=restart', start), start
        assert start.index("systemctl --system daemon-reload") < start.index("deb-systemd-invoke")

        # Enabled only again where an earlier version was installed and enabled: a first
        # install leaves the unit disabled.
        enables = [
            s for s in _snippets(scripts["postinst"]) if f"deb-systemd-helper enable {quoted}" in s
        ]
        assert enables, scripts["postinst"]
        for snippet in enables:
            guard = snippet.find(f"deb-systemd-helper debian-installed {quoted}")
            assert 0 <= guard < snippet.index(f"deb-systemd-helper enable {quoted}"), snippet


def _codename() -> str:
    lines = Path("/etc/os-release").read_text().splitlines()
    found = [
        line.partition("=")[2].strip('"') for line in lines if line.startswith("VERSION_CODENAME=")
    ]
    require_that(bool(found), "no VERSION_CODENAME in /etc/os-release: piuparts needs a release")
    return found[0]


def test_piuparts_install_and_purge_in_a_clean_chroot(base_deb: Path, tmp_path: Path) -> None:
    # A minimal chroot of this machine's release: the package's dependencies install from
    # the mirror, and piuparts checks that purge leaves no file behind and that no
    # maintainer script fails. The local upgrade is covered above (piuparts' own upgrade
    # test needs an earlier version in the archive).
    _require("piuparts", "debootstrap")
    mirror = os.environ.get("GPUAGENT_PIUPARTS_MIRROR", "http://deb.debian.org/debian")
    proc = _run(
        "piuparts",
        "--distribution",
        _codename(),
        "--mirror",
        mirror,
        "--no-upgrade-test",
        "--tmpdir",
        str(tmp_path),
        str(base_deb),
        timeout=600,
    )
    assert "PASS: All tests." in proc.stdout + proc.stderr
