// pg_scheduler dashboard. Plain JS, no dependencies, no network beyond this server.
// Everything from the API is put in the page as text nodes (el() below), never
// as HTML: job arguments, errors and names may contain markup.
"use strict";

const body = document.body;
const BASE = body.dataset.base || "";
const PAGE = body.dataset.page || "overview";
// On a read replica nothing can be written: the page is read-only whatever the token.
const REPLICA = body.dataset.replica === "true";
const READ_ONLY = body.dataset.readonly === "true" || REPLICA;
const POLL_MS = Math.max(1, parseFloat(body.dataset.poll || "5")) * 1000;
const STATUSES = ["pending", "running", "waiting", "completed", "failed", "cancelled", "expired"];
const main = document.getElementById("main");

// -- building blocks ---------------------------------------------------------------

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") node.className = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (key.startsWith("data-")) node.setAttribute(key, String(value));
    else node[key] = value;
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function table(headers, rows, empty) {
  if (!rows.length) return el("p", { class: "muted" }, empty || "Nothing here.");
  return el("table", {}, el("thead", {}, el("tr", {}, headers.map((h) => el("th", {}, h)))),
    el("tbody", {}, rows));
}

function when(iso) {
  if (!iso) return "";
  const date = new Date(iso);
  const ago = (Date.now() - date.getTime()) / 1000;
  const rel = Math.abs(ago) < 90 ? `${Math.round(Math.abs(ago))} s`
    : Math.abs(ago) < 5400 ? `${Math.round(Math.abs(ago) / 60)} min`
    : Math.abs(ago) < 129600 ? `${Math.round(Math.abs(ago) / 3600)} h`
    : `${Math.round(Math.abs(ago) / 86400)} d`;
  return el("span", { class: "time", title: iso, "data-time": iso }, ago >= 0 ? `${rel} ago` : `in ${rel}`);
}

function seconds(value) {
  if (value === null || value === undefined) return "-";
  if (value < 1) return `${Math.round(value * 1000)} ms`;
  if (value < 120) return `${value.toFixed(1)} s`;
  if (value < 7200) return `${(value / 60).toFixed(1)} min`;
  return `${(value / 3600).toFixed(1)} h`;
}

function percent(value) {
  return value === null || value === undefined ? "-" : `${(value * 100).toFixed(1)} %`;
}

function statusCell(status) {
  return el("td", { class: `status status-${status}`, "data-status": status }, status);
}

function link(page, params, text) {
  const query = new URLSearchParams(params).toString();
  return el("a", { href: `${BASE}/${page}${query ? "?" + query : ""}` }, text);
}

// A time as every page shows it: how far it is ("in 2 h"), the exact time on hover.
function at(iso) {
  return when(iso);
}

// What a parked workflow waits for: a sleep's end, a signal (until its timeout
// or the workflow's deadline), its children.
function waitNode(kind, signal, until, children) {
  if (!kind) return null;
  const parts = [];
  if (kind === "sleep") parts.push("sleep, wakes ", until ? at(until) : "?");
  else if (kind === "signal") parts.push(`signal "${signal}"`, until ? [", times out ", at(until)] : " (no timeout)");
  else if (kind === "children") {
    parts.push(children === null || children === undefined ? "children"
      : `${children} child${children === 1 ? "" : "ren"} to end`);
    if (until) parts.push(", deadline ", at(until));
  } else parts.push(kind);
  return el("span", { "data-wait": kind }, parts);
}

// A clipped text (a step's result, an error, a payload) and its full length.
function clipped(text, length) {
  if (text === null || text === undefined) return "";
  return [text, length > text.length
    ? el("span", { class: "muted", "data-clipped": length }, ` … (${length} characters)`) : null];
}

function card(label, value, key, help) {
  return el("div", { class: "card", title: help || null }, el("div", { class: "label" }, label),
    el("div", { class: "value", "data-count": key }, value));
}

// Work no live process serves: due jobs of tasks no live worker registered,
// periodic jobs no live process declares. Nothing runs them until one starts.
function orphansPanel(o) {
  const none = !o.jobs.length && !o.periodic.length;
  return el("section", { class: none ? "orphans none" : "orphans", "data-section": "orphans" },
    el("h3", {}, none ? "Orphaned work: none" : "Orphaned work"),
    none ? el("p", { class: "muted" }, "Every due job's task is registered by a live worker, and every periodic job is declared by a live process.") : [
      el("p", {}, "No live worker runs these: they wait until a worker registering their task starts "
        + "(the pg-scheduler orphans command lists and removes them). They are left out of the oldest due wait above."),
      o.jobs.length ? table(["task", "queue", "due jobs", "oldest due"], o.jobs.map((j) =>
        el("tr", { "data-orphan-task": j.task_name, "data-orphan-queue": j.queue },
          el("td", {}, link("jobs", { task: j.task_name, status: "pending" }, j.task_name),
            j.periodic_name ? ` (periodic ${j.periodic_name})` : ""),
          el("td", {}, j.queue), el("td", { class: "num", "data-orphan-due": j.due }, j.due),
          el("td", {}, when(j.oldest_due))))) : null,
      o.periodic.length ? table(["periodic job", "dedup key", "schedule", "enabled", "pending windows"],
        o.periodic.map((p) => el("tr", { "data-orphan-periodic": p.dedup_key },
          el("td", {}, p.job_name), el("td", { class: "mono" }, p.dedup_key),
          el("td", { class: "mono" }, p.schedule), el("td", {}, p.enabled ? "yes" : "no"),
          el("td", { class: "num" }, p.pending)))) : null,
    ]);
}

let toastTimer = null;
function toast(message, error) {
  const node = document.getElementById("toast");
  node.textContent = message;
  node.className = "shown" + (error ? " error" : "");
  clearTimeout(toastTimer);
  toastTimer = setTimeout(() => { node.className = ""; }, 6000);
}

async function api(path) {
  const response = await fetch(`${BASE}/api/${path}`, { headers: { Accept: "application/json" } });
  const data = await response.json();
  if (!response.ok) throw new Error(data.error || response.statusText);
  return data;
}

// Actions send the token in a header (a cross-site form cannot), JSON body.
async function act(name, payload) {
  const headers = { "Content-Type": "application/json" };
  const token = sessionStorage.getItem("pg_scheduler_token");
  if (token) headers["X-Dashboard-Token"] = token;
  const response = await fetch(`${BASE}/api/action/${name}`, {
    method: "POST", headers, body: JSON.stringify(payload),
  });
  let data = {};
  try { data = await response.json(); } catch (_) { /* empty body */ }
  if (!response.ok) {
    toast(`${name} refused: ${data.error || response.statusText}`, true);
    return null;
  }
  toast(`${name}: done`);
  scheduleRefresh(0);
  return data;
}

function actionButton(name, payload, label, danger) {
  return el("button", {
    class: danger ? "danger" : "", "data-action": name, type: "button", disabled: READ_ONLY,
    title: REPLICA ? "this dashboard reads a replica; actions need the primary"
      : READ_ONLY ? "read-only dashboard: start it with --token to act" : "",
    onclick: () => act(name, payload),
  }, label || name);
}

function jobActions(job) {
  const buttons = [];
  if (["pending", "running", "waiting"].includes(job.status)) {
    buttons.push(actionButton("cancel", { job_id: job.job_id }, "cancel", true));
  }
  if (["failed", "cancelled", "expired"].includes(job.status)) {
    buttons.push(actionButton("retry", { job_id: job.job_id }, "retry"));
  }
  return el("div", { class: "actions" }, buttons);
}

// -- pages ---------------------------------------------------------------------------

function svgNode(tag, attrs, text) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, String(value));
  if (text !== undefined) node.textContent = text;
  return node;
}

const CHART_KINDS = ["completed", "failed"];

// Finished jobs per bucket over the last hour: stacked bars, a time axis (local
// clock times, a tick every 10 buckets, "now" at the end) and a legend.
function chart(series) {
  const width = 720, height = 170, left = 34, right = 12, top = 26, bottom = 24;
  const svg = svgNode("svg", { class: "chart", viewBox: `0 0 ${width} ${height}`, width, height,
    "data-chart": "throughput" });
  const bucket = series.bucket_seconds;
  const end = Math.floor(Date.now() / 1000 / bucket) * bucket;
  const slots = 60;
  const byTime = new Map(series.points.map((p) => [p.t, p]));
  let max = 1;
  for (const p of series.points) max = Math.max(max, (p.completed || 0) + (p.failed || 0));
  const plotH = height - top - bottom, base = height - bottom;
  const barWidth = (width - left - right) / slots;
  svg.append(svgNode("line", { class: "axis", x1: left, y1: base, x2: width - right, y2: base }));
  svg.append(svgNode("line", { class: "axis", x1: left, y1: top, x2: left, y2: base }));
  svg.append(svgNode("text", { class: "tick", x: left - 4, y: top + 4, "text-anchor": "end" }, max));
  svg.append(svgNode("text", { class: "tick", x: left - 4, y: base, "text-anchor": "end" }, 0));
  for (let i = 0; i < slots; i++) {
    const t = end - (slots - 1 - i) * bucket;
    const point = byTime.get(t) || {};
    const x = left + i * barWidth;
    let y = base;
    for (const kind of CHART_KINDS) {
      const n = point[kind] || 0;
      if (!n) continue;
      const h = (n / max) * plotH;
      const rect = svgNode("rect", { x, y: y - h, width: Math.max(1, barWidth - 1), height: h, class: kind });
      rect.append(svgNode("title", {}, `${n} ${kind}, ${new Date(t * 1000).toLocaleTimeString()}`));
      svg.append(rect);
      y -= h;
    }
    if ((slots - 1 - i) % 10 === 0) {
      const cx = x + barWidth / 2;
      const label = i === slots - 1 ? "now"
        : new Date(t * 1000).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
      svg.append(svgNode("line", { class: "axis", x1: cx, y1: base, x2: cx, y2: base + 4 }));
      svg.append(svgNode("text", { class: "tick", x: cx, y: height - 6, "text-anchor": "middle",
        "data-axis": new Date(t * 1000).toISOString() }, label));
    }
  }
  svg.append(svgNode("text", { class: "tick", x: left, y: 14 },
    `finished per ${bucket >= 60 ? bucket / 60 + " min" : bucket + " s"}, last hour`));
  CHART_KINDS.forEach((kind, k) => {
    const x = width - right - 190 + k * 95;
    const item = svgNode("g", { "data-legend": kind });
    item.append(svgNode("rect", { x, y: 5, width: 10, height: 10, class: kind }));
    item.append(svgNode("text", { class: "tick", x: x + 14, y: 14 }, kind));
    svg.append(item);
  });
  return svg;
}

async function overview() {
  const d = await api("overview");
  const w5 = d.windows["300"], w60 = d.windows["3600"];
  return [
    el("h2", {}, "Overview"),
    el("div", { class: "cards" },
      STATUSES.map((s) => card(s, d.counts[s], s)),
      card("due now", d.due, "due"),
      card("oldest due wait", seconds(d.oldest_due_seconds), "oldest",
        "of tasks a live worker runs; orphaned jobs are counted apart"),
      card("orphaned due", d.orphans.due, "orphaned",
        "due jobs whose task no live worker has registered: nothing runs them"),
      card("live workers", d.live_workers, "workers"),
      card("jobs/s (5 min)", w5.throughput.toFixed(2), "throughput"),
      card("failure rate (5 min)", percent(w5.failure_rate), "failure"),
      card("failure rate (1 h)", percent(w60.failure_rate), "failure-hour")),
    orphansPanel(d.orphans),
    el("h3", {}, "Throughput"),
    chart(d.series),
    el("h3", {}, "By queue"),
    table(["queue", "paused", ...STATUSES, "due"], d.queues.map((q) => el("tr", { "data-queue": q.queue },
      el("td", {}, link("jobs", { queue: q.queue }, q.queue)), el("td", {}, q.paused ? "paused" : ""),
      STATUSES.map((s) => el("td", { class: "num" }, q.counts[s] || 0)),
      el("td", { class: "num" }, q.due)))),
    el("h3", {}, "By task"),
    table(["task", ...STATUSES], d.tasks.map((t) => el("tr", {},
      el("td", {}, link("jobs", { task: t.task }, t.task)),
      STATUSES.map((s) => el("td", { class: "num" }, t.counts[s] ? link("jobs", { task: t.task, status: s }, t.counts[s]) : 0)))),
      "No jobs yet."),
  ];
}

function filterForm(params) {
  const field = (name, label, attrs) => el("label", {}, label,
    el("input", { name, value: params.get(name) || "", ...attrs }));
  const status = el("select", { name: "status" }, el("option", { value: "" }, "any"),
    STATUSES.map((s) => el("option", { value: s, selected: params.get("status") === s }, s)));
  return el("form", { class: "filters", method: "get", action: `${BASE}/jobs` },
    el("label", {}, "status", status),
    field("task", "task"), field("queue", "queue"),
    field("q", "search (id or text in arguments)", { size: 30 }),
    field("since", "created since (30m, 2h, ISO)", { size: 12 }),
    field("until", "created before", { size: 12 }),
    field("batch", "batch id", { size: 24 }),
    el("button", { type: "submit" }, "filter"),
    el("a", { href: `${BASE}/jobs` }, "clear"));
}

// The jobs table's columns and widths: it keeps to the page's width (fixed
// layout), long text clipped on one line with the full value on hover.
const JOB_COLUMNS = [["id", "19rem"], ["task", null], ["status", "6rem"], ["queue", "6rem"],
  ["priority", "5rem"], ["tries", "3rem"], ["created", "6.5rem"], ["due / waits for", "8rem"],
  ["arguments", null], ["error", null], ["", "5rem"]];

function clipCell(text, attrs) {
  return el("td", { class: "clip", title: text || "", ...attrs }, text || "");
}

function runningToggle(params) {
  const only = params.get("status") === "running";
  const next = new URLSearchParams(params);
  next.delete("after");
  if (only) next.delete("status"); else next.set("status", "running");
  return el("a", { class: "toggle" + (only ? " on" : ""), href: `${BASE}/jobs?${next}`,
    "data-toggle": "running" }, only ? "all statuses" : "running only");
}

async function jobs() {
  const params = new URLSearchParams(location.search);
  const query = new URLSearchParams();
  for (const [k, v] of params) if (v) query.set(k, v);
  const d = await api(`jobs?${query}`);
  const rows = d.jobs.map((j) => {
    const wait = j.status === "waiting" && j.wait_kind
      ? waitNode(j.wait_kind, j.wait_for, j.wake_at, j.children_waiting) : null;
    return el("tr", { "data-job-id": j.job_id },
      el("td", { class: "id clip" }, link("job", { id: j.job_id }, j.job_id)),
      clipCell(j.task_name), statusCell(j.status), clipCell(j.queue),
      el("td", {}, j.priority), el("td", { class: "num" }, j.attempts),
      el("td", { class: "clip" }, when(j.created_at)),
      el("td", { class: "clip", title: wait ? wait.textContent : null }, wait || when(j.execution_time)),
      clipCell(j.args, { class: "clip args", "data-args": "1" }),
      clipCell(j.error, { class: "clip status-failed", "data-error-text": "1" }),
      el("td", {}, jobActions(j)));
  });
  const pager = el("div", { class: "pager" });
  if (params.get("after")) {
    const first = new URLSearchParams(params); first.delete("after");
    pager.append(link("jobs", Object.fromEntries(first), "first page"));
  }
  if (d.next) {
    const next = new URLSearchParams(params); next.set("after", d.next);
    pager.append(el("a", { href: `${BASE}/jobs?${next}`, "data-next": "1" }, "next page"));
  }
  const list = rows.length ? el("table", { class: "jobs" },
    el("colgroup", {}, JOB_COLUMNS.map(([, w]) => el("col", { style: w ? `width:${w}` : null }))),
    el("thead", {}, el("tr", {}, JOB_COLUMNS.map(([h]) => el("th", {}, h)))),
    el("tbody", {}, rows)) : el("p", { class: "muted" }, "No jobs match.");
  return [el("h2", {}, "Jobs ", runningToggle(params)), filterForm(params), list, pager];
}

function stepResult(s) {
  if (s.error) return el("span", { class: "status-failed" }, clipped(s.error, s.error_length));
  if (s.child_job_id) return link("job", { id: s.child_job_id }, s.child_job_id);
  return clipped(s.result, s.result_length);
}

// A page link of the job page: the same job, one paging parameter changed.
function jobPageLink(param, value, text) {
  const params = new URLSearchParams(location.search);
  if (value) params.set(param, value); else params.delete(param);
  return el("a", { href: `${BASE}/job?${params}`, [`data-${param}`]: value || "0" }, text);
}

function workflowSections(w) {
  if (!w) return [];
  const out = [];
  const stepsFrom = w.steps_after ? ` (after step ${w.steps_after})` : "";
  // A plain job spawned by a workflow has no steps: its parent is one of its fields.
  if (w.steps_total) out.push(el("h3", { "data-section": "steps" }, `Steps (${w.steps_total})${stepsFrom}`));
  if (w.steps_total) out.push(table(["seq", "kind", "name", "key", "status", "attempts", "started", "duration", "result or error"],
    w.steps.map((s) => el("tr", { "data-step": s.seq, "data-kind": s.kind },
      el("td", { class: "num" }, s.seq), el("td", {}, s.kind), el("td", { class: "mono" }, s.name),
      el("td", { class: "mono" }, s.key), statusCell(s.status), el("td", { class: "num" }, s.attempts),
      el("td", {}, when(s.started_at)),
      el("td", { class: "num" }, s.status === "waiting" ? "-" : seconds(s.duration)),
      el("td", { class: "result" }, stepResult(s)))), "No step recorded yet."));
  const stepPager = el("div", { class: "pager" },
    w.steps_after ? jobPageLink("steps_after", null, "first steps") : null,
    w.steps_next ? jobPageLink("steps_after", w.steps_next, "next steps") : null);
  if (stepPager.childNodes.length) out.push(stepPager);
  if (w.children_total) {
    const from = w.children_after ? ` (after step ${w.children_after})` : "";
    out.push(el("h3", { "data-section": "children" }, `Children (${w.children_total})${from}`));
    out.push(el("div", { class: "chips", "data-child-counts": "1" },
      Object.entries(w.children_counts).sort().map(([status, n]) =>
        el("span", { class: `chip status-${status}`, "data-child-status": status }, `${status} ${n}`))));
    out.push(table(["step", "job", "task", "status", "attempts", "finished", "error"],
      w.children.map((c) => el("tr", { "data-child": c.job_id },
        el("td", { class: "num" }, c.seq), el("td", { class: "id" }, link("job", { id: c.job_id }, c.job_id)),
        el("td", {}, c.task_name, c.detached ? el("span", { class: "muted" }, " (detached)") : null),
        statusCell(c.status), el("td", { class: "num" }, c.attempts ?? "-"),
        el("td", {}, when(c.finished_at)), el("td", {}, c.error || "")))));
    const childPager = el("div", { class: "pager" },
      w.children_after ? jobPageLink("children_after", null, "first children") : null,
      w.children_next ? jobPageLink("children_after", w.children_next, "next children") : null);
    if (childPager.childNodes.length) out.push(childPager);
  }
  if (w.signals_total) {
    out.push(el("h3", { "data-section": "signals" }, `Unread signals (${w.signals_total})`));
    out.push(table(["id", "name", "sent", "key", "payload"], w.signals.map((g) => el("tr", { "data-signal": g.name },
      el("td", { class: "num" }, g.id), el("td", { class: "mono" }, g.name), el("td", {}, when(g.sent_at)),
      el("td", { class: "mono", "data-signal-idempotency": g.idempotency_key || "" }, g.idempotency_key || ""),
      el("td", { class: "result" }, clipped(g.payload, g.payload_length))))));
  }
  return out;
}

async function job() {
  const params = new URLSearchParams(location.search);
  const query = new URLSearchParams({ id: params.get("id") || "" });
  for (const name of ["steps_after", "children_after"]) if (params.get(name)) query.set(name, params.get(name));
  const j = await api(`job?${query}`);
  const w = j.workflow;
  const fields = [["id", j.job_id], ["name", j.job_name], ["task", j.task_name],
    ["status", j.status], ["queue", j.queue], ["priority", j.priority],
    ["attempts", `${j.attempts} (max retries ${j.max_retries})`], ["worker", j.worker_id || ""],
    ["created", when(j.created_at)], ["due", when(j.execution_time)], ["started", when(j.started_at)],
    ["finished", when(j.finished_at)], ["next retry", when(j.next_retry_at)]];
  if (w && w.wait) {
    fields.splice(4, 0, ["waits for", waitNode(w.wait.kind, w.wait.signal, w.wait.until, w.wait.children)]);
  }
  if (w && w.deadline) fields.push(["deadline", at(w.deadline)]);
  if (j.in_graph) fields.push(["graph", link("graph", { id: j.job_id }, "view its graph")]);
  // A batch task's job: the batch its latest batch attempt ran in, linked to its jobs.
  if (j.batch_id) {
    fields.push(["batch", el("span", {}, link("jobs", { batch: j.batch_id }, j.batch_id),
      ` (${j.batch_size} job${j.batch_size === 1 ? "" : "s"})`)]);
  }
  // Its concurrency key and limits, or its fair share key and weight.
  if (j.concurrency_key) {
    const limits = [j.ordered ? "ordered" : null,
      j.max_running_per_key && !j.ordered ? `${j.max_running_per_key} at once` : null,
      j.rate_limit_per_key].filter((x) => x);
    fields.push(["concurrency key", `${j.concurrency_key}${limits.length ? ` (${limits.join(", ")})` : ""}`]);
  }
  if (j.fair_share_key) {
    fields.push(["fair share key", `${j.fair_share_key} (weight ${j.fair_share_weight ?? 1})`]);
  }
  if (w && w.parent) {
    fields.push(["parent", el("span", {}, link("job", { id: w.parent.job_id }, w.parent.job_id),
      ` (${w.parent.task_name || "deleted"}${w.parent.status ? ", " + w.parent.status : ""}; step ${w.parent.seq})`)]);
  }
  const progress = j.progress === null || j.progress === undefined ? null
    : el("div", {}, el("div", { class: "bar" }, el("span", { style: `width:${Math.round(j.progress * 100)}%` })),
      `${Math.round(j.progress * 100)} % ${j.progress_message || ""}`);
  // A failed job's page opens on why: its error and its last traceback.
  const tries = j.attempt_history.filter((a) => a.traceback);
  const traceback = j.traceback || (tries.length ? tries[tries.length - 1].traceback : null);
  const failure = j.status === "failed" && (j.error || traceback) ? el("section",
    { class: "failure", "data-section": "failure" },
    el("h3", {}, "Error"), el("pre", { "data-field": "error" }, j.error || ""),
    traceback ? [el("h3", {}, "Last traceback"), el("pre", { "data-field": "traceback" }, traceback)] : null)
    : null;
  return [
    el("h2", {}, "Job ", el("span", { class: "mono" }, j.job_id), " ",
      el("span", { class: `status status-${j.status}` }, j.status)), jobActions(j),
    workflowControls(j, w),
    failure,
    el("dl", { class: "fields", "data-job-status": j.status },
      fields.map(([k, v]) => [el("dt", {}, k), el("dd", { "data-field": k }, v)])),
    progress && el("h3", {}, "Progress"), progress,
    workflowSections(w),
    el("h3", {}, "Arguments"),
    el("pre", { "data-field": "arguments" }, JSON.stringify({ args: j.args, kwargs: j.kwargs }, null, 2)),
    el("h3", {}, "Result"), el("pre", {}, JSON.stringify(j.result, null, 2)),
    !failure && j.error && el("h3", {}, "Error"), !failure && j.error && el("pre", {}, j.error),
    !failure && j.traceback && el("pre", {}, j.traceback),
    el("h3", {}, "Attempts"),
    table(["attempt", "outcome", "worker", "started", "finished", "error"],
      j.attempt_history.map((a) => [el("tr", {}, el("td", { class: "num" }, a.attempt),
        el("td", {}, a.outcome || "running"), el("td", { class: "mono" }, a.worker_id || ""),
        el("td", {}, when(a.started_at)), el("td", {}, when(a.finished_at)), el("td", {}, a.error || "")),
        a.traceback ? el("tr", {}, el("td", { colSpan: 6 }, el("pre", {}, a.traceback))) : null]),
      "No attempt yet."),
    el("h3", {}, "Timeline"),
    table(["when", "what"], j.timeline.map((t) => el("tr", {}, el("td", {}, when(t.at)), el("td", {}, t.what)))),
  ];
}

async function workers() {
  const d = await api("workers");
  return [el("h2", {}, "Workers"),
    table(["worker", "host", "pid", "alive", "last heartbeat", "started", "slots", "running", "tasks"],
      d.workers.map((w) => el("tr", { "data-worker": w.worker_id },
        el("td", { class: "mono" }, w.worker_id), el("td", {}, w.hostname), el("td", { class: "num" }, w.pid),
        el("td", {}, w.alive ? "yes" : "NO"), el("td", {}, when(w.last_seen)), el("td", {}, when(w.started_at)),
        el("td", { class: "num" }, w.max_concurrent),
        el("td", { "data-running": w.running.length }, w.running.length ? w.running.map((r) =>
          el("div", {}, link("job", { id: r.job_id }, r.job_id), ` ${r.task_name}`)) : "0"),
        el("td", { "data-tasks": "1" }, [...new Set(w.tasks)].join(", ")))), "No workers registered."),
  ];
}

async function queues() {
  const d = await api("queues");
  return [el("h2", {}, "Queues"),
    d.named_queues ? null : el("p", { class: "muted" },
      "This schema has no named queues: every job is in \"default\"."),
    table(["queue", "state", ...STATUSES, "due", "settings", ""], d.queues.map((q) => el("tr", { "data-queue": q.queue },
      el("td", {}, link("jobs", { queue: q.queue }, q.queue)), el("td", {}, q.paused ? "paused" : "active"),
      STATUSES.map((s) => el("td", { class: "num" }, q.counts[s] || 0)), el("td", { class: "num" }, q.due),
      el("td", { class: "mono" }, Object.keys(q.settings).length ? JSON.stringify(q.settings) : ""),
      el("td", {}, d.named_queues ? (q.paused ? actionButton("resume", { queue: q.queue })
        : actionButton("pause", { queue: q.queue }, "pause", true)) : "")))),
    d.keys && d.keys.length ? el("h3", {}, "Busiest concurrency keys") : null,
    d.keys && d.keys.length ? table(["key", "running", "max running", "waiting", "rate limit", "started in window", "ordered"],
      d.keys.map((k) => el("tr", { "data-key": k.key },
        el("td", { class: "mono" }, k.key), el("td", { class: "num" }, k.running),
        el("td", { class: "num" }, k.max_running_per_key ?? ""), el("td", { class: "num" }, k.waiting),
        el("td", {}, k.rate_limit_per_key || ""), el("td", { class: "num" }, k.started_in_window ?? ""),
        el("td", {}, k.ordered ? "yes" : "")))) : null,
    d.fair_share && d.fair_share.length ? el("h3", {}, "Fair share keys") : null,
    d.fair_share && d.fair_share.length ? table(["key", "weight", "waiting", "due", "running", "recent starts", "share"],
      d.fair_share.map((f) => el("tr", { "data-fair-key": f.key },
        el("td", { class: "mono" }, f.key), el("td", { class: "num" }, f.weight ?? "jobs'"),
        el("td", { class: "num" }, f.waiting), el("td", { class: "num" }, f.due),
        el("td", { class: "num" }, f.running), el("td", { class: "num" }, f.recent_starts.toFixed(1)),
        el("td", { class: "num", "data-share": f.share }, `${(f.share * 100).toFixed(1)} %`)))) : null,
  ];
}

async function periodic() {
  const d = await api("periodic");
  return [el("h2", {}, "Periodic jobs"),
    table(["job", "dedup key", "schedule", "enabled", "next run", "last run", "last outcome", "last error", ""],
      d.periodic.map((p) => el("tr", { "data-periodic": p.dedup_key },
        el("td", {}, p.job_name), el("td", { class: "mono" }, p.dedup_key), el("td", { class: "mono" }, p.schedule),
        el("td", {}, p.enabled ? "yes" : "no"), el("td", {}, p.enabled ? when(p.next_run) : ""),
        el("td", {}, p.last_job_id ? link("job", { id: p.last_job_id }, when(p.last_run)) : when(p.last_run)),
        el("td", {}, p.last_outcome || ""), el("td", {}, p.last_error || ""),
        el("td", {}, el("div", { class: "actions" },
          p.enabled ? actionButton("disable", { key: p.dedup_key }) : actionButton("enable", { key: p.dedup_key }),
          actionButton("trigger", { key: p.dedup_key }))))),
      "No periodic jobs stored (a worker stores them when it starts)."),
  ];
}

// Pages other files define (graph.js: workflows, graph) add their renderer
// here, and in CHANGE a test of a live event: whether it concerns the page
// (without one, every event refreshes it).
const RENDER = { overview, jobs, job, workers, queues, periodic };
const CHANGE = {};

// -- refresh: live events, polling as the fallback ------------------------------------

let refreshTimer = null, trailingTimer = null, rendering = false, again = false;
// A page with its own test of events (CHANGE) re-reads at most every THROTTLE_MS on them.
const THROTTLE_MS = 400;
let lastRefresh = 0, soonTimer = null;

async function refresh() {
  if (rendering) { again = true; return; }
  lastRefresh = Date.now();
  rendering = true;
  try {
    const nodes = await RENDER[PAGE]();
    // A renderer that updated the page in place returns nothing.
    if (nodes === undefined) { main.dataset.loaded = String(Date.now()); return; }
    // Keep what the user is typing in a filter form.
    if (document.activeElement && main.contains(document.activeElement)
        && document.activeElement.tagName !== "BUTTON") return;
    main.replaceChildren(...nodes.flat().filter((n) => n));
    main.dataset.loaded = String(Date.now());
  } catch (err) {
    main.replaceChildren(el("p", { class: "status-failed", "data-error": "1" }, String(err.message || err)));
  } finally {
    rendering = false;
    if (again) { again = false; scheduleRefresh(250); }
  }
}

function scheduleRefresh(delay) {
  clearTimeout(refreshTimer);
  refreshTimer = setTimeout(refresh, delay);
}

function setMode(text, cls) {
  const node = document.getElementById("live");
  node.textContent = text;
  node.className = `pill ${cls}`;
}

let stream = null;

function connect() {
  if (!window.EventSource) { setMode("polling", "poll"); return; }
  if (stream) stream.close();
  const source = new EventSource(`${BASE}/api/stream`);
  stream = source;
  source.addEventListener("mode", (e) => {
    const live = JSON.parse(e.data).live;
    setMode(live ? "live" : "polling", live ? "live" : "poll");
    if (!live) source.close();
  });
  source.addEventListener("change", (e) => {
    const concerns = CHANGE[PAGE];
    if (concerns) {
      if (concerns(JSON.parse(e.data)) && soonTimer === null) {
        soonTimer = setTimeout(() => { soonTimer = null; refresh(); },
          Math.max(150, lastRefresh + THROTTLE_MS - Date.now()));
      }
      return;
    }
    scheduleRefresh(150);
    // The server reuses an overview for up to a second: look once more after it.
    clearTimeout(trailingTimer);
    trailingTimer = setTimeout(refresh, 1200);
  });
  source.onerror = () => setMode("polling", "poll");
}

function setup() {
  for (const a of document.querySelectorAll("nav a")) {
    if (a.dataset.nav === PAGE || (PAGE === "job" && a.dataset.nav === "jobs")
        || (PAGE === "graph" && a.dataset.nav === "workflows")) a.classList.add("current");
  }
  document.getElementById("mode").textContent = REPLICA ? "read replica: read-only"
    : READ_ONLY ? "read-only" : "actions need the token";
  const token = document.getElementById("token");
  if (!READ_ONLY) {
    token.hidden = false;
    token.value = sessionStorage.getItem("pg_scheduler_token") || "";
    token.addEventListener("input", () => sessionStorage.setItem("pg_scheduler_token", token.value));
  }
  refresh();
  connect();
  // A page left (or kept in the back/forward cache) lets its stream go: a
  // browser opens only a few connections per server, and each stream holds one.
  window.addEventListener("pagehide", () => { if (stream) { stream.close(); stream = null; } });
  window.addEventListener("pageshow", (e) => { if (e.persisted) { connect(); refresh(); } });
  // Heartbeats and due times change without events: poll slowly regardless.
  setInterval(() => { if (!document.hidden) refresh(); }, POLL_MS);
}

// After every script of the shell has run (graph.js adds its pages).
document.addEventListener("DOMContentLoaded", setup);
