"""Fixtures the engine tests share: the embedded SmolLM2 loaded once per module, and HF's own model beside it."""

import pytest
import torch


@pytest.fixture(scope="module")
def smol():
    """(model, tokenizer, config), loaded once; every test builds cheap engines around it with from_loaded."""
    from reference.models import load_model

    before = torch.get_num_threads()
    torch.set_num_threads(1)  # as the engine picks on CPU; HF's runs here get the same (measured faster)
    yield load_model("smollm2")
    torch.set_num_threads(before)  # give the other test modules theirs back


@pytest.fixture(scope="module")
def hf_model():
    from transformers import AutoModelForCausalLM

    from reference.models import smollm2_checkpoint_dir

    return AutoModelForCausalLM.from_pretrained(
        smollm2_checkpoint_dir(), dtype=torch.float32, local_files_only=True
    ).eval()
