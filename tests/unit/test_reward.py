"""Rewards as users write them: a file beside the job, the row's other keys as
keyword arguments, coroutines, and one clear line when a reward is broken."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rljob.api import RLJob
from rljob.inputs.data import Example
from rljob.preflight import resolve_paths
from rljob.reward import get_reward, score_all, try_reward

REPO = Path(__file__).resolve().parents[2]

REWARD = '''
from helper import normalise  # a module beside the file


def score(prompt, response, answer, source=None):
    if source != "arith":
        raise ValueError(f"source {source!r}")
    return float(normalise(response) == normalise(answer))


def everything(prompt, response, answer, **row):
    return float(len(row))
'''


@pytest.fixture
def reward_dir(tmp_path: Path) -> Path:
    (tmp_path / "rewards").mkdir()
    (tmp_path / "rewards" / "mine.py").write_text(REWARD)
    (tmp_path / "rewards" / "helper.py").write_text("def normalise(s):\n    return s.strip()\n")
    return tmp_path


def test_a_reward_file_is_read_from_the_job_files_directory(reward_dir):
    fn = get_reward("rewards/mine.py:score", base=reward_dir)
    got = score_all(fn, ["p", "p"], [" 7", "8"], ["7", "7"],
                    [{"source": "arith", "tests": [1]}, {"source": "arith"}])
    assert [s.score for s in got] == [1.0, 0.0] and not any(s.error for s in got)
    # named keys only, or every key with **row
    assert score_all(fn, ["p"], ["7"], ["7"], [{}])[0].error == "ValueError: source None"
    every = get_reward("rewards/mine.py:everything", base=reward_dir)
    assert score_all(every, ["p"], ["7"], ["7"], [{"a": 1, "b": 2}])[0].score == 2.0


def test_a_broken_reward_is_one_line_naming_the_file(reward_dir):
    (reward_dir / "bad.py").write_text("import nowhere_to_be_found\n")
    with pytest.raises(ValueError) as exc:
        get_reward("bad.py:score", base=reward_dir)
    assert "bad.py fails on import (ModuleNotFoundError" in str(exc.value)
    assert "\n" not in str(exc.value)
    with pytest.raises(ValueError, match="is not a file"):
        get_reward("missing.py:score", base=reward_dir)
    with pytest.raises(ValueError, match="has no function 'nope'"):
        get_reward("rewards/mine.py:nope", base=reward_dir)
    with pytest.raises(ValueError, match=r"give a file instead, 'path/to/myreward.py:score'"):
        get_reward("myreward:score")


def test_a_coroutine_reward_scores_a_batch_concurrently():
    """A remote verifier of 200 ms per call: a batch waits for the slowest call,
    not for the sum (all 16 calls are in flight at once)."""
    inflight, peak = 0, []

    async def remote(prompt, response, answer):
        nonlocal inflight
        inflight += 1
        peak.append(inflight)
        await asyncio.sleep(0.2)
        inflight -= 1
        return 1.0

    got = score_all(remote, ["p"] * 16, ["r"] * 16, ["a"] * 16)
    assert [s.score for s in got] == [1.0] * 16 and max(peak) == 16


def test_validate_calls_the_reward_once_on_the_first_row(reward_dir, tmp_path):
    data = tmp_path / "data.jsonl"
    data.write_text('{"prompt": "1+1=", "answer": "2", "source": "arith"}\n')
    doc = {"apiVersion": "rljob.dev/v1alpha1", "kind": "RLJob", "metadata": {"name": "r"},
           "spec": {"model": {"path": f"random:{REPO / 'examples/models/tiny-qwen2'}",
                              "tokenizer": "builtin:char"},
                    "dataset": {"path": "data.jsonl"}, "rollout": {"maxNewTokens": 16},
                    "reward": {"name": "rewards/mine.py:score"}}}
    job = reward_dir / "job.yaml"
    job.write_text(yaml.safe_dump(doc))

    def validate():
        return subprocess.run([sys.executable, "-m", "rljob", "validate", str(job)],
                              capture_output=True, text=True, cwd="/")

    ok = validate()
    assert ok.returncode == 0, ok.stderr
    data.write_text('{"prompt": "1+1=", "answer": "2"}\n')  # the key the reward needs is gone
    bad = validate()
    assert bad.returncode != 0
    assert bad.stderr.strip().splitlines() == [
        f"{job}: reward.name: {reward_dir / 'rewards/mine.py'}:score fails on the dataset's "
        "first row: "
        "ValueError: source None"]
    resolved = resolve_paths(RLJob.model_validate(doc), reward_dir)
    assert resolved.spec.reward.name == f"{reward_dir / 'rewards/mine.py'}:score"


def test_try_reward_names_a_reward_that_returns_no_number():
    assert try_reward(lambda p, r, a: "0.5", Example("p", "a")) == (
        "TypeError: the reward returned str '0.5', not a number")
    assert try_reward(lambda p, r, a: 1, Example("p", "a")) is None
