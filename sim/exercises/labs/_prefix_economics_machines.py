"""The property checks of the prefix-economics lab: request streams replayed through the student's cache and the
project's paged pool with prefix caching, side by side.

Random traces come from a tiny vocabulary, each request cut from an earlier one (a shared prefix, a repeat, a
conversation's next turn) plus new tokens, so hits, misses at a divergent block, evictions and a prefix computed
twice all happen in small caches. Conversation traces are sim.workloads.conversation's multi-turn chats. Before each request
the student's `lookup` is compared, then what `serve` returns, the cached blocks and the hit rate after it.
`note()` narrates the stream, so a shrunk failure reads as the requests that led to it.

Imported only when a check runs (it needs hypothesis, a dev dependency); its name starts with "_", so the lab
loader does not take it for a lab.
"""
from __future__ import annotations

import unittest
from typing import Any, Callable

from hypothesis import given, note, settings
from hypothesis import strategies as st

from ...testing.blocks import machine_settings
from ..referee import NO_RULES, Referee
from ..report import same
from ._prefix_economics_oracle import ProjectPrefixCache, Request, conversation_trace

# One request: (which earlier request to start from, where to cut it, how many new tokens, their ids as the digits
# of a number in base 3, how many tokens are the prompt). NOTE: plain integers, not a list of new tokens: five draws
# per request keep generating and shrinking a failing trace quick.
_REQUEST = st.tuples(st.integers(0, 63), st.integers(0, 63), st.integers(0, 6), st.integers(0, 3**6 - 1),
                     st.integers(0, 63))


def _request(draw: tuple, earlier: list[Request], max_len: int) -> Request:
    pick, cut, num_new, digits, prompt = draw
    base = earlier[pick % len(earlier)][0] if earlier else []
    new = [digits // 3**i % 3 for i in range(num_new)]
    tokens = (base[: cut % (len(base) + 1)] + new)[:max_len] or [0]
    return tokens, 1 + prompt % len(tokens)




def _show(tokens: list[int]) -> str:
    return str(tokens) if len(tokens) <= 24 else f"[{', '.join(map(str, tokens[:8]))}, ... {len(tokens)} tokens]"


def _compare(what: str, found: Any, expected: Any) -> None:
    if not same(found, expected):
        raise AssertionError(f"{what}: expected {expected!r}, found {found!r}")


def _replay(student: Any, project: ProjectPrefixCache, trace: list[Request]) -> None:
    for i, (tokens, num_prompt) in enumerate(trace, 1):
        call = f"({_show(tokens)}, {num_prompt})"
        _compare(f"lookup{call} before request {i}", student.lookup(tokens, num_prompt),
                 project.lookup(tokens, num_prompt))
        expected = project.serve(tokens, num_prompt)
        cached = project.num_cached_blocks
        note(f"request {i}: serve{call} -> {expected} prompt tokens cached; {cached} cached block(s)")
        _compare(f"serve{call}, request {i}", student.serve(tokens, num_prompt), expected)
        _compare(f"num_cached_blocks after request {i}", student.num_cached_blocks, project.num_cached_blocks)
        _compare(f"hit_rate after request {i}", student.hit_rate, project.hit_rate)


def trace_test(make: Callable[..., Any], max_examples: int, steps: int, conversations: bool = False,
               big: bool = False) -> type:
    """A TestCase whose runTest replays random traces (or conversation traces) of up to `steps` requests."""

    class Traces(unittest.TestCase):
        @settings(machine_settings(max_examples), report_multiple_bugs=False)
        @given(data=st.data())
        def runTest(self, data: st.DataObject) -> None:
            if conversations:
                block_size = data.draw(st.sampled_from((1, 4, 16)), label="block_size")
                max_seq_len = 256
                num_blocks = data.draw(st.integers(-(-max_seq_len // block_size), 3 * max_seq_len // block_size),
                                       label="num_blocks")
                seed = data.draw(st.integers(0, 1000), label="seed")
                # NOTE: at most 12 requests: each is up to 256 tokens, and a failure replays them while shrinking
                trace = conversation_trace(min(steps, 12), seed, max_seq_len)
                note(f"conversation trace (seed {seed}) of {len(trace)} requests")
            else:
                block_size = data.draw(st.integers(1, 4), label="block_size")
                num_blocks = data.draw(st.integers(2, 16 if big else 6), label="num_blocks")
                trace: list[Request] = []
                shortest = steps // 2 if big else 1  # NOTE: free lists average ~6 requests; the long check asks more
                for draw in data.draw(st.lists(_REQUEST, min_size=shortest, max_size=steps), label="requests"):
                    trace.append(_request(draw, trace, num_blocks * block_size))
            note(f"a cache of {num_blocks} blocks of {block_size} tokens")
            _replay(Referee(make(num_blocks, block_size), NO_RULES), ProjectPrefixCache(num_blocks, block_size), trace)

    return Traces
