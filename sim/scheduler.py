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
requests are preempted (a pluggable victim policy, sim/preemption.py; default: the latest arrival), all
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
jumped over while it is on (sim/fastforward.py and decode epochs assume one token per step).

The same object serves the simulator and the reference engine: `schedule()` returns a `StepPlan` whose blocks
are already allocated; the executor runs it and reports a `StepOutcome` to `finish_step()`. The scheduler
touches memory only through the KV contract (sim/kv/base.py) and never knows the policy behind it.

The class reads top to bottom: requests in and out; what executors and metrics may read; one iteration
(`schedule`); the executor's report (`finish_step`, `abandon_step`); and last the runs of plain decode steps
that the simulator's fast-forward (sim/fastforward.py) applies at once.
"""
from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field

from .kv.base import KVManager, NewSequence
from .plan import ScheduledSeq, StepOutcome, StepPlan, StepResult
from .preemption import latest_arrival, victim_policy
from .config import SchedulerConfig
from .request import Request
from .sequence import Sequence, SequenceGroup, SequenceStatus, queue_copies, reselect_beams, split_budget

__all__ = ["Scheduler", "SchedulerConfig", "StepResult"]

WAITING = SequenceStatus.WAITING
RUNNING = SequenceStatus.RUNNING
SWAPPED = SequenceStatus.SWAPPED
FINISHED = SequenceStatus.FINISHED


class Scheduler:
    """FCFS iteration-level scheduler over one KV manager. Queues: waiting (deque), running and swapped
    (lists kept in arrival order). Sequence ids come from a counter inside the instance. What executors and
    metrics may read (queue lengths, ids, a sequence's progress) is in the views section; the runs of plain
    decode steps the simulator jumps over, in the last section."""

    def __init__(self, kv: KVManager, config: SchedulerConfig | None = None, *, draft_len=None) -> None:
        """`draft_len(request_id, seq_id)`: with speculative decoding, how many draft tokens the executor has for the
        sequence now (the engine's n-gram draft may find none); None: num_speculative_tokens for every sequence (the
        simulator's acceptance model, which drafts anything)."""
        self.kv = kv
        self.config = config if config is not None else SchedulerConfig()
        self._draft_len = draft_len
        self._victim = victim_policy(self.config.victim)
        self._by_priority = self.config.scheduling_policy == "priority"
        self._num_drafts = self.config.num_speculative_tokens  # k: draft tokens per decode and step (0: off)
        self._waiting: deque[SequenceGroup] = deque()
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
        self._open_allocation: tuple[SequenceGroup, tuple[Sequence, ...], list[NewSequence] | None] | None = None
        self._reported: StepPlan | None = None  # the plan finish_step() was given: its K/V was written
        # NOTE: the last plain_decode_seqs() answer (its sequences, their ids by request, the fewest steps any has
        # left), kept until the next call that changes the scheduler (each of them clears it), so that
        # advance_decodes right after it does not ask again: a speed-up only.
        self._plain_decodes_cache: tuple[list[Sequence], list[list[int]], int] | None = None
        self._epoch: _DecodeEpoch | None = None  # the decode epoch open (open_decode_epoch), if any
        self._joined: list[int] = []  # requests that joined an epoch since joined_requests() last asked
        self._refused: tuple | None = None  # (head group, members, free slots) when decode_epoch_run last refused it

    # --- requests in and out ---------------------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        """Queue a request; ValueError "request <id>: <why>" if it can never be served (check_request)."""
        rid = request.request_id
        self._plain_decodes_cache = None
        if rid in self._groups:
            raise ValueError(f"request {rid} was already added (request ids must be unique)")
        problem = self.check_request(request)
        if problem is not None:
            raise ValueError(f"request {rid}: {problem}")
        seqs = [self._new_seq(request, 0) for _ in range(request.num_seqs)]
        key = (request.priority, self._num_added) if self._by_priority else self._num_added
        group = SequenceGroup(request, seqs, arrival_order=self._num_added, queue_key=key)
        self._num_added += 1
        self._groups[rid] = group
        if self._by_priority:
            bisect.insort(self._waiting, group, key=_queue_key)
        else:
            self._waiting.append(group)

    def check_request(self, request: Request) -> str | None:
        """Why `request` could never be served, in one line (a prompt over the token budget without chunked prefill,
        more sequences than max_num_seqs, a final length the whole pool cannot hold), else None. Changes nothing:
        a caller that knows the request by another name words the refusal itself."""
        cfg = self.config
        if not cfg.chunked and request.prompt_len > cfg.max_num_batched_tokens:
            return (f"prompt_len {request.prompt_len} is over max_num_batched_tokens "
                    f"(allowed: <= {cfg.max_num_batched_tokens}, or any length with chunked prefill)")  # fmt: skip
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
        self._close_epoch()
        group = self._group(request_id)
        if group.status is FINISHED:
            return
        self._plain_decodes_cache = None
        if group.status is WAITING:
            self._waiting.remove(group)
            group.set_status(FINISHED)
            group.pending_copies.clear()
        else:
            self._drop([request_id])

    def _drop(self, request_ids) -> None:
        """Finish these requests whatever state a failed step left them in: out of every queue they are in, every
        sequence of theirs the KV manager holds freed (a beam forked before its group listed it, one already freed
        left alone). Asks the manager only for its live sequences and to free them."""
        rids = set(request_ids)
        for queue in (self._waiting, self._running, self._swapped):
            kept = [g for g in queue if g.request_id not in rids]
            if len(kept) != len(queue):
                queue.clear()
                queue.extend(kept)
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
        epoch = self._epoch
        if epoch is not None:  # the running groups: its members and the groups admitted to join it
            return epoch.num_seqs + sum(len(g.live) for g in epoch.joining if g.status is RUNNING)
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
        return [s.seq_id for s in self._group(request_id).seqs]

    def request_of(self, seq_id: int) -> int | None:
        """The request sequence `seq_id` belongs to; None if the scheduler holds no such sequence (a dropped beam)."""
        seq = self._seqs.get(seq_id)
        return None if seq is None else seq.request_id

    def num_generated(self, seq_id: int) -> int:
        return self._seqs[seq_id].num_generated + self._lag(seq_id)

    def num_computed_tokens(self, seq_id: int) -> int:
        return self._seqs[seq_id].num_computed_tokens + self._lag(seq_id)

    def _lag(self, seq_id: int) -> int:
        """What an open decode epoch has not yet added to a member's counts (0 for anyone else)."""
        epoch = self._epoch
        return epoch.steps if epoch is not None and seq_id in epoch.kv.members else 0

    def group_status(self, request_id: int) -> SequenceStatus:
        return self._group(request_id).status

    def is_finished(self, request_id: int) -> bool:
        return self._group(request_id).status is FINISHED

    def request(self, request_id: int) -> Request:
        return self._group(request_id).request

    def _group(self, request_id: int) -> SequenceGroup:
        if request_id not in self._groups:
            raise KeyError(f"unknown request {request_id}")
        return self._groups[request_id]

    # --- one iteration -------------------------------------------------------------------------------
    def schedule(self) -> StepPlan:
        """Decide the next iteration.

        v1: (1) running groups, FCFS, each get the tokens they miss (a decode: 1 per sequence; a prompt: a
        chunk) while the budget lasts; a group that cannot get memory preempts victims until it can, or is
        itself the victim. (2) If nothing was preempted, swapped groups come back FCFS while they fit, then
        (3) waiting groups are admitted FCFS while they fit in memory, max_num_seqs and the budget.
        v0 / static: (3) first, with whole prompts; if anything was admitted the step is prefill-only;
        otherwise (1) without a budget, then (2).
        An open decode epoch stays open through a v0 step that admits (the running groups are not touched; the
        admitted ones join it after their prompts, decode_epoch_run), and through a v1 step whose running groups are
        all members with memory for their tokens: their decodes are then the epoch's next step (not listed in the
        plan: pending_epoch_step gives their number and reads, for the executor's price), then admissions as usual.
        Any other step closes it first.
        """
        epoch_step = self._epoch is not None and self.config.mode == "v1" and self._epoch_may_step()
        if not epoch_step and (self.config.mode == "v1" or not self._may_admit()):
            self._close_epoch()
        if self._outstanding is not None and not self._outstanding.is_empty:
            raise RuntimeError("schedule() called twice: expected finish_step() for the previous plan first")
        self._plain_decodes_cache, self._reported = None, None
        # NOTE: fork copies from the last finish_step go first. Only contiguous forks copy, and contiguous
        # groups are never swapped, so no swap-out of this step can read a block before its copy lands.
        # (with an epoch open no running group has copies waiting: a fork or new beams closed it; skip the scan)
        copying = self._running if self._epoch is None else ()
        plan = StepPlan(blocks_to_copy=[c for g in copying for c in g.pending_copies])
        self._outstanding = plan  # from here on: should this raise midway, abandon_step() undoes what it did
        for group in copying:
            group.pending_copies.clear()
        budget = self.config.max_num_batched_tokens
        if epoch_step:  # v1: the running groups (all members) decode as the epoch's next step, then admissions
            budget = self._take_epoch_step(budget)
            if self._may_admit():
                self._admit_waiting(plan, budget, first=False)
        elif self.config.mode == "v1":
            budget = self._schedule_running(plan, budget)
            if not plan.preempted:
                budget = self._swap_in(plan, budget)
                if self._may_admit():
                    self._admit_waiting(plan, budget)
        elif not (self._may_admit() and self._admit_waiting(plan, budget)):
            self._close_epoch()  # nothing admitted: this step decodes every running group
            self._schedule_running(plan, None)
            if not plan.preempted:
                self._swap_in(plan, None)
        return plan

    def _may_admit(self) -> bool:
        # NOTE: nothing is admitted while a group waits in swap space (it would be starved). Static batching
        # (FasterTransformer) admits a new batch only once the previous one has left entirely: a finished
        # request frees its memory at once, but its place stays idle until the whole batch is done (the
        # baseline's cost). A batch member preempted by recompute waits at the front and opens the next batch.
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
            drafts = self._drafts(group, seqs, counts, budget) if self._num_drafts else None
            while True:  # NOTE: the transaction's brackets (see abandon_step), inline: this loop runs every step
                self._open_allocation = (group, seqs, None)
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

    def _drafts(self, group: SequenceGroup, seqs, counts: list[int], budget: int | None) -> list[int] | None:
        """Draft tokens each sequence of the group verifies this step (speculative decoding), or None for none: k for a
        plain decode (one token fed: the last sampled one), fewer where its output would end first (it samples at most
        1 + its drafts, never past output_len: its K/V then stays within its final length), past max_model_len, or
        where the budget left after the group's own tokens runs out. None for beam search (its beams branch each
        step)."""
        if group.is_beam_search:
            return None
        k, max_len = self._num_drafts, self.config.max_model_len
        left = None if budget is None else budget - sum(counts)
        drafts = []
        for seq, count in zip(seqs, counts):
            d = 0
            if count == 1 and not seq.prefilling and seq.num_computed_tokens == seq.num_tokens - 1:
                d = min(k, seq.output_len - seq.num_generated - 1)
                if max_len:
                    d = min(d, max_len - seq.num_tokens)
                if d > 0 and self._draft_len is not None:
                    d = min(d, self._draft_len(seq.request_id, seq.seq_id))
                if left is not None:
                    d = min(d, left)
                    left -= max(d, 0)
            drafts.append(max(d, 0))
        return drafts if any(drafts) else None

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
        self._refused = None  # (the group may come back to the head in another state)
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
            if self._by_priority:
                bisect.insort(self._waiting, group, key=_queue_key)
            else:  # (every waiting group arrived after every running one)
                self._waiting.appendleft(group)  # latest-arrival victims go latest-first: the earliest ends up in front
        self._open.discard(group.request_id)

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
            self._open_allocation = (group, seqs, None)
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

    def _admission(self, group: SequenceGroup, budget: int, first: bool) -> tuple[list[NewSequence], list[int]] | None:
        """What admitting `group` now would ask of the KV manager (specs, tokens per sequence), or None if the
        budget does not allow it. NOTE: `first` (nothing fed yet this step) lets a group over the budget run
        alone: without chunking, a recompute (prompt + generated tokens) may exceed it."""
        new = [self._new_spec(group, s) for s in group.kv_seqs]
        needs = [s.num_tokens - spec.num_cached_tokens for s, spec in zip(group.kv_seqs, new)]
        if sum(needs) <= budget or (first and not self.config.chunked):
            return new, needs
        if not self.config.chunked or budget <= 0:
            return None
        counts = split_budget(group, needs, budget)
        return (new, counts) if any(counts) else None

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

    def _admit_waiting(self, plan: StepPlan, budget: int, first: bool = True) -> bool:
        """`first` False: the step feeds tokens the plan does not list (a decode epoch's step)."""
        num_seqs, admitted = self.num_running_seqs, False
        while self._waiting:
            group = self._waiting[0]
            if num_seqs + group.num_seqs > self.config.max_num_seqs:
                break
            asked = self._admission(group, budget, first=first and plan.num_batched_tokens == 0)
            if asked is None:
                break
            new, counts = asked
            seqs = group.kv_seqs
            self._open_allocation = (group, seqs, new)
            allocation = self.kv.allocate_slots([s.seq_id for s in seqs], counts, new)
            if allocation is None:  # nothing changed
                self._open_allocation = None
                break
            self._waiting.popleft()
            group.set_status(RUNNING)
            bisect.insort(self._running, group, key=_queue_key)
            if self._epoch is not None:
                self._epoch.joining.append(group)
            for seq, spec in zip(seqs, new):
                seq.num_computed_tokens = spec.num_cached_tokens
            self._add_entries(plan, group, seqs, counts, allocation.copies)
            self._open_allocation = None
            num_seqs += group.num_seqs
            budget -= sum(counts)
            admitted = True
        return admitted

    def _add_entries(self, plan: StepPlan, group: SequenceGroup, seqs, counts: list[int], copies,
                     drafts: list[int] | None = None) -> None:  # fmt: skip
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
            _check_accepted(plan, outcome)
        # the members' decodes of a v1 step taken by the epoch: sampled now (some finish), then the plan's entries
        epoch_finished = self._epoch_steps_done(1) if self._epoch is not None and self._epoch.pending else []
        if self._epoch is not None and (outcome.beam_parents or any(not e.num_new_tokens for e in plan.entries)):
            self._close_epoch()  # a fork or beams change sharing; an open epoch's step is otherwise an admission
        self._outstanding, self._reported = None, plan
        self._plain_decodes_cache = None
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
        result = StepResult(epoch_finished + self._finish(touched.values(), outcome.finished_seq_ids, beams_done),
                            new_beams)  # fmt: skip
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
        epoch = self._epoch
        pending = epoch is not None and epoch.pending  # a v1 step the epoch took: its members failed too
        members = {s.request_id for seqs in epoch.by_last.values() for s in seqs} if pending else set()
        if epoch is not None:
            epoch.pending = False  # (its sequences hold the step's slots, as stepping's allocation left them)
        self._close_epoch()
        self._open.update(members)
        if plan is None or plan is self._outstanding:
            plan, self._outstanding = self._outstanding, None
        self._plain_decodes_cache = None
        opened, self._open = self._open, set()
        allocation, self._open_allocation = self._open_allocation, None
        if allocation is not None:
            opened.add(allocation[0].request_id)
        reported = plan is not None and plan is self._reported
        self._reported = None
        # a step stopped midway may leave a group in a queue it was leaving: each queue keeps its own status only
        # (a group caught between two queues is one of `opened`, dropped below)
        self._running = [g for g in self._running if g.status is RUNNING]
        self._swapped = [g for g in self._swapped if g.status is SWAPPED]
        self._waiting = deque(g for g in self._waiting if g.status is WAITING)
        if plan is None and not opened:
            return []
        held = set(self.kv.seq_ids)
        touched = dict.fromkeys(plan.request_ids() if plan is not None else ())
        if plan is not None:
            touched.update(dict.fromkeys(r for r in plan.preempted if self._groups[r].status is SWAPPED))
            written = {dst for _, dst in plan.blocks_to_copy}
            for group in self._running if written else ():
                if any(b in written for s in group.kv_seqs if s.seq_id in held for b in self.kv.block_table(s.seq_id)):
                    touched[group.request_id] = None
        touched.update(dict.fromkeys(sorted(opened)))
        if not reported:
            self._uncache_unwritten(plan, allocation, held)
        self._drop(touched)
        return list(touched)

    def _uncache_unwritten(self, plan: StepPlan | None, allocation, held: set[int]) -> None:
        """Unregister the blocks a failed plan (and the allocation in flight) were to write from the prefix cache:
        from each sequence's first position the step computes (those before it were written by earlier steps).
        `held`: the sequences the manager holds."""
        bs = self.kv.block_size
        starts = [(e.seq_id, e.num_computed_tokens) for e in (plan.entries if plan else ())
                  if e.num_new_tokens]  # fmt: skip
        if allocation is not None:
            _, seqs, new = allocation
            starts += [(s.seq_id, s.num_computed_tokens if new is None else spec.num_cached_tokens)
                       for s, spec in zip(seqs, new or seqs)]  # fmt: skip
        for seq_id, start in starts:
            if seq_id in held:  # on the GPU: the plan's entries and an allocation are never swapped out
                self.kv.uncache(self.kv.block_table(seq_id)[start // bs:])

    def _finish(self, groups, done_ids: set[int] = frozenset(), beams_done: set[int] = frozenset()) -> list[int]:
        """Finish the sequences of `groups` that are done (named in done_ids, or output_len tokens sampled; all
        beams of a beam search together), freeing their memory at once. Returns the requests now finished."""
        finished: list[int] = []
        for group in groups:
            live = group.live
            ending = [s for s in live if s.num_generated >= s.output_len or s.seq_id in done_ids]
            if group.is_beam_search and (ending or group.request_id in beams_done):
                ending = live
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
        group = self._group(request_id)
        for dropped in reselect_beams(self.kv, group, parents, lambda n: self._new_seq(group.request, n)):
            del self._seqs[dropped.seq_id]
        return [s.seq_id for s in group.seqs]

    # --- runs of plain decode steps ------------------------------------------------------------------
    # When the next steps are certain to decode exactly the running sequences, the simulator's fast-forward
    # (sim/fastforward.py) applies many of them at once, with exactly the results of stepping.
    def plain_decode_seqs(self) -> list[Sequence] | None:
        """The running sequences, if the next schedule() is certain to be a plain decode of exactly them and
        stays so while memory lasts and none finishes: every running group decodes all its sequences (no prompt
        chunk, beam search or copy waiting), nothing is swapped out, the budget holds them all, and the first
        waiting group could not be admitted now (advance_decodes stops a run before free memory grows). Else None."""
        self._close_epoch()
        if self._outstanding is not None or not self._running or self._swapped or self._num_drafts:
            return None  # (speculative decoding: a step samples a random number of tokens, no run is plain)
        seqs: list[Sequence] = []
        seq_groups: list[list[int]] = []  # the sequence ids of each request, as a step allocates them
        steps_left = None  # the fewest tokens a sequence has still to sample
        for group in self._running:
            if group.is_beam_search or group.pending_copies or not group.forked:
                return None
            ids = []
            for seq in group.live:
                if seq.prefilling or seq.num_computed_tokens != seq.num_tokens - 1:
                    return None
                seqs.append(seq)
                ids.append(seq.seq_id)
                left = seq.output_len - seq.num_generated
                if steps_left is None or left < steps_left:
                    steps_left = left
            seq_groups.append(ids)
        budget = self.config.max_num_batched_tokens
        if self.config.mode == "v1":
            budget -= len(seqs)
            if budget < 0:
                return None
        if self._waiting and self._may_admit() and self._head_may_be_admitted(
                budget, len(seqs), nothing_fed=self.config.mode != "v1"):
            return None
        self._plain_decodes_cache = (seqs, seq_groups, steps_left)
        return seqs

    def can_admit_head(self) -> bool:
        """Would the first waiting group be admitted if a step started now with the whole budget (max_num_seqs,
        budget and memory, watermark included)? False when nothing waits or admission is closed."""
        if not self._waiting or not self._may_admit():
            return False
        return self._head_may_be_admitted(self.config.max_num_batched_tokens, self.num_running_seqs, nothing_fed=True)

    def _head_may_be_admitted(self, budget: int, num_running_seqs: int, nothing_fed: bool) -> bool:
        """Would the first waiting group be admitted with `budget` tokens left and `num_running_seqs` running?
        `nothing_fed`: the step admits before it feeds anything (v0's prefill-only steps, or an observer asking of a
        fresh step), so the answer is exact; else (v1, after the decodes) a guess that errs towards yes."""
        group = self._waiting[0]
        if num_running_seqs + group.num_seqs > self.config.max_num_seqs:
            return False
        asked = self._admission(group, budget, first=nothing_fed)
        if asked is None:
            return False
        new, counts = asked
        # NOTE: with chunking, losing a prefix-cache hit to eviction can SHRINK the chunk's memory need, so a
        # blocked group with hits might fit later in the run: treat it as admissible (no run; always safe).
        if not nothing_fed and self.config.chunked and any(spec.num_cached_tokens for spec in new):
            return True
        return self.kv.can_allocate_slots([s.seq_id for s in group.kv_seqs], counts, new)

    def advance_decodes(self, max_steps: int) -> tuple[list[tuple[int, ...]], list[int]]:
        """Apply as many plain decode steps as memory allows, at most `max_steps`, at once: the state as many
        rounds of schedule() and finish_step() with nothing reported would leave, with the same block ids. No
        sequence may reach its output_len before step `max_steps`; those that reach it in the last step applied
        finish then (the finish rule of finish_step). Returns the pool's five raw slot counts during each step
        applied (the KV manager's advance_decodes; none if memory allows no step) and the requests finished."""
        self._close_epoch()
        if self._plain_decodes_cache is None:
            self.plain_decode_seqs()
        cached, self._plain_decodes_cache = self._plain_decodes_cache, None
        if cached is None or not 1 <= max_steps <= cached[2]:
            raise ValueError(f"advance_decodes({max_steps}): expected a plain decode state and no sequence finishing "
                             "before the last step")  # fmt: skip
        # a step allocates request by request: the same calls, so that a pool freeing blocks mid-run (hybrid) finds
        # the same room and hands out the block ids stepping would (the groups: built by plain_decode_seqs)
        seqs, seq_groups, _ = cached
        # a waiting group refused now stays refused while free memory does not grow (in a paged pool it only
        # shrinks during a run; a hybrid pool's sliding groups give blocks back): the run stops before it grows
        waiting = bool(self._waiting) and self._may_admit()
        num_steps = self.kv.max_decode_steps(seq_groups, max_steps, waiting)
        if num_steps < 1:
            return [], []
        counts = self.kv.advance_decodes(seq_groups, num_steps, checked=True)
        for seq in seqs:
            seq.num_generated += num_steps
            seq.num_computed_tokens += num_steps
        if num_steps < cached[2]:  # none reached its output_len
            return counts, []
        ending = {s.request_id: self._groups[s.request_id] for s in seqs if s.num_generated >= s.output_len}
        return counts, self._finish(ending.values())

    # --- decode epochs: the same runs, lazily ----------------------------------------------------------
    # Where the KV manager can (the paged one without prefix caching), the simulator keeps the running sequences in a
    # decode epoch: run after run of plain decode steps applied without touching every sequence each run (their
    # counts are brought up to date when one finishes, or when anything else happens: the epoch then closes). An
    # arrival does not close it (it only queues the request; whether it may be admitted is asked before each run).
    def open_decode_epoch(self, on_close=None) -> bool | None:
        """Open a decode epoch if the next steps are plain decodes of the running sequences (plain_decode_seqs) and
        the KV manager has the lazy form: True if one is open; False if they are plain decodes but the manager has
        no epoch for them now (run them with advance_decodes); None if they are not. `on_close(steps)`: called when
        it closes, with the steps it applied (the loop then books what it kept lazy too). Every other call closes it
        first, except add_request, the read-only queue views and the epoch's own calls below."""
        if self._epoch is not None:
            return True
        seqs = self.plain_decode_seqs()
        if seqs is None:
            return None
        _, seq_groups, _ = self._plain_decodes_cache
        lasts = [s.output_len - s.num_generated - 1 for s in seqs]  # the epoch step that samples its last token
        keys = [(g.queue_key, j) for g in self._running for j in range(len(g.live))]  # plan order
        kv_epoch = self.kv.open_decode_epoch(seq_groups, lasts, keys)
        if kv_epoch is None:
            return False
        self._plain_decodes_cache = None
        by_last: dict[int, list[Sequence]] = {}
        for seq, last in zip(seqs, lasts):
            by_last.setdefault(last, []).append(seq)
        self._epoch = _DecodeEpoch(kv_epoch, by_last, sorted(by_last), sum(s.num_computed_tokens for s in seqs),
                                   len(seqs), on_close)  # fmt: skip
        return True

    @property
    def decode_epoch_open(self) -> bool:
        return self._epoch is not None

    def joined_requests(self) -> list[int]:
        """The requests whose sequences joined a decode epoch since the last call (their counts lazy from then; the
        epoch may have closed since, when they left it in the same run)."""
        joined, self._joined = self._joined, []
        return joined

    def decode_epoch_run(self, admission: bool = True) -> tuple[int, int, int, bool] | None:
        """The open epoch's next run: (sequences, the K/V tokens they hold, steps until the first of them samples its
        last token, whether a request waits that no step of the run admits), or None when no epoch is open or the
        next step would admit the first waiting request (plain_decode_seqs' question, for the members now; not asked
        with `admission` False: a step that preempts admits nothing). With a request waiting that is refused (or
        admission closed), a request arriving during the run queues behind it: it cannot change the run's steps
        (admission is FCFS, and free memory only shrinks in a run). Not under priority scheduling: an arrival may
        head the queue."""
        epoch = self._epoch
        if epoch is None:
            return None
        if epoch.joining and not self._join_epoch(epoch):
            self._close_epoch()
            return None
        blocked = bool(self._waiting) and not self._by_priority
        if admission and self._waiting and self._may_admit():
            # NOTE: a head refused stays refused while it stays the head, the members the same and free memory does
            # not grow (the question is monotone in free memory: no prefix cache in an epoch); asked once per such
            # stretch instead of before every run (free memory shrinks during runs and grows when a member leaves)
            head, free, refused = self._waiting[0], epoch.kv.counts[4], self._refused
            if refused is None or refused[0] is not head or refused[1] != epoch.num_seqs or free > refused[2]:
                budget = self.config.max_num_batched_tokens - (epoch.num_seqs if self.config.mode == "v1" else 0)
                if self._head_may_be_admitted(budget, epoch.num_seqs, nothing_fed=self.config.mode != "v1"):
                    return None
                self._refused = (head, epoch.num_seqs, free)
        return epoch.num_seqs, epoch.context, epoch.lasts[epoch.next_last] - epoch.steps + 1, blocked

    def preempt_in_decode_epoch(self) -> list[int] | None:
        """The open epoch's next step, when memory runs out in it (advance_decode_epoch applies none): preempt as
        schedule() would, inside the epoch. The step's groups take their blocks in plan order, and a group that finds
        too few preempts the latest arrival still running (itself last) until it can, by recompute; the victims leave
        the epoch and wait in front. Returns them (latest first); the survivors' blocks for the step are open and
        advance_decode_epoch(1) takes it (with none left, the epoch has closed). None where the epoch cannot do
        this (swap preemption, another victim policy, memory for the step after all): schedule() then does it."""
        epoch = self._epoch
        if (epoch is None or self.config.preemption != "recompute" or self._victim is not latest_arrival
                or epoch.kv.max_steps(1)):
            return None
        plan = StepPlan()  # collects the victims (_preempt's record)
        seqs, groups, running = self._seqs, self._groups, self._running
        opening = epoch.kv.opening()
        i = 0
        while i < len(opening):
            group = groups[seqs[opening[i]].request_id]
            n = 1  # a group's members are adjacent in plan order
            while i + n < len(opening) and seqs[opening[i + n]].request_id == group.request_id:
                n += 1
            i += n
            if group.status is not RUNNING:  # preempted earlier in this step
                continue
            while not epoch.kv.open_ahead(n):
                victim = running.pop()  # the latest arrival among the groups not yet served in this step, or this one
                self._leave_epoch(epoch, victim)
                self._preempt(victim, plan)
                if victim is group:
                    break
        if not epoch.num_seqs:
            self._close_epoch()
        return plan.preempted

    def _leave_epoch(self, epoch: _DecodeEpoch, group: SequenceGroup) -> None:
        """The group's sequences leave the epoch early (preempted): counts made current, out of its by_last lists."""
        steps = epoch.steps
        for seq in group.live:
            last = seq.output_len - seq.num_generated - 1  # its last step (num_generated lazy): not passed yet
            same = epoch.by_last[last]
            del same[next(i for i, s in enumerate(same) if s is seq)]  # by identity (siblings' states may be equal)
            if not same:  # nobody leaves then any more: no run stops there (it stands after next_last)
                del epoch.by_last[last], epoch.lasts[bisect.bisect_left(epoch.lasts, last, epoch.next_last)]
            seq.num_generated += steps
            seq.num_computed_tokens += steps
            epoch.context -= seq.num_computed_tokens
        epoch.num_seqs -= len(group.live)

    def _join_epoch(self, epoch: _DecodeEpoch) -> bool:
        """The groups admitted while the epoch was open join it, if each now decodes plainly (as plain_decode_seqs
        asks) and the KV manager takes its sequences; False (the caller closes the epoch) otherwise."""
        joining, epoch.joining = epoch.joining, []
        steps = epoch.steps
        for group in joining:
            if group.status is not RUNNING:  # finished with its prompt (a one-token output)
                continue
            if group.is_beam_search or group.pending_copies or not group.forked:
                return False
            seqs = group.live
            if any(s.prefilling or s.num_computed_tokens != s.num_tokens - 1 for s in seqs):
                return False
            if self.config.mode == "v1" and epoch.num_seqs + len(seqs) > self.config.max_num_batched_tokens:
                return False  # the budget no longer holds a token for every member
            lasts = [steps + s.output_len - s.num_generated - 1 for s in seqs]
            keys = [(group.queue_key, j) for j in range(len(seqs))]
            if not self.kv.join_decode_epoch([s.seq_id for s in seqs], lasts, keys):
                return False
            for seq, last in zip(seqs, lasts):
                if last not in epoch.by_last:
                    bisect.insort(epoch.lasts, last)  # after every last already passed: last >= steps
                epoch.by_last.setdefault(last, []).append(seq)
                epoch.context += seq.num_computed_tokens
                seq.num_generated -= steps  # lazy from now on: the epoch adds its steps when the sequence leaves
                seq.num_computed_tokens -= steps
            epoch.num_seqs += len(seqs)
            self._joined.append(group.request_id)
        return True

    def advance_decode_epoch(self, max_steps: int) -> tuple[list[tuple[int, ...]], list[int]]:
        """advance_decodes for the open epoch (at most `max_steps`, never past the first member's last token): the
        pool's counts during each step applied (none if memory allows no step) and the requests finished."""
        epoch = self._epoch
        if epoch is None or max_steps < 1:
            raise ValueError(f"advance_decode_epoch({max_steps}): expected an open epoch and max_steps >= 1")
        last = epoch.lasts[epoch.next_last]
        num_steps = epoch.kv.max_steps(min(max_steps, last - epoch.steps + 1))
        if num_steps < 1:
            return [], []
        return epoch.kv.advance(num_steps), self._epoch_steps_done(num_steps)

    def _epoch_may_step(self) -> bool:
        """Can the open epoch take the next v1 step's decodes (schedule)? Its admitted groups joined, every running
        group a member (nothing swapped), the budget and memory enough for one token each."""
        epoch = self._epoch
        if epoch.joining and not self._join_epoch(epoch):
            return False
        return (not self._swapped and epoch.num_seqs <= self.config.max_num_batched_tokens
                and epoch.kv.max_steps(1) >= 1)  # fmt: skip

    def _take_epoch_step(self, budget: int) -> int:
        """The members' decodes of this step: their blocks now, in plan order (before any admission's); their counts
        when the step is reported (finish_step). Returns the budget left."""
        epoch = self._epoch
        epoch.kv.advance(1)
        epoch.pending = True
        return budget - epoch.num_seqs

    @property
    def pending_epoch_step(self) -> tuple[int, int] | None:
        """The decodes a decode epoch takes in the step schedule() just planned, not listed in the plan: (sequences,
        the K/V they read: what they hold plus the token each feeds); None when it takes none."""
        epoch = self._epoch
        if epoch is None or not epoch.pending:
            return None
        return epoch.num_seqs, epoch.context + epoch.num_seqs

    def _epoch_steps_done(self, num_steps: int) -> list[int]:
        """The members sampled `num_steps` more tokens (applied in the pool already): those whose last token it was
        leave and finish (requests returned; all of a group's sequences leave together)."""
        epoch = self._epoch
        epoch.pending = False
        epoch.context += epoch.num_seqs * num_steps
        epoch.steps += num_steps
        last = epoch.lasts[epoch.next_last]
        if epoch.steps <= last:
            return []
        epoch.next_last += 1
        leaving = epoch.by_last.pop(last)
        for seq in leaving:  # made current, then finished (all of a group's sequences leave together)
            seq.num_generated += epoch.steps
            seq.num_computed_tokens += epoch.steps
            epoch.context -= seq.num_computed_tokens
        epoch.num_seqs -= len(leaving)
        finished = self._finish({s.request_id: self._groups[s.request_id] for s in leaving}.values())
        if not epoch.num_seqs:
            self._close_epoch()
        return finished

    def _close_epoch(self) -> None:
        epoch = self._epoch
        if epoch is None:
            return
        if epoch.pending:
            raise RuntimeError("a decode epoch's step is in flight: finish_step() (or abandon_step()) first")
        self._epoch = None
        for seqs in epoch.by_last.values():
            for seq in seqs:
                seq.num_generated += epoch.steps
                seq.num_computed_tokens += epoch.steps
        self.kv.close_decode_epoch()
        if epoch.on_close is not None:
            epoch.on_close(epoch.steps)


def _queue_key(group: SequenceGroup) -> int | tuple[int, int]:
    return group.queue_key


def _check_accepted(plan: StepPlan, outcome: StepOutcome) -> None:
    """ValueError unless the outcome names, for every verify entry of the plan, how many of its drafts were accepted
    (0 .. its drafts): checked before finish_step changes anything."""
    for entry in plan.decodes:
        if entry.num_draft_tokens:
            accepted = outcome.num_accepted.get(entry.seq_id)
            if not (isinstance(accepted, int) and 0 <= accepted <= entry.num_draft_tokens):
                raise ValueError(f"num_accepted[{entry.seq_id}]: expected 0 to {entry.num_draft_tokens} (the entry's "
                                 f"draft tokens), found {accepted!r}")  # fmt: skip


@dataclass(slots=True)
class _DecodeEpoch:
    """The scheduler's side of an open decode epoch: its members' counts are those at its start until they leave."""

    kv: object  # the KV manager's side (max_steps, advance)
    by_last: dict[int, list[Sequence]]  # the members still in, by the epoch step that samples their last token
    lasts: list[int]  # those steps, ascending
    context: int  # the K/V tokens the members hold now
    num_seqs: int  # members
    on_close: object  # the caller's on_close(steps), or None
    steps: int = 0  # steps applied
    next_last: int = 0  # index in lasts of the next members to leave
    joining: list = field(default_factory=list)  # groups admitted while it is open, to join before the next run
    pending: bool = False  # a v1 step's decodes taken (in the pool) and not yet reported (finish_step)
