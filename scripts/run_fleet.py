#!/usr/bin/env python3
"""A fleet on this machine: a broker with the shipped configuration and ACL, a development
CA with per-node and aggregator certificates, an aggregator, and N simulated agents, some
of whose GPUs fail as time goes on; and, where Prometheus and Alertmanager are installed,
a Prometheus scraping the agents with the shipped alert rules and an Alertmanager, which
the console shows each node's alerts from. Prints the addresses; Ctrl-C stops it all.

    scripts/run-fleet [N] [--dir DIR] [--postgres URL] [--port PORT] [--no-alerts]

Everything lives in DIR (default .run/fleet, made anew each run): certificates, the
broker's and aggregator's configuration and data, each agent's configuration, state and
log. See docs/fleet.md ("Trying it on one machine").
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from gpuagent.fleet.pki import Pki

REPO = Path(__file__).resolve().parent.parent
SHIPPED_CONF = REPO / "deploy" / "mosquitto" / "gpuagent.conf"
SHIPPED_ACL = REPO / "deploy" / "mosquitto" / "gpuagent.acl"
SHIPPED_RULES = REPO / "deploy" / "prometheus" / "gpuagent-rules.yml"
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
    root: Path, pki: Pki, broker_port: int, http: int, database: str, *, alertmanager: str = ""
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
        f'ca_file = "{pki.ca_file}"\ncert_file = "{crt}"\nkey_file = "{key}"\n'
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


def agent_files(
    root: Path, pki: Pki, node: str, index: int, broker_port: int, *, metrics_port: int
) -> tuple[Path, Path]:
    """The node's configuration and scenario."""
    home = root / node
    home.mkdir()
    (home / "kernel.log").touch()
    crt, key = pki.issue(node)
    config = home / "config.toml"
    config.write_text(
        f'[agent]\nnode_name = "{node}"\ncluster = "dev"\nstate_dir = "{home / "state"}"\n'
        f'[api]\nsocket = "{home / "gpuagent.sock"}"\n'
        f'[metrics]\nlisten = "127.0.0.1:{metrics_port}"\n'
        f'[sources.nvml]\ninterval_seconds = 1\n[sources.kmsg]\npath = "{home / "kernel.log"}"\n'
        f"[outputs.mqtt]\nenabled = true\nstate_interval_seconds = 10\n"
        f'[outputs.mqtt.broker]\nhost = "127.0.0.1"\nport = {broker_port}\n'
        f'ca_file = "{pki.ca_file}"\ncert_file = "{crt}"\nkey_file = "{key}"\n'
    )
    timeline = TIMELINES.get(index, "")
    if timeline == "demo":
        scenario = REPO / "scenarios" / "demo.toml"
    else:
        scenario = home / "scenario.toml"
        scenario.write_text(f"[node]\n{MODEL}seed = {index}\n{timeline}")
    return config, scenario


def start(command: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)  # noqa: S603


def wait_for_port(port: int, what: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            sys.exit(f"run-fleet: {what} exited; see {log}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.1)
    sys.exit(f"run-fleet: {what} is not listening on {port}; see {log}")


class Fleet:
    def __init__(
        self, root: Path, nodes: int, port: int, database: str, alerting: tuple[str, str] | None
    ) -> None:
        self.root = root
        self.nodes = nodes
        self.port = port
        self.database = database
        # (prometheus, alertmanager) executables; None: no alerting.
        self.alerting = alerting
        self.pki = Pki(root / "pki")
        self.children: list[subprocess.Popen[bytes]] = []
        self.addresses: dict[str, str] = {}

    def _service(self, command: list[str], name: str, port: int) -> None:
        log = self.root / f"{name}.log"
        child = start(command, log)
        self.children.append(child)
        wait_for_port(port, name, child, log)
        self.addresses[name] = f"http://127.0.0.1:{port}/"

    def _start_alerting(self, metrics_ports: dict[str, int]) -> str:
        """Alertmanager, then Prometheus sending to it; Alertmanager's address."""
        assert self.alerting is not None
        prometheus, alertmanager = self.alerting
        am_port, prom_port = free_port(), free_port()
        am_conf = self.root / "alertmanager.yml"
        am_conf.write_text("route:\n  receiver: none\nreceivers:\n  - name: none\n")
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
        return f"http://127.0.0.1:{am_port}"

    def start(self, mosquitto: str) -> None:
        self.pki.init(["127.0.0.1", "localhost"])
        broker_port = free_port()
        log = self.root / "mosquitto.log"
        broker = start([mosquitto, "-c", str(broker_config(self.root, self.pki, broker_port))], log)
        self.children.append(broker)
        wait_for_port(broker_port, "the broker", broker, log)
        names = [f"sim-node-{index:02d}" for index in range(1, self.nodes + 1)]
        metrics_ports = {node: free_port() for node in names}
        alertmanager = self._start_alerting(metrics_ports) if self.alerting else ""
        conf = aggregator_config(
            self.root, self.pki, broker_port, self.port, self.database, alertmanager=alertmanager
        )
        log = self.root / "aggregator.log"
        python = sys.executable
        aggregator = start([python, "-m", "gpuagent.aggregator", "run", "--config", str(conf)], log)
        self.children.append(aggregator)
        wait_for_port(self.port, "the aggregator", aggregator, log)
        for index, node in enumerate(names, start=1):
            config, scenario = agent_files(
                self.root, self.pki, node, index, broker_port, metrics_port=metrics_ports[node]
            )
            command = [python, "-m", "gpuagent", "run", "--config", str(config)]
            log = self.root / node / "log"
            self.children.append(start([*command, "--simulate", str(scenario)], log))

    def watch(self) -> int:
        """Until a child exits (1) or Ctrl-C (0)."""
        try:
            while all(child.poll() is None for child in self.children):
                time.sleep(0.5)
        except KeyboardInterrupt:
            return 0
        failed = next(child for child in self.children if child.poll() is not None)
        sys.stderr.write(f"run-fleet: {' '.join(map(str, failed.args[:4]))} exited\n")
        return 1

    def stop(self) -> None:
        for child in reversed(self.children):
            if child.poll() is None:
                child.terminate()
        for child in self.children:
            try:
                child.wait(timeout=15)
            except subprocess.TimeoutExpired:
                child.kill()


def _alerting() -> tuple[str, str] | None:
    """Prometheus's and Alertmanager's executables, where both are installed."""
    found = [shutil.which(name) for name in ("prometheus", "prometheus-alertmanager")]
    prometheus, alertmanager = found
    return (prometheus, alertmanager) if prometheus and alertmanager else None


def main() -> int:
    parser = argparse.ArgumentParser(prog="run-fleet", description=__doc__.split("\n\n")[0])
    parser.add_argument("nodes", nargs="?", type=int, default=4, help="agents (default 4)")
    parser.add_argument("--dir", type=Path, default=REPO / ".run" / "fleet")
    parser.add_argument("--postgres", metavar="URL", help="a PostgreSQL database, not SQLite")
    parser.add_argument("--port", type=int, default=19500, help="the console's (default 19500)")
    parser.add_argument(
        "--no-alerts", action="store_true", help="no Prometheus and Alertmanager, even if installed"
    )
    args = parser.parse_args()
    if not 1 <= args.nodes <= 64:
        parser.error("between 1 and 64 nodes")
    mosquitto = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    if not Path(mosquitto).exists():
        sys.exit("run-fleet: mosquitto is not installed (scripts/setup mosquitto)")
    root = args.dir.resolve()
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    alerting = None if args.no_alerts else _alerting()
    database = args.postgres or str(root / "fleet.sqlite")
    fleet = Fleet(root, args.nodes, args.port, database, alerting)
    # SIGTERM stops it as Ctrl-C does.
    signal.signal(signal.SIGTERM, lambda *_: signal.raise_signal(signal.SIGINT))
    try:
        fleet.start(mosquitto)
        lines = [
            f"run-fleet: {args.nodes} simulated nodes report to the aggregator",
            f"  {'console':<12} http://127.0.0.1:{args.port}/",
            f"  {'API':<12} http://127.0.0.1:{args.port}/api/v1/fleet",
            *(f"  {name:<12} {url}" for name, url in fleet.addresses.items()),
            f"  {'files':<12} {root} (certificates in pki/, a log per node)",
            (
                f"  {'a fault':<12} {REPO / '.venv/bin/gpuagent'} inject --config "
                f"{root / 'sim-node-01' / 'config.toml'} ecc_dbe --gpu 3 count=1"
            ),
        ]
        if not alerting and not args.no_alerts:
            lines.append("  (no alerts: install prometheus and prometheus-alertmanager)")
        sys.stdout.write("\n".join([*lines, "Ctrl-C stops everything.", ""]))
        sys.stdout.flush()
        return fleet.watch()
    except KeyboardInterrupt:
        return 0
    finally:
        fleet.stop()


if __name__ == "__main__":
    sys.exit(main())
