"use strict";
const CONFIG = /*CONFIG*/{};

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}

// Only http(s) URLs become links: a javascript: URL from anywhere would run here.
function link(url, text) {
  if (!/^https?:\/\//.test(url)) return el("span", text);
  const a = el("a", text);
  a.href = url;
  a.rel = "noopener noreferrer";
  a.target = "_blank";
  return a;
}

function inner(href, text) {
  const a = el("a", text);
  a.href = href;
  return a;
}

function grafana(node, gpu) {
  if (!CONFIG.grafana) return null;
  const values = {node: node.name, cluster: node.cluster, gpu: gpu === undefined ? "All" : gpu};
  const url = CONFIG.grafana.replace(/\{(node|cluster|gpu)\}/g,
    (_, k) => encodeURIComponent(String(values[k])));
  return link(url, "Grafana");
}

function runbook(id) {
  if (!id) return el("span", "");
  if (!CONFIG.runbookBase) return el("span", id);
  return link(CONFIG.runbookBase + "checks.md#" + encodeURIComponent(id), id);
}

function duration(s) {
  s = Math.max(0, Math.round(s));
  if (s < 120) return s + " s";
  if (s < 7200) return Math.round(s / 60) + " min";
  if (s < 172800) return Math.round(s / 3600) + " h";
  return Math.round(s / 86400) + " d";
}

function ago(t) {
  if (t === null || t === undefined) return "";
  return duration(Date.now() / 1000 - t) + " ago";
}

function utc(t) {
  return new Date(t * 1000).toISOString().replace("T", " ").slice(0, 19) + " UTC";
}

function live(n) { return n.online && !n.stale; }

function stateOf(n) {
  if (!n.online) return "offline" + (n.reason ? " (" + n.reason + ")" : "");
  return n.stale ? "stale" : "online";
}

function allFindings(n) {
  const out = n.findings.map(f => ({where: "node", f: f}));
  for (const g of n.gpus)
    for (const f of g.findings) out.push({where: "GPU " + g.index + " " + g.pci_bus_id, f: f});
  return out;
}

// How an alert is coloured: firing ones by severity, silenced ones as old news.
function alertClass(a) {
  if (a.state !== "firing") return "old";
  return a.severity === "critical" ? "CRITICAL" : "WARN";
}

// A node's alerts in Alertmanager, in a few words: "2 firing, 1 silenced".
function alertsCell(alerts) {
  const firing = alerts.filter(a => a.state === "firing");
  const td = el("td");
  const parts = [];
  if (firing.length) parts.push(el("span", firing.length + " firing",
    firing.some(a => alertClass(a) === "CRITICAL") ? "CRITICAL" : "WARN"));
  if (alerts.length > firing.length)
    parts.push(el("span", alerts.length - firing.length + " silenced", "old"));
  parts.forEach((p, i) => td.append(...(i ? [", ", p] : [p])));
  td.title = alerts.map(a => a.name + (a.gpu ? " (GPU " + a.gpu + ")" : "") +
    (a.state === "firing" ? "" : ": silenced")).join("; ");
  return td;
}

// Where the alerts come from and how old they are; empty while they are current.
function alertsNote(am) {
  if (!am || !am.configured || !am.error) return "";
  return "Alerts " + (am.checked_at ? "as of " + ago(am.checked_at) : "unknown") +
    ": Alertmanager cannot be read (" + am.error + ").";
}

function withAlertmanager(doc) {
  return !!(doc.alertmanager && doc.alertmanager.configured);
}

function alertsTable(alerts) {
  return alerts.length ? table(["alert", "severity", "state", "GPU", "since", "summary"],
    alerts.map(a => [a.name, a.severity, el("span", a.state, alertClass(a)), a.gpu,
      typeof a.since === "number" ? ago(a.since) : "", a.summary]), "alerts")
    : el("p", "None firing or silenced.", "OK");
}

function nodeHref(n) {
  return "#node/" + encodeURIComponent(n.cluster) + "/" + encodeURIComponent(n.name);
}

// --- the fleet table -------------------------------------------------------------------

function fleetParams() {
  const hash = location.hash.startsWith("#fleet?") ? location.hash.slice(7) : "";
  return new URLSearchParams(hash);
}

function setFleetParams(params) {
  for (const [k, v] of [...params]) if (!v) params.delete(k);
  const text = params.toString();
  history.replaceState(null, "", text ? "#fleet?" + text : "#fleet");
  refresh();
}

function syncFilters(params, choices) {
  const form = document.getElementById("filters");
  for (const [name, values] of [["cluster", choices.clusters], ["model", choices.models],
                                 ["driver", choices.drivers]]) {
    const select = form.elements[name];
    const wanted = ["", ...values];
    const have = [...select.options].map(o => o.value);
    if (wanted.join("\n") !== have.join("\n")) {
      select.replaceChildren(...wanted.map(v => {
        const o = el("option", v || "all");
        o.value = v;
        return o;
      }));
    }
  }
  for (const name of ["cluster", "health", "model", "driver", "q"]) {
    const field = form.elements[name];
    if (document.activeElement !== field) field.value = params.get(name) || "";
  }
}

function renderFleet(doc, params) {
  syncFilters(params, doc.choices);
  const sort = params.get("sort") || "health";
  for (const b of document.querySelectorAll("#nodes th button")) {
    const mark = b.dataset.sort === sort ? (params.get("order") === "desc" ? " ▼" : " ▲") : "";
    b.textContent = b.dataset.label + mark;
  }
  const now = Date.now() / 1000;
  const withAlerts = withAlertmanager(doc);
  document.getElementById("alerts-head").hidden = !withAlerts;
  document.getElementById("alerts-note").textContent = alertsNote(doc.alertmanager);
  const rows = [];
  for (const n of doc.nodes) {
    const tr = el("tr");
    tr.className = "node";
    tr.dataset.node = n.name;
    const state = stateOf(n);
    const name = el("td");
    name.append(inner(nodeHref(n), n.name));
    // Covered by a planned maintenance window: its records and cordons are muted.
    if (n.maintenance) {
      const tag = el("span", "maintenance", "maintenance");
      tag.title = "planned maintenance " + n.maintenance;
      name.append(" ", tag);
    }
    const found = allFindings(n);
    let reasons, age;
    if (live(n)) {
      reasons = el("td", found.map(x => (x.where === "node" ? "" : x.where + ": ") +
        x.f.reason).join("; "));
      const since = found.map(x => x.f.since).filter(t => typeof t === "number");
      age = el("td", since.length ? duration(now - Math.min(...since)) : "");
    } else {
      // What an offline or stale node last said may be over: it is on its own page.
      reasons = el("td", "no current report", "old");
      age = el("td", "");
    }
    const gpus = el("td", n.gpus.length);
    gpus.className = "wide";
    const driver = el("td", n.driver);
    driver.className = "wide";
    const agent = el("td", n.agent_version);
    agent.className = "wide";
    const stateCell = el("td", state, state.split(" ")[0]);
    // Cordoned by its agent: out of scheduling, whatever its health says now.
    const cordoned = el("td", undefined, "cordon-state");
    cordoned.append(n.cordoned ? el("span", "cordoned", "cordoned") : el("span", "no", "old"));
    tr.append(name, el("td", n.cluster), el("td", n.shown_health, n.shown_health), stateCell,
      ...(withAlerts ? [alertsCell(n.alerts)] : []), cordoned, reasons, age, gpus,
      el("td", ago(n.last_seen), live(n) ? "" : "stale"), driver, agent);
    rows.push(tr);
  }
  document.querySelector("#nodes tbody").replaceChildren(...rows);
  const filtered = [...params.keys()].some(k => k !== "sort" && k !== "order");
  document.getElementById("matched").replaceChildren(...(filtered ? [el("span",
    doc.matched + " of " + doc.counts.nodes + " nodes match")] : []), ...matchedGpus(doc.nodes));
  const more = doc.matched - doc.nodes.length;
  document.getElementById("more").textContent = more > 0 ?
    more + " more nodes: narrow the filters, or see /api/v1/fleet" : "";
  const kinds = doc.kinds.map(k => {
    const li = el("li");
    const only = new URLSearchParams({kind: k.kind});
    li.append(inner("#fleet?" + only, k.nodes + (k.nodes === 1 ? " node" : " nodes")),
      el("span", " with " + k.kind + " (" + k.today + " started today)"));
    return li;
  });
  const kind = params.get("kind");
  document.getElementById("kind").replaceChildren(...(kind ? [el("span",
    "Only nodes with " + kind + " "), inner("#fleet", "(show all)")] : []));
  if (!kinds.length) kinds.push(el("li", "No findings on online nodes.", "OK"));
  document.getElementById("kinds").replaceChildren(...kinds);
}

// A UUID, shortened for a sentence (the whole of it on hover).
function shortUuid(uuid) {
  return uuid.length > 12 ? uuid.slice(0, 12) + "…" : uuid;
}

// Which GPUs a search named: "GPU 3 (GPU-abcd1234…) on node-7, by UUID", each linked to
// its page; at most 20, then how many more.
function matchedGpus(nodes) {
  const found = [];
  for (const n of nodes)
    for (const g of n.matched_gpus || []) found.push([n, g]);
  if (!found.length) return [];
  const list = el("ul", undefined, "matched-gpus");
  for (const [n, g] of found.slice(0, 20)) {
    const li = el("li");
    const a = inner(gpuHash({cluster: n.cluster, name: n.name}, g.index),
      "GPU " + g.index + (g.uuid ? " (" + shortUuid(g.uuid) + ")" : ""));
    a.title = g.uuid + " " + g.pci_bus_id;
    li.append(a, " on " + n.name + ", by " + g.by.join(" and "));
    list.append(li);
  }
  if (found.length > 20) list.append(el("li", found.length - 20 + " more GPUs"));
  return [list];
}

function renderSummary(counts) {
  document.getElementById("summary").replaceChildren(
    el("span", counts.nodes + " nodes"),
    el("span", counts.critical + " critical", "CRITICAL"),
    el("span", counts.warning + " warning", "WARN"),
    el("span", counts.offline + " offline", "offline"),
    el("span", counts.stale + " stale", "stale"));
}

function renderDrift(clusters) {
  const parts = [];
  for (const c of clusters) {
    const section = el("div");
    section.className = "cluster";
    section.append(el("h3", "cluster " + c.cluster));
    const rows = c.fingerprints.map(f => [f.fingerprint_id + (f.majority ? " (majority)" : ""),
      f.nodes, Object.entries(f.fields).map(([k, v]) => k + "=" + v).join(", ")]);
    section.append(table(["fingerprint", "nodes", "fields"], rows));
    const drifted = c.drifted_nodes.map(d => d.node + " (" + d.fingerprint_id + ": " +
      Object.keys(d.differs).join(", ") + ")");
    section.append(el("p", drifted.length ? "Drifted: " + drifted.join("; ") :
      "No drift.", drifted.length ? "WARN drifted" : "OK"));
    if (c.unknown_nodes.length)
      section.append(el("p", "No fingerprint: " + c.unknown_nodes.join(", "), "UNKNOWN"));
    parts.push(section);
  }
  if (!parts.length) parts.push(el("p", "No nodes yet."));
  document.getElementById("drift").replaceChildren(...parts);
}

// A table from rows of cells: a cell is text, or a node to insert as it is.
function table(head, rows, id) {
  const t = el("table");
  if (id) t.id = id;
  const tr = el("tr");
  tr.append(...head.map(h => el("th", h)));
  t.append(tr);
  for (const row of rows) {
    const r = el("tr");
    for (const [i, cell] of row.entries()) {
      const td = el("td");
      td.dataset.label = head[i];
      if (cell instanceof Node) td.append(cell); else td.textContent = cell ?? "";
      r.append(td);
    }
    t.append(r);
  }
  const wrap = el("div", undefined, id ? "scroll stack" : "scroll");
  wrap.append(t);
  return wrap;
}

// --- a node's page ---------------------------------------------------------------------

function fields(obj, skip) {
  return Object.entries(obj || {}).filter(([k]) => !skip.includes(k))
    .map(([k, v]) => k + "=" + (typeof v === "object" ? JSON.stringify(v) : v)).join(", ");
}

// Pods, containers or HPC jobs on a GPU where the node reports them, else its processes.
function workload(g) {
  const items = Array.isArray(g.workloads) ? g.workloads : (g.workload ? [g.workload] : []);
  const out = items.filter(w => w && typeof w === "object").map(w => {
    const parts = [];
    if (w.pod) parts.push("pod " + (w.namespace ? w.namespace + "/" : "") + w.pod);
    if (w.container) parts.push("container " + w.container);
    if (w.hpc_job) parts.push("job " + w.hpc_job);
    if (w.device) parts.push("on " + w.device);
    return parts.join(" ") || fields(w, []);
  });
  if (!out.length && Array.isArray(g.processes))
    for (const p of g.processes) out.push(p.name + " (pid " + p.pid + ")");
  return out.join("; ");
}

const ENVELOPE = ["schema", "type", "id", "node", "cluster", "time"];

// An event in words: a kernel-log record (and a storm's count), a finding's change.
function describeEvent(e) {
  const d = e.data || {};
  if (e.category === "finding")
    return (d.gpu || "node") + " " + d.check + ": " + d.from + " → " + d.to +
      (d.reason ? ": " + d.reason : "");
  if (e.category === "kernel") {
    const what = d.kind + (d.code !== null && d.code !== undefined ? " " + d.code : "");
    const who = d.process ? " (" + d.process + (d.pid ? ", pid " + d.pid : "") + ")" : "";
    const storm = d.incident && d.incident.count > 1 ? " [" + d.incident.count +
      " records since " + utc(d.incident.first_time) + "]" : "";
    return what + " on " + (d.gpu || d.pci || "node") + who + storm + ": " + (d.line || "");
  }
  return fields(e.data || e, ENVELOPE);
}

// --- the last day, as inline SVG: a health strip and trend lines per GPU ---------------

const SVGNS = "http://www.w3.org/2000/svg";
const HEALTH_FILL = {OK: "#2e7d32", WARN: "#f9a825", CRITICAL: "#c62828", UNKNOWN: "#7b1fa2",
  OFFLINE: "#9e9e9e"};
const STRIP_W = 240, STRIP_H = 14, NOW_W = 3;

function svgEl(tag, attrs, text) {
  const e = document.createElementNS(SVGNS, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

function chart(from, to, title) {
  const s = svgEl("svg", {width: STRIP_W, height: STRIP_H, viewBox: "0 0 " + STRIP_W + " " +
    STRIP_H, role: "img"});
  s.append(svgEl("title", {}, title));
  return [s, t => Math.max(0, Math.min(STRIP_W, (t - from) / (to - from) * STRIP_W))];
}

// Health over [from, to]: ``changes`` are {time, health}, oldest first; before the first,
// ``initial`` from ``since`` on (null: not known, left blank). The health now is at least
// a few pixels wide, however recent its change: a minute is invisible in a day's strip.
function healthStrip(changes, initial, since, from, to) {
  const title = changes.map(c => utc(c.time) + " " + c.health).join("; ") || "no change";
  const [s, x] = chart(from, to, title);
  let state = initial, start = Math.max(from, since);
  for (const c of [...changes, {time: to, health: null}]) {
    const now = c.health === null ? NOW_W : 0;
    const left = Math.min(x(start), STRIP_W - now);
    if (state) s.append(svgEl("rect", {x: left, y: 0, height: STRIP_H,
      width: Math.max(now, x(c.time) - left), fill: HEALTH_FILL[state] || "#9e9e9e"}));
    state = c.health; start = Math.max(from, c.time);
  }
  return s;
}

// A trend line of {time, value} points, scaled to its own range (named in the title).
function trendLine(points, from, to, unit) {
  if (!points.length) return "";
  const values = points.map(p => p.value);
  const low = Math.min(...values), high = Math.max(...values);
  const span = high - low;
  const y = v => span ? STRIP_H - 1 - (v - low) / span * (STRIP_H - 2) : STRIP_H / 2;
  const [s, x] = chart(from, to, low + " to " + high + " " + unit + " over the last day");
  s.append(svgEl("polyline", {fill: "none", stroke: "#1565c0", "stroke-width": 1.5,
    points: points.map(p => x(p.time).toFixed(1) + "," + y(p.value).toFixed(1)).join(" ")}));
  // One sample is no line: a dot, so a node's first minutes show something.
  if (points.length === 1)
    s.append(svgEl("circle", {cx: Math.min(x(points[0].time), STRIP_W - 2), cy: y(values[0]),
      r: 2, fill: "#1565c0"}));
  return s;
}

function renderHistory(history, gpus) {
  const to = Date.now() / 1000, from = to - 86400;
  const transitions = history.transitions || [], samples = history.samples || [];
  const own = index => transitions.filter(t => t.gpu === index);
  // A sample's GPUs are columns: gpus.index[i] is the GPU of gpus.health[i], ...
  const value = (s, index, name) => {
    const i = ((s.gpus || {}).index || []).indexOf(index);
    return i < 0 ? undefined : ((s.gpus[name] || [])[i]);
  };
  // Nothing is known before the node's first row of the day: its first report, or about
  // the day's start for a node that reported before.
  const known = Math.min(to, ...transitions.map(t => t.time), ...samples.map(s => s.time));
  // The health before the first change (held since the first row), or, without a change,
  // from the first sample on: [health, since].
  const first = (changes, index) => {
    if (changes.length) return [changes[0].previous, known];
    const sample = samples.find(s => value(s, index, "health") !== undefined);
    return sample ? [value(sample, index, "health"), sample.time] : [null, from];
  };
  const series = (index, name) => samples
    .filter(s => typeof value(s, index, name) === "number")
    .map(s => ({time: s.time, value: value(s, index, name)}));
  const nodeChanges = own(null);
  const [nodeInitial, nodeSince] = nodeChanges.length ? [nodeChanges[0].previous, known] :
    samples.length ? [samples[0].health, samples[0].time] : [null, from];
  const rows = [["node", healthStrip(nodeChanges, nodeInitial, nodeSince, from, to), "", "",
    "", "", ""]];
  for (const gpu of gpus) {
    const changes = own(gpu.index);
    rows.push(["GPU " + gpu.index, healthStrip(changes, ...first(changes, gpu.index), from, to),
      trendLine(series(gpu.index, "temperature_c"), from, to, "°C"),
      trendLine(series(gpu.index, "power_w"), from, to, "W"),
      trendLine(series(gpu.index, "utilization_gpu_pct"), from, to, "%"),
      trendLine(series(gpu.index, "ecc_dbe_volatile"), from, to, "DBEs"),
      trendLine(series(gpu.index, "xid_events"), from, to, "XID events")]);
  }
  return table(["", "health", "temperature", "power", "utilisation", "DBEs", "XIDs"], rows,
    "history");
}

// A <dl> of [term, value] pairs, the empty values left out; a value may be an element.
function definitions(pairs) {
  const list = el("dl", undefined, "ident");
  for (const [k, v] of pairs) {
    if (v === undefined || v === null || v === "") continue;
    const dd = el("dd");
    if (v instanceof Node) dd.append(v); else dd.textContent = v;
    list.append(el("dt", k), dd);
  }
  return list;
}

function gpuHash(doc, index) {
  return "#gpu/" + encodeURIComponent(doc.cluster) + "/" + encodeURIComponent(doc.name) + "/" +
    index;
}

// A value the report may lack shows as "—" (not available), never as 0.
const NA = "—";

function na(v, unit) {
  if (v === null || v === undefined || v === "") return NA;
  if (typeof v === "number" && !Number.isFinite(v)) return NA;
  if (typeof v === "boolean") return v ? "yes" : "no";
  return unit ? v + " " + unit : String(v);
}

// A <dl> of [term, value, class] triples: unlike `definitions`, a missing value shows "—".
function facts(pairs, id) {
  const list = el("dl", undefined, "ident facts");
  if (id) list.id = id;
  for (const [k, v, cls] of pairs) {
    const dd = el("dd", undefined, cls);
    if (v instanceof Node) dd.append(v); else dd.textContent = v ?? NA;
    list.append(el("dt", k), dd);
  }
  return list;
}

// Text with `code` in backticks (the words of docs/checks.md's Actions table).
function withCode(text) {
  const span = el("span");
  String(text).split("`").forEach((part, i) => {
    if (part) span.append(i % 2 ? el("code", part) : part);
  });
  return span;
}

// What clears a finding: what its action asks of an operator; the runbook says more.
function remedy(f) {
  const meaning = (CONFIG.actions || {})[f.action];
  return meaning ? withCode(meaning) : el("span", na(f.action));
}

// A finding's evidence, one "name: value" a line (what the check saw when it judged).
function evidenceList(ev) {
  const entries = Object.entries(ev && typeof ev === "object" ? ev : {});
  if (!entries.length) return el("span", NA);
  const list = el("ul", undefined, "evidence");
  for (const [k, v] of entries)
    list.append(el("li", k + ": " + (v !== null && typeof v === "object" ? JSON.stringify(v) :
      na(v))));
  return list;
}

function ber(v) {
  if (typeof v !== "number" || !Number.isFinite(v)) return NA;
  return v === 0 ? "0" : v.toExponential(1);
}

// A number below what the GPU can do (a PCIe link trained down): flagged.
function belowMax(value, max, text) {
  const low = typeof value === "number" && typeof max === "number" && value < max;
  return el("span", text, low ? "WARN" : "");
}

function pcieTable(g) {
  const width = w => typeof w === "number" ? "x" + w : NA;
  return table(["PCIe", "current", "max"], [
    ["generation", belowMax(g.pcie_generation, g.pcie_max_generation, na(g.pcie_generation)),
      na(g.pcie_max_generation)],
    ["width", belowMax(g.pcie_width, g.pcie_max_width, width(g.pcie_width)),
      width(g.pcie_max_width)],
    ["replay counter", na(g.pcie_replay_count), ""]], "pcie");
}

function eccParts(g) {
  const count = v => el("span", na(v), typeof v === "number" && v > 0 ? "WARN" : "");
  const flag = v => el("span", na(v), v === true ? "CRITICAL" : "");
  const missing = v => v === undefined || v === null;
  const pair = (a, aName, b, bName) => missing(a) && missing(b) ? NA :
    na(a) + " " + aName + ", " + na(b) + " " + bName;
  return [table(["ECC errors", "volatile (since the last reset)", "aggregate (lifetime)"], [
    ["corrected (single-bit)", count(g.ecc_sbe_volatile), count(g.ecc_sbe_aggregate)],
    ["uncorrected (double-bit)", count(g.ecc_dbe_volatile), count(g.ecc_dbe_aggregate)]],
  "ecc"), facts([["ECC mode", missing(g.ecc_enabled) ? NA : g.ecc_enabled ? "on" : "off"],
  ["retired pages", pair(g.retired_pages_sbe, "single-bit", g.retired_pages_dbe, "double-bit")],
  ["retirement pending", flag(g.retired_pages_pending)],
  ["remapped rows", pair(g.remapped_rows_correctable, "correctable",
    g.remapped_rows_uncorrectable, "uncorrectable")],
  ["row remap pending", flag(g.row_remap_pending)],
  ["row remap failure", flag(g.row_remap_failure)]], "memory")];
}

// Each NVLink's state and bit-error rates; the error counters are NVML's, summed over the
// links.
function nvlinkParts(g) {
  if (!("nvlink" in g)) return [el("p", NA + " (not in the node's report)", "old")];
  const n = g.nvlink;
  if (!n || typeof n !== "object") return [el("p", "No NVLink on this GPU.")];
  const up = n.up || [], eff = n.effective_ber || [], sym = n.symbol_ber || [];
  const rows = [];
  for (let i = 0; i < Math.max(up.length, eff.length, sym.length); i++)
    rows.push([String(i), up[i] === true ? el("span", "up", "OK") : up[i] === false ?
      el("span", "down", "CRITICAL") : NA, ber(eff[i]), ber(sym[i])]);
  const count = v => el("span", na(v), typeof v === "number" && v > 0 ? "WARN" : "");
  return [facts([["CRC flit errors", count(n.crc_flit_errors)],
    ["CRC data errors", count(n.crc_data_errors)], ["replay errors", count(n.replay_errors)],
    ["recovery errors", count(n.recovery_errors)]], "nvlink-errors"),
  rows.length ? table(["link", "state", "effective BER", "symbol BER"], rows, "nvlink") :
    el("p", "No link states reported.")];
}

// Clock event reasons that slow a busy GPU down (an idle GPU's clocks drop by design, and
// applications clocks are someone's setting): marked. The thermal check judges their cost.
const SLOWDOWNS = new Set(["hw_slowdown", "sw_thermal", "hw_thermal", "power_brake"]);

function clockFacts(g) {
  const mhz = v => typeof v === "number" ? v + " MHz" : NA;
  const reasons = g.clock_event_reasons;
  return facts([
    ["SM clock", mhz(g.sm_clock_mhz) + (typeof g.sm_clock_max_mhz === "number" ?
      " (max " + mhz(g.sm_clock_max_mhz) + ")" : "")],
    ["memory clock", mhz(g.memory_clock_mhz)],
    ["performance state", typeof g.performance_state === "number" ?
      "P" + g.performance_state : NA],
    ["throttle reasons", Array.isArray(reasons) ? el("span", reasons.length ?
      reasons.join(", ") : "none", reasons.some(r => SLOWDOWNS.has(r)) ? "WARN" : "") : NA],
    ["temperature", na(g.temperature_c, "°C")],
    ["power", na(g.power_w, "W") + (typeof g.power_limit_w === "number" ?
      " (limit " + g.power_limit_w + " W)" : "")]], "clocks");
}

// Who the GPU works for: the pods or HPC jobs the node names, then its processes.
function jobParts(g) {
  const items = Array.isArray(g.workloads) ? g.workloads : null;
  const jobs = items === null ? NA : items.length ? workload({workloads: items}) :
    "none known";
  const parts = [facts([["job or pod", jobs]], "jobs")];
  if (!Array.isArray(g.processes)) parts.push(el("p", "Processes: " + NA, "old"));
  else if (!g.processes.length) parts.push(el("p", "No processes.", "OK"));
  else parts.push(table(["pid", "process", "user", "memory", "Slurm job", "running"],
    g.processes.map(p => [na(p.pid), na(p.name), na(p.user), typeof p.used_mib === "number" ?
      Math.round(p.used_mib) + " MiB" : NA, na(p.job), na(p.alive)]), "processes"));
  return parts;
}

function gpuFindings(findings, current) {
  return findings.length ? table(["severity", "check", "reason", "evidence", "action",
    "to clear it", "runbook", "started"], findings.map(f => [
    el("span", f.severity, current ? f.severity : "old"), f.check, f.reason,
    evidenceList(f.evidence), na(f.action), remedy(f), runbook(f.runbook),
    typeof f.since === "number" ? ago(f.since) + " (" + utc(f.since) + ")" : ""]), "findings")
    : el("p", "None.", "OK");
}

// One GPU, as checked before a reset: what it is, its findings with their evidence and
// what clears each, its memory (ECC, retired pages, remapped rows), PCIe link, NVLinks,
// clocks and throttling, who runs on it; then its fleet rule findings, alerts, incidents,
// last day, events, and the actions on it or for it (a cordon's record names the GPUs
// that asked for it, evidence "gpus", and says what the fleet's cordon budget decided).
function renderGpu(doc, index, events, actions, cordons, history, incidents, rules) {
  const root = document.getElementById("node-view");
  const status = doc.status || {};
  const gpu = (status.gpus || doc.gpus).find(g => g.index === index);
  const back = "#node/" + encodeURIComponent(doc.cluster) + "/" + encodeURIComponent(doc.name);
  if (!gpu) {
    root.replaceChildren(inner(back, "← " + doc.name), el("p", "No GPU " + index + " here."));
    return;
  }
  const current = live(doc);
  const parts = [inner(back, "← " + doc.name),
    el("h2", "GPU " + index + " of " + doc.name + " (" + doc.cluster + ")")];
  parts.push(definitions([["health", el("span", gpu.health, current ? gpu.health : "old")],
    ["model", gpu.model], ["UUID", gpu.uuid], ["serial", gpu.serial],
    ["bus id", gpu.pci_bus_id],
    ["status", gpu.status && gpu.status !== "ok" ? gpu.status + (gpu.error ? ": " +
      gpu.error : "") : ""],
    ["sampled", typeof gpu.sampled_at === "number" ? ago(gpu.sampled_at) : ""],
    ["Grafana", grafana(doc, index)]]));
  if (!current)
    parts.push(el("p", "The node is " + stateOf(doc) + ": what follows is from its last " +
      "report, " + ago(doc.last_seen) + ", and may no longer hold.", "banner"));
  parts.push(...maintenanceNote(doc));
  parts.push(el("h2", "Findings"));
  parts.push(gpuFindings(gpu.findings || [], current));
  parts.push(el("h2", "Memory"), ...eccParts(gpu));
  parts.push(el("h2", "PCIe"), pcieTable(gpu));
  parts.push(el("h2", "NVLink"), ...nvlinkParts(gpu));
  parts.push(el("h2", "Clocks and throttling"), clockFacts(gpu));
  parts.push(el("h2", "Processes and jobs"), ...jobParts(gpu));
  parts.push(el("h2", "Fleet rule findings"));
  parts.push(nodeRules(rules.filter(f => f.gpu && f.gpu === gpu.uuid)));
  if (withAlertmanager(doc)) {
    parts.push(el("h2", "Alerts"));
    parts.push(alertsTable(doc.alerts.filter(a => a.gpu === String(index))));
  }
  parts.push(el("h2", "Fleet incidents"));
  parts.push(memberIncidents(incidents, inc => {
    const m = inc.members.find(x => x.node === doc.name && x.gpu === gpu.pci_bus_id);
    return m && m.role;
  }));
  parts.push(el("h2", "The last day"));
  parts.push(renderHistory(history, [gpu]));
  const mine = (events || []).filter(e => {
    const d = e.data || {};
    return d.gpu === gpu.pci_bus_id || d.pci === gpu.pci_bus_id;
  });
  parts.push(el("h2", "Events"));
  parts.push(mine.length ? table(["time", "category", "what"], mine.map(e =>
    [utc(e.time), e.category || e.type, describeEvent(e)]), "events") : el("p", "None stored."));
  parts.push(el("h2", "Actions and cordon decisions"));
  const gpus = status.gpus || doc.gpus;
  parts.push(actionsTable(actionRows(actions, cordons, gpus)
    .filter(r => r.gpus.includes(gpu.pci_bus_id))));
  root.replaceChildren(...parts);
  ackFor(doc, gpu);
}

// --- acknowledging a GPU's findings (the allowlisted "ack" command) ---------------------

let ackTarget = null;

// The form names this GPU; its check choices follow the findings that are not OK, and are
// only rebuilt when they change, so a choice being made is not undone by a redraw.
function ackFor(doc, gpu) {
  const checks = (gpu.findings || []).filter(f => f.severity !== "OK").map(f => f.check);
  const key = [doc.cluster, doc.name, gpu.pci_bus_id, ...checks].join("\n");
  if (ackTarget && ackTarget.key === key) return;
  const same = ackTarget && ackTarget.gpu === gpu.pci_bus_id && ackTarget.node === doc.name;
  ackTarget = {key, cluster: doc.cluster, node: doc.name, gpu: gpu.pci_bus_id};
  const select = document.getElementById("ack-check");
  const chosen = select.value;
  select.replaceChildren(el("option", "every finding that is not OK"),
    ...[...new Set(checks)].map(c => el("option", c)));
  select.options[0].value = "";
  select.value = checks.includes(chosen) ? chosen : "";
  if (!same) document.getElementById("ack-result").textContent = "";
}

async function sendAck(event) {
  event.preventDefault();
  const result = document.getElementById("ack-result");
  if (!ackTarget) return;
  const check = document.getElementById("ack-check").value;
  const args = {gpu: ackTarget.gpu, reason: document.getElementById("ack-reason").value,
    by: "console"};
  if (check) args.check = check;
  const url = "api/v1/nodes/" + encodeURIComponent(ackTarget.node) + "/commands?cluster=" +
    encodeURIComponent(ackTarget.cluster);
  result.className = "";
  result.textContent = "sending…";
  try {
    const r = await fetch(url, {method: "POST", body: JSON.stringify({command: "ack", args}),
      headers: {"Content-Type": "application/json",
        "Authorization": "Bearer " + document.getElementById("ack-token").value}});
    const body = await r.json().catch(() => ({}));
    if (r.status === 202) {
      result.className = "OK";
      result.textContent = "Sent as command " + body.id + ": the node's reply shows under " +
        "replies on its page, and the findings turn OK with its next report.";
    } else {
      result.className = "CRITICAL";
      result.textContent = "Not sent (HTTP " + r.status + "): " + (body.error || r.statusText);
    }
  } catch (e) {
    result.className = "CRITICAL";
    result.textContent = "Not sent: " + e.message;
  }
}

document.getElementById("ack-form").addEventListener("submit", sendAck);

// --- a node's actions ------------------------------------------------------------------

// How an outcome is coloured: what failed or was refused stands out.
const OUTCOME_CLASS = {failed: "CRITICAL", escalated: "CRITICAL", refused: "WARN",
  skipped: "WARN", denied: "WARN", succeeded: "OK", verified: "OK", done: "OK",
  approved: "OK"};

function gpuLabel(gpus, bus) {
  const g = gpus.find(x => x.pci_bus_id === bus);
  return g ? "GPU " + g.index + " (" + bus + ")" : bus;
}

// One row per audit record and cordon decision: {time (the latest), first (a repeated
// record's first time, else null), gpus (bus ids), cells: action, GPU, outcome, reason}.
// An audit record's "count" and "last_seen" (repeats folded into it) are shown where the
// node sends them; why an action was refused is in its detail.
function actionRows(actions, cordons, gpus) {
  const rows = [];
  const gpuCell = ids => ids.length ? ids.map(t => gpuLabel(gpus, t)).join(", ") : "node";
  for (const a of actions) {
    const r = a.record;
    if (r) {
      const ev = r.evidence && typeof r.evidence === "object" ? r.evidence : {};
      // A cordon names the GPUs that asked for it; other actions target a GPU (a bus id,
      // kept even where the report no longer lists the GPU) or the node.
      const ids = (r.action === "cordon" || r.action === "uncordon" ?
        String(ev.gpus || "").split(", ") : [r.target]).filter(t => t && t !== a.node);
      const outcome = el("span");
      outcome.append(el("span", na(r.result), OUTCOME_CLASS[r.result] || ""));
      if (r.detail) outcome.append(" (" + r.detail + ")");
      const reason = el("span", r.reason || "");
      const evidence = fields(ev, []);
      if (evidence) reason.append(el("div", evidence, "muted"));
      // A decision repeated is one record: its count, and when it was last made.
      const repeated = typeof r.count === "number" && r.count > 1;
      const first = typeof r.time === "number" ? r.time : a.time;
      const last = typeof r.last_seen === "number" && r.last_seen > first ? r.last_seen : null;
      rows.push({time: last ?? first, first: last === null ? null : first, gpus: ids,
        cells: [(r.action || a.type) + (repeated ? " ×" + r.count : ""), gpuCell(ids), outcome,
          reason]});
    } else {
      rows.push({time: a.time, gpus: [], cells: [String(a.type).replace("_", " "), "node", "",
        fields(a, ENVELOPE)]});
    }
  }
  for (const c of cordons) {
    const retry = typeof c.retry_after_seconds === "number" ?
      " (ask again in " + duration(c.retry_after_seconds) + ")" : "";
    rows.push({time: c.time, gpus: [], cells: [c.action + " decision", "node",
      el("span", c.decision + retry, OUTCOME_CLASS[c.decision] || ""), c.reason || ""]});
  }
  return rows.sort((a, b) => b.time - a.time);
}

function actionsTable(rows) {
  return rows.length ? table(["time", "action", "GPU", "outcome", "reason"],
    rows.map(r => [r.first === null || r.first === undefined ? utc(r.time) :
      utc(r.time) + " (first " + utc(r.first) + ")", ...r.cells]), "actions")
    : el("p", "None stored.");
}

// GPU settings against the fleet: a setting the node's GPUs hold other than most GPUs of
// the same model and driver in its cluster (the aggregator's /api/v1/drift "settings").
const SETTING_NAMES = {persistence_mode: "persistence mode", ecc_enabled: "ECC mode",
  power_requested_limit_w: "power limit", applications_clock_mhz: "applications clock",
  mig_mode: "MIG mode"};

function settingValue(setting, v) {
  if (typeof v === "boolean") return v ? "on" : "off";
  if (setting === "power_requested_limit_w") return v + " W";
  if (setting === "applications_clock_mhz") return v + " MHz";
  return String(v);
}

function settingDrift(drifts) {
  if (!drifts.length) return el("p", "None: the GPUs' settings agree with the fleet's.", "OK");
  return table(["setting", "GPUs", "this node", "majority", "group"], drifts.map(d => [
    SETTING_NAMES[d.setting] || d.setting, d.gpus.join(", "),
    el("span", settingValue(d.setting, d.value), "WARN"), settingValue(d.setting, d.majority),
    d.group.model + ", driver " + d.group.driver + ": " + d.group.at_majority + " of " +
      d.group.gpus + " GPUs on " + d.group.nodes + " nodes"]), "setting-drift");
}

function renderNode(doc, events, actions, cordons, history, incidents, rules) {
  const root = document.getElementById("node-view");
  const now = Date.now() / 1000;
  const parts = [inner("#fleet", "← fleet"), el("h2", doc.name + " (" + doc.cluster + ")")];
  const status = doc.status || {};
  const nodeDoc = status.node || {};
  parts.push(definitions([["health", el("span", doc.shown_health, doc.shown_health)],
    ["state", stateOf(doc)], ["last seen", ago(doc.last_seen) + " (" + utc(doc.last_seen) + ")"],
    ["agent", doc.agent_version], ["driver", nodeDoc.driver_version || doc.driver],
    ["CUDA", nodeDoc.cuda_driver_version], ["hostname", nodeDoc.hostname],
    ["fingerprint", doc.fingerprint_id], ["Grafana", grafana(doc)]]));
  const current = live(doc);
  if (!current)
    parts.push(el("p", "Health unknown: the node is " + stateOf(doc) + ", last report " +
      ago(doc.last_seen) + ". The GPUs and findings below are from that report and may " +
      "no longer hold.", "banner"));
  parts.push(...maintenanceNote(doc));
  const findings = [...(doc.findings || []).map(f => ["node", f])];
  for (const gpu of status.gpus || doc.gpus)
    for (const f of gpu.findings || []) findings.push(["GPU " + gpu.index + " " + gpu.pci_bus_id,
      f]);
  parts.push(el("h2", "Findings"));
  parts.push(findings.length ? table(["where", "severity", "reason", "action", "runbook",
    "started"], findings.map(([where, f]) => [where, el("span", f.severity, current ?
      f.severity : "old"), f.reason, f.action, runbook(f.runbook),
      typeof f.since === "number" ? ago(f.since) + " (" + utc(f.since) + ")" : ""]), "findings")
    : el("p", "None.", "OK"));
  if (withAlertmanager(doc)) {
    parts.push(el("h2", "Alerts"));
    const note = alertsNote(doc.alertmanager);
    if (note) parts.push(el("p", note, "banner"));
    parts.push(alertsTable(doc.alerts));
  }
  parts.push(el("h2", "Fleet incidents"));
  parts.push(memberIncidents(incidents, inc => (inc.nodes || {})[doc.name]));
  parts.push(el("h2", "Fleet rule findings"));
  parts.push(nodeRules(rules));
  parts.push(el("h2", "Fleet drift"));
  parts.push(settingDrift(doc.setting_drift || []));
  parts.push(el("h2", "GPUs"));
  const gpus = status.gpus || doc.gpus;
  parts.push(table(["GPU", "health", "model", "UUID", "serial", "bus id", "workload", ""],
    gpus.map(x => [inner(gpuHash(doc, x.index), "GPU " + x.index),
      el("span", x.health, current ? x.health : "old"), x.model,
      x.uuid, x.serial, x.pci_bus_id, workload(x), grafana(doc, x.index) || ""]), "gpus"));
  parts.push(el("h2", "The last day"));
  parts.push(renderHistory(history, gpus));
  parts.push(el("h2", "Events"));
  parts.push(events.length ? table(["time", "category", "what"], events.map(e =>
    [utc(e.time), e.category || e.type, describeEvent(e)]), "events")
    : el("p", "None stored."));
  parts.push(el("h2", "Actions and cordon decisions"));
  parts.push(actionsTable(actionRows(actions, cordons, gpus)));
  parts.push(el("h2", "Command replies"));
  const replies = doc.replies || [];
  parts.push(replies.length ? table(["time", "command", "ok", "detail"], replies.map(r =>
    [utc(r.time), r.command_id, r.ok ? "ok" : "failed", r.detail]), "replies")
    : el("p", "None."));
  root.replaceChildren(...parts);
}

// --- fleet incidents ---------------------------------------------------------------------

// What many nodes saw of one fault, joined by the aggregator (/api/v1/incidents): its root
// (the GPU whose link or fault started it), the members that saw its consequences, and
// what the cordon arbiter decided for them.
const ROLE_RANK = {root: 0, unrelated: 1, consequence: 2};

function incidentHref(id) {
  return "#incidents/" + encodeURIComponent(id);
}

function plural(n, one) {
  return n + " " + one + (n === 1 ? "" : "s");
}

function gpuName(m) {
  return "GPU " + (m.index === null || m.index === undefined ? m.gpu : m.index);
}

// "node-a GPU 0: Xid 149, link 14", the node a link to its page.
function rootCell(inc) {
  const root = inc.root;
  if (!root) return el("span", "root unknown (domain-level)", "WARN");
  const span = el("span");
  span.append(inner(nodeHref({cluster: inc.cluster, name: root.node}), root.node),
    " " + gpuName(root) + ": Xid " + root.xid +
    (root.link === null || root.link === undefined ? "" : ", link " + root.link));
  return span;
}

// Nodes as links to their pages, each once (a node that asked again is decided again).
function nodeList(cluster, nodes) {
  const span = el("span");
  [...new Set(nodes || [])].forEach((n, i) => span.append(...(i ? [", "] : []),
    inner(nodeHref({cluster: cluster, name: n}), n)));
  return span;
}

function incidentAge(inc, now) {
  return inc.state === "open" ? duration(now - inc.first_time) : "closed " + ago(inc.closed_at);
}

function incidentRow(inc, selected, now) {
  const tr = el("tr");
  tr.className = "incident " + inc.state + (inc.id === selected ? " selected" : "");
  tr.dataset.incident = inc.id;
  tr.title = inc.summary || "";
  const cells = [el("span", inc.state, inc.state === "open" ? "open-state" : "old"),
    rootCell(inc), el("span", inc.domain), inc.cluster,
    plural(inc.counts.gpus, "GPU") + " on " + plural(inc.counts.nodes, "node"),
    incidentAge(inc, now), nodeList(inc.cluster, inc.approved),
    nodeList(inc.cluster, inc.denied)];
  for (const [i, cell] of cells.entries()) {
    const td = el("td");
    if (cell instanceof Node) td.append(cell); else td.textContent = cell;
    if (i === 3) td.className = "wide";
    tr.append(td);
  }
  // The row shows its members (again: hides them); links in it go where they point.
  tr.addEventListener("click", ev => {
    if (ev.target.closest("a")) return;
    location.hash = inc.id === selected ? "#incidents" : incidentHref(inc.id);
  });
  return tr;
}

function incidentDetail(inc, id) {
  if (!inc) return [el("p", "No fleet incident " + id + ".", "banner")];
  const parts = [el("h3", "Incident " + inc.id + " (" + inc.state + ")"),
    el("p", inc.summary, inc.root_unknown ? "WARN" : "")];
  parts.push(definitions([["root", rootCell(inc)], ["domain", inc.domain],
    ["NVLink domain", inc.nvlink_domain], ["cluster", inc.cluster],
    ["first record", ago(inc.first_time) + " (" + utc(inc.first_time) + ")"],
    ["last record", ago(inc.last_time) + " (" + utc(inc.last_time) + ")"],
    ["closed", inc.closed_at ? ago(inc.closed_at) + " (" + utc(inc.closed_at) + ")" : ""],
    ["records", inc.counts.records],
    ["cordons approved", (inc.approved || []).length ? nodeList(inc.cluster, inc.approved) : ""],
    ["cordons denied", (inc.denied || []).length ? nodeList(inc.cluster, inc.denied) : ""]]));
  const members = [...inc.members].sort((a, b) => ROLE_RANK[a.role] - ROLE_RANK[b.role] ||
    a.node.localeCompare(b.node) || (a.index ?? 0) - (b.index ?? 0));
  parts.push(table(["node", "GPU", "bus id", "UUID", "role", "Xid", "link", "records",
    "first", "last"], members.map(m => [inner(nodeHref({cluster: inc.cluster, name: m.node}),
    m.node), gpuName(m), m.gpu, m.uuid, el("span", m.role, "role-" + m.role), m.xid,
    m.link, m.count, ago(m.first_time), ago(m.last_time)]), "incident-members"));
  parts.push(inner("#incidents", "← all incidents"));
  return parts;
}

function renderIncidents(incidents, id, selected) {
  const now = Date.now() / 1000;
  // The latest first: the last started on top.
  const sorted = [...incidents].sort((a, b) => b.first_time - a.first_time ||
    (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
  const open = sorted.filter(i => i.state === "open").length;
  document.getElementById("incidents-count").textContent = sorted.length ?
    open + " open, " + (sorted.length - open) + " closed in the last day" +
    (sorted.length >= CONFIG.incidents ? " (the latest " + CONFIG.incidents + " shown)" : "") :
    "No fleet incidents in the last day.";
  document.querySelector("#incidents tbody").replaceChildren(
    ...sorted.map(i => incidentRow(i, id, now)));
  document.getElementById("incident-detail").replaceChildren(
    ...(id === null ? [] : incidentDetail(selected, id)));
}

// The incidents a node (or one of its GPUs) is a member of, with its part in each.
function memberIncidents(incidents, roleOf) {
  const rows = [];
  for (const inc of incidents) {
    const role = roleOf(inc);
    if (!role) continue;
    rows.push([inner(incidentHref(inc.id), inc.id), el("span", role, "role-" + role),
      el("span", inc.state, inc.state === "open" ? "open-state" : "old"), rootCell(inc),
      incidentAge(inc, Date.now() / 1000), inc.summary]);
  }
  return rows.length ? table(["incident", "role here", "state", "root", "age", "summary"],
    rows, "node-incidents") : el("p", "None in the last day.");
}

// --- the cordon budget, planned maintenance and the fleet rules -------------------------

// The fleet cordon budget per cluster (/api/v1/budget): how many nodes may still be
// cordoned, who holds the slots and when each frees; a spent cluster in red.
function renderBudget(doc) {
  const root = document.getElementById("budget");
  if (doc.source === "none") {
    root.replaceChildren(el("p", "This aggregator decides no cordon requests " +
      "(aggregator.cordon_budget.arbiter = false): the arbiter's console shows the budget.",
      "old"));
    return;
  }
  const now = Date.now() / 1000;
  const parts = [el("p", "At most " + plural(doc.max_nodes, "node") + " and " +
    doc.max_percent + " % of a cluster's nodes cordoned within " +
    duration(doc.window_seconds) + (doc.source === "database" ?
      ", as the shared database had it at the last refresh" : "") + ".")];
  if (!doc.clusters.length) {
    parts.push(el("p", "No clusters yet."));
    root.replaceChildren(...parts);
    return;
  }
  const holders = c => {
    const span = el("span");
    c.holders.forEach((h, i) => span.append(...(i ? [", "] : []),
      inner(nodeHref({cluster: c.cluster, name: h.node}), h.node),
      " (frees in " + duration(h.frees_at - now) + ")"));
    return span;
  };
  const wrap = table(["cluster", "cordoned", "remaining", "state", "holding a slot",
    "next slot frees"], doc.clusters.map(c => [c.cluster, c.used + " of " + c.limit,
    c.remaining, el("span", c.spent ? "spent" : "open", c.spent ? "spent-state" : "OK"),
    holders(c), c.next_free_at === null ? (c.spent ? "never (max_nodes = 0)" : "") :
      "in " + duration(c.next_free_at - now) + " (" + utc(c.next_free_at) + ")"]),
  "budget-table");
  const rows = wrap.querySelectorAll("tr");
  doc.clusters.forEach((c, i) => {
    rows[i + 1].dataset.cluster = c.cluster;
    if (c.spent) rows[i + 1].className = "spent";
  });
  parts.push(wrap);
  root.replaceChildren(...parts);
}

// Text quoted for the shell: a command to copy, whatever the id holds.
function quoted(text) {
  return "'" + String(text).replace(/'/g, "'\\''") + "'";
}

// The planned maintenance windows running (/api/v1/maintenance): what each covers, until
// when, who started it and why. The console holds no command token: windows are started
// and ended with the commands it shows, on the aggregator's host.
function renderMaintenance(doc) {
  const now = Date.now() / 1000;
  const running = doc.windows.filter(w => w.running);
  const parts = [];
  if (!running.length) parts.push(el("p", "None running.", "OK"));
  else {
    const wrap = table(["domain", "cluster", "until", "by", "reason", "id", "to end it"],
      running.map(w => [w.domain, w.cluster || "all clusters",
        utc(w.end) + " (" + duration(w.end - now) + " left)", w.by, w.reason, w.id,
        el("code", "gpuagent-aggregator maintenance end " + quoted(w.id), "cli")]),
    "maintenance-table");
    const rows = wrap.querySelectorAll("tr");
    running.forEach((w, i) => { rows[i + 1].dataset.window = w.id; });
    parts.push(wrap);
  }
  const p = el("p", "While a window covers a node, its records open no fleet incident and " +
    "its cordon requests are denied. Start one on the aggregator's host (it needs the " +
    "command token): ");
  p.append(el("code", "gpuagent-aggregator maintenance start --domain NAME=VALUE --for 2h " +
    "--reason TEXT", "cli"), " (a domain is a node label such as rack=r129, or node=, " +
    "nvlink= or job=); end it early: ",
  el("code", "gpuagent-aggregator maintenance end ID", "cli"), ".");
  parts.push(p);
  document.getElementById("maintenance").replaceChildren(...parts);
}

// On a node's (or GPU's) page: the window that covers the node, and what it mutes.
function maintenanceNote(doc) {
  const w = doc.maintenance;
  if (!w || typeof w !== "object") return [];
  const p = el("p", "In planned maintenance " + w.id + " (" + w.domain +
    (w.cluster ? " in " + w.cluster : "") + ", until " + utc(w.end) + ", by " + w.by + ": " +
    w.reason + "): its records open no fleet incident and its cordon requests are denied.",
  "banner in-maintenance");
  p.id = "node-maintenance";
  return [p];
}

// A rule finding's evidence in a few words (the whole of it on hover).
function ruleEvidence(f) {
  const ev = f.evidence || {};
  const words = [];
  if (f.rule === "repeat_offender") {
    if (ev.previous) words.push("CRITICAL " + ago(ev.previous.time) + " on " + ev.previous.node);
    if (ev.recovered) words.push("recovered " + ago(ev.recovered.time) + " on " +
      ev.recovered.node);
    if (ev.critical) words.push("CRITICAL again " + ago(ev.critical.time));
    words.push(ev.rma_bundle ? "RMA bundle " + ago(ev.rma_bundle.time) : "no RMA bundle");
  } else if (f.rule === "remediation_not_working") {
    const attempts = ev.attempts || [];
    const kinds = {};
    for (const a of attempts) kinds[a.action] = (kinds[a.action] || 0) + 1;
    words.push(plural(attempts.length, "attempt") + ": " + Object.entries(kinds)
      .map(([k, n]) => k + (n > 1 ? " ×" + n : "")).join(", "));
    if (attempts.length) words.push("last " + ago(Math.max(...attempts.map(a => a.time))));
    const done = f.done || {};
    if (done.mode_set) words.push("node set to " + done.mode_set + " mode" +
      (done.mode_before ? " (was " + done.mode_before + ")" : ""));
  } else if (f.rule === "die_defect") {
    const hits = ev.xid13 || [];
    words.push(hits.length + " Xid 13 on " + ev.key);
    if (hits.length) words.push("first " + ago(Math.min(...hits.map(h => h.time))));
  } else {
    words.push(Object.keys(ev).join(", "));
  }
  const span = el("span", words.join("; "));
  span.title = JSON.stringify(ev, null, 1);
  return span;
}

function ruleGpu(f) {
  if (!f.gpu) return "node";
  const critical = (f.evidence || {}).critical || {};
  return (typeof critical.index === "number" ? "GPU " + critical.index + " " : "") + f.gpu;
}

// Clearing needs the command token, which the console does not hold: the command to run
// on the aggregator's host, the id quoted for the shell.
function clearCommand(f) {
  return el("code", "gpuagent-aggregator rules clear " + quoted(f.id) + " --reason TEXT", "cli");
}

function ruleCells(f, now, withNode) {
  return [f.rule, ...(withNode ? [inner(nodeHref({cluster: f.cluster, name: f.node}), f.node)]
    : []), ruleGpu(f), duration(now - f.time), f.summary, f.recommendation, ruleEvidence(f),
    clearCommand(f)];
}

function renderRules(findings) {
  const now = Date.now() / 1000;
  document.getElementById("rules-count").textContent = findings.length ?
    plural(findings.length, "open finding") + ", the latest first" +
    (findings.length >= CONFIG.rules ? " (the latest " + CONFIG.rules + " shown)" : "") :
    "No open fleet rule findings.";
  document.getElementById("rules-clear").replaceChildren(...(findings.length ? [
    el("span", "When one is dealt with, clear it on the aggregator's host (it needs the " +
      "command token): "), el("code", "gpuagent-aggregator rules clear ID --reason TEXT", "cli"),
    el("span", ". Clearing a remediation finding lets the node remediate again.")] : []));
  document.querySelector("#rules tbody").replaceChildren(...findings.map(f => {
    const tr = el("tr");
    tr.className = "rule-finding";
    tr.dataset.finding = f.id;
    for (const [i, cell] of ruleCells(f, now, true).entries()) {
      const td = el("td");
      if (cell instanceof Node) td.append(cell); else td.textContent = cell;
      if (i === 2 || i === 6) td.className = "wide";
      tr.append(td);
    }
    return tr;
  }));
}

// A node's open rule findings, on its page.
function nodeRules(findings) {
  const now = Date.now() / 1000;
  return findings.length ? table(["rule", "GPU", "age", "summary", "recommendation",
    "evidence", "to clear it"], findings.map(f => ruleCells(f, now, false)), "node-rules")
    : el("p", "None open.", "OK");
}

// --- refresh -------------------------------------------------------------------------

// The last answer per URL with its ETag: a refresh that finds nothing changed gets 304
// and no body, and the page is drawn again only for its ages ("5 s ago"), every 5 s.
const answers = new Map();
let changed = false;
let drawnAt = 0;

async function get(url) {
  const known = answers.get(url);
  const r = await fetch(url, known ? {headers: {"If-None-Match": known.etag}} : {});
  if (r.status === 304 && known) return known.doc;
  if (!r.ok) throw new Error(url + ": HTTP " + r.status);
  const doc = await r.json();
  const etag = r.headers.get("ETag");
  if (etag) {
    answers.delete(url);
    answers.set(url, {etag, doc});
    if (answers.size > 64) answers.delete(answers.keys().next().value);
  }
  changed = true;
  return doc;
}

// Where the fragment points: {view: "fleet"}, {view: "incidents", incident: id or null},
// {view: "rules"}, or {view: "node" or "gpu", cluster, node, gpu: index or null}.
function route() {
  try {
    if (location.hash === "#rules") return {view: "rules"};
    const i = /^#incidents(?:\/([^/?]+))?$/.exec(location.hash);
    if (i) return {view: "incidents", incident: i[1] === undefined ? null :
      decodeURIComponent(i[1])};
    const m = /^#(node|gpu)\/([^/]*)\/([^/]*)(?:\/(\d+))?$/.exec(location.hash);
    if (m && (m[1] === "gpu") === (m[4] !== undefined)) return {view: m[1],
      cluster: decodeURIComponent(m[2]), node: decodeURIComponent(m[3]),
      gpu: m[4] === undefined ? null : Number(m[4])};
  } catch (e) {
    // a mangled link shows the fleet
  }
  return {view: "fleet"};
}

// One incident's document: from the list when it is there, else its own (an older one).
async function incidentOf(list, id) {
  const found = list.find(i => i.id === id);
  if (found) return found;
  try {
    return await get("api/v1/incidents/" + encodeURIComponent(id));
  } catch (e) {
    return null;
  }
}

let generation = 0;

async function refresh(forced = true) {
  const mine = ++generation;
  const target = route();
  const view = target.view;
  changed = forced || Date.now() - drawnAt > 5000;
  document.getElementById("fleet-view").hidden = view !== "fleet";
  document.getElementById("node-view").hidden = view !== "node" && view !== "gpu";
  document.getElementById("ack-form").hidden = view !== "gpu";
  document.getElementById("incidents-view").hidden = view !== "incidents";
  document.getElementById("rules-view").hidden = view !== "rules";
  for (const a of document.querySelectorAll("#views a"))
    a.className = a.dataset.view === (view === "incidents" || view === "rules" ? view :
      "fleet") ? "current" : "";
  try {
    if (view === "node" || view === "gpu") {
      const q = "?node=" + encodeURIComponent(target.node) + "&limit=" + CONFIG.history;
      const where = encodeURIComponent(target.node) + "?cluster=" +
        encodeURIComponent(target.cluster);
      const [doc, events, actions, cordons, summary, history, incidents, rules] =
        await Promise.all([get("api/v1/fleet/" + where),
          get("api/v1/events" + q), get("api/v1/actions" + q), get("api/v1/cordons?limit=1000"),
          get("api/v1/fleet?limit=1"), get("api/v1/history/" + where),
          get("api/v1/incidents?node=" + encodeURIComponent(target.node)),
          get("api/v1/rules?node=" + encodeURIComponent(target.node))]);
      if (mine !== generation) return;
      const own = x => x.node === target.node && x.cluster === target.cluster;
      const member = incidents.incidents.filter(i => i.cluster === target.cluster);
      if (changed) {
        renderSummary(summary.counts);
        if (target.gpu === null)
          renderNode(doc, events.events.filter(own), actions.actions.filter(own),
            cordons.cordons.filter(own), history, member, rules.findings.filter(own));
        else
          renderGpu(doc, target.gpu, events.events.filter(own), actions.actions.filter(own),
            cordons.cordons.filter(own), history, member, rules.findings.filter(own));
      }
      document.title = (target.gpu === null ? "" : "GPU " + target.gpu + " · ") + target.node +
        " · gpuagent";
    } else if (view === "incidents") {
      const [list, summary] = await Promise.all([
        get("api/v1/incidents?limit=" + CONFIG.incidents), get("api/v1/fleet?limit=1")]);
      const selected = target.incident === null ? null :
        await incidentOf(list.incidents, target.incident);
      if (mine !== generation) return;
      if (changed) {
        renderSummary(summary.counts);
        renderIncidents(list.incidents, target.incident, selected);
      }
      document.title = (target.incident === null ? "" : target.incident + " · ") +
        "incidents · gpuagent";
    } else if (view === "rules") {
      const [list, summary] = await Promise.all([
        get("api/v1/rules?limit=" + CONFIG.rules), get("api/v1/fleet?limit=1")]);
      if (mine !== generation) return;
      if (changed) {
        renderSummary(summary.counts);
        renderRules(list.findings);
      }
      document.title = "rules · gpuagent";
    } else {
      const params = fleetParams();
      const query = new URLSearchParams(params);
      query.set("limit", CONFIG.maxRows);
      const [fleet, drift, budget, maintenance] = await Promise.all([
        get("api/v1/fleet?" + query), get("api/v1/drift"), get("api/v1/budget"),
        get("api/v1/maintenance")]);
      if (mine !== generation) return;
      if (changed) {
        renderSummary(fleet.counts);
        renderFleet(fleet, params);
        renderDrift(drift.clusters);
        renderBudget(budget);
        renderMaintenance(maintenance);
      }
      document.title = "gpuagent fleet";
    }
    document.getElementById("error").textContent = "";
    if (changed) drawnAt = Date.now();
    if (!document.body.dataset.loaded) window.firstRenderMs = performance.now();
    document.body.dataset.loaded = "1";
    document.body.dataset.view = view;
  } catch (e) {
    if (mine === generation)
      document.getElementById("error").textContent = "Refresh failed: " + e.message;
  }
}

document.getElementById("filters").addEventListener("input", ev => {
  const params = fleetParams();
  params.set(ev.target.name, ev.target.value);
  setFleetParams(params);
});
for (const b of document.querySelectorAll("#nodes th button")) {
  b.dataset.label = b.textContent;
  b.addEventListener("click", () => {
    const params = fleetParams();
    const same = (params.get("sort") || "health") === b.dataset.sort;
    params.set("order", same && params.get("order") !== "desc" ? "desc" : "");
    params.set("sort", b.dataset.sort);
    setFleetParams(params);
  });
}
window.addEventListener("hashchange", () => { window.scrollTo(0, 0); refresh(); });
refresh();
// A page in a background tab costs the aggregator nothing; it catches up when shown.
setInterval(() => { if (!document.hidden) refresh(false); }, CONFIG.refreshMs);
document.addEventListener("visibilitychange", () => { if (!document.hidden) refresh(); });
