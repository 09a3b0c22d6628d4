"""Decode epochs: runs of plain decode steps kept open across many runs, at a cost that does not grow with the batch.

Run by run (sim/fast/runs.py), each run still costs O(running sequences): the scan that proves the next steps plain,
every sequence's counts and table, each request's token times. A busy batch runs only a few steps between events
(arrivals, finishes), so where the pool allows it (a paged pool without prefix caching: `paged.opens_epochs`), the
fast plane keeps the running sequences in an *epoch* instead: runs follow one another, and arrivals come in, without
touching each sequence. The KV side (`paged.DecodeEpoch`) hands out the very block ids stepping would and carries
the pool's five counts; this side keeps the scheduler's: when each member samples its last token (so a finish costs
O(1)), how many there are and the K/V they hold.

While an epoch is open, the fast plane owns its members: their `num_generated` / `num_computed_tokens` (the
scheduler's `Sequence`) and `num_tokens` (the manager's record) stay as they were when each joined, and are made
current when the member leaves (it finishes, or is preempted) or the epoch closes. Every call into the core goes
through this object meanwhile (`schedule`, `finish_step`, `abandon_step`, the runs), and it brings the members
current before any core call that reads them; the core classes know nothing of epochs. The calls it makes are the
public ones docs/ARCHITECTURE.md lists under "The fast plane".

Steps an epoch stays open through (each the very step stepping takes):
- v0: a prefill-only step that admits (the running groups are not touched); the admitted groups join before the
  next run, once their prompts are computed.
- v1: a step whose running groups are all members with memory for their tokens: their decodes are the epoch's next
  step (their blocks opened first, in plan order), the plan lists only the admissions after them, and the step
  reaches the loop as an `EpochStep` (the members' decodes counted, not listed).
- a step that runs out of memory (`preempt`: recompute, latest-arrival victims): the groups opening a block take
  theirs in plan order, and a group that finds too few preempts the latest running group (itself last) first.
Any other step closes it first.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ..scheduling.plan import StepOutcome, StepPlan, StepResult
from ..scheduling.preemption import latest_arrival, victim_policy
from ..scheduling.sequence import SequenceStatus
from .paged import DecodeEpoch, opens_epochs, partly_filled_and_shared
from .runs import plain_decodes

RUNNING = SequenceStatus.RUNNING


@dataclass(slots=True)
class EpochStep(StepPlan):
    """A step whose plan (`plan`, the one the scheduler handed out) lists only admissions, while the epoch's members
    decode beside them: the counts an executor prices and records include the members' decodes."""

    plan: StepPlan | None = None  # the scheduler's plan (finish_step takes it)
    num_member_seqs: int = 0  # the members' decodes: one token each
    member_context: int = 0  # the K/V those decodes read: what the members hold plus the token each feeds

    @classmethod
    def of(cls, plan: StepPlan, num_member_seqs: int, member_context: int) -> EpochStep:
        return cls(plan.prefills, plan.decodes, plan.blocks_to_swap_out, plan.blocks_to_swap_in, plan.blocks_to_copy,
                   plan.preempted, plan.num_draft_tokens, plan, num_member_seqs, member_context)

    @property
    def num_decode_seqs(self) -> int:
        return len(self.decodes) + self.num_member_seqs

    @property
    def num_seqs(self) -> int:
        return len(self.prefills) + len(self.decodes) + self.num_member_seqs

    @property
    def num_batched_tokens(self) -> int:
        return StepPlan.num_batched_tokens.__get__(self) + self.num_member_seqs

    @property
    def num_context_tokens(self) -> int:
        return StepPlan.num_context_tokens.__get__(self) + self.member_context

    @property
    def is_empty(self) -> bool:
        return not self.num_member_seqs and StepPlan.is_empty.__get__(self)


class RunShape(NamedTuple):
    """The open epoch's next run, as `run_shape` sees it."""

    num_seqs: int  # the members
    context: int  # the K/V tokens they hold
    steps_left: int  # steps until the first of them samples its last token
    blocked: bool  # a request waits that no step of the run admits (an arrival queues behind it)


@dataclass(slots=True)
class _Epoch:
    """The scheduler's side of an open decode epoch: its members' counts are those at their joining until they leave."""

    kv: DecodeEpoch  # the KV side (max_steps, advance, open_ahead, leave, changed)
    by_last: dict[int, list]  # the members still in (Sequences), by the epoch step that samples their last token
    lasts: list[int]  # those steps, ascending
    joined_at: dict[int, int]  # member seq id -> the epoch's steps when it joined (its counts are those of then)
    context: int  # the K/V tokens the members hold now
    num_seqs: int  # members
    on_close: Any  # the caller's on_close(steps), or None
    steps: int = 0  # steps applied
    next_last: int = 0  # index in lasts of the next members to leave
    joining: list = field(default_factory=list)  # groups admitted while it is open, to join before the next run
    admitted: list = field(default_factory=list)  # (seq id, pool record) of the last step's admissions
    pending: bool = False  # a v1 step's decodes taken (in the pool) and not yet reported (finish_step)


class DecodeEpochs:
    """Decode epochs over one scheduler (and its KV manager): opened, run, joined, preempted in and closed here."""

    def __init__(self, scheduler) -> None:
        self.scheduler = scheduler
        self.kv = scheduler.kv
        self.possible = opens_epochs(self.kv)  # whether an epoch can ever open over this manager
        # an arrival cannot head the waiting queue (it queues behind a refused head): not under priority scheduling
        self.fcfs = scheduler.config.scheduling_policy != "priority"
        # the victims an epoch can choose itself: recompute, the latest arrival (else the scheduler's own step does)
        self.preempts = (scheduler.config.preemption == "recompute"
                         and victim_policy(scheduler.config.victim) is latest_arrival)
        self.epoch: _Epoch | None = None
        self.joined: list[int] = []  # requests that joined an epoch since joined_requests() last asked
        # NOTE: (head group, members, free slots, preemptions so far) when run_shape last found the head refused: it
        # stays refused while it stays the head, the members the same, free memory does not grow and nobody was
        # preempted (the question is monotone in free memory: no prefix cache in an epoch); asked once per such
        # stretch instead of before every run
        self.refused: tuple | None = None

    @property
    def is_open(self) -> bool:
        return self.epoch is not None

    def num_computed_tokens(self, seq_id: int) -> int:
        """A sequence's computed tokens now: the scheduler's count, plus the epoch's steps since a member joined (its
        record holds the count of then)."""
        count, epoch = self.scheduler.num_computed_tokens(seq_id), self.epoch
        if epoch is not None and seq_id in epoch.joined_at:
            count += epoch.steps - epoch.joined_at[seq_id]
        return count

    # --- opening and running ------------------------------------------------------------------------
    def open(self, on_close=None) -> bool | None:
        """Open an epoch if the next steps are plain decodes of the running sequences (runs.plain_decodes) and the
        pool can: True if one is open; False if they are plain decodes but no epoch can hold them now (run them run
        by run); None if they are not. `on_close(steps)`: called when it closes, with the steps it applied."""
        if self.epoch is not None:
            return True
        decodes = plain_decodes(self.scheduler)
        if decodes is None:
            return None
        if not self.possible:
            return False
        kv, seqs = self.kv, decodes.seqs
        states = [kv.seq_state(s.seq_id) for s in seqs]
        if partly_filled_and_shared(kv, states):
            return False
        lasts = [s.output_len - s.num_generated - 1 for s in seqs]  # the epoch step that samples its last token
        keys = [(g.queue_key, j) for g in decodes.groups for j in range(len(g.live))]  # plan order
        kv_epoch = DecodeEpoch(kv.allocator, kv.block_size, kv.breakdown().counts())
        for seq, state, last, key in zip(seqs, states, lasts, keys):
            kv_epoch.join(seq.seq_id, state, last, key)
        by_last: dict[int, list] = {}
        for seq, last in zip(seqs, lasts):
            by_last.setdefault(last, []).append(seq)
        self.epoch = _Epoch(kv_epoch, by_last, sorted(by_last), dict.fromkeys((s.seq_id for s in seqs), 0),
                            sum(s.num_computed_tokens for s in seqs), len(seqs), on_close)
        return True

    def joined_requests(self) -> list[int]:
        """The requests whose sequences joined an epoch since the last call (their counts held from then; the epoch
        may have closed since, when they left it in the same run)."""
        joined, self.joined = self.joined, []
        return joined

    def run_shape(self, admission: bool = True) -> RunShape | None:
        """The open epoch's next run, or None when no epoch is open or the next step would admit the first waiting
        request (plain_decodes' question, for the members now; not asked with `admission` False: a step that preempts
        admits nothing). With a request waiting that is refused (or admission closed), a request arriving during the
        run queues behind it: it cannot change the run's steps (admission is FCFS, and free memory only shrinks in a
        run). Not under priority scheduling: an arrival may head the queue."""
        epoch, sched = self.epoch, self.scheduler
        if epoch is None:
            return None
        if epoch.joining and not self._join(epoch):
            self.close()
            return None
        waiting, num_seqs = sched.waiting, epoch.num_seqs
        blocked = bool(waiting) and self.fcfs
        if admission and waiting and sched.may_admit():
            head, free, refused = waiting[0], epoch.kv.counts[4], self.refused
            if (refused is None or refused[0] is not head or refused[1] != num_seqs or free > refused[2]
                    or refused[3] != sched.num_preemptions):
                config = sched.config
                budget = config.max_num_batched_tokens - (num_seqs if config.mode == "v1" else 0)
                if sched.head_may_be_admitted(budget, num_seqs, nothing_fed=config.mode != "v1"):
                    return None
                self.refused = (head, num_seqs, free, sched.num_preemptions)
        return RunShape(num_seqs, epoch.context, epoch.lasts[epoch.next_last] - epoch.steps + 1, blocked)

    def room(self, max_steps: int) -> int:
        """How many of the open epoch's next steps (at most `max_steps`, never past the first member's last token)
        memory allows."""
        epoch = self.epoch
        return epoch.kv.max_steps(min(max_steps, epoch.lasts[epoch.next_last] - epoch.steps + 1))

    def advance(self, max_steps: int) -> tuple[list[tuple[int, ...]], list[int]]:
        """Apply the open epoch's next steps (at most `max_steps`, never past the first member's last token): the
        pool's counts during each step applied (none if memory allows no step) and the requests finished."""
        epoch = self.epoch
        if epoch is None or max_steps < 1:
            raise ValueError(f"advance({max_steps}): expected an open epoch and max_steps >= 1")
        last = epoch.lasts[epoch.next_last]
        num_steps = epoch.kv.max_steps(min(max_steps, last - epoch.steps + 1))
        if num_steps < 1:
            return [], []
        return epoch.kv.advance(num_steps), self._steps_done(num_steps)

    def preempt(self) -> list[int] | None:
        """The open epoch's next step, when memory runs out in it (advance applies none): preempt as schedule()
        would, inside the epoch. The step's groups take their blocks in plan order, and a group that finds too few
        preempts the latest arrival still running (itself last) until it can, by recompute; the victims leave the
        epoch and wait in front. Returns them (latest first); the survivors' blocks for the step are open and
        advance(1) takes it (with none left, the epoch has closed). None where the epoch cannot do this (swap
        preemption, another victim policy, memory for the step after all): schedule() then does it."""
        epoch, sched = self.epoch, self.scheduler
        if epoch is None or not self.preempts or epoch.kv.max_steps(1):
            return None
        plan = StepPlan()  # collects the victims (the scheduler's record of a preemption)
        running, request_of = sched.running, sched.request_of
        opening = epoch.kv.opening()
        i = 0
        while i < len(opening):
            group = sched.group(request_of(opening[i]))
            n = 1  # a group's members are adjacent in plan order
            while i + n < len(opening) and request_of(opening[i + n]) == group.request_id:
                n += 1
            i += n
            if group.status is not RUNNING:  # preempted earlier in this step
                continue
            while not epoch.kv.open_ahead(n):
                victim = running[-1]  # the latest arrival among the groups not yet served in this step, or this one
                states = self._leave(epoch, victim)
                sched.preempt(victim, plan)
                for state in states:  # its blocks went back to the pool
                    epoch.kv.changed(state, -1)
                if victim is group:
                    break
        if not epoch.num_seqs:
            self.close()
        return plan.preempted

    # --- the steps an open epoch takes part in --------------------------------------------------------
    def schedule(self) -> StepPlan:
        """The scheduler's schedule(), the epoch staying open where it can (see the module docstring): a v1 step it
        takes is returned as an `EpochStep`."""
        epoch, sched = self.epoch, self.scheduler
        if epoch is None:
            return sched.schedule()
        config = sched.config
        if config.mode == "v1":
            if not self._may_step(epoch):
                self.close()
                return sched.schedule()
            plan = sched.begin_step()
            epoch.kv.advance(1)  # the members' blocks first, in plan order; their tokens when the step is reported
            epoch.pending = True
            if sched.may_admit():
                sched.admit_waiting(plan, config.max_num_batched_tokens - epoch.num_seqs, epoch.num_seqs, first=False)
            self._admitted(epoch, plan)
            return EpochStep.of(plan, epoch.num_seqs, epoch.context + epoch.num_seqs)
        if not sched.may_admit():
            self.close()
            return sched.schedule()
        plan = sched.begin_step()
        joining = sum(len(g.live) for g in epoch.joining if g.status is RUNNING)
        if sched.admit_waiting(plan, config.max_num_batched_tokens, epoch.num_seqs + joining):
            self._admitted(epoch, plan)  # a prefill-only step: the running groups are not touched
            return plan
        self.close()  # nothing admitted (nothing changed): this step decodes every running group
        return sched.schedule()

    def finish_step(self, plan: StepPlan, outcome: StepOutcome) -> StepResult:
        """The scheduler's finish_step(): the members' decodes of a v1 step the epoch took are sampled first (some
        finish), then the plan's entries. A fork or new beams close the epoch (they change sharing)."""
        epoch, sched = self.epoch, self.scheduler
        if isinstance(plan, EpochStep):
            plan = plan.plan
        if epoch is None:
            return sched.finish_step(plan, outcome)
        finished = self._steps_done(1) if epoch.pending else []
        if self.epoch is not None and (outcome.beam_parents or any(not e.num_new_tokens for e in plan.entries)):
            self.close()
        epoch = self.epoch
        if epoch is None:
            result = sched.finish_step(plan, outcome)
        else:  # the step's admitted sequences that finish now free their blocks (a one-token output; a sample that ends
            # before its siblings, its request still running): the counts follow
            admitted, epoch.admitted = epoch.admitted, []
            result = sched.finish_step(plan, outcome)
            seq_state = self.kv.seq_state
            for seq_id, state in admitted:
                if seq_state(seq_id) is None:
                    epoch.kv.changed(state, -1)
        return StepResult(finished + result.finished_request_ids, result.new_beam_seq_ids)

    def abandon_step(self, plan: StepPlan | None = None) -> list[int]:
        """The scheduler's abandon_step(): after a v1 step the epoch took, its members were in the step too (their
        K/V may be half written), so they are aborted with the plan's requests."""
        epoch, sched = self.epoch, self.scheduler
        if isinstance(plan, EpochStep):
            plan = plan.plan
        members = []
        if epoch is not None and epoch.pending:
            members = [s.request_id for seqs in epoch.by_last.values() for s in seqs]
            epoch.pending = False  # (its sequences hold the step's slots, as stepping's allocation left them)
        self.close()
        touched = sched.abandon_step(plan)
        for request_id in dict.fromkeys(members):
            if request_id not in touched:
                sched.abort(request_id)
                touched.append(request_id)
        return touched

    def close(self) -> None:
        """Close the open epoch (if any): every member's counts current again, on both sides."""
        epoch = self.epoch
        if epoch is None:
            return
        if epoch.pending:
            raise RuntimeError("a decode epoch's step is in flight: finish_step() (or abandon_step()) first")
        self.epoch = None
        for seqs in epoch.by_last.values():
            for seq in seqs:
                self._make_current(epoch, seq)
        epoch.kv.close()
        if epoch.on_close is not None:
            epoch.on_close(epoch.steps)

    # --- members in and out ---------------------------------------------------------------------------
    def _may_step(self, epoch: _Epoch) -> bool:
        """Can the open epoch take the next v1 step's decodes? Its admitted groups joined, every running group a
        member (nothing swapped), the budget and memory enough for one token each."""
        if epoch.joining and not self._join(epoch):
            return False
        return (not self.scheduler.num_swapped and epoch.num_seqs <= self.scheduler.config.max_num_batched_tokens
                and epoch.kv.max_steps(1) >= 1)

    def _admitted(self, epoch: _Epoch, plan: StepPlan) -> None:
        """A step taken while the epoch is open admitted the plan's requests: they join before the next run, and the
        pool's counts take their new blocks."""
        group, seq_state, changed = self.scheduler.group, self.kv.seq_state, epoch.kv.changed
        admitted = epoch.admitted = []
        request_id = None
        for entry in plan.prefills:  # (only admissions: a group's entries are adjacent)
            if entry.request_id == request_id:
                continue
            request_id = entry.request_id
            epoch.joining.append(group(request_id))
            for seq in epoch.joining[-1].kv_seqs:
                state = seq_state(seq.seq_id)
                admitted.append((seq.seq_id, state))
                changed(state, +1)

    def _join(self, epoch: _Epoch) -> bool:
        """The groups admitted while the epoch was open join it, if each now decodes plainly (as plain_decodes asks)
        and the pool takes its sequences; False (the caller closes the epoch) otherwise."""
        joining, epoch.joining = epoch.joining, []
        steps, config, kv = epoch.steps, self.scheduler.config, self.kv
        for group in joining:
            if group.status is not RUNNING:  # finished with its prompt (a one-token output)
                continue
            if group.is_beam_search or group.pending_copies or not group.forked:
                return False
            seqs = group.live
            if any(s.prefilling or s.num_computed_tokens != s.num_tokens - 1 for s in seqs):
                return False
            if config.mode == "v1" and epoch.num_seqs + len(seqs) > config.max_num_batched_tokens:
                return False  # the budget no longer holds a token for every member
            states = [kv.seq_state(s.seq_id) for s in seqs]
            if partly_filled_and_shared(kv, states):
                return False
            lasts = [steps + s.output_len - s.num_generated - 1 for s in seqs]
            for j, (seq, state, last) in enumerate(zip(seqs, states, lasts)):
                epoch.kv.join(seq.seq_id, state, last, (group.queue_key, j))
                if last not in epoch.by_last:
                    bisect.insort(epoch.lasts, last)  # after every last already passed: last >= steps
                epoch.by_last.setdefault(last, []).append(seq)
                epoch.joined_at[seq.seq_id] = steps  # its counts held from now: the epoch adds its steps since
                epoch.context += seq.num_computed_tokens
            epoch.num_seqs += len(seqs)
            self.joined.append(group.request_id)
        return True

    def _make_current(self, epoch: _Epoch, seq) -> None:
        """A member's counts, brought up to the epoch's steps (it leaves)."""
        steps = epoch.steps - epoch.joined_at.pop(seq.seq_id)
        seq.num_generated += steps
        seq.num_computed_tokens += steps

    def _leave(self, epoch: _Epoch, group) -> list:
        """The group's sequences leave the epoch early (preempted): counts made current on both sides, out of its
        by_last lists. Returns their records in the pool (the caller frees them, then corrects the counts)."""
        states = []
        for seq in group.live:
            last = epoch.joined_at[seq.seq_id] + seq.output_len - seq.num_generated - 1  # not passed yet
            same = epoch.by_last[last]
            del same[next(i for i, s in enumerate(same) if s is seq)]  # by identity (siblings' states may be equal)
            if not same:  # nobody leaves then any more: no run stops there (it stands after next_last)
                del epoch.by_last[last], epoch.lasts[bisect.bisect_left(epoch.lasts, last, epoch.next_last)]
            self._make_current(epoch, seq)
            epoch.context -= seq.num_computed_tokens
            states.append(epoch.kv.leave(seq.seq_id))
        epoch.num_seqs -= len(group.live)
        return states

    def _steps_done(self, num_steps: int) -> list[int]:
        """The members sampled `num_steps` more tokens (applied in the pool already): those whose last token it was
        leave and finish (requests returned; all of a group's sequences leave together)."""
        epoch, sched = self.epoch, self.scheduler
        epoch.pending = False
        epoch.context += epoch.num_seqs * num_steps
        epoch.steps += num_steps
        last = epoch.lasts[epoch.next_last]
        if epoch.steps <= last:
            return []
        epoch.next_last += 1
        leaving = epoch.by_last.pop(last)
        states = []
        for seq in leaving:  # made current, then finished (all of a group's sequences leave together)
            self._make_current(epoch, seq)
            epoch.context -= seq.num_computed_tokens
            states.append(epoch.kv.leave(seq.seq_id))
        epoch.num_seqs -= len(leaving)
        finished = sched.finish_sampled({s.request_id: sched.group(s.request_id) for s in leaving}.values())
        for state in states:  # their blocks went back to the pool
            epoch.kv.changed(state, -1)
        if not epoch.num_seqs:
            self.close()
        return finished
