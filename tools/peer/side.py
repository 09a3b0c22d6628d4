"""One system's side of `make peer` (tools/peer_vllm.py), run in a fresh process: vLLM's in .venv-vllm, this
project's engine in .venv. Reads a task (JSON), writes what it measured (JSON). The same code drives both systems
through the offline API they share: only the import differs.

    python tools/peer/side.py {vllm|engine} TASK.json OUT.json SPAWN_TIME

Measured, in this order, in one process: the cold start (process spawn to the first token of one request: imports,
model load, KV pool, the first step), greedy token ids of the task's prompts, beam search on the task's cases (when
PEER_BEAM=1), then the throughput workload (all requests at once, greedy, ignore_eos, exact max_tokens) after an
untimed warm-up request that shares no prefix with it. The workload's output token ids go into OUT.json as well
(workload_tokens, in the workload's order), for the long workload's equality check.

PEER_DTYPE (float32 by default, or bfloat16) is the model's dtype in both systems.
"""

import json
import os
import sys
import time


def main() -> None:
    system, task_path, out_path, spawn = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
    with open(task_path) as f:
        task = json.load(f)
    dtype = os.environ.get("PEER_DTYPE", "float32")
    if system == "vllm":
        import vllm
        from vllm import LLM, SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import BeamSearchParams

        llm = LLM(model=task["model_dir"], dtype=dtype, max_model_len=task["max_model_len"], seed=0)
        version = f"vllm {vllm.__version__}"
    else:
        import torch

        from reference import LLM, SamplingParams, TokensPrompt
        from reference.sampling_params import BeamSearchParams

        llm = LLM("smollm2", dtype=dtype, max_model_len=task["max_model_len"], seed=0)
        version = f"paged-attention-lab engine, torch {torch.__version__} ({torch.get_num_threads()} threads)"

    def greedy(max_tokens: int) -> "SamplingParams":
        return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)

    first = llm.generate([TokensPrompt(prompt_token_ids=task["ttft_prompt"])], greedy(1))
    cold_start_s = time.time() - spawn
    assert len(first[0].outputs[0].token_ids) == 1
    prompts = [TokensPrompt(prompt_token_ids=ids) for ids in task["greedy_prompts"]]
    outs = llm.generate(prompts, greedy(task["greedy_max_tokens"]))
    greedy_ids = [list(o.outputs[0].token_ids) for o in outs]
    beams = []
    if os.environ.get("PEER_BEAM") == "1":  # every sequence of each case, best first: prompt + output token ids
        for ids, width, max_tokens in task["beam_cases"]:
            out = llm.beam_search(
                [TokensPrompt(prompt_token_ids=ids)], BeamSearchParams(beam_width=width, max_tokens=max_tokens)
            )
            beams.append([list(s.tokens) for s in out[0].sequences])
    workload = task["workload"]
    # Warm-up, untimed, on a prompt that is not in the workload: both systems keep a prefix cache (vLLM by default),
    # and warming up on the workload's first prompt let vLLM skip 112 of the timed run's 2,356 prompt tokens.
    llm.generate([TokensPrompt(prompt_token_ids=task["ttft_prompt"])], greedy(4))
    started = time.perf_counter()
    outs = llm.generate([TokensPrompt(prompt_token_ids=ids) for ids, _ in workload], [greedy(n) for _, n in workload])
    wall = time.perf_counter() - started
    workload_tokens = [list(o.outputs[0].token_ids) for o in outs]
    tokens = sum(map(len, workload_tokens))
    assert tokens == sum(n for _, n in workload), "ignore_eos with exact max_tokens: every request runs to its length"
    with open(out_path, "w") as f:
        json.dump(
            {
                "version": version,
                "cold_start_s": cold_start_s,
                "greedy": greedy_ids,
                "wall_s": wall,
                "output_tokens": tokens,
                "beams": beams,
                "workload_tokens": workload_tokens,
            },
            f,
        )


if __name__ == "__main__":  # vLLM's CPU build starts worker processes: the guard is required
    main()
