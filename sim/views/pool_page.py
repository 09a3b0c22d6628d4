"""A page of the block pool in the browser: plain HTML and JavaScript, no build step. The same page is served live by
`python -m reference serve` (GET /pool: the engine's last steps, then each new step as a server-sent event) and
written as a file that replays a simulator run (`python -m sim run ... --pool-page run.html`: every step of the run
embedded, no server), so the engine's pool and the simulator's can be watched side by side. Each step is a snapshot of
sim.views.viewer (the pool through the KV contract, the queues) as JSON (`snapshot_json`). The page fills the window, the
pool's map on the left and the rest beside it (under it in a narrow window), so nothing needs scrolling at any size:

    +-- head: step, blocks held; the slider, Play, live ------------------------------+
    | the pool                                  | shares (the chart)                  |
    |   a grid of cells, each as large as the   +-------------------------------------+
    |   map's panel allows for the pool's       | block tables                        |
    |   number of cells                         +-------------------------------------+
    |                                           | queues                              |
    |                                           +-------------------------------------+
    |                                           | events                              |
    +-------------------------------------------+-------------------------------------+

    the pool        a grid of cells (a cell is a block, or a run of blocks where the pool has more than MAX_CELLS
                    blocks; the legend says how many), coloured by the request whose sequence holds it: solid for
                    token states, half for a block's unfilled slots (internal fragmentation), pale for slots reserved
                    and not yet written (the contiguous baselines' reservations); a block several sequences share (a
                    prompt under n > 1 samples, beams) is outlined and shows its reference count
    shares          the five shares of the memory breakdown (sim.kv.SHARE_NAMES) over the steps kept, one column a
                    step, on an axis labelled in % of the whole pool: zoomed to the shares in use (CHART_TOPS), free
                    slots not drawn, unless "whole pool" is ticked; the legend gives each share at the step shown
    block tables    each running sequence's, logical block i -> physical block (runs of ids as a..b)
    queues          waiting / running / swapped request ids
    events          preemptions and finishes, newest first
    the slider      scrubs back through the steps kept; Play runs them forward; "live" follows the engine again

What is drawn is what the KV manager holds (its `slot_segments`, reservations included), so a block a contiguous
policy reserved is drawn as held although no block table lists it. Each drawn cell carries `data-cell` and
`data-blocks` (the held blocks in it), the page `data-step` / `data-used`, so a script (the tests' headless Chromium)
can read what is drawn and compare it with the KV manager's own count of used blocks. After each layout the page
writes where it put things: each panel's `data-rect` (left, top, right, bottom in px; the grid of cells has its own),
and the root element's `data-viewport` and `data-scroll` (the window's inner size and the document's), so the same
script can check that everything lies inside the window.
"""
from __future__ import annotations

import json
from collections import Counter

from ..base.outfiles import atomic_write
from ..kv.base import SHARE_NAMES

MAX_STEPS = 500  # steps a replay page keeps by default: a longer run keeps evenly spaced ones (ReplayRecorder)
STEPS_RANGE = (2, 2000)  # what ReplayRecorder's max_steps may be (`python -m sim run --pool-page-steps`)
MAX_CELLS = 2048  # cells drawn at most: a larger pool is drawn a run of blocks per cell
TABLE_ENTRIES = 48  # a block table's entries shown at most (the rest counted)
WINDOW = (1400, 1000)  # px: the window the page is made to fit and is pictured in (screenshot, the tests)
# The chart's y axis, unless "whole pool" is ticked: free slots are not drawn and the axis ends at the first of these
# at or above the largest share of the pool any step kept used, so a mostly idle pool still shows what holds memory.
CHART_TOPS = (0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1)

POOL_HTML = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>KV block pool: __TITLE__</title>
<style>
* { box-sizing: border-box; }
body { font: 13px system-ui, sans-serif; margin: 0; padding: 10px 14px; color: #222; height: 100vh; display: flex;
       flex-direction: column; gap: 6px; }
h1 { font-size: 17px; margin: 0; }
#controls { display: flex; gap: 8px; align-items: center; }
#slider { flex: 0 1 480px; min-width: 120px; }
#panels { flex: 1; min-height: 0; display: grid; gap: 10px;
          grid-template-columns: minmax(0, 1fr) clamp(340px, 36vw, 560px); }
.panel { border: 1px solid #ddd; border-radius: 4px; padding: 6px 8px; display: flex; flex-direction: column; gap: 4px;
         min-height: 0; min-width: 0; }
#side { display: flex; flex-direction: column; gap: 10px; min-height: 0; min-width: 0; }
#chart { flex: none; }
#tables-panel { flex: 1 1 0; min-height: 90px; }
#queues-panel, #events-panel { flex: 0 1 auto; max-height: 170px; }
.text { font: 12px monospace; white-space: pre-wrap; word-break: break-word; overflow: auto; flex: 1 1 auto;
        min-height: 0; }
#gridbox { flex: 1 1 0; min-height: 0; overflow: hidden; }
#grid { display: grid; width: fit-content; --cell: 18px; }
.block { width: var(--cell); height: var(--cell); background: #eee; font-size: min(calc(var(--cell) * 0.55), 22px);
         line-height: var(--cell); text-align: center; border-radius: 2px; overflow: hidden; }
#grid.tiny .block { font-size: 0; border-radius: 0; }
.block.used { color: #fff; }
.block.internal { opacity: 0.6; }
.block.reserved { opacity: 0.3; }
.block.shared { outline: 2px solid #000; outline-offset: -1px; }
#shares { width: 100%; height: 190px; display: block; }
.legend { font-size: 12px; }
.legend .item { white-space: nowrap; margin-right: 10px; display: inline-block; }
.sw { display: inline-block; width: 11px; height: 11px; margin: 0 5px 0 2px; vertical-align: middle; }
#axis { font-size: 11px; color: #555; }
@media (max-width: 860px) {  /* a narrow window: the map above, the rest below it, the page scrolls */
  body { height: auto; }
  #panels { display: flex; flex-direction: column; }
  #map { height: min(75vh, 100vw); }
  #tables-panel { flex: none; max-height: 40vh; }
}
</style></head>
<body data-step="-1" data-used="0">
<h1>KV block pool of <code>__TITLE__</code>, __MODE__</h1>
<div id="head">waiting for the first step</div>
<div id="controls"><input id="slider" type="range" min="0" max="0" value="0">
<button id="play">play</button>
<label id="livebox"><input id="live" type="checkbox" checked> live</label></div>
<div id="panels">
<section id="map" class="panel" data-panel="map">
<div class="legend"><b>the pool</b>: <span id="scale">one cell a block</span><br>
<span class="item"><i class="sw" style="background:#555"></i>token states</span>
<span class="item"><i class="sw" style="background:#555; opacity: 0.6"></i>unfilled slots of a block</span>
<span class="item"><i class="sw" style="background:#555; opacity: 0.3"></i>reserved, not yet written</span>
<span class="item"><i class="sw" style="background:#eee"></i>free</span>
<span class="item"><i class="sw" style="background:#eee; outline: 2px solid #000"></i>shared (its reference count)
</span>
</div>
<div id="gridbox"><div id="grid"></div></div>
</section>
<div id="side">
<section id="chart" class="panel" data-panel="chart">
<div><b>memory breakdown</b> over the steps kept
<label style="float: right"><input id="whole" type="checkbox"> whole pool (free too)</label></div>
<div id="axis"></div>
<canvas id="shares"></canvas>
<div class="legend" id="legend"></div>
</section>
<section id="tables-panel" class="panel" data-panel="tables"><b>block tables</b><div id="tables" class="text"></div>
</section>
<section id="queues-panel" class="panel" data-panel="queues"><b>queues</b><div id="queues" class="text"></div></section>
<section id="events-panel" class="panel" data-panel="events"><b>events</b><div id="events" class="text"></div></section>
</div></div>
<script>
const SHARES = __SHARES__, COLORS = __COLORS__, KEEP = __KEEP__, LIVE = __LIVE__, KIND = ["", "reserved", "internal"];
const FREE = SHARES.length - 1;  // the last share is the free one
const TOPS = __TOPS__;  // the zoomed chart's top: the first at or above the largest share used
const MAX_PITCH = 96;  // px: a cell and its gap at most, however few the blocks
let history = [], shown = -1, timer = null;
const $ = id => document.getElementById(id);
function colour(rid) { return rid < 0 ? "#999" : `hsl(${(rid * 137.508) % 360}, 55%, 45%)`; }
function shares(snap) {
  const total = snap.counts.reduce((a, b) => a + b, 0) || 1;
  return snap.counts.map(count => count / total);
}
function show(i) {
  if (i < 0 || i >= history.length) return;
  shown = i;
  const snap = history[i], grid = $("grid"), cells = [];
  grid.textContent = "";
  for (let c = 0; c < snap.num_cells; c++) {
    const cell = document.createElement("div");
    cell.className = "block";
    cell.dataset.cell = c;
    grid.appendChild(cell);
    cells.push(cell);
  }
  for (const [first, end, rid, kind, blocks] of snap.runs)
    for (let c = first; c < end; c++) {
      const cell = cells[c];
      cell.classList.add("used");
      if (KIND[kind]) cell.classList.add(KIND[kind]);
      cell.style.background = colour(rid);
      cell.dataset.blocks = blocks;
      cell.title = `${snap.cell_blocks > 1 ? "blocks " + c * snap.cell_blocks + ".." : "block "}` +
        `${(c + 1) * snap.cell_blocks - 1}: request ${rid}, ${SHARES[kind]}`;
    }
  for (const [block, refs] of Object.entries(snap.refs)) {
    const cell = cells[Math.floor(block / snap.cell_blocks)];
    if (cell) { cell.classList.add("shared"); cell.textContent = refs; cell.title += `, ${refs} tables`; }
  }
  document.body.dataset.step = snap.step;
  document.body.dataset.used = snap.used_blocks;
  const numBlocks = Math.floor(snap.num_slots / snap.block_size), bs = snap.block_size, per = snap.cell_blocks;
  $("head").textContent = `step ${snap.step} at ${snap.time.toFixed(3)} s: ${snap.num_prefills} prompt entries, ` +
    `${snap.num_decodes} decodes; ${snap.used_blocks} of ${numBlocks} blocks held (block size ${bs}, policy ` +
    `${snap.policy})` + (snap.preempted.length ? `; preempted ${snap.preempted}` : "");
  $("scale").textContent = `${numBlocks} blocks of ${bs} token slots, ` + (per > 1 ?
    `${per} blocks a cell (${snap.num_cells} cells; a cell takes the colour of the first request in it)` :
    "one cell a block");
  $("tables").textContent = snap.tables.map(([rid, seq, table]) => `r${rid} seq ${seq}: [${table}]`).join("\\n")
    || "(none)";
  $("queues").textContent = ["waiting", "running", "swapped"]
    .map(q => `${q} (${snap[q].length}): ${snap[q].join(", ") || "-"}`).join("\\n");
  $("slider").max = history.length - 1;
  $("slider").value = i;
  drawShares();
  layout();
}
function fitCells() {
  // The largest pitch p (a cell and its gap) at which rows of floor(W / p) cells hold every cell in the map's box.
  const box = $("gridbox"), grid = $("grid"), n = Math.max(grid.childElementCount, 1);
  const W = box.clientWidth, H = box.clientHeight, columns = p => Math.max(Math.floor(W / p), 1);
  let p = MAX_PITCH;
  while (p > 2 && Math.ceil(n / columns(p)) * p > H) p--;
  const gap = p >= 10 ? 2 : p >= 5 ? 1 : 0;
  grid.style.setProperty("--cell", `${p - gap}px`);
  grid.style.gap = `${gap}px`;
  grid.style.gridTemplateColumns = `repeat(${columns(p)}, ${p - gap}px)`;
  grid.classList.toggle("tiny", p < 10);  // too small for a reference count's digits (the cell's title keeps it)
}
function layout() {
  // Size the map's cells to its box, then write down where each panel lies (for a script: the tests' browser).
  fitCells();
  const rect = el => { const r = el.getBoundingClientRect();
    return [Math.floor(r.left), Math.floor(r.top), Math.ceil(r.right), Math.ceil(r.bottom)].join(","); };
  for (const panel of document.querySelectorAll("[data-panel]")) panel.dataset.rect = rect(panel);
  $("grid").dataset.rect = rect($("grid"));
  const root = document.documentElement;
  root.dataset.viewport = `${root.clientWidth}x${root.clientHeight}`;
  root.dataset.scroll = `${root.scrollWidth}x${root.scrollHeight}`;
}
function drawShares() {
  // The breakdown of each step kept, one column a step, stacked in SHARE_NAMES order from the bottom. Unless
  // "whole pool" is ticked, the free share is left out and the y axis ends at the first of TOPS at or above the
  // largest share any kept step used, so a mostly idle pool still shows what holds its memory.
  const c = $("shares"), dpr = window.devicePixelRatio || 1, W = c.clientWidth, H = c.clientHeight;
  if (c.width !== Math.round(W * dpr) || c.height !== Math.round(H * dpr)) {
    c.width = Math.round(W * dpr);
    c.height = Math.round(H * dpr);
  }
  const g = c.getContext("2d"), n = history.length, whole = $("whole").checked;
  g.setTransform(dpr, 0, 0, dpr, 0, 0);
  g.clearRect(0, 0, W, H);
  const left = 44, top = 6, pw = W - left - 6, ph = H - top - 18, w = pw / Math.max(n, 1);
  const most = Math.max(0, ...history.map(snap => 1 - shares(snap)[FREE]));
  const ceiling = whole ? 1 : TOPS.find(t => t >= most - 1e-9);
  history.forEach((snap, i) => {
    const x = Math.floor(left + i * w), x1 = Math.max(Math.floor(left + (i + 1) * w), x + 1);  // no seams between
    let y = top + ph;
    shares(snap).forEach((share, k) => {
      if (k === FREE && !whole) return;
      const h = ph * share / ceiling;
      g.fillStyle = COLORS[k];
      g.fillRect(x, y - h, x1 - x, h);
      y -= h;
    });
  });
  g.font = "11px system-ui, sans-serif";
  g.fillStyle = "#333";
  g.strokeStyle = "rgba(0, 0, 0, 0.25)";
  g.textAlign = "right";
  g.textBaseline = "middle";
  for (let t = 0; t <= 4; t++) {  // the y axis: % of the whole pool
    const y = Math.round(top + ph - ph * t / 4) + 0.5;
    g.beginPath(); g.moveTo(left, y); g.lineTo(left + pw, y); g.stroke();
    g.fillText(`${+(ceiling * t * 25).toFixed(1)}%`, left - 4, y);
  }
  g.textBaseline = "top";
  if (n) {
    g.textAlign = "left";
    g.fillText(`step ${history[0].step}`, left, top + ph + 4);
    g.textAlign = "right";
    g.fillText(`step ${history[n - 1].step}`, left + pw, top + ph + 4);
  }
  if (shown >= 0) { g.strokeStyle = "#000"; g.strokeRect(left + shown * w, top, Math.max(w, 1), ph); }
  $("axis").textContent = `y: share of the whole KV pool, 0 to ${Math.round(ceiling * 100)}%` + (whole ? "" :
    `${ceiling < 1 ? ", zoomed to the most any step here used" : ""}; free slots (the rest) not drawn`);
  const now = shown >= 0 ? shares(history[shown]) : SHARES.map(() => 0);
  $("legend").innerHTML = SHARES.map((name, k) =>
    `<span class="item"><i class="sw" style="background:${COLORS[k]}"></i>${name} ${(100 * now[k]).toFixed(1)}%</span>`)
    .join(" ");
  listEvents();
}
function listEvents() {
  const events = [];
  for (let i = history.length - 1; i >= 0 && events.length < 30; i--) {
    const s = history[i];
    for (const r of s.preempted) events.push(`step ${s.step}: preempted r${r}`);
    for (const r of s.finished) events.push(`step ${s.step}: finished r${r}`);
  }
  $("events").textContent = events.join("\\n") || "(none yet)";
}
function add(snap) {
  history.push(snap);
  if (history.length > KEEP) { history.shift(); shown -= 1; }
  if ($("live").checked) show(history.length - 1); else { $("slider").max = history.length - 1; drawShares(); }
}
function stop() { clearInterval(timer); timer = null; $("play").textContent = "play"; }
$("slider").addEventListener("input", e => { $("live").checked = false; stop(); show(Number(e.target.value)); });
$("live").addEventListener("change", e => { if (e.target.checked) { stop(); show(history.length - 1); } });
$("whole").addEventListener("change", drawShares);
window.addEventListener("resize", () => { drawShares(); layout(); });
$("play").addEventListener("click", () => {
  if (timer) return stop();
  $("live").checked = false;
  if (shown >= history.length - 1) show(0);
  $("play").textContent = "pause";
  timer = setInterval(() => { if (shown >= history.length - 1) stop(); else show(shown + 1); }, 100);
});
__HISTORY__.forEach(s => history.push(s));  // the steps kept when the page was made, drawn at once
if (!LIVE) {
  $("live").checked = false;
  $("livebox").style.display = "none";
}
drawShares();
layout();
show(LIVE ? history.length - 1 : 0);
if (LIVE) {
  const events = new EventSource("pool/events");
  events.onmessage = e => add(JSON.parse(e.data));
}
</script></body></html>
"""


def pool_html(title: str, keep: int, history: list[dict], *, live: bool = True) -> str:
    """The page, with its title, the share palette of the project's figures, the steps it keeps, and the steps so far
    (`history`, snapshot_json's), drawn as the page loads: no request is needed for the first picture. `live`: the
    page follows the server's /pool/events and shows the latest step; otherwise it replays `history` from its first."""
    from ..figures.style import SHARE_COLORS, SHARE_LABELS

    steps = json.dumps(history, separators=(",", ":")).replace("</", "<\\/")  # in <script>: no "</script>"
    mode = "live" if live else f"a replay of {len(history)} steps"
    return (POOL_HTML.replace("__HISTORY__", steps).replace("__TITLE__", _escape(title))
            .replace("__MODE__", mode).replace("__KEEP__", str(max(keep, len(history))))
            .replace("__LIVE__", "true" if live else "false").replace("__TOPS__", json.dumps(CHART_TOPS))
            .replace("__SHARES__", json.dumps([SHARE_LABELS[n] for n in SHARE_NAMES]))
            .replace("__COLORS__", json.dumps([_css(SHARE_COLORS[n]) for n in SHARE_NAMES])))


def write_replay(snapshots: list, path: str, title: str, *, files=None) -> int:
    """The page replaying `snapshots` (sim.views.viewer's), one self-contained HTML file at `path` (written whole or not at
    all; into an open sim.base.outfiles.atomic_files group if `files` is given); its size in bytes. The caller checks the
    path first (sim.base.outfiles.check_outputs)."""
    return _write_page(path, pool_html(title, len(snapshots), [snapshot_json(s) for s in snapshots], live=False), files)


def _write_page(path: str, html: str, files) -> int:
    if files is not None:
        with files.open(path, "w", encoding="utf-8") as f:
            f.write(html)
    else:
        with atomic_write(path, encoding="utf-8") as f:
            f.write(html)
    return len(html.encode())


class ReplayRecorder:
    """An `on_step` observer for sim.run (stepped token by token, jump=False) that keeps the page's snapshots of at
    most `max_steps` steps spread evenly over the whole run: every step until `max_steps` are kept, then every other
    one is dropped and the stride doubles, as often as needed. A kept step also lists the preemptions and finishes of
    the steps dropped before it, and the page ends on the last step with an event (the run's last finish), so no
    event is lost. `write(path, title)` writes the replay page."""

    def __init__(self, max_steps: int = MAX_STEPS) -> None:
        low, high = STEPS_RANGE
        if isinstance(max_steps, bool) or not isinstance(max_steps, int) or not low <= max_steps <= high:
            raise ValueError(f"max_steps: got {max_steps!r} (allowed: an integer from {low} to {high:,})")
        self.max_steps, self.stride, self.num_steps = max_steps, 1, 0
        self.frames: list[dict] = []  # the evenly spread steps kept
        self._preempted: list[int] = []  # events since the last step kept
        self._finished: list[int] = []
        self._tail: dict | None = None  # the latest step with an event since the last step kept

    def __call__(self, sim, plan) -> None:
        from .viewer import snapshot

        step = self.num_steps
        self.num_steps += 1
        if plan is None or not hasattr(plan, "prefills"):
            return  # an idle wake-up, or a fast-forwarded run (the caller steps token by token)
        finished = [r for r in plan.request_ids() if sim.scheduler.is_finished(r)]
        self._preempted += plan.preempted
        self._finished += finished
        kept = step % self.stride == 0
        if not kept and not (plan.preempted or finished):
            return
        frame = snapshot_json(snapshot(sim.scheduler, step=step, time=sim.now, num_prefills=len(plan.prefills),
                                       num_decodes=len(plan.decodes)))
        if not kept:
            self._tail = frame  # its events stay pending: the next step kept, or the page's end, lists them
            return
        frame["preempted"], frame["finished"] = self._preempted, self._finished
        self._preempted, self._finished, self._tail = [], [], None
        self.frames.append(frame)
        if len(self.frames) >= self.max_steps:
            for i in range(1, len(self.frames), 2):  # a dropped step's events go to the kept step after it
                if i + 1 < len(self.frames):
                    later = self.frames[i + 1]
                    later["preempted"] = self.frames[i]["preempted"] + later["preempted"]
                    later["finished"] = self.frames[i]["finished"] + later["finished"]
                else:  # the last step kept is dropped: its events are pending again, and it is the tail
                    self._preempted = self.frames[i]["preempted"] + self._preempted
                    self._finished = self.frames[i]["finished"] + self._finished
                    self._tail = self._tail or self.frames[i]
            self.frames, self.stride = self.frames[::2], self.stride * 2

    def page_frames(self) -> list[dict]:
        """The steps the page shows: those kept, then the latest step with an event since, listing the events that
        no step kept lists."""
        if not (self._preempted or self._finished):
            return list(self.frames)
        return [*self.frames, {**self._tail, "preempted": self._preempted, "finished": self._finished}]

    def write(self, path: str, title: str, *, files=None) -> int:
        """The replay page of the steps kept, at `path`; its size in bytes (see write_replay)."""
        frames = self.page_frames()
        if self.stride > 1:
            title += f", every {self.stride}th of {self.num_steps} steps"
        return _write_page(path, pool_html(title, len(frames), frames, live=False), files)


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _css(colour) -> str:
    """A matplotlib colour as CSS (#rrggbb)."""
    from matplotlib.colors import to_hex

    return to_hex(colour)


def snapshot_json(snap) -> dict:
    """A sim.views.viewer.Snapshot as the page draws it. The pool as `runs` of cells, [first cell, end cell, request id,
    kind (an index of SHARE_NAMES), held blocks per cell]: a cell's request is that of the first segment in it, its
    kind the first of token states, reservation, internal fragmentation found in it; request -1 for slots no live
    request owns. `used_blocks`: the blocks any segment touches (what the KV manager counts as used); `refs`: block ->
    the number of running tables that hold it, where more than one does; `tables`: [request, seq, table as text]."""
    bs, num_blocks = snap.block_size, snap.num_slots // snap.block_size
    cell_blocks = max(1, -(-num_blocks // MAX_CELLS))
    cell_slots = cell_blocks * bs
    num_cells = -(-num_blocks // cell_blocks)
    owner, kind = [None] * num_cells, [None] * num_cells
    held_blocks = [0] * num_cells
    intervals = []
    for seq, first, end, k in sorted(snap.segments, key=lambda s: s[1]):
        intervals.append((first // bs, (end - 1) // bs + 1))
        for c in range(first // cell_slots, (end - 1) // cell_slots + 1):
            if owner[c] is None:
                owner[c] = snap.owners.get(seq, -1)
            kind[c] = k if kind[c] is None else min(kind[c], k)
    used = 0
    last_end = 0
    for first, end in sorted(intervals):  # held blocks, each counted once (segments of one block are several)
        first = max(first, last_end)
        if end > first:
            used += end - first
            for b in range(first, end):
                held_blocks[b // cell_blocks] += 1
            last_end = end
    runs: list[list[int]] = []
    for c in range(num_cells):
        if owner[c] is None:
            continue
        if runs and runs[-1][1] == c and runs[-1][2:] == [owner[c], kind[c], held_blocks[c]]:
            runs[-1][1] = c + 1
        else:
            runs.append([c, c + 1, owner[c], kind[c], held_blocks[c]])
    refs = Counter(b for table in snap.block_tables.values() for b in table)
    return {"step": snap.step, "time": snap.time, "num_prefills": snap.num_prefills, "num_decodes": snap.num_decodes,
            "preempted": list(snap.preempted), "finished": list(snap.finished), "policy": snap.policy,
            "block_size": bs, "num_slots": snap.num_slots, "cell_blocks": cell_blocks, "num_cells": num_cells,
            "runs": runs, "used_blocks": used, "refs": {str(b): n for b, n in refs.items() if n > 1},
            "tables": [[snap.owners.get(seq, -1), seq, _ranges(table)] for seq, table in snap.block_tables.items()],
            "waiting": list(snap.waiting), "running": list(snap.running), "swapped": list(snap.swapped),
            "counts": list(snap.counts)}


def _ranges(ids: list[int]) -> str:
    """A block table as text, runs of consecutive ids as a..b, at most TABLE_ENTRIES entries shown."""
    parts: list[str] = []
    i = 0
    while i < len(ids) and i < TABLE_ENTRIES:
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        parts.append(str(ids[i]) if j == i else f"{ids[i]}..{ids[j]}")
        i = j + 1
    rest = len(ids) - i
    return ", ".join(parts) + (f", ... ({rest} more)" if rest > 0 else "")


def find_chromium() -> str | None:
    """A headless-capable Chromium on this machine (Debian's `chromium` package), or None."""
    import shutil

    return next((path for name in ("chromium", "chromium-browser", "google-chrome") if (path := shutil.which(name))),
                None)


def _chromium(url: str, *flags: str, timeout_s: float = 90) -> str:
    """Run headless Chromium on `url` with `flags`; its stdout. `--timeout` stops the page's loading after 3 s: the
    live page's event stream never ends, and Chromium would otherwise wait for it."""
    import subprocess

    chromium = find_chromium()
    if chromium is None:
        raise RuntimeError("no Chromium found (allowed: install Debian's chromium package)")
    args = [chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--timeout=3000",
            *flags, url]
    done = subprocess.run(args, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        raise RuntimeError(f"chromium exited {done.returncode}: {done.stderr.strip()[-500:]}")
    return done.stdout


def page_dom(url: str, size: tuple[int, int] | None = None) -> str:
    """The page's DOM once its script has drawn (what a reader's browser shows) in a window of `size` pixels (default:
    Chromium's); `url` may be a file:// URL."""
    return _chromium(url, *([f"--window-size={size[0]},{size[1]}"] if size else []), "--dump-dom")


def screenshot(url: str, path: str, size: tuple[int, int] = WINDOW) -> None:
    """A PNG of the page at `url`, `size` pixels."""
    _chromium(url, f"--window-size={size[0]},{size[1]}", f"--screenshot={path}")
