"""The Debian packages, gpuagent (the node) and gpuagent-aggregator, built for Debian 12 on
this machine (`make deb`) and for Debian 13 in a trixie chroot (`make deb-chroot`),
lintian-clean (no errors): each depends on python3 within the minor version it was built
with, and the node's holds no aggregator code. Here (Debian 12) they install, run (with the
systemd bindings and a Kubernetes client that cordons), ship their documents with working
links, enable the agent's unit and not the aggregator's, upgrade keeping a locally edited
conffile and an administrator's disabled unit, and remove keeping state and purge without
leftovers; piuparts installs and purges each in a clean chroot of either release. Their
maintainer scripts restart the units after an upgrade and stop them on remove.

Installs into this machine's dpkg database, so it runs only as root and only when asked:
GPUAGENT_DEB_TEST=1, which scripts/test sets as root (the builds also need PyPI for the
pinned wheels, the chroots a Debian mirror: GPUAGENT_PIUPARTS_MIRROR, deb.debian.org by
default). Not root, not asked, or missing tools skip it; under CI (.ci/run) each of these
fails it instead: CI runs the suite as root and must build and install the packages.

The Debian 13 build starts in the background with the module's first test and runs beside
the Debian 12 build and the tests of its packages; each build runs once for the module.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import PATIENCE, require, require_that
from kubernetes_api import NODE, FakeApiServer, make_node, serve, write_kubeconfig

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("gpuagent", "gpuagent-aggregator")
NODE_VENV = Path("/usr/lib/gpuagent")
AGGREGATOR_VENV = Path("/usr/lib/gpuagent-aggregator")
NODE_PYTHON = str(NODE_VENV / "bin" / "python3")
AGGREGATOR_PYTHON = str(AGGREGATOR_VENV / "bin" / "python3")
CONF = Path("/etc/gpuagent/config.toml")
AGGREGATOR_CONF = Path("/etc/gpuagent/aggregator.toml")
TOKEN = Path("/etc/gpuagent/aggregator/command-token")
STATE = Path("/var/lib/gpuagent/state.txt")
# Where systemd keeps a DynamicUser's StateDirectory, and the link it makes to it.
AGGREGATOR_STATE = Path("/var/lib/private/gpuagent-aggregator")
AGGREGATOR_STATE_LINK = Path("/var/lib/gpuagent-aggregator")
# What enabling a unit (WantedBy=multi-user.target) creates.
WANTS = Path("/etc/systemd/system/multi-user.target.wants")
UNITS = {"gpuagent": "gpuagent.service", "gpuagent-aggregator": "gpuagent-aggregator.service"}
BASE_VERSION = "0.1.0"
UPGRADE_VERSION = "0.1.0+test1"
OTHER_SUITE = "trixie"
MIRROR = os.environ.get("GPUAGENT_PIUPARTS_MIRROR", "http://deb.debian.org/debian")

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True, scope="module")
def _asked_to_as_root() -> None:
    require_that(os.geteuid() == 0, "builds and installs the .debs here: dpkg -i needs root")
    require_that(
        os.environ.get("GPUAGENT_DEB_TEST") == "1",
        "builds and installs the .debs on this machine: set GPUAGENT_DEB_TEST=1 "
        "(scripts/test does as root)",
    )


# A build takes minutes on a quiet machine (two virtualenvs, psycopg-c compiled), more on a
# busy one: a generous limit, only against a hang.
BUILD_TIMEOUT = 300 * PATIENCE


def _run(*cmd: str, timeout: float = BUILD_TIMEOUT) -> subprocess.CompletedProcess[str]:
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


def _installed_version(package: str) -> str | None:
    proc = subprocess.run(
        ["dpkg-query", "-W", "-f=${Status} ${Version}", package],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0 or not proc.stdout.startswith("install ok installed"):
        return None
    return proc.stdout.split()[-1]


def _arch() -> str:
    return subprocess.run(
        ["dpkg", "--print-architecture"], capture_output=True, text=True, check=True
    ).stdout.strip()


def _require(*programs: str) -> None:
    for program in programs:
        require(program, "the Debian package tests (scripts/test installs it)")


@dataclass(frozen=True)
class Debs:
    """The two packages of one build."""

    node: Path
    aggregator: Path

    @classmethod
    def in_dir(cls, directory: Path, version: str = BASE_VERSION) -> Debs:
        node, aggregator = (directory / f"{p}_{version}_{_arch()}.deb" for p in PACKAGES)
        return cls(node, aggregator)

    def both(self) -> tuple[Path, Path]:
        return (self.node, self.aggregator)


class OtherBuild:
    """`make deb-chroot SUITE=trixie`, started in the background (its own chroot, output
    and build directories: nothing it writes is shared with `make deb`)."""

    def __init__(self) -> None:
        self.log = REPO / "build" / f"test-deb-{OTHER_SUITE}.log"
        self.log.parent.mkdir(exist_ok=True)
        self.began = time.monotonic()
        with self.log.open("w") as log:
            self.process = subprocess.Popen(
                ["make", "deb-chroot", f"SUITE={OTHER_SUITE}", f"VERSION={BASE_VERSION}",
                 f"MIRROR={MIRROR}"],
                cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
            )  # fmt: skip
        self._debs: Debs | None = None

    def debs(self) -> Debs:
        if self._debs is None:
            code = self.process.wait(BUILD_TIMEOUT)
            assert code == 0, self.log.read_text()[-6000:]
            print(f"{OTHER_SUITE} build: {time.monotonic() - self.began:.0f} s")
            self._debs = Debs.in_dir(REPO / "dist" / OTHER_SUITE)
        return self._debs

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(60)


@pytest.fixture(scope="module")
def other_build() -> Iterator[OtherBuild]:
    _require("make", "mmdebstrap")
    build = OtherBuild()
    yield build
    build.stop()
    for deb in build.debs().both() if build.process.returncode == 0 else ():
        deb.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def base_debs(other_build: OtherBuild) -> Iterator[Debs]:
    """The packages at BASE_VERSION for this machine, built once (make deb installs its
    build dependencies and runs lintian --fail-on error), deleted afterwards. Asking for
    them starts the Debian 13 build too, beside this one."""
    _require("dpkg", "make")
    for package in PACKAGES:
        require_that(
            _installed_version(package) is None,
            f"{package} is already installed on this machine; not touching it (remove it)",
        )
    began = time.monotonic()
    _run("make", "deb", f"VERSION={BASE_VERSION}")
    print(f"bookworm build: {time.monotonic() - began:.0f} s")
    debs = Debs.in_dir(REPO / "dist")
    assert all(deb.is_file() for deb in debs.both())
    yield debs
    for deb in debs.both():
        deb.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def other_debs(other_build: OtherBuild, base_debs: Debs) -> Debs:
    """The Debian 13 packages (lintian --fail-on error passed in their chroot)."""
    return other_build.debs()


# --- what the packages hold and depend on ---------------------------------------------------


def _field(deb: Path, name: str) -> str:
    return _run("dpkg-deb", "-f", str(deb), name).stdout.strip()


def _files(deb: Path) -> list[str]:
    """The paths in ``deb``, without the leading "./"."""
    listing = _run("dpkg-deb", "-c", str(deb)).stdout.splitlines()
    return [line.split(maxsplit=5)[5].removeprefix("./").split(" -> ")[0] for line in listing]


def _python_of(files: list[str], venv: Path) -> str:
    """The CPython minor version a package's virtualenv was made for ("3.11")."""
    prefix = f"{venv.relative_to('/')}/lib/python"
    found = {f.removeprefix(prefix).split("/")[0] for f in files if f.startswith(prefix)}
    assert len(found) == 1, found
    return found.pop()


def _expected_depends(version: str) -> str:
    major, minor = version.split(".")
    return f"python3 (>= {version}~), python3 (<< {major}.{int(minor) + 1})"


def _check_python_dependency(debs: Debs, expected_python: str) -> None:
    """Each package depends on the python3 of the interpreter it was built with, and its
    compiled extensions are that CPython's."""
    for deb, venv in ((debs.node, NODE_VENV), (debs.aggregator, AGGREGATOR_VENV)):
        files = _files(deb)
        assert _python_of(files, venv) == expected_python, deb
        depends = [d.strip() for d in _field(deb, "Depends").split(",")]
        python3 = [d for d in depends if d.startswith("python3")]
        assert ", ".join(python3) == _expected_depends(expected_python), depends
        tag = "cpython-" + expected_python.replace(".", "")
        extensions = [f for f in files if f.endswith(".so") and ".cpython-" in f]
        assert extensions, deb
        assert all(tag in f for f in extensions), [f for f in extensions if tag not in f]


def _check_contents(debs: Debs) -> None:
    """The node's package holds no aggregator code nor the aggregator's dependencies; the
    aggregator's holds both, and neither the other's program, unit or configuration."""
    node, aggregator = _files(debs.node), _files(debs.aggregator)
    site = "/site-packages/"
    for absent in ("gpuagent/aggregator/", "aiohttp/", "psycopg/", "psycopg_c/", "yarl/"):
        assert not [f for f in node if site + absent in f], absent
    assert not [f for f in node if "kubernetes/aio/" in f]
    assert "usr/bin/gpuagent-aggregator" not in node
    assert "usr/lib/systemd/system/gpuagent-aggregator.service" not in node
    assert "etc/gpuagent/aggregator.toml" not in node
    assert [f for f in node if f.endswith(site + "gpuagent/daemon.py")]
    for present in ("gpuagent/aggregator/service.py", "aiohttp/", "psycopg/", "psycopg_c/"):
        assert [f for f in aggregator if site + present in f], present
    assert "usr/bin/gpuagent" not in aggregator
    assert "usr/bin/gpuagent-aggregator" in aggregator
    assert "etc/gpuagent/config.toml" not in aggregator
    for deb in debs.both():
        print(f"{deb.name}: Installed-Size {_field(deb, 'Installed-Size')} KiB")


def test_this_release_packages(base_debs: Debs) -> None:
    """Built for /usr/bin/python3 here (3.11 on Debian 12)."""
    version = _run(
        "/usr/bin/python3", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"
    ).stdout.strip()
    _check_python_dependency(base_debs, version)
    _check_contents(base_debs)


def test_debian_13_packages(other_debs: Debs) -> None:
    """Built in the trixie chroot, for its Python: not this machine's."""
    _check_python_dependency(other_debs, "3.13")
    _check_contents(other_debs)


# --- installed here -------------------------------------------------------------------------


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

# Imports every module of a package in the virtualenv that runs this (not __main__, which
# runs the program); prints how many.
IMPORT_ALL = """
import importlib, pkgutil, sys
package = importlib.import_module(sys.argv[1])
names = [m.name for m in pkgutil.walk_packages(package.__path__, sys.argv[1] + ".")
         if not m.name.endswith(".__main__")]
for name in names:
    importlib.import_module(name)
print(len(names))
"""


def _check_node_installed(tmp_path: Path) -> None:
    """The agent runs, and its virtualenv has what its modules import and nothing of the
    aggregator: every gpuagent module imports (the aggregator's is absent); the systemd
    bindings (journal fields); a Kubernetes client that cordons through a kubeconfig."""
    assert f"gpuagent {BASE_VERSION}" in _run("gpuagent", "--version").stdout
    _run("/usr/bin/gpuagent", "config", "check", str(CONF))
    _run(
        "/usr/bin/gpuagent",
        "check",
        "--config",
        str(CONF),
        "--simulate",
        str(REPO / "scenarios" / "h100-healthy.toml"),
    )
    assert int(_run(NODE_PYTHON, "-I", "-c", IMPORT_ALL, "gpuagent").stdout) > 100
    missing = subprocess.run(
        [NODE_PYTHON, "-I", "-c", "import gpuagent.aggregator"],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert "ModuleNotFoundError" in missing.stderr, missing.stderr
    _run(NODE_PYTHON, "-I", "-c", "import systemd.journal")
    with serve(FakeApiServer(make_node())) as fake:
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", fake)
        _run(NODE_PYTHON, "-I", "-c", CORDON, NODE, str(kubeconfig))
    assert fake.node["spec"]["unschedulable"] is True


def _check_aggregator_installed() -> None:
    """The aggregator runs from its own virtualenv: every module of gpuagent.aggregator
    imports there, psycopg with its C implementation, the systemd bindings; and its
    command token was made root-only."""
    assert f"{BASE_VERSION}" in _run("gpuagent-aggregator", "--version").stdout
    _run("/usr/bin/gpuagent-aggregator", "config", "check", str(AGGREGATOR_CONF))
    assert int(_run(AGGREGATOR_PYTHON, "-I", "-c", IMPORT_ALL, "gpuagent.aggregator").stdout)
    _run(AGGREGATOR_PYTHON, "-I", "-c", PSYCOPG)
    _run(AGGREGATOR_PYTHON, "-I", "-c", "import systemd.journal")
    assert re.fullmatch(r"[0-9a-f]{64}\n", TOKEN.read_text())
    assert TOKEN.stat().st_mode & 0o777 == 0o600


def _check_documentation(package: str) -> None:
    """The unit's Documentation= exist, and so does every relative link of the package's
    shipped documents (they are not compressed, and keep the source tree's layout)."""
    doc = Path("/usr/share/doc") / package
    text = (Path("/lib/systemd/system") / UNITS[package]).read_text()
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
            assert uri.startswith(f"file://{doc}/"), uri
            assert Path(uri.removeprefix("file://")).is_file(), uri
    documents = list(doc.rglob("*.md"))
    assert doc / "docs" / "operations.md" in documents
    links = 0
    for document in documents:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", document.read_text()):
            if "://" not in target:
                links += 1
                assert (document.parent / target).exists(), f"{document}: {target}"
    assert links > 0
    for deployed in ("prometheus/gpuagent-rules.yml", "grafana/gpuagent.json"):
        assert (doc / "deploy" / deployed).is_file(), deployed


def _enabled(package: str) -> bool:
    return (WANTS / UNITS[package]).is_symlink()


def _reversioned(deb: Path, version: str, workdir: Path) -> Path:
    """``deb`` as another version: the same files and maintainer scripts, all an upgrade
    exercises, without a second build of the virtualenvs (minutes)."""
    tree = workdir / "tree"
    _run("dpkg-deb", "-R", str(deb), str(tree))
    control = tree / "DEBIAN" / "control"
    text = control.read_text()
    assert re.search(r"^Version: ", text, re.MULTILINE), text
    control.write_text(re.sub(r"^Version: .*$", f"Version: {version}", text, flags=re.MULTILINE))
    package = re.search(r"^Package: (\S+)$", text, re.MULTILINE)
    assert package, text
    upgrade = workdir / f"{package[1]}_{version}.deb"
    _run("dpkg-deb", "--root-owner-group", "-Zgzip", "-z1", "-b", str(tree), str(upgrade))
    shutil.rmtree(tree)
    return upgrade


def test_install_upgrade_purge(base_debs: Debs, tmp_path: Path) -> None:
    # base_debs passed lintian --fail-on error as they were built (make deb).
    assert not AGGREGATOR_STATE.exists()
    assert not AGGREGATOR_STATE_LINK.is_symlink()
    private_created = not AGGREGATOR_STATE.parent.exists()
    try:
        # The aggregator alone: it needs nothing of the node's package.
        _run("dpkg", "-i", str(base_debs.aggregator))
        assert _installed_version("gpuagent-aggregator") == BASE_VERSION
        assert _installed_version("gpuagent") is None
        _check_aggregator_installed()
        _check_documentation("gpuagent-aggregator")
        assert not _enabled("gpuagent-aggregator")  # needs its broker and database first

        _run("dpkg", "-i", str(base_debs.node))
        assert _installed_version("gpuagent") == BASE_VERSION
        _check_node_installed(tmp_path)
        _check_documentation("gpuagent")
        assert _enabled("gpuagent")  # a first install enables the agent
        assert not _enabled("gpuagent-aggregator")

        # A local edit of the conffile survives an upgrade, and so does an administrator's
        # disabled agent unit.
        text = CONF.read_text()
        assert 'cluster = "default"' in text
        CONF.write_text(text.replace('cluster = "default"', 'cluster = "deb-test"'))
        STATE.parent.mkdir(exist_ok=True)
        STATE.write_text("x")
        token = TOKEN.read_text()
        _run("systemctl", "disable", UNITS["gpuagent"])
        assert not _enabled("gpuagent")

        upgrades = [_reversioned(deb, UPGRADE_VERSION, tmp_path) for deb in base_debs.both()]
        _run("dpkg", "-i", "--force-confold", *map(str, upgrades))
        for package in PACKAGES:
            assert _installed_version(package) == UPGRADE_VERSION
        assert 'cluster = "deb-test"' in CONF.read_text()
        assert "cluster deb-test" in _run("gpuagent", "config", "check", str(CONF)).stdout
        assert TOKEN.read_text() == token
        assert not _enabled("gpuagent")
        assert not _enabled("gpuagent-aggregator")

        # Remove: the programs are gone, configuration and state stay.
        _run("dpkg", "-r", *PACKAGES)
        for path in (NODE_VENV, AGGREGATOR_VENV, Path("/usr/bin/gpuagent")):
            assert not path.exists(), path
        assert CONF.exists()
        assert TOKEN.exists()
        assert STATE.read_text() == "x"

        # The aggregator's state, as systemd lays it out for its DynamicUser.
        AGGREGATOR_STATE.mkdir(parents=True)
        (AGGREGATOR_STATE / "fleet.sqlite").write_text("x")
        AGGREGATOR_STATE_LINK.symlink_to("private/gpuagent-aggregator")

        # Purge: nothing of ours is left.
        _run("dpkg", "-P", *PACKAGES)
        for path in (
            NODE_VENV,
            AGGREGATOR_VENV,
            Path("/usr/bin/gpuagent"),
            Path("/usr/bin/gpuagent-aggregator"),
            STATE.parent,
            Path("/etc/gpuagent"),
            AGGREGATOR_STATE,
            WANTS / UNITS["gpuagent"],
        ):
            assert not path.exists(), f"{path} left after purge"
        assert not AGGREGATOR_STATE_LINK.is_symlink(), f"{AGGREGATOR_STATE_LINK} left after purge"
        for package in PACKAGES:
            assert _installed_version(package) is None
    finally:
        subprocess.run(["dpkg", "-P", *PACKAGES], capture_output=True, check=False)
        if private_created:
            shutil.rmtree(AGGREGATOR_STATE.parent, ignore_errors=True)


def _snippets(script: str) -> list[str]:
    """The parts debhelper added to a maintainer script."""
    return re.findall(
        r"^# Automatically added by .*?$(.*?)^# End automatically added section",
        script,
        re.MULTILINE | re.DOTALL,
    )


@pytest.mark.parametrize("package", PACKAGES)
def test_maintainer_scripts_restart_on_upgrade_and_stop_on_remove(
    base_debs: Debs, tmp_path: Path, package: str
) -> None:
    """What the maintainer scripts do with the units (no systemd runs here, so the scripts
    are read): an upgrade reloads systemd and restarts a unit that is enabled or running;
    remove stops it. A first install enables the agent's unit (it is then started) but
    not the aggregator's, which is only enabled again where it was before."""
    deb = base_debs.node if package == "gpuagent" else base_debs.aggregator
    _run("dpkg-deb", "-e", str(deb), str(tmp_path))
    scripts = {
        name: (tmp_path / name).read_text() if (tmp_path / name).exists() else ""
        for name in ("preinst", "postinst", "prerm")
    }
    # A unit stopped before an upgrade and never started again (--no-start) is what this
    # guards against: nothing stops a unit before the upgrade, nothing but debhelper starts.
    assert "deb-systemd-invoke stop" not in scripts["preinst"]
    assert "try-restart" not in scripts["postinst"]
    quoted = f"'{UNITS[package]}'"
    stops = [s for s in _snippets(scripts["prerm"]) if f"deb-systemd-invoke stop {quoted}" in s]
    assert len(stops) == 1, scripts["prerm"]
    assert re.search(r'\[ "\$1" = remove \]', stops[0]), stops[0]

    starts = [
        s for s in _snippets(scripts["postinst"]) if f"deb-systemd-invoke $_dh_action {quoted}" in s
    ]
    assert len(starts) == 1, scripts["postinst"]
    start = starts[0]
    assert re.search(r'if \[ -n "\$2" \]; then\s+_dh_action=restart', start), start
    assert start.index("systemctl --system daemon-reload") < start.index("deb-systemd-invoke")

    enables = [
        s for s in _snippets(scripts["postinst"]) if f"deb-systemd-helper enable {quoted}" in s
    ]
    assert len(enables) == 1, scripts["postinst"]
    if package == "gpuagent":
        # Enabled unless it was disabled before (was-enabled is true on a first install).
        assert f"deb-systemd-helper --quiet was-enabled {quoted}" in enables[0], enables[0]
        assert f"deb-systemd-helper debian-installed {quoted}" not in enables[0], enables[0]
    else:
        # Enabled only again where an earlier version was installed and enabled.
        guard = enables[0].find(f"deb-systemd-helper debian-installed {quoted}")
        assert 0 <= guard < enables[0].index(f"deb-systemd-helper enable {quoted}"), enables[0]


# --- piuparts: a clean chroot of either release ---------------------------------------------


def _codename() -> str:
    lines = Path("/etc/os-release").read_text().splitlines()
    found = [
        line.partition("=")[2].strip('"') for line in lines if line.startswith("VERSION_CODENAME=")
    ]
    require_that(bool(found), "no VERSION_CODENAME in /etc/os-release: piuparts needs a release")
    return found[0]


def _piuparts(deb: Path, distribution: str, tmp_path: Path, *options: str) -> None:
    # A minimal chroot of the release: the package's dependencies install from the mirror,
    # and piuparts checks that purge leaves no file behind and that no maintainer script
    # fails. The local upgrade is covered above (piuparts' own upgrade test needs an
    # earlier version in the archive).
    _require("piuparts", "debootstrap")
    began = time.monotonic()
    proc = _run(
        "piuparts",
        "--distribution",
        distribution,
        "--mirror",
        MIRROR,
        "--no-upgrade-test",
        "--tmpdir",
        str(tmp_path),
        *options,
        str(deb),
        timeout=600 * PATIENCE,
    )
    assert "PASS: All tests." in proc.stdout + proc.stderr
    print(f"piuparts {distribution} {deb.name}: {time.monotonic() - began:.0f} s")


@pytest.mark.parametrize("package", PACKAGES)
def test_piuparts_this_release(base_debs: Debs, tmp_path: Path, package: str) -> None:
    deb = base_debs.node if package == "gpuagent" else base_debs.aggregator
    _piuparts(deb, _codename(), tmp_path)


@pytest.mark.parametrize("package", PACKAGES)
def test_piuparts_debian_13(other_debs: Debs, tmp_path: Path, package: str) -> None:
    deb = other_debs.node if package == "gpuagent" else other_debs.aggregator
    # Debian 13's debconf leaves its temporary directory behind after any apt run, which
    # Debian 12's piuparts (older than that debconf) does not yet know to ignore.
    _piuparts(deb, OTHER_SUITE, tmp_path, "--ignore=/var/cache/debconf/tmp.ci/")
