#!/usr/bin/env python3
"""A fleet on this machine: a broker with the shipped configuration and ACL, a development
CA with per-node and aggregator certificates, an aggregator, and N simulated agents, some
of whose GPUs fail as time goes on; and, where Prometheus and Alertmanager are installed,
a Prometheus scraping the agents with the shipped alert rules and an Alertmanager, which
the console shows each node's alerts from. Prints the addresses; Ctrl-C or SIGTERM stops it all.

    scripts/run-fleet [N] [--dir DIR] [--postgres URL] [--port PORT] [--no-alerts]
                      [--stop-node K]
    scripts/run-fleet --rack gb200 [--drill cascade|links-down|none] [...]

Everything lives in DIR (default .run/fleet, made anew each run): certificates, the
broker's and aggregator's configuration and data, each agent's configuration, state and
log. See docs/fleet.md ("Trying it on one machine").

--stop-node K: a crashed node. Once node K is online at the aggregator, its agent is
killed (SIGKILL: no goodbye), so the broker publishes its last will and the console shows
it offline ("connection lost"); it prints when the aggregator has it offline. The rest of
the fleet runs on.

--rack gb200 runs a GB200 NVL72 rack instead: 18 compute trays of 4 GPUs in one NVLink
domain, 16 of them running one Slurm job (the last two are spares), every agent asking
the aggregator before it cordons (remediation enforced, cordon backend "aggregator"),
and a fleet cordon budget of 2 nodes. Once every tray has reported its domain and job,
the drill (--drill, default cascade) writes NVIDIA's kernel-log lines into the trays'
kernel logs, the same each run:

    cascade     Xid 149 (link 14 down, Fatal) on gb200-tray-07 GPU 2; within 6 s Xid 145
                on the job's 63 other GPUs (16 trays), each with 300 lines of Xid 45
                "caused by previous Xid 145" and an Xid 154 (GPU Reset Required). One
                fleet incident with its root on tray 7; the arbiter approves tray 7's
                cordon and denies the 15 others as consequences.
    links-down  Xid 149 (Fatal, link down) on all 72 GPUs within a second, and Xid 154:
                one incident with no GPU root (the rack, not a GPU); the budget decides.
    none        no drill: a quiet rack, for faults of your own (gpuagent inject).

It prints when the drill starts and ends, then the fleet incident and the cordon
decisions as the aggregator serves them (/api/v1/incidents, /api/v1/cordons), and writes
DIR/drill.json (the drill's nodes, root and times).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuagent.fleet.pki import Pki
from gpuagent.sim.catalog import find_profile

REPO = Path(__file__).resolve().parent.parent
SHIPPED_CONF = REPO / "deploy" / "mosquitto" / "gpuagent.conf"
SHIPPED_ACL = REPO / "deploy" / "mosquitto" / "gpuagent.acl"
SHIPPED_RULES = REPO / "deploy" / "prometheus" / "gpuagent-rules.yml"
SHIPPED_ROUTES = REPO / "deploy" / "alertmanager" / "gpuagent.yml"
MODEL = 'gpus = 8\nmodel = "NVIDIA H100 80GB HBM3"\ndriver_version = "550.54.15"\n'
# What goes wrong on which node, and when (seconds after it starts); the rest stay healthy.
TIMELINES = {
    1: "demo",  # scenarios/demo.toml: corrected errors, a row remap, heat, a DBE
    3: '[[fault]]\nat = 20.0\ngpu = 2\nkind = "temperature"\ncelsius = 91\n'
    '[[fault]]\nat = 90.0\ngpu = 2\nkind = "clear"\n',
    4: '[[fault]]\nat = 40.0\ngpu = 5\nkind = "gpu_lost"\n',
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def broker_config(root: Path, pki: Pki, port: int) -> Path:
    """The shipped mosquitto configuration with this fleet's paths and port."""
    paths = {
        "cafile": pki.ca_file,
        "certfile": pki.directory / "broker.crt",
        "keyfile": pki.directory / "broker.key",
        "acl_file": SHIPPED_ACL,
    }
    lines = []
    for shipped in SHIPPED_CONF.read_text().splitlines():
        words = shipped.split()
        if not words or words[0].startswith("#"):
            continue
        if words[0] == "listener":
            lines.append(f"listener {port} 127.0.0.1")
        else:
            lines.append(f"{words[0]} {paths[words[0]]}" if words[0] in paths else shipped)
    lines[:0] = [f"persistence_location {root}/", f"log_dest file {root / 'mosquitto.log'}"]
    lines.append(f"crlfile {pki.crl_file}")
    if os.geteuid() == 0:
        lines.insert(0, "user root")  # else mosquitto drops to a user that cannot read root's files
    conf = root / "mosquitto.conf"
    conf.write_text("\n".join(lines) + "\n")
    return conf


def aggregator_config(
    root: Path,
    pki: Pki,
    broker_port: int,
    http: int,
    database: str,
    *,
    alertmanager: str = "",
    extra: str = "",
) -> Path:
    crt, key = pki.client_files("aggregator")
    token = root / "command-token"
    token.write_text(os.urandom(16).hex() + "\n")
    token.chmod(0o600)
    conf = root / "aggregator.toml"
    conf.write_text(
        f'[aggregator]\nlisten = "127.0.0.1:{http}"\ndatabase = "{database}"\n'
        f'command_token_file = "{token}"\n'
        f'[aggregator.broker]\nhost = "127.0.0.1"\nport = {broker_port}\n'
        f'ca_file = "{pki.ca_file}"\ncert_file = "{crt}"\nkey_file = "{key}"\n{extra}'
    )
    if alertmanager:
        with conf.open("a") as out:
            out.write(f'[aggregator.alertmanager]\nurl = "{alertmanager}"\ninterval_seconds = 5\n')
    return conf


def prometheus_config(root: Path, metrics_ports: dict[str, int], alertmanager_port: int) -> Path:
    """Every agent scraped every 5 s, its node's name and cluster on its series (as a
    relabelling would put them), the shipped rules, and this fleet's Alertmanager."""
    targets = "".join(
        f"      - targets: ['127.0.0.1:{port}']\n"
        f"        labels: {{node: '{node}', cluster: 'dev'}}\n"
        for node, port in metrics_ports.items()
    )
    conf = root / "prometheus.yml"
    conf.write_text(
        "global:\n  scrape_interval: 5s\n  evaluation_interval: 5s\n"
        f"rule_files: ['{SHIPPED_RULES}']\n"
        "alerting:\n  alertmanagers:\n"
        f"    - static_configs:\n        - targets: ['127.0.0.1:{alertmanager_port}']\n"
        f"scrape_configs:\n  - job_name: gpuagent\n    static_configs:\n{targets}"
    )
    return conf


def agent_config(
    home: Path,
    pki: Pki,
    node: str,
    broker_port: int,
    *,
    metrics_port: int,
    state_interval: float = 10,
    extra: str = "",
) -> Path:
    """The node's configuration: reporting to this fleet's broker as ``node``."""
    (home / "kernel.log").touch()
    crt, key = pki.issue(node)
    config = home / "config.toml"
    config.write_text(
        f'[agent]\nnode_name = "{node}"\ncluster = "dev"\nstate_dir = "{home / "state"}"\n'
        f'[api]\nsocket = "{home / "gpuagent.sock"}"\n'
        f'[metrics]\nlisten = "127.0.0.1:{metrics_port}"\n'
        f'[sources.kmsg]\npath = "{home / "kernel.log"}"\n'
        f"[outputs.mqtt]\nenabled = true\nstate_interval_seconds = {state_interval:g}\n"
        f'[outputs.mqtt.broker]\nhost = "127.0.0.1"\nport = {broker_port}\n'
        f'ca_file = "{pki.ca_file}"\ncert_file = "{crt}"\nkey_file = "{key}"\n{extra}'
    )
    return config


def agent_files(
    root: Path, pki: Pki, node: str, index: int, broker_port: int, *, metrics_port: int
) -> tuple[Path, Path]:
    """The node's configuration and scenario."""
    home = root / node
    home.mkdir()
    config = agent_config(
        home,
        pki,
        node,
        broker_port,
        metrics_port=metrics_port,
        extra="[sources.nvml]\ninterval_seconds = 1\n",
    )
    timeline = TIMELINES.get(index, "")
    if timeline == "demo":
        scenario = REPO / "scenarios" / "demo.toml"
    else:
        scenario = home / "scenario.toml"
        scenario.write_text(f"[node]\n{MODEL}seed = {index}\n{timeline}")
    return config, scenario


# --- a GB200 NVL72 rack and its drills ------------------------------------------------------

RACK_TRAYS = 18
TRAY_GPUS = 4
JOB_TRAYS = 16  # the job's; the last two trays are spares, idle
RACK_JOB = 73101  # the Slurm job across the job's trays
# The rack's NVLink domain: its cluster UUID and clique id, as the fabric reports them.
RACK_CLUSTER_UUID = "5c1e7a2b-9d3f-4e61-8a70-2b4c6d8e0f12"
RACK_CLIQUE = 32766
RACK_SERIAL = "1821225000042"
# The rack's fleet cordon budget: the root's node fits, a rack's worth does not.
RACK_BUDGET = "[aggregator.cordon_budget]\nmax_nodes = 2\nmax_percent = 20.0\n"


def rack_agent(home: Path) -> str:
    """A tray's agent: it asks the aggregator before it cordons (remediation enforced, the
    "aggregator" cordon backend), reads each GPU process's Slurm job, and polls lightly."""
    return (
        "[sources.nvml]\ninterval_seconds = 5\nprofiling = false\n"
        "[sources.sysfs]\ninterval_seconds = 60\n"
        "[attribution]\nslurm = true\n"
        f'[remediation]\nmode = "enforce"\nkill_switch = "{home / "remediation.paused"}"\n'
        '[remediation.cordon]\nbackends = ["aggregator"]\n'
    )


DRILLS = ("cascade", "links-down", "none")
CASCADE_ROOT = (7, 2)  # (tray, GPU index): the GPU whose link goes down
CASCADE_LINK = 14
STORM_LINES = 300  # Xid 45 lines per GPU, in three bursts
_REGS = "(0x004505c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)"
_RLW_REGS = "(0x040868e2 0x00000008 0x00000000 0x00000000 0x00000000 0x00000000)"


@dataclass(frozen=True)
class Tray:
    """One compute tray of the rack: a node of four GB200."""

    number: int  # 1..18
    buses: tuple[str, ...]  # each GPU's PCI bus id, by index

    @property
    def name(self) -> str:
        return f"gb200-tray-{self.number:02d}"

    @property
    def in_job(self) -> bool:
        return self.number <= JOB_TRAYS

    @property
    def slot(self) -> int:
        # Ten trays above the nine NVSwitch trays (slots 11-19), eight below.
        return self.number if self.number <= 10 else self.number + 9

    def pid(self, gpu: int) -> int:
        return 30000 + 100 * self.number + gpu

    def scenario(self) -> str:
        text = (
            f'[node]\nmodel = "gb200"\ngpus = {TRAY_GPUS}\nseed = {self.number}\n'
            f'fabric_state = "completed"\nfabric_cluster_uuid = "{RACK_CLUSTER_UUID}"\n'
            f'fabric_clique_id = {RACK_CLIQUE}\nchassis_serial = "{RACK_SERIAL}"\n'
            f"slot_number = {self.slot}\ntray_index = {self.number}\nhost_id = 1\n"
            'imex = "active"\n'
        )
        if self.in_job:  # a rank of the job on every GPU, from the start
            for gpu in range(TRAY_GPUS):
                text += (
                    f'[[fault]]\nkind = "process"\ngpu = {gpu}\npid = {self.pid(gpu)}\n'
                    f'name = "python3"\nused_mib = 160000\njob = {RACK_JOB}\n'
                )
        return text


def rack_trays() -> list[Tray]:
    found = find_profile("gb200")
    assert found is not None
    slots = found[0].slots(TRAY_GPUS)
    buses = tuple(f"0000:{bus:02x}:{device:02x}.0" for bus, device in slots)
    return [Tray(number, buses) for number in range(1, RACK_TRAYS + 1)]


def _pci(bus_id: str) -> str:
    """ "0000:9c:00.0" -> "0000:9c:00", as Xid lines print it."""
    return bus_id.rsplit(".", 1)[0]


def xid149(bus_id: str, link: int) -> str:
    return (
        f"NVRM: Xid (PCI:{_pci(bus_id)}): 149, NETIR_LINK_EVT Fatal XC0 i0 Link {link:02d} {_REGS}"
    )


def xid145(bus_id: str, pid: int, link: int) -> str:
    return (
        f"NVRM: Xid (PCI:{_pci(bus_id)}): 145, pid={pid}, name=python3, "
        f"RLW_TAGSTATE Fatal XC0 i0 Link {link:02d} {_RLW_REGS}"
    )


def xid45(bus_id: str, pid: int, channel: int, root_xid: int) -> str:
    return (
        f"NVRM: Xid (PCI:{_pci(bus_id)}): 45, pid={pid}, name=python3, "
        f"Ch {channel:08x} caused by previous Xid {root_xid}"
    )


def xid154(bus_id: str) -> str:
    return (
        f"NVRM: Xid (PCI:{_pci(bus_id)}): 154, GPU recovery action changed from 0x0 (None) "
        "to 0x1 (GPU Reset Required)"
    )


@dataclass
class Drill:
    """Kernel-log lines to write into the trays' logs: (seconds after the start, node,
    lines), and what the fleet should make of them."""

    name: str
    steps: list[tuple[float, str, list[str]]] = field(default_factory=list)
    root: tuple[Tray, int] | None = None
    gpus: int = 0  # the GPUs that log anything
    requesting: list[str] = field(default_factory=list)  # the nodes that will ask to cordon
    # The step with the first line of the GPU that logs last of all (the incident's last
    # member): (seconds after the start, node).
    last_member: tuple[float, str] = (0.0, "")

    def add(self, at: float, tray: Tray, *lines: str) -> None:
        self.steps.append((round(at, 3), tray.name, list(lines)))

    def member(self, at: float, tray: Tray, line: str) -> None:
        """A GPU's first line."""
        self.add(at, tray, line)
        self.last_member = max(self.last_member, (round(at, 3), tray.name))

    def storm(self, at: float, tray: Tray, gpu: int, root_xid: int) -> None:
        """Xid 45 teardowns of the job's channels on ``gpu``, in three bursts."""
        burst = STORM_LINES // 3
        for part in range(3):
            lines = [
                xid45(tray.buses[gpu], tray.pid(gpu), 1 + (part * burst + n) % 64, root_xid)
                for n in range(burst)
            ]
            self.add(at + 0.5 * part, tray, *lines)


def cascade(trays: list[Tray]) -> Drill:
    """One GPU's link down (Xid 149), and what the job's other 63 GPUs log after it."""
    number, index = CASCADE_ROOT
    root = trays[number - 1]
    drill = Drill("cascade", root=(root, index))
    drill.member(0.0, root, xid149(root.buses[index], CASCADE_LINK))
    drill.storm(0.3, root, index, 149)
    drill.add(1.0, root, xid154(root.buses[index]))
    downstream = [
        (tray, gpu)
        for tray in trays
        if tray.in_job
        for gpu in range(TRAY_GPUS)
        if (tray, gpu) != (root, index)
    ]
    random.Random(145).shuffle(downstream)  # noqa: S311 - around the rack, the same every run
    for k, (tray, gpu) in enumerate(downstream):
        at = 0.5 + 5.5 * k / (len(downstream) - 1)  # all within 6 s of the root
        bus = tray.buses[gpu]
        drill.member(at, tray, xid145(bus, tray.pid(gpu), (3 + 5 * k) % 18))
        drill.storm(at + 0.2, tray, gpu, 145)
        drill.add(at + 1.0, tray, xid154(bus))
    drill.gpus = 1 + len(downstream)
    drill.requesting = [tray.name for tray in trays if tray.in_job]
    return drill


def links_down(trays: list[Tray]) -> Drill:
    """Every GPU of the rack loses a link at once: the rack's fault, no GPU's."""
    drill = Drill("links-down")
    gpus = [(tray, gpu) for tray in trays for gpu in range(TRAY_GPUS)]
    for k, (tray, gpu) in enumerate(gpus):
        at = k / (len(gpus) - 1)  # within a second
        drill.member(at, tray, xid149(tray.buses[gpu], k % 18))
        drill.add(at + 1.0, tray, xid154(tray.buses[gpu]))
    drill.gpus = len(gpus)
    drill.requesting = [tray.name for tray in trays]
    return drill


def make_drill(name: str) -> Drill:
    if name == "cascade":
        return cascade(rack_trays())
    if name == "links-down":
        return links_down(rack_trays())
    return Drill(name)


def say(text: str) -> None:
    sys.stdout.write(f"run-fleet: {text}\n")
    sys.stdout.flush()


class DrillRunner:
    """Waits until the aggregator knows every tray's domain and job, writes the drill's
    lines on time, then reports what the aggregator made of them."""

    def __init__(self, root: Path, api: str, trays: list[Tray], drill: Drill) -> None:
        self.root = root
        self.api = api
        self.trays = trays
        self.drill = drill
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="drill", daemon=True)

    def _get(self, path: str) -> Any:
        with urllib.request.urlopen(self.api + path, timeout=5) as answer:  # noqa: S310
            return json.loads(answer.read())

    def _placed(self, tray: Tray) -> bool:
        """Whether the aggregator has the tray's report with every GPU's domain (and job)."""
        try:
            status = self._get(f"api/v1/fleet/{tray.name}?cluster=dev").get("status") or {}
        except OSError:
            return False
        gpus = status.get("gpus") or []
        domain = f"{RACK_CLUSTER_UUID}/{RACK_CLIQUE}"
        job = [{"hpc_job": str(RACK_JOB)}] if tray.in_job else []
        return len(gpus) == TRAY_GPUS and all(
            (g.get("fabric") or {}).get("nvlink_domain") == domain
            and (g.get("workloads") or []) == job
            for g in gpus
        )

    def _wait_placed(self, seconds: float) -> bool:
        """Whether every tray is placed within ``seconds``."""
        deadline = time.monotonic() + seconds
        waiting = list(self.trays)
        while waiting:
            waiting = [tray for tray in waiting if not self._placed(tray)]
            if not waiting:
                return True
            if time.monotonic() > deadline or self.stopping.wait(1.0):
                return False
        return True

    def _run(self) -> None:
        try:
            self._drill()
        except Exception as exc:  # noqa: BLE001 - the fleet goes on without its drill
            say(f"drill {self.drill.name} failed: {exc!r}")

    def _drill(self) -> None:
        drill = self.drill
        waited = time.monotonic()
        if not self._wait_placed(180):
            if not self.stopping.is_set():
                say(f"drill {drill.name} not run: not every tray reported its domain and job")
            return
        waited = time.monotonic() - waited
        if drill.root is not None:
            tray, index = drill.root
            what = f"Xid 149 on {tray.name} GPU {index} ({tray.buses[index]})"
        else:
            what = f"Xid 149 on all {drill.gpus} GPUs"
        say(f"every tray reported its domain and job in {waited:.0f} s; drill {drill.name}: {what}")
        started = time.time()
        logs = {tray.name: self.root / tray.name / "kernel.log" for tray in self.trays}
        last = last_member = started
        for at, node, lines in sorted(drill.steps, key=lambda step: step[0]):
            if self.stopping.wait(max(0.0, started + at - time.time())):
                return
            with logs[node].open("a") as log:
                log.write("".join(f"{line}\n" for line in lines))
            last = time.time()
            if (at, node) == drill.last_member:
                last_member = last
        written = sum(len(step[2]) for step in drill.steps)
        say(f"drill {drill.name}: {written} lines written, the last {last - started:.1f} s in")
        self._record(started, last_member, last)
        self._outcome(last_member)

    def _record(self, started: float, last_member: float, last: float) -> None:
        root = None
        if self.drill.root is not None:
            tray, index = self.drill.root
            root = {"node": tray.name, "index": index, "pci_bus_id": tray.buses[index]}
        doc = {
            "drill": self.drill.name,
            "nvlink_domain": f"{RACK_CLUSTER_UUID}/{RACK_CLIQUE}",
            "root": root,
            "gpus": self.drill.gpus,
            "nodes": sorted({node for _, node, _ in self.drill.steps}),
            "requesting": self.drill.requesting,
            "started": started,
            "last_member": last_member,
            "last_line": last,
        }
        written = self.root / "drill.json.new"
        written.write_text(json.dumps(doc, indent=2) + "\n")
        written.replace(self.root / "drill.json")  # whole, for whoever waits for it

    def _outcome(self, last: float) -> None:
        """The incident once it holds every GPU of the drill (``last``: when the last of them
        logged its first line), and the decisions once every requesting node has one (or
        after two minutes: what there is)."""
        deadline = time.monotonic() + 120
        complete: float | None = None
        incident: dict[str, Any] = {}
        decisions: dict[str, dict[str, Any]] = {}
        while not self.stopping.wait(0.5):
            try:
                found = self._get(f"api/v1/incidents?since={last - 600:.0f}")["incidents"]
                rows = self._get(f"api/v1/cordons?since={last - 600:.0f}")["cordons"]
            except OSError:
                continue
            if found:
                incident = found[0]
                if complete is None and incident["counts"]["gpus"] >= self.drill.gpus:
                    complete = time.time()
            decisions = {r["node"]: r for r in rows if r.get("action") == "cordon"}
            done = complete is not None and set(self.drill.requesting) <= set(decisions)
            if done or time.monotonic() > deadline:
                break
        else:
            return
        if incident:
            counts = incident["counts"]
            when = ""
            if complete is not None:
                when = f"; complete {complete - last:.1f} s after its last GPU's first line"
            say(
                f"fleet incident {incident['id']}: {incident['summary']} "
                f"({counts['gpus']} GPUs on {counts['nodes']} nodes{when})"
            )
        else:
            say("no fleet incident")
        approved = sorted(n for n, r in decisions.items() if r["decision"] == "approved")
        denied = sorted(n for n, r in decisions.items() if r["decision"] != "approved")
        say(f"cordons approved: {', '.join(approved) or 'none'}")
        reasons = sorted({decisions[n]["reason"] for n in denied})
        say(f"cordons denied: {len(denied)} ({'; '.join(reasons) or '-'})")
        say(f"see {self.api}api/v1/incidents and {self.api}api/v1/cordons")


def start(command: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)  # noqa: S603


class Stopped(Exception):  # noqa: N818 - not an error: asked to stop
    """Raised where starting the fleet meets a stop request, to stop what has started."""


class StopRequest:
    """SIGTERM, or SIGINT (Ctrl-C) where it is not ignored, as a flag the main thread
    polls. The handler only sets it: one that raised or stopped children could do so
    halfway through starting one and leave it behind. A background job of a
    non-interactive shell starts with SIGINT ignored (Ctrl-C in the terminal is not for
    it), and SIGINT is left so; SIGTERM is what stops it there."""

    def __init__(self) -> None:
        self.signal: int | None = None

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._handle)
        if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
            signal.signal(signal.SIGINT, self._handle)

    def _handle(self, signum: int, _frame: object) -> None:
        self.signal = signum

    def check(self) -> None:
        if self.signal is not None:
            raise Stopped


def wait_for_port(
    port: int, what: str, process: subprocess.Popen[bytes], log: Path, stop: StopRequest
) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        stop.check()
        if process.poll() is not None:
            sys.exit(f"run-fleet: {what} exited; see {log}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.1)
    sys.exit(f"run-fleet: {what} is not listening on {port}; see {log}")


class NodeCrash:
    """--stop-node: when to kill the node's agent (once the aggregator has it online), and
    what the aggregator made of it after (offline, with the broker's last will)."""

    def __init__(self, api: str, node: str) -> None:
        self.api = api
        self.node = node
        self.page = f"{api}#node/dev/{node}"
        self.killed_at: float | None = None
        self.next_look = 0.0
        self.done = False

    def _record(self) -> dict[str, Any] | None:
        """The node as the aggregator has it; None: not yet, or no answer."""
        url = f"{self.api}api/v1/fleet/{self.node}?cluster=dev"
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:  # noqa: S310
                doc: dict[str, Any] = json.loads(answer.read())
        except OSError:  # not reported yet (404), or the aggregator busy
            return None
        return doc

    def due(self) -> bool:
        """Whether to kill the agent now. Looks once a second, and after the kill (never
        due again) says when the aggregator has the node offline, or that it does not."""
        now = time.monotonic()
        if self.done or now < self.next_look:
            return False
        self.next_look = now + 1.0
        record = self._record()
        if self.killed_at is None:
            return record is not None and bool(record.get("online"))
        if record is not None and not record.get("online"):
            say(
                f"{self.node} offline at the aggregator {time.monotonic() - self.killed_at:.1f}"
                f" s after the kill (reason: {record.get('reason') or '-'})"
            )
            self.done = True
        elif now - self.killed_at > 60:
            say(f"{self.node} still online at the aggregator 60 s after the kill")
            self.done = True
        return False

    def killed(self, pid: int) -> None:
        self.killed_at = time.monotonic()
        say(
            f"{self.node} stopped abruptly (its agent, pid {pid}, killed with SIGKILL: no "
            f"goodbye); the broker sends its last will, and its page shows it offline: "
            f"{self.page}"
        )


class Fleet:
    def __init__(
        self,
        root: Path,
        nodes: int,
        port: int,
        database: str,
        alerting: tuple[str, str] | None,
        *,
        drill: Drill | None = None,
        stop: StopRequest | None = None,
        crash: int | None = None,
    ) -> None:
        self.root = root
        self.nodes = nodes
        self.port = port
        self.database = database
        # (prometheus, alertmanager) executables; None: no alerting.
        self.alerting = alerting
        # A rack (its trays, and the drill, None for a quiet rack); else N plain nodes.
        self.trays = rack_trays() if drill is not None else []
        self.drill = None if drill is None or drill.name == "none" else drill
        self.runner: DrillRunner | None = None
        self.pki = Pki(root / "pki")
        self.children: list[subprocess.Popen[bytes]] = []
        self.addresses: dict[str, str] = {}
        # Each agent's process id: its node, configuration and the fleet's metrics ports.
        self.agents: dict[int, tuple[str, Path, dict[str, int]]] = {}
        self.prometheus: subprocess.Popen[bytes] | None = None
        self.alertmanager_port = 0
        self.stopping = StopRequest() if stop is None else stop
        # --stop-node: the node (1-based) whose agent is killed once it is online.
        self.crash_index = crash
        self.crash: NodeCrash | None = None

    def _service(self, command: list[str], name: str, port: int) -> None:
        log = self.root / f"{name}.log"
        child = start(command, log)
        self.children.append(child)
        wait_for_port(port, name, child, log, self.stopping)
        self.addresses[name] = f"http://127.0.0.1:{port}/"

    def _start_alerting(self, metrics_ports: dict[str, int]) -> str:
        """Alertmanager, then Prometheus sending to it; Alertmanager's address."""
        assert self.alerting is not None
        prometheus, alertmanager = self.alerting
        am_port, prom_port = free_port(), free_port()
        am_conf = self.root / "alertmanager.yml"
        am_conf.write_text(SHIPPED_ROUTES.read_text())  # its routes and inhibitions
        self._service(
            [alertmanager, f"--config.file={am_conf}", f"--web.listen-address=127.0.0.1:{am_port}",
             f"--storage.path={self.root / 'alertmanager-data'}", "--cluster.listen-address="],
            "alertmanager", am_port,
        )  # fmt: skip
        prom_conf = prometheus_config(self.root, metrics_ports, am_port)
        self._service(
            [prometheus, f"--config.file={prom_conf}",
             f"--web.listen-address=127.0.0.1:{prom_port}",
             f"--storage.tsdb.path={self.root / 'prometheus-data'}"],
            "prometheus", prom_port,
        )  # fmt: skip
        self.prometheus, self.alertmanager_port = self.children[-1], am_port
        return f"http://127.0.0.1:{am_port}"

    def start(self, mosquitto: str) -> None:
        self.pki.init(["127.0.0.1", "localhost"])
        broker_port = free_port()
        log = self.root / "mosquitto.log"
        broker = start([mosquitto, "-c", str(broker_config(self.root, self.pki, broker_port))], log)
        self.children.append(broker)
        wait_for_port(broker_port, "the broker", broker, log, self.stopping)
        if self.trays:
            names = [tray.name for tray in self.trays]
        else:
            names = [f"sim-node-{index:02d}" for index in range(1, self.nodes + 1)]
        metrics_ports = {node: free_port() for node in names}
        alertmanager = self._start_alerting(metrics_ports) if self.alerting else ""
        conf = aggregator_config(
            self.root,
            self.pki,
            broker_port,
            self.port,
            self.database,
            alertmanager=alertmanager,
            extra=RACK_BUDGET if self.trays else "",
        )
        log = self.root / "aggregator.log"
        python = sys.executable
        aggregator = start([python, "-m", "gpuagent.aggregator", "run", "--config", str(conf)], log)
        self.children.append(aggregator)
        wait_for_port(self.port, "the aggregator", aggregator, log, self.stopping)
        for index, node in enumerate(names, start=1):
            self.stopping.check()
            if self.trays:
                config, scenario = self._tray_files(
                    self.trays[index - 1], broker_port, metrics_ports
                )
            else:
                config, scenario = agent_files(
                    self.root, self.pki, node, index, broker_port, metrics_port=metrics_ports[node]
                )
            command = [python, "-m", "gpuagent", "run", "--config", str(config)]
            log = self.root / node / "log"
            agent = start([*command, "--simulate", str(scenario)], log)
            self.children.append(agent)
            self.agents[agent.pid] = (node, config, metrics_ports)
        if self.crash_index is not None:
            api = f"http://127.0.0.1:{self.port}/"
            self.crash = NodeCrash(api, names[self.crash_index - 1])

    def _tray_files(
        self, tray: Tray, broker_port: int, metrics_ports: dict[str, int]
    ) -> tuple[Path, Path]:
        home = self.root / tray.name
        home.mkdir()
        config = agent_config(
            home,
            self.pki,
            tray.name,
            broker_port,
            metrics_port=metrics_ports[tray.name],
            extra=rack_agent(home),
        )
        scenario = home / "scenario.toml"
        scenario.write_text(tray.scenario())
        return config, scenario

    def start_drill(self) -> None:
        if self.drill is not None:
            api = f"http://127.0.0.1:{self.port}/"
            self.runner = DrillRunner(self.root, api, self.trays, self.drill)
            self.runner.thread.start()

    def watch(self) -> int:
        """Until a child exits (1) or a stop request (0)."""
        while all(child.poll() is None for child in self.children) or self._port_taken():
            if self.stopping.signal is not None:
                return 0
            if self.crash is not None and self.crash.due():
                self._kill_agent(self.crash.node)
            time.sleep(0.5)
        failed = next(child for child in self.children if child.poll() is not None)
        command = failed.args if isinstance(failed.args, list) else [failed.args]
        sys.stderr.write(f"run-fleet: {' '.join(map(str, command[:4]))} exited\n")
        return 1

    def _kill_agent(self, node: str) -> None:
        """The node's agent killed as a crash would (SIGKILL), and no longer watched."""
        pid = next(pid for pid, (name, _, _) in self.agents.items() if name == node)
        child = next(child for child in self.children if child.pid == pid)
        child.kill()
        child.wait()
        self.children.remove(child)
        del self.agents[pid]
        assert self.crash is not None
        self.crash.killed(pid)

    def _port_taken(self) -> bool:
        """An agent that stopped because another program took its metrics port between
        `free_port` and its start (tests run beside it): started again on a new port, and
        Prometheus told. False: no such agent (another child exited)."""
        for index, child in enumerate(self.children):
            found = self.agents.pop(child.pid, None) if child.poll() is not None else None
            if found is None:
                continue
            node, config, ports = found
            with (self.root / node / "log").open("rb") as log:
                log.seek(max(0, log.seek(0, os.SEEK_END) - 512))
                if b"Address already in use" not in log.read():  # its last words
                    return False
            old, ports[node] = ports[node], free_port()
            text = config.read_text().replace(f"127.0.0.1:{old}", f"127.0.0.1:{ports[node]}")
            config.write_text(text)
            args = child.args if isinstance(child.args, list) else [child.args]
            again = start([str(a) for a in args], self.root / node / "log")
            self.children[index] = again
            self.agents[again.pid] = found
            if self.prometheus is not None:
                prometheus_config(self.root, ports, self.alertmanager_port)
                self.prometheus.send_signal(signal.SIGHUP)  # reloads its configuration
            say(f"{node}: metrics port {old} was taken; started again on {ports[node]}")
        return True

    def stop(self) -> None:
        # A second signal (a second Ctrl-C, `timeout` signalling the process group after
        # the script) only sets the stop request again: it cannot cut this short.
        if self.runner is not None:
            self.runner.stopping.set()
            self.runner.thread.join(timeout=5)
        for child in reversed(self.children):
            if child.poll() is None:
                child.terminate()
        # One deadline for all: they were all asked at once.
        deadline = time.monotonic() + 15
        for child in self.children:
            try:
                child.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()


def _alerting() -> tuple[str, str] | None:
    """Prometheus's and Alertmanager's executables, where both are installed."""
    found = [shutil.which(name) for name in ("prometheus", "prometheus-alertmanager")]
    prometheus, alertmanager = found
    return (prometheus, alertmanager) if prometheus and alertmanager else None


def main() -> int:
    parser = argparse.ArgumentParser(prog="run-fleet", description=__doc__.split("\n\n")[0])
    parser.add_argument("nodes", nargs="?", type=int, help="agents (default 4)")
    parser.add_argument("--dir", type=Path, default=REPO / ".run" / "fleet")
    parser.add_argument("--postgres", metavar="URL", help="a PostgreSQL database, not SQLite")
    parser.add_argument("--port", type=int, default=19500, help="the console's (default 19500)")
    parser.add_argument(
        "--no-alerts", action="store_true", help="no Prometheus and Alertmanager, even if installed"
    )
    parser.add_argument(
        "--rack", choices=["gb200"], help="a GB200 NVL72 rack: 18 trays in one NVLink domain"
    )
    parser.add_argument(
        "--drill", choices=DRILLS, help="with --rack: the drill to run (default cascade)"
    )
    parser.add_argument(
        "--stop-node",
        type=int,
        metavar="K",
        help="kill node K's agent (SIGKILL) once it is online: a crashed node",
    )
    args = parser.parse_args()
    if args.rack and args.nodes is not None:
        parser.error(f"--rack runs its {RACK_TRAYS} trays: leave N out")
    if args.drill and not args.rack:
        parser.error("--drill needs --rack")
    nodes = RACK_TRAYS if args.rack else 4 if args.nodes is None else args.nodes
    if not 1 <= nodes <= 64:
        parser.error("between 1 and 64 nodes")
    if args.stop_node is not None and not 1 <= args.stop_node <= nodes:
        parser.error(f"--stop-node: a node from 1 to {nodes}")
    mosquitto = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    if not Path(mosquitto).exists():
        sys.exit("run-fleet: mosquitto is not installed (scripts/setup mosquitto)")
    root = args.dir.resolve()
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    alerting = None if args.no_alerts else _alerting()
    database = args.postgres or str(root / "fleet.sqlite")
    drill = make_drill(args.drill or "cascade") if args.rack else None
    stop = StopRequest()
    stop.install()
    fleet = Fleet(
        root, nodes, args.port, database, alerting, drill=drill, stop=stop, crash=args.stop_node
    )
    try:
        fleet.start(mosquitto)
        what = f" (a GB200 NVL72 rack, drill {drill.name})" if drill is not None else ""
        first = fleet.trays[0].name if fleet.trays else "sim-node-01"
        lines = [
            f"run-fleet: {nodes} simulated nodes{what} report to the aggregator",
            f"  {'console':<12} http://127.0.0.1:{args.port}/",
            f"  {'API':<12} http://127.0.0.1:{args.port}/api/v1/fleet",
            *(f"  {name:<12} {url}" for name, url in fleet.addresses.items()),
            f"  {'files':<12} {root} (certificates in pki/, a log per node)",
            (
                f"  {'a fault':<12} {REPO / '.venv/bin/gpuagent'} inject --config "
                f"{root / first / 'config.toml'} ecc_dbe --gpu 3 count=1"
            ),
        ]
        if not alerting and not args.no_alerts:
            lines.append("  (no alerts: install prometheus and prometheus-alertmanager)")
        (root / "addresses.json").write_text(json.dumps(fleet.addresses))
        sys.stdout.write("\n".join([*lines, "Ctrl-C (or SIGTERM) stops everything.", ""]))
        sys.stdout.flush()
        if fleet.crash is not None:
            say(f"--stop-node: {fleet.crash.node}'s agent is killed once it is online")
        fleet.start_drill()
        return fleet.watch()
    except Stopped:
        return 0
    finally:
        fleet.stop()


if __name__ == "__main__":
    sys.exit(main())
