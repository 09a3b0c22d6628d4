"""What a failed step leaves to undo: the requests `Scheduler.abandon_step` aborts, and the prefix-cache entries of
the blocks it never wrote.

A step can fail anywhere: the executor raises, an interrupt comes, a KV call raises midway. The scheduler treats each
of its KV calls as a transaction (docs/ARCHITECTURE.md, "Bad input", from "Nothing wedges the engine"): it notes the request whose memory a
call is changing (`Allocating`, and the set of requests it opened) before the call and forgets it once the plan and
the queues record the change. When the step fails, every request it touched is aborted whole, so its blocks return
to the pool, and no later prompt may reuse K/V that was never computed. The plain request's path never comes here.
"""
from __future__ import annotations

from typing import NamedTuple

from ..kv.base import KVManager, NewSequence
from .plan import StepPlan
from .sequence import Sequence, SequenceGroup, SequenceStatus


class Allocating(NamedTuple):
    """A KV call in flight (abandon_step's record): its group, the sequences it allocates for, an admission's specs."""

    group: SequenceGroup
    seqs: tuple[Sequence, ...]
    new: list[NewSequence] | None  # None: the sequences are live already (they grow, or come back from swap)


def touched_requests(kv: KVManager, plan: StepPlan | None, opened: set[int], allocation: Allocating | None,
                     running: list[SequenceGroup], groups: dict[int, SequenceGroup]) -> list[int]:
    """The requests a failed step touched, in plan order: one with a sequence in the plan (its K/V may be half
    written), one the plan swapped out (the copy to CPU may not have happened), one owning a block the plan copies
    into, and one whose memory a KV call was changing when the step failed (`opened`, the allocation in flight: the
    plan or the queues may not record it yet). `running`: the running queue, `groups`: every request's group."""
    if allocation is not None:
        opened = opened | {allocation.group.request_id}
    if plan is None and not opened:
        return []
    touched = dict.fromkeys(plan.request_ids() if plan is not None else ())
    if plan is not None:
        touched.update(dict.fromkeys(r for r in plan.preempted if groups[r].status is SequenceStatus.SWAPPED))
        written = {dst for _, dst in plan.blocks_to_copy}
        held = set(kv.seq_ids)
        for group in running if written else ():
            if any(b in written for s in group.kv_seqs if s.seq_id in held for b in kv.block_table(s.seq_id)):
                touched[group.request_id] = None
    touched.update(dict.fromkeys(sorted(opened)))
    return list(touched)


def uncache_unwritten(kv: KVManager, plan: StepPlan | None, allocation: Allocating | None) -> None:
    """Unregister from the prefix cache the blocks a failed plan (and the allocation in flight) were to write, from
    each sequence's first position the step computes (those before it were written by earlier steps). A full block is
    registered when allocated, before the executor writes it."""
    held, bs = set(kv.seq_ids), kv.block_size
    starts = [(e.seq_id, e.num_computed_tokens) for e in (plan.entries if plan else ()) if e.num_new_tokens]
    if allocation is not None:
        seqs, new = allocation.seqs, allocation.new
        starts += [(s.seq_id, s.num_computed_tokens if new is None else spec.num_cached_tokens)
                   for s, spec in zip(seqs, new or seqs)]
    for seq_id, start in starts:
        if seq_id in held:  # on the GPU: the plan's entries and an allocation are never swapped out
            kv.uncache(kv.block_table(seq_id)[start // bs:])
