"""The argument checks every KV manager shares: what a misuse of the contract (sim/kv/base.py) is told, in one line.

Out of memory is an answer (`None`); a call that breaks the contract is an error. These are the errors every policy
words the same way: one count per distinct sequence id, no negative counts, lookahead slots (a verify step's drafts)
only for running sequences and rolled back before the sequence grows again.
"""
from __future__ import annotations

from typing import Callable, Sequence

from .base import NewSequence


def check_request_args(seq_ids: Sequence[int], num_new_tokens: Sequence[int],
                       new: Sequence[NewSequence] | None) -> None:
    """The argument checks every allocate_slots shares: one count per distinct id, counts >= 0."""
    if len(seq_ids) != len(num_new_tokens) or (new is not None and len(new) != len(seq_ids)):
        raise ValueError(f"expected one num_new_tokens (and one NewSequence) per seq id, got ids {list(seq_ids)}, "
                         f"counts {list(num_new_tokens)}, new {None if new is None else len(new)}")
    if len(set(seq_ids)) != len(seq_ids):
        raise ValueError(f"duplicate sequence ids {list(seq_ids)}")
    if any(n < 0 for n in num_new_tokens):
        raise ValueError(f"num_new_tokens must be >= 0, got {list(num_new_tokens)}")


def check_lookahead(seq_ids: Sequence[int], num_lookahead_tokens: Sequence[int] | None,
                    new: Sequence[NewSequence] | None) -> Sequence[int] | None:
    """The lookahead counts of an allocate_slots call, checked (one per id, >= 0, none for an admission), or None when
    there are none (every count 0)."""
    if num_lookahead_tokens is None:
        return None
    if len(num_lookahead_tokens) != len(seq_ids) or any(n < 0 for n in num_lookahead_tokens):
        raise ValueError(f"expected one num_lookahead_tokens >= 0 per seq id, got ids {list(seq_ids)}, lookahead "
                         f"{list(num_lookahead_tokens)}")
    if not any(num_lookahead_tokens):
        return None
    if new is not None:
        raise ValueError(f"lookahead slots are for running sequences (a verify step's drafts), not an admission, got "
                         f"{list(num_lookahead_tokens)}")
    return num_lookahead_tokens


def check_rollback(seq_id: int, num_tokens: int, held: int, lookahead: int) -> None:
    """ValueError unless a sequence holding `held` tokens, the last `lookahead` of them drafts, may keep
    `num_tokens`."""
    if not (isinstance(num_tokens, int) and held - lookahead <= num_tokens <= held):
        raise ValueError(f"rollback({seq_id}, {num_tokens!r}): expected from {held - lookahead} (its tokens before its "
                         f"{lookahead} lookahead slots) to {held}")


def with_lookahead(seq_ids: Sequence[int], num_new_tokens: Sequence[int], new: Sequence[NewSequence] | None,
                   num_lookahead_tokens: Sequence[int] | None,
                   pending: Callable[[int], int]) -> tuple[Sequence[int], Sequence[int] | None]:
    """An allocate_slots call's (tokens each sequence grows by, drafts included; the drafts, or None), checked
    (check_lookahead), and no running sequence still holding drafts (`pending(seq_id)`: its lookahead slots)."""
    lookahead = check_lookahead(seq_ids, num_lookahead_tokens, new)
    if new is None:
        for seq_id in seq_ids:
            no_pending_lookahead(seq_id, pending(seq_id))
    if lookahead is None:
        return num_new_tokens, None
    return [k + la for k, la in zip(num_new_tokens, lookahead)], lookahead


def no_pending_lookahead(seq_id: int, lookahead: int) -> None:
    """RuntimeError if the sequence still holds unverified lookahead slots (rollback comes first)."""
    if lookahead:
        raise RuntimeError(f"sequence {seq_id}: expected its {lookahead} lookahead slots rolled back before it grows")
