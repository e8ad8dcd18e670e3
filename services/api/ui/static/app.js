// The jetflow operator UI: a page per hash route, each read from and
// acting through the api's /v1 routes with the operator's token. Values
// from the api are only ever set as text (never as HTML): an execution's
// input, output or event data cannot become markup or script.
'use strict';

const STATUSES = ['started', 'cancelling', 'suspended', 'succeeded', 'failed', 'cancelled'];
const TERMINAL = new Set(['succeeded', 'failed', 'cancelled']);
const LIST_POLL_MS = 750;
const EXEC_POLL_MS = 2000;
// MAX_ROWS is how many of an execution's events its page shows (the latest).
const MAX_ROWS = 1000;

// SCOPE_OF is the scope the api's route table asks for each thing the UI
// does; STATUS_ACTIONS the actions the dispatcher accepts on an execution
// in each status (projections.Status.ActionRefused, and a signal until
// the execution has ended). The UI offers only those, and those the
// token's scopes allow; the api still checks every request. Both are
// JSON between their markers: an api test holds them to the server's rules.
const SCOPE_OF = /* begin scope-of */ {
  "cancel": "operate", "force-cancel": "operate", "kill": "operate", "resume": "operate", "force-resume": "operate",
  "replay": "operate", "clear-lock": "operate", "signal": "signal", "start": "start"
} /* end scope-of */;
const STATUS_ACTIONS = /* begin status-actions */ {
  "started": ["cancel", "force-cancel", "kill", "resume", "force-resume", "replay", "signal"],
  "cancelling": ["force-cancel", "kill", "signal"],
  "suspended": ["cancel", "force-cancel", "kill", "resume", "force-resume", "replay", "signal"],
  "succeeded": ["replay"],
  "failed": ["resume", "force-resume", "replay"],
  "cancelled": ["resume", "force-resume", "replay"]
} /* end status-actions */;

const session = {
  get token() { return sessionStorage.getItem('jetflow.token') || ''; },
  set token(v) { v ? sessionStorage.setItem('jetflow.token', v) : sessionStorage.removeItem('jetflow.token'); },
  get ns() { return sessionStorage.getItem('jetflow.namespace') || ''; },
  set ns(v) { v ? sessionStorage.setItem('jetflow.namespace', v) : sessionStorage.removeItem('jetflow.namespace'); },
};

// ---- the api ----

class APIError extends Error {
  constructor(status, body) {
    const e = (body && body.error) || {};
    super(e.message || `HTTP ${status}`);
    this.status = status;
    this.code = e.code || '';
    this.field = e.field || '';
  }
}

function headers(extra) {
  const h = Object.assign({}, extra);
  if (session.token) h['Authorization'] = 'Bearer ' + session.token;
  if (session.ns) h['Jetflow-Namespace'] = session.ns;
  return h;
}

async function api(method, path, body, signal) {
  const init = { method, headers: headers({ Accept: 'application/json' }), signal };
  if (body !== undefined) {
    init.headers['Content-Type'] = 'application/json';
    init.body = typeof body === 'string' ? body : JSON.stringify(body);
  }
  const resp = await fetch(path, init);
  const text = await resp.text();
  let data = null;
  if (text) {
    try { data = JSON.parse(text); } catch (_) { data = null; }
  }
  if (resp.status === 401) {
    const back = location.hash;
    if (!back.startsWith('#/login')) location.hash = '#/login?next=' + encodeURIComponent(back);
    throw new APIError(401, data);
  }
  if (!resp.ok) throw new APIError(resp.status, data);
  return { status: resp.status, data };
}

// ---- who the token is ----

// me is GET /v1/whoami's answer for the session's token (null until
// asked, or when the api could not say: then every action is offered and
// the api decides).
let me = null;

async function whoami() {
  if (me && me.token === session.token && me.ns === session.ns) return me.who;
  me = null;
  const res = await api('GET', '/v1/whoami');
  me = { token: session.token, ns: session.ns, who: res.data };
  return me.who;
}

// can reports whether the token holds scope (admin holds every other).
function can(scope) {
  const s = (me && me.who && me.who.scopes) || null;
  return !s || s.includes(scope) || s.includes('admin');
}

// gate disables el when the token lacks the scope what needs, saying
// which in its title.
function gate(el, what) {
  const scope = SCOPE_OF[what];
  if (!scope || can(scope)) return el;
  el.disabled = true;
  el.title = `needs the scope ${scope}; this token holds ${(me.who.scopes || []).join(', ') || 'none'}`;
  el.dataset.needs = scope;
  return el;
}

// ---- the DOM, as text ----

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'class') el.className = v;
    else if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else if (k === 'value') el.value = v;
    else if (k === 'checked') el.checked = !!v;
    else el.setAttribute(k, v === true ? '' : String(v));
  }
  el.append(...nodes(children));
  return el;
}

// nodes flattens children into nodes, strings as text, leaving out
// undefined, null and false (what `cond ? x : null` gives).
function nodes(children) {
  const out = [];
  for (const c of [children].flat(Infinity)) {
    if (c === undefined || c === null || c === false) continue;
    out.push(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return out;
}

// fill replaces el's children.
function fill(el, ...children) {
  el.replaceChildren(...nodes(children));
}

function statusBadge(s, testid) {
  if (!s) return h('span', { class: 'muted', 'data-testid': testid }, '—');
  return h('span', { class: 'status st-' + s, 'data-testid': testid }, s);
}

function time(t) {
  if (!t || t.startsWith('0001-')) return '';
  const d = new Date(t);
  return isNaN(d) ? t : d.toLocaleString(undefined, { hour12: false }) + '.' + String(d.getMilliseconds()).padStart(3, '0');
}

function duration(a, b) {
  if (!a || !b || a.startsWith('0001-') || b.startsWith('0001-')) return '';
  const ms = new Date(b) - new Date(a);
  if (!(ms >= 0)) return '';
  if (ms < 1000) return ms + ' ms';
  if (ms < 60000) return (ms / 1000).toFixed(2) + ' s';
  const s = Math.round(ms / 1000);
  if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
  const m = Math.round(s / 60);
  return m < 1440 ? `${Math.floor(m / 60)} h ${m % 60} min` : `${Math.floor(m / 1440)} d ${Math.floor((m % 1440) / 60)} h`;
}

function json(v) {
  if (v === undefined || v === null) return '';
  try { return JSON.stringify(v, null, 2); } catch (_) { return String(v); }
}

function notice(msg, isError) {
  return h('div', { class: 'notice' + (isError ? ' error' : ''), role: isError ? 'alert' : 'status', 'data-testid': isError ? 'error' : 'notice' }, msg);
}

function explain(err) {
  if (err instanceof APIError) return (err.field ? err.field + ': ' : '') + err.message + (err.status ? ` (HTTP ${err.status})` : '');
  return String(err && err.message || err);
}

// ---- pages and their lifetimes ----

// page holds what the shown page started (timers, streams): all stopped
// when another page is shown.
let page = { stops: [] };

function newPage() {
  for (const stop of page.stops) stop();
  const ac = new AbortController();
  page = { stops: [() => ac.abort()], signal: ac.signal };
  return page;
}

// every runs fn every ms while the page is shown and the tab visible,
// waiting at least three times as long as fn took: a slow api (a big
// store, a loaded machine) is asked less often, not more.
function every(p, ms, fn) {
  let t = null;
  let stopped = false;
  const tick = async () => {
    if (stopped) return;
    let took = 0;
    if (!document.hidden) {
      const began = performance.now();
      try { await fn(); } catch (_) { /* shown by fn */ }
      took = performance.now() - began;
    }
    if (!stopped) t = setTimeout(tick, Math.max(ms, 3 * took));
  };
  p.stops.push(() => { stopped = true; clearTimeout(t); });
  t = setTimeout(tick, ms);
}

function show(...children) {
  fill(document.getElementById('main'), ...children);
}

function parseHash() {
  const raw = location.hash.replace(/^#/, '') || '/executions';
  const [path, query] = raw.split('?');
  return { parts: path.split('/').filter(Boolean).map(decodeURIComponent), query: new URLSearchParams(query || '') };
}

async function route() {
  const p = newPage();
  const { parts, query } = parseHash();
  const section = parts[0] || 'executions';
  for (const a of document.querySelectorAll('header nav a')) a.classList.toggle('on', a.dataset.nav === section);
  try {
    if (section !== 'login' && (session.token || !me)) {
      // Who the token is, once per token: what the pages offer follows it.
      await whoami().catch((err) => { if (err.status === 401) throw err; });
    }
    renderWho();
    if (section === 'login') return loginPage(query);
    if (section === 'executions' && parts[1]) return await executionPage(p, parts[1]);
    if (section === 'executions') return await executionsPage(p, query);
    if (section === 'workflows' && parts[1]) return await workflowPage(p, parts[1], query);
    if (section === 'workflows') return await workflowsPage(p);
    if (section === 'locks') return await locksPage(p);
    show(h('h1', null, 'Not found'), h('p', null, 'No page ', h('code', null, location.hash), '. ', h('a', { href: '#/executions' }, 'Executions')));
  } catch (err) {
    if (err instanceof APIError && err.status === 401) return;
    if (err.name === 'AbortError') return;
    show(notice(explain(err), true));
  }
}

function renderWho() {
  const who = document.getElementById('who');
  const parts = [];
  const w = me && me.token === session.token ? me.who : null;
  if (w) parts.push(w.subject + ' (' + ((w.scopes || []).join(', ') || 'no scope') + ')');
  else parts.push(session.token ? 'token set' : 'no token');
  if (session.ns) parts.push('namespace ' + session.ns);
  fill(who, parts.join(' · '),
    h('button', { type: 'button', onclick: () => { location.hash = '#/login'; } }, session.token ? 'Change' : 'Log in'),
    session.token ? h('button', { type: 'button', onclick: () => { session.token = ''; location.hash = '#/login'; } }, 'Log out') : null);
}

// ---- login ----

function loginPage(query) {
  const next = query.get('next') || '#/executions';
  const token = h('input', { type: 'password', name: 'token', autocomplete: 'off', placeholder: 'an api key (jfk_…) or the admin token', 'data-testid': 'token' });
  const ns = h('input', { type: 'text', name: 'namespace', value: session.ns, placeholder: 'default', 'data-testid': 'namespace' });
  const out = h('div');
  const form = h('form', {
    class: 'login', onsubmit: async (e) => {
      e.preventDefault();
      session.token = token.value.trim();
      session.ns = ns.value.trim();
      try {
        me = null;
        await whoami(); // any valid token, whatever its scopes
        location.hash = next.startsWith('#/login') ? '#/executions' : next;
      } catch (err) {
        fill(out, notice(explain(err), true));
        if (err.status === 401) session.token = '';
      }
    },
  },
  h('h1', null, 'Log in'),
  h('p', null, 'Paste an API token: the admin token (', h('code', null, 'jetflow dev'),
    ' prints where it is) or a key made with ', h('code', null, 'jetflow keys create'),
    '. The UI can do what the token\'s scopes allow. It is kept in this tab only.'),
  h('label', null, 'Token', token),
  h('label', null, 'Namespace', ns),
  h('div', { class: 'bar' }, h('button', { class: 'primary', type: 'submit', 'data-testid': 'login' }, 'Log in')),
  out);
  show(form);
  token.focus();
}

// ---- executions ----

// LIST_FILTERS are the list's query parameters the page keeps in its
// hash (and passes on to GET /v1/executions), attr repeated.
const LIST_FILTERS = ['workflow', 'status', 'damaged', 'sort', 'started_after', 'started_before', 'ended_after', 'ended_before'];
const SORTS = { '': 'by id', started_desc: 'latest started first', started_asc: 'earliest started first',
  ended_desc: 'latest ended first', ended_asc: 'earliest ended first' };

// parseAttrs reads the search attribute box: name:value filters separated
// by spaces; a value with spaces (or quotes) is written in double quotes,
// name:"a b" (or "name:a b"), \" and \\ standing for " and \ inside.
// A value may hold ':' and ',' as they are (the api cuts name:value at
// the first ':').
function parseAttrs(text) {
  const out = [];
  let cur = null; // the filter being read, or null between filters
  let quoted = false;
  for (let i = 0; i < text.length; i++) {
    const c = text[i];
    if (quoted) {
      if (c === '\\' && i + 1 < text.length) cur += text[++i];
      else if (c === '"') quoted = false;
      else cur += c;
    } else if (c === '"') {
      quoted = true;
      if (cur === null) cur = '';
    } else if (/\s/.test(c)) {
      if (cur) out.push(cur);
      cur = null;
    } else {
      cur = (cur || '') + c;
    }
  }
  if (cur !== null && cur !== '') out.push(cur);
  return out;
}

// formatAttrs writes filters as parseAttrs reads them: a value with a
// space, a quote or a backslash in double quotes.
function formatAttrs(list) {
  return list.map((a) => {
    const i = a.indexOf(':');
    const name = i < 0 ? a : a.slice(0, i);
    const value = i < 0 ? '' : a.slice(i + 1);
    if (i < 0 || !/[\s"\\]/.test(value)) return a;
    return name + ':"' + value.replace(/[\\"]/g, (c) => '\\' + c) + '"';
  }).join(' ');
}

// toLocalInput shows an RFC 3339 time in a datetime-local field; fromLocalInput reads one back.
function toLocalInput(t) {
  const d = new Date(t);
  if (!t || isNaN(d)) return '';
  return new Date(d.getTime() - d.getTimezoneOffset() * 60000).toISOString().slice(0, 19);
}
function fromLocalInput(v) {
  const d = new Date(v);
  return v && !isNaN(d) ? d.toISOString() : '';
}

async function executionsPage(p, query) {
  const f = {};
  for (const k of LIST_FILTERS) f[k] = query.get(k) || '';
  f.attr = query.getAll('attr');
  f.after = query.get('after') || '';
  const prev = (query.get('prev') || '').split(',').filter((x) => x !== '');
  const wf = h('input', { name: 'workflow', value: f.workflow, placeholder: 'any', 'data-testid': 'filter-workflow' });
  const st = h('select', { name: 'status', 'data-testid': 'filter-status' },
    h('option', { value: '' }, 'any'), STATUSES.map((s) => h('option', { value: s, selected: s === f.status }, s)));
  const dmg = h('input', { type: 'checkbox', name: 'damaged', checked: f.damaged === 'true' });
  const sort = h('select', { name: 'sort', 'data-testid': 'filter-sort' },
    Object.entries(SORTS).map(([v, label]) => h('option', { value: v, selected: v === f.sort }, label)));
  const times = {};
  for (const k of ['started_after', 'started_before', 'ended_after', 'ended_before']) {
    times[k] = h('input', { type: 'datetime-local', step: '1', name: k, value: toLocalInput(f[k]), 'data-testid': 'filter-' + k });
  }
  const attr = h('input', { name: 'attr', value: formatAttrs(f.attr), placeholder: 'customer:acme region:"eu west"', size: 24, 'data-testid': 'filter-attr',
    title: 'search attributes, name:value, separated by spaces: every one must match; quote a value with spaces: name:"a b"' });
  const jump = h('input', { name: 'id', placeholder: 'execution id', 'data-testid': 'goto-id' });
  const filters = h('form', {
    class: 'bar', onsubmit: (e) => {
      e.preventDefault();
      const q = new URLSearchParams();
      if (wf.value.trim()) q.set('workflow', wf.value.trim());
      if (st.value) q.set('status', st.value);
      if (dmg.checked) q.set('damaged', 'true');
      if (sort.value) q.set('sort', sort.value);
      for (const [k, el] of Object.entries(times)) {
        const v = fromLocalInput(el.value);
        if (v) q.set(k, v);
      }
      for (const a of parseAttrs(attr.value)) q.append('attr', a);
      location.hash = '#/executions' + (q.toString() ? '?' + q : '');
    },
  }, h('label', null, 'Workflow', wf), h('label', null, 'Status', st), h('label', null, 'Order', sort),
  h('label', null, 'Started after', times.started_after), h('label', null, 'Started before', times.started_before),
  h('label', null, 'Ended after', times.ended_after), h('label', null, 'Ended before', times.ended_before),
  h('label', null, 'Search attributes', attr), h('label', { class: 'check' }, dmg, 'damaged only'),
  h('button', { type: 'submit', 'data-testid': 'filter' }, 'Filter'));
  const goto = h('form', {
    class: 'bar', onsubmit: (e) => {
      e.preventDefault();
      if (jump.value.trim()) location.hash = '#/executions/' + encodeURIComponent(jump.value.trim());
    },
  }, h('label', null, 'Open by id', jump), h('button', { type: 'submit' }, 'Open'));
  const live = h('span', { class: 'live' }, '● live');
  const counts = h('div', { class: 'counts muted', 'data-testid': 'counts' });
  const body = h('tbody', { 'data-testid': 'executions' });
  const pager = h('div', { class: 'bar' });
  const msg = h('div');
  show(h('h1', null, 'Executions ', live), h('div', { class: 'bar' }, filters, goto), counts, msg,
    h('table', null, h('thead', null, h('tr', null, ['Execution', 'Workflow', 'Status', 'Steps', 'Started', 'Ended', 'Took'].map((c) => h('th', null, c)))), body),
    pager);

  const filtered = () => {
    const n = new URLSearchParams();
    for (const k of LIST_FILTERS) if (f[k]) n.set(k, f[k]);
    for (const a of f.attr) n.append('attr', a);
    return n;
  };
  const q = filtered();
  q.set('limit', '50');
  if (f.after) q.set('after', f.after);
  const pageHash = (after, prevs) => {
    const n = filtered();
    if (after) n.set('after', after);
    if (prevs.length) n.set('prev', prevs.join(','));
    return '#/executions?' + n;
  };
  const load = async () => {
    let res;
    const all = allCounts(p, f.workflow); // asked beside the page
    try {
      res = await api('GET', '/v1/executions?' + q, undefined, p.signal);
    } catch (err) {
      // Shown, and asked again on the next refresh (a 503 while the
      // index catches up after a start, a bad filter to correct).
      if (err.name !== 'AbortError' && err.status !== 401) {
        live.className = 'live off'; live.textContent = '○ not live';
        fill(msg, notice(explain(err), true));
      }
      return;
    }
    fill(msg);
    live.className = 'live'; live.textContent = '● live';
    const list = res.data.executions || [];
    const total = await all;
    if (total) {
      fill(counts, h('span', { 'data-testid': 'counts-scope' }, f.workflow ? `All executions of ${f.workflow}:` : 'All executions:'),
        ...STATUSES.filter((k) => total.counts[k]).map((k) => h('span', null, statusBadge(k), ' ', String(total.counts[k]))),
        h('span', null, `total ${total.total}`), list.length ? '' : 'no executions on this page');
    } else {
      const by = {};
      for (const x of list) by[x.status] = (by[x.status] || 0) + 1;
      fill(counts, h('span', { 'data-testid': 'counts-scope' }, 'On this page:'), ...Object.entries(by).map(([k, n]) => h('span', null, statusBadge(k), ' ', String(n))),
        list.length ? '' : 'no executions');
    }
    fill(body, ...list.map((x) => h('tr', { 'data-id': x.id },
      h('td', null, h('a', { href: '#/executions/' + encodeURIComponent(x.id), class: 'mono' }, x.id)),
      h('td', null, h('a', { href: '#/workflows/' + encodeURIComponent(x.workflow) }, x.workflow), h('span', { class: 'muted' }, ' v' + x.version)),
      h('td', null, statusBadge(x.status), x.damaged ? [' ', statusBadge('damaged')] : null, x.error ? h('div', { class: 'error' }, x.error) : null),
      h('td', null, `${x.steps_done}/${x.steps}`),
      h('td', null, time(x.started_at)), h('td', null, time(x.ended_at)), h('td', null, duration(x.started_at, x.ended_at)))));
    fill(pager,
      f.after ? h('a', { href: pageHash(prev[prev.length - 1] || '', prev.slice(0, -1)) }, '← Previous') : null,
      res.data.next ? h('a', { href: pageHash(res.data.next, [...prev, f.after]), 'data-testid': 'next' }, 'Next →') : null,
      res.data.partial ? h('span', { class: 'muted' }, 'This page was cut short; go on with Next.') : null);
  };
  await load();
  every(p, LIST_POLL_MS, load);
}

// allCounts asks GET /v1/executions/_counts (the visibility index's
// counts by status, of one workflow or of all) for {counts, total}, or
// null while the api cannot answer it (503 while its index is fed): then
// the list counts its page, and asks again at its next refresh.
async function allCounts(p, workflow) {
  try {
    const res = await api('GET', '/v1/executions/_counts' + (workflow ? '?workflow=' + encodeURIComponent(workflow) : ''), undefined, p.signal);
    const d = res.data;
    if (d && d.counts && typeof d.counts === 'object' && typeof d.total === 'number') return d;
  } catch (err) {
    // shown by the list's own request, which fails the same way
  }
  return null;
}

async function executionPage(p, id) {
  const path = '/v1/executions/' + encodeURIComponent(id);
  const head = h('div');
  const acts = h('div');
  const details = h('div');
  const timeline = h('tbody', { 'data-testid': 'timeline' });
  const live = h('span', { class: 'live off', 'data-testid': 'live' }, '○');
  show(head, acts, details, h('h2', null, 'History ', live),
    h('p', { class: 'muted' }, 'Every event of the execution, as recorded in its stream; open one to see its CloudEvent.'),
    h('table', null, h('thead', null, h('tr', null, ['Seq', 'Time', 'Type', 'Event'].map((c) => h('th', null, c)))), timeline));

  let x = null;
  let actions = null;
  const refresh = async () => {
    const res = await api('GET', path, undefined, p.signal);
    x = res.data;
    renderExecution(x, head, details);
    if (actions) actions.update(x); // in the same turn: the status and the actions shown agree
  };
  await refresh();
  actions = renderActions(p, x, acts, () => { refresh().catch(() => {}); follow.kick(); });
  actions.update(x);
  let pending = null;
  const soon = () => {
    if (pending) return;
    pending = setTimeout(() => { pending = null; refresh().catch(() => {}); }, 150);
  };
  p.stops.push(() => clearTimeout(pending));
  const follow = followHistory(p, path + '/events', timeline, live, soon);
  every(p, EXEC_POLL_MS, refresh);
}

// cancellation says who asked to cancel, how, when and why.
function cancellation(c) {
  const who = c.actor ? c.actor.subject : c.requested_by;
  return [c.action, who ? ' by ' + who : '', c.requested_at ? ' at ' + time(c.requested_at) : '', c.reason ? ': ' + c.reason : ''].join('');
}

function renderExecution(x, head, details) {
  fill(head,
    h('h1', null, 'Execution ', h('span', { class: 'mono' }, x.id), ' ', statusBadge(x.status, 'status'), x.damaged ? [' ', statusBadge('damaged')] : null),
    h('dl', { class: 'grid' },
      h('dt', null, 'Workflow'), h('dd', null, h('a', { href: '#/workflows/' + encodeURIComponent(x.workflow) }, x.workflow), ' version ' + x.version),
      h('dt', null, 'Started'), h('dd', null, time(x.started_at), x.started_by ? ' by ' + x.started_by : ''),
      h('dt', null, 'Ended'), h('dd', null, time(x.ended_at) || '—', x.ended_at ? ' (' + duration(x.started_at, x.ended_at) + ')' : ''),
      x.error ? [h('dt', null, 'Error'), h('dd', { class: 'error', 'data-testid': 'exec-error' }, x.error)] : null,
      x.parent ? [h('dt', null, 'Parent'), h('dd', null, h('a', { href: '#/executions/' + encodeURIComponent(x.parent.execution_id || '') }, x.parent.execution_id || ''), x.parent.step_id ? ' step ' + x.parent.step_id : '')] : null,
      x.continued_from ? [h('dt', null, 'Continued from'), h('dd', null, h('a', { href: '#/executions/' + encodeURIComponent(x.continued_from) }, x.continued_from))] : null,
      x.continued_as ? [h('dt', null, 'Continued as'), h('dd', null, h('a', { href: '#/executions/' + encodeURIComponent(x.continued_as) }, x.continued_as))] : null,
      x.cancellation ? [h('dt', null, 'Cancellation'), h('dd', null, cancellation(x.cancellation))] : null,
      h('dt', null, 'Events'), h('dd', null, String(x.events), ' (last at stream sequence ', String(x.last_seq), ')')),
    x.damaged ? notice('Damaged: ' + json(x.damaged), true) : null,
    x.truncated ? notice('This read model is cut short: ' + json(x.truncated) + '. The history below has every event.') : null);

  const steps = x.steps || [];
  const blocked = (x.locks || []).filter((l) => l.status === 'waiting');
  fill(details,
    blocked.length ? notice(blocked.map((l) => `Waiting for lock ${l.name}${l.path ? ' (for ' + l.path + ')' : ''} since ${time(l.requested_at)}: another execution holds it. See Locks.`).join(' ')) : null,
    h('h2', null, 'Steps'),
    h('table', null, h('thead', null, h('tr', null, ['Step', 'Kind', 'Status', 'Attempt', 'Agent', 'Scheduled', 'Sent', 'Started', 'Ended', 'Took', 'Output / error'].map((c) => h('th', null, c)))),
      h('tbody', { 'data-testid': 'steps' }, steps.map((s) => h('tr', { 'data-step': s.id },
        h('td', { class: 'mono' }, s.id), h('td', null, s.kind), h('td', null, statusBadge(s.status)),
        h('td', null, s.attempt ? String(s.attempt) : ''), h('td', null, s.agent || ''),
        h('td', null, time(s.scheduled_at)), h('td', null, time(s.sent_at)), h('td', null, time(s.started_at)), h('td', null, time(s.ended_at)),
        h('td', null, duration(s.started_at || s.sent_at || s.scheduled_at, s.ended_at)),
        h('td', null, s.error ? h('div', { class: s.status === 'failed' ? 'error' : 'muted' }, s.error) : null, s.output !== undefined ? h('pre', null, json(s.output)) : null,
          s.child ? h('div', null, 'child ', h('a', { href: '#/executions/' + encodeURIComponent(s.child) }, s.child)) : null,
          s.wait_until && s.status === 'waiting' ? h('div', { class: 'muted' }, 'until ' + time(s.wait_until)) : null))))),
    h('h2', null, 'Input'), h('pre', { 'data-testid': 'input' }, json(x.input) || '(none)'),
    h('h2', null, 'Output'), h('pre', { 'data-testid': 'output' }, json(x.output) || '(none)'),
    (x.locks || []).length ? [h('h2', null, 'Locks'), h('table', null,
      h('thead', null, h('tr', null, ['Lock', 'Scope', 'Status', 'Asked', 'Acquired', 'Released', 'Reason'].map((c) => h('th', null, c)))),
      h('tbody', null, x.locks.map((l) => h('tr', null, h('td', null, l.name), h('td', null, l.path || 'workflow'), h('td', null, statusBadge(l.status)),
        h('td', null, time(l.requested_at)), h('td', null, time(l.acquired_at)), h('td', null, time(l.released_at)), h('td', null, l.reason || '')))))] : null,
    (x.signals || []).length ? [h('h2', null, 'Signals'), h('table', null,
      h('thead', null, h('tr', null, ['Signal', 'Received', 'Taken by', 'Data'].map((c) => h('th', null, c)))),
      h('tbody', null, x.signals.map((s) => h('tr', null, h('td', null, s.name), h('td', null, time(s.received_at)), h('td', null, s.taken_by || '(kept)'),
        h('td', null, s.data !== undefined ? h('pre', null, json(s.data)) : '')))))] : null,
    (x.actions || []).length ? [h('h2', null, 'Operator actions'), h('table', null,
      h('thead', null, h('tr', null, ['Action', 'Who', 'Command'].map((c) => h('th', null, c)))),
      h('tbody', { 'data-testid': 'actions-recorded' }, x.actions.map((a) => h('tr', null, h('td', null, a.action),
        h('td', null, a.actor ? a.actor.subject + (a.actor.method ? ' (' + a.actor.method + ')' : '') : ''), h('td', { class: 'mono' }, a.command)))))] : null);
}

// renderActions offers the operator's actions on x; done runs after each
// is answered. The api answers once the dispatcher recorded the command
// (or 202 if it has not yet): the history below shows what came of it.
function renderActions(p, x, into, done) {
  const reason = h('input', { name: 'reason', placeholder: 'why (kept in the history)', size: 30, 'data-testid': 'reason' });
  const version = h('input', { name: 'version', placeholder: 'same', size: 6, 'data-testid': 'version' });
  const from = h('input', { name: 'from', placeholder: 'resume', size: 10, list: 'replay-from', 'data-testid': 'replay-from' });
  const fromList = h('datalist', { id: 'replay-from' }, ['resume', 'last', 'start', ...(x.steps || []).map((s) => s.id)].map((v) => h('option', { value: v })));
  const force = h('input', { type: 'checkbox', name: 'force' });
  const sigName = h('input', { name: 'signal', placeholder: 'name', size: 12, 'data-testid': 'signal-name' });
  const sigData = h('textarea', { name: 'data', placeholder: '{"approved": true}', 'data-testid': 'signal-data' });
  const out = h('div', { 'data-testid': 'action-result' });
  const act = async (action, extra) => {
    const body = Object.assign({ action, requested_by: 'jetflow UI' }, extra);
    if (reason.value.trim()) body.reason = reason.value.trim();
    reason.value = ''; // a reason is for one action
    fill(out, notice(action + '…'));
    try {
      const res = await api('POST', '/v1/executions/' + encodeURIComponent(x.id) + '/actions', body, p.signal);
      fill(out, notice(res.data.recorded ? `${action}: recorded in the history.` : `${action}: sent; the dispatcher has not recorded it yet (HTTP ${res.status}).`));
    } catch (err) {
      fill(out, notice(`${action}: ${explain(err)}`, true));
    }
    done();
  };
  const withVersion = () => {
    const v = version.value.trim();
    if (!v) return {};
    return { version: /^\d+$/.test(v) ? Number(v) : v };
  };
  const signal = async (e) => {
    e.preventDefault();
    const name = sigName.value.trim();
    if (!name) { fill(out, notice('signal: give the signal a name', true)); return; }
    const data = sigData.value.trim();
    if (data) {
      try { JSON.parse(data); } catch (err) { fill(out, notice('signal data: not JSON: ' + err.message, true)); return; }
    }
    try {
      const res = await api('POST', '/v1/executions/' + encodeURIComponent(x.id) + '/signals/' + encodeURIComponent(name), data || undefined, p.signal);
      fill(out, notice(res.data.recorded ? `signal ${name}: recorded in the history.` : `signal ${name}: sent (HTTP ${res.status}).`));
    } catch (err) {
      fill(out, notice(`signal ${name}: ${explain(err)}`, true));
    }
    done();
  };
  // The buttons, by action: each disabled when the token lacks its scope,
  // and shown only while the execution's status allows it (update).
  const b = {
    cancel: h('button', { type: 'button', onclick: () => act('cancel'), 'data-testid': 'act-cancel' }, 'Cancel'),
    'force-cancel': twoStep('Force-cancel', 'act-force-cancel', () => act('force-cancel')),
    kill: twoStep('Kill', 'act-kill', () => act('kill')),
    resume: h('button', { type: 'button', onclick: () => act('resume', withVersion()), 'data-testid': 'act-resume' }, 'Resume'),
    'force-resume': h('button', { type: 'button', onclick: () => act('force-resume', withVersion()), 'data-testid': 'act-force-resume' }, 'Force-resume'),
    replay: h('button', { type: 'button', onclick: () => act('replay', Object.assign({ from: from.value.trim() || 'resume', force: force.checked }, withVersion())), 'data-testid': 'act-replay' }, 'Replay'),
    signal: h('button', { type: 'submit', 'data-testid': 'act-signal' }, 'Send signal'),
  };
  for (const [what, el] of Object.entries(b)) gate(el, what);
  const reasonField = h('label', null, 'Reason', reason);
  const versionField = h('label', null, 'Version', version);
  const replayFields = [h('label', null, 'Replay from', from, fromList), h('label', { class: 'check' }, force, 'force')];
  const signalForm = h('form', { class: 'bar', onsubmit: signal }, h('label', null, 'Signal', sigName), h('label', null, 'Data (JSON)', sigData), b.signal);
  const none = h('p', { class: 'muted', 'data-testid': 'no-actions' });
  const scopes = !can('operate') && !can('signal')
    ? h('p', { class: 'muted', 'data-testid': 'read-only' }, 'This token can take none of these actions: they need the scope operate (signals: signal).') : null;
  fill(into, h('div', { class: 'panel', 'data-testid': 'actions' },
    h('div', { class: 'bar' }, reasonField, b.cancel, b['force-cancel'], b.kill),
    h('div', { class: 'bar' }, versionField, b.resume, b['force-resume'], replayFields, b.replay),
    signalForm, none, scopes, out));
  return {
    // update shows the actions the dispatcher accepts in x's status (all
    // of them for a status the table does not know: the api decides).
    update(x) {
      const ok = STATUS_ACTIONS[x.status] || Object.keys(b);
      for (const [what, el] of Object.entries(b)) el.hidden = !ok.includes(what);
      const shown = (...names) => names.some((n) => ok.includes(n));
      reasonField.hidden = !shown('cancel', 'force-cancel', 'kill', 'resume', 'force-resume', 'replay');
      versionField.hidden = !shown('resume', 'force-resume', 'replay');
      for (const el of replayFields) el.hidden = !shown('replay');
      signalForm.hidden = !shown('signal');
      none.hidden = shown(...Object.keys(b));
      none.textContent = none.hidden ? '' : `No action applies to a ${x.status} execution.`;
    },
  };
}

// twoStep is a button for an action that cannot be taken back: the
// first click asks, a second within five seconds acts.
function twoStep(label, testid, run) {
  let armed = null;
  const b = h('button', {
    type: 'button', class: 'danger', 'data-testid': testid, onclick: () => {
      if (armed) {
        clearTimeout(armed); armed = null; b.textContent = label;
        run();
        return;
      }
      b.textContent = 'Click again to ' + label.toLowerCase();
      armed = setTimeout(() => { armed = null; b.textContent = label; }, 5000);
    },
  }, label);
  return b;
}

// followHistory streams the execution's events (server-sent events, read
// with fetch so that the token goes in a header) into rows, from the
// first; the api ends the stream once the execution is settled, and it
// is followed again from the last event every few seconds (a resume or
// replay goes on) or at once on kick.
function followHistory(p, path, into, live, onEvent) {
  let last = 0;
  let wake = null;
  let dropped = 0;
  const older = h('tr', { class: 'muted', 'data-testid': 'older' });
  const row = (ev) => {
    if (ev.seq <= last) return; // the stream is in order: seen already
    last = ev.seq;
    into.append(h('tr', { 'data-seq': ev.seq, 'data-type': ev.type },
      h('td', null, String(ev.seq)), h('td', null, time(ev.time)), h('td', { class: 'mono' }, ev.type),
      h('td', null, h('details', { class: 'ev' }, h('summary', null, summary(ev)), h('pre', null, json(ev))))));
    // A long history keeps the tab small: the latest MAX_ROWS events.
    let rows = into.querySelectorAll('tr[data-seq]');
    while (rows.length > MAX_ROWS) {
      rows[0].remove();
      dropped++;
      rows = into.querySelectorAll('tr[data-seq]');
    }
    if (dropped) {
      fill(older, h('td', { colspan: 4 }, `${dropped} earlier events are not shown here: `,
        h('code', null, 'GET ' + path), ' and jetflow events have them all.'));
      if (!older.isConnected) into.prepend(older);
    }
    onEvent();
  };
  const once = async () => {
    const resp = await fetch(path + '?from_seq=' + (last + 1), { headers: headers({ Accept: 'text/event-stream' }), signal: p.signal });
    if (resp.status === 204) return;
    if (resp.status === 401) { location.hash = '#/login?next=' + encodeURIComponent(location.hash); return; }
    if (!resp.ok) throw new APIError(resp.status, await resp.json().catch(() => null));
    live.className = 'live'; live.textContent = '● following';
    const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
    let buf = '';
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += value;
      let i;
      while ((i = buf.indexOf('\n\n')) >= 0) {
        const block = buf.slice(0, i);
        buf = buf.slice(i + 2);
        const data = block.split('\n').filter((l) => l.startsWith('data:')).map((l) => l.slice(5).replace(/^ /, '')).join('\n');
        if (!data) continue;
        try { row(JSON.parse(data)); } catch (_) { /* a line we do not know */ }
      }
    }
  };
  const loop = async () => {
    while (!p.signal.aborted) {
      try {
        await once();
        live.className = 'live off'; live.textContent = '○ settled (watching for a resume)';
      } catch (err) {
        if (p.signal.aborted) return;
        live.className = 'live off'; live.textContent = '○ ' + explain(err);
      }
      await new Promise((res) => { wake = res; setTimeout(res, 3000); });
    }
  };
  loop();
  return { kick: () => { if (wake) wake(); } };
}

function summary(ev) {
  const d = ev.data || {};
  const bits = [];
  for (const k of ['step_id', 'timer_id', 'purpose', 'name', 'action', 'error', 'reason', 'status', 'agent']) {
    if (typeof d[k] === 'string' && d[k]) bits.push(`${k}=${d[k].length > 80 ? d[k].slice(0, 80) + '…' : d[k]}`);
  }
  // An end that also records the last step's success (docs/adr/0015).
  if (d.step && typeof d.step.step_id === 'string') bits.push('with=succeeded:' + d.step.step_id);
  // A sleep's success that also records its timer's firing (docs/adr/0017).
  const fired = (d.step && d.step.fired) || d.fired;
  if (typeof fired === 'string' && fired) bits.push('fired=' + fired);
  // A wait that also records its timer's arming (docs/adr/0018).
  if (d.timer && typeof d.timer.timer_id === 'string') {
    bits.push('timer=' + d.timer.timer_id);
    if (typeof d.timer.purpose === 'string' && d.timer.purpose) bits.push('purpose=' + d.timer.purpose);
  }
  // A start or a success that also records the next operation's dispatch
  // (docs/adr/0008).
  if (d.then && typeof d.then.step_id === 'string') bits.push('then=dispatched:' + d.then.step_id);
  if (ev.invalid) bits.push('invalid: ' + ev.invalid);
  return bits.join(' ') || 'details';
}

// ---- workflows ----

async function workflowsPage(p) {
  const res = await api('GET', '/v1/workflows', undefined, p.signal);
  const list = res.data.workflows || [];
  show(h('h1', null, 'Workflows'),
    list.length ? h('table', null, h('thead', null, h('tr', null, ['Workflow', 'Latest version', 'Description', 'Updated', ''].map((c) => h('th', null, c)))),
      h('tbody', { 'data-testid': 'workflows' }, list.map((w) => h('tr', null,
        h('td', null, h('a', { href: '#/workflows/' + encodeURIComponent(w.name) }, w.name)), h('td', null, String(w.latest_version)),
        h('td', null, w.description || ''), h('td', null, time(w.updated_at)),
        h('td', null, h('a', { href: '#/executions?workflow=' + encodeURIComponent(w.name) }, 'executions'))))))
      : h('p', { class: 'muted' }, 'No workflow is registered. Register one with jetflow apply FILE.'));
}

async function workflowPage(p, name, query) {
  const base = '/v1/workflows/' + encodeURIComponent(name);
  const res = await api('GET', base, undefined, p.signal);
  const w = res.data;
  const want = Number(query.get('version')) || w.latest.version;
  let v = w.latest;
  if (want !== w.latest.version) v = (await api('GET', base + '/versions/' + want, undefined, p.signal)).data;
  const def = v.definition || {};
  const versions = h('select', { 'data-testid': 'versions', onchange: (e) => { location.hash = '#/workflows/' + encodeURIComponent(name) + '?version=' + e.target.value; } },
    (w.versions || []).map((n) => h('option', { value: n, selected: n === v.version }, 'version ' + n + (n === w.latest.version ? ' (latest)' : ''))));
  show(h('h1', null, 'Workflow ', name),
    h('div', { class: 'bar' }, versions, h('a', { href: '#/executions?workflow=' + encodeURIComponent(name) }, 'its executions')),
    h('dl', { class: 'grid' }, h('dt', null, 'Digest'), h('dd', { class: 'mono' }, v.digest), h('dt', null, 'Registered'), h('dd', null, time(v.created_at))),
    h('h2', null, 'Start an execution of version ' + v.version), startForm(p, name, v.version, def.input),
    h('h2', null, 'Definition'),
    // As YAML, written by the api from the stored definition (an older api
    // answers JSON only).
    v.yaml ? h('pre', { 'data-testid': 'definition', 'data-format': 'yaml' }, v.yaml) : h('pre', { 'data-testid': 'definition', 'data-format': 'json' }, json(def)));
}

// startForm is a form for the input JSON Schema: a field per top-level
// property of an object schema whose type is a string, number, integer or
// boolean, and the input as JSON for anything else.
function startForm(p, name, version, schema) {
  const out = h('div');
  const fields = [];
  const props = schema && schema.type === 'object' && schema.properties ? schema.properties : null;
  const simple = props && Object.values(props).every((s) => s && ['string', 'number', 'integer', 'boolean'].includes(s.type));
  const required = new Set((schema && schema.required) || []);
  let raw = null;
  if (simple) {
    for (const [k, s] of Object.entries(props)) {
      let input;
      if (s.type === 'boolean') input = h('input', { type: 'checkbox', name: k });
      else if (Array.isArray(s.enum)) input = h('select', { name: k }, required.has(k) ? null : h('option', { value: '' }, ''), s.enum.map((e) => h('option', { value: String(e) }, String(e))));
      else input = h('input', { type: s.type === 'string' ? (s.writeOnly ? 'password' : 'text') : 'number', step: s.type === 'integer' ? '1' : 'any', name: k, placeholder: s.default !== undefined ? String(s.default) : '' });
      fields.push({ k, s, input });
    }
  } else {
    raw = h('textarea', { name: 'input', placeholder: '{}', 'data-testid': 'start-input' });
  }
  const id = h('input', { name: 'id', placeholder: 'generated', 'data-testid': 'start-id' });
  const build = () => {
    if (raw) {
      const t = raw.value.trim();
      return t ? JSON.parse(t) : undefined;
    }
    const input = {};
    for (const { k, s, input: el } of fields) {
      if (s.type === 'boolean') { input[k] = el.checked; continue; }
      const val = el.value.trim();
      if (val === '') continue;
      input[k] = s.type === 'string' ? val : Number(val);
    }
    return input;
  };
  return h('form', {
    onsubmit: async (e) => {
      e.preventDefault();
      let input;
      try { input = build(); } catch (err) { fill(out, notice('input: not JSON: ' + err.message, true)); return; }
      const body = { workflow: name, version };
      if (input !== undefined) body.input = input;
      if (id.value.trim()) body.id = id.value.trim();
      try {
        const res = await api('POST', '/v1/executions', body, p.signal);
        location.hash = '#/executions/' + encodeURIComponent(res.data.id);
      } catch (err) {
        fill(out, notice(explain(err), true));
      }
    },
  },
  h('div', { class: 'bar' }, fields.map(({ k, s, input }) => h('label', { title: s.description || '' }, k + (required.has(k) ? ' *' : '') + ' (' + s.type + ')', input)),
    raw ? h('label', null, 'Input (JSON)', raw) : null, h('label', null, 'Execution id', id),
    gate(h('button', { class: 'primary', type: 'submit', 'data-testid': 'start' }, 'Start'), 'start')),
  out);
}

// ---- locks ----

async function locksPage(p) {
  const body = h('div', { 'data-testid': 'locks' });
  const out = h('div');
  const live = h('span', { class: 'live' }, '● live');
  const reason = h('input', { name: 'reason', placeholder: 'why (kept in the holder\'s history)', size: 36, 'data-testid': 'clear-reason' });
  show(h('h1', null, 'Locks ', live), h('p', { class: 'muted' }, 'Every lock held or waited for: holders, and waiters in the order they acquire. ',
    'Force-clearing a hold removes it: the first waiter acquires the lock; a cleared holder that still runs asks for it again before its next step inside it.'),
  h('div', { class: 'bar' }, h('label', null, 'Reason for a force-clear', reason)), out, body);
  let shown = null;
  const load = async () => {
    const res = await api('GET', '/v1/locks', undefined, p.signal);
    const locks = res.data.locks || [];
    const now = JSON.stringify(locks);
    if (now === shown) return; // unchanged: keep the page (and an armed button) as it is
    shown = now;
    const entry = (e) => [h('a', { href: '#/executions/' + encodeURIComponent(e.execution_id), class: 'mono' }, e.execution_id),
      ' ', h('span', { class: 'muted' }, e.workflow + (e.path ? ' · ' + e.path : '') + ' · since ' + time(e.since))];
    fill(body, ...(locks.length ? locks.map((l) => h('div', { class: 'panel', 'data-lock': l.name },
      h('h2', null, 'Lock ', h('span', { class: 'mono' }, l.name), h('span', { class: 'muted' }, ` (limit ${l.limit})`)),
      h('div', null, h('strong', null, 'Holders: '), l.holders.length ? h('ol', null, l.holders.map((e) => h('li', { 'data-holder': e.execution_id }, entry(e),
        ' ', gate(twoStep('Force-clear', 'clear', () => clear(l.name, e.execution_id)), 'clear-lock')))) : 'none'),
      h('div', null, h('strong', null, 'Waiters: '), l.waiters.length ? h('ol', null, l.waiters.map((e) => h('li', { 'data-waiter': e.execution_id }, entry(e)))) : 'none')))
      : [h('p', { class: 'muted' }, 'No lock is held or waited for.')]));
  };
  const clear = async (name, exec) => {
    const why = reason.value.trim();
    try {
      await api('DELETE', '/v1/locks/' + encodeURIComponent(name), { execution_id: exec, reason: why || undefined, requested_by: 'jetflow UI' }, p.signal);
      fill(out, notice(`Cleared ${exec}'s hold of ${name}.`));
    } catch (err) {
      fill(out, notice(explain(err), true));
    }
    await load().catch(() => {});
  };
  await load();
  every(p, LIST_POLL_MS, load);
}

window.addEventListener('hashchange', route);
window.addEventListener('DOMContentLoaded', route);
