"""Inject a fault at every KV call of a run, for every KV configuration the engine runs, and count what survives.

    .venv/bin/python tools/kv_faults.py [--config NAME ...] [--sample N] [--csv figures/kv_faults.csv]

For each configuration of reference/validation/fault_injection.py (paged with recompute, swap, prefix caching and a chunked
budget; the contiguous max and pow2; vattention; radix; hybrid on a tiny Gemma 3) the engine serves six requests
(greedy, beam search, n = 2 sampling) once without a fault, then once per point: every call the scheduler makes
into the KV manager, before it and just after it returned, and every call the manager makes into its own parts
(allocator, radix tree) before it. The outcomes (survived, replaced, wedged, leaked, mismatch, over_aborted,
broken_after) are defined in reference/validation/fault_injection.py. Prints one line per configuration and saves the
table. This is a probe, minutes long; tests/reference/test_kv_faults.py runs part of it in `make test`.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from reference.validation import fault_injection as fi  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--config", action="append", choices=list(fi.CONFIGS), help="a configuration (repeatable; default: all)"
    )
    parser.add_argument(
        "--sample", type=int, default=None, help="points drawn at random per configuration (default: every point)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of --sample's draw")
    parser.add_argument("--csv", default=str(ROOT / "figures" / "kv_faults.csv"), help="where the table goes")
    args = parser.parse_args(argv)
    if args.sample is not None and args.sample < 1:
        parser.error(f"--sample must be >= 1, got {args.sample}")
    rows, failures = [], []
    for name in args.config or list(fi.CONFIGS):
        start = time.perf_counter()
        results = fi.run([name], sample=args.sample, seed=args.seed)
        counts = Counter(r.outcome for r in results)
        rows.append({"config": name, "points": len(results), **{o: counts.get(o, 0) for o in fi.OUTCOMES}})
        failures += [r for r in results if r.outcome != "survived"]
        shown = ", ".join(f"{o} {counts[o]}" for o in fi.OUTCOMES if counts.get(o))
        print(f"{name:30s} {len(results):5d} points in {time.perf_counter() - start:5.1f} s: {shown}", flush=True)
    total = {o: sum(r[o] for r in rows) for o in fi.OUTCOMES}
    rows.append({"config": "all", "points": sum(r["points"] for r in rows), **total})
    print(f"{'all':30s} {rows[-1]['points']:5d} points: " + ", ".join(f"{o} {n}" for o, n in total.items()))
    for r in failures[:20]:
        print(f"  {r.config}: {r.outcome} at {r.point}: {r.detail}")
    path = Path(args.csv)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["config", "points", *fi.OUTCOMES])
        writer.writeheader()
        writer.writerows(rows)
    os.replace(tmp, path)
    print(f"wrote {path}")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
