"""The live page of the block pool (`GET /pool` of `python -m reference serve`): plain HTML and JavaScript, no build
step. It comes with the last steps kept (the same as `/pool/history`) and draws the latest as it loads, then follows the
engine step by step (`/pool/events`, server-sent events), each step a snapshot of sim.viewer (the pool through the KV
contract, the queues) as JSON:

    the pool        one cell per block, coloured by the request whose sequence holds it; a block several sequences
                    share (a prompt under n > 1 samples, beams) is marked with its reference count
    block tables    each running sequence's, logical block i -> physical block
    queues          waiting / running / swapped request ids
    shares          the five shares of the memory breakdown (sim.kv.SHARE_NAMES) over the steps kept
    events          preemptions and finishes, newest first
    the slider      scrubs back through the steps kept; "live" follows the engine again

Each drawn block carries `data-block` and the page `data-step` / `data-used`, so a script (the tests' headless
Chromium) can read what is drawn and compare it with the engine's own count of used blocks.
"""
from __future__ import annotations

import json

from sim.kv.base import SHARE_NAMES

POOL_HTML = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>KV block pool: __MODEL__</title>
<style>
body { font: 14px system-ui, sans-serif; margin: 16px; color: #222; }
h1 { font-size: 18px; margin: 0 0 8px; }
#head { margin-bottom: 8px; }
#grid { display: grid; grid-template-columns: repeat(__COLUMNS__, 18px); gap: 2px; margin: 8px 0; }
.block { width: 18px; height: 18px; background: #eee; font-size: 10px; line-height: 18px; text-align: center;
         border-radius: 2px; }
.block.used { color: #fff; }
.block.shared { outline: 2px solid #000; }
#cols { display: flex; gap: 24px; align-items: flex-start; }
#tables, #events, #queues { font: 12px monospace; white-space: pre-wrap; word-break: break-word; max-height: 320px;
                            overflow: auto; width: 420px; }
#shares { border: 1px solid #ccc; }
.legend span { display: inline-block; width: 12px; height: 12px; margin: 0 4px 0 12px; vertical-align: middle; }
</style></head>
<body data-step="-1" data-used="0">
<h1>KV block pool of <code>__MODEL__</code>, live</h1>
<div id="head">waiting for the first step</div>
<div><input id="slider" type="range" min="0" max="0" value="0" style="width: 480px">
<label><input id="live" type="checkbox" checked> live</label></div>
<div id="grid"></div>
<div class="legend" id="legend"></div>
<canvas id="shares" width="480" height="90"></canvas>
<div id="cols"><div><b>block tables</b><div id="tables"></div></div>
<div><b>queues</b><div id="queues"></div><br><b>events</b><div id="events"></div></div></div>
<script>
const SHARES = __SHARES__, COLORS = __COLORS__, KEEP = __KEEP__;
let history = [], shown = -1;
const $ = id => document.getElementById(id);
function colour(rid) { return `hsl(${(rid * 137.508) % 360}, 55%, 45%)`; }
function owners(snap) {  // block id -> request ids of the sequences whose tables hold it
  const held = {};
  for (const [seq, table] of Object.entries(snap.block_tables))
    for (const b of table) (held[b] = held[b] || []).push(snap.owners[seq]);
  return held;
}
function show(i) {
  if (i < 0 || i >= history.length) return;
  shown = i;
  const snap = history[i], held = owners(snap), grid = $("grid");
  const numBlocks = Math.floor(snap.num_slots / snap.block_size);
  grid.textContent = "";
  for (let b = 0; b < numBlocks; b++) {
    const cell = document.createElement("div");
    cell.className = "block";
    cell.dataset.block = b;
    const who = held[b];
    if (who) {
      cell.classList.add("used");
      cell.style.background = colour(who[0]);
      cell.title = `block ${b}: request(s) ${who.join(", ")}`;
      if (who.length > 1) { cell.classList.add("shared"); cell.textContent = who.length; }
    }
    grid.appendChild(cell);
  }
  document.body.dataset.step = snap.step;
  document.body.dataset.used = Object.keys(held).length;
  $("head").textContent = `step ${snap.step} at ${snap.time.toFixed(3)} s: ${snap.num_prefills} prompt entries, ` +
    `${snap.num_decodes} decodes; ${Object.keys(held).length} of ${numBlocks} blocks used (block size ` +
    `${snap.block_size}, policy ${snap.policy})` + (snap.preempted.length ? `; preempted ${snap.preempted}` : "");
  $("tables").textContent = Object.entries(snap.block_tables)
    .map(([seq, table]) => `r${snap.owners[seq]} seq ${seq}: [${table.join(", ")}]`).join("\\n") || "(none)";
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
$("legend").innerHTML = SHARES.map((name, k) => `<span style="background:${COLORS[k]}"></span>${name}`).join("");
$("slider").addEventListener("input", e => { $("live").checked = false; show(Number(e.target.value)); });
$("live").addEventListener("change", e => { if (e.target.checked) show(history.length - 1); });
__HISTORY__.forEach(s => history.push(s));  // the steps kept when the page was served, drawn at once
show(history.length - 1);
const events = new EventSource("pool/events");
events.onmessage = e => add(JSON.parse(e.data));
</script></body></html>
"""


def pool_html(model: str, keep: int, history: list[dict]) -> str:
    """The page, with the model's name, the share palette of the project's figures, the steps it keeps, and the steps
    kept so far (`history`, snapshot_json's), drawn as the page loads: no request is needed for the first picture."""
    from sim.figures.style import SHARE_COLORS, SHARE_LABELS

    steps = json.dumps(history).replace("</", "<\\/")  # inside <script>: no "</script>" may appear
    return (POOL_HTML.replace("__HISTORY__", steps).replace("__MODEL__", model).replace("__COLUMNS__", "32")
            .replace("__KEEP__", str(keep))
            .replace("__SHARES__", json.dumps([SHARE_LABELS[n] for n in SHARE_NAMES]))
            .replace("__COLORS__", json.dumps([_css(SHARE_COLORS[n]) for n in SHARE_NAMES])))  # fmt: skip


def _css(colour) -> str:
    """A matplotlib colour as CSS (#rrggbb)."""
    from matplotlib.colors import to_hex

    return to_hex(colour)


def find_chromium() -> str | None:
    """A headless-capable Chromium on this machine (Debian's `chromium` package), or None."""
    import shutil

    return next((path for name in ("chromium", "chromium-browser", "google-chrome") if (path := shutil.which(name))),
                None)  # fmt: skip


def _chromium(url: str, *flags: str, timeout_s: float = 90) -> str:
    """Run headless Chromium on `url` with `flags`; its stdout. `--timeout` stops the page's loading after 3 s: the
    page's event stream never ends, and Chromium would otherwise wait for it."""
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
    """The page's DOM once its script has drawn the latest step (what a reader's browser shows)."""
    return _chromium(url, "--dump-dom")


def screenshot(url: str, path: str, size: tuple[int, int] = (1000, 720)) -> None:
    """A PNG of the page at `url`, `size` pixels."""
    _chromium(url, f"--window-size={size[0]},{size[1]}", f"--screenshot={path}")


def snapshot_json(snap) -> dict:
    """A sim.viewer.Snapshot as the page reads it (its slot-level segments left out: the page draws blocks)."""
    return {"step": snap.step, "time": snap.time, "num_prefills": snap.num_prefills, "num_decodes": snap.num_decodes,
            "preempted": list(snap.preempted), "finished": list(snap.finished), "policy": snap.policy,
            "block_size": snap.block_size, "num_slots": snap.num_slots,
            "owners": {str(k): v for k, v in snap.owners.items()},
            "block_tables": {str(k): list(v) for k, v in snap.block_tables.items()}, "waiting": list(snap.waiting),
            "running": list(snap.running), "swapped": list(snap.swapped), "counts": list(snap.counts)}  # fmt: skip
