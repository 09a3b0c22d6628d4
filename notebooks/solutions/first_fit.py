"""Solution to exercise 1: a first-fit slot allocator (notebooks/exercises/01_first_fit.ipynb).

Contiguous KV memory (vLLM paper, section 3): each sequence needs ONE run of consecutive slots.
The free space is a list of holes sorted by address; `allocate` takes the first hole that is long
enough, `free` puts a run back and merges it with the holes touching it.
"""
from __future__ import annotations


class MyFirstFitAllocator:
    def __init__(self, num_slots: int):
        if num_slots < 1:
            raise ValueError(f"num_slots must be >= 1, got {num_slots}")
        self.num_slots = num_slots
        self.holes = [(0, num_slots)]  # free runs (start, length), sorted by start, never touching
        self.runs = {}  # start -> length of every allocation handed out

    @property
    def num_free_slots(self) -> int:
        return sum(length for _, length in self.holes)

    def free_runs(self) -> list[tuple[int, int]]:
        return list(self.holes)

    def allocated_size(self, start: int) -> int:
        if start not in self.runs:
            raise RuntimeError(f"no allocation starts at slot {start}")
        return self.runs[start]

    def check_invariants(self) -> None:
        spans = sorted(self.holes + list(self.runs.items()))
        end = 0
        for start, length in spans:
            assert start == end, f"runs must tile the space: expected a run at {end}, found {start}"
            end = start + length
        assert end == self.num_slots, f"runs must end at {self.num_slots}, found {end}"
        for (a, la), (b, _) in zip(self.holes, self.holes[1:]):
            assert a + la < b, f"free runs at {a} and {b}: expected sorted and merged, found them touching"

    # --- the exercise ---------------------------------------------------------------------------
    @property
    def largest_free_run(self) -> int:
        """The longest hole (0 if none): the largest size `allocate` would satisfy now."""
        return max((length for _, length in self.holes), default=0)

    def allocate(self, size: int) -> int | None:
        """Start of `size` consecutive slots from the lowest hole long enough; None (nothing changed) if none."""
        if size < 1:
            raise ValueError(f"size must be >= 1, got {size}")
        for i, (start, length) in enumerate(self.holes):
            if length < size:
                continue
            if length == size:
                self.holes.pop(i)
            else:
                self.holes[i] = (start + size, length - size)
            self.runs[start] = size
            return start
        return None

    def free(self, start: int) -> None:
        """Give the run at `start` back, merged with the holes right before and after it."""
        if start not in self.runs:
            raise RuntimeError(f"free of slot {start}, which starts no allocation")
        length = self.runs.pop(start)
        i = 0
        while i < len(self.holes) and self.holes[i][0] < start:
            i += 1
        if i < len(self.holes) and self.holes[i][0] == start + length:  # the hole after touches it
            length += self.holes.pop(i)[1]
        if i > 0 and self.holes[i - 1][0] + self.holes[i - 1][1] == start:  # so does the hole before
            before_start, before_length = self.holes[i - 1]
            self.holes[i - 1] = (before_start, before_length + length)
        else:
            self.holes.insert(i, (start, length))
