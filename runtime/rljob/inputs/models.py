"""Tokenizers and policy models: built in code for tests and the quickstart,
loaded with transformers otherwise (from local paths; nothing is downloaded
unless the path is a hub name)."""

from __future__ import annotations

import json
import string
from pathlib import Path

from ..api.spec import ModelSpec

BUILTIN_CHAR = "builtin:char"
# what ends a model's turn besides its tokenizer's EOS, where the tokenizer has it as
# one token: Llama 3.1's <|eom_id|> ends a turn that called a tool after <|python_tag|>
# (the turn waits for the tool's answer; its EOS, <|eot_id|>, ends one that does not)
TURN_END_TOKENS = ("<|eom_id|>",)


def turn_end_ids(tok) -> tuple[int, ...]:
    """The tokens that end a model's turn: the EOS first, then `TURN_END_TOKENS` the
    tokenizer has as single tokens."""
    ends = [tok.eos_token_id] if tok.eos_token_id is not None else []
    convert = getattr(tok, "convert_tokens_to_ids", None)
    for token in TURN_END_TOKENS if convert is not None else ():
        i = convert(token)
        if isinstance(i, int) and i != getattr(tok, "unk_token_id", None) and i not in ends \
                and tok.decode([i]) == token:
            ends.append(i)
    return tuple(ends)


class CharTokenizer:
    """One token per printable ASCII character, plus pad/bos/eos."""

    pad_token = "<pad>"
    bos_token = "<bos>"
    eos_token = "<eos>"
    chat_template = None

    def __init__(self):
        specials = [self.pad_token, self.bos_token, self.eos_token]
        chars = [c for c in string.printable if c not in "\x0b\x0c\r"]
        self.vocab = specials + chars
        self.ids = {t: i for i, t in enumerate(self.vocab)}
        self.pad_token_id, self.bos_token_id, self.eos_token_id = 0, 1, 2

    def __len__(self) -> int:
        return len(self.vocab)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        unknown = sorted({c for c in text if c not in self.ids})
        if unknown:
            raise ValueError(f"characters outside the built-in vocabulary: {unknown}")
        ids = [self.ids[c] for c in text]
        return [self.bos_token_id, *ids] if add_special_tokens else ids

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        out = []
        for i in ids:
            i = int(i)
            if i == self.eos_token_id and skip_special_tokens:
                break
            if i < 3 and skip_special_tokens:
                continue
            out.append(self.vocab[i])
        return "".join(out)

    def save_pretrained(self, path: str | Path) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)
        (Path(path) / "rljob_tokenizer.json").write_text(json.dumps({"type": BUILTIN_CHAR}))



def model_config(spec: ModelSpec) -> dict | None:
    """The model's config.json when its directory is on this machine (`random:DIR`
    too); None for a hub id or a directory without one. (`rljob validate` reports
    what is wrong with it instead: preflight.py.)"""
    config = Path(spec.path.removeprefix("random:")) / "config.json"
    return json.loads(config.read_text()) if config.is_file() else None

def load_tokenizer(spec: ModelSpec):
    name = spec.tokenizer_path
    if name == BUILTIN_CHAR:
        return CharTokenizer()
    path = name.removeprefix("random:")
    marker = Path(path) / "rljob_tokenizer.json"
    if marker.is_file() and json.loads(marker.read_text()).get("type") == BUILTIN_CHAR:
        return CharTokenizer()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def build_model(spec: ModelSpec, tokenizer, seed: int = 0, dtype=None):
    """The policy: random init from a config directory (`random:DIR`) or pretrained."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch_dtype = dtype or getattr(torch, spec.dtype)
    if spec.path.startswith("random:"):
        config = AutoConfig.from_pretrained(spec.path.removeprefix("random:"))
        config.vocab_size = len(tokenizer)
        config.pad_token_id = tokenizer.pad_token_id
        config.bos_token_id = tokenizer.bos_token_id
        config.eos_token_id = tokenizer.eos_token_id
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
    else:
        model = AutoModelForCausalLM.from_pretrained(spec.path, dtype=torch_dtype)
    model.config.use_cache = True
    return model
