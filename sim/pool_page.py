"""A page of the block pool in the browser: plain HTML and JavaScript, no build step. The same page is served live by
`python -m reference serve` (GET /pool: the engine's last steps, then each new step as a server-sent event) and
written as a file that replays a simulator run (`python -m sim run ... --pool-page run.html`: every step of the run
embedded, no server), so the engine's pool and the simulator's can be watched side by side. Each step is a snapshot of
sim.viewer (the pool through the KV contract, the queues) as JSON (`snapshot_json`):

    the pool        a grid of cells (a cell is a block, or a run of blocks where the pool has more than MAX_CELLS
                    blocks), coloured by the request whose sequence holds it: solid for token states, half for a
                    block's unfilled slots (internal fragmentation), pale for slots reserved and not yet written (the
                    contiguous baselines' reservations); a block several sequences share (a prompt under n > 1
                    samples, beams) is outlined and shows its reference count
    block tables    each running sequence's, logical block i -> physical block (runs of ids as a..b)
    queues          waiting / running / swapped request ids
    shares          the five shares of the memory breakdown (sim.kv.SHARE_NAMES) over the steps kept
    events          preemptions and finishes, newest first
    the slider      scrubs back through the steps kept; Play runs them forward; "live" follows the engine again

What is drawn is what the KV manager holds (its `slot_segments`, reservations included), so a block a contiguous
policy reserved is drawn as held although no block table lists it. Each drawn cell carries `data-cell` and
`data-blocks` (the held blocks in it), the page `data-step` / `data-used`, so a script (the tests' headless Chromium)
can read what is drawn and compare it with the KV manager's own count of used blocks.
"""
from __future__ import annotations

import json
from collections import Counter

from .kv.base import SHARE_NAMES
from .outfiles import atomic_write

MAX_STEPS = 500  # steps a replay page keeps by default: a longer run keeps evenly spaced ones (ReplayRecorder)
STEPS_RANGE = (2, 2000)  # what ReplayRecorder's max_steps may be (`python -m sim run --pool-page-steps`)
MAX_CELLS = 2048  # cells drawn at most: a larger pool is drawn a run of blocks per cell
TABLE_ENTRIES = 48  # a block table's entries shown at most (the rest counted)

POOL_HTML = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>KV block pool: __TITLE__</title>
<style>
body { font: 14px system-ui, sans-serif; margin: 16px; color: #222; }
h1 { font-size: 18px; margin: 0 0 8px; }
#head { margin-bottom: 8px; }
#grid { display: grid; grid-template-columns: repeat(__COLUMNS__, 18px); gap: 2px; margin: 8px 0; }
.block { width: 18px; height: 18px; background: #eee; font-size: 10px; line-height: 18px; text-align: center;
         border-radius: 2px; }
.block.used { color: #fff; }
.block.internal { opacity: 0.6; }
.block.reserved { opacity: 0.3; }
.block.shared { outline: 2px solid #000; }
#cols { display: flex; gap: 24px; align-items: flex-start; }
#tables, #events, #queues { font: 12px monospace; white-space: pre-wrap; word-break: break-word; max-height: 320px;
                            overflow: auto; width: 420px; }
#shares { border: 1px solid #ccc; }
.legend span { display: inline-block; width: 12px; height: 12px; margin: 0 4px 0 12px; vertical-align: middle; }
</style></head>
<body data-step="-1" data-used="0">
<h1>KV block pool of <code>__TITLE__</code>, __MODE__</h1>
<div id="head">waiting for the first step</div>
<div><input id="slider" type="range" min="0" max="0" value="0" style="width: 480px">
<button id="play">play</button>
<label id="livebox"><input id="live" type="checkbox" checked> live</label></div>
<div id="grid"></div>
<div class="legend">cells: <span style="background:#555"></span>token states
<span style="background:#555; opacity: 0.6"></span>unfilled slots of a block
<span style="background:#555; opacity: 0.3"></span>reserved, not yet written
<span style="background:#eee; outline: 2px solid #000"></span>shared (reference count)</div>
<canvas id="shares" width="480" height="90"></canvas>
<div class="legend" id="legend"></div>
<div id="cols"><div><b>block tables</b><div id="tables"></div></div>
<div><b>queues</b><div id="queues"></div><br><b>events</b><div id="events"></div></div></div>
<script>
const SHARES = __SHARES__, COLORS = __COLORS__, KEEP = __KEEP__, LIVE = __LIVE__, KIND = ["", "reserved", "internal"];
let history = [], shown = -1, timer = null;
const $ = id => document.getElementById(id);
function colour(rid) { return rid < 0 ? "#999" : `hsl(${(rid * 137.508) % 360}, 55%, 45%)`; }
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
  const numBlocks = Math.floor(snap.num_slots / snap.block_size);
  $("head").textContent = `step ${snap.step} at ${snap.time.toFixed(3)} s: ${snap.num_prefills} prompt entries, ` +
    `${snap.num_decodes} decodes; ${snap.used_blocks} of ${numBlocks} blocks held (block size ${snap.block_size}` +
    `${snap.cell_blocks > 1 ? ", " + snap.cell_blocks + " blocks a cell" : ""}, policy ${snap.policy})` +
    (snap.preempted.length ? `; preempted ${snap.preempted}` : "");
  $("tables").textContent = snap.tables.map(([rid, seq, table]) => `r${rid} seq ${seq}: [${table}]`).join("\\n")
    || "(none)";
  $("queues").textContent = `waiting ${JSON.stringify(snap.waiting)}\\nrunning ${JSON.stringify(snap.running)}\\n` +
    `swapped ${JSON.stringify(snap.swapped)}`;
  $("slider").max = history.length - 1;
  $("slider").value = i;
  drawShares();
}
function drawShares() {
  const c = $("shares"), g = c.getContext("2d"), n = history.length;
  g.clearRect(0, 0, c.width, c.height);
  const w = c.width / Math.max(n, 1);
  history.forEach((snap, i) => {
    const total = snap.counts.reduce((a, b) => a + b, 0) || 1;
    let y = c.height;
    snap.counts.forEach((count, k) => {
      const h = c.height * count / total;
      g.fillStyle = COLORS[k];
      g.fillRect(i * w, y - h, Math.ceil(w), h);
      y -= h;
    });
  });
  if (shown >= 0) { g.strokeStyle = "#000"; g.strokeRect(shown * w, 0, Math.max(w, 1), c.height); }
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
$("legend").innerHTML = SHARES.map((name, k) => `<span style="background:${COLORS[k]}"></span>${name}`).join("");
$("slider").addEventListener("input", e => { $("live").checked = false; stop(); show(Number(e.target.value)); });
$("live").addEventListener("change", e => { if (e.target.checked) { stop(); show(history.length - 1); } });
$("play").addEventListener("click", () => {
  if (timer) return stop();
  $("live").checked = false;
  if (shown >= history.length - 1) show(0);
  $("play").textContent = "pause";
  timer = setInterval(() => { if (shown >= history.length - 1) stop(); else show(shown + 1); }, 100);
});
__HISTORY__.forEach(s => history.push(s));  // the steps kept when the page was made, drawn at once
if (LIVE) {
  show(history.length - 1);
  const events = new EventSource("pool/events");
  events.onmessage = e => add(JSON.parse(e.data));
} else {
  $("live").checked = false;
  $("livebox").style.display = "none";
  show(0);
}
</script></body></html>
"""


def pool_html(title: str, keep: int, history: list[dict], *, live: bool = True) -> str:
    """The page, with its title, the share palette of the project's figures, the steps it keeps, and the steps so far
    (`history`, snapshot_json's), drawn as the page loads: no request is needed for the first picture. `live`: the
    page follows the server's /pool/events and shows the latest step; otherwise it replays `history` from its first."""
    from .figures.style import SHARE_COLORS, SHARE_LABELS

    steps = json.dumps(history, separators=(",", ":")).replace("</", "<\\/")  # in <script>: no "</script>"
    mode = "live" if live else f"a replay of {len(history)} steps"
    return (POOL_HTML.replace("__HISTORY__", steps).replace("__TITLE__", _escape(title)).replace("__COLUMNS__", "32")
            .replace("__MODE__", mode).replace("__KEEP__", str(max(keep, len(history))))
            .replace("__LIVE__", "true" if live else "false")
            .replace("__SHARES__", json.dumps([SHARE_LABELS[n] for n in SHARE_NAMES]))
            .replace("__COLORS__", json.dumps([_css(SHARE_COLORS[n]) for n in SHARE_NAMES])))  # fmt: skip


def write_replay(snapshots: list, path: str, title: str, *, files=None) -> int:
    """The page replaying `snapshots` (sim.viewer's), one self-contained HTML file at `path` (written whole or not at
    all; into an open sim.outfiles.atomic_files group if `files` is given); its size in bytes. The caller checks the
    path first (sim.outfiles.check_outputs)."""
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
                                       num_decodes=len(plan.decodes)))  # fmt: skip
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
    """A sim.viewer.Snapshot as the page draws it. The pool as `runs` of cells, [first cell, end cell, request id,
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
            "counts": list(snap.counts)}  # fmt: skip


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
                None)  # fmt: skip


def _chromium(url: str, *flags: str, timeout_s: float = 90) -> str:
    """Run headless Chromium on `url` with `flags`; its stdout. `--timeout` stops the page's loading after 3 s: the
    live page's event stream never ends, and Chromium would otherwise wait for it."""
    import subprocess

    chromium = find_chromium()
    if chromium is None:
        raise RuntimeError("no Chromium found (allowed: install Debian's chromium package)")
    args = [chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--timeout=3000",
            *flags, url]  # fmt: skip
    done = subprocess.run(args, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        raise RuntimeError(f"chromium exited {done.returncode}: {done.stderr.strip()[-500:]}")
    return done.stdout


def page_dom(url: str) -> str:
    """The page's DOM once its script has drawn (what a reader's browser shows); `url` may be a file:// URL."""
    return _chromium(url, "--dump-dom")


def screenshot(url: str, path: str, size: tuple[int, int] = (1000, 720)) -> None:
    """A PNG of the page at `url`, `size` pixels."""
    _chromium(url, f"--window-size={size[0]},{size[1]}", f"--screenshot={path}")
