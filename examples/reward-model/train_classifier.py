"""Train the reward model of examples/quickstart-reward-model.yaml: a tiny
Qwen2ForSequenceClassification (examples/models/tiny-qwen2's shape, the built-in
character tokenizer) that tells a right sum from a wrong one, 'a+b=c' → the
probability that c is a + b (label 1: right, 0: wrong).

It learns from sums of two numbers below 50 (the example dataset's range), half of
each batch right and half wrong, each wrong one drawn afresh: a near miss (off by a
little, a digit changed, dropped, doubled or swapped, more digits after the right
ones) or any other number below 100. Held-out sums (one in ten) measure it.

    python examples/reward-model/train_classifier.py examples/reward-model/classifier

takes about three minutes on 2 CPU cores."""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
CONFIG = HERE.parent / "models/tiny-qwen2/config.json"


def near_miss(answer: str, rng: random.Random) -> str:
    """A wrong answer close to the right one."""
    value, digits = int(answer), list(answer)
    kind = rng.randrange(6)
    if kind == 0:
        wrong = str(max(0, value + rng.choice([-1, 1]) * rng.randint(1, 10)))
    elif kind == 1:
        i = rng.randrange(len(digits))
        digits[i] = rng.choice([d for d in "0123456789" if d != digits[i]])
        wrong = "".join(digits)
    elif kind == 2:
        wrong = answer[:-1] or "0" if len(answer) > 1 else str(value + 1)
    elif kind == 3:
        wrong = answer + rng.choice("0123456789")
    elif kind == 4:
        wrong = answer[::-1] if answer[::-1] != answer else str(value + 11)
    else:
        i = rng.randrange(len(digits))
        wrong = answer[:i] + digits[i] + answer[i:]
    return wrong if wrong != answer else str(value + 1)


def wrong(answer: str, rng: random.Random) -> str:
    """A wrong answer: a near miss, or any other number below 100."""
    if rng.random() < 0.5:
        return near_miss(answer, rng)
    return str(rng.choice([n for n in range(100) if str(n) != answer]))


def split(rng: random.Random) -> tuple[list, list]:
    """(train, held-out) sums (a, b); the held-out ones as (text, label) rows, each
    sum right and wrong once."""
    sums = [(a, b) for a in range(50) for b in range(50)]
    rng.shuffle(sums)
    cut = len(sums) // 10
    held_out = []
    for a, b in sums[:cut]:
        prompt, answer = f"{a}+{b}=", str(a + b)
        held_out += [(prompt + answer, 1), (prompt + wrong(answer, rng), 0)]
    return sums[cut:], held_out


def batches(sums, tok, size: int, rng: random.Random):
    """Batches of `size` rows, half right, half wrong (drawn afresh)."""
    while True:
        rows = []
        for i, (a, b) in enumerate(rng.sample(sums, size)):
            answer = str(a + b)
            rows.append((f"{a}+{b}=" + (answer if i % 2 else wrong(answer, rng)), i % 2))
        ids = [tok.encode(t) for t, _ in rows]
        width = max(map(len, ids))
        yield (torch.tensor([x + [tok.pad_token_id] * (width - len(x)) for x in ids]),
               torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x in ids]),
               torch.tensor([label for _, label in rows]))


def accuracy(model, rows, tok) -> float:
    right = 0
    with torch.inference_mode():
        for i in range(0, len(rows), 256):
            part = rows[i:i + 256]
            ids = [tok.encode(t) for t, _ in part]
            width = max(map(len, ids))
            x = torch.tensor([r + [tok.pad_token_id] * (width - len(r)) for r in ids])
            m = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in ids])
            got = model(input_ids=x, attention_mask=m).logits.argmax(-1)
            right += sum(int(g) == label for g, (_, label) in zip(got, part))
    return right / len(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="Where to write the model.")
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    from transformers import AutoConfig, AutoModelForSequenceClassification

    from rljob.inputs.models import CharTokenizer

    rng = random.Random(args.seed)
    torch.manual_seed(args.seed)
    tok = CharTokenizer()
    config = AutoConfig.from_pretrained(CONFIG.parent)
    config.architectures = ["Qwen2ForSequenceClassification"]
    config.vocab_size, config.num_labels = len(tok), 2
    config.pad_token_id, config.tie_word_embeddings = tok.pad_token_id, False
    config.id2label, config.label2id = {0: "wrong", 1: "right"}, {"wrong": 0, "right": 1}
    model = AutoModelForSequenceClassification.from_config(config)
    train, held_out = split(rng)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, 1e-3, total_steps=args.steps)
    for step, (x, m, y) in zip(range(args.steps), batches(train, tok, 128, rng)):
        loss = torch.nn.functional.cross_entropy(model(input_ids=x, attention_mask=m).logits, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if (step + 1) % 500 == 0:
            model.eval()
            print(f"step {step + 1}: loss {loss.item():.3f}, held-out accuracy "
                  f"{accuracy(model, held_out, tok):.3f}", flush=True)
            model.train()
    model.eval()
    model.save_pretrained(args.out)
    tok.save_pretrained(args.out)
    figures = {"held_out_accuracy": accuracy(model, held_out, tok), "steps": args.steps,
               "seed": args.seed}
    (args.out / "accuracy.json").write_text(json.dumps(figures, indent=1) + "\n")
    print(f"wrote {args.out}: {figures}")


if __name__ == "__main__":
    main()
