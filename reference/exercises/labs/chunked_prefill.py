"""Lab `chunked_prefill`: attention for one chunk of a prompt through a paged KV cache, and a driver that prefills
a prompt in chunks of any sizes; chunking must change nothing.

With chunked prefill (vLLM v1; Sarathi-Serve, Agrawal et al., OSDI 2024) a prompt of L tokens is computed over
several steps. The chunk of tokens start .. start + n - 1 writes its K/V into the sequence's blocks, then attends
to everything before it (the K/V earlier chunks cached) and causally to itself. Attention is causal, so token p
sees exactly tokens 0..p whichever way the prompt is cut: the outputs and the cache equal those of one pass over
the whole prompt, up to the order of floating-point sums.

    prompt of 7 tokens, chunks [3, 4], block_size 2, block_table [5, 2, 7, 0]:
      chunk 1: write t0 t1 t2 -> block 5 slots 0 1, block 2 slot 0;  queries t0..t2 read t0..t2 (causal)
      chunk 2: write t3..t6   -> block 2 slot 1, block 7, block 0 slot 0;  query t4 reads t0..t4 (t0..t2 cached)

The oracles are the project's torch reference (reference/attention/torch_ref.py): `store_kv_ref` writes a whole
prompt's K/V, `paged_prefill_attention_ref` is one-shot causal attention over a paged cache. Torch is imported
only when a check runs. Unwritten cache slots hold NaN (the skeleton's constructor makes them so), so an answer
that reads a slot it should not turns NaN.
"""
from __future__ import annotations

from sim.exercises.referee import NO_RULES
from sim.exercises.registry import Exercise, MachineCheck
from sim.exercises.report import Story


def _cumulative_means(values):
    """Row p: the mean of rows 0..p (causal attention's output when every score is equal)."""
    import torch

    counts = torch.arange(1, values.shape[0] + 1, dtype=values.dtype).view(-1, 1, 1)
    return values.cumsum(0) / counts


def _random(seed: int, *shape: int):
    import torch

    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _short(x) -> str:
    """A tensor as a flat list of rounded numbers when small, else its shape (a story line stays one line)."""
    import torch

    if not isinstance(x, torch.Tensor):
        return repr(x)
    if x.numel() <= 8:
        return str([round(v, 4) for v in x.flatten().tolist()])
    return f"a tensor of shape {list(x.shape)}"


def _do(t: Story, obj, method: str, shown: str, *args):
    """obj.method(*args), told as `method(shown) -> result` (Story.do would print every tensor in full)."""
    t.steps.append(f"{method}({shown})")
    result = getattr(obj, method)(*args)
    if result is not None:
        t.steps[-1] += f" -> {_short(result)}"
    return result


def _close(t: Story, what: str, found, expected) -> None:
    """found equals expected within 1e-5 (float32 sums in another order move the last bits only)."""
    import torch

    if not isinstance(found, torch.Tensor) or found.shape != expected.shape:
        shape = list(found.shape) if isinstance(found, torch.Tensor) else type(found).__name__
        t.ensure(False, f"{what}: expected a tensor of shape {list(expected.shape)}, found {shape}")
    bad = ~torch.isclose(found.float(), expected.float(), atol=1e-5)  # either may be float64 (a student's own)
    if expected.numel() <= 8:
        t.ensure(not bad.any(), f"{what}: expected {_short(expected)}, found {_short(found)}")
    elif bad.any():
        p = int(bad.flatten(1).any(1).nonzero()[0])
        t.ensure(False, f"{what}: token {p} (heads x head_dim) expected {_short(expected[p])}, "
                        f"found {_short(found[p])}")


def write_through_table(make, t: Story) -> None:
    """write_chunk puts token p into block block_table[p // block_size], slot p % block_size"""
    import math

    import torch

    p = make(4, 2, 1, 1)  # 4 blocks of 2 slots, 1 head, head_dim 1: each slot holds one number
    keys = torch.tensor([10.0, 11.0, 12.0, 13.0]).view(4, 1, 1)
    t.say("keys of tokens 0..3 are 10, 11, 12, 13; values their negatives")
    _do(t, p, "write_chunk", "[3, 1], 0, keys of tokens 0..2, values of tokens 0..2", [3, 1], 0, keys[:3], -keys[:3])
    cache = [[None if math.isnan(x) else x for x in row] for row in p.key_cache.view(4, 2).tolist()]
    t.expect("key_cache (block -> its 2 slots; None: never written)", cache,
             [[None, None], [12.0, None], [None, None], [10.0, 11.0]])
    _do(t, p, "write_chunk", "[3, 1], 3, key of token 3, value of token 3", [3, 1], 3, keys[3:], -keys[3:])
    t.expect("key_cache[1] after writing token 3", p.key_cache[1].flatten().tolist(), [12.0, 13.0])
    t.expect("value_cache[1]", p.value_cache[1].flatten().tolist(), [-12.0, -13.0])


def one_token_sees_itself(make, t: Story) -> None:
    """the first token of a prompt attends only to itself: its output is its own value"""
    p = make(2, 4, 2, 3)
    q, k, v = (_random(seed, 1, 2, 3) for seed in (1, 2, 3))
    t.say(f"one token, 2 heads x head_dim 3: value {_short(v)}")
    _do(t, p, "write_chunk", "[1], 0, key, value", [1], 0, k, v)
    _close(t, "attend_chunk([1], 0, query)", _do(t, p, "attend_chunk", "[1], 0, query", [1], 0, q), v)


def causal_within_chunk(make, t: Story) -> None:
    """inside a chunk, token p sees tokens 0..p only: with all keys zero, its output is the mean of values 0..p"""
    import torch

    p = make(3, 2, 1, 1)
    values = torch.tensor([1.0, 2.0, 6.0, 3.0, 8.0]).view(5, 1, 1)
    t.say("5 tokens, 1 head, head_dim 1; keys all zero, so every score is equal; values 1, 2, 6, 3, 8")
    _do(t, p, "write_chunk", "[2, 0, 1], 0, keys, values", [2, 0, 1], 0, torch.zeros(5, 1, 1), values)
    out = _do(t, p, "attend_chunk", "[2, 0, 1], 0, queries", [2, 0, 1], 0, _random(0, 5, 1, 1))
    _close(t, "attend_chunk of 5 tokens (token p: the mean of values 0..p)", out, _cumulative_means(values))


def later_chunk_reads_the_cache(make, t: Story) -> None:
    """a later chunk attends to the K/V earlier chunks cached, and to nothing past its own last token"""
    import torch

    p = make(3, 2, 1, 1)
    values = torch.tensor([1.0, 2.0, 6.0, 3.0, 8.0]).view(5, 1, 1)
    t.say("keys all zero; values 1, 2, 6, 3, 8; block_table [2, 0, 1]; slots past token 3 hold NaN")
    _do(t, p, "write_chunk", "[2, 0, 1], 0, keys, values of tokens 0..1", [2, 0, 1], 0, torch.zeros(2, 1, 1),
        values[:2])
    _do(t, p, "write_chunk", "[2, 0, 1], 2, keys, values of tokens 2..3", [2, 0, 1], 2, torch.zeros(2, 1, 1),
        values[2:4])
    out = _do(t, p, "attend_chunk", "[2, 0, 1], 2, queries of tokens 2..3", [2, 0, 1], 2, _random(0, 2, 1, 1))
    _close(t, "attend_chunk for tokens 2..3 (means of values 0..2 and 0..3)", out, _cumulative_means(values[:4])[2:])


def chunks_change_nothing(make, t: Story) -> None:
    """prefill in chunks [2, 1, 3] gives every token the output of one pass over the whole prompt"""
    import torch

    values = _random(7, 6, 2, 2)
    t.say("6 tokens, 2 heads x head_dim 2, keys all zero, random values; block_size 4, block_table [3, 1]")
    outs = []
    for chunks in ([6], [2, 1, 3]):
        p = make(4, 4, 2, 2)
        outs.append(_do(t, p, "prefill", f"[3, 1], queries, keys, values, {chunks}", [3, 1], _random(5, 6, 2, 2),
                        torch.zeros(6, 2, 2), values, chunks))
    _close(t, "prefill with chunk_sizes [6] (keys zero: the running means of the values)", outs[0],
           _cumulative_means(values))
    _close(t, "prefill with chunk_sizes [2, 1, 3]", outs[1], outs[0])


EXAMPLES = (write_through_table, one_token_sees_itself, causal_within_chunk, later_chunk_reads_the_cache,
            chunks_change_nothing)


def _lazy(shape: str):
    def build(make, max_examples: int, steps: int) -> type:
        from ._chunked_prefill_checks import chunk_check

        return chunk_check(shape)(make, max_examples, steps)

    return build


EXERCISE = Exercise(
    "attention for a prompt computed in chunks through a paged KV cache (chunked prefill, vLLM v1)",
    "YourClass(num_blocks, block_size, num_heads, head_dim)", "MyChunkedPrefill",
    (2, 4, 1, 2), {"write_chunk": ([0], 0, None, None), "attend_chunk": ([0], 0, None),
                   "prefill": ([0], None, None, None, [1])},
    ("key_cache", "value_cache", "write_chunk", "attend_chunk", "prefill"), NO_RULES, EXAMPLES,
    (
        MachineCheck("model", "chunkings: {n} random prompts, each prefilled in random chunks against "
                     "one-shot attention (reference/attention/torch_ref.py)", _lazy("model"), 4.0, "visible"),
        MachineCheck("rule", "two prompts: {n} runs, their chunks interleaved in one cache, each chunk against "
                     "torch_ref", _lazy("rule"), 3.0, "hidden"),
        MachineCheck("long", "long prompts: {n} random prompts of up to 96 tokens, more heads",
                     _lazy("long"), 2.0, "hidden", scale=2, steps=60),
    ),
    "07_chunked_prefill", "chunked_prefill",
)
