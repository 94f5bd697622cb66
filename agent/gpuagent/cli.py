"""`gpuagent` command line: a thin shell over the daemon, the API client and the checks.

Commands import what they need when they run, so `gpuagent status` does not pay for
pynvml, prometheus_client or the simulator.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from gpuagent import __version__

if TYPE_CHECKING:
    from collections.abc import Iterator

    from gpuagent.config import Config
    from gpuagent.gpuselect import KnownGpu
    from gpuagent.model import KernelLine
    from gpuagent.sim import Scenario

DEFAULT_CONFIG = Path("/etc/gpuagent/config.toml")
# A usage error or an invalid configuration: argparse's own status, and the one a unit's
# RestartPreventExitStatus=2 keys on, so that `run` with a bad configuration is not retried.
EXIT_CONFIG_ERROR = 2
# `check` and `status` exit as a Nagios plugin: 0 OK, 1 WARN, 2 CRITICAL, 3 UNKNOWN. Their
# 2 drains a node, so whatever kept them from judging (a usage error too) is 3, never 2.
EXIT_UNKNOWN = 3
JUDGING_COMMANDS = frozenset({"check", "status"})
EXIT_DIAG_UNAVAILABLE = 2  # `gpuagent diag`: 0 passed, 1 failed, 2 could not be run
DIAG_POLL_SECONDS = 2.0
WATCH_SECONDS = 2.0  # `gpuagent status --watch` without a number
# Cursor home and erase the screen: each `status --watch` frame replaces the last.
_CLEAR_SCREEN = "\x1b[H\x1b[2J"


class InputError(Exception):
    """What a command was given cannot be used: a bad option, an invalid or unreadable
    configuration, scenario or capture, a GPU that does not exist. main() picks the exit
    status from the command (`_input_error_status`), so no helper can get it wrong."""


def _input_error_status(command: str | None) -> int:
    return EXIT_UNKNOWN if command in JUDGING_COMMANDS else EXIT_CONFIG_ERROR


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
        raise InputError(f"invalid configuration{f' {path}' if path else ''}: {exc}") from None


def _socket_path(args: argparse.Namespace) -> Path:
    if args.socket is not None:
        return Path(args.socket)
    return _load_config(args.config).api.socket


def _resolve_gpus(status: dict[str, Any], selectors: list[str]) -> list[KnownGpu]:
    """The GPUs of ``status`` the --gpu arguments name; an InputError listing the GPUs there
    are when one names none of them."""
    from gpuagent.gpuselect import NoSuchGpuError, known_gpus, resolve_gpus  # noqa: PLC0415

    try:
        return resolve_gpus(selectors, known_gpus(status))
    except NoSuchGpuError as exc:
        raise InputError(str(exc)) from None


def _daemon_gpus(socket: Path, selectors: list[str], unreachable_code: int) -> list[KnownGpu]:
    """The daemon's GPUs the --gpu arguments name, resolved against its status document;
    ``unreachable_code`` is the exit status when the daemon cannot be asked."""
    from gpuagent.client import ClientError, call  # noqa: PLC0415

    try:
        status = call(socket, "status")
    except ClientError as exc:
        _fail(str(exc), unreachable_code)
    return _resolve_gpus(status, selectors)


def _check_scenario(path: Path | None) -> None:
    if path is None:
        return
    from gpuagent.config import ConfigError  # noqa: PLC0415
    from gpuagent.sim import load_scenario  # noqa: PLC0415

    try:
        load_scenario(path)
    except ConfigError as exc:
        raise InputError(f"invalid scenario {path}: {exc}") from None


def _setup_logging(level: str, log_format: str = "text") -> None:
    # Under systemd, journald stamps time and unit itself; see gpuagent.logs.
    from gpuagent import logs  # noqa: PLC0415

    logs.setup(level, log_format)


# --- commands -------------------------------------------------------------------------


def cmd_run(args: argparse.Namespace) -> int:
    config = _with_node_name(_load_config(args.config), args.node_name)
    _check_scenario(args.simulate)
    _setup_logging(args.log_level, args.log_format)

    import asyncio  # noqa: PLC0415

    from gpuagent import heap  # noqa: PLC0415
    from gpuagent.daemon import Agent  # noqa: PLC0415
    from gpuagent.remediation.backend import BackendConfigError  # noqa: PLC0415

    heap.cap_arenas()  # before the daemon's threads start
    agent = Agent(config, simulate=args.simulate)
    try:
        asyncio.run(agent.run())
    except BackendConfigError as exc:
        raise InputError(f"invalid configuration: {exc}") from None
    except OSError as exc:
        _fail(str(exc))
    return 0


def _with_node_name(config: Config, node_name: str | None) -> Config:
    """``config`` with agent.node_name set from --node-name. A DaemonSet passes the Node's
    name from the downward API this way (`--node-name=$(NODE_NAME)`), so one ConfigMap
    serves every node."""
    if node_name is None:
        return config
    import dataclasses  # noqa: PLC0415

    from gpuagent.config.rules import check_value  # noqa: PLC0415

    problem = check_value("agent.node_name", node_name)
    if problem is not None:
        _fail(f"invalid --node-name {node_name!r}: {problem}", EXIT_CONFIG_ERROR)
    agent = dataclasses.replace(config.agent, node_name=node_name)
    return dataclasses.replace(config, agent=agent)


def _replayed_host(path: Path) -> Scenario:
    """The scenario that serves the host a `nvidia-smi -q` capture describes."""
    from gpuagent.sim import replay_scenario  # noqa: PLC0415
    from gpuagent.smi import CaptureError, load_capture  # noqa: PLC0415

    try:
        return replay_scenario(load_capture(path), source=str(path))
    except CaptureError as exc:
        raise InputError(f"cannot replay {path}: {exc}") from None


def _replay_title(replay: dict[str, Any]) -> str:
    """The replay's title, the file and the capture's own Timestamp line: "nvidia-smi
    capture h100.txt, taken Mon Jan 15 10:00:00 2024"."""
    taken = replay["timestamp"]
    when = f", taken {taken}" if taken else " (no Timestamp line)"
    return f"nvidia-smi capture {replay['file']}{when}"


def _read_kernel_log(path: Path | None) -> bytes | None:
    if path is None:
        return None
    try:
        return path.read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror or exc}") from None


def cmd_check(args: argparse.Namespace) -> int:
    config = _load_config(args.config)
    if args.simulate is not None and args.from_nvidia_smi is not None:
        raise InputError("--simulate and --from-nvidia-smi cannot be combined")
    _check_scenario(args.simulate)
    simulate: Path | Scenario | None = args.simulate
    notes: tuple[str, ...] = ()
    replay: dict[str, Any] | None = None
    if args.from_nvidia_smi is not None:
        simulate = _replayed_host(args.from_nvidia_smi)
        if simulate.capture is not None:
            notes = simulate.capture.notes
            replay = {"file": args.from_nvidia_smi.name, "timestamp": simulate.capture.timestamp}
    kernel_log = _read_kernel_log(args.dmesg)
    _setup_logging("ERROR")

    import asyncio  # noqa: PLC0415

    from gpuagent.daemon import Agent  # noqa: PLC0415
    from gpuagent.render import color_enabled, render_status  # noqa: PLC0415
    from gpuagent.statusview import status_document  # noqa: PLC0415

    snapshot = asyncio.run(Agent(config, simulate=simulate).collect_once(kernel_log))
    doc = status_document(snapshot)
    title = None
    if replay is not None:
        # A replay is the capture's host at the capture's time, which the capture does not
        # name: not this machine (its name, its hostname), now.
        node = {**doc["node"], "name": None, "hostname": None}
        doc = {**doc, "node": node, "replay": replay}
        title = _replay_title(replay)
    color = color_enabled(args.color, sys.stdout)
    if args.json:
        # Values of the capture no reader understood, read as absent: one note per value.
        print(json.dumps({**doc, "replay_notes": list(notes)} if notes else doc, indent=2))
    else:
        print(render_status(doc, color=color, title=title))
        for note in notes:
            print(f"note: read as absent: {note}", file=sys.stderr)
    return int(snapshot.health.severity.value)


def _status_of(socket: Path, selectors: list[str]) -> dict[str, Any]:
    """The daemon's status document, with only the GPUs --gpu names when it names any.
    Raises ClientError when the daemon cannot be asked, InputError when --gpu names none."""
    from gpuagent.client import call  # noqa: PLC0415

    doc: dict[str, Any] = call(socket, "status")
    if not selectors:
        return doc
    chosen = {gpu.index for gpu in _resolve_gpus(doc, selectors)}
    return {**doc, "gpus": [g for g in doc["gpus"] if g["index"] in chosen]}


def cmd_status(args: argparse.Namespace) -> int:
    from gpuagent.client import ClientError  # noqa: PLC0415
    from gpuagent.render import color_enabled, render_status  # noqa: PLC0415

    if args.watch is not None and args.json:
        raise InputError("--watch and --json cannot be combined")
    socket = _socket_path(args)
    selectors = args.gpu or []
    color = color_enabled(args.color, sys.stdout)
    if args.watch is not None:
        return _watch_status(socket, selectors, args.watch, color)
    try:
        doc = _status_of(socket, selectors)
    except ClientError as exc:
        _fail(str(exc), EXIT_UNKNOWN)
    print(json.dumps(doc, indent=2) if args.json else render_status(doc, color=color))
    return 0 if args.exit_zero else _health_exit_code(doc, selectors)


def _health_exit_code(doc: dict[str, Any], selectors: list[str]) -> int:
    """As `check`: 0 OK, 1 WARN, 2 CRITICAL, 3 UNKNOWN; the node's health, or with --gpu
    the worst of the GPUs named."""
    from gpuagent.model import Severity  # noqa: PLC0415

    names = [g["health"] for g in doc["gpus"]] if selectors else [doc["node"]["health"]]
    return int(Severity.worst([Severity[name] for name in names]).value)


def _watch_status(socket: Path, selectors: list[str], seconds: float, color: bool) -> int:
    """Redraw the status every ``seconds`` until Ctrl-C, which ends it with status 0. On a
    terminal each frame replaces the last; piped, the frames follow one another."""
    import shutil  # noqa: PLC0415
    import time  # noqa: PLC0415

    from gpuagent.client import ClientError  # noqa: PLC0415
    from gpuagent.render import fit_to_width, render_status  # noqa: PLC0415

    terminal = sys.stdout.isatty()
    frames = 0
    try:
        while True:
            # The terminal's width now (it may have been resized); piped, no limit.
            width = shutil.get_terminal_size().columns if terminal else 0
            try:
                body = render_status(_status_of(socket, selectors), color=color, width=width)
            except ClientError as exc:
                if not frames:  # a wrong socket is told at once, not watched
                    _fail(str(exc), EXIT_UNKNOWN)
                body = f"gpuagent: {exc}"  # keep watching through a daemon restart
            header = f"Every {seconds:g} s: gpuagent status  {time.strftime('%Y-%m-%d %H:%M:%S')}"
            start = _CLEAR_SCREEN if terminal else ("\n" if frames else "")
            frame = f"{header}\n\n{body}"
            sys.stdout.write(f"{start}{fit_to_width(frame, width) if width else frame}\n")
            sys.stdout.flush()
            frames += 1
            time.sleep(seconds)
    except KeyboardInterrupt:
        return 0


def _parse_assignment(item: str) -> tuple[str, Any]:
    key, sep, raw = item.partition("=")
    if not sep or not key:
        raise InputError(f"expected key=value, got {item!r}")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw  # a bare word: treat as a string
    return key, value


def cmd_inject(args: argparse.Namespace) -> int:
    from gpuagent.client import ClientError, call  # noqa: PLC0415
    from gpuagent.drills import DRILL_KINDS  # noqa: PLC0415

    values: dict[str, Any] = {}
    for item in args.values:
        if "=" not in item and item.isdigit():
            values["code"] = int(item)  # `inject xid 79 --gpu 3`
        else:
            key, value = _parse_assignment(item)
            values[key] = value
    socket = _socket_path(args)
    if args.kind == "clear-drills":
        try:
            result = call(socket, "clear_drills", {"by": _operator()})
        except ClientError as exc:
            _fail(str(exc))
        print(result["detail"])
        return 0
    if args.gpu is None:
        raise InputError(f"inject {args.kind} needs --gpu")
    # Kernel-log faults are drills: a real line into the kernel log, on a node or simulated.
    method = "drill" if args.kind in DRILL_KINDS else "inject"
    # The API takes the index; any other form of --gpu is resolved to it here.
    (gpu,) = _daemon_gpus(socket, [args.gpu], unreachable_code=1)
    params = {"kind": args.kind, "gpu": gpu.index, "values": values, "yes": args.yes}
    try:
        result = call(socket, method, params)
    except ClientError as exc:
        _fail(str(exc))
    if method == "drill":
        print(f"wrote to {result['path']}: {result['line']}")
    else:
        print(f"injected {args.kind} into GPU {gpu.index} (snapshot {result['sequence']})")
    return 0


def _operator() -> str:
    """Who runs the command, for the audit trail: the sudo user behind root, if any."""
    import getpass  # noqa: PLC0415

    return os.environ.get("SUDO_USER") or getpass.getuser()


def cmd_ack(args: argparse.Namespace) -> int:
    from gpuagent.client import ClientError, call  # noqa: PLC0415

    if not args.reason.strip():
        raise InputError("--reason must say why the finding is acknowledged")
    socket = _socket_path(args)
    (gpu,) = _daemon_gpus(socket, [args.gpu], unreachable_code=1)
    params = {"gpu": gpu.index, "check": args.check, "reason": args.reason, "by": _operator()}
    try:
        result = call(socket, "ack", params)
    except ClientError as exc:
        _fail(str(exc))
    print(f"GPU {gpu.index}: {result['detail']}, until the fault comes again")
    return 0


def cmd_actions(args: argparse.Namespace) -> int:
    from gpuagent.client import ClientError, call  # noqa: PLC0415

    try:
        result = call(_socket_path(args), "actions", {"limit": args.limit})
    except ClientError as exc:
        _fail(str(exc))
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    import time  # noqa: PLC0415

    paused = " (paused)" if result["paused"] else ""
    print(f"remediation mode: {result['mode']}{paused}")
    for record in result["actions"]:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record["time"]))
        detail = f" [{record['detail']}]" if record["detail"] else ""
        count = record.get("count", 1)  # a repeat of the same decision is counted on its row
        if count > 1:
            last = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record["last_seen"]))
            detail += f" ({count} times, last {last})"
        print(
            f"{when}  {record['result']:<9} {record['action']:<18} {record['target']}: "
            f"{record['reason']}{detail}"
        )
    return 0


def cmd_diag(args: argparse.Namespace) -> int:
    """Start DCGM's diagnostic in the daemon and ask for its result until it is there: a
    long diagnostic outlasts any one request to the daemon."""
    import time  # noqa: PLC0415

    from gpuagent.client import ClientError, call  # noqa: PLC0415

    socket = _socket_path(args)
    gpus = (
        [gpu.index for gpu in _daemon_gpus(socket, args.gpu, EXIT_DIAG_UNAVAILABLE)]
        if args.gpu
        else []
    )
    try:
        job = call(socket, "diag", {"level": args.level, "gpus": gpus})
        while job["state"] == "running":
            time.sleep(DIAG_POLL_SECONDS)
            job = call(socket, "diag_result", {"id": job["id"]})
    except ClientError as exc:
        _fail(str(exc), EXIT_DIAG_UNAVAILABLE)
    if args.json:
        print(json.dumps(job, indent=2))
    if job["state"] != "done":
        if not args.json:
            print(f"gpuagent: diagnostic {job['state']}: {job.get('error', '')}", file=sys.stderr)
        return EXIT_DIAG_UNAVAILABLE
    result = job["result"]
    if not args.json:
        print(_render_diag(result))
    return 0 if result["passed"] else 1


def _render_diag(result: dict[str, Any]) -> str:
    """Per-test results per GPU: one row a test, one column a GPU."""
    tests = result["tests"]
    gpus = sorted({t["gpu"] for t in tests if t["gpu"] is not None})
    columns = [
        *(f"GPU {g}" for g in gpus),
        *(["node"] if any(t["gpu"] is None for t in tests) else []),
    ]
    keys: list[int | None] = [*gpus, *([None] if "node" in columns else [])]
    names = list(dict.fromkeys(t["name"] for t in tests))
    outcome = {(t["name"], t["gpu"]): t["outcome"] for t in tests}
    width = max([len("test"), *(len(n) for n in names)])
    lines = [
        f"DCGM diagnostic level {result['level']} via {result['via']}: "
        + ("PASSED" if result["passed"] else "FAILED"),
        "  ".join([f"{'test':<{width}}", *(f"{c:<7}" for c in columns)]).rstrip(),
    ]
    for name in names:
        cells = [f"{outcome.get((name, k), '-'):<7}" for k in keys]
        lines.append("  ".join([f"{name:<{width}}", *cells]).rstrip())
    if result["error"]:
        lines.append(f"error: {result['error']}")
    for test in tests:
        if test["info"] and test["outcome"] in ("fail", "warn", "skip"):
            where = "node" if test["gpu"] is None else f"GPU {test['gpu']}"
            lines.append(f"{test['outcome']}: {test['name']} on {where}: {test['info']}")
    return "\n".join(lines)


def cmd_remediation(args: argparse.Namespace) -> int:
    """pause/resume: the kill-switch file, written directly, so it works with the daemon
    down too; status: from the daemon, or from the file when the daemon is not running."""
    config = _load_config(args.config)
    switch = config.remediation.kill_switch
    if args.action == "pause":
        try:
            switch.parent.mkdir(parents=True, exist_ok=True)
            switch.write_text("paused by gpuagent remediation pause\n")
        except OSError as exc:
            _fail(f"cannot create {switch}: {exc.strerror or exc}")
        print(f"remediation paused ({switch} exists)")
        return 0
    if args.action == "resume":
        try:
            switch.unlink(missing_ok=True)
        except OSError as exc:
            _fail(f"cannot remove {switch}: {exc.strerror or exc}")
        print("remediation resumed")
        return 0
    from gpuagent.client import ClientError, call  # noqa: PLC0415

    try:
        status = call(config.api.socket, "status")["remediation"] or {}
    except ClientError:
        status = {}
    mode = status.get("mode", config.remediation.mode)
    paused = switch.exists()
    print(f"mode: {mode}\npaused: {'yes (' + str(switch) + ')' if paused else 'no'}")
    if status:
        print(f"node cordoned by gpuagent: {'yes' if status['cordoned_by_us'] else 'no'}")
        for budget in status["budgets"]:
            print(f"budget {budget['action']} per {budget['scope']}: {budget['remaining']} left")
        for step in status.get("plan", []):
            times = f" ({step['count']} times)" if step["count"] > 1 else ""
            detail = f" [{step['detail']}]" if step["detail"] else ""
            print(
                f"plan: {step['result']}{times} {step['action']} {step['target']}: "
                f"{step['reason']}{detail}"
            )
    return 0


def cmd_events(args: argparse.Namespace) -> int:
    from gpuagent.client import ClientError, call  # noqa: PLC0415

    socket = _socket_path(args)
    params: dict[str, Any] = {"limit": args.limit}
    if args.gpu:
        # Events name GPUs by their canonical bus id (0000:3b:00.0).
        from gpuagent.kernel.parse import canonical_pci  # noqa: PLC0415

        (gpu,) = _daemon_gpus(socket, [args.gpu], unreachable_code=1)
        params["gpu"] = canonical_pci(gpu.pci_bus_id) or gpu.pci_bus_id
    try:
        events = call(socket, "events", params)["events"]
    except ClientError as exc:
        _fail(str(exc))
    if args.json:
        print(json.dumps(events, indent=2))
        return 0
    import time  # noqa: PLC0415

    for event in events:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(event["time"]))
        code = f" {event['code']}" if event["code"] is not None else ""
        where = event["gpu"] or event["pci"] or "node"
        print(f"{when}  {event['source']:<5} {event['kind']}{code} {where}: {event['line']}")
    return 0


def cmd_mqtt_identity(args: argparse.Namespace) -> int:
    from gpuagent.k8s.identity import run_command  # noqa: PLC0415 - its libraries load here

    return run_command(args)


def cmd_config_check(args: argparse.Namespace) -> int:
    config = _load_config(Path(args.file))
    print(
        f"{args.file}: valid (node {config.agent.resolved_node_name}, "
        f"cluster {config.agent.cluster})"
    )
    return 0


# --- kernel log and XIDs ----------------------------------------------------------------

# `kmsg parse --json` prints these keys for every line. The catalog's keys are null except
# on XID lines; an XID the catalog does not list has "severity": "unknown" and the other
# catalog keys null ("action": "" is a listed XID for which NVIDIA names no action yet).
_CATALOG_KEYS = (
    "mnemonic",
    "description",
    "category",
    "severity",
    "action",
    "investigatory_action",
    "app_error",
)


def _kernel_line_document(line: KernelLine) -> dict[str, Any]:
    from gpuagent.kernel.parse import canonical_pci  # noqa: PLC0415
    from gpuagent.kernel.xid import lookup  # noqa: PLC0415

    doc: dict[str, Any] = {
        "kind": line.kind,
        "code": line.code,
        "pci": line.pci,
        "gpu": canonical_pci(line.pci) if line.pci else None,
        "pid": line.pid,
        "process": line.process,
        "aer_severity": line.aer_severity,
    }
    doc.update(dict.fromkeys(_CATALOG_KEYS))
    if line.kind == "xid" and line.code is not None:
        info = lookup(line.code)
        if info is None:
            doc["severity"] = "unknown"
        else:
            doc.update({key: getattr(info, key) for key in _CATALOG_KEYS})
    doc["text"] = line.text
    return doc


def _explain_kernel_line(line: KernelLine) -> str | None:
    """One readable line, or None for noise (not shown)."""
    from gpuagent.kernel.parse import canonical_pci  # noqa: PLC0415
    from gpuagent.kernel.xid import action_hint, lookup  # noqa: PLC0415

    if line.kind == "noise":
        return None
    device = (canonical_pci(line.pci) or line.pci) if line.pci else None
    where = f" on {device}" if device else ""
    if line.kind == "xid" and line.code is not None:
        info = lookup(line.code)
        if info is None:
            explanation = f"unknown XID {line.code} (not in the catalog): {line.text}"
        elif info.action:
            explanation = (
                f"{info.description} ({info.mnemonic}) -> {info.action}: {action_hint(info.action)}"
            )
        else:
            explanation = f"{info.description} ({info.mnemonic}); the catalog names no action"
        owner = [f"pid {line.pid}"] if line.pid is not None else []
        owner += [line.process] if line.process else []
        process = f" [{' '.join(owner)}]" if owner else ""
        return f"xid {line.code}{where}{process}: {explanation}"
    label = line.kind if line.code is None else f"{line.kind} {line.code}"
    if line.aer_severity is not None:
        label += f" ({line.aer_severity})"
    return f"{label}{where}: {line.text}"


def _kernel_log_lines(path: str) -> Iterator[bytes]:
    if path == "-":
        yield from sys.stdin.buffer
        return
    try:
        with Path(path).open("rb") as stream:
            yield from stream
    except OSError as exc:
        _fail(f"cannot read {path}: {exc.strerror or exc}")


def _parse_kernel_line(raw: bytes) -> KernelLine:
    """A /dev/kmsg record line (``6,123,456,-;message``) or any plain kernel-log line."""
    from gpuagent.kernel.parse import parse_kmsg_record, parse_message  # noqa: PLC0415

    raw = raw.rstrip(b"\r\n")
    if raw[:1].isdigit() and b";" in raw:
        record = parse_kmsg_record(raw)
        if record is not None:
            # The record's message, with the kernel's \xNN escapes undone.
            return parse_message(record.message)
    return parse_message(raw.decode("utf-8", errors="replace"))


def cmd_kmsg_parse(args: argparse.Namespace) -> int:
    # From stdin the input may be a live feed (`journalctl -kf | gpuagent kmsg parse`):
    # each answer goes out as soon as its line came in.
    live = args.file == "-"
    for number, raw in enumerate(_kernel_log_lines(args.file), 1):
        line = _parse_kernel_line(raw)
        if args.json:
            print(json.dumps(_kernel_line_document(line)), flush=live)
        elif (explained := _explain_kernel_line(line)) is not None:
            print(f"{number}: {explained}", flush=live)
    return 0


def cmd_xid_explain(args: argparse.Namespace) -> int:
    from gpuagent.kernel.xid import lookup  # noqa: PLC0415
    from gpuagent.xidview import document, explain_lines  # noqa: PLC0415

    info = lookup(args.xid)
    if info is None:
        _fail(f"unknown XID {args.xid}")
    if args.json:
        print(json.dumps(document(info), indent=2))
    else:
        print("\n".join(explain_lines(info)))
    return 0


def cmd_xid_list(args: argparse.Namespace) -> int:
    from gpuagent.kernel.xid import all_xids  # noqa: PLC0415
    from gpuagent.xidview import document, list_lines  # noqa: PLC0415

    if args.json:
        print(json.dumps([document(info) for info in all_xids()], indent=2))
    else:
        print("\n".join(list_lines()))
    return 0


# --- parser ---------------------------------------------------------------------------


Add = Callable[[str, str], argparse.ArgumentParser]


def _config_option(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--config", type=Path, help=f"configuration file (default {DEFAULT_CONFIG})")


# What every --gpu accepts (see gpuagent.gpuselect).
_GPU_FORMS = "an index (3), a PCI bus id (0000:ba:00.0, 00000000:BA:00.0, ba:00.0) or a UUID"


def _color_option(sub: argparse.ArgumentParser) -> None:
    sub.add_argument(
        "--color",
        choices=["auto", "always", "never"],
        default="auto",
        help="colour the severities: auto (default) on a terminal unless NO_COLOR is set",
    )


def _watch_seconds(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        seconds = 0.0
    if not 0 < seconds < float("inf"):
        raise argparse.ArgumentTypeError(f"not a positive number of seconds: {text!r}")
    return seconds


def _socket_options(sub: argparse.ArgumentParser) -> None:
    group = sub.add_mutually_exclusive_group()
    group.add_argument("--config", type=Path, help="read api.socket from this file")
    group.add_argument("--socket", type=Path, help="the daemon's API socket")


class _Parser(argparse.ArgumentParser):
    """argparse's parser, but a usage error exits with ``usage_status``: 3 for the commands
    that judge health, whose 2 is CRITICAL. Its subparsers are of this class too."""

    def __init__(self, *args: Any, usage_status: int = EXIT_CONFIG_ERROR, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.usage_status = usage_status

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(self.usage_status, f"{self.prog}: error: {message}\n")


def _parser() -> _Parser:
    parser = _Parser(prog="gpuagent", description="GPU node health agent")
    parser.add_argument("--version", action="version", version=f"gpuagent {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, help_text: str) -> argparse.ArgumentParser:
        return commands.add_parser(
            name, help=help_text, description=help_text, usage_status=_input_error_status(name)
        )

    _add_daemon_commands(add)
    _add_client_commands(add)
    _add_remediation_commands(add)
    _add_tool_commands(add)
    return parser


def _add_daemon_commands(add: Add) -> None:
    run = add("run", "run the daemon")
    _config_option(run)
    run.add_argument("--simulate", type=Path, metavar="SCENARIO", help="simulate the GPUs")
    run.add_argument(
        "--node-name",
        metavar="NAME",
        help="this node's name (overrides agent.node_name), e.g. a Kubernetes Node's name",
    )
    run.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    run.add_argument(
        "--log-format",
        default="text",
        choices=["text", "json"],
        help="text (with journald priority prefixes under systemd) or JSON lines",
    )
    run.set_defaults(func=cmd_run)

    check = add(
        "check", "run every check once without a daemon; exit 0/1/2/3 = OK/WARN/CRITICAL/UNKNOWN"
    )
    _config_option(check)
    check.add_argument("--simulate", type=Path, metavar="SCENARIO", help="simulate the GPUs")
    check.add_argument(
        "--from-nvidia-smi",
        type=Path,
        metavar="FILE",
        help="judge the host an `nvidia-smi -q` (or `-q -x`) capture describes",
    )
    check.add_argument(
        "--dmesg",
        type=Path,
        metavar="FILE",
        help="add a captured kernel log (dmesg or journalctl -k output) to the judgement",
    )
    check.add_argument("--json", action="store_true", help="print the status document")
    _color_option(check)
    check.set_defaults(func=cmd_check)


def _add_client_commands(add: Add) -> None:
    status = add("status", "show per-GPU health from the running daemon")
    _socket_options(status)
    status.add_argument("--json", action="store_true", help="print the status document")
    status.add_argument(
        "--gpu", nargs="+", action="extend", metavar="GPU", help=f"only these GPUs: {_GPU_FORMS}"
    )
    status.add_argument(
        "--watch",
        nargs="?",
        const=WATCH_SECONDS,
        type=_watch_seconds,
        metavar="SECONDS",
        help=f"redraw every SECONDS (default {WATCH_SECONDS:g}) until Ctrl-C",
    )
    status.add_argument(
        "--exit-zero",
        action="store_true",
        help="exit 0 whatever the health (by default 0 OK, 1 WARN, 2 CRITICAL, 3 UNKNOWN)",
    )
    _color_option(status)
    status.set_defaults(func=cmd_status)

    inject = add(
        "inject",
        "fault drill: xid N, sxid N, fallen_off_bus, aer write a real line into the kernel "
        "log (on a real node only with --yes); other kinds (ecc_dbe, temperature, gpu_lost, "
        "pci_remove, clear, ...) go into a simulated daemon's GPUs; clear-drills ends every "
        "drill",
    )
    _socket_options(inject)
    inject.add_argument(
        "kind", help="fault kind, e.g. xid, aer, ecc_dbe, temperature, clear, clear-drills"
    )
    inject.add_argument("--gpu", help=f"the GPU: {_GPU_FORMS}")
    inject.add_argument(
        "--yes",
        action="store_true",
        help="write a drill into a real node's kernel log, which its other readers see too",
    )
    inject.add_argument(
        "values", nargs="*", metavar="N|KEY=VALUE", help="XID/SXid number, or values: count=2"
    )
    inject.set_defaults(func=cmd_inject)

    ack = add(
        "ack",
        "acknowledge a GPU's findings (root, audited): held at OK until the fault comes again",
    )
    _socket_options(ack)
    ack.add_argument("--gpu", required=True, help=f"the GPU: {_GPU_FORMS}")
    ack.add_argument("--check", help="only this check's finding (e.g. xid, ecc)")
    ack.add_argument("--reason", required=True, help="why: what was done about it")
    ack.set_defaults(func=cmd_ack)

    events = add("events", "recent kernel-log, NVML and bus events from the running daemon")
    _socket_options(events)
    events.add_argument("--gpu", help=f"only this GPU: {_GPU_FORMS}")
    events.add_argument("--limit", type=int, default=50, help="at most this many (newest first)")
    events.add_argument("--json", action="store_true", help="print JSON")
    events.set_defaults(func=cmd_events)


def _add_remediation_commands(add: Add) -> None:
    actions = add("actions", "the remediation audit trail from the running daemon")
    _socket_options(actions)
    actions.add_argument("--limit", type=int, default=50, help="at most this many (newest first)")
    actions.add_argument("--json", action="store_true", help="print JSON")
    actions.set_defaults(func=cmd_actions)

    diag = add(
        "diag",
        "run DCGM's diagnostic through the daemon; exit 0 passed, 1 failed, 2 unavailable",
    )
    _socket_options(diag)
    diag.add_argument(
        "--level",
        type=int,
        default=1,
        choices=[1, 2, 3],
        help="1 quick (seconds), 2 medium (minutes), 3 long (tens of minutes)",
    )
    diag.add_argument(
        "--gpu", nargs="+", action="extend", metavar="GPU", help=f"only these GPUs: {_GPU_FORMS}"
    )
    diag.add_argument("--json", action="store_true", help="print JSON")
    diag.set_defaults(func=cmd_diag)

    remediation = add("remediation", "pause or resume remediation (the kill switch), or status")
    _config_option(remediation)
    remediation.add_argument("action", choices=["pause", "resume", "status"])
    remediation.set_defaults(func=cmd_remediation)


def _add_tool_commands(add: Add) -> None:
    config = add("config", "configuration tools")
    config_commands = config.add_subparsers(dest="config_command", required=True, metavar="ACTION")
    config_check = config_commands.add_parser("check", help="validate a configuration file")
    config_check.add_argument("file")
    config_check.set_defaults(func=cmd_config_check)

    kmsg = add("kmsg", "kernel-log tools")
    kmsg_commands = kmsg.add_subparsers(dest="kmsg_command", required=True, metavar="ACTION")
    kmsg_parse = kmsg_commands.add_parser(
        "parse",
        help="explain kernel-log lines: dmesg, journal, syslog or /dev/kmsg records",
        description="Explain each kernel-log line: XIDs, SXids, GPUs off the bus, PCIe AER, "
        "GSP and driver messages. Without --json, other lines are not shown.",
    )
    kmsg_parse.add_argument("file", nargs="?", default="-", help="a log file (default: stdin)")
    kmsg_parse.add_argument("--json", action="store_true", help="one JSON object per line")
    kmsg_parse.set_defaults(func=cmd_kmsg_parse)

    xid = add("xid", "NVIDIA's XID catalog and what gpuagent makes of each XID")
    xid_commands = xid.add_subparsers(dest="xid_command", required=True, metavar="ACTION")
    xid_explain = xid_commands.add_parser(
        "explain", help="gpuagent's verdict on one XID and what NVIDIA's catalog says"
    )
    xid_explain.add_argument("xid", type=int, metavar="N", help="the XID number")
    xid_explain.add_argument("--json", action="store_true", help="print a JSON object")
    xid_explain.set_defaults(func=cmd_xid_explain)
    xid_list = xid_commands.add_parser(
        "list", help="every XID: gpuagent's severity and action, NVIDIA's name"
    )
    xid_list.add_argument("--json", action="store_true", help="print a JSON array")
    xid_list.set_defaults(func=cmd_xid_list)

    identity = add("mqtt-identity", "get this node's MQTT client certificate from cert-manager")
    identity.add_argument("--node-name", required=True, help="the certificate's CN")
    identity.add_argument("--dir", type=Path, required=True, help="for tls.key, tls.crt, ca.crt")
    identity.add_argument("--issuer", required=True, help="the cert-manager issuer's name")
    identity.add_argument("--issuer-kind", default="Issuer", choices=["Issuer", "ClusterIssuer"])
    identity.add_argument("--namespace", required=True, help="where the request is made")
    identity.add_argument("--kubeconfig", default="", help="default: the in-cluster account")
    identity.add_argument("--duration-hours", type=int, default=8760, help="default: a year")
    identity.add_argument("--timeout", type=float, default=300.0, help="seconds to wait")
    identity.set_defaults(func=cmd_mqtt_identity)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    # Apart from main, so the parser (every command's options and help) is not kept alive
    # for as long as the command runs: the daemon runs for months.
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    # `inject KIND --gpu I key=value ...`: values may follow the options.
    if extra and args.command == "inject" and not any(i.startswith("-") for i in extra):
        args.values += extra
    elif extra:
        # argparse leaves a command's unknown arguments to the top parser: still the
        # command's usage error.
        parser.usage_status = _input_error_status(args.command)
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    try:
        result: int = args.func(args)
    except InputError as exc:
        print(f"gpuagent: {exc}", file=sys.stderr)
        return _input_error_status(args.command)
    except BrokenPipeError:
        # `gpuagent status | head`: the reader went away, which is not an error of ours.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception:
        if args.command not in JUDGING_COMMANDS:
            raise
        # A crash is no verdict: Python's exit status 1 would read as WARN.
        import traceback  # noqa: PLC0415

        traceback.print_exc()
        return EXIT_UNKNOWN
    return result


if __name__ == "__main__":
    sys.exit(main())
