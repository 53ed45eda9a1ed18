"""A profile from a run's own records (planner/live.py, pure parts) and whether a
profile holds for a job (`Profile.fit`)."""

from __future__ import annotations

import json

import pytest

from rljob.api.spec import RLJobSpec
from rljob.planner.cost import Workload, generation_time
from rljob.planner.live import calls_profile, profile_from_records, train_profile, workload_lengths
from rljob.planner.profile import (GenProfile, Profile, TrainProfile, measured_on,
                                   non_decreasing)
from rljob.workflow.timing import RECORD_CALLS, RECORD_LENGTHS, profile_record

SPEC = RLJobSpec.model_validate({
    "model": {"path": "random:examples/models/tiny-qwen2", "tokenizer": "builtin:char"},
    "dataset": {"path": "examples/data/arith.jsonl"},
    "rollout": {"maxNewTokens": 6, "maxNumSeqs": 64}})


def call(rows, steps, decode, prefill=0.01, prompt=8):
    return {"rows": rows, "prompt_tokens": rows * prompt, "output_tokens": rows * steps,
            "steps": steps, "prefill_seconds": prefill, "decode_seconds": decode}


def test_decode_steps_by_rows_and_the_prefill_per_token():
    """A call's first step is its prefill's: its decode steps are the others; the
    median per row count; the prefill over the prompt tokens it computed."""
    gen = calls_profile([call(16, 6, 0.05), call(32, 6, 0.10), call(16, 6, 0.07),
                         call(16, 11, 0.20)], 64)
    assert gen.batch_sizes == [16.0, 32.0] and gen.max_batch_size == 64
    assert gen.ptl_seconds == pytest.approx([0.014, 0.02])  # median of .01, .014, .02
    assert gen.prefill_per_token == pytest.approx(0.01 / 128)
    concurrent = {**call(24, 5, 0.5, prefill=0.0), "concurrent": True}
    assert calls_profile([concurrent], 64).ptl_seconds == [pytest.approx(0.1)]  # all 5 steps
    with pytest.raises(ValueError, match="no engine call with a decode step"):
        calls_profile([call(16, 1, 0.0)], 64)


def test_a_larger_batch_measured_faster_is_pooled_and_one_more_replica_saves_time():
    """On a busy machine a flat decode step's medians wobble (measured: 32 rows
    11.05 ms, 64 rows 10.28 ms); the fit pools such a fall, so fewer rows per replica
    never predicts a longer step and one more replica always saves the prefill's
    share at least (a profile like this once gave δ′ = 0 at 2 → 3 replicas)."""
    rows_ms = [(4, 9.67), (8, 9.48), (16, 9.89), (32, 11.05), (64, 10.28)]
    gen = calls_profile([call(rows, 7, ms * 6 / 1000) for rows, ms in rows_ms], 256)
    assert gen.ptl_seconds == pytest.approx([0.009575, 0.009575, 0.00989, 0.010665, 0.010665])
    assert non_decreasing([3.0, 1.0, 2.0], [1, 1, 2]) == pytest.approx([2.0, 2.0, 2.0])
    assert non_decreasing([1.0, 2.0, 2.0]) == [1.0, 2.0, 2.0]
    gen.prefill_per_token = 0.23e-3
    work = Workload(128, 6.0, 6.0, 6.5, group_size=8)
    times = [generation_time(gen, work, r) for r in (1, 2, 3)]
    assert times[0] > times[1] > times[2]


def test_the_trainer_s_tokens_per_second_and_the_workload():
    records = [{"step": 4, "train_tokens": 300, "train_seconds": 1.0},
               {"step": 5, "train_tokens": 600, "train_seconds": 0.5}]
    train = train_profile(records, world=2)
    assert train.tokens_per_second == [pytest.approx(900 / 1.5)] and train.npus == [2.0]
    lengths, prompt = workload_lengths([{"response_lengths": [3, 6], "prompt_tokens": 6.0},
                                        {"response_lengths": [6], "prompt_tokens": 7.0}])
    assert (lengths, prompt) == ([3, 6, 6], 6.5)
    with pytest.raises(ValueError, match="train_tokens and train_seconds"):
        train_profile([{"step": 4}], world=1)


def _line(step, calls, lengths, tokens=200, seconds=0.5, prompt=8.0):
    return {"step": step, "gen_calls": calls, "train_tokens": tokens,
            "train_seconds": seconds, "response_lengths": lengths, "prompt_tokens": prompt,
            "reward_mean": 0.5}


def test_the_record_of_recent_steps_is_bounded_and_gives_the_same_profile():
    """What the trainer reports to the controller: its steps' records in one, at most
    RECORD_CALLS calls and RECORD_LENGTHS lengths (both ends of the lengths kept); the
    profile built from it is the one built from the steps' lines."""
    lines = [_line(s, [call(4, 6, 0.05 + 0.001 * s)], [3, 6, 6, 40]) for s in range(4, 9)]
    record = profile_record(lines)
    assert record["steps"] == [4, 8] and len(record["gen_calls"]) == 5
    a = profile_from_records(lines, SPEC, "a")
    b = profile_from_records([json.loads(json.dumps(record))], SPEC, "b")
    assert (a.gen.ptl_seconds, a.train.tokens_per_second) == (
        pytest.approx(b.gen.ptl_seconds), pytest.approx(b.train.tokens_per_second))
    assert sorted(a.output_lengths) == b.output_lengths and a.prompt_tokens == b.prompt_tokens
    many = [_line(s, [call(4, 6, 0.05)] * 30, list(range(1, 201))) for s in range(20)]
    big = profile_record(many)
    assert len(big["gen_calls"]) == RECORD_CALLS and len(big["response_lengths"]) == RECORD_LENGTHS
    assert (big["response_lengths"][0], big["response_lengths"][-1]) == (1, 200)
    assert len(json.dumps(big)) < 16_000
    with pytest.raises(ValueError, match="no engine timings"):
        profile_from_records([_line(4, [], [3])], SPEC, "older")


def test_the_prefill_adds_the_instance_s_share_of_prompt_tokens():
    gen = GenProfile([1, 64], [0.01, 0.02], 64)
    w = Workload(samples=64, mean_output=10, max_output=20, prompt_tokens=8)
    plain = generation_time(gen, w, 2)
    gen.prefill_per_token = 1e-4
    assert generation_time(gen, w, 2) == pytest.approx(plain + 1e-4 * 64 * 8 / 2)


def _profile(**meta) -> Profile:
    return Profile(GenProfile([16], [0.01], 64), TrainProfile([1], [1000.0]), [5, 6], 6.0,
                   meta={**measured_on(SPEC, "test"), "created": 1000.0, **meta})


def test_a_profile_of_another_setup_is_refused_with_one_line():
    fit, notes = _profile().fit(SPEC, now=2000.0)
    assert fit is not None and notes == []
    for key, value, says in (("engine", "vllm", "engine 'vllm' (the job's: 'hf')"),
                             ("rollout_accelerator", "ascend", "rollout_accelerator 'ascend'"),
                             ("model", "other", "model 'other' (the job's: 'tiny-qwen2')")):
        fit, notes = _profile(**{key: value}).fit(SPEC, now=2000.0)
        assert fit is None and len(notes) == 1
        assert notes[0].startswith("profile measured on another setup: " + says)


def test_a_workload_measured_under_another_cap_or_long_ago_is_dropped_not_the_latencies():
    fit, notes = _profile(max_new_tokens=256).fit(SPEC, now=2000.0)
    assert fit.output_lengths == [] and fit.gen.ptl_seconds == [0.01]
    assert notes == ["profile's workload dropped: its responses were capped at 256 tokens, "
                     "the job's rollout.maxNewTokens is 6"]
    fit, notes = _profile().fit(SPEC, now=1000.0 + 40 * 86400)
    assert fit.output_lengths == [] and "measured 40 days ago" in notes[0]
    hand_written = Profile(GenProfile([16], [0.01], 64), TrainProfile([1], [1000.0]))
    assert hand_written.fit(SPEC, now=0.0) == (hand_written, [])


def test_a_malformed_profile_file_says_so():
    for text in ("{", "[]", '{"gen": {"batch_sizes": []}, "train": {}}'):
        with pytest.raises(ValueError, match="not a planner profile"):
            Profile.from_json(text)


def test_a_model_is_matched_by_its_name_wherever_it_is_mounted():
    from rljob.planner.profile import model_name

    assert {model_name(p) for p in ("random:examples/models/tiny-qwen2", "/mnt/tiny-qwen2/",
                                    "models/tiny-qwen2")} == {"tiny-qwen2"}
    assert model_name("Qwen/Qwen2.5-7B-Instruct") == "Qwen2.5-7B-Instruct"
