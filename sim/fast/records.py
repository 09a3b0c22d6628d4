"""The KV managers' own records of live sequences, as the fast plane reads them (each manager's `seq_state`)."""
from __future__ import annotations

from typing import Sequence


def records(kv, seq_groups: Sequence[Sequence[int]]) -> list:
    """The records of the sequences of `seq_groups`, the groups concatenated: KeyError for a sequence the manager does
    not hold, ValueError for one named twice."""
    seq_ids = [i for ids in seq_groups for i in ids]
    if len(set(seq_ids)) != len(seq_ids):
        raise ValueError(f"duplicate sequence ids {seq_ids}")
    state, found = kv.seq_state, []
    for seq_id in seq_ids:
        seq = state(seq_id)
        if seq is None:
            raise KeyError(f"sequence {seq_id} is not live")
        found.append(seq)
    return found
