"""Correct-but-different solutions (tests/notebooks/test_different.py): each lab's answer written another way than
notebooks/solutions/ (another order where the spec leaves it open, another data structure, helpers and computed
constants at module level). Every file `{exercise}_{variant}.py` must get full marks, as a module and inside the
exercise's notebook (with a broken scratch cell beside it)."""
