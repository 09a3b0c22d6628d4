"""Where vLLM's scripts import the parameter records from (`from vllm.sampling_params import BeamSearchParams`):
the same names as reference.sampling, so that changing `vllm` to `reference` in the import is all it takes."""
from reference.sampling import BeamSearchParams, SamplingParams

__all__ = ["SamplingParams", "BeamSearchParams"]
