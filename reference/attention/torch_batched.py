"""Paged attention in vectorized torch: many sequences in a few tensor ops, no per-sequence Python loop.

The same three operations as the oracle in ``torch_ref`` (PagedAttention, Kwon et al., SOSP 2023,
Section 4.1), written for speed on a CPU (they run on any device): ``torch_ref`` loops over sequences
in Python and is the test oracle; this module is what the engine runs on CPU by default. It loops only
over a few *groups* of sequences of similar length (see GROUP_SLACK), each padded to its longest.

The gather. First the *slot* of every (sequence, position) up to the longest sequence, from the
block tables in a few integer ops (the same formula as ``slot_mapping``), then ONE ``index_select``
per cache pulls all of them out at once::

    block_size = 4    seq 0: seq_len 6, block_table [7, 2]      seq 1: seq_len 3, block_table [5, x]
    position          0   1   2   3   4   5                    (x: a column seq 1 does not need)
    slot  seq 0       28  29  30  31  8   9       slot = block_table[pos // 4] * 4 + pos % 4
          seq 1       20  21  22  20* 20* 20*     * past seq_len: redirected to the seq's position 0
    valid seq 0       1   1   1   1   1   1
          seq 1       1   1   1   0   0   0

The slots a sequence does not own (the tail of its last block, its unneeded columns ``x``) hold
whatever the cache holds there: stale tokens of a freed sequence, or NaN in the tests. Reading them
and then giving them zero probability is not enough (``0 * NaN = NaN``), so they are never read:
a position past ``seq_len`` is redirected to a slot the sequence owns, and its score is *replaced*
by -inf before the softmax (masked_fill, so its probability is exactly 0 times a finite value).

GQA: query head ``h`` reads KV head ``h // group``; reshaping the queries to ``[.., H_kv, group, D]``
lets each KV head serve its ``group`` query heads in one batched matmul, with no repeat of K/V.
Everything is computed in float32 and rounded to the query dtype at the end, as the oracle does.

NOTE: like the oracle, these functions check tensor *values* (slots and block ids in range, seq_lens
within the block tables), which costs a few device-to-host reads per call: nothing on a CPU, syncs on
a GPU, where the Triton kernels are the fast path anyway.
"""

from __future__ import annotations

import torch

from .torch_ref import packed_query_lens

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
) -> None:
    """Write token ``t``'s K/V into cache slot ``slot_mapping[t]`` (in place), all tokens in one scatter."""
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
    key_cache[block, offset] = key
    value_cache[block, offset] = value


def _slots_and_valid(
    block_tables: torch.Tensor,  # [num_seqs, max_blocks_per_seq] int32
    seq_lens: torch.Tensor,  # [num_seqs] int32
    num_blocks: int,
    block_size: int,
) -> tuple[torch.Tensor, torch.Tensor]:  # slots [num_seqs, max_len] int64, valid [num_seqs, max_len] bool
    """The cache slot of every (sequence, position) up to the longest sequence; values checked as the oracle does.

    A position past its sequence's end is *redirected* to the sequence's own position 0 (to slot 0 when
    the sequence is empty), so the gather never reads a slot the sequence does not own.
    """
    lo, hi = (int(x) for x in torch.aminmax(seq_lens)) if seq_lens.numel() else (0, 0)
    if lo < 0:
        raise ValueError(f"seq_lens must be >= 0, got {seq_lens.tolist()}")
    num_cols = -(-hi // block_size)  # ceil division: the block-table columns the longest sequence needs
    if num_cols > block_tables.shape[1]:
        raise ValueError(
            f"seq_len {hi} needs {num_cols} blocks but the block table has {block_tables.shape[1]} columns"
        )
    seq_lens = seq_lens.long()
    pos = torch.arange(hi, device=seq_lens.device)  # [max_len]
    valid = pos[None, :] < seq_lens[:, None]  # [num_seqs, max_len]
    if hi == 0:
        return torch.zeros_like(valid, dtype=torch.int64), valid
    slots = block_tables[:, pos // block_size].long() * block_size + pos % block_size  # [num_seqs, max_len]
    first = torch.where(seq_lens[:, None] > 0, slots[:, :1], 0)  # [num_seqs, 1]
    slots = torch.where(valid, slots, first)
    lo, hi = (int(x) for x in torch.aminmax(slots))
    if lo < 0 or hi >= num_blocks * block_size:
        bad = lo if lo < 0 else hi
        raise ValueError(f"block table entries must be in 0..{num_blocks - 1}, got {bad // block_size}")
    return slots, valid


def _gather(
    cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    slots: torch.Tensor,  # [num_seqs, max_len] int64, every one a slot its sequence owns
) -> torch.Tensor:  # [num_seqs, num_kv_heads, max_len, head_dim] float32
    """Every sequence's K (or V) in logical order, one KV head after another, in ONE index_select."""
    num_seqs, max_len = slots.shape
    num_kv_heads, head_dim = cache.shape[2:]
    try:
        rows = cache.view(-1, head_dim)  # [num_blocks*block_size*num_kv_heads, D]: row = slot*H_kv + head
    except RuntimeError:  # a strided view that cannot be flattened: index (block, offset), one copy more
        block_size = cache.shape[1]
        return cache[slots // block_size, slots % block_size].transpose(1, 2).float()
    # NOTE: laying out the rows as [seq, head, position] here (not [seq, position, head]) makes each
    # head's keys contiguous, so both matmuls below run on the gathered tensor without another copy.
    heads = torch.arange(num_kv_heads, device=slots.device)  # [H_kv]
    index = slots[:, None, :] * num_kv_heads + heads[None, :, None]  # [num_seqs, H_kv, max_len]
    return rows.index_select(0, index.flatten()).view(num_seqs, num_kv_heads, max_len, head_dim).float()


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


def _decode_group(
    query: torch.Tensor,  # [num_seqs, num_heads, head_dim]
    key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor,  # [num_seqs, max_blocks_per_seq] int32
    seq_lens: torch.Tensor,  # [num_seqs] int32
    scale: float,
) -> torch.Tensor:  # [num_seqs, num_heads, head_dim] float32
    """Decode attention for one group of sequences, padded to the group's longest context."""
    num_seqs, num_heads, head_dim = query.shape
    num_blocks, block_size, num_kv_heads, _ = key_cache.shape
    slots, valid = _slots_and_valid(block_tables, seq_lens, num_blocks, block_size)
    keys = _gather(key_cache, slots)  # [S, H_kv, len, D]
    values = _gather(value_cache, slots)  # [S, H_kv, len, D]
    q = (query.float() * scale).reshape(num_seqs, num_kv_heads, num_heads // num_kv_heads, head_dim)
    scores = torch.matmul(q, keys.transpose(-1, -2))  # [S, H_kv, group, len], scale already in q
    scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1)  # NaN only in rows of seq_len 0 (all -inf): zeroed below
    out = torch.matmul(probs, values).view(num_seqs, num_heads, head_dim)  # [S, H, D]
    return out.masked_fill((seq_lens == 0)[:, None, None], 0.0)  # nothing to attend to: zeros, as the oracle


def paged_decode_attention_batched(
    query: torch.Tensor,  # [num_seqs, num_heads, head_dim]
    key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor,  # [num_seqs, max_blocks_per_seq] int32
    seq_lens: torch.Tensor,  # [num_seqs] int32
    scale: float,
) -> torch.Tensor:  # [num_seqs, num_heads, head_dim]
    """One new query token per sequence attends to all ``seq_lens[i]`` cached tokens (itself included)."""
    groups = _length_groups([1] * query.shape[0], seq_lens.tolist(), query.shape[1])
    if len(groups) == 1:  # the common case: no reordering
        return _decode_group(query, key_cache, value_cache, block_tables, seq_lens, scale).to(query.dtype)
    out = torch.empty_like(query)
    for group in groups:
        idx = torch.tensor(group, device=query.device)  # [group_seqs]
        group_out = _decode_group(query.index_select(0, idx), key_cache, value_cache, block_tables[idx],
                                  seq_lens[idx], scale)  # [group_seqs, H, D]
        out.index_copy_(0, idx, group_out.to(query.dtype))
    return out


def _prefill_group(
    query: torch.Tensor,  # [group_tokens, num_heads, head_dim], the group's packed rows
    key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor,  # [group_seqs, max_blocks_per_seq] int32
    q_lens: torch.Tensor,  # [group_seqs] int64, new tokens per sequence
    seq_lens: torch.Tensor,  # [group_seqs] int32
    scale: float,
) -> torch.Tensor:  # [group_tokens, num_heads, head_dim] float32
    """Causal attention for one group of sequences, padded to ``[seqs, max_q]`` queries."""
    num_tokens, num_heads, head_dim = query.shape
    num_blocks, block_size, num_kv_heads, _ = key_cache.shape
    num_seqs, device = q_lens.shape[0], query.device
    group = num_heads // num_kv_heads
    slots, valid = _slots_and_valid(block_tables, seq_lens, num_blocks, block_size)
    keys = _gather(key_cache, slots)  # [S, H_kv, len, D]
    values = _gather(value_cache, slots)  # [S, H_kv, len, D]

    # Packed row r is new token j[r] of sequence seq_of[r]: padded row seq_of[r] * max_q + j[r].
    max_q = int(q_lens.max())
    seq_of = torch.repeat_interleave(torch.arange(num_seqs, device=device), q_lens)  # [T]
    j = torch.arange(num_tokens, device=device) - (torch.cumsum(q_lens, 0) - q_lens)[seq_of]  # [T]
    padded_row = seq_of * max_q + j  # [T]
    q = query.new_zeros((num_seqs * max_q, num_heads, head_dim), dtype=torch.float32)
    q.index_copy_(0, padded_row, query.float() * scale)  # padding rows stay 0 and are dropped below
    # Fold (group, max_q) into one axis so each KV head's keys serve all its query rows in one matmul.
    q = q.view(num_seqs, max_q, num_kv_heads, group, head_dim).permute(0, 2, 3, 1, 4)  # [S, H_kv, g, max_q, D]
    q = q.reshape(num_seqs, num_kv_heads, group * max_q, head_dim)

    scores = torch.matmul(q, keys.transpose(-1, -2))  # [S, H_kv, group*max_q, len], scale already in q
    scores = scores.view(num_seqs, num_kv_heads, group, max_q, -1)  # [S, H_kv, group, max_q, len]
    # New token j of sequence i sits at absolute position seq_len_i - q_len_i + j and sees keys 0..that.
    # A padding row (j >= q_len_i) would see past seq_len; `valid` stops it there, its output is dropped.
    q_pos = (seq_lens.long() - q_lens)[:, None] + torch.arange(max_q, device=device)  # [S, max_q]
    k_pos = torch.arange(valid.shape[1], device=device)  # [len]
    visible = (k_pos[None, None, :] <= q_pos[:, :, None]) & valid[:, None, :]  # [S, max_q, len]
    scores = scores.masked_fill(~visible[:, None, None], float("-inf"))
    probs = torch.softmax(scores, dim=-1)  # a real row always sees >= 1 key (itself): no NaN there
    out = torch.matmul(probs.view(num_seqs, num_kv_heads, group * max_q, -1), values)  # [S, H_kv, g*max_q, D]
    out = out.view(num_seqs, num_kv_heads, group, max_q, head_dim).permute(0, 3, 1, 2, 4)
    out = out.reshape(num_seqs * max_q, num_heads, head_dim)  # [S*max_q, H, D]
    return out.index_select(0, padded_row)  # [T, H, D], back to packed rows


def paged_prefill_attention_batched(
    query: torch.Tensor,  # [num_tokens, num_heads, head_dim], sequences packed one after another
    key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor,  # [num_seqs, max_blocks_per_seq] int32
    query_start_loc: torch.Tensor,  # [num_seqs + 1] int32, cumulative new-token counts
    seq_lens: torch.Tensor,  # [num_seqs] int32, context length including the new tokens
    scale: float,
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
    """Causal attention of each sequence's new tokens over its cached prefix plus the new tokens."""
    out = torch.zeros_like(query)
    starts, q_lens, lens = packed_query_lens(query_start_loc, seq_lens, query.shape[0])
    live = [i for i, q_len in enumerate(q_lens) if q_len > 0]  # a sequence with no new token has no rows
    groups = _length_groups([q_lens[i] for i in live], [lens[i] for i in live], query.shape[1])
    for group in groups:
        seqs = [live[k] for k in group]
        idx = torch.tensor(seqs, device=query.device)  # [group_seqs]
        rows = torch.tensor([r for i in seqs for r in range(starts[i], starts[i + 1])], device=query.device)
        q_len_t = torch.tensor([q_lens[i] for i in seqs], dtype=torch.int64, device=query.device)
        group_out = _prefill_group(query.index_select(0, rows), key_cache, value_cache, block_tables[idx],
                                   q_len_t, seq_lens[idx], scale)  # [group_tokens, H, D]
        out.index_copy_(0, rows, group_out.to(query.dtype))
    return out
