"""Where fleet outputs link to: Grafana and the published documentation's runbooks. The
aggregator's page and the alert rules (``gpuagent.alertrules``) share these rules, so the
agent's package reaches no aggregator code for them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Links:
    """Where the page links to: Grafana ({node}, {cluster}, {gpu} replaced) and the
    published docs/ (runbooks are <base>checks.md#<runbook>); empty: no links."""

    grafana_url_template: str = ""
    runbook_base_url: str = ""

    def __post_init__(self) -> None:
        for name, url in (
            ("grafana_url_template", self.grafana_url_template),
            ("runbook_base_url", self.runbook_base_url),
        ):
            if url and not url.startswith(("https://", "http://")):
                raise ValueError(f"aggregator.{name} must be an http(s) URL, got {url!r}")
        if self.runbook_base_url and not self.runbook_base_url.endswith("/"):
            raise ValueError("aggregator.runbook_base_url must end with '/'")
