"""`rljob bench optimisations`' configurations are the jobs they say (the benchmark
itself ran for the figures in the README; it takes minutes)."""

from __future__ import annotations

from pathlib import Path

from rljob_bench.optimisations import COMPARISONS, CONFIGS, config_job


def test_each_configuration_switches_what_its_name_says():
    model = Path("/models/warm")
    jobs = {name: config_job(name, model, 12).spec for name in CONFIGS}
    for name, spec in jobs.items():
        assert spec.model.path == str(model) and spec.model.warmup_steps == 0
        assert spec.algorithm.max_steps == 12
        if CONFIGS[name]["task"] == "longprompt":
            assert spec.dataset.path.endswith("longprompt.jsonl")
            assert spec.trainer.packing == {"padded": "none", "packed": "sequences",
                                            "shared prompt": "shared_prompt"}[
                name.split(", ")[1]]
            continue
        assert spec.dataset.path.endswith("longtail.jsonl")
        if name == "sync, fifo, packed":
            assert spec.trainer.packing == "sequences" and spec.workflow.mode == "sync"
            continue
        if name.startswith("2 ranks"):
            assert spec.trainer.npus_per_node == 2 and spec.trainer.packing == "sequences"
            assert spec.trainer.data_parallel_split == name.split(", ")[1].replace(" ", "_")
            continue
        assert spec.rollout.replicas == (2 if "2 replicas" in name else 1)
        assert spec.workflow.mode == name.split(",")[0].split("(")[0]
        assert spec.rollout.dispatch == ("fifo" if "fifo" in name else "skew_aware")
        order = spec.trainer.micro_batch_order_in(spec.workflow.mode, spec.rollout.dispatch)
        assert order == ("slot" if "slot order" in name or "fifo" in name and
                         spec.workflow.mode != "async" else "arrival"), name
    assert jobs["async(1), skew-aware"].workflow.staleness_bound == 1
    assert CONFIGS["periodic, oracle"]["oracle"] and not CONFIGS["periodic, skew-aware"]["oracle"]
    # the oracle is a length predictor the driver loads by its address, the rest learn
    assert jobs["periodic, oracle"].rollout.length_predictor == "rljob_bench.oracle:AnswerLength"
    assert jobs["periodic, skew-aware"].rollout.length_predictor == "online"
    # each comparison differs in its one mechanism
    for _, off, on in COMPARISONS:
        assert off in CONFIGS and on in CONFIGS


def test_the_driver_loads_the_length_predictor_the_job_names():
    """The driver's LengthModel takes rollout.lengthPredictor: the online ranker by
    default, the oracle by its address (each answer's tokens and its end)."""
    from rljob.inputs.models import CharTokenizer
    from rljob.workflow.lengths import LengthModel, OnlineRanker

    tok = CharTokenizer()
    oracle = LengthModel(None, tok, "rljob_bench.oracle:AnswerLength")
    assert oracle.predict(["1+1=", "12+30="], ["2", "42"]) == [2, 3]
    online = LengthModel(None, tok)
    assert isinstance(online.predictor, OnlineRanker)
    online.predictor.observe(["1+1="] * 2, [9, 11])
    assert online.predict(["1+1="], ["2"])[0] >= 1
