"""What one forward step needs to know about its batch: which rows are which sequence, where K/V go.

Continuous batching (Orca, OSDI 2022; vLLM, SOSP 2023 Section 4.5) runs prefill sequences (many new
tokens each) and decode sequences (one new token each) in the same step. All new tokens are packed
into one list of rows; prefill sequences come first, then one row per decode sequence::

    seqs:    A: prefill 4 new tokens   B: prefill 3 new   C: decode   D: decode
    rows:    0   1   2   3             4   5   6          7           8
             |-------- prefill rows -------------|        |-- decode rows --|
    prefill.query_start_loc = [0, 4, 7]    (A's rows are [0, 4), B's are [4, 7))
    logits_indices          = [3, 6, 7, 8] (the last new row of every sequence)

A token at position `pos` of a sequence is stored in the cache slot of its block table (vLLM's
`slot_mapping`)::

    slot = block_table[pos // block_size] * block_size + pos % block_size

Block tables are `list[int]` in Python and become `int32` tensors only here, at the kernel boundary.
The builder takes plain lists, so the engine and tests can drive the model without the scheduler.

KV cache groups (the hybrid KV manager, sim/kv/hybrid.py; Gemma 3): each sequence has one block table per group
of layers, and a sliding group's table may start with freed blocks (None: vLLM's null block). Group 0's tables
are the fields below; the others are `groups[g - 1]` (`tables(g)` reads either). Every new token has a slot in
every group. A None entry becomes block 0 in the tensors: attention with a window never reads it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

# One sequence to run: (token ids to run now, number of its tokens already in the cache, block table).
SeqToRun = tuple[Sequence[int], int, Sequence[int]]


@dataclass(slots=True)
class PrefillMetadata:
    query_start_loc: torch.Tensor  # int32 [num_prefill_seqs + 1]; seq i owns rows [loc[i], loc[i+1])
    seq_lens: torch.Tensor  # int32 [num_prefill_seqs]; context incl. the new tokens
    block_tables: torch.Tensor  # int32 [num_prefill_seqs, max_blocks]; rows padded with 0 (never read)


@dataclass(slots=True)
class DecodeMetadata:
    seq_lens: torch.Tensor  # int32 [num_decode_seqs]; context incl. the one new token
    block_tables: torch.Tensor  # int32 [num_decode_seqs, max_blocks]; rows padded with 0 (never read)


@dataclass(slots=True)
class GroupTables:
    """One more KV cache group's view of the step: where the new tokens go, and the tables attention reads."""

    slot_mapping: torch.Tensor  # int64 [num_tokens]
    prefill_block_tables: torch.Tensor | None  # int32 [num_prefill_seqs, max_blocks]
    decode_block_tables: torch.Tensor | None  # int32 [num_decode_seqs, max_blocks]


@dataclass(slots=True)
class ForwardBatch:
    """Tensors for one forward step. Build it with `ForwardBatch.build`."""

    input_ids: torch.Tensor  # int64 [num_tokens], prefill rows first, then decode rows
    positions: torch.Tensor  # int64 [num_tokens], position of each row's token in its sequence
    slot_mapping: torch.Tensor  # int64 [num_tokens], cache slot that receives each row's K/V
    logits_indices: torch.Tensor  # int64 [num_seqs], row of each sequence's last new token
    num_prefill_tokens: int  # rows [0, num_prefill_tokens) are prefill rows
    prefill: PrefillMetadata | None  # None when the step has no prefill sequence
    decode: DecodeMetadata | None  # None when the step has no decode sequence
    max_seq_len: int  # longest context in the batch (a Python int: checks need no device sync)
    groups: tuple[GroupTables, ...] = ()  # KV cache groups 1, 2, ... (group 0 is the fields above)

    @property
    def num_groups(self) -> int:
        return 1 + len(self.groups)

    def tables(self, group: int) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """(slot_mapping, prefill block tables, decode block tables) of KV cache group `group`."""
        if group == 0:
            return (self.slot_mapping, None if self.prefill is None else self.prefill.block_tables,
                    None if self.decode is None else self.decode.block_tables)
        g = self.groups[group - 1]
        return g.slot_mapping, g.prefill_block_tables, g.decode_block_tables

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[0]

    @property
    def num_seqs(self) -> int:
        return self.logits_indices.shape[0]

    @staticmethod
    def is_decode(num_new_tokens: int, num_computed_tokens: int) -> bool:
        """A decode runs exactly one token after at least one cached token; anything else is a prefill
        (a whole prompt, a chunk of one, or the rest of a prompt after a prefix-cache hit)."""
        return num_new_tokens == 1 and num_computed_tokens > 0

    @classmethod
    def build(cls, seqs: Sequence[SeqToRun], block_size: int, device: torch.device | str = "cpu",
              group_tables: Sequence[Sequence[Sequence[int | None]]] | None = None) -> ForwardBatch:
        """Pack `seqs` (prefill sequences first) into the tensors of one step.

        Each seq is (token_ids_to_run, num_computed_tokens, block_table): the new tokens sit at
        positions num_computed_tokens .. num_computed_tokens + len(token_ids) - 1, and the block
        table must already cover all of them. `group_tables[i]`: seq i's tables of KV cache groups 1, 2, ...
        (position-indexed, None for a freed block), the same number for every seq.
        """
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        if not seqs:
            raise ValueError("a forward batch needs at least one sequence")
        kinds = [_check_seq(i, s, block_size) for i, s in enumerate(seqs)]
        num_prefill = kinds.count("prefill")
        if "prefill" in kinds[num_prefill:]:
            raise ValueError(f"prefill sequences must come before decode sequences, got the order {kinds}")

        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        starts = [0]
        for token_ids, num_computed, block_table in seqs:
            for pos in range(num_computed, num_computed + len(token_ids)):
                positions.append(pos)
                slots.append(block_table[pos // block_size] * block_size + pos % block_size)
            input_ids.extend(int(t) for t in token_ids)
            starts.append(len(input_ids))
        seq_lens = [num_computed + len(ids) for ids, num_computed, _ in seqs]
        tables = [list(table) for _, _, table in seqs]

        def i64(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int64, device=device)

        prefill = decode = None
        if num_prefill:
            prefill = PrefillMetadata(
                query_start_loc=torch.tensor(starts[: num_prefill + 1], dtype=torch.int32, device=device),
                seq_lens=torch.tensor(seq_lens[:num_prefill], dtype=torch.int32, device=device),
                block_tables=_block_tables_tensor(tables[:num_prefill], device),
            )
        if num_prefill < len(seqs):
            decode = DecodeMetadata(
                seq_lens=torch.tensor(seq_lens[num_prefill:], dtype=torch.int32, device=device),
                block_tables=_block_tables_tensor(tables[num_prefill:], device),
            )
        return cls(
            input_ids=i64(input_ids),
            positions=i64(positions),
            slot_mapping=i64(slots),
            logits_indices=i64([end - 1 for end in starts[1:]]),
            num_prefill_tokens=starts[num_prefill],
            prefill=prefill,
            decode=decode,
            max_seq_len=max(seq_lens),
            groups=_groups(seqs, group_tables, num_prefill, block_size, device) if group_tables else (),
        )


def _check_seq(index: int, seq: SeqToRun, block_size: int) -> str:
    """Validate one (token_ids, num_computed_tokens, block_table); return "prefill" or "decode"."""
    token_ids, num_computed, block_table = seq
    if len(token_ids) == 0:
        raise ValueError(f"seq {index}: token_ids to run must not be empty")
    if num_computed < 0:
        raise ValueError(f"seq {index}: num_computed_tokens must be >= 0, got {num_computed}")
    seq_len = num_computed + len(token_ids)
    needed = -(-seq_len // block_size)  # ceil division
    if len(block_table) < needed:
        raise ValueError(
            f"seq {index}: {seq_len} tokens need {needed} blocks of {block_size}, "
            f"but the block table has {len(block_table)}"
        )
    if any(b is None or b < 0 for b in block_table):
        raise ValueError(f"seq {index}: block table entries must be block ids >= 0, got {list(block_table)}")
    return "decode" if ForwardBatch.is_decode(len(token_ids), num_computed) else "prefill"


def _groups(seqs: Sequence[SeqToRun], group_tables: Sequence[Sequence[Sequence[int | None]]], num_prefill: int,
            block_size: int, device: torch.device | str) -> tuple[GroupTables, ...]:
    """The slot mappings and block tables of KV cache groups 1, 2, ... (see the module docstring)."""
    if len(group_tables) != len(seqs) or len({len(t) for t in group_tables}) != 1:
        raise ValueError(f"group_tables must give every one of the {len(seqs)} seqs the same number of tables")
    out = []
    for g in range(len(group_tables[0])):
        slots: list[int] = []
        tables = []
        for i, ((token_ids, num_computed, _), own) in enumerate(zip(seqs, group_tables)):
            table = own[g]
            for pos in range(num_computed, num_computed + len(token_ids)):
                block = table[pos // block_size] if pos // block_size < len(table) else None
                if block is None or block < 0:
                    raise ValueError(f"seq {i}: group {g + 1} has no block for position {pos} (table {list(table)})")
                slots.append(block * block_size + pos % block_size)
            tables.append([0 if b is None else b for b in table])
        out.append(GroupTables(
            torch.tensor(slots, dtype=torch.int64, device=device),
            _block_tables_tensor(tables[:num_prefill], device) if num_prefill else None,
            _block_tables_tensor(tables[num_prefill:], device) if num_prefill < len(seqs) else None))
    return tuple(out)


def _block_tables_tensor(tables: list[list[int]], device: torch.device | str) -> torch.Tensor:
    """int32 [num_seqs, max_blocks]. NOTE: short rows are padded with block 0, a sentinel that lives only
    in this tensor: kernels stop at ceil(seq_len / block_size) blocks so it is never read, and a real id
    keeps any stray read inside the cache."""
    width = max(len(t) for t in tables)
    return torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32, device=device)
