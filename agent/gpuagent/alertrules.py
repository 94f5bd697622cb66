"""The Prometheus alert rules with clickable runbook links.

deploy/prometheus/gpuagent-rules.yml names each alert's runbook relative to the
documentation ("docs/checks.md#gpu-lost"), which an alert notification cannot open. This
prints the rules with every relative ``runbook_url`` made absolute from where docs/ is
published (the base the aggregator's page uses, `aggregator.runbook_base_url`), so only one
rules file is maintained. Every other line is copied unchanged.

    python3 -m gpuagent.alertrules --runbook-base https://gpuagent.example/docs/ \\
        deploy/prometheus/gpuagent-rules.yml > /etc/prometheus/rules/gpuagent.yml
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from gpuagent.links import Links

# `runbook_url: "docs/..."`, quoted or not, as the rules file writes it.
_RUNBOOK = re.compile(r"""^(?P<head>\s*runbook_url:\s*)(?P<q>["']?)(?P<url>[^"'\s]+)(?P=q)\s*$""")
DOCS = "docs/"


def absolute(url: str, base: str) -> str:
    """``url`` made absolute: "docs/X" becomes base + "X"; an absolute URL is kept."""
    if re.match(r"^[a-z][a-z0-9+.-]*://", url, flags=re.IGNORECASE):
        return url
    if not url.startswith(DOCS):
        raise ValueError(f"runbook_url {url!r} is neither absolute nor under {DOCS}")
    return base + url.removeprefix(DOCS)


def render(text: str, base: str) -> str:
    """The rules ``text`` with each runbook_url absolute from ``base``."""
    Links(runbook_base_url=base)  # the same rules as the page's: http(s), ending in "/"
    if not base:
        raise ValueError("the runbook base URL is empty")
    out = []
    for line in text.splitlines(keepends=True):
        match = _RUNBOOK.match(line.rstrip("\n"))
        if match:
            # A JSON string is a valid YAML double-quoted scalar, whatever the base holds.
            url = json.dumps(absolute(match["url"], base))
            out.append(f"{match['head']}{url}\n")
        else:
            out.append(line)
    return "".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python3 -m gpuagent.alertrules",
        description="Print the alert rules with absolute runbook links.",
    )
    parser.add_argument(
        "--runbook-base",
        required=True,
        help="where docs/ is published, ending in '/' (e.g. https://gpuagent.example/docs/)",
    )
    parser.add_argument("rules", type=Path, help="the rules file (gpuagent-rules.yml)")
    args = parser.parse_args(argv)
    try:
        sys.stdout.write(render(args.rules.read_text(), args.runbook_base))
    except (OSError, ValueError) as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
