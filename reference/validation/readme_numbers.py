"""The README's numbers of `make calibrate`: the committed cost model's fit and the simulator-vs-engine validation,
as generated blocks.

The same markers and rules as sim/figures/readme_numbers.py (`python -m sim readme-numbers`), which makes every other
block of the README but cannot make these: sim imports nothing of reference. The text is what the commands
themselves print (reference.validation.calibrate's fit_sentence and stability_sentence, reference.validation.validate_sim's readme_table
and targets_sentence), made here from the committed files; nothing is measured. Each block lives on its section's
page (docs/serving.md, docs/calibration.md; looked for in README.md and every docs/*.md, as sim's are). A test checks
that each block is exactly what this module makes of those files, so no number there is typed by hand.

    python -m reference readme-numbers              # print every block, between its markers
    python -m reference readme-numbers --write      # rewrite the blocks, on whichever page each is
    python -m reference readme-numbers --check      # exit 1 if a block is not what the files give

The blocks, in reading order (BLOCKS):
    serving       figures/validate_online*.csv  the server under a trace over HTTP: latencies at the client, the HTTP
                                                overhead, the simulator's error against the client and the engine
    calibration   figures/cost_model_cpu.json   the machine it was measured on, how well it fits, how stable the fit is
    validation    figures/validate_sim.csv      the simulator's errors against the engine, trace by trace; the targets
"""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Callable

from reference.validation.calibrate import fit_sentence, stability_sentence
from reference.validation.validate_sim import readme_table, targets_sentence
from sim.figures import readme_numbers as sim_numbers
from sim.figures.readme_numbers import Row, Table

COMMAND = "python -m reference readme-numbers"
COST_MODEL = "cost_model_cpu.json"  # under figures/: written by `python -m reference calibrate`
VALIDATION = "validate_sim"  # figures/validate_sim.csv: written by `python -m reference validate-sim`
SERVING = "validate_online"  # figures/validate_online.csv (+ _requests.csv): `python -m reference validate-sim --online`


class Files(sim_numbers.Files):
    """The committed results under one folder (figures/), as sim's readme-numbers reads them, and the cost model's
    JSON record."""

    def text(self, filename: str) -> str:
        path = self.folder / filename
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such file (the README's numbers are read from the committed "
                                    f"files; `{COMMAND} --figures DIR` reads another folder)")
        return super().text(filename)

    def record(self, filename: str = COST_MODEL) -> dict:
        try:
            return json.loads(self.text(filename))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{self.folder / filename}: not a JSON file ({exc})") from None


def _threads(n: int | str) -> str:
    return f"{n} thread{'' if str(n) == '1' else 's'}"


def calibration(f: Files) -> str:
    """The committed cost model: where it was measured, how well it fits, how far fits to single passes differ."""
    record = f.record()
    machine, engine = record["machine"], record["engine"]
    table = Table(f"From `figures/{COST_MODEL}` (`python -m reference calibrate`, {record['created']}):",
                  ("", "the committed cost model"),
                  (Row("machine", ("measured on", f"{record['model']}, {_threads(engine['threads'])}, "
                                   f"{engine['dtype']}, on a {machine['cpu_count']}-core {machine['cpu']}")),
                   Row("fit", ("fit", fit_sentence(record))),
                   Row("stability", ("stability", stability_sentence(record)))))
    return table.text()


def validation(f: Files) -> str:
    """The validation run: each trace's errors (the table validate-sim prints) and which traces meet the targets."""
    rows, comments = f.rows(VALIDATION), f.comments(VALIDATION)
    priced = re.fullmatch(r"(\S+) \((.*)\)", comments.get("cost model", ""))
    if not rows or "engine threads" not in comments or priced is None:
        raise ValueError(f"{f.folder / VALIDATION}.csv: expected the summary rows and the `# engine threads:` and "
                         f"`# cost model:` lines `python -m reference validate-sim` writes")
    caption = (f"From `figures/{VALIDATION}.csv` (`python -m reference validate-sim`: the engine at "
               f"{_threads(comments['engine threads'])}, the simulator priced by `{priced[1]}` of {priced[2]}), "
               "one row per trace:")
    return "\n\n".join([caption, readme_table(rows), targets_sentence(rows)])


def serving(f: Files) -> str:
    """The online validation run: the load it served, the latencies its client saw, what HTTP added, the simulator's
    error (validate_online.csv, one row; the client's percentiles from validate_online_requests.csv)."""
    import numpy as np

    (s,), comments = f.rows(SERVING), f.comments(SERVING)
    requests = f.rows(f"{SERVING}_requests")
    ms = 1000

    def pct(column: str, q: int) -> str:
        values = np.array([float(r[column]) for r in requests], dtype=float)
        values = values[np.isfinite(values)]
        return f"{np.percentile(values, q) * ms:,.0f} ms"

    def share(key: str) -> str:
        return f"{float(s[key]):.1%}"

    machine = comments.get("machine", "?").split(", ")
    table = Table(f"From `figures/{SERVING}.csv` and `{SERVING}_requests.csv` (`{comments.get('command', '?')}`; the "
                  f"engine at {_threads(comments.get('engine threads', '?'))} on {', '.join(machine[1:3])}; the "
                  f"simulator priced by `{comments.get('cost model', '?').split(' ')[0]}`):",
                  ("", "over HTTP"),
                  (Row("load", ("the load", f"{s['num_requests']} requests (`{s['trace']}`), {s['errors']} errors, at "
                                f"most {s['max_in_flight']} in flight, preemptions {s['measured_preemptions']} on the "
                                f"engine ({s['simulated_preemptions']} simulated), KV blocks still used afterwards: "
                                f"{s['kv_blocks_used_after']}")),
                   Row("client", ("at the client", f"TTFT p50 {pct('client_ttft', 50)}, p99 {pct('client_ttft', 99)}; "
                                  f"inter-token p50 {pct('client_itl_mean', 50)}, p99 {pct('client_itl_mean', 99)}")),
                   Row("overhead", ("HTTP overhead (client minus engine)",
                                    f"TTFT median {float(s['http_overhead_ttft_median']) * ms:.0f} ms, p90 "
                                    f"{float(s['http_overhead_ttft_p90']) * ms:.0f} ms (the hand-over to the engine, "
                                    f"the wait for the step in progress included, median "
                                    f"{float(s['http_handover_median']) * ms:.0f} ms; the first token's way back "
                                    f"{float(s['http_delivery_median']) * ms:.0f} ms); end to end median "
                                    f"{float(s['http_overhead_e2e_latency_median']) * ms:.0f} ms")),
                   Row("predicted", ("the simulator against the client (median / p90 error)",
                                     f"TTFT {share('median_ttft_error')} / {share('p90_ttft_error')}, ITL "
                                     f"{share('median_itl_mean_error')} / {share('p90_itl_mean_error')}, end to end "
                                     f"{share('median_e2e_latency_error')} / {share('p90_e2e_latency_error')}")),
                   Row("engine", ("... against the engine's own latencies",
                                  f"TTFT {share('median_ttft_engine_error')} / {share('p90_ttft_engine_error')}, "
                                  f"ITL {share('median_itl_mean_engine_error')} / "
                                  f"{share('p90_itl_mean_engine_error')}, end to end "
                                  f"{share('median_e2e_latency_engine_error')} / "
                                  f"{share('p90_e2e_latency_engine_error')}")),
                   Row("steps", ("the cost model on the engine's own steps", f"median error "
                                 f"{share('all_step_error_median')}, bias {float(s['decode_step_bias']):+.1%} (decode "
                                 f"steps; negative: the steps took longer than priced)"))))
    return table.text()


BLOCKS: dict[str, Callable[[Files], str]] = {
    "serving": serving,
    "calibration": calibration,
    "validation": validation,
}
SOURCES = {"calibration": (COST_MODEL, "calibrate"), "validation": (f"{VALIDATION}.csv", "validate-sim"),
           "serving": (f"{SERVING}.csv", "validate-sim --online")}


def make_block(name: str, files: Files | None = None) -> str:
    files = Files() if files is None else files
    try:
        return BLOCKS[name](files)
    except KeyError as exc:  # a field the command writes is absent
        filename, command = SOURCES[name]
        raise ValueError(f"{files.folder / filename}: no {exc} (not what `python -m reference {command}` "
                         "writes)") from None


def readme_blocks(files: Files | None = None) -> dict[str, str]:
    """{block name: the text between its markers}, every block, in README order."""
    files = Files() if files is None else files
    return {name: make_block(name, files) for name in BLOCKS}


# --- the README (the markers' rules are sim's: sim.figures.readme_numbers) ---------------------------------------
def missing_blocks(text: str) -> list[str]:
    """The blocks whose two markers README `text` lacks (or has in the wrong order)."""
    return sim_numbers.missing_blocks(text, BLOCKS)


def update_readme(readme: str | Path | None = None, files: Files | None = None) -> bool:
    """Rewrite the blocks from the committed files (atomically), on the page of each (README.md, docs/*.md), or all in
    the one file `readme`; True if any changed."""
    return sim_numbers._write(sim_numbers._targets(readme), BLOCKS, readme_blocks(files))[0] != []


# --- the command -------------------------------------------------------------------------------------------------
def run(args: argparse.Namespace) -> int:
    """`python -m reference readme-numbers` (its flags: reference/cli.py), as `python -m sim readme-numbers`:
    ValueError/OSError for bad input (no markers to --write into, a README or results file that cannot be read)."""
    return sim_numbers.readme_command(args.readme, args.write, args.check, BLOCKS,
                                      lambda: readme_blocks(Files(args.figures)), COMMAND,
                                      "the README's calibration numbers are the files'")
