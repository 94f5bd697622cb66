"""`gpuagent-aggregator`: run the fleet aggregator, check its configuration, or keep the
fleet's MQTT certificates (`pki`)."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path
from typing import NoReturn

from gpuagent import __version__
from gpuagent.aggregator import opscli
from gpuagent.aggregator.database import describe
from gpuagent.config import AggregatorSection, ConfigError, load_config

DEFAULT_CONFIG = Path("/etc/gpuagent/aggregator.toml")
DEFAULT_PKI = Path("/etc/gpuagent/pki")
EXIT_CONFIG_ERROR = 2


def _fail(message: str, code: int = 1) -> NoReturn:
    print(f"gpuagent-aggregator: {message}", file=sys.stderr)  # noqa: T201 - a CLI
    sys.exit(code)


def _load(path: Path) -> AggregatorSection:
    # The same loader and file format as the agent's; only [aggregator] is read.
    try:
        return load_config(path).aggregator
    except ConfigError as exc:
        _fail(f"invalid configuration {path}: {exc}", EXIT_CONFIG_ERROR)


async def _serve(config: AggregatorSection) -> None:
    from gpuagent.aggregator.service import run  # noqa: PLC0415 - aiohttp only when running

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await run(config, stop)


def cmd_run(args: argparse.Namespace) -> int:
    config = _load(args.config)
    from gpuagent import logs  # noqa: PLC0415

    logs.setup(args.log_level, args.log_format)
    # The store writes on a thread; hand the GIL back to the event loop quickly, so
    # message handling does not queue behind a batch of inserts (default: 5 ms).
    sys.setswitchinterval(0.0005)
    from gpuagent.aggregator.store import StoreOpenError  # noqa: PLC0415
    from gpuagent.aggregator.supervise import TaskFailedError  # noqa: PLC0415

    try:
        asyncio.run(_serve(config))
    except TaskFailedError as exc:  # a background task kept failing: let systemd restart us
        _fail(f"stopping: {exc}")
    except ConfigError as exc:  # a file the configuration names cannot be read
        _fail(str(exc), 2)
    except StoreOpenError as exc:  # the database is unreachable, or its schema too new
        _fail(str(exc))
    except OSError as exc:  # e.g. the listen address is taken, the database unwritable
        _fail(str(exc))
    return 0


def cmd_pki(args: argparse.Namespace) -> int:
    from gpuagent.fleet.pki import Pki, PkiError  # noqa: PLC0415 - only for this command

    pki = Pki(args.dir)
    try:
        if args.pki_command == "init":
            pki.init(args.broker_name or ["localhost"], args.days)
            print(f"{args.dir}: CA, broker certificate, aggregator certificate, empty CRL")  # noqa: T201
        elif args.pki_command == "issue":
            crt, key = pki.issue(args.name, args.days)
            print(f"{crt} {key}")  # noqa: T201 - a CLI
        else:
            serial = pki.revoke(args.name)
            print(f"{args.name}: serial {serial:x} revoked in {pki.crl_file}")  # noqa: T201
    except (PkiError, OSError) as exc:
        _fail(str(exc))
    return 0


def cmd_config_check(args: argparse.Namespace) -> int:
    config = _load(args.file)
    broker = config.broker
    print(  # noqa: T201 - a CLI
        f"{args.file}: valid (listen {config.listen}, broker {broker.host}:{broker.port}, "
        f"database {describe(config.database)})"
    )
    return 0


def cmd_operator(args: argparse.Namespace) -> int:
    return opscli.run(_load(args.config), args)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpuagent-aggregator", description="gpuagent fleet aggregator"
    )
    parser.add_argument("--version", action="version", version=f"gpuagent {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = commands.add_parser("run", help="run the aggregator", description="run the aggregator")
    run.add_argument(
        "--config",
        type=Path,
        default=DEFAULT_CONFIG,
        help=f"configuration (default {DEFAULT_CONFIG})",
    )
    run.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    run.add_argument("--log-format", default="text", choices=["text", "json"])
    run.set_defaults(func=cmd_run)
    config = commands.add_parser("config", help="configuration tools")
    config_commands = config.add_subparsers(dest="config_command", required=True, metavar="ACTION")
    check = config_commands.add_parser("check", help="validate a configuration file")
    check.add_argument("file", type=Path)
    check.set_defaults(func=cmd_config_check)
    _add_pki_commands(commands)
    for operator in opscli.add_parsers(commands):
        operator.add_argument(
            "--config",
            type=Path,
            default=DEFAULT_CONFIG,
            help=f"the aggregator's configuration (default {DEFAULT_CONFIG})",
        )
        operator.set_defaults(func=cmd_operator)
    return parser


def _add_pki_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    pki = commands.add_parser(
        "pki",
        help="the fleet's MQTT certificates: a CA, the broker's, one per node",
        description="Certificates for a small fleet (docs/fleet.md, Certificates): the CN of "
        "a client certificate is the name the broker's ACL lets it publish as.",
    )
    pki_commands = pki.add_subparsers(dest="pki_command", required=True, metavar="ACTION")
    init = pki_commands.add_parser("init", help="a new CA, broker and aggregator certificates")
    init.add_argument(
        "--broker-name",
        action="append",
        metavar="NAME",
        help="a host name or address clients reach the broker by (repeat; default localhost)",
    )
    issue = pki_commands.add_parser("issue", help="a client certificate with CN = NAME")
    issue.add_argument("name", metavar="NAME", help="a node's name, or aggregator-<name>")
    revoke = pki_commands.add_parser("revoke", help="revoke NAME's certificate (crl.pem)")
    revoke.add_argument("name", metavar="NAME")
    for sub in (init, issue, revoke):
        sub.add_argument("--dir", type=Path, default=DEFAULT_PKI, help=f"default {DEFAULT_PKI}")
    for sub in (init, issue):
        sub.add_argument("--days", type=int, default=825, help="validity (default 825)")
    pki.set_defaults(func=cmd_pki)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
