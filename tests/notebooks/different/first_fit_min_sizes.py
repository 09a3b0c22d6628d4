"""Exercise 1, correct but different: the reported case. A module-level constant computed by a call
(`MIN_SIZES = list(range(1, 2))`) that the class reads, a slot map (one entry per slot) instead of a hole list,
and the free runs computed by a module-level helper."""

MIN_SIZES = list(range(1, 2))


def runs_of(free):
    """The runs (start, length) of consecutive True entries."""
    runs, start = [], None
    for i, f in enumerate(free + [False]):
        if f and start is None:
            start = i
        elif not f and start is not None:
            runs.append((start, i - start))
            start = None
    return runs


class MyFirstFitAllocator:
    def __init__(self, num_slots):
        if num_slots < MIN_SIZES[0]:
            raise ValueError(f"num_slots must be >= 1, got {num_slots}")
        self.num_slots = num_slots
        self.is_free = [True] * num_slots
        self.sizes = {}

    @property
    def num_free_slots(self):
        return sum(self.is_free)

    def free_runs(self):
        return runs_of(self.is_free)

    def allocated_size(self, start):
        if start not in self.sizes:
            raise RuntimeError(f"no allocation starts at slot {start}")
        return self.sizes[start]

    def check_invariants(self):
        assert sum(self.sizes.values()) + self.num_free_slots == self.num_slots

    @property
    def largest_free_run(self):
        return max((n for _, n in self.free_runs()), default=0)

    def allocate(self, size):
        if size < min(MIN_SIZES):
            raise ValueError(f"size must be >= {MIN_SIZES[0]}, got {size}")
        for start, length in self.free_runs():
            if length >= size:
                self.is_free[start : start + size] = [False] * size
                self.sizes[start] = size
                return start
        return None

    def free(self, start):
        if start not in self.sizes:
            raise RuntimeError(f"free({start}): no allocation starts at slot {start}")
        size = self.sizes.pop(start)
        self.is_free[start : start + size] = [True] * size
