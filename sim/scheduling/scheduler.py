"""The scheduler: which requests compute how many tokens each iteration, and what memory that takes.

One scheduler, three modes (docs/ARCHITECTURE.md, "A request's life"):

- `v1` (today's vLLM, vllm/v1/core/sched/scheduler.py; Sarathi-Serve's chunked prefill, Agrawal et al.,
  OSDI 2024): there is no prefill phase and no decode phase. Every step hands out a token budget
  (`max_num_batched_tokens`): running requests first (decodes and unfinished prompt chunks), in arrival
  order, then waiting ones. With chunked prefill a prompt longer than what is left of the budget is served in
  chunks, so steps mix prompt chunks and decodes and a long prompt never stalls the decodes behind it.
- `v0` (the paper's system: Kwon et al., SOSP 2023, sections 4.5 and 5; vLLM v0 of 2023): a step either
  admits waiting requests with their whole prompts (a prefill-only step) or decodes the running ones.
- `static` (FasterTransformer's request-level batching): v0, but a batch is admitted only when nothing runs.

In every mode admission is FCFS without overtaking; when a running request cannot get memory, running
requests are preempted (a pluggable victim policy, sim/scheduling/preemption.py; default: the latest arrival), all
sequences of a group together, by swapping (its blocks move to CPU memory) or recompute (its blocks are
freed and it is computed again later, sampled tokens included).

`scheduling_policy="priority"` (vLLM's `--scheduling-policy priority`) orders every queue by (request.priority,
arrival) instead of arrival alone: the lowest value is admitted first (still without overtaking: the head waits
for memory, and nothing behind it goes first) and the latest arrival of the highest value is preempted first. A
request that arrives with a better priority than running ones does not preempt them: it heads the waiting queue.

Speculative decoding (`num_speculative_tokens` k > 0, vLLM's name; Leviathan et al., ICML 2023): a decoding sequence
is fed its last sampled token plus up to k draft tokens (fewer where its output or max_model_len ends first, or the
budget runs out; none for beam search), its drafts in lookahead slots of the KV manager. The executor verifies them
and reports how many it accepted (`StepOutcome.num_accepted`); the sequence keeps those, samples one more token (the
target's own next token), and `rollback` gives back the rejected drafts' slots. Who proposes the drafts is the
executor's business (the engine's n-gram draft; the simulator's acceptance model). No run of plain decode steps is
jumped over while it is on (the fast plane, sim/fast/, assumes one token per step).

The same object serves the simulator and the reference engine: `schedule()` returns a `StepPlan` whose blocks
are already allocated; the executor runs it and reports a `StepOutcome` to `finish_step()`. The scheduler
touches memory only through the KV contract (sim/kv/base.py) and never knows the policy behind it.

The class reads top to bottom: requests in and out; what executors and metrics may read; one iteration
(`schedule`); the executor's report (`finish_step`, `abandon_step`). It steps one step at a time, and every field is
true at every moment. (The simulator's fast plane, sim/fast/, jumps over runs of plain decode steps with exactly
these results, calling only the public methods listed in docs/ARCHITECTURE.md, "The fast plane".)
"""
from __future__ import annotations

import bisect
from collections import deque
from operator import attrgetter
from typing import AbstractSet, NamedTuple

from ..base.request import Request
from ..config import SchedulerConfig
from ..kv.base import KVManager, NewSequence
from .beam import reselect_beams
from .failed_step import Allocating, touched_requests, uncache_unwritten
from .plan import ScheduledSeq, StepOutcome, StepPlan, StepResult
from .preemption import victim_policy
from .request_queue import FCFSRequestQueue, PriorityRequestQueue
from .sequence import Sequence, SequenceGroup, SequenceStatus, queue_copies, split_budget
from .speculative import check_accepted, draft_counts

__all__ = ["Scheduler", "SchedulerConfig", "StepResult"]

_queue_key = attrgetter("queue_key")  # a group's place in every queue (the bisections' key)


class Admission(NamedTuple):
    """What admitting a waiting group now asks of the KV manager."""

    new: list[NewSequence]  # one per sequence that takes memory (its prefix-cache hits included)
    counts: list[int]  # tokens each computes in this step (a chunk, or the rest of its prompt)


WAITING = SequenceStatus.WAITING
RUNNING = SequenceStatus.RUNNING
SWAPPED = SequenceStatus.SWAPPED
FINISHED = SequenceStatus.FINISHED


class Scheduler:
    """Iteration-level scheduler over one KV manager. Queues: waiting (sim/scheduling/request_queue.py: FCFS or priority),
    running and swapped (lists kept in the same order). Sequence ids come from a counter inside the instance. What
    executors and metrics may read (queue lengths, ids, a sequence's progress) is in the views section."""

    def __init__(self, kv: KVManager, config: SchedulerConfig | None = None, *, draft_len=None) -> None:
        """`draft_len(request_id, seq_id)`: with speculative decoding, how many draft tokens the executor has for the
        sequence now (the engine's n-gram draft may find none); None: num_speculative_tokens for every sequence (the
        simulator's acceptance model, which drafts anything)."""
        self.kv = kv
        self.config = config if config is not None else SchedulerConfig()
        self._draft_len = draft_len
        self._victim = victim_policy(self.config.victim)
        self._num_drafts = self.config.num_speculative_tokens  # k: draft tokens per decode and step (0: off)
        priority = self.config.scheduling_policy == "priority"
        self._waiting = PriorityRequestQueue() if priority else FCFSRequestQueue()
        self._running: list[SequenceGroup] = []
        self._swapped: list[SequenceGroup] = []
        self._groups: dict[int, SequenceGroup] = {}  # every request ever added, finished ones included
        self._seqs: dict[int, Sequence] = {}  # every sequence but dropped beams
        self._next_seq_id = 0
        self._num_added = 0
        self._num_preemptions = 0
        self._outstanding: StepPlan | None = None  # the plan schedule() returned and finish_step() has not seen
        # The step's KV calls as transactions (abandon_step): the requests whose memory a KV call of the step in flight
        # began to change before the plan or the queues recorded it; the allocation in flight (its sequences, and
        # the specs of an admission), whose blocks the prefix cache may hold before their K/V is written.
        self._open: set[int] = set()
        # (group, its sequences, the admission's specs or None): the allocation in flight, its group open too
        self._open_allocation: Allocating | None = None
        self._reported: StepPlan | None = None  # the plan finish_step() was given: its K/V was written

    # --- requests in and out ---------------------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        """Queue a request; ValueError "request <id>: <why>" if it can never be served (check_request)."""
        rid = request.request_id
        if rid in self._groups:
            raise ValueError(f"request {rid} was already added (request ids must be unique)")
        problem = self.check_request(request)
        if problem is not None:
            raise ValueError(f"request {rid}: {problem}")
        seqs = [self._new_seq(request, 0) for _ in range(request.num_seqs)]
        key = self._waiting.queue_key(request, self._num_added)
        group = SequenceGroup(request, seqs, arrival_order=self._num_added, queue_key=key)
        self._num_added += 1
        self._groups[rid] = group
        self._waiting.add_request(group)

    def check_request(self, request: Request) -> str | None:
        """Why `request` could never be served, in one line (a prompt over the token budget without chunked prefill,
        more sequences than max_num_seqs, a final length the whole pool cannot hold), else None. Changes nothing:
        a caller that knows the request by another name words the refusal itself."""
        cfg = self.config
        if not cfg.chunked and request.prompt_len > cfg.max_num_batched_tokens:
            return (f"prompt_len {request.prompt_len} is over max_num_batched_tokens "
                    f"(allowed: <= {cfg.max_num_batched_tokens}, or any length with chunked prefill)")
        if request.beam_width > cfg.max_num_batched_tokens:  # the k beams of a step are fed together
            return f"beam_width {request.beam_width} is over max_num_batched_tokens (allowed: <= {cfg.max_num_batched_tokens})"
        if request.num_seqs > cfg.max_num_seqs:
            return f"{request.num_seqs} sequences (allowed: <= max_num_seqs, {cfg.max_num_seqs})"
        return self.kv.check_request(request.prompt_len, request.total_len - 1, request.num_seqs)

    def _new_seq(self, request: Request, num_generated: int) -> Sequence:
        seq = Sequence(self._next_seq_id, request.request_id, request.prompt_len, request.output_len, num_generated)
        self._next_seq_id += 1
        self._seqs[seq.seq_id] = seq
        return seq

    def abort(self, request_id: int) -> None:
        """Drop a request wherever it is and free its memory (GPU or CPU). Aborting a finished request does nothing."""
        group = self.group(request_id)
        if group.status is FINISHED:
            return
        if group.status is WAITING:
            self._waiting.remove_request(group)
            group.set_status(FINISHED)
            group.pending_copies.clear()
        else:
            self._drop([request_id])

    def _drop(self, request_ids) -> None:
        """Finish these requests whatever state a failed step left them in: out of every queue they are in, every
        sequence of theirs the KV manager holds freed (a beam forked before its group listed it, one already freed
        left alone). Asks the manager only for its live sequences and to free them."""
        rids = set(request_ids)
        self._waiting.keep(lambda g: g.request_id not in rids)
        for queue in (self._running, self._swapped):
            kept = [g for g in queue if g.request_id not in rids]
            if len(kept) != len(queue):
                queue[:] = kept
        for seq_id in self.kv.seq_ids:
            seq = self._seqs.get(seq_id)
            if seq is not None and seq.request_id in rids:
                self.kv.free(seq_id)
        for rid in rids:
            group = self._groups[rid]
            group.set_status(FINISHED)
            group.pending_copies.clear()

    def has_unfinished(self) -> bool:
        return bool(self._waiting or self._running or self._swapped)

    # --- what executors, metrics and figures may read: queues, requests, sequences (never changed) ----
    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_swapped(self) -> int:
        return len(self._swapped)

    @property
    def num_running_seqs(self) -> int:
        return sum(len(g.live) for g in self._running)

    @property
    def num_preemptions(self) -> int:
        return self._num_preemptions

    def waiting_request_ids(self) -> list[int]:
        return [g.request_id for g in self._waiting]

    def running_request_ids(self) -> list[int]:
        return [g.request_id for g in self._running]

    def swapped_request_ids(self) -> list[int]:
        return [g.request_id for g in self._swapped]

    def seq_ids(self, request_id: int) -> list[int]:
        """The request's current sequences (finished ones included, dropped beams not), in beam order."""
        return [s.seq_id for s in self.group(request_id).seqs]

    def request_of(self, seq_id: int) -> int | None:
        """The request sequence `seq_id` belongs to; None if the scheduler holds no such sequence (a dropped beam)."""
        seq = self._seqs.get(seq_id)
        return None if seq is None else seq.request_id

    def num_generated(self, seq_id: int) -> int:
        return self._seqs[seq_id].num_generated

    def num_computed_tokens(self, seq_id: int) -> int:
        return self._seqs[seq_id].num_computed_tokens

    def group_status(self, request_id: int) -> SequenceStatus:
        return self.group(request_id).status

    def is_finished(self, request_id: int) -> bool:
        return self.group(request_id).status is FINISHED

    def request(self, request_id: int) -> Request:
        return self.group(request_id).request

    def group(self, request_id: int) -> SequenceGroup:
        """The request's group (its sequences are public records: read them, never change them but as the fast plane's
        contract says, docs/ARCHITECTURE.md)."""
        if request_id not in self._groups:
            raise KeyError(f"unknown request {request_id}")
        return self._groups[request_id]

    @property
    def running(self) -> list[SequenceGroup]:
        """The running groups, in queue order (the list itself: never change it)."""
        return self._running

    @property
    def waiting(self) -> FCFSRequestQueue:
        """The waiting queue (the queue itself: never change it)."""
        return self._waiting

    @property
    def in_flight(self) -> StepPlan | None:
        """The plan schedule() returned that finish_step() (or abandon_step()) has not seen yet, if any."""
        return self._outstanding

    # --- one iteration -------------------------------------------------------------------------------
    def schedule(self) -> StepPlan:
        """Decide the next iteration.

        v1: (1) running groups, FCFS, each get the tokens they miss (a decode: 1 per sequence; a prompt: a
        chunk) while the budget lasts; a group that cannot get memory preempts victims until it can, or is
        itself the victim. (2) If nothing was preempted, swapped groups come back FCFS while they fit, then
        (3) waiting groups are admitted FCFS while they fit in memory, max_num_seqs and the budget.
        v0 / static: (3) first, with whole prompts; if anything was admitted the step is prefill-only;
        otherwise (1) without a budget, then (2).
        """
        plan = self.begin_step()
        budget = self.config.max_num_batched_tokens
        if self.config.mode == "v1":
            budget = self._schedule_running(plan, budget)
            if not plan.preempted:
                budget = self._swap_in(plan, budget)
                if self.may_admit():
                    self.admit_waiting(plan, budget, self.num_running_seqs)
        elif not (self.may_admit() and self.admit_waiting(plan, budget, self.num_running_seqs)):
            self._schedule_running(plan, None)  # nothing admitted: this step decodes every running group
            if not plan.preempted:
                self._swap_in(plan, None)
        return plan

    def begin_step(self) -> StepPlan:
        """The next step's plan, begun: the fork copies the last report queued come first. RuntimeError while the
        last plan is not reported. schedule() begins with it (and the fast plane, for a step it takes part in)."""
        if self._outstanding is not None and not self._outstanding.is_empty:
            raise RuntimeError("schedule() called twice: expected finish_step() for the previous plan first")
        self._reported = None
        # NOTE: fork copies from the last finish_step go first. Only contiguous forks copy, and contiguous
        # groups are never swapped, so no swap-out of this step can read a block before its copy lands.
        plan = StepPlan()
        self._outstanding = plan  # from here on: should this raise midway, abandon_step() undoes what it did
        for group in self._running:
            if group.pending_copies:
                plan.blocks_to_copy += group.pending_copies
                group.pending_copies = []
        return plan

    def may_admit(self) -> bool:
        """Is admission open? NOTE: nothing is admitted while a group waits in swap space (it would be starved).
        Static batching (FasterTransformer) admits a new batch only once the previous one has left entirely: a
        finished request frees its memory at once, but its place stays idle until the whole batch is done (the
        baseline's cost). A batch member preempted by recompute waits at the front and opens the next batch."""
        return not self._swapped and (self.config.mode != "static" or not self._running)

    def _schedule_running(self, plan: StepPlan, budget: int | None) -> int | None:
        remaining = deque(self._running)  # FCFS: earliest arrival first
        kept: list[SequenceGroup] = []
        allocate = self.kv.allocate_slots
        while remaining:
            group = remaining.popleft()
            seqs = group.kv_seqs
            needs = [s.prompt_len + s.num_generated - s.num_computed_tokens for s in seqs]
            counts = needs if budget is None or sum(needs) <= budget else split_budget(group, needs, budget)
            if not any(counts):  # the budget is spent: it waits for the next step, keeping its memory
                kept.append(group)
                continue
            ids = [s.seq_id for s in seqs]
            drafts = draft_counts(group, seqs, counts, budget, self._num_drafts, self.config.max_model_len,
                                  self._draft_len) if self._num_drafts else None
            while True:  # NOTE: the transaction's brackets (see abandon_step), inline: this loop runs every step
                self._open_allocation = Allocating(group, seqs, None)
                if drafts is None:
                    allocation = allocate(ids, counts)
                else:
                    allocation = allocate(ids, counts, num_lookahead_tokens=drafts)
                if allocation is not None:
                    break
                self._open_allocation = None  # None: nothing changed
                victim = self._choose_victim(group, remaining)
                self._preempt(victim, plan)
                if victim is group:
                    break
                remaining.remove(victim)
            if allocation is not None:
                self._add_entries(plan, group, seqs, counts, allocation.copies, drafts)
                kept.append(group)
                if budget is not None:
                    budget -= sum(counts) + (sum(drafts) if drafts else 0)
                self._open_allocation = None
        self._running = kept
        return budget

    def _choose_victim(self, group: SequenceGroup, remaining: deque[SequenceGroup]) -> SequenceGroup:
        """Among the group that needs memory and the running groups not yet scheduled in this step."""
        candidates = [*remaining, group]
        victim = self._victim(candidates)
        if not any(victim is c for c in candidates):
            raise ValueError(f"the victim policy returned {victim!r}, expected one of the candidates it was given")
        return victim

    def _preempt(self, group: SequenceGroup, plan: StepPlan) -> None:
        seqs = group.kv_seqs
        ids = [s.seq_id for s in seqs]
        self._num_preemptions += 1
        self._open.add(group.request_id)
        plan.preempted.append(group.request_id)
        if self.config.preemption == "swap" and self.kv.can_swap_out(ids):
            plan.blocks_to_swap_out += self.kv.swap_out(ids)
            group.set_status(SWAPPED)
            bisect.insort(self._swapped, group, key=_queue_key)
        else:
            for seq in seqs:
                self.kv.free(seq.seq_id)
                seq.num_computed_tokens, seq.prefilling = 0, True
            group.set_status(WAITING)
            self._waiting.prepend_request(group)
        self._open.discard(group.request_id)

    def preempt(self, group: SequenceGroup, plan: StepPlan) -> None:
        """Preempt a running group now, as a step short of memory does (swap or recompute), recorded in `plan`; it
        leaves the running queue. (schedule() preempts through _preempt; the fast plane, for a step it takes.)"""
        running = self._running
        if running and running[-1] is group:
            running.pop()
        else:
            del running[next(i for i, g in enumerate(running) if g is group)]
        self._preempt(group, plan)

    def _swap_in(self, plan: StepPlan, budget: int | None) -> int | None:
        num_seqs = self.num_running_seqs
        while self._swapped:
            group = self._swapped[0]
            seqs = group.kv_seqs
            ids = [s.seq_id for s in seqs]
            counts = split_budget(group, [s.num_tokens - s.num_computed_tokens for s in seqs], budget)
            if num_seqs + group.num_seqs > self.config.max_num_seqs or not any(counts):
                break
            if not self.kv.can_swap_in(ids, counts):
                break
            self._open.add(group.request_id)
            plan.blocks_to_swap_in += self.kv.swap_in(ids)
            self._open_allocation = Allocating(group, seqs, None)
            allocation = self.kv.allocate_slots(ids, counts)
            if allocation is None:
                raise RuntimeError(f"request {group.request_id}: expected room after swap-in (checked), found none")
            self._swapped.pop(0)
            group.set_status(RUNNING)
            bisect.insort(self._running, group, key=_queue_key)
            self._add_entries(plan, group, seqs, counts, allocation.copies)
            self._open.discard(group.request_id)
            self._open_allocation = None
            num_seqs += group.num_seqs
            budget = None if budget is None else budget - sum(counts)
        return budget

    def _admission(self, group: SequenceGroup, budget: int, first: bool) -> Admission | None:
        """What admitting `group` now would ask of the KV manager, or None if the budget does not allow it. NOTE:
        `first` (nothing fed yet this step) lets a group over the budget run alone: without chunking, a recompute
        (prompt + generated tokens) may exceed it."""
        new = [self._new_spec(group, s) for s in group.kv_seqs]
        needs = [s.num_tokens - spec.num_cached_tokens for s, spec in zip(group.kv_seqs, new)]
        if sum(needs) <= budget or (first and not self.config.chunked):
            return Admission(new, needs)
        if not self.config.chunked or budget <= 0:
            return None
        counts = split_budget(group, needs, budget)
        return Admission(new, counts) if any(counts) else None

    def _new_spec(self, group: SequenceGroup, seq: Sequence) -> NewSequence:
        request = group.request
        ids, skip = request.prompt_token_ids, request.skip_reading_prefix_cache
        if ids is not None and request.output_token_ids is not None and request.num_seqs == 1:
            # Known generated tokens are prefix-cache keys too (a conversation's next turn repeats them), up to the
            # sequence's final length: its last sampled token is never fed, so it never has K/V. Only for a lone
            # sequence: siblings would generate different tokens (Request refuses the combination too).
            ids = ids + request.output_token_ids[: seq.final_len - len(ids)]
        cached = self.kv.get_computed_tokens(ids, seq.num_tokens) if ids is not None and not skip else 0
        forks = tuple(s.final_len for s in group.siblings_to_fork)
        return NewSequence(seq.prompt_len, seq.final_len, ids, cached, forks, skip)

    def admit_waiting(self, plan: StepPlan, budget: int, num_running_seqs: int, first: bool = True) -> bool:
        """Admit waiting groups into `plan` FCFS, with no overtaking, while `budget` tokens, max_num_seqs (beside
        `num_running_seqs` running sequences) and memory allow; True if any was. `first` False: the step feeds tokens
        the plan does not list (the fast plane's decode epoch, sim/fast/epoch.py), so no group runs alone over the
        budget."""
        num_seqs, admitted = num_running_seqs, False
        while self._waiting:
            group = self._waiting.peek_request()
            if num_seqs + group.num_seqs > self.config.max_num_seqs:
                break
            asked = self._admission(group, budget, first=first and plan.num_batched_tokens == 0)
            if asked is None:
                break
            new, counts = asked.new, asked.counts
            seqs = group.kv_seqs
            self._open_allocation = Allocating(group, seqs, new)
            allocation = self.kv.allocate_slots([s.seq_id for s in seqs], counts, new)
            if allocation is None:  # nothing changed
                self._open_allocation = None
                break
            self._waiting.pop_request()
            group.set_status(RUNNING)
            bisect.insort(self._running, group, key=_queue_key)
            for seq, spec in zip(seqs, new):
                seq.num_computed_tokens = spec.num_cached_tokens
            self._add_entries(plan, group, seqs, counts, allocation.copies)
            self._open_allocation = None
            num_seqs += group.num_seqs
            budget -= sum(counts)
            admitted = True
        return admitted

    def can_admit_head(self) -> bool:
        """Would the first waiting group be admitted if a step started now with the whole budget (max_num_seqs,
        budget and memory, watermark included)? False when nothing waits or admission is closed."""
        if not self._waiting or not self.may_admit():
            return False
        return self.head_may_be_admitted(self.config.max_num_batched_tokens, self.num_running_seqs, nothing_fed=True)

    def head_may_be_admitted(self, budget: int, num_running_seqs: int, nothing_fed: bool) -> bool:
        """Would the first waiting group be admitted with `budget` tokens left and `num_running_seqs` running?
        `nothing_fed`: the step admits before it feeds anything (v0's prefill-only steps, or an observer asking of a
        fresh step), so the answer is exact; else (v1, after the decodes) a guess that errs towards yes. Changes
        nothing."""
        group = self._waiting.peek_request()
        if num_running_seqs + group.num_seqs > self.config.max_num_seqs:
            return False
        asked = self._admission(group, budget, first=nothing_fed)
        if asked is None:
            return False
        new, counts = asked.new, asked.counts
        # NOTE: with chunking, losing a prefix-cache hit to eviction can SHRINK the chunk's memory need, so a
        # blocked group with hits might fit later: treat it as admissible (the cautious answer).
        if not nothing_fed and self.config.chunked and any(spec.num_cached_tokens for spec in new):
            return True
        return self.kv.can_allocate_slots([s.seq_id for s in group.kv_seqs], counts, new)

    def _add_entries(self, plan: StepPlan, group: SequenceGroup, seqs, counts: list[int], copies,
                     drafts: list[int] | None = None) -> None:
        rid, block_table = group.request_id, self.kv.block_table
        if copies:
            plan.blocks_to_copy += copies
        for i, (seq, count) in enumerate(zip(seqs, counts)):
            if not count:
                continue
            computed = seq.num_computed_tokens
            sample = computed + count == seq.prompt_len + seq.num_generated
            entry = ScheduledSeq(seq.seq_id, rid, computed, count, block_table(seq.seq_id), sample)
            if drafts is not None and drafts[i]:  # a verify entry: its last token, then its drafts
                entry.num_new_tokens += drafts[i]
                entry.num_draft_tokens = drafts[i]
                plan.num_draft_tokens += drafts[i]
            (plan.prefills if seq.prefilling else plan.decodes).append(entry)
            if sample and not group.forked:  # the leader's last prompt token: its siblings sample from its logits
                plan.prefills += [ScheduledSeq(s.seq_id, rid, computed + count, 0, [], True) for s in group.siblings_to_fork]

    # --- the executor's report -----------------------------------------------------------------------
    def finish_step(self, plan: StepPlan, outcome: StepOutcome) -> StepResult:
        """Apply what happened in `plan`: fed tokens are computed; sampling entries sampled one token each;
        siblings of a just-computed prompt are forked from their leader; beams are re-chosen (unlisted ones
        freed FIRST, then repeated parents forked); finished sequences free their memory at once.

        NOTE: a sequence also finishes when it has generated output_len tokens (the simulator's rule, the engine's
        max_tokens), and for beam search all k beams end together: one finished beam finishes the group.
        """
        if plan is not self._outstanding:
            raise ValueError("finish_step() expects the plan the last schedule() returned")
        if plan.num_draft_tokens:
            check_accepted(plan, outcome)
        self._outstanding, self._reported = None, plan
        seqs, groups = self._seqs, self._groups
        touched: dict[int, SequenceGroup] = {}  # the groups that sampled: only they can finish
        for entry in plan.entries:
            seq = seqs.get(entry.seq_id)
            if seq is None or seq.status is not RUNNING:  # an abort in between leaves it FINISHED
                continue
            accepted = 0
            if entry.num_draft_tokens:  # a verify entry: keep the accepted drafts, give the rejected ones' slots back
                accepted = outcome.num_accepted[entry.seq_id]
                seq.num_computed_tokens += entry.num_new_tokens - entry.num_draft_tokens + accepted
                self.kv.rollback(seq.seq_id, seq.num_computed_tokens)
            elif entry.num_new_tokens:
                seq.num_computed_tokens += entry.num_new_tokens
            else:  # a sibling of the prompt just computed: it joins the pool as a fork of the leader
                group = groups[entry.request_id]
                copies = self.kv.fork(group.live[0].seq_id, seq.seq_id, seq.final_len)
                if copies is None:
                    raise RuntimeError(f"fork of seq {seq.seq_id}: expected room (reserved at admission), found none")
                queue_copies(group, copies)
                seq.num_computed_tokens = entry.num_computed_tokens
            if entry.sample:
                seq.num_generated += 1 + accepted
                seq.prefilling = False
                group = touched.get(entry.request_id) or touched.setdefault(entry.request_id, groups[entry.request_id])
                group.forked = True
        for seq_id in outcome.finished_seq_ids:  # checked before beams are re-chosen: a dropped beam may be named
            seq = seqs.get(seq_id)
            if seq is None or seq.status not in (RUNNING, FINISHED):
                raise ValueError(f"finished_seq_ids: expected running sequences, found {seq_id} ({seq and seq.status})")
            if seq.status is RUNNING:
                touched.setdefault(seq.request_id, groups[seq.request_id])
        self._open.update(touched)  # the requests this report frees or forks (those of the plan are touched anyway)
        self._open.update(outcome.beam_parents)
        beams_done = {seqs[i].request_id for i in outcome.finished_seq_ids}
        new_beams = {rid: self._reselect_beams(rid, parents) for rid, parents in outcome.beam_parents.items()}
        result = StepResult(self._finish(touched.values(), outcome.finished_seq_ids, beams_done), new_beams)
        self._open.clear()
        return result

    def abandon_step(self, plan: StepPlan | None = None) -> list[int]:
        """A step failed (the executor raised, an interrupt came, a KV call raised): abort every request the step
        touched, so their blocks return to the pool, and forget the plan, so that schedule() can run again. Other
        requests stay as they were. Returns the touched requests (all FINISHED now), in plan order. Never raises
        for a state a failed step left behind: the step's own exception is the one the caller must see.

        plan: the plan schedule() returned, reported to finish_step() or not; None: the plan schedule() was
        building when it raised. Touched: a request with a sequence in the plan (its K/V may be half written), one
        the plan swapped out (the copy to CPU may not have happened), one owning a block the plan copies into, and
        one whose memory a KV call was changing when the step failed (before, inside or just after the call: the
        plan or the queues may not record it yet). A transaction, seen from the scheduler: each of its KV calls is
        either recorded whole or its request is aborted whole.
        Unless the plan reached finish_step() (its K/V was written), the blocks it was to write are unregistered from
        the prefix cache (a full block is registered when allocated, before the executor writes it), so no later
        prompt reuses K/V that was never computed.
        """
        if plan is None or plan is self._outstanding:
            plan, self._outstanding = self._outstanding, None
        opened, self._open = self._open, set()
        allocation, self._open_allocation = self._open_allocation, None
        reported, self._reported = plan is not None and plan is self._reported, None
        # a step stopped midway may leave a group in a queue it was leaving: each queue keeps its own status only
        # (a group caught between two queues is one of `opened`, dropped below)
        self._running = [g for g in self._running if g.status is RUNNING]
        self._swapped = [g for g in self._swapped if g.status is SWAPPED]
        self._waiting.keep(lambda g: g.status is WAITING)
        touched = touched_requests(self.kv, plan, opened, allocation, self._running, self._groups)
        if touched and not reported:
            uncache_unwritten(self.kv, plan, allocation)
        self._drop(touched)
        return touched

    def finish_sampled(self, groups) -> list[int]:
        """Finish the sequences of these running groups that have sampled their output_len tokens, freeing their
        memory at once (finish_step's rule); returns the requests now finished. (For the fast plane, which adds the
        tokens of the decode steps it applies to the sequences itself.)"""
        return self._finish(groups)

    def _finish(self, groups, done_ids: AbstractSet[int] = frozenset(), beams_done: AbstractSet[int] = frozenset()):
        """Finish the sequences of `groups` that are done (named in done_ids, or output_len tokens sampled; all
        beams of a beam search together), freeing their memory at once. Returns the requests now finished."""
        finished: list[int] = []
        for group in groups:
            live = group.live
            ending = [s for s in live if s.num_generated >= s.output_len or s.seq_id in done_ids]
            if group.is_beam_search and (ending or group.request_id in beams_done):
                ending = list(live)
            if not ending:
                continue
            for seq in ending:
                self.kv.free(seq.seq_id)
            group.finish(ending)
            if group.is_finished:
                group.status = FINISHED
                running = self._running  # sorted by arrival: found by bisection, by identity (no field comparisons)
                at = bisect.bisect_left(running, group.queue_key, key=_queue_key)
                if at == len(running) or running[at] is not group:
                    raise RuntimeError(f"request {group.request_id}: finished but not in the running queue")
                del running[at]
                finished.append(group.request_id)
        return finished

    def _reselect_beams(self, request_id: int, parents: list[int]) -> list[int]:
        group = self.group(request_id)
        for dropped in reselect_beams(self.kv, group, parents, lambda n: self._new_seq(group.request, n)):
            del self._seqs[dropped.seq_id]
        return [s.seq_id for s in group.seqs]
