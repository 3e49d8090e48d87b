// pg_scheduler dashboard: the workflows list, a graph's page, and the
// whole-workflow controls of a job page. Loaded after app.js, whose helpers it
// uses (el, svgNode, api, act, actionButton, link, when, table, statusCell).
// What the API sends goes in as text nodes and attributes, never as HTML.
"use strict";

const UNFINISHED = ["pending", "running", "waiting"];
const ENDED_BADLY = ["failed", "cancelled", "expired"];
// A node's box, the gaps between layers (left to right) and rows, the margin.
const BOX = { w: 196, h: 44, gapX: 64, gapY: 12, pad: 16 };
const TASK_CHARS = 26;
// Jobs (and their edges) added to the drawing per frame after the first paint,
// which shows only the part in view: a large graph paints at once and the
// page stays responsive while the rest comes in.
const CHUNK = 150;
// Rows of the table of jobs that ended without completing, at most.
const FAILURES_SHOWN = 50;

// -- the workflows list ----------------------------------------------------------------

let LISTED = new Set();  // the first jobs the list shows

async function workflows() {
  const params = new URLSearchParams(location.search);
  const query = new URLSearchParams();
  for (const name of ["status", "limit"]) if (params.get(name)) query.set(name, params.get(name));
  const d = await api(`workflows?${query}`);
  LISTED = new Set(d.workflows.map((w) => w.job_id));
  const status = el("select", { name: "status", "data-filter": "status" },
    el("option", { value: "" }, "any"),
    STATUSES.map((s) => el("option", { value: s, selected: s === d.status }, s)));
  const form = el("form", { class: "filters", method: "get", action: `${BASE}/workflows` },
    el("label", {}, "status", status), el("button", { type: "submit" }, "filter"));
  const rows = d.workflows.map((w) => el("tr", { "data-workflow": w.job_id, "data-kind": w.kind },
    el("td", { class: "id" }, link("job", { id: w.job_id }, w.job_id)),
    el("td", {}, w.kind === "graph"
      ? link("graph", { id: w.job_id }, "graph") : el("span", {}, "workflow")),
    el("td", {}, w.task_name), el("td", {}, w.queue), statusCell(w.status),
    el("td", {}, w.wait_kind || ""),
    el("td", { class: "num" }, w.kind === "graph" ? "" : w.steps),
    el("td", {}, when(w.created_at)), el("td", {}, when(w.finished_at))));
  return [el("h2", {}, "Workflows and graphs"), form,
    el("p", { class: "muted" }, "A graph is the jobs joined by depends_on, listed by its first job; "
      + "a workflow is a @workflow job with its steps. Newest first."),
    table(["job", "kind", "task", "queue", "status", "waits for", "steps", "created", "finished"],
      rows, "No workflow or graph" + (d.status ? ` is ${d.status}.` : " yet."))];
}

// -- a graph -----------------------------------------------------------------------------

// Longest-path layers from the roots (each job one layer past its deepest
// dependency), then a few barycentre sweeps to order each layer by where its
// neighbours sit. Returns each node's x, y and the drawing's size.
function layoutGraph(nodes, edges) {
  const count = nodes.length;
  const index = new Map(nodes.map((n, i) => [n.job_id, i]));
  const parents = nodes.map(() => []), children = nodes.map(() => []);
  for (const e of edges) {
    const a = index.get(e.from), b = index.get(e.to);
    if (a === undefined || b === undefined || a === b) continue;
    parents[b].push(a);
    children[a].push(b);
  }
  const layer = new Array(count).fill(0);
  const indegree = parents.map((p) => p.length);
  const order = [];
  for (let i = 0; i < count; i++) if (!indegree[i]) order.push(i);
  for (let q = 0; q < order.length; q++) {
    const i = order[q];
    for (const c of children[i]) {
      layer[c] = Math.max(layer[c], layer[i] + 1);
      if (--indegree[c] === 0) order.push(c);
    }
  }
  if (order.length < count) {  // a cycle (never declared by depends_on): after the rest
    const deepest = layer.reduce((m, l) => Math.max(m, l), 0);
    for (let i = 0; i < count; i++) if (indegree[i] > 0) layer[i] = deepest + 1;
  }
  const layers = [];
  for (let i = 0; i < count; i++) (layers[layer[i]] ||= []).push(i);
  for (let l = 0; l < layers.length; l++) layers[l] ||= [];
  const widest = layers.reduce((m, ids) => Math.max(m, ids.length), 1);
  // A row position: layers are centred on the widest one.
  const row = new Array(count);
  const place = (ids) => {
    const offset = (widest - ids.length) / 2;
    ids.forEach((i, k) => { row[i] = offset + k; });
  };
  layers.forEach(place);
  const centre = (i, near) => near.length ? near.reduce((s, j) => s + row[j], 0) / near.length : row[i];
  for (let sweep = 0; sweep < 4; sweep++) {
    const down = sweep % 2 === 0;
    const ls = [...layers.keys()];
    if (!down) ls.reverse();
    for (const l of ls) {
      const ids = layers[l];
      if (ids.length < 2) continue;
      const key = new Map(ids.map((i) => [i, centre(i, down ? parents[i] : children[i])]));
      ids.sort((a, b) => key.get(a) - key.get(b) || a - b);
      place(ids);
    }
  }
  const x = layer.map((l) => BOX.pad + l * (BOX.w + BOX.gapX));
  const y = row.map((r) => BOX.pad + r * (BOX.h + BOX.gapY));
  return {
    x, y,
    width: 2 * BOX.pad + layers.length * (BOX.w + BOX.gapX) - BOX.gapX,
    height: 2 * BOX.pad + widest * (BOX.h + BOX.gapY) - BOX.gapY,
  };
}

function clip(text, chars) {
  text = text || "";
  return text.length > chars ? text.slice(0, chars - 1) + "…" : text;
}

function nodeTitle(n) {
  return [n.task_name, n.job_id, n.status + (n.wait_kind ? ` (waits for ${n.wait_kind})` : ""),
    n.error_message || ""].filter((t) => t).join("\n");
}

// A node's state: its colour (the status classes of style.css), its text.
function setNodeState(node, n, focus) {
  node.setAttribute("class", `node status-${n.status}${focus ? " focus" : ""}`);
  node.setAttribute("data-status", n.status);
  node.querySelector("text.state").textContent = n.status + (n.wait_kind ? ` · ${n.wait_kind}` : "");
  node.querySelector("title").textContent = nodeTitle(n);
}

function graphNode(n, x, y, focus) {
  const node = svgNode("a", { href: `${BASE}/job?id=${encodeURIComponent(n.job_id)}`,
    "data-node": n.job_id, transform: `translate(${x},${y})` });
  node.append(svgNode("title", {}),
    svgNode("rect", { class: "box", width: BOX.w, height: BOX.h, rx: 5 }),
    svgNode("rect", { class: "stripe", width: 5, height: BOX.h, rx: 2 }),
    svgNode("text", { class: "task", x: 12, y: 18 }, clip(n.task_name, TASK_CHARS)),
    svgNode("text", { class: "state", x: 12, y: 35 }));
  setNodeState(node, n, focus);
  return node;
}

// The drawing: every job and edge made, those in view (around the job the
// page is for) in the page at once, the rest queued for reveal().
function drawGraph(d) {
  const { x, y, width, height } = layoutGraph(d.nodes, d.edges);
  const svg = svgNode("svg", { class: "graph", width, height, viewBox: `0 0 ${width} ${height}`,
    "data-graph": d.job_id });
  const marker = svgNode("marker", { id: "graph-arrow", viewBox: "0 0 8 8", refX: 8, refY: 4,
    markerWidth: 7, markerHeight: 7, orient: "auto" });
  marker.append(svgNode("path", { d: "M0,0 L8,4 L0,8 z", class: "arrow" }));
  const defs = svgNode("defs", {});
  defs.append(marker);
  const edgeLayer = svgNode("g", { class: "edges" });
  const nodeLayer = svgNode("g", { class: "nodes" });
  svg.append(defs, edgeLayer, nodeLayer);
  // The box shows about this much of the drawing (style.css: main's width, 75vh).
  const seeW = Math.min(width, Math.min(innerWidth, 1400) - 40);
  const seeH = Math.min(height, innerHeight * 0.75);
  const index = new Map(d.nodes.map((n, i) => [n.job_id, i]));
  const focus = index.get(d.job_id) ?? 0;
  const clamp = (v, most) => Math.max(0, Math.min(v, most));
  const left = clamp(x[focus] + BOX.w / 2 - seeW / 2, width - seeW);
  const top = clamp(y[focus] + BOX.h / 2 - seeH / 2, height - seeH);
  const seen = (i) => x[i] + BOX.w >= left && x[i] <= left + seeW && y[i] + BOX.h >= top
    && y[i] <= top + seeH;
  const byId = new Map();
  const later = [];
  d.nodes.forEach((n, i) => {
    const node = graphNode(n, x[i], y[i], i === focus);
    byId.set(n.job_id, node);
    if (seen(i)) nodeLayer.append(node); else later.push([nodeLayer, node]);
  });
  for (const e of d.edges) {
    const a = index.get(e.from), b = index.get(e.to);
    const x1 = x[a] + BOX.w, y1 = y[a] + BOX.h / 2, x2 = x[b] - 1, y2 = y[b] + BOX.h / 2;
    const bend = Math.max(BOX.gapX / 2, (x2 - x1) / 3);
    const path = svgNode("path", { class: "edge", "data-from": e.from, "data-to": e.to,
      d: `M${x1},${y1} C${x1 + bend},${y1} ${x2 - bend},${y2} ${x2},${y2}`,
      "marker-end": "url(#graph-arrow)" });
    if (seen(a) || seen(b)) edgeLayer.append(path); else later.push([edgeLayer, path]);
  }
  return { svg, byId, later, left, top };
}

// Once the drawing is in the page: scroll it to the job the page is for,
// then add the rest a chunk a frame. The first drawing of the page marks
// its first paint ("graph-painted") and its end ("graph-complete").
function reveal(view, first) {
  requestAnimationFrame(() => {
    const box = view.svg.parentNode;
    if (box) { box.scrollLeft = view.left; box.scrollTop = view.top; }
    requestAnimationFrame(() => {
      if (first) performance.mark("graph-painted");
      const step = () => {
        if (GRAPH.view !== view) return;  // drawn anew meanwhile
        for (const [layer, item] of view.later.splice(0, CHUNK)) layer.append(item);
        if (view.later.length) requestAnimationFrame(step);
        else {
          view.svg.setAttribute("data-complete", "1");
          if (first) requestAnimationFrame(() => performance.mark("graph-complete"));
        }
      };
      step();
    });
  });
}

// The counts by status (each in its colour: the legend), the totals, the
// cancel button.
function graphHead(d) {
  const unfinished = UNFINISHED.reduce((s, k) => s + (d.counts[k] || 0), 0);
  return [
    el("div", { class: "chips legend", "data-graph-legend": "1" },
      STATUSES.map((s) => el("span", { class: `chip status-${s}`, "data-graph-count": s },
        el("span", { class: "swatch" }), `${s} ${d.counts[s] || 0}`))),
    el("p", { class: "muted", "data-graph-total": d.total },
      `${d.total} job${d.total === 1 ? "" : "s"}, ${d.edges.length} dependenc${d.edges.length === 1 ? "y" : "ies"}`,
      d.truncated ? `; the oldest ${d.nodes.length} drawn` : "",
      ". Each box links to its job."),
    unfinished ? el("div", { class: "actions" }, actionButton("cancel_workflow", { job_id: d.job_id },
      `cancel graph (${unfinished} unfinished)`, true)) : null,
  ];
}

// The jobs that ended without completing: a failed or expired one can be
// retried (its graph goes on), as can a cancelled one whose dependencies completed.
function graphFailures(d) {
  const status = new Map(d.nodes.map((n) => [n.job_id, n.status]));
  const retryable = (n) => n.status === "failed" || n.status === "expired"
    || (n.status === "cancelled" && n.depends_on.every((id) => (status.get(id) || "completed") === "completed"));
  const bad = d.nodes.filter((n) => ENDED_BADLY.includes(n.status));
  if (!bad.length) return [];
  const more = bad.length - FAILURES_SHOWN;
  return [el("h3", { "data-section": "graph-failures" }, `Ended without completing (${bad.length})`),
    table(["job", "task", "status", "finished", "error", ""], bad.slice(0, FAILURES_SHOWN).map((n) =>
      el("tr", { "data-failed-node": n.job_id },
        el("td", { class: "id" }, link("job", { id: n.job_id }, n.job_id)), el("td", {}, n.task_name),
        statusCell(n.status), el("td", {}, when(n.finished_at)),
        el("td", { class: "result" }, n.error_message || ""),
        el("td", {}, retryable(n) ? actionButton("retry_workflow", { job_id: n.job_id }, "retry") : "")))),
    more > 0 ? el("p", { class: "muted", "data-failures-more": more },
      `and ${more} more (the oldest are listed; each box of the graph links to its job)`) : null,
  ];
}

function graphKey(d) {
  return d.nodes.map((n) => n.job_id).join(" ") + "|" + d.edges.map((e) => `${e.from}>${e.to}`).join(" ");
}

// What the page shows now: its jobs (live events naming one refresh it),
// and its drawing, kept while the jobs and edges stay the same.
const GRAPH = { ids: new Set(), key: null, view: null, head: null, tail: null, drawn: false };

async function graph() {
  const id = new URLSearchParams(location.search).get("id") || "";
  const d = await api(`graph?id=${encodeURIComponent(id)}`);
  GRAPH.ids = new Set(d.nodes.map((n) => n.job_id));
  const key = graphKey(d);
  if (GRAPH.view && GRAPH.key === key && main.contains(GRAPH.view.svg)) {
    for (const n of d.nodes) setNodeState(GRAPH.view.byId.get(n.job_id), n, n.job_id === d.job_id);
    GRAPH.head.replaceChildren(...graphHead(d).filter((x) => x));
    GRAPH.tail.replaceChildren(...graphFailures(d).filter((x) => x));
    return undefined;
  }
  GRAPH.key = key;
  GRAPH.view = drawGraph(d);
  GRAPH.head = el("div", { "data-section": "graph-head" }, graphHead(d));
  GRAPH.tail = el("div", {}, graphFailures(d));
  if (!GRAPH.drawn) performance.mark("graph-drawn");
  reveal(GRAPH.view, !GRAPH.drawn);
  GRAPH.drawn = true;
  return [el("h2", {}, "Graph of ", link("job", { id: d.job_id }, d.job_id)), GRAPH.head,
    el("div", { class: "graph-box" }, GRAPH.view.svg), GRAPH.tail];
}

RENDER.workflows = workflows;
// The list follows its rows' first jobs, and new jobs (a new workflow or graph).
CHANGE.workflows = (data) => Boolean(data.more) || Boolean((data.kinds || {}).scheduled)
  || (data.jobs || []).some((id) => LISTED.has(id));
RENDER.graph = graph;
// An event naming one of the graph's jobs (or more jobs than it lists) refreshes it.
CHANGE.graph = (data) => Boolean(data.more) || (data.jobs || []).some((id) => GRAPH.ids.has(id));

// -- a job page: signal, retry or fork a code-first workflow -----------------------------------

// A workflow parked on a signal: send it one by hand (its name filled in, a
// JSON payload, an optional idempotency key), as Scheduler.signal does.
function signalControls(j, w) {
  const title = REPLICA ? "this dashboard reads a replica; actions need the primary"
    : READ_ONLY ? "read-only dashboard: start it with --token to act" : "";
  const name = el("input", { type: "text", value: w.wait.signal || "", size: 16,
    "data-signal-name": "1", disabled: READ_ONLY });
  const payload = el("input", { type: "text", size: 28, placeholder: "JSON payload (empty: null)",
    "data-signal-payload": "1", disabled: READ_ONLY });
  const key = el("input", { type: "text", size: 16, placeholder: "idempotency key",
    "data-signal-key": "1", disabled: READ_ONLY });
  const send = el("button", {
    type: "button", "data-action": "signal_workflow", disabled: READ_ONLY, title,
    onclick: async () => {
      const text = payload.value.trim();
      let value = null;
      if (text) {
        try { value = JSON.parse(text); } catch (error) {
          toast(`payload is not JSON: ${error.message}`, true);
          return;
        }
      }
      const body = { job_id: j.job_id, name: name.value, payload: value };
      if (key.value.trim()) body.idempotency_key = key.value.trim();
      const sent = await act("signal_workflow", body);
      if (sent && !sent.stored) toast(`not sent: it has a signal of key ${body.idempotency_key}`);
    },
  }, "send signal");
  return el("div", { class: "actions workflow-actions", "data-section": "signal-actions" },
    el("label", {}, "signal ", name), el("label", {}, "payload ", payload),
    el("label", {}, "key ", key), send);
}

// A job of a graph that ended without completing: retry it with its graph
// (the dependents its end cancelled wait again). A code-first workflow that
// ended: retry it from its failed step (not completed), or fork a new run from
// a chosen step (the steps before it are replayed).
function workflowControls(j, w) {
  if (j.status === "waiting" && w && w.wait && w.wait.kind === "signal") return signalControls(j, w);
  const steps = Boolean(w && w.steps_total);
  if (!steps && j.in_graph && ENDED_BADLY.includes(j.status)) {
    return el("div", { class: "actions workflow-actions", "data-section": "workflow-actions" },
      actionButton("retry_workflow", { job_id: j.job_id }, "retry with its graph"));
  }
  if (!steps || !(ENDED_BADLY.includes(j.status) || j.status === "completed")) return null;
  const failed = w.steps.find((s) => s.status === "failed");
  const first = failed ? failed.seq : 1;
  const listed = !w.steps_after && w.steps.length >= w.steps_total;
  const chooser = listed
    ? el("select", { "data-fork-step": "1", disabled: READ_ONLY },
      w.steps.map((s) => el("option", { value: s.seq, selected: s.seq === first },
        `${s.seq} · ${s.name || s.kind}`)))
    : el("input", { type: "number", min: 1, max: w.steps_total, value: first,
      "data-fork-step": "1", disabled: READ_ONLY });
  const fork = el("button", {
    type: "button", "data-action": "fork_workflow", disabled: READ_ONLY,
    title: READ_ONLY ? "read-only dashboard: start it with --token to act"
      : "a new run that replays the steps before this one and runs the rest",
    onclick: async () => {
      const made = await act("fork_workflow", { job_id: j.job_id, from_step: Number(chooser.value) });
      if (made) location.href = `${BASE}/job?id=${encodeURIComponent(made.job_id)}`;
    },
  }, "fork");
  return el("div", { class: "actions workflow-actions", "data-section": "workflow-actions" },
    ENDED_BADLY.includes(j.status) ? actionButton("retry_workflow", { job_id: j.job_id },
      failed ? `retry from failed step ${failed.seq}` : "retry from failed step") : null,
    el("label", {}, "fork from step ", chooser), fork);
}
