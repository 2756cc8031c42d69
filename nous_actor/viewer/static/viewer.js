// The viewer's page script: plain JavaScript, no library, nothing fetched from elsewhere.
// The list page pages through /api/sessions; the session page draws its newest rows
// first (/api/tail: they do not wait for the whole timeline, which the server reads
// meanwhile), then only the rows in view (fetched a chunk at a time from /api/rows), the
// spans over them (/api/spans), the surface as of a seq (/api/surface), one event's audit
// (/api/event), and follows the session live (/api/live, server-sent events). A session
// that keeps a LangGraph thread also has a LangGraph view: its checkpoints as a tree
// (/api/langgraph) and a chosen checkpoint's messages (/api/langgraph/messages).
"use strict";

const $ = (id) => document.getElementById(id);
const el = (tag, cls, text) => {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
};
const q = (params) => new URLSearchParams(params).toString();

async function getJSON(path, params) {
  return fetchJSON(path + "?" + q(params));
}

async function fetchJSON(url) {
  const r = await fetch(url);
  const body = await r.json();
  if (!r.ok) throw new Error(body.error || r.statusText);
  return body;
}

function setStatus(text, live) {
  const s = $("status");
  s.textContent = text;
  s.classList.toggle("live", !!live);
}

// -- the sessions ---------------------------------------------------------------------

const list = { offset: 0, limit: 100, sort: "last_write", order: "desc", q: "", total: 0 };

// fresh: the store's index is read for this page (Reload), not the one the server read last.
async function loadList(fresh) {
  const params = { offset: list.offset, limit: list.limit, sort: list.sort, order: list.order, q: list.q };
  if (fresh === true) params.fresh = 1;
  let page;
  try {
    page = await getJSON("/api/sessions", params);
  } catch (err) {
    setStatus("error: " + err.message);
    return;
  }
  $("where").textContent = page.store;
  list.total = page.total;
  const body = document.querySelector("#sessions tbody");
  body.replaceChildren();
  for (const s of page.rows) {
    const tr = el("tr");
    const a = el("a", null, s.session_id);
    a.href = "/session?" + q({ id: s.session_id });
    const name = el("td");
    name.append(a);
    tr.append(name);
    if (s.error) {
      const td = el("td", "error", s.error);
      td.colSpan = 4;
      tr.append(td);
    } else {
      tr.append(el("td", "num", String(s.events)), el("td", "num", String(s.next_seq)),
        el("td", null, s.last_write ? new Date(s.last_write).toLocaleString() : ""),
        el("td", null, s.holder || ""));
    }
    body.append(tr);
  }
  const last = Math.min(page.offset + page.rows.length, page.total);
  $("list-count").textContent = page.total
    ? `${page.offset + 1}–${last} of ${page.total}` +
      (page.total !== page.sessions ? ` (of ${page.sessions} sessions)` : " sessions")
    : (list.q ? "no session matches" : "no sessions");
  $("prev").disabled = list.offset === 0;
  $("next").disabled = last >= page.total;
  for (const th of document.querySelectorAll("th[data-sort]")) {
    th.classList.toggle("sorted", th.dataset.sort === list.sort);
    th.classList.toggle("asc", th.dataset.sort === list.sort && list.order === "asc");
    th.classList.toggle("desc", th.dataset.sort === list.sort && list.order === "desc");
  }
  setStatus("read " + new Date(page.read_at * 1000).toLocaleTimeString());
}

function startList() {
  $("list-view").hidden = false;
  for (const th of document.querySelectorAll("th[data-sort]")) {
    th.addEventListener("click", () => {
      if (list.sort === th.dataset.sort) list.order = list.order === "asc" ? "desc" : "asc";
      else { list.sort = th.dataset.sort; list.order = th.dataset.sort === "id" ? "asc" : "desc"; }
      list.offset = 0;
      loadList();
    });
  }
  let timer = null;
  $("search").addEventListener("input", () => {
    clearTimeout(timer);
    timer = setTimeout(() => { list.q = $("search").value; list.offset = 0; loadList(); }, 200);
  });
  $("prev").addEventListener("click", () => { list.offset = Math.max(0, list.offset - list.limit); loadList(); });
  $("next").addEventListener("click", () => { list.offset += list.limit; loadList(); });
  $("reload").addEventListener("click", () => loadList(true));
  loadList();
}

// -- one session --------------------------------------------------------------------------

const CHUNK = 200;
const TAIL = 200;  // the newest rows, drawn before the whole timeline is read
const KEEP_CHUNKS = 40;
const ROW = 24;
const LANE = 10;
const view = {
  id: "", meta: null, chunks: new Map(), pending: new Set(), asOf: null, selected: null,
  spans: { spans: [], more: 0 }, spanKey: "", generation: 0,
  tail: null,  // the newest rows, until the whole timeline is read (view.meta)
};

function totalRows() {
  return view.meta ? view.meta.rows : view.tail ? view.tail.rows.length + view.tail.offset : 0;
}

function turnColour(seq) {
  return `hsl(${(seq * 47) % 360} 55% 72%)`;
}

function shadowedNow(r) {
  return r.shadowed_by !== null && (view.asOf === null || r.shadowed_by <= view.asOf);
}

function drawRow(r) {
  const d = el("div", "row");
  d.style.top = r.row * ROW + "px";
  d.dataset.seq = r.seq;
  if (shadowedNow(r)) d.classList.add("shadowed");
  if (view.asOf !== null && r.seq > view.asOf) d.classList.add("future");
  if (r.turn !== null) { d.classList.add("turn"); d.style.setProperty("--turn", turnColour(r.turn)); }
  if (r.inherited) d.classList.add("inherited");
  if (r.seq === view.selected) d.classList.add("selected");
  d.append(el("span", "seq", String(r.seq)), el("span", "type", r.type));
  const op = el("span", "op");
  if (r.replace) {
    const b = el("span", "badge " + r.kind, r.kind);
    op.append(b, document.createTextNode(` ${r.replace[0]}..${r.replace[1]}`));
  }
  d.append(op);
  d.append(el("span", "text", r.text));
  if (shadowedNow(r)) {
    const note = el("span", "note");
    if (r.pruned) note.append(el("span", "badge pruned", "pruned"), document.createTextNode(" "));
    note.append(document.createTextNode("hidden by " + r.shadowed_by));
    d.append(note);
  }
  return d;
}

function visibleRange() {
  const t = $("timeline");
  const first = Math.max(0, Math.floor(t.scrollTop / ROW) - 20);
  const last = Math.min(totalRows(), Math.ceil((t.scrollTop + t.clientHeight) / ROW) + 20);
  return [first, last];
}

async function fetchChunk(k) {
  if (view.chunks.has(k) || view.pending.has(k)) return;
  view.pending.add(k);
  const gen = view.generation;
  try {
    const body = await getJSON("/api/rows", { id: view.id, lo: k * CHUNK, hi: (k + 1) * CHUNK });
    if (gen === view.generation) view.chunks.set(k, body.rows);
  } catch (err) {
    setStatus("error: " + err.message);
  } finally {
    view.pending.delete(k);
  }
  while (view.chunks.size > KEEP_CHUNKS) view.chunks.delete(view.chunks.keys().next().value);
  render();
}

let frame = 0;
function render() {
  if (frame) return;
  frame = requestAnimationFrame(() => { frame = 0; renderNow(); });
}

function renderTail() {
  // The newest rows only, below a line that says the older ones are being read.
  const tail = view.tail;
  const [first, last] = visibleRange();
  const out = tail.rows.filter((r) => r.row >= first && r.row < last).map(drawRow);
  if (tail.offset && first === 0) {
    const waiting = el("div", "row pending",
      `Reading the older events (seq ${tail.rows[0].seq - 1} and before)…`);
    waiting.id = "older";
    waiting.style.top = "0px";
    out.push(waiting);
  }
  $("rows").replaceChildren(...out);
  view.spans = tail.spans;
  drawSpans();
}

function renderNow() {
  if (!view.meta) { if (view.tail) renderTail(); return; }
  const [first, last] = visibleRange();
  const rows = $("rows");
  const out = [];
  for (let k = Math.floor(first / CHUNK); k * CHUNK < last; k++) {
    const chunk = view.chunks.get(k);
    if (!chunk) { fetchChunk(k); continue; }
    view.chunks.delete(k); view.chunks.set(k, chunk);  // most recently used last
    for (const r of chunk) if (r.row >= first && r.row < last) out.push(drawRow(r));
  }
  rows.replaceChildren(...out);
  rows.dataset.first = first;
  loadSpans(first, last);
}

async function loadSpans(first, last) {
  const key = `${first}:${last}:${view.generation}`;
  if (key === view.spanKey) { drawSpans(); return; }
  view.spanKey = key;
  try {
    const body = await getJSON("/api/spans", { id: view.id, lo: first, hi: last });
    if (view.spanKey === key) { view.spans = body; drawSpans(); }
  } catch (err) {
    setStatus("error: " + err.message);
  }
}

function drawSpans() {
  const lanes = $("lanes");
  const out = [];
  const columns = Math.max(0, ...view.spans.spans.map((s) => s.column + 1));
  for (const s of view.spans.spans) {
    const bar = el("div", "span " + s.kind);
    bar.style.top = s.lo * ROW + 3 + "px";
    bar.style.height = (s.hi - s.lo + 1) * ROW - 6 + "px";
    bar.style.left = 6 + (columns - 1 - s.column) * LANE + "px";
    bar.title = `${s.kind} at seq ${s.seq}: positions ${s.start}..${s.stop}`;
    bar.dataset.seq = s.seq;
    if (view.asOf !== null && s.seq > view.asOf) bar.classList.add("future");
    out.push(bar);
  }
  if (view.spans.more) {
    const m = el("div", "more", `+${view.spans.more}`);
    m.title = `${view.spans.more} more replaces enclose these rows`;
    m.style.top = $("timeline").scrollTop + "px";
    out.push(m);
  }
  lanes.replaceChildren(...out);
}

function seqLink(seq) {
  const a = el("a", "seqlink", String(seq));
  a.addEventListener("click", () => openEvent(seq));
  return a;
}

function links(parent, seqs) {
  seqs.forEach((s, i) => { if (i) parent.append(document.createTextNode(", ")); parent.append(seqLink(s)); });
}

async function openEvent(seq) {
  let info;
  try {
    info = await getJSON("/api/event", { id: view.id, seq });
  } catch (err) {
    setStatus("error: " + err.message);
    return;
  }
  view.selected = seq;
  scrollToRow(info.row, false);
  const d = $("detail");
  d.hidden = false;
  d.replaceChildren();
  d.dataset.seq = seq;
  d.append(el("h2", null, `Event ${seq}: ${info.event.type}`));
  const facts = el("p");
  if (info.shadowed_by_count) {
    facts.append(document.createTextNode(`Shadowed by ${info.shadowed_by_count} replace(s): `));
    const who = el("span", "shadowers");
    links(who, info.shadowed_by);
    facts.append(who);
    facts.append(document.createTextNode(`; first hidden by ${info.first_shadowed_by}.`));
  } else {
    facts.append(document.createTextNode("Not shadowed."));
  }
  if (info.turn !== null) facts.append(document.createTextNode(` In the turn opened at seq ${info.turn}.`));
  d.append(facts);
  if (info.replaces) {
    const r = info.replaces;
    const p = el("p", "replaces");
    p.append(document.createTextNode(
      `A ${r.kind} of positions ${r.range[0]}..${r.range[1]}: it replaced ${r.count} event(s), ` +
      `${r.first_hidden_here} of them hidden first by it. Replaced: `));
    const who = el("span", "replaced");
    links(who, r.seqs);
    p.append(who);
    if (r.count > r.seqs.length) p.append(document.createTextNode(` … and ${r.count - r.seqs.length} more`));
    d.append(p);
    if (r.nested_count) {
      const n = el("p");
      n.append(document.createTextNode(`It covers ${r.nested_count} earlier replace(s): `));
      links(n, r.nested_replaces);
      d.append(n);
    }
    if (r.pruned_original !== null) {
      const n = el("p");
      n.append(document.createTextNode("The pruned original: "), seqLink(r.pruned_original));
      d.append(n);
    }
  }
  d.append(el("pre", null, JSON.stringify(info.event, null, 2)));
  renderNow();
}

function scrollToRow(row, top) {
  const t = $("timeline");
  const y = row * ROW;
  if (top || y < t.scrollTop || y > t.scrollTop + t.clientHeight - ROW) {
    t.scrollTop = Math.max(0, y - (top ? 0 : t.clientHeight / 3));
  }
}

let surfaceAsked = 0;
async function loadSurface() {
  const params = { id: view.id };
  if (view.asOf !== null) params.as_of = view.asOf;
  const asked = ++surfaceAsked;
  let body;
  try {
    body = await getJSON("/api/surface", params);
  } catch (err) {
    setStatus("error: " + err.message);
    return;
  }
  if (asked !== surfaceAsked) return;  // a later seq was asked for meanwhile
  $("surface-title").textContent =
    `Surface as of seq ${body.as_of}${view.asOf === null ? " (now)" : ""}: ${body.count} message(s)`;
  const ol = $("surface");
  ol.replaceChildren();
  for (const m of body.messages) {
    const li = el("li");
    li.dataset.seq = m.seq;
    li.append(el("span", "role", m.role), seqLink(m.seq), document.createTextNode(" " + m.text));
    ol.append(li);
  }
}

function setAsOf(seq) {
  if (!view.meta) return;  // the whole timeline is still being read
  view.asOf = seq;
  const last = view.meta.next_seq - 1;
  $("asof-range").value = seq === null ? last : seq;
  $("asof-seq").value = seq === null ? last : seq;
  if (seq !== null) $("follow").checked = false;
  renderNow();
  // While the slider moves, the surface is asked for once it rests (a fold each time).
  clearTimeout(setAsOf.timer);
  setAsOf.timer = setTimeout(loadSurface, 120);
}

async function loadMeta() {
  const meta = await getJSON("/api/session", { id: view.id });
  view.meta = meta;
  $("where").textContent = meta.store;
  $("title").textContent = meta.session_id;
  $("summary").textContent =
    `${meta.rows} events, next seq ${meta.next_seq}; ${meta.summaries} summaries, ` +
    `${meta.prunes} pruned results, ${meta.compactions} compactions, ${meta.turns} turns; ` +
    `${meta.shadowed} shadowed, ${meta.surface_events} on the surface`;
  const fork = $("fork");
  fork.replaceChildren();
  if (meta.forked_from) {
    const a = el("a", null, meta.forked_from.session_id);
    a.href = "/session?" + q({ id: meta.forked_from.session_id });
    fork.append(document.createTextNode("forked from "), a,
      document.createTextNode(` through seq ${meta.forked_from.through_seq}`));
  }
  const toggle = $("lg-toggle");
  toggle.hidden = !meta.langgraph;
  if (meta.langgraph) toggle.textContent = lg.open ? "Timeline view" : "LangGraph view";
  $("spacer").style.height = meta.rows * ROW + "px";
  const last = meta.next_seq - 1;
  for (const id of ["asof-range", "asof-seq"]) $(id).max = last;
  if (view.asOf === null) { $("asof-range").value = last; $("asof-seq").value = last; }
  return meta;
}

// Following the session. A live feed (/api/live) holds a connection open, and a browser
// keeps at most six HTTP/1.1 connections to one host (Chromium, Firefox): six pages
// following sessions would leave none for a seventh page to load. So the pages of one
// viewer share LIVE_FEEDS feeds (Web Locks, one lock a feed, held while a page's feed is
// open), leaving connections for the pages and their reads; a page that gets none reads
// the session's next seq every POLL_MS meanwhile, and takes the first feed let go. A
// hidden page (another tab in front, a minimized window) lets its feed go; shown again, it
// takes one and catches up from the last seq it saw (the feed starts there). Without Web
// Locks (a page not served from loopback or HTTPS) a page holds its own feed while shown.
const LIVE_FEEDS = 4;
const POLL_MS = 3000;
// round: counts the starts and stops, so that a start overtaken by a stop (the page was
// hidden, then shown, while it looked for a free feed) lets go of what it took.
const live = { on: false, round: 0, es: null, release: null, abort: null, poll: 0 };

async function caughtUp(next) {
  // The session's next seq is `next`: read what was committed since the page last did.
  if (next <= view.meta.next_seq) return;
  await loadMeta();
  view.generation += 1;  // a new replace may grey old rows: read the rows again
  view.chunks.clear();
  if ($("follow").checked) scrollToRow(view.meta.rows - 1, true);
  renderNow();
  if (view.asOf === null) loadSurface();
  if (lg.open) loadThread();
}

function openFeed() {
  // The live feed from the last seq seen: what was committed since comes first.
  return new Promise((closed) => {
    const es = new EventSource("/api/live?" + q({ id: view.id, from: view.meta.next_seq }));
    live.es = es;
    live.release = () => { es.close(); closed(); };
    es.onopen = () => setStatus("live", true);
    es.onerror = () => setStatus("reconnecting…");
    es.addEventListener("end", (e) => {
      setStatus("ended: " + JSON.parse(e.data).error);
      live.on = false;
      stopFollowing();
    });
    es.onmessage = async (e) => {
      const next = JSON.parse(e.data).next_seq;
      if (next <= view.meta.next_seq) return;
      await caughtUp(next);
      setStatus(`live: seq ${next - 1}`, true);
    };
  });
}

function startPolling() {
  if (live.poll) return;
  setStatus(`live, read every ${POLL_MS / 1000} s (other pages of this viewer hold the live feeds)`, true);
  live.poll = setInterval(async () => {
    try {
      await caughtUp((await getJSON("/api/session", { id: view.id })).next_seq);
    } catch (err) {
      setStatus("error: " + err.message);
    }
  }, POLL_MS);
}

function stopPolling() {
  clearInterval(live.poll);
  live.poll = 0;
}

function takeFeed(n) {
  // Feed n if no page holds it, opened: what closes it (and lets its lock go), or null.
  return new Promise((taken) => {
    navigator.locks.request(`nous-viewer-live-${n}`, { ifAvailable: true }, (lock) => {
      if (lock === null) { taken(null); return undefined; }
      const open = openFeed();
      taken(live.release);
      return open;
    }).catch(() => taken(null));
  });
}

async function startFollowing() {
  if (live.on) return;
  live.on = true;
  const round = ++live.round;
  if (!navigator.locks) { openFeed(); return; }
  for (let n = 0; n < LIVE_FEEDS; n++) {
    const release = await takeFeed(n);
    if (release) {
      if (round !== live.round) release();  // stopped meanwhile: not this start's to keep
      return;
    }
    if (round !== live.round) return;
  }
  // None free: follow by reading, and take the first feed let go.
  startPolling();
  const abort = new AbortController();
  live.abort = abort;
  const n = Math.floor(Math.random() * LIVE_FEEDS);
  navigator.locks.request(`nous-viewer-live-${n}`, { signal: abort.signal }, () => {
    live.abort = null;
    stopPolling();
    return openFeed();
  }).catch(() => {});  // aborted: the page was hidden
}

function stopFollowing() {
  live.on = false;
  live.round += 1;
  stopPolling();
  if (live.abort) { live.abort.abort(); live.abort = null; }
  if (live.release) { live.release(); live.release = null; }
  if (live.es) { live.es.close(); live.es = null; }
}

function follow() {
  document.addEventListener("visibilitychange", () => {
    if (document.hidden) stopFollowing();
    else startFollowing();
  });
  window.addEventListener("pagehide", stopFollowing);
  window.addEventListener("pageshow", (e) => { if (e.persisted && !document.hidden) startFollowing(); });
  if (!document.hidden) startFollowing();
}

async function showTail() {
  // The newest rows, at their place in the whole: the page shows them at once.
  // The page asked for them already (a preload beside its script): the same URL.
  const preloaded = $("tail");
  const tail = await (preloaded
    ? fetchJSON(preloaded.getAttribute("href"))
    : getJSON("/api/tail", { id: view.id, n: TAIL }));
  if (tail.ready) {
    // The whole timeline is read already: these are its newest rows, under their row
    // numbers. Kept as the chunks they fill, so that the first drawing (at the end of
    // the timeline) has them, whichever chunk read answers first.
    const end = tail.lo + tail.rows.length;
    for (let k = Math.ceil(tail.lo / CHUNK); k * CHUNK < end; k++) {
      view.chunks.set(k, tail.rows.filter((r) => r.row >= k * CHUNK && r.row < (k + 1) * CHUNK));
    }
    return;
  }
  // Drawn in a frame of their own (one line above them while older ones are read).
  tail.offset = tail.older ? 1 : 0;
  for (const r of tail.rows) r.row += tail.offset;
  for (const s of tail.spans.spans) { s.lo += tail.offset; s.hi += tail.offset; }
  view.tail = tail;
  $("where").textContent = tail.store;
  $("title").textContent = view.id;
  $("summary").textContent =
    `the newest ${tail.rows.length} events (seq ${tail.rows[0].seq} to ${tail.next_seq - 1}); ` +
    "reading the older ones…";
  setStatus("reading the session…");
  $("spacer").style.height = totalRows() * ROW + "px";
  scrollToRow(totalRows() - 1, true);
  renderNow();
}

async function startSession() {
  $("session-view").hidden = false;
  view.id = document.body.dataset.session;
  $("timeline").addEventListener("scroll", render);
  // A row or a replace's bar opens its event when pressed. Handled here, on the timeline
  // (rows and bars are drawn anew at every render: a scroll, a chunk read, a commit), and
  // on the press: a render between the press and the release made them two elements, so
  // no click came at all.
  $("timeline").addEventListener("pointerdown", (e) => {
    if (e.button !== 0) return;
    const hit = e.target.closest(".span, .row");
    if (hit && hit.dataset.seq !== undefined) openEvent(Number(hit.dataset.seq));
  });
  window.addEventListener("resize", render);
  try {
    await showTail();
    await loadMeta();
  } catch (err) {
    setStatus("error: " + err.message);
    return;
  }
  view.tail = null;
  $("asof-range").addEventListener("input", () => setAsOf(Number($("asof-range").value)));
  $("asof-seq").addEventListener("change", () => {
    const v = Number($("asof-seq").value);
    if (Number.isInteger(v) && v >= 0 && v < view.meta.next_seq) setAsOf(v);
  });
  $("asof-now").addEventListener("click", () => setAsOf(null));
  $("goto").addEventListener("change", async () => {
    const body = await getJSON("/api/rows", { id: view.id, seq: Number($("goto").value), hi: 0 });
    scrollToRow(body.lo, true);
    render();
  });
  if ($("follow").checked) scrollToRow(view.meta.rows - 1, true);
  renderNow();
  loadSurface();
  $("lg-toggle").addEventListener("click", () => showLangGraph(!lg.open));
  if (view.meta.langgraph && location.hash === "#langgraph") showLangGraph(true);
  follow();
}

// -- a LangGraph thread -------------------------------------------------------------------

// following: the view shows the thread's head and moves with it (until a click on an
// earlier checkpoint); said once, not inferred from ids that in-flight reads change.
const lg = { open: false, ns: "", checkpoint: null, asked: 0, following: true };

function showLangGraph(open) {
  lg.open = open;
  $("lg-view").hidden = !open;
  $("timeline-split").hidden = open;
  $("asof-tools").hidden = open;
  $("lg-toggle").textContent = open ? "Timeline view" : "LangGraph view";
  history.replaceState(null, "", open ? "#langgraph" : location.pathname + location.search);
  if (open) loadThread();
  else render();
}

function short(id) {
  return id && id.length > 13 ? "…" + id.slice(-12) : id || "";
}

async function loadThread() {
  let body;
  try {
    body = await getJSON("/api/langgraph", { id: view.id });
  } catch (err) {
    setStatus("error: " + err.message);
    return;
  }
  const hidden = body.hidden ? `, ${body.hidden} hidden from LangGraph (kept)` : "";
  $("lg-title").textContent =
    `Thread ${body.thread_id ?? body.session_id}: ${body.checkpoints} checkpoints, ` +
    `${body.forks} fork(s)${hidden}`;
  const ol = $("lg-checkpoints");
  const out = [];
  let ns = null;
  for (const r of body.rows) {
    if (r.ns !== ns) {
      ns = r.ns;
      out.push(el("li", "lg-ns", ns === "" ? "graph" : "subgraph " + ns));
    }
    const li = el("li", "lg-cp");
    li.dataset.id = r.id;
    li.dataset.ns = r.ns;
    li.style.paddingLeft = 8 + r.depth * 18 + "px";
    if (r.depth) li.classList.add("branch");
    if (r.gone) li.classList.add("gone");
    if (r.head) li.classList.add("head");
    if (r.id === lg.checkpoint && r.ns === lg.ns) li.classList.add("selected");
    const id = el("span", "lg-id", short(r.id));
    id.title = r.id;
    li.append(id);
    const step = r.step === null ? "" : `step ${r.step}`;
    li.append(el("span", "lg-step", [step, r.source].filter(Boolean).join(" · ")));
    li.append(el("span", "lg-count", r.messages === null ? "" : `${r.messages} msg`));
    if (r.head) li.append(el("span", "badge head", "head"));
    if (r.fork) li.append(el("span", "badge fork", `fork ×${r.children}`));
    if (r.gone) {
      const b = el("span", "badge gone", r.gone);
      b.title = `hidden from LangGraph by seq ${r.gone_at}; kept in the log`;
      li.append(b);
    }
    li.addEventListener("click", () => {
      // Chosen now, not when its messages arrive: a live refresh of the thread that
      // lands meanwhile must not take the view back to the head.
      lg.ns = r.ns;
      lg.checkpoint = r.id;
      lg.following = Boolean(r.head);
      loadMessages(r.ns, r.id);
    });
    out.push(li);
  }
  ol.replaceChildren(...out);
  // (Two refreshes may overlap while a run commits its checkpoints: whether to show the
  // new head must not depend on which of their reads answered first.)
  if (lg.following) loadMessages("", null);
}

async function loadMessages(ns, checkpoint) {
  const params = { id: view.id, ns };
  if (checkpoint) params.checkpoint = checkpoint;
  const asked = ++lg.asked;
  let body;
  try {
    body = await getJSON("/api/langgraph/messages", params);
  } catch (err) {
    if (checkpoint === null) {  // no head (the thread was deleted): nothing to show yet
      $("lg-messages-title").textContent = "Messages: " + err.message;
      $("lg-messages").replaceChildren();
      return;
    }
    setStatus("error: " + err.message);
    return;
  }
  if (asked !== lg.asked) return;  // another checkpoint was chosen meanwhile
  const cp = body.checkpoint;
  lg.ns = cp.ns;
  lg.checkpoint = cp.id;
  for (const li of document.querySelectorAll("#lg-checkpoints .lg-cp")) {
    li.classList.toggle("selected", li.dataset.id === cp.id && li.dataset.ns === cp.ns);
  }
  $("lg-messages-title").textContent =
    `${body.channel} at checkpoint ${short(cp.id)}${cp.head ? " (head)" : ""}: ` +
    `${body.messages.length} message(s)`;
  const facts = [`id ${cp.id}`, `seq ${cp.seq}`, cp.time];
  if (cp.step !== null) facts.push(`step ${cp.step}`);
  if (cp.source) facts.push(cp.source);
  if (cp.parent) facts.push(`parent ${short(cp.parent)}`);
  if (cp.writes) facts.push(`${cp.writes} pending write(s)`);
  if (cp.gone) facts.push(`${cp.gone} at seq ${cp.gone_at} (kept in the log)`);
  if (body.partial) facts.push("an ancestor's record is missing: earlier messages are not shown");
  if (!body.present) facts.push(`no ${body.channel} channel here`);
  $("lg-cp").textContent = facts.join(" · ");
  const out = [];
  for (const m of body.messages) {
    const li = el("li", "lg-msg");
    li.dataset.type = m.type;
    li.dataset.index = m.index;
    const head = el("div", "lg-msg-head");
    head.append(el("span", "role", m.name ? `${m.type} (${m.name})` : m.type));
    if (m.tool_call_id) head.append(el("span", "lg-meta", `result of ${m.tool_call_id}`));
    const by = el("span", "lg-meta", `added at ${short(m.added_by)}`);
    by.title = m.added_by;
    head.append(by);
    li.append(head);
    if (m.content) li.append(el("div", m.opaque ? "lg-content opaque" : "lg-content", m.content));
    for (const c of m.tool_calls) {
      li.append(el("div", "lg-call", `→ ${c.name}(${JSON.stringify(c.args)})` + (c.id ? `  [${c.id}]` : "")));
    }
    out.push(li);
  }
  $("lg-messages").replaceChildren(...out);
}

if (document.body.dataset.view === "session") startSession();
else startList();
