"""Whole runs with the real vLLM rollout engine (CPU build): the README's vLLM
quickstart and the agentic example learn, and `rljob bench engines` prints both
engines side by side."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.tiers import import_or_skip  # noqa: E402
import_or_skip("vllm", "vllm", "the vLLM tier runs in tests/vllm/setup.sh's environment")

REPO = Path(__file__).resolve().parents[2]


def _env() -> dict:
    path = os.pathsep.join([str(REPO / "runtime"), str(REPO / "operator"),
                            os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path}


@pytest.mark.timeout(1800)
def test_the_vllm_quickstart_learns(tmp_path):
    """examples/quickstart-vllm.yaml as it is: its 300 steps are what the learning
    claim is about, so the test stays long (2 min alone on a quiet 2-core machine with
    AVX-512, where 150 steps rose only 0.04-0.05; about twice that beside the other
    lanes, more on a slower one: hence its limit)."""
    job = REPO / "examples" / "quickstart-vllm.yaml"
    spec = yaml.safe_load(job.read_text())["spec"]
    out = subprocess.run([sys.executable, "-m", "rljob", "run", str(job), "--run-dir",
                          str(tmp_path / "run")], capture_output=True, text=True, cwd=REPO,
                         env=_env(), timeout=1700)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rollout_log = (tmp_path / "run" / "logs" / "rollout-0.log").read_text()
    assert "WeightUpdateExtension" in rollout_log  # the vLLM engine generated, not hf
    ms = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    steps = spec["algorithm"]["maxSteps"]
    samples = spec["algorithm"]["promptsPerStep"] * spec["algorithm"]["groupSize"]
    assert [m["step"] for m in ms] == list(range(1, steps + 1))
    assert all(m["samples"] == samples for m in ms)
    assert max(m["staleness_max"] for m in ms) <= spec["workflow"]["maxStaleness"]
    assert len({v for m in ms for v in m["versions"]}) > steps // 2  # weights kept updating
    window = 30
    means = [sum(m["reward_mean"] for m in ms[i:i + window]) / window
             for i in range(0, steps, window)]
    print("mean reward per 30 steps:", " → ".join(f"{r:.2f}" for r in means))
    assert means[-1] > means[0] + 0.05
    # vLLM's log-probs at temperature 0.8, top-p 0.9 are the distribution the trainer
    # scores: the importance weights stay near 1 (vLLM's raw softmax would put them
    # far off), and on fresh samples rollout and trainer agree to float32 rounding
    later = ms[2:]
    weight = sum(m["is_weight_mean"] for m in later) / len(later)
    capped = sum(m["is_capped"] for m in later) / len(later)
    ess = sum(m["is_ess"] for m in later) / len(later)
    mismatch = [m["logp_mismatch_mean"] for m in ms if m["logp_mismatch_mean"] is not None]
    print(f"importance weights: mean {weight:.4f}, capped {capped:.4f}, ESS {ess:.4f}; engine "
          f"mismatch on {len(mismatch)} step(s) with fresh samples: mean "
          f"{sum(mismatch) / len(mismatch):.2e}, max "
          f"{max(m['logp_mismatch_max'] for m in ms if m['logp_mismatch_max'] is not None):.2e}")
    assert 0.95 < weight < 1.05 and capped < 0.02 and ess > 0.9
    assert mismatch and max(mismatch) < 1e-3
    # the run's live profile: vLLM's groups, each timed among the sequences in flight
    from rljob.api.validation import load_rljob
    from rljob.planner.live import profile_from_run

    prof = profile_from_run(tmp_path / "run", load_rljob(job).spec)
    print("live profile: decode step " + ", ".join(
        f"{b:g} in flight {t * 1e3:.1f} ms" for b, t in zip(prof.gen.batch_sizes,
                                                          prof.gen.ptl_seconds))
          + f"; trainer {prof.train.tokens_per_second[0]:.0f} tokens/s")
    assert prof.meta["engine"] == "vllm" and prof.gen.batch_sizes
    assert all(t > 0 for t in prof.gen.ptl_seconds) and prof.train.tokens_per_second[0] > 0


def test_bench_engines_prints_both_engines(tmp_path):
    out = subprocess.run([sys.executable, "-m", "rljob", "bench", "engines", "--steps", "5",
                          "--json"], capture_output=True, text=True, cwd=REPO, env=_env(),
                         timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    results = json.loads(out.stdout)
    print(json.dumps({k: results[k] for k in ("engines", "vllm_over_hf")}, indent=1))
    for engine in ("hf", "vllm"):
        e = results["engines"][engine]
        assert e["steps"] == 2  # the first 3 are not measured
        assert e["generated_tokens_per_s"] > 0 and e["weight_updates"] >= 1
        assert e["weight_update_seconds"] > 0
    assert results["vllm_over_hf"]["generated_tokens_per_s"] == pytest.approx(
        results["engines"]["vllm"]["generated_tokens_per_s"]
        / results["engines"]["hf"]["generated_tokens_per_s"])


@pytest.mark.timeout(1800)
def test_the_agentic_example_learns_on_vllm(tmp_path):
    """examples/agentic-calculator-vllm.yaml: episodes on vLLM (a request per turn on
    the episode's prefix, stopped at </calc>, the calculator answering in a thread
    while the other episodes generate). Over its 40 steps the reward and the
    calculator calls a step rise from the first 20 steps to the last 20; every step
    has tool calls and observation tokens and no episode errors; each tool call is
    a span on the timeline. Its 40 steps are the learning claim: the test stays long,
    and its limit leaves room for a slow machine."""
    job = REPO / "examples" / "agentic-calculator-vllm.yaml"
    spec = yaml.safe_load(job.read_text())["spec"]
    run = tmp_path / "run"
    out = subprocess.run([sys.executable, "-m", "rljob", "run", str(job), "--run-dir",
                          str(run)], capture_output=True, text=True, cwd=REPO, env=_env(),
                         timeout=1700)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "WeightUpdateExtension" in (run / "logs" / "rollout-0.log").read_text()
    ms = [json.loads(line) for line in (run / "metrics.jsonl").open()]
    steps = spec["algorithm"]["maxSteps"]
    assert [m["step"] for m in ms] == list(range(1, steps + 1))
    budget, turns = spec["rollout"]["maxNewTokens"], spec["rollout"]["maxTurns"]
    for m in ms:
        assert m["tool_calls"] > 0 and m["observation_tokens"] > 0 and m["episode_errors"] == 0
        assert 1 <= m["turns_mean"] <= m["turns_max"] <= turns
        assert m["response_length"] <= budget
        assert m["staleness_max"] <= spec["workflow"]["maxStaleness"]
    half = steps // 2

    def mean(key, part):
        return sum(m[key] for m in part) / len(part)

    first, last = ms[:half], ms[half:]
    well = [1 - sum(m["tool_errors"] for m in p) / sum(m["tool_calls"] for m in p)
            for p in (first, last)]
    print(f"agentic example on vLLM, steps 1-{half} → {half + 1}-{steps}: reward "
          f"{mean('reward_mean', first):.3f} → {mean('reward_mean', last):.3f}, tool calls a "
          f"step {mean('tool_calls', first):.1f} → {mean('tool_calls', last):.1f}, well-formed "
          f"{well[0]:.0%} → {well[1]:.0%}, turns {mean('turns_mean', first):.2f} → "
          f"{mean('turns_mean', last):.2f}")
    assert mean("reward_mean", last) > mean("reward_mean", first)
    assert mean("tool_calls", last) > mean("tool_calls", first)
    spans = [json.loads(x) for x in (run / "spans" / "rollout-0.jsonl").read_text().splitlines()]
    tools = [s for s in spans if s["kind"] == "tool"]
    # every trained call's span (and those of groups generated past the last step)
    assert len(tools) >= sum(m["tool_calls"] for m in ms)
    assert all(0 <= s["end"] - s["start"] < 5 for s in tools)


@pytest.mark.timeout(900)
def test_a_lora_job_on_vllm_serves_its_adapter_per_version_through_partial_rollouts(tmp_path):
    """examples/quickstart-lora.yaml with rollout.engine vllm, updates interrupting the
    samples in flight and keeping their cache (partial rollout): vLLM serves the
    adapter, each update is the adapter alone after the first (the base with it), the
    run ends, and the rollout's log-probs are the trainer's to float32 rounding.
    Whether a sample crosses an update here depends on the machine's timing (on a
    quiet one most steps had some); test_engine's LoRA test makes samples cross one."""
    job = yaml.safe_load((REPO / "examples" / "quickstart-lora.yaml").read_text())
    spec = job["spec"]
    spec["model"]["path"] = f"random:{REPO / 'examples/models/tiny-qwen2'}"
    spec["model"]["warmupSteps"] = 30
    spec["dataset"]["path"] = str(REPO / "examples/data/arith.jsonl")
    spec["algorithm"]["maxSteps"] = 6
    spec["rollout"].update(engine="vllm", replicas=1, maxNumSeqs=64)
    spec["workflow"].update(weightUpdate="interrupt", interruptCache="keep")
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    run = tmp_path / "run"
    out = subprocess.run([sys.executable, "-m", "rljob", "run", str(path), "--run-dir",
                          str(run)], capture_output=True, text=True, cwd=REPO, env=_env(),
                         timeout=850)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    log = (run / "logs" / "rollout-0.log").read_text()
    assert "enable_lora" in log  # vLLM's own LoRA serving
    sizes = [float(mb) for mb in re.findall(r"loaded version \d+ \(([\d.]+) MB\)", log)]
    print("update sizes (MB):", sizes)
    assert len(sizes) >= 6 and sizes[0] > 2.5 and max(sizes[1:]) < 0.3
    ms = [json.loads(line) for line in (run / "metrics.jsonl").open()]
    assert [m["step"] for m in ms] == list(range(1, 7))
    mismatch = [m["logp_mismatch_max"] for m in ms if m["logp_mismatch_max"] is not None]
    print(f"rollout/trainer log-prob mismatch on {len(mismatch)} step(s): max "
          f"{max(mismatch):.2e}; samples that crossed an update: "
          f"{sum(m['interrupted'] for m in ms)}")
    assert mismatch and max(mismatch) < 1e-3
    assert (run / "final" / "adapter" / "adapter_config.json").is_file()
    # `rljob export --merge`: a checkpoint vLLM loads as it is (not random:), whose
    # log-probs are transformers' of the same files
    merged = tmp_path / "merged"
    out = subprocess.run([sys.executable, "-m", "rljob", "export", str(run), str(merged),
                          "--merge"], capture_output=True, text=True, cwd=REPO, env=_env(),
                         timeout=300)
    assert out.returncode == 0 and "merged" in out.stdout, out.stderr[-3000:]
    import torch
    from transformers import AutoModelForCausalLM

    from rljob.api.spec import ModelSpec, RolloutSpec
    from rljob.inputs.models import load_tokenizer
    from rljob.rollout.engine import SamplingParams
    from rljob.rollout.vllm_engine import VLLMEngine
    from rljob.trainer.batch import make_batch, token_logprobs

    model_spec = ModelSpec(path=str(merged), dtype="float32")
    tok = load_tokenizer(model_spec)
    model = AutoModelForCausalLM.from_pretrained(merged).eval()
    engine = VLLMEngine(model_spec, RolloutSpec(engine="vllm", max_num_seqs=8), tok, "cpu",
                        seed=0)
    try:
        prompt = tok.encode("12+34=")
        [group] = engine.generate([prompt], SamplingParams(n=4, max_new_tokens=6))
    finally:
        engine.close()
    b = make_batch([prompt] * 4, [g.response_ids for g in group], tok.pad_token_id)
    with torch.no_grad():
        ref = token_logprobs(model, b)
    worst = max(float((torch.tensor(g.logprobs) - ref[i][b.mask[i].bool()]).abs().max())
                for i, g in enumerate(group))
    print(f"the merged export in vLLM: |vLLM - transformers| log-prob {worst:.2e}")
    assert worst < 1e-4
