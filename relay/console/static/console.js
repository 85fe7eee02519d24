
'use strict';
// The session is kept in this origin's storage, not in a cookie (browsers send a host's cookies
// to every port of it), and sent as a header, which no other site's page can send here.
const KEY = 'outbox-console-session';
const session = () => localStorage.getItem(KEY) || '';
const withSession = () => (session() ? {'X-Console-Session': session()} : {});

async function post(url, body) {
  const res = await fetch(url, {
    method: 'POST', credentials: 'omit',
    headers: {'Content-Type': 'application/json', ...withSession()},
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
  // A group acts only on what the dry run counted (the server answers 409 if that changed).
  if (dry.json.bound) body.bound = dry.json.bound;
  const done = await post(url, body);
  const text = done.json.summary || done.json.error || `failed (${done.status})`;
  sessionStorage.setItem('outbox-console-result', JSON.stringify([text, !done.ok]));
  location.reload();
}

async function fetchPage() {
  const res = await fetch(location.href, {credentials: 'omit', headers: withSession()});
  if (!res.ok) return {status: res.status, page: null};
  return {status: res.status, page: new DOMParser().parseFromString(await res.text(), 'text/html')};
}

function swap(page) {
  for (const selector of ['#live', 'header .who']) {
    const fresh = page.querySelector(selector);
    if (fresh) document.querySelector(selector).replaceWith(fresh);
  }
}

async function live() {
  const seconds = Number(document.body.dataset.live || 0);
  if (!seconds) return;
  setInterval(async () => {
    if (document.querySelector('dialog[open]') || document.hidden) return;
    const active = document.activeElement;
    if (active && active.closest('#live form')) return;
    const {page} = await fetchPage();
    if (page) swap(page);
  }, seconds * 1000);
}

// A page served without credentials: fetch it again with the session, or log in.
async function withStoredSession() {
  if (!session()) { location.replace('/login'); return false; }
  const {status, page} = await fetchPage();
  if (!page) {
    if (status === 401) { localStorage.removeItem(KEY); location.replace('/login'); }
    else tell(`failed (${status})`, true);
    return false;
  }
  swap(page);
  document.title = page.title;
  document.body.dataset.live = page.body.dataset.live || '';
  return true;
}

async function logout() {
  await fetch('/logout', {method: 'POST', credentials: 'omit', headers: withSession()});
  localStorage.removeItem(KEY);
  location.assign('/login');
}

document.addEventListener('submit', (event) => {
  if (event.target.closest('form.logout')) {
    event.preventDefault();
    logout().catch((e) => tell(String(e), true));
    return;
  }
  if (event.target.closest('form.filters')) {
    // A blank field filters nothing: left out, so that `exchange=` can mean the default exchange.
    for (const input of event.target.querySelectorAll('input')) input.disabled = !input.value;
    return;
  }
  const form = event.target.closest('form[data-url]');
  if (!form) return;
  event.preventDefault();
  act(form).catch((e) => tell(String(e), true));
});

document.addEventListener('change', (event) => {
  if (event.target.id !== 'pick-all') return;
  for (const box of document.querySelectorAll('input.pick')) box.checked = event.target.checked;
});

document.addEventListener('DOMContentLoaded', async () => {
  const signedIn = document.querySelector('meta[name="console-session"]');
  if (signedIn) {
    localStorage.setItem(KEY, signedIn.content);
    location.replace('/');
    return;
  }
  if (document.querySelector('meta[name="console-needs-session"]') &&
      !await withStoredSession()) return;
  const saved = sessionStorage.getItem('outbox-console-result');
  if (saved) {
    sessionStorage.removeItem('outbox-console-result');
    const [text, problem] = JSON.parse(saved);
    tell(text, problem);
  }
  document.body.dataset.ready = '1';
  live();
});
