"""The model zoo (tests/zoo.py: Qwen2.5-, Llama-3- and Qwen3-shaped checkpoints in
bfloat16 with trained tokenizers, chat templates and padded embeddings) through
the hf rollout and the torch trainer, and through the Megatron adapter's weight
conversion."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch
import yaml

from rljob.api.spec import ModelSpec
from rljob.inputs.data import prompt_ids
from rljob.inputs.models import build_model, load_tokenizer
from rljob.rollout.engine import SamplingParams, make_engine
from rljob.sampling import TokenDistribution
from rljob.trainer.batch import make_batch, token_logprobs
from tests import zoo
from tests.tiers import import_or_skip
from tests.training.test_runtime import metrics, rljob_run

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def models(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("zoo")
    for name in zoo.MODELS:
        zoo.build(name, root)
    return root


REWARD = """
from rljob.reward.builtin import arith_partial


def score(prompt, response, answer, source):  # a key of the row beside prompt and answer
    assert source == "arith", source
    return arith_partial(prompt, response, answer)
"""


def _job(tmp_path: Path, model: Path, **spec) -> Path:
    """The checkpoint's job, with a reward file beside it that asks for a key of
    the dataset's rows."""
    rows = [json.loads(x) for x in (REPO / "examples/data/arith.jsonl").read_text().splitlines()
            if x.strip()]
    (tmp_path / "data.jsonl").write_text("".join(json.dumps({**r, "source": "arith"}) + "\n"
                                                 for r in rows))
    (tmp_path / "reward.py").write_text(REWARD)
    doc = {"apiVersion": "rljob.dev/v1alpha1", "kind": "RLJob",
           "metadata": {"name": f"zoo-{model.name.replace('.', '')}"},
           "spec": {"model": {"path": str(model)},
                    "dataset": {"path": "data.jsonl"},
                    "algorithm": {"groupSize": 4, "promptsPerStep": 2,
                                  "samplesPerMicroBatch": 8, "maxSteps": 3, "lr": 1e-4},
                    "workflow": {"mode": "async", "maxStaleness": 1, "weightSync": "async"},
                    "rollout": {"maxNewTokens": 8, "temperature": 0.8, "topP": 0.9},
                    "reward": {"name": "reward.py:score"}, **spec}}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.parametrize("name", ["llama3", "qwen3"])  # qwen2.5: the flagship's test below
def test_a_zoo_checkpoint_trains_and_its_final_weights_reload_and_generate(models, name,
                                                                           tmp_path):
    """`rljob run` of the checkpoint as it is on disk (bf16, padded embedding, its own
    tokenizer and chat template) with a user's reward file: three async steps, then
    `final/` loads with transformers, keeps the checkpoint's rows and generates."""
    run_dir = tmp_path / "run"
    rljob_run(_job(tmp_path, models / name), run_dir, timeout=400)
    steps = metrics(run_dir)
    assert [m["step"] for m in steps] == [1, 2, 3]
    # the reward file was found from the job's directory and got the row's key
    assert "reward failed" not in (run_dir / "logs" / "rollout-0.log").read_text()
    _final_reloads_and_generates(run_dir, models / name)


def _final_reloads_and_generates(run_dir: Path, checkpoint: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(run_dir / "final")
    final = AutoModelForCausalLM.from_pretrained(run_dir / "final")
    on_disk = json.loads((checkpoint / "config.json").read_text())
    assert final.config.vocab_size == on_disk["vocab_size"] > len(tok)  # rows kept
    ids = torch.tensor([prompt_ids(tok, "What is 2 + 3?")])
    out = final.generate(ids, max_new_tokens=4, do_sample=False)
    assert out.shape[1] > ids.shape[1]


@pytest.mark.parametrize("name", zoo.MODELS)
def test_padded_ids_are_never_sampled_and_both_sides_agree_on_log_probs(models, name):
    """The padded rows made the most likely tokens: the hf engine still samples only
    the tokenizer's ids, and the trainer's log-probs of what it sampled (the same
    distribution over the same ids) equal the engine's."""
    spec = ModelSpec(path=str(models / name), dtype="float32")
    tok = load_tokenizer(spec)
    model = build_model(spec, tok, dtype=torch.float32)
    head = model.get_output_embeddings().weight
    with torch.no_grad():  # tied or not: the padded rows now win every argmax
        head[len(tok):] = head[:len(tok)].abs().max() * 50
    assert model.config.vocab_size > len(tok)
    engine = make_engine("hf", spec, None, tok, model)
    prompts = [prompt_ids(tok, p) for p in ("What is 2 + 3?", "What is 7 * 6?")]
    params = SamplingParams(n=4, max_new_tokens=6, temperature=0.8, top_p=0.9, seeds=(1, 2))
    groups = engine.generate(prompts, params)
    rows = [(p, g) for p, group in zip(prompts, groups) for g in group]
    assert all(t < len(tok) for _, g in rows for t in g.response_ids)
    batch = make_batch([p for p, _ in rows], [g.response_ids for _, g in rows],
                       tok.pad_token_id)
    dist = TokenDistribution(0.8, 0.9, len(tok))
    with torch.no_grad():
        logp = token_logprobs(model, batch, dist)
    for k, (_, g) in enumerate(rows):
        got = logp[k][batch.mask[k].bool()].tolist()
        assert got == pytest.approx(g.logprobs, abs=1e-5)
        assert all(x > -50 for x in got)  # finite: no token outside the nucleus


def test_the_tokenizer_adds_no_second_bos_to_a_chat_template(models):
    tok = load_tokenizer(ModelSpec(path=str(models / "llama3")))
    ids = prompt_ids(tok, "What is 2 + 3?")
    assert ids[0] == tok.bos_token_id and ids[1] != tok.bos_token_id


@pytest.mark.parametrize("name", zoo.MODELS)
def test_megatron_weights_of_a_zoo_checkpoint_convert_both_ways(models, name, gloo):
    """hf → mcore → hf tensor for tensor, and the mcore GPTModel built from the
    config takes every tensor (QKV bias where the family has it, Qwen3's q/k norms,
    tied or untied output, the padded embedding). mcore's attention forward needs a
    CUDA/NPU device, so the forward is compared on the GPU check only."""
    import_or_skip("megatron", "megatron.core", "megatron-core is the dev extra")
    from rljob.trainer.mcore import MegatronEngine, architecture_problem, hf_to_mcore, mcore_to_hf

    warnings.filterwarnings("ignore", message="Apex is not installed")
    cfg = json.loads((models / name / "config.json").read_text())
    assert architecture_problem(cfg) is None
    spec = ModelSpec(path=str(models / name), dtype="float32")
    hf = build_model(spec, load_tokenizer(spec), dtype=torch.float32)
    state = hf.state_dict()
    back = mcore_to_hf(hf_to_mcore(state, cfg), cfg)
    for k, v in state.items():
        assert torch.equal(back[k], v), k
    from megatron.core import parallel_state

    parallel_state.destroy_model_parallel()
    engine = MegatronEngine(cfg, dtype=torch.float32, cpu_init=True)
    model = engine.build()
    distinct = {id(p): p for p in hf.parameters()}  # a tied head counts once
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel()
                                                             for p in distinct.values())
    engine.load_hf_state(state)
    for k, v in engine.hf_state().items():
        assert torch.equal(v, state[k]), k


def test_rope_scaling_mcore_cannot_express_is_refused(models):
    from rljob.trainer.mcore import architecture_problem

    cfg = json.loads((models / "llama3" / "config.json").read_text())
    cfg["rope_parameters"]["original_max_position_embeddings"] = 4096
    assert "original_max_position_embeddings" in architecture_problem(cfg)
    cfg["rope_parameters"] = {"rope_type": "yarn", "factor": 4.0}
    assert "yarn" in architecture_problem(cfg)


def test_the_flagship_example_runs_its_shape_scaled_down(models, tmp_path):
    """examples/grpo-qwen2.5-7b-ascend.yaml as it is, with what this machine cannot
    have swapped: the Qwen2.5-shaped zoo checkpoint for Qwen2.5-7B-Instruct (its
    config family, padded vocabulary, byte-level BPE, ChatML template), a GSM8K-style
    Parquet file with the example's keys, CPU, the hf engine and the torch trainer
    (vLLM-Ascend and Megatron on NPUs are not here), and a few small steps. Its
    reward (math_answer), async workflow, staleness bound and batch shape stay; the
    cluster-only fields stay too, and `rljob run` names them."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    doc = yaml.safe_load((REPO / "examples/grpo-qwen2.5-7b-ascend.yaml").read_text())
    rows = [{"question": f"Tom has {a} apples and buys {b} more. How many apples?",
             "answer": f"He has {a} + {b} = {a + b} apples.\n#### {a + b}"}
            for a in range(2, 9) for b in range(1, 4)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "train.parquet")
    spec = doc["spec"]
    spec["model"] = {"path": str(models / "qwen2.5"), "dtype": "bfloat16"}
    spec["dataset"].update(path=str(tmp_path / "train.parquet"))
    del spec["dataset"]["pvc"]
    spec["algorithm"].update(promptsPerStep=2, maxSteps=2, lr=1e-5)
    spec["rollout"].update(engine="hf", tensorParallel=1, npusPerReplica=1, replicas=1,
                           minReplicas=1, maxReplicas=2, maxNewTokens=16)
    spec["trainer"].update(engine="torch", npusPerNode=1, parallelism={"tp": 1, "pp": 1})
    spec["accelerator"] = {"type": "cpu"}
    job = tmp_path / "flagship.yaml"
    job.write_text(yaml.safe_dump(doc))
    out = rljob_run(job, tmp_path / "run", timeout=400)
    assert [m["step"] for m in metrics(tmp_path / "run")] == [1, 2]
    assert all(m["staleness_max"] <= 1 for m in metrics(tmp_path / "run"))
    said = [x for x in out.stdout.splitlines() if x.startswith("not applied on this machine")]
    assert said and all(f in said[0] for f in ("spec.scheduling", "spec.rollout.autoscaling",
                                               "spec.transferQueue.redis"))
    assert "spec.image" not in said[0]  # the example names the default image: no change
    _final_reloads_and_generates(tmp_path / "run", models / "qwen2.5")


def test_a_chat_model_learns_the_calculator_from_demonstrated_messages(models, tmp_path):
    """The agentic example on the Qwen2.5-shaped checkpoint (byte-level BPE, ChatML):
    the warm-up teaches demonstrated episodes given as messages (the tool's reply as
    the template writes a tool message, masked), and the RL steps' episodes call the
    calculator, end the model's turns at </calc> or at <|im_end|>, and read the
    replies as tool messages."""
    rows = [json.loads(x) for x in (REPO / "examples/data/calc.jsonl").read_text()
            .splitlines() if x.strip()]
    with (tmp_path / "calc.jsonl").open("w") as f:
        for r in rows:
            call = r["prompt"].rstrip("=")
            f.write(json.dumps({"prompt": r["prompt"], "answer": r["answer"], "demonstration": [
                {"role": "assistant", "content": f"<calc>{call}</calc>"},
                {"role": "tool", "content": f"<res>{r['answer']}</res>"},
                {"role": "assistant", "content": r["answer"]}]}) + "\n")
    doc = yaml.safe_load((REPO / "examples/agentic-calculator.yaml").read_text())
    spec = doc["spec"]
    spec["model"] = {"path": str(models / "qwen2.5"), "dtype": "bfloat16", "warmupSteps": 100}
    spec["dataset"] = {"path": str(tmp_path / "calc.jsonl")}
    spec["algorithm"].update(maxSteps=2, promptsPerStep=4)
    spec["rollout"]["maxNewTokens"] = 64
    job = tmp_path / "agentic-chat.yaml"
    job.write_text(yaml.safe_dump(doc))
    rljob_run(job, tmp_path / "run", timeout=400)
    ms = metrics(tmp_path / "run")
    print("chat model's episodes:", [{k: m[k] for k in ("reward_mean", "tool_calls",
                                                       "tool_errors", "turns_mean")}
                                     for m in ms])
    assert [m["step"] for m in ms] == [1, 2]
    for m in ms:
        assert m["episode_errors"] == 0 and m["response_length"] <= 64
        assert m["tool_calls"] >= 8 and m["observation_tokens"] > 0  # of 32 episodes
        assert m["turns_mean"] > 1.2
