// runq console: the little the pages need beyond HTML. Works without it, too.
"use strict";

// "Select all" for the bulk form: toggles every checkbox named by data-select-all.
document.addEventListener("change", (event) => {
  const box = event.target;
  if (!(box instanceof HTMLInputElement) || !box.dataset.selectAll) return;
  const form = box.closest("form") || document;
  for (const item of form.querySelectorAll(`input[type=checkbox][name="${box.dataset.selectAll}"]`)) {
    item.checked = box.checked;
  }
});

// Live updates: at most one EventSource per page, on whichever of these the page has.
// Every value arrives as text or as HTML the server rendered (autoescaped); nothing from
// an event is ever evaluated.

// The overview: <body data-live>. A "stats" event carries {name: value}; every element
// with data-live-stat="name" shows the new value. A "fragment" event carries {id: html}:
// the element with that id is replaced (a <details> inside keeps its open state).
function connectStats(url) {
  const source = new EventSource(url);
  source.addEventListener("stats", (event) => {
    let values;
    try { values = JSON.parse(event.data); } catch { return; }
    for (const [name, value] of Object.entries(values)) {
      for (const el of document.querySelectorAll(`[data-live-stat="${CSS.escape(name)}"]`)) {
        const text = String(value);
        if (el.textContent !== text) el.textContent = text;
      }
    }
  });
  source.addEventListener("fragment", (event) => {
    let parts;
    try { parts = JSON.parse(event.data); } catch { return; }
    for (const [id, html] of Object.entries(parts)) {
      const el = document.getElementById(id);
      if (!el) continue;
      const opened = [...el.querySelectorAll("details")].map((d) => d.open);
      el.outerHTML = html;
      const fresh = document.getElementById(id);
      if (fresh) fresh.querySelectorAll("details").forEach((d, i) => { d.open = !!opened[i]; });
    }
  });
  return source;
}

// The runs table: #results[data-live-runs]. A "rows" event carries the table body and the
// count as HTML; selected rows stay selected and a focused checkbox keeps its focus.
let rowsSource = null;
let rowsUrl = null;
function connectRows() {
  const results = document.querySelector("[data-live-runs]");
  const url = results ? results.dataset.liveRuns : null;
  if (url === rowsUrl) return;
  if (rowsSource) rowsSource.close();
  rowsSource = null;
  rowsUrl = url;
  if (!url) return;
  rowsSource = new EventSource(url);
  rowsSource.addEventListener("rows", (event) => {
    let update;
    try { update = JSON.parse(event.data); } catch { return; }
    const body = document.getElementById("run-rows");
    const count = document.getElementById("run-count");
    if (!body) return;
    const checked = new Set([...body.querySelectorAll("input[name=ids]:checked")].map((b) => b.value));
    const focused = document.activeElement instanceof HTMLInputElement && body.contains(document.activeElement)
      ? document.activeElement.value : null;
    body.innerHTML = update.rows;
    for (const box of body.querySelectorAll("input[name=ids]")) {
      if (checked.has(box.value)) box.checked = true;
      if (box.value === focused) box.focus();
    }
    if (count && count.textContent.trim() !== update.count.trim()) count.textContent = update.count.trim();
    // A reconnect resumes from what the page shows now, not from what it first showed.
    const base = rowsUrl.replace(/([?&])v=[^&]*/, `$1v=${encodeURIComponent(update.version)}`);
    if (results) results.dataset.liveRuns = base;
    rowsUrl = base;
  });
}

// The run page: #timeline[data-live-events]. Each "timeline" event is one item of the
// run's event log; the stream ends with the run's final event.
const STATUS_OF_KIND = {
  claimed: "running", paused: "paused", completed: "completed", failed: "failed",
  cancelled: "cancelled", continued: "queued", requeued: "queued", released: "queued",
  retry_scheduled: "queued", reaped: "queued",
};
const FINAL_KINDS = new Set(["completed", "failed", "cancelled"]);

function timelineItem(item) {
  const li = document.createElement("li");
  li.dataset.seq = String(item.seq);
  const time = document.createElement("time");
  const at = new Date(item.at * 1000);
  time.dateTime = at.toISOString().replace(/\.\d+Z$/, "+00:00");
  time.textContent = at.toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
  const kind = document.createElement("span");
  kind.className = "event-kind";
  kind.textContent = item.kind;
  const attempt = document.createElement("span");
  attempt.className = "event-attempt";
  attempt.textContent = `attempt ${item.attempt}`;
  li.append(time, " ", kind, " ", attempt);
  if (item.data !== null && item.data !== undefined) {
    const data = document.createElement("code");
    data.className = "event-data";
    data.textContent = JSON.stringify(item.data);
    li.append(" ", data);
  }
  return li;
}

function connectTimeline(list) {
  const source = new EventSource(list.dataset.liveEvents);
  source.addEventListener("timeline", (event) => {
    let item;
    try { item = JSON.parse(event.data); } catch { return; }
    if (list.querySelector(`li[data-seq="${CSS.escape(String(item.seq))}"]`)) return;
    list.append(timelineItem(item));
    const empty = document.getElementById("timeline-empty");
    if (empty) empty.remove();
    const status = STATUS_OF_KIND[item.kind];
    const badge = document.getElementById("run-status");
    if (status && badge && badge.textContent !== status) {
      badge.textContent = status;
      badge.className = `badge badge-${status}`;
      const note = document.getElementById("run-live-note");
      if (note) note.textContent = `The run is now ${status}. Reload the page for its current fields and actions.`;
    }
    // The log is complete: without this the browser would reconnect for nothing.
    if (FINAL_KINDS.has(item.kind)) source.close();
  });
  return source;
}

function connectLive() {
  if (!window.EventSource) return;
  const stats = document.body.dataset.live;
  if (stats) { connectStats(stats); return; }
  const timeline = document.querySelector("#timeline[data-live-events]");
  if (timeline) { connectTimeline(timeline); return; }
  connectRows();
}
document.addEventListener("DOMContentLoaded", connectLive);
// The filter form swaps #results in place (htmx): follow the new view's stream.
document.addEventListener("htmx:afterSettle", () => { if (window.EventSource) connectRows(); });
