"""The console's stylesheet and script, served from /static/ (the Content-Security-Policy allows
no inline script or style). Kept here as text so the package needs no data files.

The script does two things: it refreshes a live page (the overview, one message) by fetching it
again and swapping its main element, and it runs actions: a dry run through the JSON API, a
dialog with the summary of what will change, then the action itself on confirmation.
"""

from __future__ import annotations

CSS = """
:root { --fg: #1d2430; --muted: #5f6b7a; --line: #d8dee6; --bg: #f6f8fa; --accent: #1f6feb;
        --ok: #1a7f37; --warn: #9a6700; --bad: #cf222e; font-family: system-ui, sans-serif; }
body { margin: 0; color: var(--fg); background: #fff; font-size: 14px; }
header { display: flex; gap: 1.5em; align-items: center; padding: .6em 1.2em;
         border-bottom: 1px solid var(--line); background: var(--bg); }
header .brand { font-weight: 700; color: var(--fg); text-decoration: none; }
header nav a { margin-right: 1em; }
header .who { margin-left: auto; color: var(--muted); }
header .who form { display: inline; }
main { padding: 1em 1.2em 3em; max-width: 1280px; }
a { color: var(--accent); }
h1 { font-size: 1.4em; margin: .2em 0 .6em; }
h2 { font-size: 1.1em; margin: 1.4em 0 .5em; }
table { border-collapse: collapse; width: 100%; margin: .4em 0; }
th, td { text-align: left; padding: .3em .6em; border-bottom: 1px solid var(--line);
         vertical-align: top; }
th { color: var(--muted); font-weight: 600; background: var(--bg); }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
td.error { max-width: 38em; overflow-wrap: anywhere; }
code, pre, .id { font-family: ui-monospace, monospace; font-size: 12.5px; }
pre { background: var(--bg); border: 1px solid var(--line); padding: .8em; overflow: auto;
      max-height: 32em; white-space: pre-wrap; overflow-wrap: anywhere; }
.cards { display: flex; flex-wrap: wrap; gap: .8em; }
.card { border: 1px solid var(--line); border-radius: 6px; padding: .6em 1em; min-width: 7em;
        color: inherit; text-decoration: none; }
.card:hover { border-color: var(--accent); }
.card .n { font-size: 1.6em; font-weight: 600; }
.card .label { color: var(--muted); }
.state { padding: 0 .4em; border-radius: 4px; background: var(--bg); }
.state-dead, .state-open { color: var(--bad); }
.state-pending, .state-in_flight, .state-half_open { color: var(--warn); }
.state-published, .state-closed { color: var(--ok); }
.muted { color: var(--muted); }
.note { color: var(--muted); margin: .3em 0; }
.problem { color: var(--bad); font-weight: 600; }
.charts { display: flex; flex-wrap: wrap; gap: 1em; }
figure.chart { margin: 0; flex: 1 1 360px; max-width: 760px; }
figure.chart svg { width: 100%; height: auto; border: 1px solid var(--line); }
figcaption { font-weight: 600; margin-bottom: .3em; }
.legend { display: block; font-weight: 400; font-size: 12px; }
.key { margin-right: 1em; }
.key::before { content: ""; display: inline-block; width: .8em; height: .8em;
               margin-right: .3em; border-radius: 2px; background: currentColor; }
.line { fill: none; stroke-width: 2; }
.grid { stroke: var(--line); }
.axis, .empty { fill: var(--muted); font-size: 11px; }
.s-published { color: var(--ok); stroke: var(--ok); }
.s-failed { color: var(--warn); stroke: var(--warn); }
.s-dead { color: var(--bad); stroke: var(--bad); }
.s-ready { color: var(--accent); stroke: var(--accent); }
.s-pending { color: #8250df; stroke: #8250df; }
.s-in_flight { color: var(--warn); stroke: var(--warn); }
form.filters { display: flex; flex-wrap: wrap; gap: .5em; align-items: end; margin: .5em 0; }
form.filters label { display: flex; flex-direction: column; font-size: 12px;
                     color: var(--muted); }
input, select, button { font: inherit; padding: .25em .4em; }
input[name="priority"] { width: 5em; }
input[name="in"] { width: 5em; }
button { cursor: pointer; border: 1px solid var(--line); border-radius: 4px; background: #fff; }
button.danger { color: var(--bad); }
.actions { display: flex; flex-wrap: wrap; gap: .6em; align-items: center; margin: .6em 0;
           padding: .5em; background: var(--bg); border: 1px solid var(--line);
           border-radius: 6px; }
.actions form { display: flex; gap: .3em; align-items: center; }
.paging { display: flex; gap: 1em; margin: .6em 0; }
dl.fields { display: grid; grid-template-columns: max-content 1fr; gap: .2em 1em; }
dl.fields dt { color: var(--muted); }
dl.fields dd { margin: 0; overflow-wrap: anywhere; }
dialog { border: 1px solid var(--line); border-radius: 8px; max-width: 36em; }
dialog menu { display: flex; gap: .6em; justify-content: end; padding: 0; }
#result { margin: .5em 1.2em 0; font-weight: 600; }
#result:empty { display: none; }
.login { max-width: 24em; display: flex; flex-direction: column; gap: .6em; }
"""

JS = """
'use strict';
const csrf = () => document.querySelector('meta[name="csrf-token"]')?.content || '';

async function post(url, body) {
  const res = await fetch(url, {
    method: 'POST', credentials: 'same-origin',
    headers: {'Content-Type': 'application/json', 'X-CSRF-Token': csrf()},
    body: JSON.stringify(body),
  });
  let json = {};
  try { json = await res.json(); } catch (e) { json = {error: res.statusText}; }
  return {status: res.status, ok: res.ok, json};
}

function request(form) {
  const body = {};
  const data = new FormData(form);
  for (const [name, value] of data.entries()) {
    if (name === 'at' && value) body.at = new Date(value).toISOString();
    else if (value !== '') body[name] = value;
  }
  const target = form.dataset.target;
  if (target === 'selection') {
    body.ids = [...document.querySelectorAll('input.pick:checked')].map((i) => i.value);
  } else if (target === 'group') {
    body.filter = JSON.parse(form.dataset.filter || '{}');
  }
  return body;
}

function ask(summary, canGo) {
  const dialog = document.getElementById('confirm');
  const go = document.getElementById('confirm-go');
  document.getElementById('confirm-summary').textContent = summary;
  go.hidden = !canGo;
  dialog.showModal();
  return new Promise((resolve) => {
    dialog.onclose = () => resolve(dialog.returnValue === 'go');
  });
}

function tell(text, problem) {
  const result = document.getElementById('result');
  result.textContent = text;
  result.className = problem ? 'problem' : '';
}

async function act(form) {
  const body = request(form);
  if (form.dataset.target === 'selection' && body.ids.length === 0) {
    tell('Select messages first.', true);
    return;
  }
  const url = form.dataset.url;
  const dry = await post(url, {...body, dry_run: true});
  if (!dry.ok) { tell(dry.json.error || `failed (${dry.status})`, true); return; }
  if (!await ask(dry.json.summary, dry.json.would_change !== 0)) return;
  const done = await post(url, body);
  const text = done.json.summary || done.json.error || `failed (${done.status})`;
  sessionStorage.setItem('outbox-console-result', JSON.stringify([text, !done.ok]));
  location.reload();
}

async function live() {
  const seconds = Number(document.body.dataset.live || 0);
  if (!seconds) return;
  setInterval(async () => {
    if (document.querySelector('dialog[open]') || document.hidden) return;
    const active = document.activeElement;
    if (active && active.closest('#live form')) return;
    const res = await fetch(location.href, {credentials: 'same-origin'});
    if (!res.ok) return;
    const page = new DOMParser().parseFromString(await res.text(), 'text/html');
    const fresh = page.getElementById('live');
    if (fresh) document.getElementById('live').replaceWith(fresh);
  }, seconds * 1000);
}

document.addEventListener('submit', (event) => {
  const form = event.target.closest('form[data-url]');
  if (!form) return;
  event.preventDefault();
  act(form).catch((e) => tell(String(e), true));
});

document.addEventListener('change', (event) => {
  if (event.target.id !== 'pick-all') return;
  for (const box of document.querySelectorAll('input.pick')) box.checked = event.target.checked;
});

document.addEventListener('DOMContentLoaded', () => {
  const saved = sessionStorage.getItem('outbox-console-result');
  if (saved) {
    sessionStorage.removeItem('outbox-console-result');
    const [text, problem] = JSON.parse(saved);
    tell(text, problem);
  }
  document.body.dataset.ready = '1';
  live();
});
"""
