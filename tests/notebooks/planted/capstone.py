"""The capstone's stack with one piece broken the way students break it (tests/notebooks/test_grader.py grades each).

Each variant is a subclass of the solution's MyServingStack whose allocator or policy has one bug; the lab-3 and lab-8
graders catch most of these on their own, and the capstone must catch them too, through the engine's tokens and the
simulator's tables, in their words.
"""

from __future__ import annotations


def _allocator(base, method: str, body):
    """The stack, its allocator's `method` replaced by body(self, *args) (a subclass of the solution's allocator)."""
    allocator = type(base().block_allocator(1, 1))
    broken = type(f"Broken{method.title()}", (allocator,), {method: body})

    class Stack(base):
        def block_allocator(self, num_blocks, block_size):
            return broken(num_blocks, block_size)

    return Stack


def cow_in_place(base):
    def copy_on_write(self, block_id):  # writes into the shared block: the other samples read its tokens
        return block_id

    return _allocator(base, "copy_on_write", copy_on_write)


def cow_keeps_the_copy(base):
    def copy_on_write(self, block_id):  # takes a fresh block and drops a reference, then hands back the shared one
        if self.owners[block_id] > 1 and self.stack:
            self.owners[block_id] -= 1
            self.allocate(1)
        return block_id

    return _allocator(base, "copy_on_write", copy_on_write)


def free_ignores_owners(base):
    def free(self, block_ids):  # a shared block is freed at its first owner's free: handed out while still read
        for b in list(block_ids):
            if self.owners[b] > 0:
                self.owners[b] = 0
                self.stack.append(b)

    return _allocator(base, "free", free)


def frees_while_owned(base):
    def free(self, block_ids):  # off by one: a block left with one owner goes back on the stack too
        for b in list(block_ids):
            self.owners[b] -= 1
            if self.owners[b] <= 1 and b not in self.stack:
                self.stack.append(b)

    def share(self, block_ids):  # and share trusts its caller (no check that the block is in use)
        for b in block_ids:
            self.owners[b] += 1

    broken = _allocator(base, "free", free)
    allocator = type(broken().block_allocator(1, 1))
    allocator.share = share
    return broken


def leaks(base):
    def free(self, block_ids):  # the count drops, the block never comes back
        for b in list(block_ids):
            self.owners[b] -= 1

    return _allocator(base, "free", free)


def one_pool_for_all(base):
    class OnePool(base):  # caches its allocator: the second run starts on the first run's blocks
        def block_allocator(self, num_blocks, block_size):
            key = (num_blocks, block_size)
            pools = self.__dict__.setdefault("pools", {})
            if key not in pools:
                pools[key] = super().block_allocator(num_blocks, block_size)
            return pools[key]

    return OnePool


def one_policy_for_all(base):
    class OnePolicy(base):  # one policy for every run: its preemption counts carry over
        def victim_policy(self, max_preemptions):
            if "policy" not in self.__dict__:
                self.policy = super().victim_policy(max_preemptions)
            return self.policy

    return OnePolicy


def never_protects(base):
    class NeverProtects(base):
        def victim_policy(self, max_preemptions):
            policy = super().victim_policy(max_preemptions)
            policy.is_protected = lambda request_id: False  # plain fewest_computed: starves the readmitted
            return policy

    return NeverProtects


def returns_the_id(base):
    class ReturnsTheId(base):
        def victim_policy(self, max_preemptions):
            policy = super().victim_policy(max_preemptions)
            chosen = policy.victim
            policy.victim = lambda candidates: chosen(candidates).request_id
            return policy

    return ReturnsTheId


# (name, variant, checks it passes, phrases in the feedback); the stack is correct but for the one bug
PLANTED = [
    ("cow-in-place", cow_in_place, (), ["the engine said: ValueError: copy_blocks"]),
    ("cow-keeps-the-copy", cow_keeps_the_copy, (), ["the engine said: ValueError: copy_blocks"]),
    # beams dropped one by one free shared blocks: the next fork shares a block the bug already freed
    (
        "free-ignores-owners",
        free_ignores_owners,
        ("model",),
        ["beam search (width 3)", "cannot share a free block", "beam_width 2"],
    ),
    (
        "frees-while-owned",
        frees_while_owned,
        (),
        ["the tokens part at token", "On the project's allocator the model wrote", "recount first failed"],
    ),
    ("leaks", leaks, (), ["the engine said: RuntimeError: expected the scheduler to admit"]),
    (
        "one-pool-for-all",
        one_pool_for_all,
        (),
        ["block_allocator(8, 4) returned the same allocator twice: each run needs a pool of its own"],
    ),
    (
        "one-policy-for-all",
        one_policy_for_all,
        (),
        ["victim_policy(2) returned the same policy twice: each run needs its own preemption counts"],
    ),
    ("never-protects", never_protects, (), ["your policy chose r", "lab 08's rule chooses r"]),
    ("returns-the-id", returns_the_id, (), ["expected one of them (the SequenceGroup itself, not its id)"]),
]
