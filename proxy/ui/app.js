// brim's dashboard: polls GET /admin/status with the admin key and draws it. No libraries.
// Everything shown comes from the server as data and is written with textContent, never as HTML.
"use strict";

const KEY_ITEM = "brim-admin-key";
const POLL_MS = 5000;
const SVG = "http://www.w3.org/2000/svg";
const COLORS = ["#2563eb", "#db2777", "#059669", "#d97706", "#7c3aed", "#0891b2", "#dc2626", "#4b5563"];
const KINDS = ["prevented", "survived", "refused", "blocked"];
const $ = (id) => document.getElementById(id);

// The key: a `#key=…` fragment (never sent to a server) is taken once and removed from the
// address bar; otherwise the one this tab kept; otherwise the form asks.
function takeKeyFromFragment() {
  const match = /(?:^#|&)key=([^&]*)/.exec(location.hash);
  if (match) {
    sessionStorage.setItem(KEY_ITEM, decodeURIComponent(match[1]));
    history.replaceState(null, "", location.pathname + location.search);
  }
}

function el(tag, attrs, ...children) {
  const node = tag.startsWith("svg:") ? document.createElementNS(SVG, tag.slice(4)) : document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) node.setAttribute(name, String(value));
  for (const child of children) node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  return node;
}

const number = (n) => (n ?? 0).toLocaleString("en-US");
const percent = (r) => `${Math.round(r * 100)}%`;
const clock = (t) => new Date(t * 1000).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", hour12: false });
const seconds = (date) => date.toLocaleTimeString([], { hour12: false });
const KEYS_SHOWN = 3;
function duration(s) {
  s = Math.round(s);
  if (s < 90) return `${s} s`;
  if (s < 5400) return `${Math.round(s / 60)} min`;
  if (s < 172800) return `${(s / 3600).toFixed(1)} h`;
  return `${Math.round(s / 86400)} d`;
}

function showLogin(message) {
  $("board").hidden = true;
  $("forget").hidden = true;
  $("login").hidden = false;
  $("login-error").textContent = message || "";
  $("state").textContent = "admin key needed";
  $("key").focus();
}

let timer = null;
async function poll() {
  clearTimeout(timer);
  const key = sessionStorage.getItem(KEY_ITEM);
  if (!key) return showLogin("");
  let reply;
  try {
    reply = await fetch("/admin/status", { headers: { "x-brim-admin-key": key }, cache: "no-store" });
  } catch (error) {
    $("state").textContent = `brim did not answer (${error.message}); retrying`;
    timer = setTimeout(poll, POLL_MS);
    return;
  }
  if (reply.status === 401 || reply.status === 403) {
    sessionStorage.removeItem(KEY_ITEM);
    const body = await reply.json().catch(() => ({}));
    return showLogin(body?.error?.message || `brim answered ${reply.status}`);
  }
  if (!reply.ok) {
    $("state").textContent = `brim answered ${reply.status}; retrying`;
  } else {
    render(await reply.json());
  }
  timer = setTimeout(poll, POLL_MS);
}

function render(status) {
  $("login").hidden = true;
  $("board").hidden = false;
  $("forget").hidden = false;
  const instances = status.instances ? ` · ${status.instances.length} instance(s)${status.shared ? ", shared" : ""}` : "";
  $("state").textContent = `up ${duration(status.uptime_s)}${instances} · updated ${seconds(new Date())}`;
  renderCards(status);
  const series = status.series || { bucket_s: 60, fields: [], series: [] };
  const span = timeSpan(series);
  renderUsage(series, span);
  renderTimeline(series, span);
  renderRemoved(status.tokens_removed || {});
  renderLearned(status.learned || []);
  renderRatios(status.token_ratios || []);
  renderLoops(status.loop_guard || { limit: 0, blocked: [] }, status.totals || {});
  renderEvents(status.recent_events || []);
}

function renderCards(status) {
  const totals = status.totals || {};
  const removed = Object.values(status.tokens_removed || {}).reduce((a, b) => a + b, 0);
  const cards = [
    ["requests", totals.requests, ""],
    ["overflows prevented", totals.prevented, "prevented"],
    ["survived (retried)", totals.survived, "survived"],
    ["refused", totals.refused, "refused"],
    ["loop guard 429s", totals.blocked, "blocked"],
    ["tokens removed", removed, ""],
  ];
  $("cards").replaceChildren(
    ...cards.map(([label, value, kind]) => el("div", { class: `card ${kind}`, "data-figure": label }, el("b", {}, number(value)), el("span", {}, label))),
  );
}

// The x axis: at least the last 30 buckets, up to now.
function timeSpan(series) {
  const bucket = series.bucket_s || 60;
  const now = Math.floor(Date.now() / 1000 / bucket) * bucket;
  let first = now;
  let last = now;
  for (const s of series.series) {
    for (const p of s.points) {
      first = Math.min(first, p[0]);
      last = Math.max(last, p[0]);
    }
  }
  return { bucket, start: Math.min(first, last - 29 * bucket), end: last + bucket };
}

const BOX = { left: 52, right: 12, top: 12 };
function axes(svg, span, height, bottom, yTicks, yLabel) {
  const width = 960 - BOX.left - BOX.right;
  const x = (t) => BOX.left + ((t + span.bucket / 2 - span.start) / (span.end - span.start)) * width;
  const plotHeight = height - BOX.top - bottom;
  const top = yTicks[yTicks.length - 1];
  const y = (v) => BOX.top + plotHeight - (v / top) * plotHeight;
  for (const tick of yTicks) {
    svg.append(el("svg:line", { class: "grid", x1: BOX.left, x2: 960 - BOX.right, y1: y(tick), y2: y(tick) }));
    svg.append(el("svg:text", { class: "tick", x: BOX.left - 6, y: y(tick) + 4, "text-anchor": "end" }, yLabel(tick)));
  }
  const step = Math.max(1, Math.round((span.end - span.start) / span.bucket / 6)) * span.bucket;
  for (let t = span.end - span.bucket; t >= span.start; t -= step) {
    svg.append(el("svg:text", { class: "tick", x: x(t), y: height - bottom + 16, "text-anchor": "middle" }, clock(t)));
  }
  return { x, y };
}

function renderUsage(series, span) {
  const svg = $("usage-plot");
  svg.replaceChildren();
  const fields = series.fields;
  const at = (name) => fields.indexOf(name);
  const [iT, iN, iMax, iDemand] = [at("t"), at("requests"), at("usage_max"), at("demand_max")];
  let top = 1;
  for (const s of series.series) for (const p of s.points) top = Math.max(top, p[iDemand]);
  const ceiling = Math.ceil(top * 4) / 4;
  const ticks = [];
  for (let v = 0; v <= ceiling + 1e-9; v += ceiling > 2 ? 0.5 : 0.25) ticks.push(v);
  const { x, y } = axes(svg, span, 260, 28, ticks, percent);
  svg.append(el("svg:line", { class: "window", x1: BOX.left, x2: 960 - BOX.right, y1: y(1), y2: y(1) }));
  svg.append(el("svg:text", { class: "window-label", x: 960 - BOX.right - 4, y: y(1) - 5, "text-anchor": "end" }, "context window"));
  const legend = [];
  series.series.forEach((s, index) => {
    const color = COLORS[index % COLORS.length];
    const name = `${s.model} · ${s.client}`;
    const points = s.points.filter((p) => p[iT] >= span.start);
    const line = (i) => points.map((p, k) => `${k ? "L" : "M"}${x(p[iT]).toFixed(1)},${y(p[i]).toFixed(1)}`).join("");
    const group = el("svg:g", { class: "series", "data-series": name });
    group.append(el("svg:path", { class: "demand", d: line(iDemand), stroke: color }));
    group.append(el("svg:path", { class: "usage", d: line(iMax), stroke: color }));
    for (const p of points) {
      group.append(el("svg:circle", { class: "demand-point", cx: x(p[iT]), cy: y(p[iDemand]), r: 3, stroke: color }));
      const tip = `${name}, ${clock(p[iT])}: ${p[iN]} request(s), peak ${percent(p[iMax])} of the window sent, ${percent(p[iDemand])} received`;
      group.append(el("svg:circle", { class: "point", cx: x(p[iT]), cy: y(p[iMax]), r: 3.5, fill: color }, el("svg:title", {}, tip)));
    }
    svg.append(group);
    legend.push(el("span", { class: "key" }, el("i", { class: "swatch", "data-color": color }), name));
  });
  $("usage-legend").replaceChildren(...legend);
  for (const swatch of $("usage-legend").querySelectorAll(".swatch")) swatch.style.background = swatch.dataset.color;
  if (!series.series.length) {
    svg.append(el("svg:text", { class: "empty", x: 480, y: 120, "text-anchor": "middle" }, "no requests yet"));
  }
  $("usage-note").textContent = `peak per ${duration(series.bucket_s)}: filled dot and line = sent to the provider, hollow dot and dotted line = as received`;
}

function renderTimeline(series, span) {
  const svg = $("timeline");
  svg.replaceChildren();
  const fields = series.fields;
  const buckets = new Map();
  for (const s of series.series) {
    for (const p of s.points) {
      if (p[0] < span.start) continue;
      const counts = buckets.get(p[0]) || Object.fromEntries(KINDS.map((k) => [k, 0]));
      for (const kind of KINDS) counts[kind] += p[fields.indexOf(kind)] || 0;
      buckets.set(p[0], counts);
    }
  }
  let most = 1;
  for (const counts of buckets.values()) most = Math.max(most, KINDS.reduce((a, k) => a + counts[k], 0));
  const top = Math.max(2, Math.ceil(most / 2) * 2);
  const { x, y } = axes(svg, span, 140, 24, [0, top / 2, top], (v) => String(v));
  const width = Math.max(3, ((960 - BOX.left - BOX.right) * span.bucket) / (span.end - span.start) - 2);
  for (const [t, counts] of buckets) {
    let base = 0;
    for (const kind of KINDS) {
      if (!counts[kind]) continue;
      const rect = el("svg:rect", {
        class: `bar ${kind}`,
        "data-t": t,
        x: x(t) - width / 2,
        y: y(base + counts[kind]),
        width,
        height: y(base) - y(base + counts[kind]),
      });
      rect.append(el("svg:title", {}, `${clock(t)}: ${counts[kind]} ${kind}`));
      svg.append(rect);
      base += counts[kind];
    }
  }
  if (!buckets.size || ![...buckets.values()].some((c) => KINDS.some((k) => c[k]))) {
    svg.append(el("svg:text", { class: "empty", x: 480, y: 64, "text-anchor": "middle" }, "no overflows in this span"));
  }
}

function renderRemoved(removed) {
  const entries = Object.entries(removed).sort((a, b) => b[1] - a[1]);
  const most = Math.max(1, ...entries.map(([, n]) => n));
  const rows = entries.map(([policy, tokens]) => {
    const fill = el("i", {});
    fill.style.width = `${(100 * tokens) / most}%`;
    return el("div", { class: "bar-row", "data-policy": policy }, el("span", { class: "name" }, policy), el("span", { class: "track" }, fill), el("span", { class: "value" }, number(tokens)));
  });
  $("removed").replaceChildren(...(rows.length ? rows : [el("p", { class: "empty" }, "nothing removed yet")]));
}

function fillTable(id, rows, empty) {
  const body = $(id).tBodies[0];
  const columns = $(id).tHead.rows[0].cells.length;
  body.replaceChildren(...(rows.length ? rows : [el("tr", {}, el("td", { class: "empty", colspan: columns }, empty))]));
}

function renderLearned(learned) {
  const rows = learned.map((fact) =>
    el("tr", {}, el("td", {}, fact.model), el("td", {}, fact.kind === "window" ? `window ${number(fact.value)}` : "output counts against the window"), el("td", {}, duration(fact.expires_in_s))),
  );
  fillTable("learned", rows, "nothing learned from providers yet");
}

function renderRatios(ratios) {
  // The shared ratio (the median of the clients that settled their own) and how many clients
  // taught it: a client that has not settled its own is counted at it.
  const clients = (r) => (r.settled < r.clients ? `${number(r.clients)} (${number(r.settled)} settled)` : number(r.clients));
  const rows = ratios.map((r) =>
    el("tr", { "data-model": r.model }, el("td", {}, r.model), el("td", {}, r.upstream), el("td", { class: "num" }, r.ratio === null ? "learning" : `× ${r.ratio.toFixed(3)}`), el("td", { class: "num" }, clients(r)), el("td", { class: "num" }, number(r.replies)), el("td", {}, `${duration(r.updated_s_ago)} ago`)),
  );
  fillTable("ratios", rows, "no usage reported yet: brim counts with its tokenizers' own factors");
}

function renderLoops(guard, totals) {
  $("loop-note").textContent = guard.limit ? `${guard.limit} identical failures within ${duration(guard.window_s)} · ${number(totals.blocked)} refused` : "off";
  const rows = guard.blocked.map((b) => el("tr", { class: "blocked" }, el("td", {}, el("code", {}, b.request)), el("td", {}, number(b.failures)), el("td", {}, duration(b.lifts_in_s))));
  fillTable("loops", rows, "no request blocked now");
}

function renderEvents(events) {
  const rows = events.slice().reverse().map((e) => {
    const keys = el("td", { class: "keys" });
    const archived = e.archive_keys || [];
    for (const key of archived.slice(0, KEYS_SHOWN)) keys.append(el("code", { title: key }, `sha256:${key.slice(0, 12)}`), " ");
    if (archived.length > KEYS_SHOWN) keys.append(el("span", { class: "more" }, `+${archived.length - KEYS_SHOWN} more`));
    const when = new Date(e.time);
    return el(
      "tr",
      { class: `event ${e.outcome}` },
      el("td", { class: "time", title: e.time }, isNaN(when) ? e.time : seconds(when)),
      el("td", {}, e.model),
      el("td", { class: "client", title: e.client || "" }, e.client || "–"),
      el("td", {}, el("span", { class: `badge ${e.outcome}` }, e.outcome), e.retries ? ` ${e.retries} retr${e.retries > 1 ? "ies" : "y"}` : ""),
      el("td", { class: "num" }, `${number(e.tokens_in)} → ${number(e.tokens_out)} / ${e.budget == null ? "–" : number(e.budget)}`),
      el("td", {}, el("code", {}, e.actions)),
      keys,
    );
  });
  fillTable("events", rows, "no overflow events yet");
}

function start() {
  takeKeyFromFragment();
  $("login").addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem(KEY_ITEM, $("key").value);
    $("key").value = "";
    poll();
  });
  $("forget").addEventListener("click", () => {
    sessionStorage.removeItem(KEY_ITEM);
    clearTimeout(timer);
    showLogin("");
  });
  poll();
}

start();
