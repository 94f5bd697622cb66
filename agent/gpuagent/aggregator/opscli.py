"""`gpuagent-aggregator rules ...` and `maintenance ...`: an operator's commands to a
running aggregator, through its HTTP API. Changes need the command token, read from the
file the configuration names (root, or whoever the file's mode lets read it)."""

from __future__ import annotations

import argparse
import getpass
import json
import sys
import urllib.error
import urllib.parse
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpuagent.config import AggregatorSection

TIMEOUT_SECONDS = 10.0


def _url(config: AggregatorSection, path: str) -> str:
    host, port = config.host_port
    host = "127.0.0.1" if host in {"", "0.0.0.0"} else host  # noqa: S104 - where to connect
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{port}{path}"


def _call(request: urllib.request.Request) -> dict[str, Any]:
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_SECONDS) as response:  # noqa: S310
            doc: dict[str, Any] = json.loads(response.read())
            return doc
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace").strip()
        raise SystemExit(f"gpuagent-aggregator: {exc.code}: {detail}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise SystemExit(f"gpuagent-aggregator: cannot reach the aggregator: {exc}") from None


def _when(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def cmd_list(config: AggregatorSection, args: argparse.Namespace) -> int:
    query = {"since": str(args.since)} if args.since is not None else {}
    if args.node:
        query["node"] = args.node
    path = "/api/v1/rules" + (f"?{urllib.parse.urlencode(query)}" if query else "")
    findings = _call(urllib.request.Request(_url(config, path)))["findings"]  # noqa: S310
    if args.json:
        print(json.dumps(findings, indent=2))  # noqa: T201 - a CLI
        return 0
    if not findings:
        print("no fleet rule findings" + ("" if query else " open"))  # noqa: T201
    for f in findings:
        print(f"{_when(f['time'])}  {f['state']:<7}  {f['rule']:<23}  {f['id']}")  # noqa: T201
        print(f"    {f['summary']}")  # noqa: T201
        print(f"    → {f['recommendation']}")  # noqa: T201
    return 0


def _token(config: AggregatorSection) -> str:
    try:
        lines = Path(config.command_token_file).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise SystemExit(f"gpuagent-aggregator: cannot read the command token: {exc}") from None
    return lines[0].strip() if lines else ""


def _post(config: AggregatorSection, path: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(  # noqa: S310 - our own aggregator's URL
        _url(config, path),
        data=json.dumps(body | {"by": getpass.getuser()}).encode(),
        method="POST",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {_token(config)}"},
    )
    return _call(request)


def cmd_clear(config: AggregatorSection, args: argparse.Namespace) -> int:
    path = f"/api/v1/rules/{urllib.parse.quote(args.id, safe='/')}/clear"
    doc = _post(config, path, {"reason": args.reason})
    print(f"cleared {doc['id']}: {doc['summary']}")  # noqa: T201
    mode = doc.get("done", {}).get("mode_set")
    if doc["rule"] == "remediation_not_working" and mode and mode != "observe":
        print(f"{doc['node']} was told to go back to {mode} mode")  # noqa: T201
    return 0


def _window_line(w: dict[str, Any]) -> str:
    where = f" in {w['cluster']}" if w["cluster"] else ""
    ended = f", ended early by {w['ended_by']}" if w.get("ended_by") else ""
    return (
        f"{w['id']}  {w['domain']}{where}  {_when(w['start'])} → {_when(w['end'])}  "
        f"by {w['by']}: {w['reason']}{ended}"
    )


def cmd_maintenance_start(config: AggregatorSection, args: argparse.Namespace) -> int:
    body = {"domain": args.domain, "for": args.duration, "cluster": args.cluster,
            "reason": args.reason}  # fmt: skip
    print(_window_line(_post(config, "/api/v1/maintenance", body)))  # noqa: T201
    return 0


def cmd_maintenance_end(config: AggregatorSection, args: argparse.Namespace) -> int:
    path = f"/api/v1/maintenance/{urllib.parse.quote(args.id)}/end"
    print(_window_line(_post(config, path, {})))  # noqa: T201
    return 0


def cmd_maintenance_list(config: AggregatorSection, args: argparse.Namespace) -> int:
    path = "/api/v1/maintenance" + (f"?since={args.since}" if args.since is not None else "")
    windows = _call(urllib.request.Request(_url(config, path)))["windows"]  # noqa: S310
    if not windows:
        print("no maintenance window running")  # noqa: T201
    for window in windows:
        print(_window_line(window))  # noqa: T201
    return 0


def add_parsers(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
) -> list[argparse.ArgumentParser]:
    """`rules` and `maintenance`; the caller adds --config to each."""
    rules = commands.add_parser(
        "rules",
        help="fleet rule findings: repeat offenders, remediation stopped, die defects",
        description="Findings of the fleet rules (docs/fleet.md#fleet-rules), from the "
        "aggregator running with --config.",
    )
    actions = rules.add_subparsers(dest="rules_command", required=True, metavar="ACTION")
    found = actions.add_parser("list", help="the open findings (or all since --since)")
    found.add_argument("--since", type=float, help="every finding changed since (Unix time)")
    found.add_argument("--node", help="only this node's")
    found.add_argument("--json", action="store_true", help="as the API returns them")
    found.set_defaults(ops_func=cmd_list)
    clear = actions.add_parser(
        "clear", help="a person says a finding is dealt with (automatic remediation resumes)"
    )
    clear.add_argument("id", help="the finding's id (rules list)")
    clear.add_argument("--reason", required=True, help="what was done (audited)")
    clear.set_defaults(ops_func=cmd_clear)
    maintenance = commands.add_parser(
        "maintenance",
        help="planned maintenance: mute a rack, an NVLink domain, a job or a node",
        description="A maintenance window (docs/fleet.md#planned-maintenance): the nodes "
        "it covers are shown, but open no fleet incident, feed no fleet rule, and their "
        "cordon requests are denied.",
    )
    steps = maintenance.add_subparsers(dest="maintenance_command", required=True,
                                       metavar="ACTION")  # fmt: skip
    start = steps.add_parser("start", help="a window from now")
    start.add_argument("--domain", required=True,
                       help="rack=r129 (any node label), node=NAME, nvlink=UUID/CLIQUE, "
                       "job=slurm:ID")  # fmt: skip
    start.add_argument("--for", dest="duration", required=True, help="90m, 2h, 1d (≤ 7 days)")
    start.add_argument("--cluster", default="", help="only this cluster's nodes")
    start.add_argument("--reason", required=True, help="why (audited)")
    start.set_defaults(ops_func=cmd_maintenance_start)
    end = steps.add_parser("end", help="end a running window now")
    end.add_argument("id", help="the window's id (maintenance list)")
    end.set_defaults(ops_func=cmd_maintenance_end)
    listing = steps.add_parser("list", help="the running windows (or all since --since)")
    listing.add_argument("--since", type=float, help="also those ended since (Unix time)")
    listing.set_defaults(ops_func=cmd_maintenance_list)
    return [rules, maintenance]


def run(config: AggregatorSection, args: argparse.Namespace) -> int:
    result: int = args.ops_func(config, args)
    sys.stdout.flush()
    return result
