"""The Triton decode kernel with one rule broken (tests/notebooks/test_grader.py grades each).

Each bug is the solution's kernel with a few lines replaced (`_mutant`), so the diff IS the bug.
"""

from __future__ import annotations

import inspect
import linecache
import textwrap


def _mutant(name: str, *edits: tuple[str, str]):
    """A subclass of the solution whose kernel is the solution's source with each (old, new) edit applied."""

    def break_it(base):
        source = textwrap.dedent(inspect.getsource(base.kernel))
        for old, new in edits:
            assert old in source, f"planted bug {name}: {old!r} is not in the solution's kernel"
            source = source.replace(old, new)
        filename = f"<planted {name}>"
        # NOTE: registered in linecache so the interpreter finds the source, as it does for a real file
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        namespace: dict = {}
        exec(compile(source, filename, "exec"), base.kernel.__globals__, namespace)
        return type(name, (base,), {"kernel": namespace["kernel"]})

    return break_it


# The running max stays 0: exp(score) straight away. Exact for small scores; inf / inf = NaN past ~88.
no_max_subtraction = _mutant(
    "NoMaxSubtraction",
    ('m_i = tl.full([], float("-inf"), tl.float32)', "m_i = tl.full([], 0.0, tl.float32)"),
    ("m_new = tl.maximum(m_i, tl.max(scores, axis=0))", "m_new = m_i"),
)
# The sum of exp(score - m) * v is not rescaled when a block raises the max (l is).
acc_not_rescaled = _mutant("AccNotRescaled", ("acc = acc * alpha + tl.sum(", "acc = acc + tl.sum("))
# <= seq_len: the slot right after the last token is read too (NaN in the checks).
mask_off_by_one = _mutant(
    "MaskOffByOne", ("logical * BLOCK_SIZE + offs_t < seq_len", "logical * BLOCK_SIZE + offs_t <= seq_len")
)
# Logical block i read from physical block i: the block table is never looked at.
block_index_not_table_entry = _mutant(
    "BlockIndexNotTableEntry",
    ("block = tl.load(block_tables_ptr + seq * stride_bt + logical)", "block = logical + 0 * seq"),
)

PLANTED = [
    (
        "no-max-subtraction",
        no_max_subtraction,
        ("model", "rule"),
        ["✓ random batches", "✗ large scores", "forward(query", "exp() overflows"],
    ),
    (
        "acc-not-rescaled",
        acc_not_rescaled,
        (),
        [
            "online softmax: a later block with a larger score rescales",
            "the output ([1, e^3] / (1 + e^3)): expected [[[0.0474, 0.9526]]], found [[[0.9526, 0.9526]]]",
        ],
    ),
    (
        "mask-off-by-one",
        mask_off_by_one,
        (),
        [
            "a context ending inside its last block",
            "the output (the mean of the 5 values): expected [[[2.0, 1.0]]], found [[[nan, nan]]]",
        ],
    ),
    (
        "block-index-not-table-entry",
        block_index_not_table_entry,
        (),
        [
            "logical block i lives in physical block block_table[i]",
            "the output (the mean of the 4 values): expected [[[2.0, 3.0]]], found [[[nan, nan]]]",
        ],
    ),
]
