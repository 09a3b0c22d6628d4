"""The KV managers' own records of live sequences, as the fast plane reads them (each manager's `seq_state`)."""
from __future__ import annotations

from typing import Sequence


def records(kv, seq_groups: Sequence[Sequence[int]]) -> list:
    """The records of the sequences of `seq_groups`, the groups concatenated: KeyError for a sequence the manager does
    not hold, ValueError for one named twice."""
    state = kv.seq_state
    found = [state(seq_id) for ids in seq_groups for seq_id in ids]
    distinct = set(map(id, found))  # (the common case checked in C: `None in found` would call each record's __eq__)
    if id(None) in distinct or len(distinct) != len(found):
        seq_ids = [i for ids in seq_groups for i in ids]
        missing = [i for i, seq in zip(seq_ids, found) if seq is None]
        if missing:
            raise KeyError(f"sequence {missing[0]} is not live")
        raise ValueError(f"duplicate sequence ids {seq_ids}")
    return found
