// groupcast board: renders the JSON API (/api/...) for the path it was
// opened on, and refreshes every 2 seconds. No framework, no CDN.
"use strict";

const REFRESH_MS = 2000;
const STATES = ["queued", "in_flight", "scheduled", "stalled", "reported"];
const main = document.getElementById("main");
const toast = document.getElementById("toast");
let timer = null;
let eventsOffset = 0;

// Builds an element; children are nodes or text (never parsed as HTML),
// or arrays of them nested to any depth: a `map` that returns a pair of
// nodes per entry gives an array of arrays, and one level of flattening
// would turn each pair into the text "[object HTMLElement],[object ...]".
function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat(Infinity)) {
    if (c === undefined || c === null) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

function ago(ms) {
  if (ms === undefined || ms === null) return "-";
  const s = Math.floor(ms / 1000);
  if (s < 60) return s + "s";
  if (s < 3600) return Math.floor(s / 60) + "m" + String(s % 60).padStart(2, "0") + "s";
  if (s < 86400) return Math.floor(s / 3600) + "h" + String(Math.floor(s / 60) % 60).padStart(2, "0") + "m";
  return Math.floor(s / 86400) + "d" + String(Math.floor(s / 3600) % 24).padStart(2, "0") + "h";
}

function badge(state) {
  return h("span", { class: "badge " + state }, state.replace("_", " "));
}

function show(message, bad) {
  toast.textContent = message;
  toast.className = bad ? "bad shown" : "shown";
  setTimeout(() => { toast.className = ""; }, 5000);
}

async function getJson(path) {
  const r = await fetch(path, { headers: { "X-Groupcast-Board": "1" } });
  const body = await r.json().catch(() => ({}));
  if (!r.ok) throw new Error(body.error || r.status + " " + r.statusText);
  return body;
}

// Actions carry the custom header (the server refuses requests without it:
// a cross-site form cannot send it) and the bearer token typed in the header.
async function act(path) {
  return post(path);
}

// An action on a batch (`close`, `cancel`), with the reason the operator
// types; asks first, since neither can be undone.
async function batchAction(batch, what, question) {
  const reason = window.prompt(question + "\nReason (recorded in the batch's events):", what + "ed from the board");
  if (reason === null) return;
  const r = await post("/api/batches/" + encodeURIComponent(batch) + "/" + what + "?reason=" + encodeURIComponent(reason));
  if (r) { show("batch " + batch + ": " + what + (what === "cancel" ? "led: " + r.stopped + " generation(s) stopped" : "d: " + r.missing + " missing seq(s)")); refresh(); }
}

// Downloads a batch's stored outcomes (failed and unknown, numbers in
// full): the API needs the token, so the file is fetched, then saved.
async function downloadResults(batch) {
  const token = sessionStorage.getItem("groupcast-board-token") || "";
  const headers = { "X-Groupcast-Board": "1" };
  if (token) headers["Authorization"] = "Bearer " + token;
  const r = await fetch("/api/batches/" + encodeURIComponent(batch) + "/results?status=failed,unknown,not_sent&show_numbers=1", { headers });
  if (!r.ok) { const body = await r.json().catch(() => ({})); show(r.status + ": " + (body.error || r.statusText), true); return; }
  const a = h("a", { href: URL.createObjectURL(await r.blob()), download: batch + "-results.csv" });
  a.click();
}

async function post(path) {
  const token = sessionStorage.getItem("groupcast-board-token") || "";
  const headers = { "X-Groupcast-Board": "1" };
  if (token) headers["Authorization"] = "Bearer " + token;
  const r = await fetch(path, { method: "POST", headers });
  const body = await r.json().catch(() => ({}));
  if (!r.ok) { show(r.status + ": " + (body.error || r.statusText), true); return null; }
  return body;
}

// A bar's fill, sized through the CSSOM: the page's Content-Security-Policy
// allows no inline style attribute.
function fill(pct) {
  const el = h("div", { class: "fill" });
  el.style.width = pct + "%";
  return el;
}

function progress(gens) {
  if (!gens || gens.length === 0) return h("span", { class: "muted" }, "-");
  return h("div", { class: "gens" }, gens.map((g) => {
    const pct = g.chunks > 0 ? Math.round((100 * g.loaded) / g.chunks) : 0;
    const label = "gen " + g.generation + ": " + g.loaded + "/" + g.chunks + " chunks" +
      (g.sent ? ", sent" : "") + (g.done ? ", " + g.done : "");
    return h("div", { class: "bar" + (g.sent ? " sent" : ""), title: label },
      fill(pct),
      h("span", {}, "g" + g.generation + " " + g.loaded + "/" + g.chunks + (g.sent ? " ✓" : "")));
  }));
}

const filters = { state: "", q: "" };

function overview(data) {
  const counts = {};
  for (const b of data.batches) counts[b.state] = (counts[b.state] || 0) + 1;
  const rows = data.batches
    .filter((b) => !filters.state || b.state === filters.state)
    .filter((b) => !filters.q || b.batch.includes(filters.q))
    .sort((a, b) => STATES.indexOf(a.state) - STATES.indexOf(b.state) || a.batch.localeCompare(b.batch));
  const stateFilter = h("select", { id: "filter-state", onchange: (e) => { filters.state = e.target.value; refresh(); } },
    h("option", { value: "" }, "every state"),
    STATES.map((s) => h("option", { value: s, selected: filters.state === s }, s.replace("_", " ") + " (" + (counts[s] || 0) + ")")));
  const search = h("input", { id: "filter-q", type: "search", placeholder: "batch id", value: filters.q,
    oninput: (e) => { filters.q = e.target.value; refresh(); } });
  const table = h("table", { id: "batches" },
    h("thead", {}, h("tr", {}, ["batch", "state", "shard", "chunks", "recipients", "registered", "failed", "progress per generation", "age", "quiet", "outcome"].map((c) => h("th", {}, c)))),
    h("tbody", {}, rows.length === 0 ? h("tr", {}, h("td", { colspan: 11, class: "muted" }, "no batches")) :
      rows.map((b) => h("tr", { class: "state-" + b.state, "data-batch": b.batch },
        h("td", {}, h("a", { href: "/batches/" + encodeURIComponent(b.batch) }, b.batch)),
        h("td", {}, badge(b.state)),
        h("td", { class: "num" }, b.shard),
        h("td", { class: "num" }, b.state === "queued" ? b.queuedChunks + " queued" :
          (b.chunks + "/" + (b.lastSeq === null || b.lastSeq === undefined ? "?" : b.lastSeq + 1)) + (b.queuedChunks ? " +" + b.queuedChunks + " queued" : "")),
        h("td", { class: "num" }, b.recipients ?? b.queuedRecipients ?? "-"),
        h("td", { class: "num" }, b.registered ?? "-"),
        h("td", { class: "num" }, b.failed ?? "-"),
        h("td", {}, progress(b.generations)),
        h("td", { class: "num" }, ago(b.ageMs)),
        h("td", { class: "num" }, ago(b.quietMs)),
        h("td", {}, b.outcome || (b.state === "queued" ? (b.ingestConsumers > 0 ? "waiting for a loader" : "no worker reads the ingest stream") : "")))))
  );
  const health = h("table", { id: "streams" },
    h("thead", {}, h("tr", {}, ["shard", "stream", "length", "group", "consumers", "pending", "lag"].map((c) => h("th", {}, c)))),
    h("tbody", {}, data.streams.map((s) => h("tr", { class: s.what === "dead letters" && s.length > 0 ? "warn" : "" },
      h("td", { class: "num" }, s.shard), h("td", { title: s.key }, s.what), h("td", { class: "num" }, s.length),
      h("td", {}, s.group || "-"),
      h("td", { class: "num" }, s.consumers ?? "-"),
      h("td", { class: "num" }, s.pending ?? "-"),
      h("td", { class: "num" }, s.lag ?? "-")))));
  return [
    h("section", {}, h("div", { class: "toolbar" }, h("h1", {}, "Batches"), stateFilter, search,
      h("span", { class: "muted" }, data.batches.length + " batch(es); stalled after " + ago(data.stallAfterMs) + " quiet")), table),
    h("section", {}, h("h2", {}, "Stream health"), health),
  ];
}

// A value of the report as text: a count or a word as is, a breakdown (the
// failures by reason) as "reason: count" items, an empty one as "none".
function reportValue(v) {
  if (v === null || v === undefined) return "-";
  if (typeof v !== "object") return String(v);
  const entries = Array.isArray(v) ? v.map((x, i) => [String(i), x]) : Object.entries(v);
  if (entries.length === 0) return "none";
  return h("ul", { class: "breakdown" }, entries.map(([k, x]) => h("li", {}, k + ": ", reportValue(x))));
}

function batchPage(b, events) {
  const gens = h("table", { id: "generations" },
    h("thead", {}, h("tr", {}, ["gen", "group", "recipients", "chunks loaded", "registered", "failed", "closed", "send", "provider status"].map((c) => h("th", {}, c)))),
    h("tbody", {}, (b.generations || []).map((g) => h("tr", {},
      h("td", { class: "num" }, g.generation), h("td", {}, g.group || "-"), h("td", { class: "num" }, g.recipients),
      h("td", { class: "num" }, g.loaded + "/" + g.chunks), h("td", { class: "num" }, g.registered), h("td", { class: "num" }, g.failed),
      h("td", {}, g.closed || "-"), h("td", {}, g.refused ? "REFUSED: " + g.refused : (g.sent || "-")), h("td", {}, g.done || "-")))));
  const ranges = b.missingSeqRanges || [];
  const moreRanges = (b.missingSeqRangesTotal || 0) - ranges.length;
  const missing = ranges.length > 0
    ? h("p", { id: "missing", class: "warn" }, "Missing seqs (not accepted yet): " +
      ranges.map(([a, z]) => a === z ? String(a) : a + "-" + z).join(", ") +
      (moreRanges > 0 ? " ... (" + moreRanges + " more range(s))" : "") +
      (b.missingSeqCount > ranges.length ? " (" + b.missingSeqCount + " seqs)" : "") +
      (b.lastSeqKnown ? "" : " (the last chunk has not arrived either)"))
    : h("p", { id: "missing", class: "muted" }, b.lastSeqKnown === false ? "The last chunk has not arrived." : "No seq missing.");
  const rejected = h("table", { id: "rejected" },
    h("thead", {}, h("tr", {}, ["seq", "reason"].map((c) => h("th", {}, c)))),
    h("tbody", {}, (b.rejected || []).length === 0 ? h("tr", {}, h("td", { colspan: 2, class: "muted" }, "none")) :
      b.rejected.map((r) => h("tr", {}, h("td", { class: "num" }, r.seq ?? "-"), h("td", {}, r.reason)))));
  const report = b.report
    ? h("dl", { id: "report" }, Object.entries(b.report).filter(([k]) => k !== "time_ms").map(([k, v]) => [h("dt", {}, k), h("dd", {}, reportValue(v))]))
    : h("p", { id: "report", class: "muted" }, "Not reported yet.");
  const delivery = b.delivery_report
    ? h("dl", { id: "delivery" }, Object.entries(b.delivery_report).filter(([k]) => k !== "time_ms").map(([k, v]) => [h("dt", {}, k), h("dd", {}, reportValue(v))]))
    : h("p", { id: "delivery", class: "muted" }, "Delivery results are still coming (or nothing was sent).");
  const timeline = events ? h("div", {},
    h("div", { class: "toolbar" },
      h("button", { disabled: eventsOffset === 0, onclick: () => { eventsOffset = Math.max(0, eventsOffset - events.limit); refresh(); } }, "← newer"),
      h("span", { class: "muted" }, "events " + (events.total === 0 ? 0 : events.offset + 1) + "–" + (events.offset + events.events.length) + " of " + events.total),
      h("button", { disabled: events.offset + events.events.length >= events.total, onclick: () => { eventsOffset += events.limit; refresh(); } }, "older →")),
    h("table", { id: "timeline" },
      h("thead", {}, h("tr", {}, ["time", "event", "what"].map((c) => h("th", {}, c)))),
      h("tbody", {}, events.events.map((e) => h("tr", {}, h("td", {}, e.time || e.id), h("td", {}, e.type), h("td", {}, e.summary)))))) : null;
  return [
    h("section", {}, h("div", { class: "toolbar" }, h("h1", {}, "Batch " + b.batch), badge(b.state || "queued"),
      b.outcome ? h("strong", {}, b.outcome) : null,
      b.cancelled && !b.outcome ? h("strong", { id: "cancelled" }, "cancelled: " + b.cancelled) : null,
      b.state !== "reported" && b.state !== "queued" && !b.cancelled ? h("button", { id: "close", disabled: b.readOnly,
        title: b.readOnly ? "read-only board" : "stop waiting for missing seqs: send what was loaded, then report",
        onclick: () => batchAction(b.batch, "close", "Close batch " + b.batch + "? Seqs not arrived are given up; what was loaded is sent.") }, "Close") : null,
      b.state !== "reported" && !b.cancelled ? h("button", { id: "cancel", class: "danger", disabled: b.readOnly,
        title: b.readOnly ? "read-only board" : "stop every generation whose send was not claimed yet",
        onclick: () => batchAction(b.batch, "cancel", "Cancel batch " + b.batch + "? Generations not yet being sent are never sent; their groups are deleted.") }, "Cancel") : null),
      b.describe ? h("p", { class: "warn" }, b.describe) : null,
      b.providerRefusedCredentials ? h("p", { id: "credentials", class: "warn" }, "provider refused credentials: " + b.providerRefusedCredentials +
        " (fix the workers' key or secret, restart them, then redrive the batch's dead letters)") : null,
      b.chunksAfterEnd ? h("p", { id: "after-end", class: "muted" }, b.chunksAfterEnd + " chunk(s) came after the batch ended: counted, not loaded") : null,
      h("p", {}, (b.chunks ?? 0) + " chunk(s) accepted of " + (b.lastSeq === null || b.lastSeq === undefined ? "?" : b.lastSeq + 1) +
        (b.queuedChunks ? ", " + b.queuedChunks + " more queued unread" : "") + "; " + (b.recipients ?? b.queuedRecipients ?? 0) + " recipients, " +
        (b.registered ?? 0) + " registered, " + (b.failed ?? 0) + " failed; age " + ago(b.ageMs) + ", quiet " + ago(b.quietMs)),
      missing),
    h("section", {}, h("h2", {}, "Generations and groups"), gens),
    h("section", {}, h("h2", {}, "Rejected inputs"), rejected),
    h("section", {}, h("h2", {}, "Report"), report),
    h("section", {}, h("div", { class: "toolbar" }, h("h2", {}, "Delivery results"),
      h("button", { id: "download-results", disabled: b.readOnly, title: b.readOnly ? "read-only board" : "failed, unknown and not sent recipients, as CSV",
        onclick: () => downloadResults(b.batch) }, "Download")), delivery),
    h("section", {}, h("h2", {}, "Event timeline"), timeline),
  ];
}

function dlqPage(data) {
  const letters = data.deadLetters;
  return [h("section", {}, h("div", { class: "toolbar" }, h("h1", {}, "Dead letters"),
    h("span", { class: "muted" }, letters.length + " dead letter(s)" + (data.readOnly ? "; read-only board (no token configured)" : ""))),
    h("table", { id: "dead-letters" },
      h("thead", {}, h("tr", {}, ["id", "age", "source", "kind", "reason", "deliveries", ""].map((c) => h("th", {}, c)))),
      h("tbody", {}, letters.length === 0 ? h("tr", {}, h("td", { colspan: 7, class: "muted" }, "no dead letters")) :
        letters.map((d) => h("tr", { "data-id": d.id },
          h("td", {}, d.id), h("td", { class: "num" }, ago(d.ageMs)), h("td", {}, d.source || "-"), h("td", {}, d.kind),
          h("td", { class: "reason" }, d.reason || "-"), h("td", { class: "num" }, d.deliveries || "-"),
          h("td", {}, h("button", { disabled: data.readOnly, onclick: async () => {
            const r = await act("/api/dlq/" + encodeURIComponent(d.id) + "/redrive");
            if (r) { show("redriven " + r.redriven + " to " + r.to); refresh(); }
          } }, "redrive")))))))];
}

async function refresh() {
  const path = location.pathname;
  try {
    let content;
    if (path.startsWith("/batches/")) {
      const id = decodeURIComponent(path.slice("/batches/".length));
      const b = await getJson("/api/batches/" + encodeURIComponent(id));
      const ev = b.events ? await getJson("/api/batches/" + encodeURIComponent(id) + "/events?offset=" + eventsOffset + "&limit=50") : null;
      content = batchPage(b, ev);
      document.title = "groupcast: " + id;
    } else if (path === "/dlq") {
      content = dlqPage(await getJson("/api/dlq"));
      document.title = "groupcast: dead letters";
    } else {
      const data = await getJson("/api/overview");
      document.getElementById("dlq-count").textContent = data.deadLetters > 0 ? "(" + data.deadLetters + ")" : "";
      content = overview(data);
    }
    // Keep the focus in the search box while typing through a refresh.
    const focused = document.activeElement && document.activeElement.id;
    main.replaceChildren(...content);
    if (focused) { const el = document.getElementById(focused); if (el) el.focus(); }
    document.getElementById("live").className = "ok";
  } catch (e) {
    main.replaceChildren(h("p", { class: "bad", id: "error" }, "error: " + e.message));
    document.getElementById("live").className = "bad";
  }
  clearTimeout(timer);
  timer = setTimeout(refresh, REFRESH_MS);
}

document.getElementById("token-form").addEventListener("submit", (e) => {
  e.preventDefault();
  const input = document.getElementById("token");
  sessionStorage.setItem("groupcast-board-token", input.value);
  input.value = "";
  input.placeholder = "token set for this tab";
});
if (sessionStorage.getItem("groupcast-board-token")) document.getElementById("token").placeholder = "token set for this tab";
refresh();
