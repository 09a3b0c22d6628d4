"""The engine: the simulator's scheduler and KV managers around real tensors.

llm.py (`LLM`, vLLM's offline API; config.py: `EngineConfig`, its settings), engine.py (`LLMEngine`: requests in,
one step, outputs), executor.py (a plan carried out: the forward pass over the paged cache of kv_cache.py and
kv_groups.py), batch.py, sampling.py, beam.py, speculative.py; a request's way in and out: prompts.py,
request_ids.py, request_state.py, stops.py, outputs.py, prompt_logprobs.py; threads.py (the engine's guards) and
timeline.py (its run as a Chrome trace). `from reference import LLM, ...` gives what a user types; this package
imports nothing of its own, so `import reference.engine.config` loads no model code.
"""
