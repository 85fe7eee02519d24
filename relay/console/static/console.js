
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
