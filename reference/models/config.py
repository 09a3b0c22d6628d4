"""The numbers of a Llama-family model that the forward pass and the KV cache need.

A Hugging Face `config.json` carries dozens of keys; our forward pass reads only these. Llama, Mistral
and Qwen2 share one architecture (pre-norm decoder, RoPE, grouped-query attention, SwiGLU MLP), so one
small record describes all three. Qwen2 differs only by biases on the q/k/v projections. Gemma 3's text model
(`gemma3_text`, the engine's second family: reference/models/gemma3.py) adds a few fields: which layers slide
(`layer_types`), the sliding layers' own RoPE base, the query scale and its GELU activation.

`ModelConfig.from_hf_dict` accepts both spellings of the RoPE settings: transformers < 5 writes
`rope_theta` / `rope_scaling` at the top level, transformers >= 5 writes them in `rope_parameters`.
`read_checkpoint_config(folder)` reads the files; whatever is wrong in them (missing, not JSON, a field missing
or of the wrong type) is one ValueError naming the file and the field.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "gemma3_text")
LAYER_TYPES = ("full_attention", "sliding_attention")  # Gemma 3's names for its two kinds of layer
_SUPPORTED = ", ".join(SUPPORTED_MODEL_TYPES)
REQUIRED_FIELDS = ("model_type", "num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
                   "vocab_size")  # every other field we read has a default
_MISSING = object()


@dataclass(frozen=True, slots=True)
class Llama3RopeScaling:
    """Llama 3.1's RoPE frequency rescaling (the only `rope_scaling` type we implement)."""

    factor: float  # how much longer the context is than the original training context
    low_freq_factor: float  # wavelengths longer than original_max / low_freq_factor are divided by factor
    high_freq_factor: float  # wavelengths shorter than original_max / high_freq_factor are kept
    original_max_position_embeddings: int

    def __post_init__(self) -> None:
        if self.factor <= 0:
            raise ValueError(f"rope_scaling.factor must be > 0, got {self.factor}")
        if not 0 < self.low_freq_factor < self.high_freq_factor:
            raise ValueError(
                "rope_scaling needs 0 < low_freq_factor < high_freq_factor, "
                f"got {self.low_freq_factor} and {self.high_freq_factor}"
            )
        if self.original_max_position_embeddings < 1:
            raise ValueError("rope_scaling.original_max_position_embeddings must be >= 1")


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """What our forward pass needs to know about a Llama-family checkpoint."""

    model_type: str  # one of SUPPORTED_MODEL_TYPES
    num_layers: int
    hidden_size: int
    intermediate_size: int  # width of the SwiGLU MLP
    num_heads: int  # query heads
    num_kv_heads: int  # key/value heads (grouped-query attention: num_heads % num_kv_heads == 0)
    head_dim: int
    vocab_size: int
    max_position_embeddings: int  # the longest context the model was trained for
    eos_token_ids: tuple[int, ...]  # any of them ends a sequence (config + generation_config)
    bos_token_id: int | None
    rope_theta: float  # RoPE base: frequency i is rope_theta ** (-2i / head_dim)
    rms_norm_eps: float
    tie_word_embeddings: bool  # lm_head reuses the input embedding matrix
    attention_bias: bool = False  # q/k/v projections have biases (Qwen2; Llama's flag adds o_proj's)
    rope_scaling: Llama3RopeScaling | None = None
    sliding_window: int | None = None  # Mistral v0.1: attend to the last N tokens only (Gemma 3: its sliding layers)
    # Gemma 3 (gemma3_text) only:
    layer_types: tuple[str, ...] = ()  # per layer, one of LAYER_TYPES; () = every layer full attention
    rope_local_theta: float | None = None  # the RoPE base of the sliding layers (rope_theta is the full layers')
    query_pre_attn_scalar: float | None = None  # scores are scaled by query_pre_attn_scalar ** -0.5 (None: head_dim)

    @property
    def family(self) -> str:
        """Which forward pass runs it: "gemma3" (reference/models/gemma3.py) or "llama" (llama.py)."""
        return "gemma3" if self.model_type == "gemma3_text" else "llama"

    def layer_window(self, layer: int) -> int | None:
        """The sliding window of `layer` (its queries attend to the last `window` positions), None for full attention.
        Gemma 3: its sliding_attention layers; Mistral (v0.1): every layer."""
        if self.layer_types:
            return self.sliding_window if self.layer_types[layer] == "sliding_attention" else None
        return self.sliding_window if self.model_type == "mistral" else None

    @property
    def attention_scale(self) -> float:
        return (self.query_pre_attn_scalar or self.head_dim) ** -0.5

    def __post_init__(self) -> None:
        if self.model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(f"model_type {self.model_type!r} is not supported (allowed: {_SUPPORTED})")
        for name in ("num_layers", "hidden_size", "intermediate_size", "num_heads", "num_kv_heads",
                     "head_dim", "vocab_size", "max_position_embeddings"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads != 0:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
            )
        if self.head_dim % 2 != 0:
            raise ValueError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")
        if self.rope_theta <= 0 or self.rms_norm_eps <= 0:
            raise ValueError("rope_theta and rms_norm_eps must be > 0")
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ValueError(f"sliding_window must be None or >= 1, got {self.sliding_window}")
        if self.layer_types:
            if len(self.layer_types) != self.num_layers or not set(self.layer_types) <= set(LAYER_TYPES):
                raise ValueError(f"layer_types must name each of the {self.num_layers} layers (allowed: "
                                 f"{', '.join(LAYER_TYPES)}), got {list(self.layer_types)}")
            if "sliding_attention" in self.layer_types and self.sliding_window is None:
                raise ValueError("layer_types has sliding_attention layers but sliding_window is None")

    @classmethod
    def from_hf_dict(cls, hf: dict[str, Any], generation: dict[str, Any] | None = None) -> ModelConfig:
        """Read a transformers `config.json` (and optionally `generation_config.json`) dict. ValueError naming the
        field if one is missing or of the wrong type (JSON null counts as missing)."""
        if "model_type" not in hf:
            raise ValueError(f"missing field 'model_type' (allowed: {_SUPPORTED})")
        model_type = hf.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(f"model_type {_show(model_type)} is not supported (allowed: {_SUPPORTED})")
        if model_type == "gemma3_text":
            return _gemma3_config(hf, generation or {})
        if hf.get("hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act {_show(hf['hidden_act'])} is not supported (allowed: silu)")
        if _bool_field(hf, "mlp_bias", False):
            raise ValueError("mlp_bias=true is not supported (allowed: SwiGLU MLP without biases)")
        num_heads, hidden = _int_field(hf, "num_attention_heads"), _int_field(hf, "hidden_size")
        rope = _dict_field(hf, "rope_parameters")
        rope_theta = _real_field(rope, "rope_theta", _real_field(hf, "rope_theta", 10000.0), "rope_parameters.")
        scaling = rope if "rope_type" in rope else _dict_field(hf, "rope_scaling")
        sliding = _int_field(hf, "sliding_window", None)
        if model_type == "qwen2" and not _bool_field(hf, "use_sliding_window", False):
            sliding = None  # Qwen2 configs name a window but switch it off
        return cls(
            model_type=model_type,
            num_layers=_int_field(hf, "num_hidden_layers"),
            hidden_size=hidden,
            intermediate_size=_int_field(hf, "intermediate_size"),
            num_heads=num_heads,
            num_kv_heads=_int_field(hf, "num_key_value_heads", num_heads),
            head_dim=_int_field(hf, "head_dim", hidden // num_heads if num_heads > 0 else 0),
            vocab_size=_int_field(hf, "vocab_size"),
            max_position_embeddings=_int_field(hf, "max_position_embeddings", 2048),
            eos_token_ids=_eos_ids(hf, generation or {}),
            bos_token_id=_int_field(hf, "bos_token_id", None),
            rope_theta=rope_theta,
            rms_norm_eps=_real_field(hf, "rms_norm_eps", 1e-6),
            tie_word_embeddings=_bool_field(hf, "tie_word_embeddings", False),
            # Qwen2's q/k/v projections always carry biases (its config does not say so).
            attention_bias=model_type == "qwen2" or _bool_field(hf, "attention_bias", False),
            rope_scaling=_rope_scaling(scaling),
            sliding_window=sliding,
        )


def _gemma3_config(hf: dict[str, Any], generation: dict[str, Any]) -> ModelConfig:
    """Gemma 3's text config: GELU (tanh) MLP, a RoPE base per kind of layer, every `sliding_window_pattern`-th layer
    full attention unless `layer_types` lists them (transformers >= 4.53 writes it)."""
    act = hf.get("hidden_activation", hf.get("hidden_act", "gelu_pytorch_tanh"))
    if act != "gelu_pytorch_tanh":
        raise ValueError(f"hidden_activation {_show(act)} is not supported (allowed: gelu_pytorch_tanh)")
    for name in ("final_logit_softcapping", "attn_logit_softcapping"):
        if hf.get(name) is not None:
            raise ValueError(f"{name}={hf[name]!r} is not supported (allowed: null, as Gemma 3 has it)")
    num_layers, num_heads = _int_field(hf, "num_hidden_layers"), _int_field(hf, "num_attention_heads")
    rope = _dict_field(hf, "rope_parameters")  # transformers >= 5: {"full_attention": {...}, "sliding_attention": ...}
    full, local = _dict_field(rope, "full_attention"), _dict_field(rope, "sliding_attention")
    theta = _real_field(full, "rope_theta", _real_field(hf, "rope_theta", 1_000_000.0), "rope_parameters.full_attention.")
    local_theta = _real_field(local, "rope_theta", _real_field(hf, "rope_local_base_freq", 10_000.0),
                              "rope_parameters.sliding_attention.")
    types = hf.get("layer_types")
    if types is None:
        pattern = _int_field(hf, "sliding_window_pattern", 6)
        types = ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(num_layers)]
    if not isinstance(types, list) or not all(isinstance(t, str) for t in types):
        raise ValueError(f"field 'layer_types' is {_show(types)} (allowed: a list of {', '.join(LAYER_TYPES)})")
    return ModelConfig(
        model_type="gemma3_text", num_layers=num_layers, hidden_size=_int_field(hf, "hidden_size"),
        intermediate_size=_int_field(hf, "intermediate_size"), num_heads=num_heads,
        num_kv_heads=_int_field(hf, "num_key_value_heads", num_heads), head_dim=_int_field(hf, "head_dim", 256),
        vocab_size=_int_field(hf, "vocab_size"), max_position_embeddings=_int_field(hf, "max_position_embeddings", 32768),
        eos_token_ids=_eos_ids(hf, generation), bos_token_id=_int_field(hf, "bos_token_id", None),
        rope_theta=theta, rms_norm_eps=_real_field(hf, "rms_norm_eps", 1e-6),
        tie_word_embeddings=_bool_field(hf, "tie_word_embeddings", True),
        attention_bias=_bool_field(hf, "attention_bias", False),
        rope_scaling=_rope_scaling(full if "rope_type" in full else _dict_field(hf, "rope_scaling")),
        sliding_window=_int_field(hf, "sliding_window", 512), layer_types=tuple(types), rope_local_theta=local_theta,
        query_pre_attn_scalar=_real_field(hf, "query_pre_attn_scalar", None),
    )


def read_checkpoint_config(folder: str | Path) -> ModelConfig:
    """ModelConfig from a checkpoint folder's config.json (+ generation_config.json when present). Any problem
    with them is a ValueError that starts with the file's path: "DIR/config.json: missing field 'vocab_size' ..."."""
    folder = Path(folder)
    path = folder / "config.json"
    hf = _read_json_object(path)
    gen_path = folder / "generation_config.json"
    generation = _read_json_object(gen_path) if gen_path.is_file() else None
    try:
        _token_id_list((generation or {}).get("eos_token_id"))  # the one field we read there
    except ValueError as exc:
        raise ValueError(f"{gen_path}: {exc}") from None
    try:
        return ModelConfig.from_hf_dict(hf, generation)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None


def _read_json_object(path: Path) -> dict[str, Any]:
    if path.exists() and not path.is_file():  # a FIFO would block until a writer came, a device never end
        raise ValueError(f"{path}: not a regular file (allowed: a checkpoint folder's JSON file)")
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ValueError(f"{path}: no such file (allowed: a checkpoint folder with config.json and *.safetensors)"
                         ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: cannot be read: {exc} (allowed: a readable UTF-8 JSON file)") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno} "
                         "(allowed: a JSON object {...})") from None
    except RecursionError:
        raise ValueError(f"{path}: JSON nested too deeply to be a model config (allowed: a JSON object {{...}})"
                         ) from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a JSON {type(data).__name__} (allowed: a JSON object {{...}})")
    return data


def _field(hf: dict[str, Any], name: str, default: Any, prefix: str, real: bool) -> Any:
    """hf[name] checked as an integer (real: a finite number, returned as float); `default` when absent or null."""
    value = hf.get(name)
    if value is None:
        if default is _MISSING:
            allowed = "a number" if real else "an integer" if prefix else (
                "a Llama-family config.json, which has all of " + ", ".join(REQUIRED_FIELDS))
            raise ValueError(f"missing field '{prefix}{name}' (allowed: {allowed})")
        return default
    ok = isinstance(value, (int, float) if real else int) and not isinstance(value, bool)
    if not ok or (real and not math.isfinite(value)):
        raise ValueError(f"field '{prefix}{name}' is {_show(value)} (allowed: {'a finite number' if real else 'an integer'})")
    return float(value) if real else value


def _show(value: Any) -> str:
    """A value for an error message, cut to 60 characters (a config field may hold anything)."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _bool_field(hf: dict[str, Any], name: str, default: bool) -> bool:
    """hf[name] as JSON true/false; `default` when absent or null. A string ("false") or a number is refused: bool()
    of either would silently read "false" as True."""
    value = hf.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ValueError(f"field '{name}' is {_show(value)} (allowed: true, false or null)")
    return value


def _int_field(hf: dict[str, Any], name: str, default: Any = _MISSING, prefix: str = "") -> Any:
    return _field(hf, name, default, prefix, real=False)


def _real_field(hf: dict[str, Any], name: str, default: Any = _MISSING, prefix: str = "") -> Any:
    return _field(hf, name, default, prefix, real=True)


def _dict_field(hf: dict[str, Any], name: str) -> dict[str, Any]:
    value = hf.get(name)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"field '{name}' is {_show(value)} (allowed: an object {{...}} or null)")
    return dict(value)


def _token_id_list(value: Any) -> tuple[int, ...]:
    """eos_token_id: null, an integer or a list of integers."""
    if value is None:
        return ()
    ids = tuple(value) if isinstance(value, (list, tuple)) else (value,)
    if any(not isinstance(i, int) or isinstance(i, bool) for i in ids):
        raise ValueError(f"field 'eos_token_id' is {_show(value)} (allowed: an integer, a list of integers, or null)")
    return ids


def _eos_ids(hf: dict[str, Any], generation: dict[str, Any]) -> tuple[int, ...]:
    # NOTE: instruct models often list extra end tokens only in generation_config.json (Llama 3's
    # <|eot_id|>); we take the union so generation stops where transformers' generate() stops.
    ids = _token_id_list(hf.get("eos_token_id")) + _token_id_list(generation.get("eos_token_id"))
    return tuple(dict.fromkeys(ids))


def _rope_scaling(scaling: dict[str, Any]) -> Llama3RopeScaling | None:
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind in (None, "default"):
        return None
    if kind != "llama3":
        raise ValueError(f"rope_scaling type {kind!r} is not supported (allowed: default, llama3)")
    return Llama3RopeScaling(
        factor=_real_field(scaling, "factor", prefix="rope_scaling."),
        low_freq_factor=_real_field(scaling, "low_freq_factor", prefix="rope_scaling."),
        high_freq_factor=_real_field(scaling, "high_freq_factor", prefix="rope_scaling."),
        original_max_position_embeddings=_int_field(scaling, "original_max_position_embeddings",
                                                    prefix="rope_scaling."),
    )
