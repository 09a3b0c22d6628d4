"""BlockAllocator, step by step: allocation, sharing, copy-on-write, out of memory, the prefix cache."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from sim.kv.blocks import BlockAllocator, hash_block_tokens


def test_rejects_empty_pools():
    with pytest.raises(ValueError, match="num_blocks"):
        BlockAllocator(0, 4)
    with pytest.raises(ValueError, match="block_size"):
        BlockAllocator(4, 0)


def test_allocate_share_free_round_trip():
    a = BlockAllocator(4, 16)
    assert a.allocate(0) == []
    # allocate: a fresh pool hands out blocks 0 and 1, one owner each
    blocks = a.allocate(2)
    assert blocks == [0, 1] and [a.ref_count(b) for b in blocks] == [1, 1]
    assert (a.num_free_blocks, a.num_used_blocks) == (2, 2)
    # share (a fork): block 0 now has two owners
    a.share([0])
    assert a.ref_count(0) == 2
    # free once: block 0 still has an owner and stays used; block 1 goes back to the pool
    a.free([0, 1])
    assert (a.ref_count(0), a.ref_count(1), a.num_free_blocks) == (1, 0, 3)
    a.free([0])
    assert a.num_free_blocks == 4
    a.check_invariants()


def test_out_of_memory_changes_nothing():
    a = BlockAllocator(3, 4)
    a.allocate(2)
    before = (a.num_free_blocks, [a.ref_count(b) for b in range(3)])
    # only one block is free: asking for two is refused, and nothing moves
    assert not a.can_allocate(2)
    assert a.allocate(2) is None
    assert (a.num_free_blocks, [a.ref_count(b) for b in range(3)]) == before
    a.check_invariants()


def test_misuse_raises_and_changes_nothing():
    a = BlockAllocator(2, 4)
    [b] = a.allocate(1)
    with pytest.raises(RuntimeError, match="block 1"):
        a.free([1])  # block 1 was never allocated
    with pytest.raises(RuntimeError, match=f"block {b}"):
        a.free([b, b])  # one reference, freed twice: refused as a whole
    assert a.ref_count(b) == 1
    with pytest.raises(RuntimeError):
        a.share([1])
    with pytest.raises(RuntimeError, match="out of range"):
        a.ref_count(7)
    a.check_invariants()


def test_copy_on_write():
    a = BlockAllocator(3, 4)
    [b] = a.allocate(1)
    # exclusive block: the writer writes in place
    assert a.copy_on_write(b) == b
    # fork: two owners of block 0; the writer gets a fresh block 1 to copy into
    a.share([b])
    fresh = a.copy_on_write(b)
    assert fresh == 1 and a.ref_count(b) == 1 and a.ref_count(fresh) == 1
    # pool full and block 0 shared again: copy-on-write cannot get a block and changes nothing
    a.allocate(1)
    a.share([b])
    assert a.copy_on_write(b) is None and a.ref_count(b) == 2
    a.check_invariants()


def test_prefix_cache_keeps_freed_blocks_until_the_pool_needs_them():
    a = BlockAllocator(3, 4, enable_prefix_caching=True)
    h0 = hash_block_tokens(None, [1, 2, 3, 4])
    h1 = hash_block_tokens(h0, [5, 6, 7, 8])
    b0, b1 = a.allocate(2)
    a.cache_block(b0, h0)
    a.cache_block(b1, h1)
    # the request finishes: both blocks are free (countable as free memory) yet still cached
    a.free([b1, b0])  # tail first, as the KV manager frees: block 1 is now the least recently freed
    assert a.num_free_blocks == 3 and a.is_cached(b0) and a.is_cached(b1)
    # a new request with the same first block: a hit revives block 0 out of the free queue
    assert a.lookup(h0) == b0 and a.ref_count(b0) == 1 and a.num_free_blocks == 2
    assert a.lookup(hash_block_tokens(h0, [9, 9, 9, 9])) is None
    assert (a.num_prefix_hits, a.num_prefix_misses) == (1, 1)
    # the pool needs memory: never-used block 2 first, then block 1, the least recently freed, is evicted
    assert a.allocate(1) == [2]
    assert a.is_cached(b1)
    assert a.allocate(1) == [b1]
    assert not a.is_cached(b1) and a.lookup(h1) is None
    a.check_invariants()


def test_a_hash_cached_twice_names_both_blocks_and_finds_the_first():
    a = BlockAllocator(2, 4, enable_prefix_caching=True)
    b0, b1 = a.allocate(2)
    a.cache_block(b0, 42)
    a.cache_block(b1, 42)  # the same prefix computed again: both stay cached (vLLM v1 does the same)
    assert a.is_cached(b0) and a.is_cached(b1) and a.cached_block(42) == b0
    a.cache_block(b0, 42)  # re-registering the same pair is harmless: nothing changes
    assert a.is_cached(b0) and a.cached_block(42) == b0
    with pytest.raises(RuntimeError, match="already cached"):
        a.cache_block(b0, 43)
    assert a.lookup(42) == b0 and a.is_cached(b1)  # a lookup finds the one cached first
    a.free([b0, b0])  # cached: to the back of the free queue, then b1 behind it
    a.free([b1])
    assert a.free_queue() == [b0, b1]
    assert a.allocate(1) == [b0] and not a.is_cached(b0)  # evicting b0 leaves 42 naming b1
    assert a.lookup(42) == b1
    a.check_invariants()


def test_the_free_queue_is_vllms():
    """vLLM v1's BlockPool.free_blocks: a freed block holding no cached prefix goes to the front (reused first, the
    first of one free() call first), a freed cached block to the back (evicted last)."""
    a = BlockAllocator(6, 4, enable_prefix_caching=True)
    assert a.allocate(4) == [0, 1, 2, 3] and a.free_queue() == [4, 5]
    a.cache_block(0, 7)
    a.free([3, 2, 1, 0])  # a request's blocks, tail first
    assert a.free_queue() == [3, 2, 1, 4, 5, 0]
    assert a.allocate(2) == [3, 2]  # the freed tail is reused first; the cached head stays until the very end
    plain = BlockAllocator(4, 4)
    plain.allocate(3)
    plain.free([2, 0])
    assert plain.free_queue() == [2, 0, 3]


def test_prefix_cache_calls_raise_when_caching_is_off():
    a = BlockAllocator(2, 4)
    [b] = a.allocate(1)
    with pytest.raises(RuntimeError, match="prefix caching"):
        a.cache_block(b, 1)
    with pytest.raises(RuntimeError, match="prefix caching"):
        a.lookup(1)
    assert not a.is_cached(b)


def test_hash_chains_the_parent_and_is_stable_across_processes():
    h = hash_block_tokens(None, [1, 2, 3])
    assert hash_block_tokens(None, (1, 2, 3)) == h
    assert hash_block_tokens(h, [1, 2, 3]) != h  # same tokens, different prefix: a different block
    assert hash_block_tokens(None, [1, 2, 4]) != h
    code = "from sim.kv.blocks import hash_block_tokens as f; print(f(f(None, [1, 2, 3]), [7, 8]))"
    outs = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
        ).stdout
        for seed in ("1", "2")
    }
    assert outs == {f"{hash_block_tokens(h, [7, 8])}\n"}


def test_check_invariants_reports_corruption():
    a = BlockAllocator(2, 4)
    a.allocate(1)
    a._ref_counts[1] = 1  # corrupt on purpose: block 1 is referenced yet still in the free queue
    with pytest.raises(RuntimeError, match="free queue"):
        a.check_invariants()


def test_bench_alloc_command_writes_its_csv(tmp_path, capsys):
    from sim.drivers import bench_alloc

    out = tmp_path / "bench.csv"
    assert bench_alloc.main(["--ops", "300", "--csv", str(out)]) == 0
    header, *rows = out.read_text().splitlines()
    assert header.split(",") == list(bench_alloc.COLUMNS)
    assert len(rows) == 8 and all(row.split(",")[3] == "300" for row in rows)  # blocks, paged, 3 policies x 2
    assert "ops_per_s" in capsys.readouterr().out


def test_bench_alloc_rejects_bad_flags_in_one_line(capsys):
    from sim.drivers import bench_alloc

    assert bench_alloc.main(["--ops", "0"]) == 2
    with pytest.raises(SystemExit) as exit_info:
        bench_alloc.main(["--ops", "many"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("error: ") for line in err)


def test_uncache_forgets_a_blocks_prefix_entry_and_keeps_its_references():
    alloc = BlockAllocator(num_blocks=4, block_size=2, enable_prefix_caching=True)
    a, b = alloc.allocate(2)
    alloc.cache_block(a, 111)
    alloc.cache_block(b, 222)
    assert alloc.cached_block(111) == a and alloc.cached_block(222) == b
    alloc.uncache([a, 3])  # block 3 was never cached: skipped
    assert alloc.cached_block(111) is None and alloc.cached_block(222) == b
    assert alloc.lookup(111) is None and alloc.ref_count(a) == 1
    alloc.check_invariants()
