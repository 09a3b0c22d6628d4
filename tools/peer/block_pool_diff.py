"""The block-pool differential of `make peer`: vLLM v1's BlockPool and sim.BlockAllocator, driven by the same random
operation sequences, compared after every operation. Runs in .venv-vllm with the repository on PYTHONPATH.

Operations, as vLLM's KV cache manager issues them: allocate k blocks for a new owner; free an owner's blocks tail
first (vLLM frees a request's blocks in reverse order); cache one of an owner's full, uncached blocks under a hash
drawn from a small set (so that one hash may name several blocks); look a hash up (a hit takes a reference, as
vLLM's `touch`). vLLM keeps block 0 as its null block, so its ids are ours + 1. Compared after each operation: the
ids handed out, hit or miss, the number of free blocks, and the whole free queue in order.

    python tools/peer/block_pool_diff.py RUNS OPS OUT.json
"""

import json
import random
import sys

from vllm.v1.core.block_pool import BlockPool

from sim.kv.blocks import BlockAllocator

BLOCK_SIZE = 16


class _Request:
    """What BlockPool.cache_full_blocks reads of a request: its block hashes."""

    def __init__(self, block_hash: bytes):
        self.block_hashes = [block_hash]


def run(seed: int, num_ops: int) -> str | None:
    """None when the two agree after every operation, else the first disagreement."""
    rng = random.Random(seed)
    num_blocks = rng.randint(4, 24)
    pool = BlockPool(num_gpu_blocks=num_blocks + 1, enable_caching=True, hash_block_size=BLOCK_SIZE)
    ours = BlockAllocator(num_blocks, BLOCK_SIZE, enable_prefix_caching=True)
    owners: list[list[int]] = []
    hashes = [rng.getrandbits(64) for _ in range(rng.randint(2, 8))]
    for step in range(num_ops):
        op = rng.choice(["allocate", "allocate", "free", "free", "cache", "lookup"])
        what = f"op {step} {op}"
        if op == "allocate":
            k = rng.randint(1, 4)
            got = ours.allocate(k)
            theirs = [b.block_id - 1 for b in pool.get_new_blocks(k)] if k <= pool.get_num_free_blocks() else None
            if got != theirs:
                return f"{what}({k}): ours {got}, vLLM's {theirs}"
            if got:
                owners.append(got)
        elif op == "free" and owners:
            blocks = owners.pop(rng.randrange(len(owners)))[::-1]  # tail first
            ours.free(blocks)
            pool.free_blocks([pool.blocks[b + 1] for b in blocks])
            what += f"({blocks})"
        elif op == "cache" and owners:
            candidates = [
                b for o in owners for b in o if not ours.is_cached(b) and pool.blocks[b + 1].block_hash is None
            ]
            if candidates:
                b, h = rng.choice(candidates), rng.choice(hashes)
                ours.cache_block(b, h)
                pool.cache_full_blocks(_Request(h.to_bytes(8, "little")), [pool.blocks[b + 1]], 0, 1, BLOCK_SIZE, 0)
                what += f"({b}, {h:#x})"
        elif op == "lookup":
            h = rng.choice(hashes)
            got = ours.lookup(h)
            found = pool.get_cached_block(h.to_bytes(8, "little"), [0])
            if found:
                pool.touch(found)
            theirs = None if not found else found[0].block_id - 1
            if got != theirs:
                return f"{what}({h:#x}): ours {got}, vLLM's {theirs}"
            if got is not None:
                owners.append([got])
        queue_ours = ours.free_queue()
        queue_theirs = [b.block_id - 1 for b in pool.free_block_queue.get_all_free_blocks()]
        if queue_ours != queue_theirs:
            return f"after {what}: free queue ours {queue_ours}, vLLM's {queue_theirs}"
    return None


def main() -> None:
    runs, ops, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    results = [run(seed, ops) for seed in range(runs)]
    diverged = [r for r in results if r is not None]
    with open(out, "w") as f:
        json.dump({"runs": runs, "ops": ops, "diverged": len(diverged), "first": diverged[:3]}, f)


if __name__ == "__main__":
    main()
