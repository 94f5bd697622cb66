"""`gpuagent` command line: a thin shell over the daemon, the API client and the checks.

Commands import what they need when they run, so `gpuagent status` does not pay for
pynvml, prometheus_client or the simulator.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from gpuagent import __version__

if TYPE_CHECKING:
    from gpuagent.config import Config

DEFAULT_CONFIG = Path("/etc/gpuagent/config.toml")
EXIT_CONFIG_ERROR = 2
EXIT_UNKNOWN = 3


def _fail(message: str, code: int = 1) -> NoReturn:
    print(f"gpuagent: {message}", file=sys.stderr)
    sys.exit(code)


def _load_config(path: Path | None) -> Config:
    """Load --config, else /etc/gpuagent/config.toml if present, else the defaults."""
    from gpuagent.config import ConfigError, load_config  # noqa: PLC0415

    if path is None and DEFAULT_CONFIG.exists():
        path = DEFAULT_CONFIG
    try:
        return load_config(path)
    except ConfigError as exc:
        _fail(f"invalid configuration{f' {path}' if path else ''}: {exc}", EXIT_CONFIG_ERROR)


def _socket_path(args: argparse.Namespace) -> Path:
    if args.socket is not None:
        return Path(args.socket)
    return _load_config(args.config).api.socket


def _check_scenario(path: Path | None) -> None:
    if path is None:
        return
    from gpuagent.config import ConfigError  # noqa: PLC0415
    from gpuagent.sim import load_scenario  # noqa: PLC0415

    try:
        load_scenario(path)
    except ConfigError as exc:
        _fail(f"invalid scenario {path}: {exc}", EXIT_CONFIG_ERROR)


def _setup_logging(level: str) -> None:
    # Under systemd, journald stamps time and unit itself.
    fmt = "%(levelname)s %(name)s: %(message)s"
    if not os.environ.get("JOURNAL_STREAM"):
        fmt = "%(asctime)s " + fmt
    logging.basicConfig(level=level.upper(), format=fmt, stream=sys.stderr)


# --- commands -------------------------------------------------------------------------


def cmd_run(args: argparse.Namespace) -> int:
    config = _load_config(args.config)
    _check_scenario(args.simulate)
    _setup_logging(args.log_level)

    import asyncio  # noqa: PLC0415

    from gpuagent.daemon import Agent  # noqa: PLC0415

    agent = Agent(config, simulate=args.simulate)
    try:
        asyncio.run(agent.run())
    except OSError as exc:
        _fail(str(exc))
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    config = _load_config(args.config)
    _check_scenario(args.simulate)
    _setup_logging("ERROR")

    import asyncio  # noqa: PLC0415

    from gpuagent.daemon import Agent  # noqa: PLC0415
    from gpuagent.render import render_status  # noqa: PLC0415
    from gpuagent.statusview import status_document  # noqa: PLC0415

    snapshot = asyncio.run(Agent(config, simulate=args.simulate).collect_once())
    doc = status_document(snapshot)
    print(json.dumps(doc, indent=2) if args.json else render_status(doc))
    return int(snapshot.health.severity.value)


def cmd_status(args: argparse.Namespace) -> int:
    from gpuagent.client import ClientError, call  # noqa: PLC0415
    from gpuagent.render import render_status  # noqa: PLC0415

    try:
        doc = call(_socket_path(args), "status")
    except ClientError as exc:
        _fail(str(exc), EXIT_UNKNOWN)
    print(json.dumps(doc, indent=2) if args.json else render_status(doc))
    return 0


def _parse_assignment(item: str) -> tuple[str, Any]:
    key, sep, raw = item.partition("=")
    if not sep or not key:
        _fail(f"expected key=value, got {item!r}", EXIT_CONFIG_ERROR)
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw  # a bare word: treat as a string
    return key, value


def cmd_inject(args: argparse.Namespace) -> int:
    from gpuagent.client import ClientError, call  # noqa: PLC0415

    values = dict(_parse_assignment(item) for item in args.values)
    try:
        result = call(
            _socket_path(args), "inject", {"kind": args.kind, "gpu": args.gpu, "values": values}
        )
    except ClientError as exc:
        _fail(str(exc))
    print(f"injected {args.kind} into GPU {args.gpu} (snapshot {result['sequence']})")
    return 0


def cmd_config_check(args: argparse.Namespace) -> int:
    config = _load_config(Path(args.file))
    print(
        f"{args.file}: valid (node {config.agent.resolved_node_name}, "
        f"cluster {config.agent.cluster})"
    )
    return 0


# --- parser ---------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpuagent", description="GPU node health agent")
    parser.add_argument("--version", action="version", version=f"gpuagent {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, help_text: str) -> argparse.ArgumentParser:
        return commands.add_parser(name, help=help_text, description=help_text)

    def config_option(sub: argparse.ArgumentParser) -> None:
        sub.add_argument(
            "--config", type=Path, help=f"configuration file (default {DEFAULT_CONFIG})"
        )

    def socket_options(sub: argparse.ArgumentParser) -> None:
        group = sub.add_mutually_exclusive_group()
        group.add_argument("--config", type=Path, help="read api.socket from this file")
        group.add_argument("--socket", type=Path, help="the daemon's API socket")

    run = add("run", "run the daemon")
    config_option(run)
    run.add_argument("--simulate", type=Path, metavar="SCENARIO", help="simulate the GPUs")
    run.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    run.set_defaults(func=cmd_run)

    status = add("status", "show per-GPU health from the running daemon")
    socket_options(status)
    status.add_argument("--json", action="store_true", help="print the status document")
    status.set_defaults(func=cmd_status)

    check = add(
        "check", "run every check once without a daemon; exit 0/1/2/3 = OK/WARN/CRITICAL/UNKNOWN"
    )
    config_option(check)
    check.add_argument("--simulate", type=Path, metavar="SCENARIO", help="simulate the GPUs")
    check.add_argument("--json", action="store_true", help="print the status document")
    check.set_defaults(func=cmd_check)

    inject = add("inject", "inject a fault into a simulated daemon (a fault drill)")
    socket_options(inject)
    inject.add_argument("kind", help="fault kind, e.g. ecc_dbe, temperature, gpu_lost, clear")
    inject.add_argument("--gpu", type=int, required=True, help="GPU index")
    inject.add_argument("values", nargs="*", metavar="KEY=VALUE", help="fault values, e.g. count=2")
    inject.set_defaults(func=cmd_inject)

    config = add("config", "configuration tools")
    config_commands = config.add_subparsers(dest="config_command", required=True, metavar="ACTION")
    config_check = config_commands.add_parser("check", help="validate a configuration file")
    config_check.add_argument("file")
    config_check.set_defaults(func=cmd_config_check)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    # `inject KIND --gpu I key=value ...`: values may follow the options.
    if extra and args.command == "inject" and all("=" in item for item in extra):
        args.values += extra
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        result: int = args.func(args)
    except BrokenPipeError:
        # `gpuagent status | head`: the reader went away, which is not an error of ours.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return result


if __name__ == "__main__":
    sys.exit(main())
