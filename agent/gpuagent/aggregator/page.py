"""The fleet page: one self-contained HTML document (no external assets, so it works on
an isolated management network) that fetches the API every second and redraws, so a fault
shows within two seconds of its report. Its HTML, CSS and script are package data in
``static/`` (fleet.html, fleet.css, fleet.js), joined here with the page's settings and
what each finding action means (actions.json).

Views switched by the URL fragment so any can be bookmarked or pasted into a ticket: the
fleet table (``#fleet?cluster=...&sort=...``), filtered and sorted by the aggregator
(`/api/v1/fleet`) so a refresh carries only the rows shown, with the cordon budget per
cluster (`/api/v1/budget`); a node's page (``#node/<cluster>/<name>``, with the fleet
incidents it is a member of and its open rule findings); a GPU's page
(``#gpu/<cluster>/<name>/<index>``: what is checked before a reset); the fleet incidents
(``#incidents``, one's members at ``#incidents/<id>``, `/api/v1/incidents`); and the open
fleet rule findings (``#rules``, `/api/v1/rules`).
Node-supplied text is only ever set with textContent, and links only ever get http(s)
URLs, so a node name or finding reason cannot inject markup.
"""

from __future__ import annotations

import functools
import json
from importlib import resources
from typing import Final

from gpuagent.links import Links

# Rows shown in the node table; the API has them all.
MAX_ROWS: Final = 500
REFRESH_MS: Final = 1000
# History rows fetched for a node's page.
NODE_HISTORY: Final = 50
# Fleet incidents listed (the latest of the last day; the API has them all).
INCIDENT_ROWS: Final = 100
# Open fleet rule findings listed (the latest; the API has them all).
RULE_ROWS: Final = 200
NO_LINKS: Final = Links()


def runbook_url(base: str, runbook: str) -> str:
    """The absolute link to a runbook id: its heading's anchor in checks.md."""
    return f"{base}checks.md#{runbook}" if base and runbook else ""


def _script_json(value: object) -> str:
    """JSON safe inside <script>: no "</script>" or "<!--" can close or confuse it."""
    return json.dumps(value).replace("<", "\\u003c").replace(">", "\\u003e")


@functools.cache
def render(links: Links = NO_LINKS) -> str:
    config = {
        "maxRows": MAX_ROWS,
        "refreshMs": REFRESH_MS,
        "history": NODE_HISTORY,
        "incidents": INCIDENT_ROWS,
        "rules": RULE_ROWS,
        "grafana": links.grafana_url_template,
        "runbookBase": links.runbook_base_url,
        "actions": action_meanings(),
    }
    # One document with its style and script inline: it needs no other request, so it
    # works on an isolated management network. The parts are files of their own.
    script = _static("fleet.js").replace("/*CONFIG*/{}", _script_json(config), 1)
    return (
        _static("fleet.html")
        .replace("/*STYLE*/\n", _static("fleet.css"), 1)
        .replace("/*SCRIPT*/\n", script, 1)
    )


def action_meanings() -> dict[str, str]:
    """What each finding action asks of an operator (static/actions.json, the words of the
    Actions table in docs/checks.md, `code` in backticks): a GPU's page says what clears
    each of its findings."""
    meanings: dict[str, str] = json.loads(_static("actions.json"))
    return meanings


def _static(name: str) -> str:
    return resources.files("gpuagent.aggregator").joinpath("static", name).read_text("utf-8")
