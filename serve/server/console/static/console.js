// The streamlimit console: polls api/state once a second and redraws the page. Every
// string that comes from the server is inserted as text (append, textContent), never as
// markup: keys and descriptor values are chosen by whoever sends requests.
'use strict';

const POLL_MS = 1000;
const HISTORY = 60; // points of each sparkline
const RESULTS = ['ok', 'soft', 'over_limit', 'shadow_over_limit'];

const STATE_HELP = {
  fresh: 'its count, and its share of the room by demand',
  cut: 'its count, and its share of each key it served, while the silence lasts',
  crashed: 'its count, and its share of the keys it served, fading over the crash hold',
  left: 'its hits still in their windows, nothing more',
};

let prev = null; // the previous State's time and decision totals, for rates
let drawn = 0; // when (this browser's clock) the figures on the page were last drawn
const history = Object.fromEntries(RESULTS.map((r) => [r, []]));

// el makes an element; attrs sets properties (class, title) and data-* attributes;
// children are nodes or strings (inserted as text).
function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null) continue;
    if (k === 'class') e.className = v;
    else if (k.startsWith('data-')) e.setAttribute(k, String(v));
    else e[k] = v;
  }
  for (const c of children) {
    if (c === undefined || c === null) continue;
    e.append(c instanceof Node ? c : String(c));
  }
  return e;
}

function fmtWindow(ms) {
  if (!ms) return '—';
  const units = [[86400000, 'd'], [3600000, 'h'], [60000, 'm'], [1000, 's']];
  for (const [n, u] of units) if (ms % n === 0) return (ms / n) + u;
  return ms < 1000 ? ms + 'ms' : (ms / 1000) + 's';
}

function fmtAgo(ms) {
  if (ms < 0) ms = 0;
  if (ms < 1000) return ms + ' ms';
  if (ms < 60000) return (ms / 1000).toFixed(1) + ' s';
  if (ms < 3600000) return Math.floor(ms / 60000) + ' min ' + Math.floor((ms % 60000) / 1000) + ' s';
  return (ms / 3600000).toFixed(1) + ' h';
}

function fmtNum(x) {
  if (x === undefined || x === null) return '—';
  const r = Math.round(x * 10) / 10;
  return Number.isInteger(r) ? r.toLocaleString('en-US') : r.toLocaleString('en-US', { maximumFractionDigits: 1 });
}

function fmtTime(ms) {
  const d = new Date(ms);
  const p = (n, w) => String(n).padStart(w, '0');
  return p(d.getHours(), 2) + ':' + p(d.getMinutes(), 2) + ':' + p(d.getSeconds(), 2) + '.' + p(d.getMilliseconds(), 3);
}

// fmtLimit shows a limit as `rules check` does: the hard limit per window, and where a
// soft band raises it, the count past which requests get 429s (what X-RateLimit-Limit
// and the check API call the limit).
function fmtLimit(l) {
  if (!l) return '—';
  const soft = l.requests > l.hard ? ' (soft to ' + fmtNum(l.requests) + ')' : '';
  return fmtNum(l.hard) + ' / ' + fmtWindow(l.window_ms) + soft;
}

// denialLimit finds the limit of the rules that a recent 429 names, so that it is shown as
// the rules table shows it; a limit no longer in the rules (or an override) is shown as
// the denial recorded it.
function denialLimit(st, d) {
  const rule = st.rules.find((r) => r.domain === d.domain && r.id === d.rule);
  const same = (x) => x.requests === d.requests && x.scope === d.scope;
  const l = rule && (rule.limits.find((x) => same(x) && x.window_ms === d.window_ms) || rule.limits.find(same));
  return l ? fmtLimit(l) : fmtNum(d.requests) + ' / ' + fmtWindow(d.window_ms);
}

function setStatus(kind, text) {
  const s = document.getElementById('status');
  s.className = 'pill status-' + kind;
  s.setAttribute('data-status', kind);
  s.textContent = text;
}

function fill(tbodyParent, rows, empty, cols) {
  const tbody = document.querySelector('#' + tbodyParent + ' tbody');
  if (rows.length === 0) rows = [el('tr', { class: 'empty' }, el('td', { colSpan: cols }, empty))];
  tbody.replaceChildren(...rows);
}

function renderHeader(st) {
  document.getElementById('site').textContent = 'site ' + st.site;
  const snap = document.getElementById('snapshot');
  snap.classList.remove('warn');
  if (!st.snapshot) {
    snap.textContent = 'no Kafka: global limits on local shares';
    snap.classList.add('warn');
  } else if (!st.snapshot.ready) {
    snap.textContent = 'restoring the counts topic…';
    snap.classList.add('warn');
  } else {
    const s = st.snapshot;
    snap.textContent = (s.stale ? 'counts STALE (local shares), ' : 'counts ') + fmtAgo(s.age_ms) + ' old, ' + fmtNum(s.keys) + ' keys';
    if (s.stale) snap.classList.add('warn');
  }
}

// siteHelp says what a site in its state holds. A crashed site's reservation fades to
// nothing crash_hold_ms after its last heartbeat; it stays listed, holding only its hits
// still in their windows, until the aggregators forget it (a silent site is remembered so
// that a long partition stays bounded).
function siteHelp(st, s) {
  if (s.state !== 'crashed' || !st.crash_hold_ms) return STATE_HELP[s.state] || '';
  const left = st.crash_hold_ms - s.silent_ms;
  if (left > 0) return STATE_HELP.crashed + ', ' + fmtAgo(left) + ' left';
  return 'its hits still in their windows, nothing more: the crash hold is over (listed until the aggregators forget it)';
}

function renderSites(st) {
  const rows = st.sites.map((s) => el('tr', { 'data-site': s.site, 'data-state': s.state,
    'data-held': s.state === 'crashed' && st.crash_hold_ms && s.silent_ms >= st.crash_hold_ms ? 'over' : undefined },
    el('td', {}, s.site, s.self ? el('span', { class: 'self' }, '(this site)') : null),
    el('td', {}, el('span', { class: 'badge ' + s.state }, s.state)),
    el('td', {}, s.heard ? fmtAgo(st.now - s.heard) + ' ago' : (s.self ? 'here' : '—')),
    el('td', {}, s.silent_ms ? fmtAgo(s.silent_ms) : ''),
    el('td', { class: 'muted' }, siteHelp(st, s))));
  fill('sites', rows, 'no site known yet', 5);
}

// rates returns, per result and per domain/rule/result, the decisions per second since
// the previous State; null on the first.
function rates(st) {
  const totals = new Map();
  for (const d of st.decisions || []) totals.set(d.domain + '\u0000' + d.rule + '\u0000' + d.result, d);
  let out = null;
  if (prev && st.now > prev.now) {
    const dt = (st.now - prev.now) / 1000;
    out = { byResult: Object.fromEntries(RESULTS.map((r) => [r, 0])), byRule: new Map() };
    for (const [k, d] of totals) {
      const before = prev.totals.get(k);
      const r = Math.max(0, d.total - (before ? before.total : 0)) / dt;
      out.byResult[d.result] = (out.byResult[d.result] || 0) + r;
      out.byRule.set(k, r);
    }
  }
  if (!prev || st.now > prev.now) prev = { now: st.now, totals };
  return out;
}

function spark(svg, points) {
  const max = Math.max(1, ...points);
  const n = points.length;
  const coords = points.map((v, i) => ((HISTORY - n + i) * 120 / (HISTORY - 1)).toFixed(1) + ',' + (29 - (v / max) * 27).toFixed(1));
  const line = document.createElementNS('http://www.w3.org/2000/svg', 'polyline');
  line.setAttribute('points', coords.join(' '));
  svg.replaceChildren(line);
}

function renderRates(st, r) {
  if (!st.decisions) return;
  for (const res of RESULTS) {
    const tile = document.getElementById('rate-' + res);
    if (!r) continue;
    const v = r.byResult[res] || 0;
    const h = history[res];
    h.push(v);
    if (h.length > HISTORY) h.shift();
    tile.querySelector('.value').textContent = fmtNum(v);
    tile.setAttribute('data-rate', String(v));
    spark(tile.querySelector('svg'), h);
  }
}

function bar(total, lim) {
  const b = el('div', { class: 'bar' });
  if (!lim || !lim.requests) return b;
  const scale = Math.max(lim.requests, total);
  const f = el('div', { class: 'fill' });
  f.style.width = Math.min(100, (total / scale) * 100).toFixed(1) + '%';
  b.append(f);
  if (lim.requests > lim.hard) {
    const s = el('div', { class: 'softband' });
    s.style.width = (((lim.requests - lim.hard) / scale) * 100).toFixed(1) + '%';
    b.append(s);
  }
  return b;
}

function renderTop(st) {
  const rows = st.top.map((k) => {
    const lim = k.limit;
    let cls = '';
    if (lim && k.total > lim.requests) cls = 'limited';
    else if (lim && k.total > lim.hard) cls = 'soft';
    else if (lim && k.total >= lim.hard) cls = 'limited';
    const sites = el('td', {}, ...k.sites.map((s) => el('span', { class: 'site-count', 'data-site': s.site },
      s.site + ' ' + fmtNum(s.count), el('span', { class: 'demand' }, ' / ' + fmtNum(s.demand)))));
    return el('tr', { class: cls, 'data-key': k.key },
      el('td', { class: 'key' }, k.key),
      el('td', {}, k.rule || (lim && lim.pool ? 'pool ' + lim.pool : '—')),
      el('td', { class: 'num' }, fmtNum(k.total)),
      el('td', { class: 'num' }, lim ? fmtLimit(lim) : '—'),
      el('td', { class: 'bar-col' }, bar(k.total, lim)),
      sites);
  });
  fill('top', rows, st.snapshot ? 'no counts yet' : 'no counts topic (no Kafka)', 6);
}

function renderDenials(st) {
  const rows = st.denials.map((d) => el('tr', { 'data-key': d.key, 'data-rule': d.rule },
    el('td', {}, fmtTime(d.time)),
    el('td', {}, d.site),
    el('td', { class: 'key' }, d.key),
    el('td', {}, d.rule || 'override'),
    el('td', {}, denialLimit(st, d) + ' ' + d.scope)));
  fill('denials', rows, 'none lately', 5);
}

function renderRules(st, r) {
  const rows = [];
  for (const rule of st.rules) {
    const k = rule.domain + '\u0000' + rule.id + '\u0000';
    const rate = (res) => (r ? fmtNum(r.byRule.get(k + res) || 0) : '—');
    const limits = rule.limits.length ? rule.limits : [null];
    limits.forEach((l, i) => {
      const desc = i === 0 ? [rule.descriptor, rule.shadow ? el('span', { class: 'tag' }, 'shadow') : null] : [''];
      rows.push(el('tr', { 'data-rule': rule.id },
        el('td', {}, i === 0 ? rule.domain : ''),
        el('td', { class: 'key' }, ...desc),
        el('td', {}, rule.unlimited ? 'unlimited' : fmtLimit(l)),
        el('td', {}, l ? l.scope + ' · ' + l.algorithm + (l.pool ? ' · pool ' + l.pool : '') : ''),
        el('td', { class: 'softband-cell' }, l && l.soft_band ? l.soft_band[0] + '–' + l.soft_band[1] : ''),
        el('td', { class: 'num' }, i === 0 ? rate('ok') : ''),
        el('td', { class: 'num' }, i === 0 ? rate('over_limit') : ''),
        el('td', { class: 'muted' }, rule.file + ':' + ((l && l.line) || rule.line))));
    });
  }
  fill('rules', rows, 'no rules', 8);
}

function render(st) {
  const r = rates(st);
  renderHeader(st);
  renderSites(st);
  renderRates(st, r);
  renderTop(st);
  renderDenials(st);
  renderRules(st, r);
  document.body.setAttribute('data-updated', String(st.now));
  drawn = Date.now();
  delete document.body.dataset.stale;
  document.getElementById('stale').hidden = true;
}

// stale says, after a failed poll, that the figures on the page are old: the whole page
// is dimmed and a banner gives their age, so that no panel still reads as live.
function stale(why) {
  setStatus('error', why);
  if (!drawn) return;
  document.body.dataset.stale = 'true';
  const b = document.getElementById('stale');
  b.textContent = why + ': the figures below are from ' + fmtAgo(Date.now() - drawn) + ' ago and no longer update.';
  b.hidden = false;
}

async function poll() {
  try {
    const resp = await fetch('api/state', { cache: 'no-store', credentials: 'same-origin' });
    if (resp.status === 401) {
      stale('a token is needed: reload the page and give it as the password');
    } else if (!resp.ok) {
      stale('error ' + resp.status);
    } else {
      const st = await resp.json();
      render(st);
      setStatus('ok', 'live · ' + fmtTime(st.now));
    }
  } catch (e) {
    stale('disconnected: ' + e.message);
  } finally {
    setTimeout(poll, POLL_MS);
  }
}

poll();
