"""Paged attention in vectorized torch: the engine's CPU backend, a few large tensor ops per layer.

The same three operations as the oracle in ``torch_ref`` (PagedAttention, Kwon et al., SOSP 2023,
Section 4.1), written for speed on a CPU (they run on any device): ``torch_ref`` loops over sequences
in Python and is the test oracle; this module is what the engine runs on CPU by default.

Decode (one query per sequence). The gather copies *whole blocks*: one ``index_select`` per cache over
the block ids of every sequence's table, so each copied row is a block (``block_size * H_kv * D``
values, 12 KiB for SmolLM2 in float32) rather than one token's head (64 values), which is what made the
gather fast. Sequences are padded to the longest one's block count (in length groups, see GROUP_SLACK)::

    block_size = 4    seq 0: seq_len 6, block_table [7, 2]      seq 1: seq_len 3, block_table [5, x]
    gathered blocks   seq 0: 7 2        seq 1: 5 5*              * a column seq 1 does not need: its own
    position          0   1   2   3   4   5   6   7             first block again, never a foreign id
    valid seq 0       1   1   1   1   1   1   0   0             (6, 7: the unowned tail of block 2)
          seq 1       1   1   1   0   0   0   0   0

The slots a sequence does not own hold whatever the cache holds there: stale tokens of a freed sequence,
or NaN in the tests. Giving them zero probability is not enough (``0 * NaN = NaN``): their scores are
*replaced* by -inf before the softmax, and their gathered values (a copy) are set to 0.

GQA: query head ``h`` reads KV head ``h // group``; the queries of one KV head multiply its keys in one
batched matmul over the sequences (``bmm`` reads each head's keys in place through strides: no copy).
Everything is computed in float32 and rounded to the query dtype at the end, as the oracle does.

Prefill: one ``scaled_dot_product_attention`` call per sequence (torch's fused CPU kernel, which never
holds a [q_len, seq_len] score matrix), over the sequence's own tokens gathered from its blocks; causal
when the sequence has no cached prefix, else with the mask "query j at position seq_len - q_len + j sees
keys 0 .. that position". Measured on the bench's first step (55 prompts of 8-128 tokens, 2,060 rows):
14 ms per layer against 34 for the padded batched matmuls this replaced.

Sliding-window layers (``window=W``; Gemma 3): a query at position ``p`` sees ``p - W + 1 .. p``. Positions before a
sequence's first visible one are masked exactly like unowned slots, and its table columns wholly before it (which
may name blocks already back in the pool: the hybrid KV manager frees them) are replaced by its first visible
block, so no foreign block is read. Decode gathers each sequence from the block holding its first visible position:
about the window, not the whole context (a window of 512 in a 4,096-token sequence gathers 512 to 527 positions).

What every layer of a step shares (the gather's block ids, the masks, the checks of the block tables) is
computed once per step: see ``_memo``.

An int8 cache (reference.attention.quant): the store quantizes in one vectorized pass and scatters the scales
beside the rows; decode and prefill gather the int8 blocks (a quarter of the float32 bytes) and their scales through
the same block ids, and dequantize the gathered copy before the matmuls.

NOTE: like the oracle, these functions check tensor *values* (slots and block ids in range, seq_lens
within the block tables), which costs a few device-to-host reads per step: nothing on a CPU, syncs on
a GPU, where the Triton kernels are the fast path anyway.
"""

from __future__ import annotations

import torch

from .quant import dequantize_int8, quantize_int8
from .torch_ref import packed_query_lens, window_start

# NOTE: a group of sequences is padded to its longest query and longest context, so it computes (and
# holds) [seqs, heads, max_q, max_len] float32 scores. Sequences are sorted by length and cut into groups:
# - when padding would more than double a group's work (the bench's heavy-tailed lengths: one 128-token
#   prompt would otherwise pad 63 prompts of ~37 tokens to 128x128 score tiles, several times the
#   oracle's work; measured 4-7x slower than the oracle's loop);
#   modelling approximation: GROUP_SLACK (query x key pairs of padding) is what a group's fixed cost, ~20
#   small tensor ops, buys in matmul work on a CPU core (measured on the 2-core box), so tiny groups merge;
# - when the scores would pass SCORE_BUDGET (~64 MiB); a sequence that big alone forms a group of its own.
SCORE_BUDGET = 1 << 24  # float32 elements
GROUP_SLACK = 1024  # query x key pairs


def store_kv_batched(
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    value: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    slot_mapping: torch.Tensor,  # [num_tokens] int64; slot < 0 means "skip this token"
    k_scale: torch.Tensor | None = None,  # [num_blocks, block_size, num_kv_heads] float32: an int8 cache's scales
    v_scale: torch.Tensor | None = None,
) -> None:
    """Write token ``t``'s K/V into cache slot ``slot_mapping[t]`` (in place), all tokens in one scatter (quantized,
    with their scales, into an int8 cache)."""
    num_blocks, block_size = key_cache.shape[:2]
    num_slots = num_blocks * block_size
    if slot_mapping.numel() and int(slot_mapping.max()) >= num_slots:
        t = int(torch.argmax((slot_mapping >= num_slots).int()))
        raise ValueError(
            f"slot_mapping[{t}] = {int(slot_mapping[t])} is outside the cache (allowed: 0..{num_slots - 1})"
        )
    keep = slot_mapping >= 0  # [num_tokens]; the skip sentinel drops a token (see reference.attention.store_kv)
    if not bool(keep.all()):
        key, value, slot_mapping = key[keep], value[keep], slot_mapping[keep]
    block, offset = slot_mapping // block_size, slot_mapping % block_size  # [num_kept] each
    if k_scale is not None:
        (key, k_scale[block, offset]), (value, v_scale[block, offset]) = quantize_int8(key), quantize_int8(value)
    key_cache[block, offset] = key
    value_cache[block, offset] = value


def _length_groups(q_lens: list[int], seq_lens: list[int], num_heads: int) -> list[list[int]]:
    """Sequence indices, longest first, cut into groups whose padding stays cheap (see GROUP_SLACK)."""
    order = sorted(range(len(q_lens)), key=lambda i: (q_lens[i], seq_lens[i]), reverse=True)
    groups: list[list[int]] = []
    max_q = max_len = useful = 0
    for i in order:
        new_q, new_len = max(max_q, q_lens[i]), max(max_len, seq_lens[i])
        new_useful = useful + q_lens[i] * seq_lens[i]  # query x key pairs the oracle would compute
        padded = (len(groups[-1]) + 1 if groups else 1) * new_q * new_len
        if not groups or padded * num_heads > SCORE_BUDGET or padded - new_useful > max(new_useful, GROUP_SLACK):
            groups.append([])
            new_q, new_len, new_useful = q_lens[i], seq_lens[i], q_lens[i] * seq_lens[i]
        groups[-1].append(i)
        max_q, max_len, useful = new_q, new_len, new_useful
    return groups


class _Memo:
    """A one-entry cache of what the layers of one step share, keyed by the identity of its input tensors.

    NOTE: every layer of a forward step calls attention with the same block_tables and seq_lens tensors, so the
    gather's block ids, the masks and the value checks are computed for the first layer and reused by the other
    29 (vLLM builds its attention metadata once per step for the same reason). The entry holds the tensors
    themselves, so their ids cannot be reused while cached, and their version counters, so an in-place change
    is seen. Tensors made under inference mode (the engine's) have no version counter: for them identity alone
    is the key, which holds because nothing writes a block table in place once a step has built it.
    """

    def __init__(self) -> None:
        self.tensors: tuple[torch.Tensor, ...] = ()
        self.key: tuple | None = None
        self.value = None

    def get(self, build, tensors: tuple[torch.Tensor, ...], extra: tuple):
        key = tuple(None if t.is_inference() else t._version for t in tensors) + extra
        same = len(tensors) == len(self.tensors) and all(a is b for a, b in zip(tensors, self.tensors))
        if not (same and key == self.key):
            self.tensors, self.key = (), None  # NOTE: cleared first: a build that raises leaves nothing stale
            self.value = build()
            self.tensors, self.key = tensors, key
        return self.value


_memo = {"decode": _Memo(), "prefill": _Memo(), "check": _Memo()}


def _memo_for(kind: str, window: int | None) -> _Memo:
    """One memo per kind and window: a Gemma 3 step alternates sliding and full layers over the same tables."""
    return _memo[kind] if window is None else _memo.setdefault(f"{kind} {window}", _Memo())


def check_block_tables(block_tables: torch.Tensor, seq_lens: torch.Tensor, num_blocks: int, block_size: int
                       ) -> None:
    """The value checks of a decode batch alone (once per step), for a kernel that reads the tables itself."""
    _memo["check"].get(lambda: _used_blocks(block_tables, seq_lens, num_blocks, block_size),
                       (block_tables, seq_lens), (num_blocks, block_size))


def _used_blocks(block_tables: torch.Tensor, seq_lens: torch.Tensor, num_blocks: int, block_size: int,
                 first: torch.Tensor | None = None) -> torch.Tensor:
    """The first ``num_cols`` columns of the block tables (num_cols: what the longest sequence needs), with every
    column a sequence does not need replaced by its own first needed block (block 0 when it is empty), checked to
    lie in the cache. ``first``: int64 [num_seqs], the first position each sequence reads (a sliding window's
    start; None: 0), so columns wholly before it are not needed either. Returns blocks, int64 [num_seqs, num_cols]."""
    lo, hi = (int(x) for x in torch.aminmax(seq_lens)) if seq_lens.numel() else (0, 0)
    if lo < 0:
        raise ValueError(f"seq_lens must be >= 0, got {seq_lens.tolist()}")
    num_cols = -(-hi // block_size)  # ceil division: the block-table columns the longest sequence needs
    if num_cols > block_tables.shape[1]:
        raise ValueError(
            f"seq_len {hi} needs {num_cols} blocks but the block table has {block_tables.shape[1]} columns"
        )
    blocks = block_tables[:, :num_cols].long()  # [num_seqs, num_cols]
    cols = torch.arange(num_cols, device=blocks.device)[None, :]
    needed = cols * block_size < seq_lens.long()[:, None]
    first_col = torch.zeros((seq_lens.shape[0], 1), dtype=torch.int64, device=blocks.device)
    if first is not None:
        first_col = (first // block_size)[:, None].clamp(max=max(num_cols - 1, 0))
        needed &= cols >= first_col
    keep = torch.where(seq_lens[:, None] > 0, blocks.gather(1, first_col), 0) if num_cols else blocks  # [seqs, 1]
    blocks = torch.where(needed, blocks, keep)
    if blocks.numel():
        lo, hi = (int(x) for x in torch.aminmax(blocks))
        if lo < 0 or hi >= num_blocks:
            raise ValueError(f"block table entries must be in 0..{num_blocks - 1}, got {lo if lo < 0 else hi}")
    return blocks


def _decode_plan(block_tables: torch.Tensor, seq_lens: torch.Tensor, cache: torch.Tensor, num_heads: int,
                 window: int | None = None) -> list[tuple]:
    """Per length group: (sequence indices or None for all, block ids [n * num_cols], invalid [n, num_cols *
    block_size] bool, empty [n] bool or None, and two gather buffers shaped like n * num_cols blocks of `cache`).

    NOTE: the gather buffers are allocated here, once per step, and refilled by every layer: a fresh multi-MiB
    tensor per layer and cache came from the kernel as new zeroed pages each time, which measured slower than
    the copy itself (2-4 ms instead of 0.8 for 7 MiB) on the 2-core box."""
    num_blocks, block_size = cache.shape[:2]
    first = None if window is None else (seq_lens.long() - window).clamp(min=0)  # [num_seqs]
    blocks = _used_blocks(block_tables, seq_lens, num_blocks, block_size, first)
    lens = seq_lens.tolist()
    # Each sequence's gather starts at the block holding its first visible position (column `skip`), so a sliding
    # layer gathers about its window, not its whole context; `span`: the positions from there to its end.
    skips = [0] * len(lens) if window is None else [max(0, n - window) // block_size for n in lens]
    spans = [n - k * block_size for n, k in zip(lens, skips)]
    groups = _length_groups([1] * len(lens), spans, num_heads)
    plan = []
    for group in groups:
        if len(groups) == 1:
            group = list(range(len(lens)))  # all of them, in the batch's own order (idx None)
        idx = None if len(groups) == 1 else torch.tensor(group, device=seq_lens.device)
        g_lens = seq_lens if idx is None else seq_lens[idx]
        num_cols = -(-max(spans[i] for i in group) // block_size)
        cols = torch.arange(num_cols, device=seq_lens.device)[None, :]
        g_blocks = blocks if idx is None else blocks[idx]
        positions = torch.arange(num_cols * block_size, device=seq_lens.device)[None, :]
        if window is None:
            g_blocks = g_blocks[:, :num_cols]
        else:
            skip = torch.tensor([skips[i] for i in group], device=seq_lens.device)[:, None]  # [n, 1]
            g_blocks = g_blocks.gather(1, (skip + cols).clamp(max=blocks.shape[1] - 1))  # past the end: never valid
            positions = positions + skip * block_size
        invalid = positions >= g_lens.long()[:, None]
        if first is not None:  # before the window: masked as unowned slots are
            invalid |= positions < (first if idx is None else first[idx])[:, None]
        g_blocks = g_blocks.reshape(-1)
        empty = (g_lens == 0) if min(lens[i] for i in group) == 0 else None
        buffers = [cache.new_empty((g_blocks.shape[0],) + cache.shape[1:]) for _ in range(2)]
        plan.append((idx, g_blocks, invalid, empty, *buffers))
    return plan


def _decode_group(
    query: torch.Tensor,  # [n, num_heads, head_dim]
    key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    blocks: torch.Tensor,  # [n * num_cols] int64, each sequence's blocks in logical order
    invalid: torch.Tensor,  # [n, num_cols * block_size] bool, positions the sequence does not own
    kbuf: torch.Tensor,  # [n * num_cols, block_size, num_kv_heads, head_dim], the cache's dtype: gather space
    vbuf: torch.Tensor,
    scale: float,
    k_scale: torch.Tensor | None = None,  # [num_blocks, block_size, num_kv_heads] float32: an int8 cache's scales
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:  # [n, num_heads, head_dim] float32
    """Decode attention for one group of sequences, padded to the group's longest block count."""
    n, num_heads, head_dim = query.shape
    num_kv_heads = key_cache.shape[2]
    group, length = num_heads // num_kv_heads, invalid.shape[1]
    keys = torch.index_select(key_cache, 0, blocks, out=kbuf).view(n, length, num_kv_heads, head_dim)
    values = torch.index_select(value_cache, 0, blocks, out=vbuf).view(n, length, num_kv_heads, head_dim)
    if k_scale is None:
        keys, values = keys.float(), values.float()
    else:  # the gathered int8 copy times its rows' scales, gathered by the same block ids
        keys = dequantize_int8(keys, k_scale.index_select(0, blocks).view(n, length, num_kv_heads))
        values = dequantize_int8(values, v_scale.index_select(0, blocks).view(n, length, num_kv_heads))
    values.masked_fill_(invalid[:, :, None, None], 0.0)  # a copy: unowned slots may hold NaN, and 0 * NaN = NaN
    q = (query.float() * scale).view(n, num_kv_heads, group, head_dim)
    scores = query.new_empty((num_kv_heads, n, group, length), dtype=torch.float32)
    for h in range(num_kv_heads):  # keys[:, :, h] is a strided view: bmm reads it in place
        torch.bmm(q[:, h], keys[:, :, h].transpose(1, 2), out=scores[h])
    scores.masked_fill_(invalid[None, :, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1)  # NaN only in rows of seq_len 0 (all -inf): zeroed by the caller
    out = query.new_empty((n, num_kv_heads, group, head_dim), dtype=torch.float32)
    for h in range(num_kv_heads):
        out[:, h] = torch.bmm(probs[h], values[:, :, h])
    return out.view(n, num_heads, head_dim)


def paged_decode_attention_batched(
    query: torch.Tensor,  # [num_seqs, num_heads, head_dim]
    key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor,  # [num_seqs, max_blocks_per_seq] int32
    seq_lens: torch.Tensor,  # [num_seqs] int32
    scale: float,
    window: int | None = None,
    k_scale: torch.Tensor | None = None,  # [num_blocks, block_size, num_kv_heads] float32: an int8 cache's scales
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:  # [num_seqs, num_heads, head_dim]
    """One new query token per sequence attends to all ``seq_lens[i]`` cached tokens (itself included), or to the
    last ``window`` of them."""
    if query.shape[0] == 0:
        return torch.empty_like(query)
    plan = _memo_for("decode", window).get(
        lambda: _decode_plan(block_tables, seq_lens, key_cache, query.shape[1], window), (block_tables, seq_lens),
        (tuple(key_cache.shape), key_cache.dtype, key_cache.device, query.shape[1], GROUP_SLACK, SCORE_BUDGET,
         window))
    out = torch.empty_like(query)
    for idx, blocks, invalid, empty, kbuf, vbuf in plan:
        q = query if idx is None else query.index_select(0, idx)
        group_out = _decode_group(q, key_cache, value_cache, blocks, invalid, kbuf, vbuf, scale, k_scale, v_scale)
        if empty is not None:  # nothing to attend to: zeros, as the oracle
            group_out.masked_fill_(empty[:, None, None], 0.0)
        if idx is None:
            out.copy_(group_out)
        else:
            out.index_copy_(0, idx, group_out.to(query.dtype))
    return out


def _prefill_plan(block_tables: torch.Tensor, query_start_loc: torch.Tensor, seq_lens: torch.Tensor,
                  num_tokens: int, num_blocks: int, block_size: int, window: int | None = None) -> list[tuple]:
    """Per sequence with new tokens: (first row, end row, first key position, seq_len, its block ids from the one
    holding the first key, mask or None when causal)."""
    starts, q_lens, lens = packed_query_lens(query_start_loc, seq_lens, num_tokens)
    firsts = [window_start(n - q, window) // block_size * block_size for q, n in zip(q_lens, lens)]
    first = None if window is None else torch.tensor(firsts, dtype=torch.int64, device=seq_lens.device)
    blocks = _used_blocks(block_tables, seq_lens, num_blocks, block_size, first)
    plan = []
    for i, (q_len, seq_len) in enumerate(zip(q_lens, lens)):
        if q_len == 0:  # a sequence with no new token has no rows
            continue
        mask, lo = None, firsts[i]
        if q_len < seq_len or window is not None:  # query j (position seq_len - q_len + j) sees keys 0 .. that
            q_pos = torch.arange(seq_len - q_len, seq_len, device=blocks.device)[:, None]
            k_pos = torch.arange(lo, seq_len, device=blocks.device)[None, :]
            mask = k_pos <= q_pos  # [q_len, seq_len - lo]
            if window is not None:  # ... and in a sliding layer only its last `window` positions
                mask &= k_pos > q_pos - window
        plan.append((starts[i], starts[i + 1], lo, seq_len,
                     blocks[i, lo // block_size: -(-seq_len // block_size)], mask))
    return plan


def paged_prefill_attention_batched(
    query: torch.Tensor,  # [num_tokens, num_heads, head_dim], sequences packed one after another
    key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor,  # [num_seqs, max_blocks_per_seq] int32
    query_start_loc: torch.Tensor,  # [num_seqs + 1] int32, cumulative new-token counts
    seq_lens: torch.Tensor,  # [num_seqs] int32, context length including the new tokens
    scale: float,
    window: int | None = None,
    k_scale: torch.Tensor | None = None,  # [num_blocks, block_size, num_kv_heads] float32: an int8 cache's scales
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
    """Causal attention of each sequence's new tokens over its cached prefix plus the new tokens (each over its
    last ``window`` positions only, when given)."""
    num_blocks, block_size, num_kv_heads, head_dim = key_cache.shape
    plan = _memo_for("prefill", window).get(
        lambda: _prefill_plan(block_tables, query_start_loc, seq_lens, query.shape[0], num_blocks, block_size,
                              window),
        (block_tables, query_start_loc, seq_lens), (query.shape[0], num_blocks, block_size, window))
    out = torch.zeros_like(query)
    for start, end, lo, seq_len, blocks, mask in plan:
        keys = key_cache.index_select(0, blocks).view(-1, num_kv_heads, head_dim)[:seq_len - lo]  # its own tokens
        values = value_cache.index_select(0, blocks).view(-1, num_kv_heads, head_dim)[:seq_len - lo]
        if k_scale is not None:  # an int8 cache: the rows times their scales
            keys = dequantize_int8(keys, k_scale.index_select(0, blocks).view(-1, num_kv_heads)[:seq_len - lo])
            values = dequantize_int8(values, v_scale.index_select(0, blocks).view(-1, num_kv_heads)[:seq_len - lo])
        # NOTE: 4-D inputs ([1, heads, tokens, D]): with 3-D ones torch's CPU SDPA took its unfused path, measured
        # 16.3 against 6.7-7.3 ms per layer for the bench workload's 64 prompts at 1 thread (scratch benchmark).
        attended = torch.nn.functional.scaled_dot_product_attention(
            query[start:end].float().transpose(0, 1)[None], keys.float().transpose(0, 1)[None],
            values.float().transpose(0, 1)[None], attn_mask=mask, is_causal=mask is None, scale=scale,
            enable_gqa=True)  # [1, num_heads, q_len, D]
        out[start:end] = attended[0].transpose(0, 1)
    return out
