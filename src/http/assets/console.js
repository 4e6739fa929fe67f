// delayd console: reads the JSON API under /api/v1 and shows it. Data from
// the API only ever reaches the page as text (textContent), never as markup.
// The view lives in the URL hash (#b=NAME&tab=dead&id=...), so a link or a
// reload shows the same thing. The token typed into the page (the read or
// the admin token), kept in this tab's sessionStorage, goes out with every
// API call as an Authorization header.
"use strict";

const API = "api/v1";
const POLL_MS = 5000;
const POLL_KEY = "delayd-poll-ms";
const TOKEN_KEY = "delayd-admin-token";

let overview = null;
let pendingCursor = null;
// The window the pending form last showed: a poll that re-renders the same
// window leaves the fields alone, so it never wipes what is being typed.
let pendingShown = null;
let searchCursor = null;
let pendingConfirm = null;

// --- small helpers ---------------------------------------------------------

function $(id) { return document.getElementById(id); }

// An element with attributes and children; strings become text nodes.
function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") e.className = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children) {
    if (c === null || c === undefined) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function clear(node) { while (node.firstChild) node.removeChild(node.firstChild); }

// Shows `rows` in the table body `body`, keeping every cell that reads the
// same: the page refreshes every few seconds, and a button replaced by an
// equal one loses the click on its way to it. A row's attributes say what
// it stands for, so cells are kept only in a row that stands for the same.
function fill(body, rows) {
  const old = Array.from(body.rows);
  const attrs = (e) => Array.from(e.attributes, (a) => a.name + "=" + a.value).join(" ");
  const same = old.length === rows.length && rows.every((r, i) =>
    attrs(r) === attrs(old[i]) && r.cells.length === old[i].cells.length);
  if (!same) { body.replaceChildren(...rows); return; }
  rows.forEach((r, i) => {
    Array.from(r.cells).forEach((c, j) => {
      const o = old[i].cells[j];
      if (o.outerHTML !== c.outerHTML) o.replaceWith(c);
    });
  });
}

function state() { return new URLSearchParams(location.hash.slice(1)); }

function setState(changes) {
  const s = state();
  for (const [k, v] of Object.entries(changes)) {
    if (v === null || v === undefined || v === "") s.delete(k); else s.set(k, v);
  }
  const next = "#" + s.toString();
  if (next !== location.hash) location.hash = next; else render();
}

function token() { return sessionStorage.getItem(TOKEN_KEY) || ""; }

function span(ms) {
  if (ms === null || ms === undefined) return "–";
  if (ms > 100 * 365 * 86400000) return "far future";
  const s = Math.abs(ms) / 1000;
  if (s < 1) return Math.round(Math.abs(ms)) + "ms";
  if (s < 60) return s.toFixed(1) + "s";
  const parts = [[86400, "d"], [3600, "h"], [60, "m"], [1, "s"]];
  let left = Math.floor(s), out = [];
  for (const [n, u] of parts) {
    if (left >= n && out.length < 2) { out.push(Math.floor(left / n) + u); left %= n; }
  }
  return out.join(" ");
}

function when(ms) {
  if (ms === null || ms === undefined) return "–";
  const d = new Date(ms);
  return isNaN(d) ? String(ms) : d.toISOString().replace("T", " ").replace(".000Z", "Z");
}

function rate(v) { return v === null || v === undefined ? "–" : (v < 10 ? v.toFixed(2) : v.toFixed(0)); }
function ms(v) { return v === null || v === undefined ? "–" : v.toFixed(1) + "ms"; }

// Bytes as the API shows them: text, cut with the full size.
function shown(m) {
  if (!m) return "";
  return m.truncated ? m.text + "… (cut: " + m.bytes + " bytes in all)" : m.text;
}

async function api(method, path, body) {
  const headers = {};
  if (body !== undefined) headers["Content-Type"] = "application/json";
  if (token()) headers["Authorization"] = "Bearer " + token();
  const r = await fetch(API + path, {
    method, headers, credentials: "omit", cache: "no-store",
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  let json = null;
  try { json = await r.json(); } catch (_) { json = { error: "HTTP " + r.status }; }
  return { status: r.status, ok: r.ok, json };
}

function showError(text) {
  const e = $("error");
  e.hidden = !text;
  e.textContent = text || "";
}

function showResult(text, bad) {
  const r = $("result");
  r.hidden = !text;
  r.className = bad ? "result bad" : "result";
  r.textContent = text || "";
}

function business() {
  const name = state().get("b");
  return overview && overview.businesses.find((b) => b.name === name);
}

function path(b) { return "/businesses/" + encodeURIComponent(b.name); }

// --- overview ----------------------------------------------------------------

async function loadOverview() {
  const r = await api("GET", "/businesses");
  if (r.status === 401) {
    $("token-form").hidden = false;
    showError(token() ? "this token does not open the console: " + r.json.error
      : "this console needs a token to read: type the read token or the admin token above");
    return;
  }
  if (!r.ok) { showError(r.json.error); return; }
  showError("");
  overview = r.json;
  $("health").textContent = "redis " + r.json.redis + " · amqp " + r.json.amqp;
  const mode = $("mode");
  mode.textContent = r.json.read_only ? "read-only"
    : r.json.can_write ? "writes allowed with this token" : "read-only: writes need the admin token";
  mode.className = r.json.can_write ? "badge" : "badge ro";
  for (const w of document.querySelectorAll(".write")) w.hidden = !r.json.can_write;
  $("token-form").hidden = r.json.read_only && !r.json.reads_need_token;
  const rows = [];
  for (const b of r.json.businesses) {
    const cell = (field, v) => el("td", { "data-field": field }, v);
    const link = el("a", { href: "#" + new URLSearchParams({ b: b.name, tab: "histogram" }) }, b.name);
    if (b.error) {
      rows.push(el("tr", { "data-business": b.name }, el("td", {}, link),
        el("td", { class: "paused", colspan: 15 }, b.error)));
      continue;
    }
    const rt = b.rates || {};
    const within = b.due_within || {};
    rows.push(el("tr", { "data-business": b.name },
      el("td", {}, link),
      cell("pending", b.tenants_uncounted ? b.pending + "+" : b.pending), cell("due_now", b.due_now),
      cell("oldest_overdue", span(b.oldest_overdue_ms)),
      cell("in_flight", b.in_flight), cell("dead", b.dead),
      cell("due_1m", within["1m"]), cell("due_1h", within["1h"]), cell("due_1d", within["1d"]),
      cell("claimed", rate(rt.claimed_per_s)), cell("confirmed", rate(rt.confirmed_per_s)),
      cell("retried", rate(rt.retried_per_s)), cell("dead_lettered", rate(rt.dead_lettered_per_s)),
      cell("p50", ms(rt.lateness_p50_ms)), cell("p99", ms(rt.lateness_p99_ms)),
      b.pause ? el("td", { class: "paused", "data-field": "paused" }, "paused by " + b.pause.by + " " + span(r.json.now_ms - b.pause.since_ms) + " ago")
        : b.paused ? el("td", { class: "paused", "data-field": "paused" }, "paused: " + b.paused)
        : el("td", { "data-field": "paused" }, "ok")));
  }
  fill($("businesses").tBodies[0], rows);
}

// --- one business --------------------------------------------------------------

async function loadHistogram(b) {
  const r = await api("GET", path(b) + "/histogram");
  const out = $("histogram");
  if (!r.ok) { showResult(r.json.error, true); return; }
  clear(out);
  const buckets = r.json.buckets;
  const groups = [
    ["overdue and the next hour, by minute", buckets.slice(0, 61), "now", "+1h"],
    ["the next day, by hour", buckets.slice(61, 84), "+1h", "+24h"],
    ["the next week, by day, and later", buckets.slice(84), "+1d", "later"],
  ];
  const wrap = el("div", { class: "hist" });
  for (const [title, part, from, to] of groups) {
    const total = part.reduce((s, x) => s + x.count, 0);
    const max = Math.max(1, ...part.map((x) => x.count));
    const bars = el("div", { class: "bars" });
    for (const x of part) {
      const h = x.count ? Math.max(2, Math.round((x.count / max) * 100)) : 0;
      const bar = el("div", {
        class: "bar" + (x.count ? "" : " zero") + (x.label === "overdue" ? " overdue" : ""),
        title: x.label + ": " + x.count + (x.to_ms ? " (by " + when(x.to_ms) + ")" : ""),
        "data-label": x.label, "data-count": x.count,
      });
      bar.style.height = h + "%";
      bars.append(bar);
    }
    wrap.append(el("h3", {}, title + ": " + total), bars,
      el("div", { class: "axis" }, el("span", {}, from), el("span", {}, to)));
  }
  out.append(wrap);
}

async function loadPending(b) {
  const s = state();
  const q = new URLSearchParams({ limit: "50" });
  for (const k of ["from", "to", "cursor", "tenant"]) if (s.get(k)) q.set(k, s.get(k));
  const r = await api("GET", path(b) + "/tasks?" + q);
  if (!r.ok) { showResult(r.json.error, true); return; }
  pendingCursor = r.json.cursor;
  $("pending-next").disabled = !pendingCursor;
  const rows = [];
  for (const t of r.json.tasks) {
    const label = shown(t.member);
    const member = b.member === "id"
      ? el("a", { href: "#" + new URLSearchParams({ b: b.name, tab: "find", id: t.member.text }) }, label)
      : label;
    rows.push(el("tr", {}, el("td", {}, when(t.due_ms)),
      el("td", {}, t.due_ms >= r.json.now_ms ? "in " + span(t.due_ms - r.json.now_ms) : span(r.json.now_ms - t.due_ms) + " ago"),
      el("td", { class: "text" }, member)));
  }
  if (!rows.length) rows.push(el("tr", {}, el("td", { colspan: 3 }, "nothing pending in this window")));
  fill($("pending").tBodies[0], rows);
}

async function loadTask(b, id) {
  const out = $("task");
  const r = await api("GET", path(b) + "/tasks/" + encodeURIComponent(id));
  clear(out);
  if (!r.ok && r.status !== 404) { out.append(el("p", { class: "error" }, r.json.error)); return; }
  const t = r.json;
  const rows = [["id", t.id], ["state", t.state], ["key", t.key]];
  if (t.due_ms !== undefined) rows.push(["due", when(t.due_ms) + " (" + (t.due_ms >= t.now_ms ? "in " : "") + span(t.due_ms - t.now_ms) + (t.due_ms < t.now_ms ? " ago" : "") + ")"]);
  if (t.lease_deadline_ms !== undefined) rows.push(["lease ends", when(t.lease_deadline_ms)]);
  if (t.died_ms !== undefined) rows.push(["died", when(t.died_ms)], ["reason", t.reason]);
  if (t.error) rows.push(["note", t.error]);
  const dl = el("dl", { class: "task" });
  for (const [k, v] of rows) dl.append(el("dt", {}, k), el("dd", { "data-field": k }, v));
  out.append(dl);
  if (t.body) {
    out.append(el("h3", {}, "body (" + t.body.bytes + " bytes" + (t.body.truncated ? ", first 4 KiB shown" : "") + ")"),
      el("pre", { class: "body", id: "task-body" }, t.body.text));
  }
  if (t.state === "pending") {
    const resched = el("input", { id: "resched-in", placeholder: "e.g. 10m", size: 8 });
    out.append(el("p", { class: "row write" },
      el("button", { id: "task-run", onclick: () => act("POST", path(b) + "/tasks/" + encodeURIComponent(id) + "/run", {}) }, "run now"),
      el("button", { id: "task-cancel", class: "danger", onclick: () => act("DELETE", path(b) + "/tasks/" + encodeURIComponent(id)) }, "cancel"),
      el("label", {}, "reschedule in ", resched),
      el("button", { onclick: () => act("POST", path(b) + "/tasks/" + encodeURIComponent(id) + "/reschedule", { in: resched.value }) }, "move")));
    for (const w of out.querySelectorAll(".write")) w.hidden = !overview.can_write;
  }
}

// One page of /search shown in the search table (emptied for a first page):
// the answer and the table body, or null with the error shown.
async function searchPage(b, q, cursor) {
  if (cursor) q.set("cursor", cursor);
  const r = await api("GET", path(b) + "/search?" + q);
  if (!r.ok) { showResult(r.json.error, true); return null; }
  const table = $("search");
  table.hidden = false;
  const body = table.tBodies[0];
  if (!cursor) clear(body);
  return { r, body };
}

async function search(b, prefix, cursor) {
  const q = new URLSearchParams({ prefix, limit: "50" });
  const tenant = $("find-tenant").value.trim();
  if (b.tenants && tenant) q.set("tenant", tenant);
  const page = await searchPage(b, q, cursor);
  if (!page) return;
  const { r, body } = page;
  for (const t of r.json.tasks) body.append(el("tr", {}, el("td", {}, when(t.due_ms)), el("td", { class: "text" }, shown(t.member))));
  searchCursor = r.json.cursor;
  $("search-more").hidden = !searchCursor;
  $("search-note").textContent = (body.rows.length + " found") +
    (r.json.partial ? "; the search is partial (bounded per request): search on for more" : "; searched to the end");
}

async function loadDead(b) {
  const r = await api("GET", path(b) + "/dead?limit=100");
  if (!r.ok) { showResult(r.json.error, true); return; }
  $("dead-summary").textContent = r.json.total + " dead" + (r.json.total > r.json.members.length ? "; the oldest " + r.json.members.length + " shown" : "");
  const rows = [];
  for (const m of r.json.members) {
    // The handle names the member's exact bytes; its text may be cut or
    // escaped. On the row too: its buttons act on the handle.
    const one = { handle: m.handle };
    const label = shown(m.member);
    rows.push(el("tr", { "data-member": m.member.text, "data-handle": m.handle },
      el("td", { class: "text" }, label),
      el("td", {}, span(r.json.now_ms - m.died_ms) + " ago"),
      el("td", { class: "text" }, m.reason),
      el("td", {},
        el("button", { class: "write", "data-act": "requeue", onclick: () => askDead(b, "requeue", one, label) }, "requeue"),
        " ",
        el("button", { class: "write danger", "data-act": "purge", onclick: () => askDead(b, "purge", one, label) }, "purge"))));
  }
  const body = $("dead").tBodies[0];
  fill(body, rows);
  for (const w of body.querySelectorAll(".write")) w.hidden = !overview.can_write;
}

// Counts first (dry_run), then asks, then acts.
async function askDead(b, action, filter, label) {
  const r = await api("POST", path(b) + "/dead/" + action, Object.assign({ dry_run: true }, filter));
  const box = $("dead-confirm");
  clear(box);
  if (!r.ok) { showResult(r.json.error, true); return; }
  const what = filter.handle !== undefined ? "\u201c" + label + "\u201d"
    : filter.reason !== undefined ? "whose reason contains \u201c" + filter.reason + "\u201d" : "(all)";
  const n = r.json.count;
  box.append(action + " " + n + " dead member" + (n === 1 ? " " : "s ") + what + (r.json.partial ? " (at least; the count is partial)" : "") + "? ",
    el("button", { id: "dead-confirm-go", class: action === "purge" ? "danger" : "", onclick: async () => {
      box.hidden = true;
      await act("POST", path(b) + "/dead/" + action, filter);
    } }, action + " " + n),
    " ",
    el("button", { onclick: () => { box.hidden = true; } }, "keep them"));
  box.hidden = false;
}

async function act(method, p, body) {
  const r = await api(method, p, body);
  if (r.ok) {
    const j = r.json;
    showResult(j.action ? j.action + ": " + j.count + " done" : (j.result || "done") + (j.due_ms ? ", due " + when(j.due_ms) : ""), false);
  } else {
    showResult(r.json.error || "HTTP " + r.status, true);
  }
  await inTurn();
}

// --- search by payload (id mode) ----------------------------------------------

let bodyCursor = null;

async function searchBody(b, text, cursor) {
  const page = await searchPage(b, new URLSearchParams({ body: text, limit: "50" }), cursor);
  if (!page) return;
  const { r, body } = page;
  for (const t of r.json.tasks) {
    const link = el("a", { href: "#" + new URLSearchParams({ b: b.name, tab: "find", id: t.id.text }) }, shown(t.id));
    body.append(el("tr", { "data-id": t.id.text }, el("td", {}, t.due_ms === null ? "not pending" : when(t.due_ms)),
      el("td", { class: "text" }, link, ": ", shown(t.body))));
  }
  bodyCursor = r.json.cursor;
  searchCursor = null;
  $("search-more").hidden = !bodyCursor;
  $("search-note").textContent = body.rows.length + " found" +
    (r.json.partial ? "; searched part of the bodies (bounded per request): search on for more" : "; searched to the end");
}

// --- bulk actions: count, confirm that count, act a bounded step at a time --

function bulkRequest() {
  const action = $("bulk-action").value;
  const body = {};
  if (action === "requeue" || action === "purge") {
    body.reason = $("bulk-reason").value;
  } else {
    const prefix = $("bulk-prefix").value;
    const from = $("bulk-from").value.trim(), to = $("bulk-to").value.trim();
    if (prefix) body.prefix = prefix;
    if (from) body.from = from;
    if (to) body.to = to;
    const tenant = $("bulk-tenant").value.trim();
    if (tenant) body.tenant = tenant;
    if (action === "reschedule") body.in = $("bulk-in").value.trim();
  }
  return [action, body];
}

// A tenant field only where the business has tenants, and not for dead
// members, which are kept per business, nor for a find by id (an id is
// found in whichever tenant's set holds it).
function tenantFields(b) {
  const dead = $("bulk-action").value === "requeue" || $("bulk-action").value === "purge";
  for (const l of document.querySelectorAll(".tenant-field")) {
    l.hidden = !(b && b.tenants) || (dead && l.classList.contains("bulk-pending")) ||
      (b.member === "id" && l.classList.contains("find-prefix"));
  }
}

function bulkFields() {
  const action = $("bulk-action").value;
  const dead = action === "requeue" || action === "purge";
  for (const l of document.querySelectorAll(".bulk-pending")) l.hidden = dead;
  tenantFields(business());
  for (const l of document.querySelectorAll(".bulk-dead")) l.hidden = !dead;
  for (const l of document.querySelectorAll(".bulk-move")) l.hidden = action !== "reschedule";
  $("bulk-confirm").hidden = true;
}

async function bulkCount(b) {
  const [action, body] = bulkRequest();
  const r = await api("POST", path(b) + "/bulk/" + action, Object.assign({ dry_run: true }, body));
  const box = $("bulk-confirm");
  clear(box);
  box.hidden = true;
  if (!r.ok) { showResult(r.json.error, true); return; }
  showResult("");
  const n = r.json.count;
  box.append(action + " " + n + " (" + r.json.filter + ")" + (r.json.partial ? ", at least: the count is partial" : "") + "? ");
  if (n > 0) {
    box.append(el("button", { id: "bulk-go", class: "write" + (action === "purge" || action === "cancel" ? " danger" : ""),
      onclick: () => { box.hidden = true; bulkRun(b, action, body, n); } }, action + " " + n), " ");
  }
  box.append(el("button", { onclick: () => { box.hidden = true; } }, "leave them"));
  for (const w of box.querySelectorAll(".write")) w.hidden = !overview.can_write;
  box.hidden = false;
}

async function bulkRun(b, action, body, n) {
  let cursor = null, total = 0, steps = 0;
  do {
    const req = Object.assign({}, body, cursor ? { cursor } : { confirm: n });
    const r = await api("POST", path(b) + "/bulk/" + action, req);
    if (!r.ok) { showResult(r.json.error, true); break; }
    total += r.json.touched;
    steps += 1;
    cursor = r.json.cursor;
    $("bulk-progress").textContent = action + ": " + total + " of at most " + n + " done in " + steps + " step" + (steps === 1 ? "" : "s") + (cursor ? "; going on…" : "");
  } while (cursor && steps < 10000);
  if (!cursor) showResult(action + ": " + total + " done", false);
  await inTurn();
}

function wireBulk() {
  $("bulk-action").addEventListener("change", bulkFields);
  $("bulk-form").addEventListener("submit", (e) => {
    e.preventDefault();
    const b = business();
    if (b) bulkCount(b);
  });
  $("body-form").addEventListener("submit", (e) => {
    e.preventDefault();
    const b = business();
    if (b) searchBody(b, $("body-input").value, null);
  });
  $("search-more").addEventListener("click", () => {
    const b = business();
    if (b && bodyCursor) searchBody(b, $("body-input").value, bodyCursor);
  });
}

// --- the intake, beside delivery ---------------------------------------------

function renderIntakes(o) {
  const rows = o.businesses.filter((b) => b.intake);
  $("intakes").hidden = !rows.length;
  const shownRows = [];
  for (const b of rows) {
    const i = b.intake;
    const cell = (field, v) => el("td", { "data-field": field }, v);
    shownRows.push(el("tr", { "data-business": b.name },
      el("td", {}, b.name), el("td", { class: "text" }, i.queue),
      i.consuming ? cell("consumer", "up") : el("td", { class: "paused", "data-field": "consumer" }, "down"),
      cell("queue_messages", i.queue_messages),
      cell("taken_in_rate", rate(i.taken_in_per_s)), cell("taken_in", i.taken_in_total),
      cell("rejected_rate", rate(i.rejected_per_s)), cell("rejected", i.rejected_total),
      cell("waiting", i.waiting_for_redis)));
  }
  fill($("intake").tBodies[0], shownRows);
}

// The state cell of something an operator can pause (a schedule, a tenant):
// who paused it and how long ago, or "running".
function pauseCell(paused, nowMs) {
  return paused
    ? el("td", { class: "paused", "data-field": "state" }, "paused by " + paused.by + " " + span(nowMs - paused.since_ms) + " ago")
    : el("td", { "data-field": "state" }, "running");
}

// The button that pauses or resumes what `base` (its API path) names.
function pauseButton(base, paused) {
  return el("button", { class: "write", "data-act": paused ? "resume" : "pause",
    onclick: () => act("POST", base + (paused ? "/resume" : "/pause"), {}) }, paused ? "resume" : "pause");
}

// --- recurring schedules -----------------------------------------------------

async function loadSchedules(b) {
  const r = await api("GET", path(b) + "/schedules");
  if (!r.ok) { showResult(r.json.error, true); return; }
  const rows = [];
  $("schedules-note").textContent = r.json.schedules.length
    ? "Each schedule's next occurrences, the latest delivered and the occurrences missed while no instance ran (every instance's count). A paused schedule writes nothing on any instance until resumed; run now delivers one extra occurrence."
    : "This business has no recurring schedules ([businesses." + b.name + ".recurring.NAME] in the configuration).";
  for (const s of r.json.schedules) {
    const one = path(b) + "/schedules/" + encodeURIComponent(s.name);
    const next = s.next.slice(0, 3).map((o) => o.local).join("\n");
    const last = s.last_delivered ? s.last_delivered.local + " (" + span(r.json.now_ms - s.last_delivered.due_ms) + " ago)" : "–";
    const state = pauseCell(s.paused, r.json.now_ms);
    rows.push(el("tr", { "data-schedule": s.name },
      el("td", {}, s.name), el("td", { class: "text" }, s.cron), el("td", {}, s.tz),
      el("td", { class: "text", "data-field": "next" }, next),
      el("td", { "data-field": "last" }, last),
      el("td", { "data-field": "missed" }, s.missed),
      state,
      el("td", {},
        el("button", { class: "write", "data-act": "run", onclick: () => act("POST", one + "/run", {}) }, "run now"),
        " ",
        pauseButton(one, s.paused))));
  }
  const body = $("schedules").tBodies[0];
  fill(body, rows);
  for (const w of body.querySelectorAll(".write")) w.hidden = !overview.can_write;
}

// --- tenants -------------------------------------------------------------------

async function loadTenants(b) {
  const r = await api("GET", path(b) + "/tenants?limit=100");
  if (!r.ok) { showResult(r.json.error, true); return; }
  const l = r.json;
  $("tenants-note").textContent = l.tenants + " tenants with pending tasks, " + l.paused +
    " paused; the 100 whose earliest task is due first. Due tasks leave in weighted fair shares; a paused tenant's tasks stay until resumed, on every instance.";
  const rows = [];
  for (const t of l.rows) {
    const one = path(b) + "/tenants/" + encodeURIComponent(t.tenant);
    const weight = el("input", { type: "number", min: "1", max: "1000", value: String(t.weight), "aria-label": "weight of " + t.tenant });
    // Empty: the config's max rate again.
    const maxRate = el("input", { type: "number", min: "1", max: "10000000", value: t.max_rate === null ? "" : String(t.max_rate), placeholder: "none", "aria-label": "max rate of " + t.tenant });
    const state = pauseCell(t.paused, l.now_ms);
    rows.push(el("tr", { "data-tenant": t.tenant },
      el("td", { class: "text" }, t.tenant),
      el("td", { "data-field": "pending" }, t.pending),
      el("td", { "data-field": "due" }, t.due),
      el("td", { "data-field": "next" }, t.next_due_ms === null ? "–" : when(t.next_due_ms)),
      el("td", { "data-field": "overdue" }, t.oldest_overdue_ms ? span(t.oldest_overdue_ms) : "–"),
      el("td", { "data-field": "released" }, t.released_per_s),
      el("td", { "data-field": "weight" }, t.weight + (t.weight_set_at_run_time ? " (set)" : "")),
      el("td", { "data-field": "max_rate" }, (t.max_rate === null ? "–" : t.max_rate + "/s") + (t.max_rate_set_at_run_time ? " (set)" : "")),
      state,
      el("td", { class: "actions" },
        pauseButton(one, t.paused),
        " ",
        el("span", { class: "write" }, weight,
          el("button", { "data-act": "weight", onclick: () => act("POST", one + "/weight", { weight: Number(weight.value) }) }, "set weight")),
        " ",
        el("span", { class: "write" }, maxRate,
          el("button", { "data-act": "max_rate", onclick: () => act("POST", one + "/max_rate", { max_rate: maxRate.value === "" ? null : Number(maxRate.value) }) }, "set max rate")))));
  }
  const body = $("tenants").tBodies[0];
  fill(body, rows);
  for (const w of body.querySelectorAll(".write")) w.hidden = !overview.can_write;
}

// --- live: how often the page refreshes ----------------------------------------

let pollTimer = null;

// Every 2 s at the most: faster, an idle business's page would cost Redis
// more than one command a second.
const POLL_MIN_MS = 2000;

function pollMs() {
  const v = Number(localStorage.getItem(POLL_KEY));
  if (!Number.isFinite(v) || localStorage.getItem(POLL_KEY) === null) return POLL_MS;
  return v === 0 ? 0 : Math.max(v, POLL_MIN_MS);
}

// Polls every pollMs() while the tab is visible; says how often and when last.
function schedulePoll() {
  if (pollTimer) clearInterval(pollTimer);
  pollTimer = null;
  const every = pollMs();
  $("poll").value = String(every);
  if (every > 0) pollTimer = setInterval(() => { if (!document.hidden) render(); }, every);
  showPollState();
}

function showPollState() {
  const every = pollMs();
  const last = new Date().toTimeString().slice(0, 8);
  $("poll-state").textContent = (every > 0
    ? "counts and rates refresh every " + every / 1000 + " s while this tab is visible"
    : "refreshing is off: reload or pick an interval") + "; last " + last;
}

// --- the audit log -----------------------------------------------------------

let auditCursor = null;

async function loadAudit(cursor) {
  const q = new URLSearchParams({ limit: "50" });
  if (cursor) q.set("cursor", cursor);
  const r = await api("GET", "/audit?" + q);
  if (!r.ok) { showError(r.json.error); return; }
  const body = $("audit-log").tBodies[0];
  if (!cursor) clear(body);
  for (const e of r.json.entries) {
    body.append(el("tr", { "data-action": e.action },
      el("td", {}, when(e.at_ms)), el("td", {}, e.by), el("td", {}, e.business),
      el("td", {}, e.action), el("td", { class: "text" }, e.what), el("td", {}, e.count)));
  }
  if (!body.rows.length) body.append(el("tr", {}, el("td", { colspan: 6 }, "no writes recorded")));
  auditCursor = r.json.cursor;
  $("audit-more").hidden = !auditCursor;
}

// --- the view ----------------------------------------------------------------

async function renderBusiness(b) {
  const s = state();
  const tab = s.get("tab") || "histogram";
  $("business-name").textContent = b.name + (b.member === "id" ? " (tasks by id)" : " (tasks are their bodies)");
  $("pause-state").textContent = b.pause
    ? "paused by " + b.pause.by + " since " + when(b.pause.since_ms) + ": nothing is claimed, pending work stays"
    : "running";
  $("pause-state").className = b.pause ? "paused" : "muted";
  const toggle = $("pause-toggle");
  toggle.textContent = b.pause ? "resume" : "pause";
  toggle.dataset.action = b.pause ? "resume" : "pause";
  toggle.hidden = !overview.can_write;
  for (const a of document.querySelectorAll("#tabs a")) {
    a.className = a.dataset.tab === tab ? "on" : "";
    a.href = "#" + new URLSearchParams({ b: b.name, tab: a.dataset.tab });
  }
  for (const t of document.querySelectorAll(".tab")) t.hidden = t.id !== "tab-" + tab;
  if (tab === "histogram") await loadHistogram(b);
  if (tab === "pending") {
    const asked = [b.name, s.get("from") || "", s.get("to") || "", s.get("tenant") || ""];
    if (JSON.stringify(asked) !== pendingShown) {
      pendingShown = JSON.stringify(asked);
      [$("pending-from").value, $("pending-to").value, $("pending-tenant").value] = asked.slice(1);
    }
    await loadPending(b);
  }
  if (tab === "find") {
    $("find-label").textContent = b.member === "id" ? "id" : "body starts with";
    const id = s.get("id");
    if (b.member === "id" && id) { $("find-input").value = id; await loadTask(b, id); }
    else if (b.member === "id") clear($("task"));
  }
  if (tab === "dead") await loadDead(b);
  if (tab === "find") $("body-form").hidden = b.member !== "id";
  if (tab === "schedules") await loadSchedules(b);
  if (tab === "tenants") await loadTenants(b);
}

async function refresh() {
  try {
    const audit = state().get("view") === "audit";
    $("audit").hidden = !audit;
    $("overview").hidden = audit;
    if (audit) { $("business").hidden = true; return; }
    await loadOverview();
    if (overview) { renderIntakes(overview); showPollState(); }
    const b = business();
    $("business").hidden = !b;
    if (b) $("schedules-tab").hidden = !b.schedules;
    if (b) $("tenants-tab").hidden = !b.tenants;
    if (b) tenantFields(b);
    if (b) await renderBusiness(b);
  } catch (e) {
    showError("cannot reach delayd: " + e.message);
  }
}

// One refresh at a time, in the order asked: a slow poll's answer must not
// land after, and over, the answer to an action taken since (a row's
// inputs would be rebuilt from the stale values under the user's typing).
let turn = Promise.resolve();
function inTurn() {
  const next = turn.then(refresh);
  turn = next.catch(() => {});
  return next;
}

let busy = false;
async function render() {
  if (busy) return;
  busy = true;
  try { await inTurn(); } finally { busy = false; }
}

function wire() {
  const t = $("token");
  $("token-state").textContent = token() ? "token set for this tab" : "no token";
  $("token-form").addEventListener("submit", (e) => {
    e.preventDefault();
    if (t.value) sessionStorage.setItem(TOKEN_KEY, t.value);
    t.value = "";
    $("token-state").textContent = token() ? "token set for this tab" : "no token";
    render();
  });
  $("token-forget").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    $("token-state").textContent = "no token";
    render();
  });
  $("pending-form").addEventListener("submit", (e) => {
    e.preventDefault();
    setState({ from: $("pending-from").value.trim(), to: $("pending-to").value.trim(), tenant: $("pending-tenant").value.trim(), cursor: null });
  });
  $("pending-first").addEventListener("click", () => setState({ cursor: null }));
  $("pending-next").addEventListener("click", () => { if (pendingCursor) setState({ cursor: pendingCursor }); });
  $("find-form").addEventListener("submit", (e) => {
    e.preventDefault();
    const b = business();
    const v = $("find-input").value;
    if (!b) return;
    if (b.member === "id") setState({ id: v });
    else search(b, v, null);
  });
  $("pause-toggle").addEventListener("click", (e) => {
    const b = business();
    if (b) act("POST", path(b) + "/" + e.target.dataset.action, {});
  });
  $("search-more").addEventListener("click", () => { const b = business(); if (b && searchCursor) search(b, $("find-input").value, searchCursor); });
  $("dead-form").addEventListener("submit", (e) => {
    e.preventDefault();
    const b = business();
    const reason = $("dead-reason").value;
    const action = (e.submitter && e.submitter.dataset.action) || "requeue";
    if (b) askDead(b, action, reason ? { reason } : { all: true });
  });
  for (const f of ["dead-form"]) for (const btn of $(f).querySelectorAll("button")) btn.classList.add("write");
  $("audit-more").addEventListener("click", () => loadAudit(auditCursor));
  wireBulk();
  window.addEventListener("hashchange", () => {
    showResult("");
    if (state().get("view") === "audit") loadAudit(null);
    render();
  });
  if (state().get("view") === "audit") loadAudit(null);
  $("poll").addEventListener("change", (e) => {
    localStorage.setItem(POLL_KEY, e.target.value);
    schedulePoll();
  });
  $("live").addEventListener("submit", (e) => e.preventDefault());
  schedulePoll();
  render();
}

wire();
