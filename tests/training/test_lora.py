"""model.lora end to end: `rljob run` of the quickstart with an adapter (real processes,
PEFT on the torch trainer, the hf rollout engine)."""

from __future__ import annotations

import json
import re

import torch
import yaml

from .test_runtime import REPO, job, metrics, rljob_run

ADAPTER = re.compile(r"\.lora_[AB]\.")
UPDATE = re.compile(r"loaded version (\d+) \(([\d.]+) MB\)")


def _optimizer_mb(run_dir) -> float:
    log = (run_dir / "logs" / "trainer-0.log").read_text()
    return float(re.findall(r"optimizer state on this rank: ([\d.]+) MB", log)[-1])


def test_a_lora_job_trains_its_adapter_alone_resumes_and_saves_it_with_merged_weights(
        tmp_path):
    """The adapter trains and nothing else: its optimizer holds the adapter's state
    (a fraction of the full model's), the base weights are the same in every
    checkpoint, the rollouts sample with the adapter merged in (their log-probs are the
    trainer's up to rounding, step after step), a resumed run goes on from the
    adapter's checkpoint, and final/ holds the merged model and the adapter."""
    from peft import PeftModel
    from safetensors.torch import load_file

    from rljob.api.spec import ModelSpec
    from rljob.inputs.models import build_model, load_tokenizer
    from rljob.trainer.lora import hf_name

    # two trainer ranks: the adapter's gradients all-reduced (DDP made again around the
    # adapted model), its optimizer state sharded (ZeRO-1)
    path = job(tmp_path, "lora", model={"lora": {"rank": 4, "alpha": 8}},
               algorithm={"lr": 2.0e-3}, trainer={"checkpointEvery": 2, "npusPerNode": 2})
    run_dir = tmp_path / "run"
    rljob_run(path, run_dir, "--max-steps", "4")
    # the full model's AdamW state is 4.84 MB here (one rank); the adapter's (r=4)
    # 0.26 MB, in two shards
    assert _optimizer_mb(run_dir) < 0.2
    ck4 = torch.load(run_dir / "checkpoints/step-4/trainer.pt", weights_only=True)
    assert ck4["lora"] and "ref" not in ck4
    rljob_run(path, run_dir, "--resume", str(run_dir), "--max-steps", "6")
    rows = metrics(run_dir)
    assert [m["step"] for m in rows] == [1, 2, 3, 4, 5, 6]
    ck6 = torch.load(run_dir / "checkpoints/step-6/trainer.pt", weights_only=True)
    base = [k for k in ck6["model"] if not ADAPTER.search(k)]
    adapter = [k for k in ck6["model"] if ADAPTER.search(k)]
    assert base and adapter and set(ck4["model"]) == set(ck6["model"])
    assert all(torch.equal(ck4["model"][k], ck6["model"][k]) for k in base)
    assert any(not torch.equal(ck4["model"][k], ck6["model"][k]) for k in adapter)
    # what the rollouts sampled with is what the trainer computes: the adapter reached
    # them (a base without it would drift from the trainer as the adapter trains)
    mismatch = [m["logp_mismatch_max"] for m in rows if m.get("logp_mismatch_max") is not None]
    assert mismatch and max(mismatch) < 1e-3, mismatch
    # the updates were the adapter alone: each replica took the base once a trainer
    # life (its first version, and the resumed life's), then 0.13 MB a version
    full = sum(v.numel() * 4 for k, v in ck6["model"].items() if k in base)
    for replica in ("rollout-0", "rollout-1"):
        text = (run_dir / "logs" / f"{replica}.log").read_text()
        loads = [(int(v), float(mb) * 1e6) for v, mb in UPDATE.findall(text)]
        whole = [v for v, size in loads if size >= full]
        assert whole == [0, 4], loads  # the first life's first, the resumed life's first
        small = [size for _, size in loads if size < full]
        assert len(small) >= 2 and len(small) == len(loads) - 2 and max(small) < full / 10

    final = run_dir / "final"
    config = json.loads((final / "adapter" / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["lora_alpha"] == 8
    spec = ModelSpec(path=f"random:{REPO / 'examples/models/tiny-qwen2'}",
                     tokenizer="builtin:char", dtype="float32")
    tok = load_tokenizer(spec)
    merged = build_model(spec, tok, dtype=torch.float32)
    merged.load_state_dict(load_file(str(final / "model.safetensors")))
    # the adapter in PEFT's format on the base of the last checkpoint computes what
    # the merged model computes
    plain = build_model(spec, tok, dtype=torch.float32)
    plain.load_state_dict({hf_name(k): v for k, v in ck6["model"].items() if k in base})
    lora = PeftModel.from_pretrained(plain, str(final / "adapter"))
    ids = torch.tensor([tok.encode("12+34=")])
    with torch.no_grad():
        assert torch.allclose(lora(input_ids=ids).logits, merged(input_ids=ids).logits,
                              atol=1e-5)
    # `rljob export`: any checkpoint's adapter alone, or merged (the newest is final/'s)
    import subprocess
    import sys

    def export(*args):
        return subprocess.run([sys.executable, "-m", "rljob", "export", str(run_dir), *args],
                              capture_output=True, text=True, timeout=300)

    out = export(str(tmp_path / "step4"), "--step", "4")
    assert out.returncode == 0 and "adapter in PEFT's format" in out.stdout, out.stderr
    adapter4 = load_file(str(tmp_path / "step4" / "adapter_model.safetensors"))
    assert adapter4 and all(ADAPTER.search(k) for k in adapter4)
    assert all(torch.equal(v, ck4["model"][k.replace(".weight", ".default.weight")])
               for k, v in adapter4.items())
    out = export(str(tmp_path / "merged"), "--merge")
    assert out.returncode == 0 and "step 6" in out.stdout, out.stderr
    again = load_file(str(tmp_path / "merged" / "model.safetensors"))
    assert again.keys() == load_file(str(final / "model.safetensors")).keys()
    assert all(torch.equal(v, merged.state_dict()[k]) for k, v in again.items())
    out = export(str(tmp_path / "none"), "--step", "3")
    assert out.returncode == 1 and out.stderr.strip() == (
        f"--step 3: {run_dir} has checkpoints of steps 2, 4, 6")


def test_with_an_adapter_periodic_makes_bit_identical_updates_to_sync(tmp_path):
    """The on-policy modes with model.lora at temperature 0.8 and top-p 0.9: periodic
    (adapter updates over gRPC) trains the same adapter as sync (updates broadcast over
    the collective path), bit for bit, step after step; the base stays the warmed
    model's; the rollouts' log-probs of fresh samples are the trainer's to float32
    rounding."""
    runs = {}
    for mode, transport in (("sync", "collective"), ("periodic", "grpc")):
        path = job(tmp_path, f"lora-{mode}", model={"lora": {"rank": 8, "alpha": 16}},
                   algorithm={"lr": 2.0e-3},
                   workflow={"mode": mode, "weightTransport": transport},
                   rollout={"temperature": 0.8, "topP": 0.9})
        doc = yaml.safe_load(path.read_text())
        del doc["spec"]["workflow"]["maxStaleness"]
        path.write_text(yaml.safe_dump(doc))
        rljob_run(path, tmp_path / mode, "--max-steps", "3")
        runs[mode] = tmp_path / mode
    cks = {m: torch.load(d / "checkpoints/step-3/trainer.pt", weights_only=True)["model"]
           for m, d in runs.items()}
    ms = {m: metrics(d) for m, d in runs.items()}
    adapter = [k for k in cks["sync"] if ADAPTER.search(k)]
    assert cks["periodic"].keys() == cks["sync"].keys()
    assert all(torch.equal(cks["periodic"][k], cks["sync"][k]) for k in cks["sync"])
    assert [x["reward_mean"] for x in ms["periodic"]] == [x["reward_mean"] for x in ms["sync"]]
    assert any(float(cks["sync"][k].abs().max()) > 0 for k in adapter if ".lora_B." in k)
    logs = sorted((runs["sync"] / "logs").glob("rollout-*.log"))
    assert logs and all("joined weight group" in p.read_text() for p in logs)
    mismatch = [x["logp_mismatch_max"] for m in ms.values() for x in m
                if x.get("logp_mismatch_max") is not None]
    print(f"\nLoRA at T=0.8, top-p 0.9: rollout/trainer log-prob mismatch max "
          f"{max(mismatch):.2e} over {len(mismatch)} step(s)")
    assert len(mismatch) >= 4 and max(mismatch) < 1e-4
