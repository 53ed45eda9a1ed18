"""How well the final policies of runs add: each prompt of the dataset sampled 8
times as the rollouts sample (temperature 1), scored by arith_partial and by exact
match, means printed per run (and for the warmed-up model the runs started from,
their reference).

    python examples/reward-model/evaluate.py RUN_DIR [RUN_DIR ...]"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
DATA = HERE.parent / "data/arith.jsonl"


def evaluate(model, rows, tok, samples: int = 8, seed: int = 0) -> tuple[float, float]:
    from rljob.reward.builtin import arith_partial, exact_match

    torch.manual_seed(seed)
    partial = exact = n = 0.0
    for i in range(0, len(rows), 64):
        part = rows[i:i + 64]
        for row in part:
            ids = torch.tensor([tok.encode(row["prompt"])] * samples)
            out = model.generate(ids, max_new_tokens=6, do_sample=True, temperature=1.0,
                                 top_k=0, top_p=1.0, pad_token_id=tok.pad_token_id,
                                 eos_token_id=tok.eos_token_id)
            for seq in out[:, ids.shape[1]:].tolist():
                text = tok.decode(seq)
                partial += arith_partial(row["prompt"], text, row["answer"])
                exact += exact_match(row["prompt"], text, row["answer"])
                n += 1
    return partial / n, exact / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path)
    args = parser.parse_args()

    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    from rljob.inputs.models import CharTokenizer

    tok = CharTokenizer()
    rows = [json.loads(line) for line in DATA.read_text().splitlines()]
    for run in args.runs:
        for name in ("reference", "final"):
            if name == "final":
                model = AutoModelForCausalLM.from_pretrained(run / "final")
            else:
                model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(run / "final"))
                missing, unexpected = model.load_state_dict(
                    load_file(run / "reference.safetensors"), strict=False)
                assert not unexpected and set(missing) <= {"lm_head.weight"}, missing  # tied
            partial, exact = evaluate(model.eval(), rows, tok)
            print(json.dumps({"run": str(run), "model": name, "arith_partial": round(partial, 4),
                              "exact_match": round(exact, 4)}), flush=True)


if __name__ == "__main__":
    main()
