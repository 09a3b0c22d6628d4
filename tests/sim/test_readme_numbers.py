"""The README's generated numbers (sim/figures/readme_numbers.py): every block of README.md is exactly what the module
makes of the committed files; each number is the committed CSV's, recomputed here by hand with the rounding the README
has always printed it with; and `python -m sim readme-numbers` checks a stale block (exit 1), rewrites a copy, and
says in one line what is wrong with a README without markers.

The numbers of the engine's files are recomputed beside the engine's own tests (tests/reference/test_bench_gpu.py,
test_bench_hybrid.py, tests/test_peer.py), with the engine's own readers."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

from sim.drivers.cli import main
from sim.figures import readme_numbers
from sim.figures.readme_numbers import BLOCKS, Files, current_block, make_block, markers, page_block, readme_blocks
from sim.kv import allocates_blocks_on_demand
from tests.docs_book import book_text

ROOT = Path(__file__).resolve().parents[2]
FIGURES = ROOT / "figures"


@pytest.fixture(scope="module")
def files() -> Files:
    return Files(FIGURES)


def read_rows(name: str) -> list[dict]:
    with open(FIGURES / f"{name}.csv", newline="") as f:
        return list(csv.DictReader(line for line in f if not line.startswith("#")))


def lab(files: Files, block: str, key: str, column: str = "lab") -> str:
    return make_block(block, files).row(key)[column]


def test_readme_blocks_are_generated_from_the_committed_files(files):
    for name, block in readme_blocks(files).items():  # each on its page: README.md or docs/*.md, exactly one
        assert page_block(name) == block, name
    book = book_text()  # README.md, then mkdocs.yml's nav
    assert list(BLOCKS) == sorted(BLOCKS, key=lambda name: book.index(markers(name)[0]))  # in reading order


# --- each number, by hand -----------------------------------------------------------------------------------------
def test_memory_waste_map_and_chunked_prefill(files):
    used = {r["policy"]: float(r["token_states"]) for r in read_rows("memory_waste") if r["view"] == "memory in use"}
    reserving = [share for policy, share in used.items() if not allocates_blocks_on_demand(policy)]
    paging = [share for policy, share in used.items() if allocates_blocks_on_demand(policy)]
    assert len(paging) == 1 and len(reserving) == 3
    waste = make_block("memory-waste", files)
    assert waste.row("reserving")["token states"] == f"{100 * min(reserving):.0f}-{100 * max(reserving):.0f}%"
    assert waste.row("paged")["token states"] == f"{paging[0]:.0%}"

    memory_map = {r["policy"]: r for r in read_rows("memory_map")}
    pool = make_block("memory-map", files)
    assert pool.row("max")["requests in memory"] == memory_map["max"]["num_requests_in_memory"]
    assert pool.row("max")["waiting"] == memory_map["max"]["num_waiting"]
    paged = memory_map["paged"]
    assert pool.row("paged")["requests in memory"] == paged["num_requests_in_memory"]
    assert pool.row("paged")["slots free"] == f"{int(paged['free']) / int(paged['num_slots']):.0%}"

    chunked = read_rows("chunked_prefill")
    stall = {(r["system"], float(r["rate"])): float(r["p99_itl_max_s"]) for r in chunked}
    ttft = {(r["system"], float(r["rate"])): float(r["p99_ttft_s"]) for r in chunked}
    block = make_block("chunked-prefill", files)
    for system in ("v0", "v1-512", "v1-2048"):
        assert block.row(system)["a request's largest gap between two tokens"] == f"{1e3 * stall[system, 1.0]:.0f} ms"
        assert block.row(system)["time to first token"] == f"{1e3 * ttft[system, 1.0]:.0f} ms"


def test_priority(files):
    rows = read_rows("priority")
    top = max(float(r["rate"]) for r in rows)
    block = make_block("priority", files)
    for r in rows:
        if float(r["rate"]) == top:
            row = block.row(f"{r['priority']}.{r['scheduling_policy']}")
            assert row["mean time to first token"] == f"{float(r['mean_ttft_s']):.2f} s"
            assert row["normalized latency (s/token)"] == f"{float(r['normalized_latency_s_per_token']):.3f} s"


def test_batch_size_and_the_sustained_rates_of_figs_14_and_17(files):
    batch = {(r["workload"], r["system"]): float(r["mean_batch_size"]) for r in read_rows("batch_size")}
    expected = f"{batch['sharegpt', 'paged'] / batch['sharegpt', 'max']:.1f}x"
    assert lab(files, "figures", "batch_size.paged/max") == expected

    sustained = {
        (r["kind"], int(r["width"]), r["system"]): (">= " if r["sustained_is_lower_bound"] == "True" else "")
        + r["sustained_rate"]
        for r in read_rows("sampling_latency")
    }
    for kind in ("n", "beam_width"):
        expected = f"paged {sustained[kind, 6, 'paged']}, Oracle {sustained[kind, 6, 'oracle']}"
        assert lab(files, "figures", f"sampling_latency.{kind}") == expected

    chat = {r["system"]: r["sustained_rate"] for r in read_rows("chatbot")}
    ratio = float(chat["paged"]) / max(float(chat[s]) for s in ("max", "pow2", "oracle"))
    expected = f"paged {chat['paged']}; Max {chat['max']}, Pow2 {chat['pow2']}, Oracle {chat['oracle']}"
    assert lab(files, "figures", "chatbot.sustained") == expected
    assert lab(files, "figures", "chatbot.ratio") == f"{ratio:.2g}x"


def test_vattention_and_hybrid_memory(files):
    rows = {(r["system"], r["page_tokens"]): r for r in read_rows("vattention_pages")}
    used = {t: float(rows["vattention", str(t)]["token_states_of_used"]) for t in (1, 64, 2048)}
    max_used, max_batch = float(rows["max", ""]["token_states_of_used"]), float(rows["max", ""]["mean_batch_size"])
    expected = f"{used[1]:.1%} (1-token pages), {used[64]:.1%} (64-token pages), {used[2048]:.1%} (2048-token pages)"
    assert lab(files, "figures", "vattention_pages.used") == expected
    assert lab(files, "figures", "vattention_pages.max") == f"{max_used:.1%}"
    assert lab(files, "figures", "vattention_pages.batch").endswith(f"; Max {max_batch:.1f}")
    assert float(rows["vattention", "2048"]["mean_batch_size"]) == pytest.approx(max_batch)  # the batch falls to Max's

    rows = {(r["system"], r["prompt_len"]): r for r in read_rows("hybrid_memory")}
    hyb, full = rows["hybrid", "8192"], rows["paged", "8192"]
    ratio = float(hyb["throughput_req_per_s"]) / float(full["throughput_req_per_s"])
    batches = [f"{float(r['mean_batch_size']):.1f}" for r in (hyb, full)]
    expected = f"hybrid {batches[0]}, every layer full attention {batches[1]}"
    assert lab(files, "figures", "hybrid_memory.batch") == expected
    assert lab(files, "figures", "hybrid_memory.throughput") == f"{ratio:.1f}x"


def test_memory_managers(files):
    rows = read_rows("memory_managers")
    a = [r for r in rows if r["panel"] == "a" and not (r["policy"] == "vattention" and r["block_size_tokens"] != "64")]
    names = ("Max", "Pow2", "Oracle", "vAttention, 64-token pages", "paged", "radix, 1-token pages")
    assert [r["policy"] for r in a] == ["max", "pow2", "oracle", "vattention", "paged", "radix"]
    shares = [f"{float(r['token_states']):.0%} ({name})" for r, name in zip(a, names)]
    assert lab(files, "figures", "memory_managers.token_states") == ", ".join(shares)
    batches = [f"{float(r['mean_batch_size']):.1f} ({name})" for r, name in zip(a, names)]
    assert lab(files, "figures", "memory_managers.batch") == ", ".join(batches)
    hits = {
        (r["policy"], r["block_size_tokens"]): float(r["prefix_hit_rate_tokens"]) for r in rows if r["panel"] == "b"
    }
    for policy in ("paged", "radix"):
        expected = ", ".join(f"{hits[policy, b]:.1%} ({b})" for b in ("1", "16", "64"))
        assert lab(files, "figures", f"memory_managers.hits.{policy}") == expected


def test_the_simulator_and_cpu_benchmarks(files):
    interpreted = [r for r in read_rows("bench_sim") if r.get("build") in (None, "", "interpreted")]
    sim_bench = {r["run"]: float(r["wall_time_s"]) for r in interpreted if r["run"] != "heapq"}
    block = make_block("benchmarks", files)
    result = block.row("sim")["result"]
    for run, label in (
        ("paper-scale paged", "paged"),
        ("paper-scale max", "max"),
        ("paper-scale pow2", "pow2"),
        ("paper-scale oracle", "oracle"),
        ("paper-scale paged v1", "paged under v1"),
    ):
        assert f"{label} {sim_bench[run]:.2f} s" in result, run
    assert block.row("sim_100k")["result"].startswith(
        f"v0 {sim_bench['100k paged v0']:.1f} s, v1 {sim_bench['100k paged v1']:.1f} s"
    )
    huge = next(r for r in interpreted if r["run"] == "1M paged v0")
    assert block.row("sim_1m")["result"].startswith(
        f"{float(huge['wall_time_s']):.1f} s, peak memory {float(huge['peak_rss_mib']):,.0f} MiB"
    )
    alloc = {
        (r["benchmark"], r["policy"], r["allocator"]): float(r["ops_per_s"]) / 1e6 for r in read_rows("bench_alloc")
    }
    contiguous = [v for (b, p, _), v in alloc.items() if b == "kv_cycle" and p != "paged"]
    assert block.row("alloc")["result"] == (
        f"BlockAllocator allocate/free {alloc['blocks', '', 'block']:.2f} M/s; "
        f"paged {alloc['kv_cycle', 'paged', 'block']:.2f} M/s; "
        f"contiguous {min(contiguous):.2f}-{max(contiguous):.2f} M/s"
    )
    engine = {r["system"].split(" ")[0]: r for r in read_rows("bench_engine_cpu") if r["section"] == "throughput"}
    tokens = {k: float(v["tokens_per_s"]) for k, v in engine.items()}
    assert block.row("engine")["result"].startswith(
        f"{tokens['engine']:.1f} vs {tokens['HF']:.1f} output tokens/s: {tokens['engine'] / tokens['HF']:.2f}x"
    )
    held = {
        r["system"]: r["max_concurrent_requests"]
        for r in read_rows("bench_engine_cpu")
        if r["section"] == "concurrency"
    }
    assert block.row("concurrency")["result"].replace(" (the whole workload)", "") == ", ".join(
        f"{s} {n}" for s, n in held.items()
    )


# --- the command line ---------------------------------------------------------------------------------------------
def sim(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sim", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )


def empty_blocks(names=tuple(BLOCKS), inside: str = "") -> str:
    return "\n\n".join(f"{markers(n)[0]}\n{inside}{markers(n)[1]}" for n in names)


def test_check_passes_on_the_committed_readme():
    out = sim("readme-numbers", "--check")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "README.md and docs/*.md: the README's numbers are the files'"


def test_a_stale_block_is_found_and_write_rewrites_a_copy(tmp_path, capsys):
    readme = tmp_path / "README.md"
    readme.write_text("before\n\n" + empty_blocks(inside="stale\n") + "\n\nafter\n")
    assert main(["readme-numbers", "--check", "--readme", str(readme)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "memory-waste" in err[0] and "readme-numbers --write" in err[0], err
    assert main(["readme-numbers", "--write", "--readme", str(readme)]) == 0
    assert capsys.readouterr().out.strip() == f"rewrote {readme}"
    assert main(["readme-numbers", "--check", "--readme", str(readme)]) == 0
    assert capsys.readouterr().out.strip() == f"{readme}: the README's numbers are the files'"
    text = readme.read_text()
    assert text.startswith(f"before\n\n{markers('install')[0]}\nEach install") and text.endswith("\n\nafter\n")
    assert f"{markers('memory-waste')[0]}\nToken states" in text
    assert "stale" not in text
    assert main(["readme-numbers", "--write", "--readme", str(readme)]) == 0
    assert capsys.readouterr().out.strip() == f"unchanged: {readme}"

    # one block edited by hand: --check names it, and only it
    readme.write_text(text.replace("Token states among", "Token states, by hand, among"))
    assert main(["readme-numbers", "--check", "--readme", str(readme)]) == 1
    assert "its blocks memory-waste are not" in capsys.readouterr().err


def test_a_readme_without_markers_is_one_line(tmp_path, capsys):
    plain = tmp_path / "plain.md"
    plain.write_text("no markers here\n")
    assert main(["readme-numbers", "--check", "--readme", str(plain)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"{plain}: no {markers('install')[0]}"), err
    # --write has nowhere to write: bad input, one `error:` line, exit 2, nothing written (as paper-table)
    assert main(["readme-numbers", "--write", "--readme", str(plain)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "readme-numbers:install:begin" in err[0], err
    assert plain.read_text() == "no markers here\n"
    # one block missing, or its markers in the wrong order: that block is named
    some = tmp_path / "some.md"
    begin, end = markers("gpu")
    some.write_text(empty_blocks([n for n in BLOCKS if n != "gpu"]) + f"\n{end}\n{begin}\n")
    assert main(["readme-numbers", "--check", "--readme", str(some)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"no {begin} ... {end} block" in err[0], err
    assert main(["readme-numbers", "--write", "--readme", str(some)]) == 2
    assert "error: " in capsys.readouterr().err and "stale" not in some.read_text()


def test_print_gives_every_block_between_its_markers(capsys):
    assert main(["readme-numbers"]) == 0
    out = capsys.readouterr().out
    readme = book_text()
    for name in BLOCKS:
        begin, end = markers(name)
        assert f"{begin}\n{current_block(readme, name)}\n{end}" in out


@pytest.mark.parametrize(
    "args, message",
    [
        (["readme-numbers", "--figures", "nowhere"], "no such file"),
        (["readme-numbers", "--write", "--check"], "not allowed with argument"),
        (["readme-numbers", "--check", "--readme", "absent.md"], "absent.md"),
    ],
)
def test_bad_input_is_one_error_line(args, message, tmp_path):
    out = sim(*args, cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    assert out.stderr.startswith("error: ") and message in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_a_missing_file_names_itself(tmp_path):
    with pytest.raises(FileNotFoundError, match="memory_waste.csv: no such file"):
        readme_numbers.make_block("memory-waste", Files(tmp_path))


def test_blocks_are_found_on_whichever_page_holds_them(tmp_path, files):
    """The pages (README.md, docs/*.md) share the blocks: --write rewrites each on its own page, the changed pages
    only; a block on no page, or on two, is one line naming it (and nothing is written)."""
    from sim.figures.readme_numbers import _write, locate, read_pages

    blocks = readme_blocks(files)
    names = list(BLOCKS)
    front, page, other = tmp_path / "README.md", tmp_path / "page.md", tmp_path / "other.md"
    front.write_text("front\n\n" + empty_blocks(names[:1], inside="stale\n") + "\n")
    page.write_text("a page\n\n" + empty_blocks(names[1:], inside="stale\n") + "\n")
    other.write_text("no blocks here\n")
    changed, _ = _write([front, page, other], names, blocks)
    assert changed == [front, page] and other.read_text() == "no blocks here\n"
    texts = read_pages([front, page, other])
    assert locate(texts, names) == {name: [front] if name == names[0] else [page] for name in names}
    assert all(page_block(name, texts) == blocks[name] for name in names)
    assert _write([front, page, other], names, blocks)[0] == []  # unchanged: nothing written

    other.write_text(empty_blocks(names[:1]) + "\n")  # the first block on two pages
    with pytest.raises(ValueError, match=f"{markers(names[0])[0]} is on .*README.md and .*other.md"):
        _write([front, page, other], names, blocks)
    other.write_text("no blocks here\n")
    page.write_text("a page\n")  # the others on none
    with pytest.raises(ValueError, match=rf"no {markers(names[1])[0]} .* block \(nor "):
        _write([front, page, other], names, blocks)
    assert front.read_text().startswith("front\n")
