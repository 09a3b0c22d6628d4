"""Lab `triton_decode`: the paged decode attention kernel, written in Triton by the student.

PagedAttention's decode kernel (Kwon et al., SOSP 2023, section 4.1; vLLM's `paged_attention_v1`, and this
project's `reference/attention/triton_decode.py`) never copies a sequence's K/V out of the cache. One program per
(sequence, query head) walks the sequence's blocks, loading each block's number from the block table, and keeps
an ONLINE softmax (FlashAttention, Dao et al. 2022):

    for each block:  scores = scale * K_block . q           (masked past seq_len: -inf)
                     m_new  = max(m, max(scores))
                     l      = l * exp(m - m_new) + sum(exp(scores - m_new))
                     acc    = acc * exp(m - m_new) + exp(scores - m_new) @ V_block
                     m      = m_new
    out = acc / l

The student writes that update once on the host in numpy (`online_softmax_step`), then the kernel's body, given
the launch wrapper (`forward`) and the kernel's signature.
Without CUDA the kernel runs on CPU tensors through Triton's interpreter (TRITON_INTERPRET=1): correct, and slow
(about 7 ms per block per program), so every batch here is tiny. The oracle is the project's torch reference,
`reference.attention.torch_ref.paged_decode_attention_ref` (through `_paged_batches`).
"""
from __future__ import annotations

import numpy as np

from sim.exercises.referee import NO_RULES
from sim.exercises.registry import Exercise, MachineCheck
from sim.exercises.report import Story

from .block_table_attention import expect_close

# NOTE: the interpreter runs about 7 ms per block per program (Triton 3.9 on one CPU core: every tl.sum / tl.max
# call re-patches triton.language), so each check runs at most this many batches, whatever max_examples asks.
CAPS = {"model": 20, "rule": 10, "long": 8}
# The kernel's parameters after `out_ptr` (the probe calls the skeleton's kernel with out_ptr = the instance).
KERNEL_ARGS = 18


def device() -> str:
    """Where the checks put their tensors: CUDA when a compiled kernel can run there, else the CPU (interpreter)."""
    import torch

    from reference.attention._checks import interpreting

    return "cuda" if torch.cuda.is_available() and not interpreting() else "cpu"


def _caches(num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int) -> tuple:
    import torch

    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    return torch.full(shape, float("nan")), torch.full(shape, float("nan"))


def _t(values: list):
    import torch

    return torch.tensor(values, dtype=torch.float32)


def _forward(t: Story, dec, query, key_cache, value_cache, tables: list[list[int]], seq_lens: list[int],
             scale: float):
    import torch

    t.say(f"forward(query {list(query.shape)}, key_cache/value_cache {list(key_cache.shape)}, block_tables "
          f"{tables}, seq_lens {seq_lens}, scale {scale})")
    on = device()
    out = dec.forward(query.to(on), key_cache.to(on), value_cache.to(on), torch.tensor(tables, dtype=torch.int32,
                      device=on), torch.tensor(seq_lens, dtype=torch.int32, device=on), scale)
    return out.cpu() if hasattr(out, "cpu") else out


# --- narrated examples ------------------------------------------------------------------------------------------
def online_steps(make, t: Story) -> None:
    """online_softmax_step folds one block at a time; acc / l after the last block is the softmax's answer"""
    dec = make()
    state = (float("-inf"), 0.0, np.zeros(1))
    t.say("scores [1, 2 | 5, 0 | 3] with values [10, 20 | 30, 40 | 50] (head_dim 1), in blocks of 2")
    blocks = (([1.0, 2.0], [10.0, 20.0], (2.0, 1.3679, 23.6788)), ([5.0, 0.0], [30.0, 40.0], (5.0, 1.0748, 31.4484)),
              ([3.0], [50.0], (5.0, 1.2102, 38.2152)))
    for scores, values, (m, l, acc) in blocks:
        step = t.do(dec, "online_softmax_step", state[0], state[1], state[2], np.array(scores),
                    np.array(values)[:, None])
        t.ensure(isinstance(step, (tuple, list)) and len(step) == 3, f"online_softmax_step returned {step!r}: "
                 f"expected the three values (m, l, acc)")
        expect_close(t, f"(m, l, acc[0]) after the block with scores {scores}",
                     [step[0], step[1], np.asarray(step[2]).reshape(-1)[0]], [m, l, acc])
        state = step
    expect_close(t, "acc / l (the plain softmax gives 31.5782)", np.asarray(state[2]) / state[1], [31.5782])


def one_token_gqa(make, t: Story) -> None:
    """one cached token: every query head gets its KV head's value (GQA: heads 0-1 read KV head 0, 2-3 KV head 1)"""
    dec = make()
    key_cache, value_cache = _caches(2, 2, 2, 2)
    key_cache[1, 0], value_cache[1, 0] = _t([[1, 0], [0, 1]]), _t([[1, 2], [3, 4]])
    t.say("2 KV heads, 4 query heads; the token sits in block 1, offset 0: V = [1, 2] for KV head 0, [3, 4] for "
          "KV head 1; every other slot is NaN")
    out = _forward(t, dec, _t([[[0.5, -1], [2, 0], [1, 1], [-3, 0.25]]]), key_cache, value_cache, [[1]], [1], 1.0)
    expect_close(t, "the output (a softmax over one token is 1: its value)", out, [[[1, 2], [1, 2], [3, 4], [3, 4]]])


def table_entry_not_index(make, t: Story) -> None:
    """logical block i lives in physical block block_table[i], not in block i"""
    dec = make()
    key_cache, value_cache = _caches(4, 2, 1, 2)
    key_cache[[3, 1]] = 0.0
    value_cache[3, :, 0], value_cache[1, :, 0] = _t([[1, 2], [1, 2]]), _t([[3, 4], [3, 4]])
    t.say("block_table [3, 1]: tokens 0-1 in block 3 (values [1, 2]), tokens 2-3 in block 1 (values [3, 4]); "
          "blocks 0 and 2 hold NaN; all keys are 0, so each token weighs 1/4")
    out = _forward(t, dec, _t([[[1, 1]]]), key_cache, value_cache, [[3, 1]], [4], 1.0)
    expect_close(t, "the output (the mean of the 4 values)", out, [[[2, 3]]])


def online_rescale(make, t: Story) -> None:
    """online softmax: a later block with a larger score rescales what the earlier blocks summed"""
    dec = make()
    key_cache, value_cache = _caches(2, 2, 1, 2)
    key_cache[1, :, 0], value_cache[1, :, 0] = _t([[0, 0], [0, 0]]), _t([[1, 0], [1, 0]])
    key_cache[0, :, 0], value_cache[0, :, 0] = _t([[3, 0], [3, 0]]), _t([[0, 1], [0, 1]])
    t.say("block_table [1, 0], query [1, 0]: block 1 scores [0, 0] (values [1, 0]), then block 0 scores [3, 3] "
          "(values [0, 1])")
    t.say("after block 1: m = 0, l = 2, acc = [2, 0]; block 0 raises m to 3, so l and acc are first multiplied "
          "by exp(0 - 3)")
    out = _forward(t, dec, _t([[[1, 0]]]), key_cache, value_cache, [[1, 0]], [4], 1.0)
    expect_close(t, "the output ([1, e^3] / (1 + e^3))", out, [[[0.04743, 0.95257]]])


def last_block_partly_filled(make, t: Story) -> None:
    """a context ending inside its last block: the slots after it hold NaN and must be masked, never loaded"""
    dec = make()
    key_cache, value_cache = _caches(3, 4, 1, 2)
    for p in range(5):
        block, offset = (2, 0)[p // 4], p % 4
        key_cache[block, offset], value_cache[block, offset] = _t([[0, 0]]), _t([[p, 1]])
    t.say("seq_len 5, block_table [2, 0, 1]: tokens 0-3 in block 2, token 4 in block 0 (offset 0), block 1 a spare; "
          "every other slot is NaN; all keys 0, token p has value [p, 1]")
    out = _forward(t, dec, _t([[[1, 1]]]), key_cache, value_cache, [[2, 0, 1]], [5], 1.0)
    expect_close(t, "the output (the mean of the 5 values)", out, [[[2, 1]]])


def block_size_not_a_power_of_two(make, t: Story) -> None:
    """block_size 3: tl.arange covers 4 slots (BLOCK_PAD), and the 4th must be masked: it is the next block's"""
    dec = make()
    key_cache, value_cache = _caches(3, 3, 1, 2)
    key_cache[1], value_cache[1] = 0.0, _t([[[1, 0]], [[2, 0]], [[3, 0]]])
    t.say("seq_len 3, block_table [1]: block 1 is full (values [1, 0], [2, 0], [3, 0]); block 2, right after it "
          "in memory, holds NaN")
    out = _forward(t, dec, _t([[[1, 1]]]), key_cache, value_cache, [[1]], [3], 1.0)
    expect_close(t, "the output (the mean of the 3 values)", out, [[[2, 0]]])


def batch_against_the_oracle(make, t: Story) -> None:
    """a batch of two sequences, 4 query heads over 2 KV heads, against the project's torch oracle"""
    import torch

    from reference.attention.torch_ref import paged_decode_attention_ref

    dec = make()
    rng = np.random.default_rng(0)
    key_cache, value_cache = _caches(5, 2, 2, 2)
    for blocks in ([4, 0], [2, 3, 1]):
        for b in blocks:
            key_cache[b] = torch.from_numpy(rng.standard_normal((2, 2, 2)).astype(np.float32))
            value_cache[b] = torch.from_numpy(rng.standard_normal((2, 2, 2)).astype(np.float32))
    query = torch.from_numpy(rng.standard_normal((2, 4, 2)).astype(np.float32))
    t.say("seq 0: block_table [4, 0], seq_len 3; seq 1: block_table [2, 3, 1], seq_len 5; random K/V and queries")
    tables, lens = [[4, 0, 0], [2, 3, 1]], [3, 5]
    out = _forward(t, dec, query, key_cache, value_cache, tables, lens, 0.7)
    expected = paged_decode_attention_ref(query, key_cache, value_cache, torch.tensor(tables, dtype=torch.int32),
                                          torch.tensor(lens, dtype=torch.int32), 0.7)
    expect_close(t, "the output (paged_decode_attention_ref's)", out, expected.tolist(), by_head=True)


EXAMPLES = (online_steps, one_token_gqa, table_entry_not_index, online_rescale, last_block_partly_filled,
            block_size_not_a_power_of_two, batch_against_the_oracle)


def _probe(*shape: int) -> np.ndarray:
    """A read-only array of zeros: a probe call (unfinished.py) must change nothing, even in a written method."""
    a = np.zeros(shape)
    a.setflags(write=False)
    return a


_PROBE_ROW, _PROBE_TILE = _probe(1), _probe(1, 1)


def _lazy(shape: str):
    def build(make, max_examples: int, steps: int) -> type:
        from ._triton_decode_checks import batch_check

        return batch_check(shape, CAPS[shape], device)(make, max_examples, steps)

    return build


EXERCISE = Exercise(
    "a paged decode attention kernel in Triton: block table, online softmax (paper section 4.1)",
    "YourClass()", "MyPagedDecode",
    (), {"online_softmax_step": (float("-inf"), 0.0, _PROBE_ROW, _PROBE_ROW, _PROBE_TILE),
         "kernel": (None,) * KERNEL_ARGS}, ("forward", "online_softmax_step", "kernel"), NO_RULES, EXAMPLES,
    (
        MachineCheck("model", f"random batches: up to {CAPS['model']} tiny batches against "
                     "reference.attention.torch_ref", _lazy("model"), 4.0, "visible"),
        MachineCheck("rule", f"large scores: up to {CAPS['rule']} batches whose scores overflow exp() unless the "
                     "running max is subtracted", _lazy("rule"), 3.0, "hidden"),
        MachineCheck("long", f"long contexts: up to {CAPS['long']} batches of 17 to 40 tokens, many blocks per "
                     "sequence", _lazy("long"), 2.0, "hidden", scale=2),
    ),
    "10_triton_decode", "triton_decode",
)
