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

// Live updates: one EventSource per page on <body data-live>. A "stats" event carries
// {name: value}; every element with data-live-stat="name" shows the new value.
function connectLive() {
  const url = document.body.dataset.live;
  if (!url || !window.EventSource) return;
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
}
document.addEventListener("DOMContentLoaded", connectLive);
