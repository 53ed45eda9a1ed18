"""Prompt datasets: JSONL or Parquet, configurable keys, a resumable cursor."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path

from ..api.spec import DatasetSpec


@dataclass(frozen=True)
class Example:
    prompt: str
    answer: str
    extra: dict = field(default_factory=dict, compare=False)  # the row's other keys


def load_examples(spec: DatasetSpec, name: str = "dataset.path") -> list[Example]:
    """The rows of `spec.path`; a problem is one line that starts with `name`, the
    field that gave the file."""
    path = Path(spec.path)
    fmt = spec.format
    if fmt == "auto":
        fmt = "parquet" if path.suffix in (".parquet", ".pq") else "jsonl"
    if not path.is_file():
        raise ValueError(f"{name} {spec.path!r} does not exist")
    if fmt == "parquet":
        import pyarrow.parquet as pq

        try:
            rows = pq.read_table(path).to_pylist()
        except Exception as exc:  # noqa: BLE001 - pyarrow's errors for a file that is not parquet
            raise ValueError(f"{name} {spec.path!r} is not valid parquet: {exc}") from None
        where = [f"row {n}" for n in range(1, len(rows) + 1)]
    else:
        rows, where = [], []
        try:
            with path.open(encoding="utf-8") as f:
                for number, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    where.append(f"line {number}")
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError as exc:
                        raise ValueError(f"{name} {spec.path!r} line {number} is not "
                                         f"JSON: {exc.msg} (column {exc.colno})") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"{name} {spec.path!r} cannot be read as JSONL: {exc}") from None
    if not rows:
        raise ValueError(f"{name} {spec.path!r} has no rows")
    _check_rows(spec, rows, where, name)
    keys = (spec.prompt_key, spec.answer_key)
    return [Example(str(r[spec.prompt_key]), str(r[spec.answer_key]),
                    {k: v for k, v in r.items() if k not in keys}) for r in rows]


def _check_rows(spec: DatasetSpec, rows: list, where: list[str], name: str) -> None:
    """Every row an object with the prompt and answer keys; the first that is not is
    named by its line (JSONL) or row (Parquet)."""
    if not isinstance(rows[0], dict):
        raise ValueError(f"{name} {spec.path!r}: rows must be JSON objects, the first "
                         f"is a {type(rows[0]).__name__}")
    keys = (spec.prompt_key, spec.answer_key)
    missing = [k for k in keys if k not in rows[0]]
    if missing:
        raise ValueError(f"{name} {spec.path!r}: rows have no key "
                         f"{', '.join(repr(k) for k in missing)} (their keys: "
                         f"{', '.join(sorted(rows[0]))}); set dataset.promptKey / "
                         "dataset.answerKey to the prompt's and the answer's keys")
    for row, at in zip(rows, where):
        if not isinstance(row, dict):
            raise ValueError(f"{name} {spec.path!r} {at} is a {type(row).__name__}, "
                             "not an object: every row needs the prompt and answer keys")
        missing = [k for k in keys if k not in row]
        if missing:
            raise ValueError(f"{name} {spec.path!r} {at} has no key "
                             f"{', '.join(repr(k) for k in missing)} (the first row has "
                             "it): every row needs dataset.promptKey and dataset.answerKey")


def prompt_columns(tokenizer, examples: list[Example], group_size: int,
                   groups: list[int] | None = None, tools: list[dict] | None = None
                   ) -> dict[str, list]:
    """TransferQueue rows of prompts, rendered and tokenized, `group_size` rows per
    example; example k is group `groups[k]` of its step (default k), whose rows
    hold slots groups[k]·G ... groups[k]·G + G − 1. `tools`: the function schemas
    the chat template announces."""
    import numpy as np

    g = group_size
    groups = list(range(len(examples))) if groups is None else groups
    prompts = [render_prompt(tokenizer, e.prompt, tools) for e in examples]
    ids = [np.asarray(encode_rendered(tokenizer, p), dtype=np.int32) for p in prompts]
    # the row's other keys, for a reward that asks for them (reward/__init__.py): made
    # plain once an example, each row a copy of its own
    extras = [_plain_json(e.extra) if e.extra else None for e in examples]
    return {"prompt": [p for p in prompts for _ in range(g)],
            "answer": [e.answer for e in examples for _ in range(g)],
            "extra": [json.loads(x) if x else {} for x in extras for _ in range(g)],
            "prompt_ids": [x for x in ids for _ in range(g)],
            "slot": [k * g + j for k in groups for j in range(g)]}


def _plain_json(row: dict) -> str:
    """A row's values as JSON text (a Parquet row's arrays become lists)."""
    return json.dumps(row, default=lambda v: v.tolist() if hasattr(v, "tolist") else str(v))


def render_prompt(tokenizer, prompt: str, tools: list[dict] | None = None) -> str:
    """Apply the tokenizer's chat template when it has one (`tools`: the function
    schemas it announces, rollout.tools)."""
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                             tokenize=False, add_generation_prompt=True,
                                             **({"tools": tools} if tools else {}))
    return prompt


def encode_rendered(tokenizer, rendered: str) -> list[int]:
    """The ids of a rendered prompt. A chat template writes its own special tokens
    (Llama-3's begins with <|begin_of_text|>): the tokenizer adds none of its own
    then, or the prompt would start with two BOS."""
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.encode(rendered, add_special_tokens=False)
    return tokenizer.encode(rendered)


def prompt_ids(tokenizer, prompt: str, tools: list[dict] | None = None) -> list[int]:
    """A dataset prompt as the model sees it: rendered, then encoded."""
    return encode_rendered(tokenizer, render_prompt(tokenizer, prompt, tools))


class PromptCursor:
    """Walks the dataset in a seeded order, epoch after epoch; its state
    (epoch, position) is saved with checkpoints so a resumed job continues."""

    def __init__(self, examples: list[Example], seed: int, epoch: int = 0, position: int = 0):
        self.examples = examples
        self.seed = seed
        self.epoch = epoch
        self.position = position
        self._order = self._shuffle(epoch)

    def _shuffle(self, epoch: int) -> list[int]:
        order = list(range(len(self.examples)))
        random.Random(self.seed * 100_003 + epoch).shuffle(order)
        return order

    def take(self, n: int) -> list[Example]:
        out = []
        while len(out) < n:
            if self.position >= len(self._order):
                self.epoch += 1
                self.position = 0
                self._order = self._shuffle(self.epoch)
            out.append(self.examples[self._order[self.position]])
            self.position += 1
        return out

    @classmethod
    def at_step(cls, examples: list[Example], seed: int, step: int, per_step: int
                ) -> PromptCursor:
        """Where step `step` starts when every step takes `per_step` prompts: a cursor
        needs no saved state, so a restarted driver resumes anywhere."""
        taken = step * per_step
        return cls(examples, seed, taken // len(examples), taken % len(examples))

    def state(self) -> dict:
        return {"epoch": self.epoch, "position": self.position}
