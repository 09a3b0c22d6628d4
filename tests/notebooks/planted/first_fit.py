"""First fit with one rule broken (tests/notebooks/test_grader.py grades each)."""

from __future__ import annotations


def highest_hole(base):
    class HighestHole(base):
        def allocate(self, size):  # the LAST hole that fits, not the first
            if size < 1:
                raise ValueError(f"size must be >= 1, got {size}")
            for i in range(len(self.holes) - 1, -1, -1):
                start, length = self.holes[i]
                if length >= size:
                    self.holes[i : i + 1] = [(start + size, length - size)] if length > size else []
                    self.runs[start] = size
                    return start
            return None

    return HighestHole


def _fit(base, pick, doc):
    class Fit(base):
        def allocate(self, size):
            if size < 1:
                raise ValueError(f"size must be >= 1, got {size}")
            fits = [i for i, (_, length) in enumerate(self.holes) if length >= size]
            if not fits:
                return None
            i = pick(fits, self.holes)
            start, length = self.holes[i]
            self.holes[i : i + 1] = [(start + size, length - size)] if length > size else []
            self.runs[start] = size
            return start

    Fit.__name__ = Fit.__qualname__ = doc
    return Fit


def best_fit(base):  # the SMALLEST hole that fits (lowest of equal ones), not the first
    return _fit(base, lambda fits, holes: min(fits, key=lambda i: (holes[i][1], i)), "BestFit")


def worst_fit(base):  # the LARGEST hole that fits (lowest of equal ones), not the first
    return _fit(base, lambda fits, holes: max(fits, key=lambda i: (holes[i][1], -i)), "WorstFit")


def merges_only_forward(base):
    class MergesOnlyForward(base):
        def free(self, start):  # merges with the hole after the run, never with the one before
            if start not in self.runs:
                raise RuntimeError(f"free of slot {start}, which starts no allocation")
            length = self.runs.pop(start)
            after = [h for h in self.holes if h[0] == start + length]
            merged = (start, length + sum(h[1] for h in after))
            self.holes = sorted([h for h in self.holes if h not in after] + [merged])

    return MergesOnlyForward


def carves_before_checking(base):
    class CarvesBeforeChecking(base):
        def allocate(self, size):  # shrinks the first hole, THEN notices the size is bad
            start, length = self.holes[0]
            self.holes[0] = (start + size, length - size)
            if size < 1:
                raise ValueError(f"size must be >= 1, got {size}")
            self.holes[0] = (start, length)
            return super().allocate(size)

    return CarvesBeforeChecking


PLANTED = [
    (
        "highest-hole",
        highest_hole,
        ("rule",),
        [
            "allocate(2): the lowest hole that fits, not the smallest one ([6, 8), best fit) nor the largest ([10, 16), "
            "worst fit): expected 0, found 10",
            "first fit takes the lowest-addressed free run of at least 1 slot(s)",
        ],
    ),
    (
        "best-fit",
        best_fit,
        (),
        [
            "allocate(2): the lowest hole that fits, not the smallest one ([6, 8), best fit) nor the largest ([10, 16), "
            "worst fit): expected 0, found 6"
        ],
    ),
    (
        "worst-fit",
        worst_fit,
        (),
        [
            "allocate(2): the lowest hole that fits, not the smallest one ([6, 8), best fit) nor the largest ([10, 16), "
            "worst fit): expected 0, found 10"
        ],
    ),
    (
        "merges-only-forward",
        merges_only_forward,
        ("rule",),
        [
            "free_runs() after freeing the middle: one run again: expected [(0, 12)]",
            "a freed run merges with the free runs touching it on either side",
        ],
    ),
    (
        "carves-before-checking",
        carves_before_checking,
        ("model",),
        [
            "raised ValueError (size must be >= 1, got",
            "but changed the allocator: free_runs()",
            "A refused call must change nothing (all-or-nothing)",
        ],
    ),
]
