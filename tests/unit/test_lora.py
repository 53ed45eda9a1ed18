"""model.lora: the spec's checks, and the adapter's merged weights and reference on the
tiny Qwen2 (PEFT on a real transformers model)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from rljob.api import RLJob
from rljob.api.spec import LoraSpec, ModelSpec

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "examples/models/tiny-qwen2"


def _quickstart(**model) -> dict:
    doc = yaml.safe_load((REPO / "examples/quickstart.yaml").read_text())
    doc["spec"]["model"].update(model)
    return doc


def test_the_spec_takes_an_adapter_on_the_torch_engine_and_refuses_megatron():
    job = RLJob.model_validate(_quickstart(lora={"rank": 4, "targetModules": ["q_proj"]}))
    assert job.spec.model.lora == LoraSpec(rank=4, target_modules=["q_proj"])
    assert job.spec.model.lora.alpha == 16 and job.spec.model.lora.dropout == 0
    doc = _quickstart(lora={})
    doc["spec"]["trainer"] = {"engine": "megatron"}
    doc["spec"]["accelerator"] = {"type": "ascend"}
    with pytest.raises(ValueError, match="model.lora is trained by trainer.engine torch"):
        RLJob.model_validate(doc)
    with pytest.raises(ValueError, match="rank"):
        RLJob.model_validate(_quickstart(lora={"rank": 0}))


def test_modules_and_layers_the_model_lacks_are_one_line_each_naming_what_it_has():
    from rljob.trainer.lora import linear_names, lora_problems

    config = json.loads((TINY / "config.json").read_text())
    names, layers = linear_names(config)
    assert names == ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj",
                     "v_proj"] and layers == config["num_hidden_layers"]
    assert lora_problems(LoraSpec(target_modules=["q_proj", "v_proj"], layers=[0]),
                         config) == []
    problems = lora_problems(LoraSpec(target_modules=["q_proj", "qkv_proj"], layers=[1, 7]),
                             config)
    assert problems == [
        "model.lora.targetModules: qkv_proj not in the model; its linear modules are "
        "down_proj, gate_proj, k_proj, o_proj, q_proj, up_proj, v_proj",
        f"model.lora.layers: 7 out of range: the model has layers 0-{layers - 1}"]


def test_rljob_validate_names_a_module_the_model_lacks(tmp_path):
    import subprocess
    import sys

    doc = _quickstart(lora={"targetModules": ["c_attn"]})
    doc["spec"]["model"]["path"] = f"random:{TINY}"
    doc["spec"]["dataset"]["path"] = str(REPO / "examples/data/arith.jsonl")
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    out = subprocess.run([sys.executable, "-m", "rljob", "validate", str(path)],
                         capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode != 0
    assert "model.lora.targetModules: c_attn not in the model" in out.stdout + out.stderr
    assert "Traceback" not in out.stdout + out.stderr


def test_merged_weights_compute_what_the_adapter_does_and_the_reference_is_the_base():
    from peft import get_peft_model

    from rljob.inputs.models import build_model, load_tokenizer
    from rljob.trainer.lora import AdapterOff, lora_config, merged_tensors

    spec = ModelSpec(path=f"random:{TINY}", tokenizer="builtin:char", dtype="float32")
    tok = load_tokenizer(spec)
    model = build_model(spec, tok, seed=0, dtype=torch.float32)
    base = {k: v.clone() for k, v in model.state_dict().items()}
    ids = torch.tensor([tok.encode("12+34=46")])
    with torch.no_grad():
        base_logits = model(input_ids=ids).logits
    # the modules and layers a spec names, and no others
    other = build_model(spec, tok, seed=0, dtype=torch.float32)
    some = get_peft_model(other, lora_config(LoraSpec(target_modules=["q_proj", "v_proj"],
                                                      layers=[1]), other))
    assert sorted(n.split(".lora_A.")[0] for n, _ in some.named_parameters()
                  if ".lora_A." in n) == ["base_model.model.model.layers.1.self_attn.q_proj",
                                          "base_model.model.model.layers.1.self_attn.v_proj"]
    lora = get_peft_model(model, lora_config(LoraSpec(rank=4, alpha=8, layers=[0, 1, 2, 3]),
                                             model))
    trained = [n for n, p in lora.named_parameters() if p.requires_grad]
    assert trained and all(".lora_A." in n or ".lora_B." in n for n in trained)
    # unset target modules: every linear module of the layers, not the output head
    assert {n.split(".")[-4] for n in trained} == {
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    torch.manual_seed(1)
    for name, p in lora.named_parameters():
        if ".lora_B." in name:  # as if trained: B leaves zero
            p.data.normal_(0, 0.05)
    merged = dict(merged_tensors(lora))
    assert set(merged) == set(base)  # the plain model's names, adapter left out
    plain = build_model(spec, tok, seed=0, dtype=torch.float32)
    plain.load_state_dict(merged)
    with torch.no_grad():
        adapted = lora(input_ids=ids).logits
        ref = AdapterOff(lora)(input_ids=ids).logits
        again = lora(input_ids=ids).logits
        merged_logits = plain(input_ids=ids).logits
    assert (adapted - base_logits).abs().max() > 1e-3  # the adapter changes the model
    assert torch.allclose(merged_logits, adapted, atol=1e-5)
    assert torch.equal(ref, base_logits)  # adapter off: the base, bit for bit
    assert torch.equal(again, adapted)  # and back on after the reference's forward
    # the base's weights are untouched by the merge, and are the reference's state
    for k, v in AdapterOff(lora).state_dict().items():
        assert torch.equal(v, base[k]), k


def test_the_adapters_dropout_acts_in_the_policys_forwards_in_eval_mode_too():
    """A model from `from_pretrained` is in eval mode, where PEFT's dropout would never
    act: model.lora.dropout is on in the policy's forwards all the same, and 0 is none."""
    from peft import get_peft_model

    from rljob.inputs.models import build_model, load_tokenizer
    from rljob.trainer.lora import dropout_on, lora_config

    spec = ModelSpec(path=f"random:{TINY}", tokenizer="builtin:char", dtype="float32")
    tok = load_tokenizer(spec)
    ids = torch.tensor([tok.encode("12+34=46")])
    for dropout, differ in ((0.5, True), (0.0, False)):
        model = build_model(spec, tok, seed=0, dtype=torch.float32).eval()
        lora = get_peft_model(model, lora_config(LoraSpec(rank=4, dropout=dropout), model))
        assert dropout_on(lora) == (28 if dropout else 0)  # 7 modules in each of 4 layers
        assert not lora.get_base_model().training  # the model itself stays in eval mode
        for name, p in lora.named_parameters():
            if ".lora_B." in name:
                p.data.normal_(0, 0.05)
        with torch.no_grad():
            a, b = (lora(input_ids=ids).logits for _ in range(2))
        assert (not torch.equal(a, b)) == differ, dropout


def test_an_adapter_update_reaches_a_peft_engine_in_place_and_a_plain_one_merged():
    """The wire's LoRA version: the base under Hugging Face names once, the adapter
    under PEFT's names each update. A PEFT model takes both in place (the hf engine:
    it then computes what the trainer's model computes, bit for bit); an engine of
    whole weights gets them merged by the receiver (`AdapterMerge`), bit for bit the
    trainer's own merge; an adapter without a base, or one the model lacks, is an
    error, never a silent half load."""
    from peft import get_peft_model

    from rljob.inputs.models import build_model, load_tokenizer
    from rljob.trainer.lora import (adapter_tensors, base_tensors, load_into, lora_config,
                                    merged_tensors)
    from rljob.weights.adapter import AdapterMerge

    spec = ModelSpec(path=f"random:{TINY}", tokenizer="builtin:char", dtype="float32")
    tok = load_tokenizer(spec)
    lora_spec = LoraSpec(rank=4, alpha=8)

    def peft(seed):
        model = build_model(spec, tok, seed=seed, dtype=torch.float32)
        return get_peft_model(model, lora_config(lora_spec, model))

    trainer, engine = peft(0), peft(5)  # the engine's base starts elsewhere
    torch.manual_seed(2)
    for name, p in trainer.named_parameters():
        if ".lora_" in name:
            p.data.normal_(0, 0.05)
    adapter = {k: v.clone() for k, v in adapter_tensors(trainer)}  # version 0's
    base = dict(base_tensors(trainer))
    assert all(".lora_A.weight" in k or ".lora_B.weight" in k for k in adapter)
    assert sum(v.numel() for v in adapter.values()) * 10 < sum(v.numel() for v in base.values())
    with pytest.raises(ValueError, match="adapter of 2 weights"):
        load_into(engine, dict(list(adapter.items())[:2]))
    load_into(engine, {**base, **adapter})  # a life's first version
    ids = torch.tensor([tok.encode("12+34=46")])
    with torch.no_grad():
        assert torch.equal(engine(input_ids=ids).logits, trainer(input_ids=ids).logits)
    for name, p in trainer.named_parameters():  # the next update: the adapter alone
        if ".lora_B." in name:
            p.data.add_(0.01)
    load_into(engine, dict(adapter_tensors(trainer)))
    with torch.no_grad():
        assert torch.equal(engine(input_ids=ids).logits, trainer(input_ids=ids).logits)

    merge = AdapterMerge(lora_spec.rank, lora_spec.alpha)
    with pytest.raises(ValueError, match="before any base"):
        merge(dict(adapter_tensors(trainer)))
    merged = merge({**base, **adapter})
    again = merge(dict(adapter_tensors(trainer)))  # the base kept from the first
    want = dict(merged_tensors(trainer))
    assert set(again) == set(want)
    assert all(torch.equal(again[k], want[k]) for k in want)
    assert any(not torch.equal(merged[k], again[k]) for k in want)


def test_vllm_is_started_to_serve_the_adapters_rank():
    """vLLM sizes its LoRA buffers for a rank it allows (1, 8, 16, 32, ...): the
    smallest at or above the adapter's; no LoRA set-up for a job without one."""
    from rljob.api.spec import RolloutSpec
    from rljob.rollout.vllm_engine import engine_args

    def args(lora):
        spec = ModelSpec(path=f"random:{TINY}", tokenizer="builtin:char", dtype="float32",
                         lora=lora)
        return engine_args(spec, RolloutSpec(engine="vllm"), "cpu", 100, 0)

    assert "enable_lora" not in args(None)
    for rank, served in ((1, 1), (4, 8), (16, 16), (17, 32), (300, 320)):
        a = args(LoraSpec(rank=rank, alpha=2 * rank))
        assert (a["enable_lora"], a["max_loras"], a["max_lora_rank"]) == (True, 1, served)
