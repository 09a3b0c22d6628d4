"""Tests of the projection paths (reference/models/matmul.py): oneDNN with prepacked weights against F.linear.

Tolerance: float32, atol = rtol = 1e-5 on outputs of unit-scale inputs: oneDNN sums the 64-1,536 products of a
row in another order than MKL's sgemm; float32 rounding over that many terms stays below (measured ~1e-6).
"""

import pytest
import torch
import torch.nn.functional as F

from reference.cpu_paths import cpu_paths
from reference.models import load_model
from reference.models.matmul import PACKED_MAX_ROWS, PackedLinear, default_matmul

needs_onednn = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="needs torch's oneDNN")


@needs_onednn
@pytest.mark.parametrize("rows", [1, 7, 64, PACKED_MAX_ROWS])
def test_packed_linear_equals_f_linear(rows):
    gen = torch.Generator().manual_seed(rows)
    weight, bias = torch.randn(96, 48, generator=gen), torch.randn(96, generator=gen)
    x = torch.randn(rows, 48, generator=gen)
    linear = PackedLinear([weight])
    assert linear.num_packed == 1
    torch.testing.assert_close(linear(x, weight), F.linear(x, weight), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(linear(x, weight, bias), F.linear(x, weight, bias), atol=1e-5, rtol=1e-5)


@needs_onednn
def test_large_inputs_and_unknown_weights_go_to_f_linear_exactly():
    weight, other = torch.randn(32, 16), torch.randn(32, 16)
    linear = PackedLinear([weight, weight], max_rows=8)  # the same tensor twice is packed once
    assert linear.num_packed == 1
    big = torch.randn(9, 16)
    assert torch.equal(linear(big, weight), F.linear(big, weight))  # 9 rows > max_rows: F.linear itself
    small = torch.randn(3, 16)
    assert torch.equal(linear(small, other), F.linear(small, other))  # never packed: F.linear
    assert torch.equal(linear(small, other.clone()), F.linear(small, other))


def test_default_matmul_choices_and_bad_values():
    cpu = torch.device("cpu")
    expected = "onednn" if torch.backends.mkldnn.is_available() else "torch"
    assert default_matmul(None, cpu, torch.float32) == expected
    # bfloat16 prepacked too where oneDNN can pack it on this CPU (test_bf16_cpu.py), else F.linear (test_cpu_paths.py)
    assert default_matmul(None, cpu, torch.bfloat16) == ("onednn" if cpu_paths().onednn_bfloat16 else "torch")
    assert default_matmul(None, cpu, torch.float16) == "torch"  # not measured: not prepacked
    assert default_matmul("torch", cpu, torch.float32) == "torch"
    with pytest.raises(ValueError, match=r"unknown matmul 'mkl' \(allowed: torch, onednn\)"):
        default_matmul("mkl", cpu, torch.float32)
    with pytest.raises(ValueError, match="matmul 'onednn' runs on a CPU"):
        default_matmul("onednn", torch.device("meta"), torch.float32)


@needs_onednn
def test_model_logits_with_prepacked_weights_equal_the_plain_forward():
    """The whole forward (random tiny Llama) with each path, on the oracle attention: logits within 1e-4."""
    from reference.engine.batch import ForwardBatch
    from reference.engine.kv_cache import KVCache
    from reference.models.llama import LlamaForwardModel

    model, _, config = load_model("random")
    assert model.matmul == "onednn"
    plain = LlamaForwardModel(config, model.weights, matmul="torch")
    logits = []
    for m in (model, plain):
        cache = KVCache.for_model(config, 8, 4, torch.float32, torch.device("cpu"))
        batch = ForwardBatch.build([([5, 17, 99, 3, 42], 0, [0, 1]), ([7, 8, 9], 0, [2])], 4)
        logits.append(m.forward(batch.input_ids, batch.positions, batch, cache, "torch"))
    torch.testing.assert_close(logits[0], logits[1], atol=1e-4, rtol=1e-4)
