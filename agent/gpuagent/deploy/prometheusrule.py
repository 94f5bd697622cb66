"""The Prometheus Operator's PrometheusRule for gpuagent, generated from the plain rules file.

deploy/prometheus/gpuagent-rules.yml is the one source of the alerts (promtool checks and
unit-tests it); deploy/kubernetes/components/prometheus-operator/prometheusrule.yaml
carries the same groups in a PrometheusRule. Regenerate it after changing the rules:

    scripts/render-prometheusrule     (.venv/bin/python -m gpuagent.deploy.prometheusrule, run
                                       in the checkout's root)

``--check`` exits 1 when the committed file differs from what the rules file gives.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

# Relative to the checkout's root, where scripts/render-prometheusrule runs it.
RULES = Path("deploy/prometheus/gpuagent-rules.yml")
OUTPUT = Path("deploy/kubernetes/components/prometheus-operator/prometheusrule.yaml")
HEADER = f"""\
# Generated from {RULES} by scripts/render-prometheusrule; do not edit.
# The Prometheus Operator loads it where its ruleSelector matches its labels: the
# component's kustomization adds release: kube-prometheus-stack (docs/kubernetes.md).
"""


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (PromQL expressions) as literal blocks, the way they are written."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


class RulesError(ValueError):
    """The rules file is not a Prometheus rules file with groups of rules."""


def render(rules_text: str, *, name: str = "gpuagent", namespace: str = "gpuagent") -> str:
    """The PrometheusRule (YAML text) holding the groups of ``rules_text``, unchanged."""
    data = yaml.safe_load(rules_text)
    groups = data.get("groups") if isinstance(data, dict) else None
    if not isinstance(groups, list) or not groups:
        raise RulesError("no groups: not a Prometheus rules file")
    for group in groups:
        if not isinstance(group, dict) or "name" not in group or "rules" not in group:
            raise RulesError(f"a group without name or rules: {group!r:.80}")
    resource: dict[str, Any] = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {
                "app.kubernetes.io/name": "gpuagent",
                "app.kubernetes.io/part-of": "gpuagent",
            },
        },
        "spec": {"groups": groups},
    }
    # Wide lines and block order as written: the annotations stay readable and diffable.
    body = yaml.dump(resource, Dumper=_Dumper, sort_keys=False, width=10_000, allow_unicode=True)
    return HEADER + body


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rules", type=Path, default=RULES)
    parser.add_argument("--output", type=Path, default=OUTPUT)
    parser.add_argument(
        "--check", action="store_true", help="only compare: exit 1 if the output is stale"
    )
    args = parser.parse_args(argv)
    text = render(args.rules.read_text(encoding="utf-8"))
    if args.check:
        current = args.output.read_text(encoding="utf-8") if args.output.exists() else ""
        if current != text:
            sys.stderr.write(f"{args.output} is stale: run scripts/render-prometheusrule\n")
            return 1
        return 0
    args.output.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
