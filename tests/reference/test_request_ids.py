"""Request ids as vLLM's: strings at the engine's surface (add_request, step's outputs, abort), numbered "0", "1", ...
by generate() from one counter per LLM (vllm/entrypoints/common/offline.py: `str(next(self.request_counter))`),
while the simulator's scheduler underneath keeps its ints (reference/engine/request_ids.py)."""

from __future__ import annotations

import pytest

from reference import LLM, SamplingParams
from reference.engine.request_ids import RequestIds
from reference.models import random_model

GREEDY = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny():
    return random_model(seed=4)


def engine(tiny, **kwargs) -> LLM:
    return LLM.from_loaded(tiny, **{"block_size": 4, "num_gpu_blocks": 32, "max_model_len": 64, **kwargs})


def test_generate_numbers_requests_as_vllm_does(tiny):
    llm = engine(tiny)
    first = llm.generate([[5, 6, 7], [8, 9]], GREEDY)
    assert [o.request_id for o in first] == ["0", "1"] and all(type(o.request_id) is str for o in first)
    assert [o.request_id for o in llm.generate([[5, 6, 7]], GREEDY)] == ["2"]  # one counter across calls
    assert llm.add_request([3, 4], GREEDY) == "3"  # request_id=None: the same counter
    assert [o.request_id for o in engine(tiny).generate([[5, 6, 7]], GREEDY)] == ["0"]  # per LLM


def test_a_custom_id_round_trips_through_add_request_step_and_abort(tiny):
    llm = engine(tiny)
    assert llm.add_request([5, 6, 7], GREEDY, request_id="chat-42") == "chat-42"
    assert llm.add_request([8, 9], GREEDY, request_id="victim") == "victim"
    outs = llm.step()
    assert {o.request_id for o in outs} == {"chat-42", "victim"} and all(not o.finished for o in outs)
    llm.abort("victim")
    assert llm.stats.num_aborted_requests == 1
    finals = []
    while llm.has_unfinished_requests():
        finals += [o for o in llm.step() if o.finished]
    assert [o.request_id for o in finals] == ["chat-42"] and len(finals[0].outputs[0].token_ids) == 3
    llm.abort("victim")  # twice, or a finished request, or one never given: nothing happens
    llm.abort("chat-42")
    llm.abort("never")
    assert llm.stats.num_aborted_requests == 1
    assert llm.scheduler_request_id("chat-42") == 0 and llm.scheduler_request_id("victim") == 1
    with pytest.raises(KeyError, match="unknown request_id 'never'"):
        llm.scheduler_request_id("never")


def test_an_id_already_given_is_refused_and_the_engine_goes_on(tiny):
    llm = engine(tiny)
    llm.add_request([5, 6, 7], GREEDY, request_id="a")
    with pytest.raises(ValueError, match=r"^request_id 'a' was already given to this engine \(allowed: an id"):
        llm.add_request([1], GREEDY, request_id="a")
    while llm.has_unfinished_requests():
        llm.step()
    with pytest.raises(ValueError, match="request_id 'a' was already given"):  # finished: still taken
        llm.add_request([1], GREEDY, request_id="a")
    assert llm.add_request([1], GREEDY, request_id=7) == "7"  # an int, as this engine's ids used to be
    with pytest.raises(ValueError, match="request_id '7' was already given"):
        llm.add_request([1], GREEDY, request_id="7")
    assert len(llm.scheduler.waiting_request_ids()) == 1


def test_the_schedulers_refusal_names_the_callers_id(tiny):
    llm = engine(tiny, num_gpu_blocks=4)  # 16 slots: a 40-token sequence never fits
    with pytest.raises(ValueError, match=r"^request 'big': "):
        llm.add_request(list(range(1, 30)), SamplingParams(max_tokens=11), request_id="big")
    assert llm.add_request([1], GREEDY, request_id="big") == "big"  # the refused one took nothing


def test_request_ids_map_in_order_and_check_types():
    ids = RequestIds()
    assert ids.check_new(None) is None and ids.check_new("x") == "x" and ids.check_new(3) == "3"
    with pytest.raises(TypeError, match=r"request_id must be a str \(or an int, converted with str\(\)\), got bool"):
        ids.check_new(False)
    ids.add("0", 0)
    ids.add("x", 1)
    assert ids.next_public() == "1" and ids.next_scheduler_id == 2
    with pytest.raises(RuntimeError, match="expected a new id under scheduler id 2"):
        ids.add("x", 2)
    assert ids.scheduler_id("x") == 1 and ids.scheduler_id(0) == 0 and ids.scheduler_id("1") is None
