"""An LLM serves one thread at a time: a call from a second thread while one runs is refused at once.

Before the rule, two threads in generate() broke each other inside the engine (a KeyError for a request the other
thread finished, "schedule() called twice"). Now the second caller gets one RuntimeError line and nothing of it is
queued; the running call completes with the tokens it would have had alone, and a later call works. The engine
is the tiny random Llama: a generate() of a few tokens takes milliseconds.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest

from reference import LLM, BeamSearchParams, SamplingParams
from reference.models import random_model

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
PROMPTS = [[5, 6, 7], [1, 2, 3, 4]]
REFUSED = "in another thread; use one LLM per thread or call it from one thread"


@pytest.fixture(scope="module")
def tiny():
    return random_model(seed=5, tie_word_embeddings=False)


class ChatByteTokenizer:
    """Text <-> its UTF-8 bytes (the tiny vocabulary is 256), and a chat template that writes "role: content"."""

    chat_template = "role: content, a line each"  # LLM.chat asks only whether there is one

    def __call__(self, text: str):
        return SimpleNamespace(input_ids=list(text.encode()))

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return bytes(ids).decode(errors="replace")

    def apply_chat_template(self, conversation, add_generation_prompt: bool, tokenize: bool) -> str:
        return "".join(f"{m['role']}: {m['content']}\n" for m in conversation)


def engine(tiny) -> LLM:
    return LLM.from_loaded(tiny, ChatByteTokenizer(), block_size=4, num_gpu_blocks=32, max_model_len=64)


def tokens(outputs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outputs]


def assert_idle_and_free(llm: LLM) -> None:
    kv = llm.kv_manager
    assert not llm.has_unfinished_requests() and not llm._requests and kv.num_free_blocks == kv.num_blocks
    kv.check_invariants()


def test_a_second_thread_is_refused_while_the_first_is_inside_a_step(tiny):
    expected = tokens(engine(tiny).generate(PROMPTS, GREEDY))
    llm = engine(tiny)
    # hold the first thread's generate() inside its first forward pass, until the other calls are made
    inside, release = threading.Event(), threading.Event()
    execute = llm.executor.execute

    def held_execute(*args, **kwargs):
        inside.set()
        release.wait(30)
        return execute(*args, **kwargs)

    llm.executor.execute = held_execute
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(llm.generate, PROMPTS, GREEDY)
        try:
            assert inside.wait(30)
            # this (main) thread is the other thread: every call that drives or changes the engine is refused
            for call in (
                lambda: llm.generate(PROMPTS, GREEDY),
                llm.step,
                lambda: llm.add_request([9, 9], GREEDY),
                lambda: llm.abort("0"),
                lambda: llm.beam_search([[1, 2]], BeamSearchParams(2, 3)),
                lambda: llm.chat([{"role": "user", "content": "hi"}]),
            ):
                with pytest.raises(RuntimeError) as info:
                    call()
                assert str(info.value) == f"this LLM is already running generate() {REFUSED}"
        finally:
            release.set()
        assert tokens(first.result(timeout=60)) == expected  # the first call never noticed
    llm.executor.execute = execute
    assert_idle_and_free(llm)
    assert [o.request_id for o in llm.generate(PROMPTS, GREEDY)] == ["2", "3"]  # the refused calls took no id


@pytest.mark.parametrize("num_threads", [2, 8])
def test_threads_racing_on_generate_never_break_the_engine(tiny, num_threads):
    """All threads call generate() at once: each either gets its tokens, exactly as alone, or one RuntimeError line;
    the ones that overlap a running call are refused, the others run one after another."""
    expected = tokens(engine(tiny).generate(PROMPTS, GREEDY))
    llm = engine(tiny)
    start = threading.Barrier(num_threads)

    def race():
        start.wait(30)
        try:
            return tokens(llm.generate(PROMPTS, GREEDY))
        except RuntimeError as exc:
            return str(exc)

    with ThreadPoolExecutor(num_threads) as pool:
        results = list(pool.map(lambda _: race(), range(num_threads)))  # any other exception re-raises here
    served = [r for r in results if not isinstance(r, str)]
    assert served and all(r == expected for r in served)
    assert all(
        r.startswith("this LLM is already running generate() ") and REFUSED in r for r in results if isinstance(r, str)
    )
    assert_idle_and_free(llm)
    assert llm.stats.num_failed_steps == 0 and llm.stats.num_aborted_requests == 0
    assert tokens(llm.generate(PROMPTS, GREEDY)) == expected  # one thread after the race: as a fresh engine


def test_the_streaming_api_from_one_thread_after_another(tiny):
    """The rule is about overlapping calls, not about which thread: calls that take turns all work."""
    expected = tokens(engine(tiny).generate(PROMPTS, GREEDY))
    llm = engine(tiny)
    with ThreadPoolExecutor(2) as pool:
        ids = [pool.submit(llm.add_request, p, GREEDY).result(timeout=30) for p in PROMPTS]
        finals = {}
        while llm.has_unfinished_requests():
            finals.update(
                {o.request_id: o.outputs[0].token_ids for o in pool.submit(llm.step).result(timeout=30) if o.finished}
            )
    assert [finals[i] for i in ids] == expected
    assert_idle_and_free(llm)
