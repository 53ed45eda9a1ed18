"""A model zoo built in code: tiny checkpoints made the way the real ones are.

Each is saved with `save_pretrained` in bfloat16, with a tokenizer trained here
with `tokenizers` and a chat template in its family's style:

- `qwen2.5`: Qwen2, QKV bias, untied embeddings (as the 7B), the embedding
  padded past the tokenizer (Qwen2.5 has 152,064 rows for 151,665 tokens),
  byte-level BPE, ChatML template with Hermes-style tool calls (`<tool_call>`
  blocks, `<tool_response>` answers in a user turn), EOS `<|im_end|>` and pad
  `<|endoftext|>`.
- `llama3`: Llama, untied, `rope_scaling` of type llama3, BPE with byte fallback,
  `<|begin_of_text|>` as BOS in the template, EOS `<|eot_id|>`, no pad token of
  its own, padded embedding; Llama 3.1's tool format (schemas in the first user
  message, a JSON call, `ipython` answers).
- `qwen3`: Qwen3 (q/k RMS norm), tied embeddings, explicit head_dim, ChatML with
  Qwen2.5's tool format, and `<think>` blocks dropped from the assistant turns
  before the last user message.

`build(name, root)` writes one (cached: an existing directory is reused);
`python -m tests.zoo DIR` writes them all. `tool_caller()` is the example chat
policy after its warm-up on the calculator's native episodes (kept under
~/.cache/rljob/zoo)."""

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

# The families' tool formats, as their templates write them (the wording is ours):
# Qwen2.5 announces the function schemas in a system block between <tools> tags, the
# model calls in <tool_call> JSON blocks (hermes), and the answers go back as a user
# turn of <tool_response> blocks (consecutive tool messages share one turn).
_QWEN_TOOLS = (
    "{% if tools %}<|im_start|>system\n"
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}\n\n{% endif %}"
    "# Tools\n\nFunctions you may call, as JSON schemas:\n<tools>"
    "{% for t in tools %}\n{{ t | tojson }}{% endfor %}\n</tools>\n\n"
    "Call one by writing <tool_call>\n{\"name\": NAME, \"arguments\": {...}}\n"
    "</tool_call><|im_end|>\n"
    "{% elif messages[0]['role'] == 'system' %}<|im_start|>system\n"
    "{{ messages[0]['content'] }}<|im_end|>\n{% endif %}")
_QWEN_CALLS = ("{% for c in m.get('tool_calls') or [] %}"
               "{% if m['content'] or not loop.first %}\n{% endif %}"
               "<tool_call>\n{\"name\": \"{{ c['function']['name'] }}\", \"arguments\": "
               "{{ c['function']['arguments'] | tojson }}}\n</tool_call>{% endfor %}")
_QWEN_TOOL_MESSAGE = (
    "{% if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}"
    "<|im_start|>user{% endif %}\n<tool_response>\n{{ m['content'] }}\n</tool_response>"
    "{% if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}<|im_end|>\n"
    "{% endif %}")
QWEN25 = (_QWEN_TOOLS + "{% for m in messages %}"
          "{% if m['role'] == 'system' and loop.first %}"
          "{% elif m['role'] == 'tool' %}" + _QWEN_TOOL_MESSAGE +
          "{% else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}" + _QWEN_CALLS +
          "<|im_end|>\n{% endif %}{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# Qwen3: the same, and an assistant turn's <think> block is kept only after the last
# user message (the turns of the episode in flight), the earlier ones' dropped
QWEN3 = (_QWEN_TOOLS + "{% set ns = namespace(last=-1) %}"
         "{% for m in messages %}{% if m['role'] == 'user' %}"
         "{% set ns.last = loop.index0 %}{% endif %}{% endfor %}"
         "{% for m in messages %}"
         "{% if m['role'] == 'system' and loop.first %}"
         "{% elif m['role'] == 'tool' %}" + _QWEN_TOOL_MESSAGE +
         "{% elif m['role'] == 'assistant' %}"
         "{% set content = m['content'] %}"
         "{% if loop.index0 < ns.last and '</think>' in content %}"
         "{% set content = content.split('</think>')[-1].lstrip('\\n') %}{% endif %}"
         "<|im_start|>assistant\n{{ content }}" + _QWEN_CALLS + "<|im_end|>\n"
         "{% else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endif %}"
         "{% endfor %}"
         "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# Llama 3.1: the schemas go in the first user message, the model calls with a bare
# JSON object {"name", "parameters"}, and the answers come back as `ipython` turns
LLAMA31 = (
    "<|begin_of_text|>{% for m in messages %}"
    "{% if tools and loop.first and m['role'] == 'user' %}"
    "<|start_header_id|>user<|end_header_id|>\n\n"
    "Answer with a function call as JSON {\"name\": NAME, \"parameters\": {...}} when a "
    "function helps. The functions:{% for t in tools %}\n{{ t | tojson }}{% endfor %}"
    "\n\n{{ m['content'] }}<|eot_id|>"
    "{% elif m['role'] == 'tool' %}<|start_header_id|>ipython<|end_header_id|>\n\n"
    "{{ m['content'] }}<|eot_id|>"
    "{% else %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n{{ m['content'] }}"
    "{% for c in m.get('tool_calls') or [] %}{% if not loop.first %}; {% endif %}"
    "{\"name\": \"{{ c['function']['name'] }}\", \"parameters\": "
    "{{ c['function']['arguments'] | tojson }}}{% endfor %}<|eot_id|>{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n"
    "{% endif %}")


def _kept(template: str) -> str:
    """`template` with the newlines after its tags kept (transformers renders with
    trim_blocks, which drops a newline that follows a tag)."""
    return template.replace("%}\n", "%}{{ '\\n' }}")


TEMPLATES = {"qwen2.5": _kept(QWEN25), "llama3": _kept(LLAMA31), "qwen3": _kept(QWEN3)}
# the families' tool tokens (added tokens, as their tokenizers have them)
QWEN_ADDED = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
              "<think>", "</think>"]
LLAMA_ADDED = ["<|python_tag|>", "<|eom_id|>"]


def _corpus() -> list[str]:
    """What the tokenizers learn from: the arithmetic prompts and answers, and words."""
    rows = [json.loads(x) for x in
            (Path(__file__).resolve().parents[1] / "examples/data/arith.jsonl").read_text()
            .splitlines() if x.strip()]
    text = [f"{r['prompt']} {r['answer']}" for r in rows]
    return text + ["the answer is a number between zero and one hundred"] * 4


def _tokenizer(style: str, vocab: int, template: str | None = None, added: tuple = (),
               texts: list[str] = ()):
    """A tokenizer of `style` (its chat template `template`, by default the plain
    ChatML or Llama-3 one; `added`: tokens added as the families' tool tags are;
    `texts`: more to learn from)."""
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
        tok.train_from_iterator(_corpus() + list(texts), trainer)
        tok.add_tokens(list(added))
        return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>",
                                       pad_token="<|endoftext|>",
                                       chat_template=template or CHATML)
    # sentencepiece's kind with byte fallback: unknown characters as <0xNN> pieces
    specials = ["<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>",
                "<unk>"] + [f"<0x{b:02X}>" for b in range(256)]
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.pre_tokenizer = pre_tokenizers.Split("\u2581", behavior="merged_with_previous")
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                     decoders.Fuse()])
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=specials)
    tok.train_from_iterator(_corpus() + list(texts), trainer)
    bos = tok.token_to_id("<|begin_of_text|>")  # Llama-3 adds BOS to every encode
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A $B",
        special_tokens=[("<|begin_of_text|>", bos)])
    tok.add_special_tokens(list(added))
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|begin_of_text|>",
                                   eos_token="<|eot_id|>", unk_token="<unk>",
                                   chat_template=template or LLAMA3)


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
    llama = name == "llama3"
    tok = _tokenizer("bytefallback" if llama else "bytelevel", 400, TEMPLATES[name],
                     tuple(LLAMA_ADDED if llama else QWEN_ADDED))
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


def chat_tokenizer(out: Path, vocab: int = 1000) -> Path:
    """The tokenizer of `examples/models/tiny-chat` (shipped; this makes it again):
    Qwen2.5's format (QWEN25: ChatML, hermes tool calls), its BPE learnt on the
    arithmetic data and on the tool format's text, so that the tools' announcement
    and a call are a few tokens each."""
    import shutil

    from rljob.tools.functions import resolve

    draft = _tokenizer("bytelevel", 400, TEMPLATES["qwen2.5"], tuple(QWEN_ADDED))
    tools = [t.schema for t in resolve(["calculator"])]
    rows = [json.loads(x) for x in (Path(__file__).resolve().parents[1]
                                    / "examples/data/calc-tools.jsonl").read_text().splitlines()]
    talks = [draft.apply_chat_template([{"role": "user", "content": r["prompt"]},
                                        *r["demonstration"]], tools=tools, tokenize=False)
             for r in rows]
    tok = _tokenizer("bytelevel", vocab, TEMPLATES["qwen2.5"], tuple(QWEN_ADDED), talks)
    out = Path(out)
    shutil.rmtree(out / "tokenizer", ignore_errors=True)
    tok.save_pretrained(out)
    return out


def tool_caller(steps: int = 150, cache: Path | None = None) -> Path:
    """`examples/models/tiny-chat` (random init, Qwen2.5's tool format) after `steps`
    steps of warm-up on examples/data/calc-tools.jsonl, its calculator announced by
    the MCP server examples/tools/calculator_server.py: a policy that calls it in
    Qwen2.5's format (at 150 steps about 20 of 32 episodes a step call it well), for
    the tests of MCP jobs, which need no warm-up of their own. Made by `rljob run` of
    examples/agentic-tools.yaml so changed (its warm-up, then one RL step; its final
    weights), once: kept under `cache` (~/.cache/rljob/zoo), keyed by the files it is
    made from (the example, its data, model and server, the warm-up's code): about 7
    minutes of a core on a fresh machine; a second caller meanwhile waits."""
    import fcntl
    import hashlib
    import os
    import shutil
    import subprocess
    import tempfile

    import yaml

    repo = Path(__file__).resolve().parents[1]
    sources = [repo / "examples/agentic-tools.yaml", repo / "examples/data/calc-tools.jsonl",
               repo / "examples/tools/calculator_server.py",
               *sorted((repo / "examples/models/tiny-chat").iterdir()),
               repo / "runtime/rljob/trainer/warmup.py", repo / "runtime/rljob/inputs/models.py"]
    key = hashlib.sha256(str(steps).encode())
    for f in sources:
        key.update(f.name.encode() + f.read_bytes())
    cache = Path(cache or os.environ.get("RLJOB_ZOO_CACHE",
                                         Path.home() / ".cache/rljob/zoo"))
    out = cache / f"tool-caller-{key.hexdigest()[:16]}"
    cache.mkdir(parents=True, exist_ok=True)
    with (cache / "tool-caller.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # both test lanes may ask at once: one makes it
        if (out / "config.json").exists():
            return out
        with tempfile.TemporaryDirectory(dir=cache) as tmp:
            doc = yaml.safe_load((repo / "examples/agentic-tools.yaml").read_text())
            spec = doc["spec"]
            spec["model"]["path"] = f"random:{repo / 'examples/models/tiny-chat'}"
            spec["model"]["warmupSteps"] = steps
            # one file of calling episodes, for the warm-up and the step after it
            spec["dataset"] = {"path": str(repo / "examples/data/calc-tools.jsonl")}
            spec["algorithm"]["maxSteps"] = 1
            spec["rollout"]["tools"] = []
            spec["rollout"]["mcpServers"] = [{"name": "calc", "command": [
                sys.executable, str(repo / "examples/tools/calculator_server.py")]}]
            job = Path(tmp) / "job.yaml"
            job.write_text(yaml.safe_dump(doc))
            done = subprocess.run([sys.executable, "-m", "rljob", "run", str(job),
                                   "--run-dir", str(Path(tmp) / "run")], capture_output=True,
                                  text=True, cwd=repo, timeout=1800)
            if done.returncode != 0:
                raise RuntimeError(f"the tool caller's warm-up failed: {done.stderr[-2000:]}")
            (Path(tmp) / "run" / "final").rename(out)  # whole or not at all
        for old in cache.glob("tool-caller-*"):  # those of older inputs
            if old != out:
                shutil.rmtree(old, ignore_errors=True)
    return out


if __name__ == "__main__":
    if sys.argv[1] == "--chat-tokenizer":
        print(chat_tokenizer(Path(sys.argv[2])))
    else:
        for m in MODELS:
            print(build(m, Path(sys.argv[1])))


def reward_classifier(out: Path) -> Path:
    """A randomly initialised sequence classifier of examples/models/tiny-qwen2's shape
    (two labels, the built-in character tokenizer): a reward model whose scores a test
    compares with the model's own."""
    from transformers import AutoConfig, AutoModelForSequenceClassification

    from rljob.inputs.models import CharTokenizer

    tok = CharTokenizer()
    config = AutoConfig.from_pretrained(Path(__file__).resolve().parents[1]
                                        / "examples/models/tiny-qwen2")
    config.vocab_size, config.num_labels, config.pad_token_id = len(tok), 2, tok.pad_token_id
    config.architectures = ["Qwen2ForSequenceClassification"]
    AutoModelForSequenceClassification.from_config(config).save_pretrained(out)
    tok.save_pretrained(out)
    return out
