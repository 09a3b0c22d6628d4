"""figures/pool_live.png: the live pool page (`python -m reference serve`, GET /pool) in headless Chromium, mid-run.

    python tools/pool_screenshot.py [--out figures/pool_live.png]

Serves SmolLM2 on a pool of NUM_BLOCKS blocks of 4 tokens in this process, sends eight streamed requests (three with
n = 2, whose samples share their prompt's blocks), waits until the pool is mostly used, and saves the page as Chromium
draws it in a 1400x1000 window (sim.views.pool_page.WINDOW, the window the page is made to fit). Needs Debian's chromium
package (sim.views.pool_page.find_chromium).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PROMPTS = [
    ("Tell me a story about a lighthouse.", 2),
    ("List some rivers:", 1),
    ("Write a poem about snow.", 2),
    ("Explain paging in one sentence.", 1),
    ("The history of bread", 1),
    ("Name colours:", 1),
    ("A recipe for soup:", 2),
    ("Why is the sky blue?", 1),
]
NUM_BLOCKS = 256  # 11 sequences of up to ~110 tokens: about 300 blocks at the end, so the pool fills
WAIT_S = 600  # for the pool to fill (SmolLM2 on a CPU: a step takes longer on a busy machine)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(ROOT / "figures" / "pool_live.png"))
    args = parser.parse_args()
    import httpx

    from reference import LLM
    from reference.server.run import serve_in_thread
    from sim.views.pool_page import find_chromium, screenshot

    if find_chromium() is None:
        print("error: no Chromium (allowed: apt-get install chromium)", file=sys.stderr)
        return 2
    server, base = serve_in_thread(LLM("smollm2", num_gpu_blocks=NUM_BLOCKS, block_size=4), "smollm2")

    def read(prompt: str, n: int) -> None:
        body = {
            "model": "smollm2",
            "prompt": prompt,
            "max_tokens": 100,
            "temperature": 0.8,
            "n": n,
            "seed": 1,
            "ignore_eos": True,
            "stream": True,
        }
        with httpx.stream("POST", base + "/v1/completions", json=body, timeout=300) as r:
            for _ in r.iter_lines():
                pass

    for prompt, n in PROMPTS:
        threading.Thread(target=read, args=(prompt, n), daemon=True).start()
    deadline = time.time() + WAIT_S
    while time.time() < deadline:
        history = httpx.get(base + "/pool/history").json()
        if history and history[-1]["used_blocks"] >= 0.75 * NUM_BLOCKS and len(history) >= 60:
            break
        time.sleep(0.05)
    screenshot(base + "/pool", args.out)
    print(f"wrote {args.out} (step {history[-1]['step']}, {history[-1]['used_blocks']} of {NUM_BLOCKS} blocks used)")
    server.should_exit = True
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    # NOTE: the streams still running hold torch's worker threads; leave without unwinding them (no C++ abort message)
    os._exit(code)
