"""The fleet page: one self-contained HTML document (no external assets, so it works on
an isolated management network) that fetches the API every second and redraws, so a fault
shows within two seconds of its report. Each refresh asks only for the rows it shows and
the counts. Node-supplied text is only ever set with textContent, never parsed as HTML."""

from __future__ import annotations

from typing import Final

# Rows shown in the node table; the API has them all.
MAX_ROWS: Final = 500
REFRESH_MS: Final = 1000

PAGE: Final = (
    """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>gpuagent fleet</title>
<style>
body { font: 14px system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 1.5em; }
table { border-collapse: collapse; }
th, td { text-align: left; padding: 3px 10px; border-bottom: 1px solid #ddd; vertical-align: top; }
th { background: #f4f4f4; }
.CRITICAL { color: #b00020; font-weight: bold; } .WARN { color: #a15c00; font-weight: bold; }
.OK { color: #17702a; } .UNKNOWN, .offline, .stale { color: #666; font-style: italic; }
#summary span { margin-right: 1.5em; } #error { color: #b00020; }
</style>
</head>
<body>
<h1>gpuagent fleet</h1>
<p id="summary">Loading…</p>
<p id="error"></p>
<h2>Nodes</h2>
<table id="nodes">
<thead><tr><th>node</th><th>cluster</th><th>health</th><th>state</th><th>reasons</th>
<th>GPUs</th><th>last seen</th><th>agent</th></tr></thead>
<tbody></tbody>
</table>
<p id="more"></p>
<h2>Drift</h2>
<div id="drift"></div>
<script>
"use strict";
const MAX_ROWS = """
    + str(MAX_ROWS)
    + """;
const REFRESH_MS = """
    + str(REFRESH_MS)
    + """;

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}

function ago(t) {
  const s = Math.max(0, Math.round(Date.now() / 1000 - t));
  if (s < 120) return s + " s ago";
  if (s < 7200) return Math.round(s / 60) + " min ago";
  return new Date(t * 1000).toISOString().replace("T", " ").slice(0, 19) + " UTC";
}

function stateOf(n) {
  if (!n.online) return "offline" + (n.reason ? " (" + n.reason + ")" : "");
  return n.stale ? "stale" : "online";
}

function reasons(n) {
  const out = n.findings.map(f => f.reason);
  for (const g of n.gpus) {
    for (const f of g.findings) out.push("GPU " + g.index + " " + g.pci_bus_id + ": " + f.reason);
  }
  return out.join("; ");
}

function renderNodes(nodes, counts) {
  const body = document.querySelector("#nodes tbody");
  const rows = [];
  for (const n of nodes) {
    const tr = el("tr");
    tr.className = "node";
    tr.dataset.node = n.name;
    const state = stateOf(n);
    tr.append(el("td", n.name), el("td", n.cluster), el("td", n.health, n.health),
      el("td", state, state.split(" ")[0]), el("td", reasons(n)),
      el("td", n.gpus.length), el("td", ago(n.last_seen)), el("td", n.agent_version));
    rows.push(tr);
  }
  body.replaceChildren(...rows);
  const more = counts.nodes - nodes.length;
  document.getElementById("more").textContent =
    more > 0 ? more + " more nodes (all healthy or later in order): see /api/v1/nodes" : "";
  const summary = document.getElementById("summary");
  summary.replaceChildren(
    el("span", counts.nodes + " nodes"),
    el("span", counts.critical + " critical", "CRITICAL"),
    el("span", counts.warning + " warning", "WARN"),
    el("span", counts.offline + " offline", "offline"),
    el("span", counts.stale + " stale", "stale"));
}

function renderDrift(clusters) {
  const root = document.getElementById("drift");
  const parts = [];
  for (const c of clusters) {
    const section = el("div");
    section.className = "cluster";
    section.append(el("h3", "cluster " + c.cluster));
    const table = el("table");
    const head = el("tr");
    head.append(el("th", "fingerprint"), el("th", "nodes"), el("th", "fields"));
    table.append(head);
    for (const f of c.fingerprints) {
      const tr = el("tr");
      const fields = Object.entries(f.fields).map(([k, v]) => k + "=" + v).join(", ");
      tr.append(el("td", f.fingerprint_id + (f.majority ? " (majority)" : "")),
        el("td", f.nodes), el("td", fields));
      table.append(tr);
    }
    section.append(table);
    const drifted = c.drifted_nodes.map(d => d.node + " (" + d.fingerprint_id + ": " +
      Object.keys(d.differs).join(", ") + ")");
    section.append(el("p", drifted.length ? "Drifted: " + drifted.join("; ") :
      "No drift.", drifted.length ? "WARN drifted" : "OK"));
    if (c.unknown_nodes.length)
      section.append(el("p", "No fingerprint: " + c.unknown_nodes.join(", "), "UNKNOWN"));
    parts.push(section);
  }
  if (!parts.length) parts.push(el("p", "No nodes yet."));
  root.replaceChildren(...parts);
}

async function refresh() {
  try {
    const [nodes, drift] = await Promise.all(
      [fetch("api/v1/nodes?limit=" + MAX_ROWS), fetch("api/v1/drift")].map(p => p.then(r => {
        if (!r.ok) throw new Error(r.url + ": HTTP " + r.status);
        return r.json();
      })));
    renderNodes(nodes.nodes, nodes.counts);
    renderDrift(drift.clusters);
    document.getElementById("error").textContent = "";
    document.body.dataset.loaded = "1";
  } catch (e) {
    document.getElementById("error").textContent = "Refresh failed: " + e.message;
  }
}
refresh();
// A page in a background tab costs the aggregator nothing; it catches up when shown.
setInterval(() => { if (!document.hidden) refresh(); }, REFRESH_MS);
document.addEventListener("visibilitychange", () => { if (!document.hidden) refresh(); });
</script>
</body>
</html>
"""
)
