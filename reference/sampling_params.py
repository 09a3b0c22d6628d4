"""Where vLLM's scripts import the parameter records from (`from vllm.sampling_params import BeamSearchParams`):
the same names as reference.engine.sampling, so that changing `vllm` to `reference` in the import is all it takes."""
from reference.engine.sampling import BeamSearchParams, SamplingParams

__all__ = ["SamplingParams", "BeamSearchParams"]
