"""A model zoo built in code: tiny checkpoints made the way the real ones are.

Each is saved with `save_pretrained` in bfloat16, with a tokenizer trained here
with `tokenizers` and a chat template in its family's style:

- `qwen2.5`: Qwen2, QKV bias, untied embeddings (as the 7B), the embedding
  padded past the tokenizer (Qwen2.5 has 152,064 rows for 151,665 tokens),
  byte-level BPE, ChatML template, EOS `<|im_end|>` and pad `<|endoftext|>`.
- `llama3`: Llama, untied, `rope_scaling` of type llama3, BPE with byte fallback,
  `<|begin_of_text|>` as BOS in the template, EOS `<|eot_id|>`, no pad token of
  its own, padded embedding.
- `qwen3`: Qwen3 (q/k RMS norm), tied embeddings, explicit head_dim, ChatML.

`build(name, root)` writes one (cached: an existing directory is reused);
`python -m tests.zoo DIR` writes them all."""

from __future__ import annotations

import json
import sys
from pathlib import Path

MODELS = ("qwen2.5", "llama3", "qwen3")

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
LLAMA3 = ("<|begin_of_text|>{% for m in messages %}<|start_header_id|>{{ m['role'] }}"
          "<|end_header_id|>\n\n{{ m['content'] }}<|eot_id|>{% endfor %}"
          "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n"
          "{% endif %}")


def _corpus() -> list[str]:
    """What the tokenizers learn from: the arithmetic prompts and answers, and words."""
    rows = [json.loads(x) for x in
            (Path(__file__).resolve().parents[1] / "examples/data/arith.jsonl").read_text()
            .splitlines() if x.strip()]
    text = [f"{r['prompt']} {r['answer']}" for r in rows]
    return text + ["the answer is a number between zero and one hundred"] * 4


def _tokenizer(style: str, vocab: int):
    from tokenizers import (Tokenizer, decoders, models, normalizers, pre_tokenizers,
                            processors, trainers)
    from transformers import PreTrainedTokenizerFast

    if style == "bytelevel":  # Qwen's and Llama-3's kind: BPE over bytes
        specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=specials,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tok.train_from_iterator(_corpus(), trainer)
        return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>",
                                       pad_token="<|endoftext|>", chat_template=CHATML)
    # sentencepiece's kind with byte fallback: unknown characters as <0xNN> pieces
    specials = ["<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>",
                "<unk>"] + [f"<0x{b:02X}>" for b in range(256)]
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.pre_tokenizer = pre_tokenizers.Split("\u2581", behavior="merged_with_previous")
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                     decoders.Fuse()])
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=specials)
    tok.train_from_iterator(_corpus(), trainer)
    bos = tok.token_to_id("<|begin_of_text|>")  # Llama-3 adds BOS to every encode
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A $B",
        special_tokens=[("<|begin_of_text|>", bos)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|begin_of_text|>",
                                   eos_token="<|eot_id|>", unk_token="<unk>",
                                   chat_template=LLAMA3)


def _padded(n: int, multiple: int = 64) -> int:
    return (n + multiple - 1) // multiple * multiple + multiple  # past the tokenizer


def _config(name: str, tok):
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config

    ids = {"bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id,
           "pad_token_id": tok.pad_token_id}
    # head_dim 32: the smallest vLLM's CPU attention kernels take
    small = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2,
             "max_position_embeddings": 256, "rms_norm_eps": 1e-6}
    if name == "qwen2.5":
        return Qwen2Config(vocab_size=_padded(len(tok)), tie_word_embeddings=False,
                           rope_theta=1e6, **small, **ids)
    if name == "llama3":  # Llama-3.1's long context over RoPE scaled from 8192
        return LlamaConfig(vocab_size=_padded(len(tok)), tie_word_embeddings=False,
                           rope_theta=5e5, **{**small, "max_position_embeddings": 16384},
                           **ids, rope_scaling={
                               "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                               "high_freq_factor": 4.0,
                               "original_max_position_embeddings": 8192})
    return Qwen3Config(vocab_size=_padded(len(tok)), tie_word_embeddings=True, head_dim=32,
                       rope_theta=1e6, **small, **ids)


def build(name: str, root: Path) -> Path:
    """The zoo model `name` under root/name (made once)."""
    import torch
    from transformers import AutoModelForCausalLM

    out = Path(root) / name
    if (out / "config.json").exists():
        return out
    tok = _tokenizer("bytefallback" if name == "llama3" else "bytelevel", 400)
    config = _config(name, tok)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():  # rows past the tokenizer are never trained: zeros, as shipped
        model.get_input_embeddings().weight[len(tok):] = 0
        if not config.tie_word_embeddings:
            model.get_output_embeddings().weight[len(tok):] = 0
    model.to(torch.bfloat16).save_pretrained(out)
    tok.save_pretrained(out)
    return out


if __name__ == "__main__":
    for m in MODELS:
        print(build(m, Path(sys.argv[1])))
