// gangway console: one page over the registry's REST API (docs/api.md, docs/console.md).
// Plain JS, no library, no build step. Everything the API returns is put into the page as
// text (never as HTML): metadata and names come from clients.
"use strict";

const state = {
  session: null, // GET /ui/session
  services: [], // GET /v1/services
  drains: [], // GET /v1/drains
  selected: null, // {namespace, group, service} from the location hash
  detail: null, // GET .../liveness of the selected service
  subscribers: null, // GET .../subscribers of the selected service
  fetchedAt: 0, // Date.now() of the last refresh
  filter: "",
  pending: new Set(), // "service|addr|action" of mutations in flight
  events: null, // the EventSource
  refreshing: false,
  again: false,
};

// ---------------------------------------------------------------------------------------------
// DOM helpers

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") el.className = v;
    else if (k === "text") el.textContent = v;
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "dataset") Object.assign(el.dataset, v);
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

const $ = (id) => document.getElementById(id);

function chip(text, kind, title) {
  return h("span", { class: `chip ${kind || ""}`, title }, text);
}

const STATE_LABEL = {
  serving: "serving",
  unhealthy: "unhealthy",
  offline: "offline",
  zero_weight: "weight 0",
};

function ago(ms) {
  if (ms < 0) ms = 0;
  if (ms < 1000) return `${ms} ms`;
  const s = ms / 1000;
  if (s < 60) return `${s < 10 ? s.toFixed(1) : Math.round(s)} s`;
  const m = s / 60;
  if (m < 60) return `${Math.round(m)} min`;
  const hrs = m / 60;
  if (hrs < 48) return `${Math.round(hrs)} h`;
  return `${Math.round(hrs / 24)} d`;
}

function since(unixMs) {
  return `${ago(Date.now() - unixMs)} ago`;
}

function when(unixMs) {
  return new Date(unixMs).toLocaleString();
}

function shortRev(rev) {
  const s = String(rev);
  return s.length > 7 ? `…${s.slice(-6)}` : s;
}

function addr(i) {
  return i.ip.includes(":") ? `[${i.ip}]:${i.port}` : `${i.ip}:${i.port}`;
}

function keyOf(s) {
  return `${s.namespace}/${s.group}/${s.service}`;
}

function sameService(a, b) {
  return a && b && a.namespace === b.namespace && a.group === b.group && a.service === b.service;
}

function query(s) {
  return `namespace=${encodeURIComponent(s.namespace)}&group=${encodeURIComponent(s.group)}`;
}

// ---------------------------------------------------------------------------------------------
// The API

class ApiError extends Error {
  constructor(status, body) {
    const e = body && body.error ? body.error : {};
    super(e.message || `HTTP ${status}`);
    this.status = status;
    this.code = e.code || "";
    this.rule = e.rule || "";
  }
}

async function api(method, path, body) {
  const init = { method, credentials: "same-origin", headers: {} };
  if (method !== "GET") {
    // JSON and the session's CSRF token: what the server asks of every change (docs/console.md).
    init.headers["Content-Type"] = "application/json";
    if (state.session && state.session.csrf) init.headers["X-CSRF-Token"] = state.session.csrf;
    init.body = JSON.stringify(body || {});
  }
  const r = await fetch(path, init);
  let data = null;
  try {
    data = await r.json();
  } catch (_) {
    data = null;
  }
  if (!r.ok) {
    const err = new ApiError(r.status, data);
    if (r.status === 401 && state.session && state.session.auth === "on") signedOut();
    throw err;
  }
  return data;
}

function instancePath(svc, i, action) {
  const a = encodeURIComponent(addr(i));
  return `/v1/services/${encodeURIComponent(svc.service)}/instances/${a}/${action}?${query(svc)}&cluster=${encodeURIComponent(i.cluster)}`;
}

// ---------------------------------------------------------------------------------------------
// Session

async function start() {
  $("login-form").addEventListener("submit", onLogin);
  $("logout").addEventListener("click", onLogout);
  window.addEventListener("hashchange", () => {
    readHash();
    refresh();
  });
  setInterval(renderTimes, 1000);
  try {
    state.session = await api("GET", "/ui/session");
  } catch (e) {
    toast(`The server did not answer: ${e.message}`, "error");
    return;
  }
  if (state.session.auth === "on" && !state.session.user) showLogin();
  else enter();
}

function showLogin(message) {
  closeEvents();
  $("app-view").hidden = true;
  $("login-view").hidden = false;
  $("logout").hidden = true;
  $("who").textContent = "";
  $("live").hidden = true;
  const err = $("login-error");
  err.hidden = !message;
  err.textContent = message || "";
  $("username").focus();
}

function signedOut() {
  state.session = Object.assign({}, state.session, { user: null, csrf: null });
  showLogin("Your session ended: sign in again.");
}

async function onLogin(ev) {
  ev.preventDefault();
  const button = $("login-button");
  button.disabled = true;
  try {
    state.session = await api("POST", "/ui/login", {
      username: $("username").value,
      password: $("password").value,
    });
    $("password").value = "";
    enter();
  } catch (e) {
    showLogin(e.status === 401 ? "Wrong user name or password." : e.message);
  } finally {
    button.disabled = false;
  }
}

async function onLogout() {
  try {
    await api("POST", "/ui/logout", {});
  } catch (_) {
    // Signed out either way.
  }
  state.session = Object.assign({}, state.session, { user: null, csrf: null });
  showLogin("Signed out.");
}

function enter() {
  $("login-view").hidden = true;
  $("app-view").hidden = false;
  $("live").hidden = false;
  renderWho();
  readHash();
  openEvents();
  refresh();
}

function renderWho() {
  const who = $("who");
  who.replaceChildren();
  const s = state.session;
  if (s.auth === "off") {
    who.append(
      s.exposed
        ? chip("auth off on a public address", "bad", "--insecure-no-auth: anyone who reaches the port can change the registry")
        : chip("auth off · loopback only", "info", "This server runs without --auth: it serves loopback addresses only, and the console needs no sign-in."),
    );
    $("logout").hidden = true;
    return;
  }
  const roles = (s.grants || []).map((g) => `${g.role} on ${g.namespace === "*" ? "every namespace" : g.namespace}`);
  who.append(h("span", { class: "user", title: roles.join(", ") }, s.user), h("span", { class: "roles" }, roles.join(" · ")));
  $("logout").hidden = false;
}

// ---------------------------------------------------------------------------------------------
// Live updates: /ui/events says when something changed; the page then fetches again.

function openEvents() {
  closeEvents();
  const es = new EventSource("/ui/events");
  state.events = es;
  es.addEventListener("open", () => setLive("on"));
  es.addEventListener("change", () => {
    setLive("on");
    refresh();
  });
  es.addEventListener("error", () => setLive(es.readyState === EventSource.CLOSED ? "off" : "retry"));
}

function closeEvents() {
  if (state.events) state.events.close();
  state.events = null;
}

function setLive(mode) {
  const el = $("live");
  el.className = `live ${mode}`;
  el.textContent = { on: "live", retry: "reconnecting", off: "offline" }[mode] || mode;
}

// ---------------------------------------------------------------------------------------------
// Fetching

function readHash() {
  const parts = location.hash.replace(/^#\/?/, "").split("/").filter(Boolean).map(decodeURIComponent);
  state.selected = parts.length === 3 ? { namespace: parts[0], group: parts[1], service: parts[2] } : null;
  if (!sameService(state.selected, state.detail)) {
    state.detail = null;
    state.subscribers = null;
  }
}

async function refresh() {
  if (state.refreshing) {
    state.again = true;
    return;
  }
  state.refreshing = true;
  try {
    do {
      state.again = false;
      await load();
      render();
    } while (state.again);
  } catch (e) {
    if (e.status !== 401) toast(`Could not load: ${e.message}`, "error");
  } finally {
    state.refreshing = false;
  }
}

async function load() {
  const sel = state.selected;
  const asks = [api("GET", "/v1/services"), api("GET", "/v1/drains")];
  if (sel) {
    const base = `/v1/services/${encodeURIComponent(sel.service)}`;
    asks.push(api("GET", `${base}/liveness?${query(sel)}`), api("GET", `${base}/subscribers?${query(sel)}`));
  }
  const [services, drains, detail, subscribers] = await Promise.all(asks);
  state.services = services.services;
  state.drains = drains.drains;
  state.detail = detail || null;
  state.subscribers = subscribers || null;
  state.fetchedAt = Date.now();
}

// ---------------------------------------------------------------------------------------------
// Rendering

function render() {
  renderSidebar();
  const main = $("main");
  main.replaceChildren(state.selected ? serviceView() : overview());
}

function namespaces() {
  const names = new Set(state.services.map((s) => s.namespace));
  for (const g of (state.session && state.session.grants) || []) if (g.namespace !== "*") names.add(g.namespace);
  return [...names].sort();
}

function renderSidebar() {
  const nav = $("sidebar");
  const filter = h("input", {
    class: "filter",
    type: "search",
    placeholder: "Filter services",
    value: state.filter,
    "aria-label": "Filter services",
    oninput: (e) => {
      state.filter = e.target.value;
      renderSidebar();
      const f = nav.querySelector(".filter");
      f.focus();
      f.setSelectionRange(f.value.length, f.value.length);
    },
  });
  const overviewLink = h("a", { class: `nav-item overview ${state.selected ? "" : "active"}`, href: "#/" }, "All services", h("span", { class: "count" }, state.services.length));
  const groups = namespaces().map((ns) => {
    const services = state.services.filter((s) => s.namespace === ns && (!state.filter || s.service.includes(state.filter)));
    return h(
      "div",
      { class: "ns", dataset: { namespace: ns } },
      h("div", { class: "ns-name" }, ns, h("span", { class: "count" }, services.length)),
      services.length === 0 ? h("div", { class: "nav-empty" }, state.filter ? "no match" : "no services") : null,
      services.map((s) => {
        const active = sameService(s, state.selected);
        const degraded = s.states.unhealthy + s.states.offline + s.states.zero_weight > 0;
        return h(
          "a",
          {
            class: `nav-item ${active ? "active" : ""}`,
            href: `#/${encodeURIComponent(s.namespace)}/${encodeURIComponent(s.group)}/${encodeURIComponent(s.service)}`,
            dataset: { service: s.service },
          },
          h("span", { class: "nav-name" }, s.service, s.group !== "DEFAULT_GROUP" ? h("span", { class: "nav-group" }, s.group) : null),
          h("span", { class: `pill ${s.serving === 0 && s.instances > 0 ? "bad" : degraded ? "warn" : "ok"}`, title: `${s.serving} of ${s.instances} serving` }, `${s.serving}/${s.instances}`),
        );
      }),
    );
  });
  nav.replaceChildren(filter, overviewLink, ...groups);
}

function stateChips(states, instances) {
  const out = [];
  for (const k of ["serving", "unhealthy", "offline", "zero_weight"]) {
    if (states[k] > 0 || (k === "serving" && instances === 0)) out.push(chip(`${states[k]} ${STATE_LABEL[k]}`, k));
  }
  return h("span", { class: "chips" }, out);
}

function overview() {
  const totals = state.services.reduce(
    (t, s) => {
      t.instances += s.instances;
      t.serving += s.serving;
      t.subscribers += s.subscribers;
      t.notServing += s.instances - s.serving;
      return t;
    },
    { instances: 0, serving: 0, subscribers: 0, notServing: 0 },
  );
  const running = state.drains.filter((d) => d.state === "waiting").length;
  const cards = h(
    "div",
    { class: "cards" },
    card("Services", state.services.length, `${namespaces().length} namespace(s)`),
    card("Instances", totals.instances, `${totals.serving} serving · ${totals.notServing} not`),
    card("Subscribers", totals.subscribers, "sessions, watchers, pollers"),
    card("Drains", running, running ? "waiting for acks" : "none running"),
  );
  const rows = state.services.map((s) =>
    h(
      "tr",
      { class: "clickable", dataset: { service: s.service, namespace: s.namespace }, onclick: () => (location.hash = `#/${encodeURIComponent(s.namespace)}/${encodeURIComponent(s.group)}/${encodeURIComponent(s.service)}`) },
      h("td", {}, h("span", { class: "strong" }, s.service), h("div", { class: "sub" }, `${s.namespace} · ${s.group}`)),
      h("td", {}, s.kind ? chip(s.kind, "kind") : h("span", { class: "muted" }, "empty")),
      h("td", {}, stateChips(s.states, s.instances)),
      h("td", { class: "num" }, s.instances),
      h("td", { class: "num" }, s.subscribers),
      h("td", { class: "num" }, s.protect_threshold),
      h("td", { class: "mono", title: String(s.revision) }, shortRev(s.revision)),
    ),
  );
  return h(
    "div",
    {},
    h("h1", {}, "Services"),
    cards,
    drainsPanel(state.drains, "Drains"),
    state.services.length === 0
      ? h("p", { class: "empty" }, "No service holds instances, settings or subscribers yet.")
      : table("services-table", ["Service", "Kind", "Instances by state", "Total", "Subscribers", "Protect threshold", "Revision"], rows),
  );
}

function card(title, value, note) {
  return h("div", { class: "card stat" }, h("div", { class: "stat-title" }, title), h("div", { class: "stat-value" }, value), h("div", { class: "stat-note" }, note));
}

// `inService`: the drains of the service shown, whose name the rows need not repeat.
function drainsPanel(drains, title, inService) {
  if (drains.length === 0) return null;
  const running = drains.filter((d) => d.state === "waiting");
  const ended = drains.filter((d) => d.state !== "waiting").slice(0, running.length ? 3 : 5);
  return h("section", { class: "panel", id: "drains" }, h("h2", {}, title, h("span", { class: "count" }, running.length ? `${running.length} running` : "recent")), h("div", { class: "drains" }, [...running, ...ended].map((d) => drainRow(d, inService))));
}

const DRAIN_STATE = { waiting: "waiting for acks", complete: "complete", timed_out: "timed out", cancelled: "cancelled" };

function drainRow(d, inService) {
  const pct = d.total === 0 ? 100 : Math.round((100 * d.acked) / d.total);
  const bar = h("div", { class: "bar" }, h("div", { class: "fill" }));
  bar.firstChild.style.width = `${pct}%`;
  const laggards = d.laggards.map((l) => h("li", {}, h("span", { class: "mono" }, l.id), ` at ${l.address}, acked ${l.acked_revision === 0 ? "nothing yet" : shortRev(l.acked_revision)}`));
  const elapsed = d.state === "waiting" ? d.waited_ms + (Date.now() - state.fetchedAt) : d.waited_ms;
  return h(
    "div",
    { class: `drain ${d.state}`, dataset: { state: d.state, addr: addr(d.instance), service: d.service } },
    h(
      "div",
      { class: "drain-head" },
      h("span", { class: "strong" }, addr(d.instance)),
      inService ? null : h("span", { class: "muted" }, ` ${d.namespace}/${d.group}/${d.service}`),
      h("span", { class: "spacer" }),
      chip(DRAIN_STATE[d.state] || d.state, `drain-${d.state}`),
    ),
    h(
      "div",
      { class: "drain-body" },
      bar,
      h("span", { class: "drain-count" }, d.total === 0 ? "no subscriber" : `${d.acked} / ${d.total} acked`),
      h("span", { class: `muted drain-time ${d.state === "waiting" ? "ticking" : ""}`, dataset: { base: d.waited_ms, timeout: d.timeout_ms } }, `${ago(elapsed)} of ${ago(d.timeout_ms)}`),
    ),
    laggards.length ? h("div", { class: "laggards" }, h("span", { class: "muted" }, d.state === "waiting" ? "Waiting for:" : "Laggards:"), h("ul", {}, laggards)) : null,
  );
}

function serviceView() {
  const sel = state.selected;
  const summary = state.services.find((s) => sameService(s, sel));
  const d = state.detail;
  const head = h(
    "div",
    { class: "service-head" },
    h("div", { class: "crumbs" }, h("a", { href: "#/" }, "Services"), " / ", sel.namespace, " / ", sel.group),
    h(
      "h1",
      {},
      sel.service,
      summary && summary.kind ? chip(summary.kind, "kind") : null,
      d && d.protection_triggered ? chip("protect threshold fired", "bad", "Healthy ÷ enabled is at or below the threshold: consumers get every enabled instance") : null,
    ),
    summary
      ? h(
          "div",
          { class: "facts" },
          stateChips(summary.states, summary.instances),
          fact("protect threshold", summary.protect_threshold),
          fact("subscribers", summary.subscribers),
          fact("revision", summary.revision),
        )
      : h("p", { class: "muted" }, "The registry knows nothing of this service (yet)."),
  );
  const drains = state.drains.filter((x) => sameService(x, sel));
  return h("div", {}, head, drainsPanel(drains, "Drains of this service", true), instancesPanel(), subscribersPanel());
}

function fact(name, value) {
  return h("span", { class: "fact" }, h("span", { class: "muted" }, `${name} `), h("span", { class: "mono" }, value));
}

function keeper(i) {
  switch (i.liveness) {
    case "session": {
      const s = i.session;
      if (!s) return ["session", "gone"];
      return [`session ${s.id}${s.client_name ? ` · ${s.client_name}` : ""}`, s.address];
    }
    case "lease": {
      const l = i.lease;
      const hb = l.last_heartbeat_ms_ago + (Date.now() - state.fetchedAt);
      return ["lease (heartbeats)", h("span", { class: "live-time", dataset: { base: l.last_heartbeat_ms_ago } }, `last ${ago(hb)} ago`), ` · TTL ${ago(l.ttl_ms)}`];
    }
    case "probe": {
      const p = i.probe;
      return [`probe (${p.kind}${p.kind === "http" ? " " + p.path : ""})`, `every ${ago(p.interval_ms)}, fall ${p.fall}, rise ${p.rise}`];
    }
    case "grace":
      return ["grace", `ends in ${ago(i.grace.ends_in_ms)}`];
    default:
      return [i.liveness, ""];
  }
}

function instancesPanel() {
  const d = state.detail;
  if (!d) return h("p", { class: "muted" }, "Loading…");
  const sel = state.selected;
  const rows = d.instances.map((i) => {
    const [how, ...detail] = keeper(i);
    const meta = Object.entries(i.metadata || {});
    return h(
      "tr",
      { dataset: { addr: addr(i), state: i.state } },
      h("td", {}, h("span", { class: "mono strong" }, addr(i)), i.cluster !== "DEFAULT" ? h("div", { class: "sub" }, `cluster ${i.cluster}`) : null),
      h("td", {}, chip(STATE_LABEL[i.state] || i.state, i.state)),
      h("td", {}, i.healthy ? h("span", { class: "ok-text" }, "healthy") : h("span", { class: "bad-text" }, "unhealthy")),
      h("td", { class: "num" }, i.weight),
      h("td", {}, i.enabled ? "yes" : h("span", { class: "muted" }, "no")),
      h("td", { class: "meta" }, meta.length ? meta.map(([k, v]) => h("span", { class: "kv", title: `${k}=${v}` }, `${k}=${v}`)) : h("span", { class: "muted" }, "—")),
      h("td", {}, h("div", { class: "nowrap" }, how), h("div", { class: "sub" }, detail), i.owner ? h("div", { class: "sub" }, `owner ${i.owner}`) : null),
      h("td", { class: "nowrap", title: when(i.since_ms) }, h("span", { class: "since", dataset: { since: i.since_ms } }, since(i.since_ms))),
      h("td", { class: "actions" }, actions(sel, i)),
    );
  });
  const headers = ["Instance", "State", "Health", "Weight", "Enabled", "Metadata", "Kept alive by", "Since", ""];
  return tablePanel("Instances", "instances-table", headers, rows, "No instance.");
}

function actions(svc, i) {
  const busy = (a) => state.pending.has(`${keyOf(svc)}|${addr(i)}|${a}`);
  const button = (action, label, cls) =>
    h(
      "button",
      { type: "button", class: `small ${cls}`, disabled: busy(action) || null, dataset: { action }, onclick: () => confirmAction(svc, i, action) },
      busy(action) ? `${label}…` : label,
    );
  return i.enabled ? [button("drain", "Drain", "primary"), button("offline", "Offline", "ghost")] : [button("online", "Online", "ghost")];
}

function subscribersPanel() {
  const subs = state.subscribers;
  if (!subs) return null;
  const rows = subs.subscribers.map((s) =>
    h(
      "tr",
      { dataset: { subscriber: s.id } },
      h("td", {}, h("span", { class: "mono" }, s.id), s.client_name ? h("div", { class: "sub" }, s.client_name) : null),
      h("td", {}, chip(s.kind, "kind")),
      h("td", { class: "mono" }, s.address),
      h("td", { class: "mono", title: String(s.acked_revision) }, s.acked_revision ? shortRev(s.acked_revision) : "—"),
      h("td", { class: "mono", title: String(s.pushed_revision) }, s.pushed_revision ? shortRev(s.pushed_revision) : "—"),
      h("td", {}, s.lag_ms === null || s.lag_ms === undefined ? chip("up to date", "serving") : chip(`${s.behind} behind · ${ago(s.lag_ms)}`, s.lag_ms > 5000 ? "unhealthy" : "zero_weight")),
      h("td", {}, s.acked_at_ms ? since(s.acked_at_ms) : h("span", { class: "muted" }, "never")),
    ),
  );
  const headers = ["Subscriber", "Kind", "Address", "Acked", "Pushed", "Lag", "Last ack"];
  return tablePanel("Subscribers", "subscribers-table", headers, rows, "Nobody follows this service: a drain completes at once.");
}

function table(id, headers, rows) {
  return h("table", { id, class: "table" }, h("thead", {}, h("tr", {}, headers.map((t) => h("th", {}, t)))), h("tbody", {}, rows));
}

// A panel with a title, the number of rows, and their table (or `empty` when there is none).
function tablePanel(title, id, headers, rows, empty) {
  return h("section", { class: "panel" }, h("h2", {}, title, h("span", { class: "count" }, rows.length)), rows.length === 0 ? h("p", { class: "empty" }, empty) : table(id, headers, rows));
}

// Times that move while nothing is fetched.
function renderTimes() {
  for (const el of document.querySelectorAll(".since")) el.textContent = since(Number(el.dataset.since));
  const gone = Date.now() - state.fetchedAt;
  for (const el of document.querySelectorAll(".live-time")) el.textContent = `last ${ago(Number(el.dataset.base) + gone)} ago`;
  for (const el of document.querySelectorAll(".drain-time.ticking")) {
    el.textContent = `${ago(Math.min(Number(el.dataset.base) + gone, Number(el.dataset.timeout)))} of ${ago(Number(el.dataset.timeout))}`;
  }
}

// ---------------------------------------------------------------------------------------------
// Offline / online / drain

const ACTION_TEXT = {
  drain: (a, svc, n) => [
    `Drain ${a}?`,
    `It goes offline in ${keyOf(svc)} at once; the registry then waits until ${n === 1 ? "its one subscriber has" : `each of its ${n} subscribers has`} acked the revision without it (at most the server's drain timeout). Stop the process only after that.`,
  ],
  offline: (a, svc) => [`Take ${a} offline?`, `Consumers of ${keyOf(svc)} stop getting it with the next push; nothing waits for their acks. It stays offline until it is brought online.`],
  online: (a, svc) => [`Bring ${a} online?`, `Consumers of ${keyOf(svc)} get it again with the next push (if it is healthy).`],
};

function confirmAction(svc, i, action) {
  const n = state.subscribers ? state.subscribers.subscribers.length : 0;
  const [title, text] = ACTION_TEXT[action](addr(i), svc, n);
  const dialog = $("confirm");
  $("confirm-title").textContent = title;
  $("confirm-text").textContent = text;
  const ok = $("confirm-ok");
  ok.textContent = action === "drain" ? "Drain" : action === "offline" ? "Take offline" : "Bring online";
  ok.dataset.action = action;
  const done = (yes) => {
    ok.onclick = null;
    $("confirm-cancel").onclick = null;
    dialog.close();
    if (yes) run(svc, i, action);
  };
  ok.onclick = () => done(true);
  $("confirm-cancel").onclick = () => done(false);
  dialog.showModal();
}

async function run(svc, i, action) {
  const id = `${keyOf(svc)}|${addr(i)}|${action}`;
  state.pending.add(id);
  render();
  try {
    const result = await api("POST", instancePath(svc, i, action), {});
    if (action === "drain") {
      const n = result.acked.length + result.laggards.length;
      if (result.complete) {
        toast(`Drain of ${addr(i)} complete: ${n === 0 ? "no subscriber to wait for" : `${result.acked.length}/${n} subscriber(s) acked`} in ${ago(result.waited_ms)}.`, "ok");
      } else {
        toast(`Drain of ${addr(i)} timed out after ${ago(result.waited_ms)}: ${result.laggards.map((l) => l.id).join(", ")} did not ack.`, "warn");
      }
    } else {
      toast(`${addr(i)} is ${action === "offline" ? "offline" : "online"}.`, "ok");
    }
  } catch (e) {
    // The API's own refusal, word for word.
    toast(`${action[0].toUpperCase()}${action.slice(1)} of ${addr(i)} refused (${e.status} ${e.code}${e.rule ? `, rule ${e.rule}` : ""}): ${e.message}`, "error");
  } finally {
    state.pending.delete(id);
    refresh();
  }
}

function toast(text, kind) {
  const close = h("button", { type: "button", class: "toast-close", "aria-label": "Dismiss", onclick: () => t.remove() }, "×");
  const t = h("div", { class: `toast ${kind || ""}`, role: kind === "error" ? "alert" : "status" }, h("span", { class: "toast-text" }, text), close);
  $("toasts").append(t);
  setTimeout(() => t.remove(), kind === "error" ? 20000 : 8000);
}

document.addEventListener("DOMContentLoaded", start);
