#!/usr/bin/env python3
"""A fleet on this machine: a broker with the shipped configuration and ACL, a development
CA with per-node and aggregator certificates, an aggregator, and N simulated agents, some
of whose GPUs fail as time goes on. Prints the console's address; Ctrl-C stops it all.

    scripts/run-fleet [N] [--dir DIR] [--postgres URL] [--port PORT]

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


def aggregator_config(root: Path, pki: Pki, broker_port: int, http: int, database: str) -> Path:
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
    return conf


def agent_files(root: Path, pki: Pki, node: str, index: int, broker_port: int) -> tuple[Path, Path]:
    """The node's configuration and scenario."""
    home = root / node
    home.mkdir()
    (home / "kernel.log").touch()
    crt, key = pki.issue(node)
    config = home / "config.toml"
    config.write_text(
        f'[agent]\nnode_name = "{node}"\ncluster = "dev"\nstate_dir = "{home / "state"}"\n'
        f'[api]\nsocket = "{home / "gpuagent.sock"}"\n'
        f'[metrics]\nlisten = "127.0.0.1:{free_port()}"\n'
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
    def __init__(self, root: Path, nodes: int, port: int, database: str) -> None:
        self.root = root
        self.nodes = nodes
        self.port = port
        self.database = database
        self.pki = Pki(root / "pki")
        self.children: list[subprocess.Popen[bytes]] = []

    def start(self, mosquitto: str) -> None:
        self.pki.init(["127.0.0.1", "localhost"])
        broker_port = free_port()
        log = self.root / "mosquitto.log"
        broker = start([mosquitto, "-c", str(broker_config(self.root, self.pki, broker_port))], log)
        self.children.append(broker)
        wait_for_port(broker_port, "the broker", broker, log)
        conf = aggregator_config(self.root, self.pki, broker_port, self.port, self.database)
        log = self.root / "aggregator.log"
        python = sys.executable
        aggregator = start([python, "-m", "gpuagent.aggregator", "run", "--config", str(conf)], log)
        self.children.append(aggregator)
        wait_for_port(self.port, "the aggregator", aggregator, log)
        for index in range(1, self.nodes + 1):
            node = f"sim-node-{index:02d}"
            config, scenario = agent_files(self.root, self.pki, node, index, broker_port)
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


def main() -> int:
    parser = argparse.ArgumentParser(prog="run-fleet", description=__doc__.split("\n\n")[0])
    parser.add_argument("nodes", nargs="?", type=int, default=4, help="agents (default 4)")
    parser.add_argument("--dir", type=Path, default=REPO / ".run" / "fleet")
    parser.add_argument("--postgres", metavar="URL", help="a PostgreSQL database, not SQLite")
    parser.add_argument("--port", type=int, default=19500, help="the console's (default 19500)")
    args = parser.parse_args()
    if not 1 <= args.nodes <= 64:
        parser.error("between 1 and 64 nodes")
    mosquitto = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    if not Path(mosquitto).exists():
        sys.exit("run-fleet: mosquitto is not installed (scripts/setup mosquitto)")
    root = args.dir.resolve()
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    fleet = Fleet(root, args.nodes, args.port, args.postgres or str(root / "fleet.sqlite"))
    # SIGTERM stops it as Ctrl-C does.
    signal.signal(signal.SIGTERM, lambda *_: signal.raise_signal(signal.SIGINT))
    try:
        fleet.start(mosquitto)
        sys.stdout.write(
            f"run-fleet: {args.nodes} simulated nodes report to the aggregator\n"
            f"  console  http://127.0.0.1:{args.port}/\n"
            f"  API      http://127.0.0.1:{args.port}/api/v1/fleet\n"
            f"  files    {root} (certificates in pki/, a log per node)\n"
            f"  a fault  {REPO / '.venv/bin/gpuagent'} inject --config "
            f"{root / 'sim-node-01' / 'config.toml'} ecc_dbe --gpu 3 count=1\n"
            "Ctrl-C stops everything.\n"
        )
        sys.stdout.flush()
        return fleet.watch()
    except KeyboardInterrupt:
        return 0
    finally:
        fleet.stop()


if __name__ == "__main__":
    sys.exit(main())
