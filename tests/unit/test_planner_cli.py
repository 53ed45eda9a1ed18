"""`rljob plan` and `rljob simulate` on the shipped examples, as a user runs them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from tests.cases import EXAMPLES, REPO



def rljob(*args, env=None):
    return subprocess.run([sys.executable, "-m", "rljob", *args], capture_output=True, text=True,
                          cwd=REPO, timeout=300, env=env)


def test_plan_fits_the_terminal_and_gives_a_pipe_whole_rows():
    import os
    import re

    ansi = re.compile(r"\x1b\[[0-9;]*m")
    job = str(REPO / "examples" / "grpo-qwen2.5-7b-ascend.yaml")
    for columns in (80, 100):  # a terminal of that width (rich reads TTY_COMPATIBLE)
        out = rljob("plan", job, env=dict(os.environ, TTY_COMPATIBLE="1", COLUMNS=str(columns)))
        assert out.returncode == 0, out.stderr
        lines = ansi.sub("", out.stdout).splitlines()
        assert max(len(x) for x in lines) <= columns, out.stdout
        assert "…" not in out.stdout  # wrapped, not cut
    piped = rljob("plan", job).stdout  # not a terminal: every row on one line
    assert any(x.strip().startswith("as specified") for x in piped.splitlines()), piped


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_plan_prints_a_feasible_split(path):
    out = rljob("plan", str(path), "--json")
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    best, now = plan["plan"], plan["current"]
    assert best["step_seconds"] <= now["step_seconds"] * (1 + 1e-9)
    assert best["rollout_npus"] + best["trainer_npus"] <= now["rollout_npus"] + now["trainer_npus"]
    assert 0 <= best["idle_ratio"] < 1 and best["gain_of_one_more_replica"] >= 0
    table = rljob("plan", str(path))
    assert table.returncode == 0 and "Tgen" in table.stdout


def test_plan_with_a_profile_more_npus_and_two_pools(tmp_path):
    from rljob.planner.profile import GenProfile, Profile, TrainProfile

    prof = tmp_path / "profile.json"
    Profile(GenProfile([1, 32, 128], [0.02, 0.025, 0.04], 128),
            TrainProfile([8, 16, 32], [20000.0, 38000.0, 70000.0]),
            output_lengths=[200, 400, 900, 1800]).save(prof)
    job = str(REPO / "examples" / "grpo-qwen2.5-7b-ascend.yaml")
    out = json.loads(rljob("plan", job, "--npus", "64", "--profile", str(prof), "--json").stdout)
    assert out["source"] == "measured profile"
    assert out["plan"]["rollout_npus"] + out["plan"]["trainer_npus"] <= 64
    assert out["workload"]["max_output_tokens"] == 1800
    cross = json.loads(rljob("plan", job, "--cross", "32,16", "--json").stdout)
    assert cross["plan"]["rollout_npus"] <= 32 and cross["plan"]["trainer_npus"] <= 16
    bad = rljob("plan", job, "--cross", "32")
    assert bad.returncode == 2 and "ROLLOUT,TRAINER" in bad.stderr
    missing = rljob("plan", job, "--profile", str(tmp_path / "nope.json"))
    assert missing.returncode == 1 and "Traceback" not in missing.stderr


def test_simulate_compares_modes_and_writes_the_gantt(tmp_path):
    png = tmp_path / "sim.png"
    out = rljob("simulate", str(REPO / "examples" / "grpo-qwen2.5-7b-ascend.yaml"), "-o",
                str(png), "--steps", "10", "--json")
    assert out.returncode == 0, out.stderr
    modes = {m["mode"]: m for m in json.loads(out.stdout)["modes"]}
    assert set(modes) == {"sync", "periodic", "async(k=1)"}
    assert modes["sync"]["speedup_vs_sync"] == 1.0
    assert modes["async(k=1)"]["samples_per_second"] >= modes["sync"]["samples_per_second"]
    assert modes["periodic"]["max_staleness"] == 0 and modes["async(k=1)"]["max_staleness"] <= 1
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_unsized_models_get_a_clear_error(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text((REPO / "examples" / "grpo-qwen2.5-7b-ascend.yaml").read_text()
                   .replace("/models/Qwen2.5-7B-Instruct", "/models/mystery-model"))
    out = rljob("plan", str(job))
    assert out.returncode == 1 and "cannot size model" in out.stderr


@pytest.mark.parametrize("npus", [12, 16, 20, 24, 28])
def test_plan_gives_the_trainer_one_node_or_whole_nodes(npus):
    """The 7B example has 8-NPU nodes: a trainer gang of 12 NPUs is not a shape a
    cluster can run, so it is never planned."""
    out = rljob("plan", str(REPO / "examples" / "grpo-qwen2.5-7b-ascend.yaml"), "--npus",
                str(npus), "--json")
    assert out.returncode == 0, out.stderr
    t = json.loads(out.stdout)["plan"]["trainer_npus"]
    assert t <= 8 or t % 8 == 0, t


def test_plan_of_a_cpu_job_counts_cores():
    out = rljob("plan", str(REPO / "examples" / "quickstart.yaml"))
    assert out.returncode == 0 and "trainer cores" in out.stdout and "NPU" not in out.stdout
    # a tiny model's roofline says so, and names the command that measures this machine
    assert "rljob profile" in out.stdout and "per-step overheads" in out.stdout, out.stdout
    big = rljob("plan", str(REPO / "examples" / "grpo-qwen2.5-7b-ascend.yaml"))
    assert "per-step overheads" not in big.stdout


def test_a_plan_says_in_one_line_why_it_splits_otherwise():
    from rljob.cli.plan import why

    def row(replicas, trainer, gen, train, npus_per_replica=4):
        return {"rollout_replicas": replicas, "rollout_npus": replicas * npus_per_replica,
                "trainer_npus": trainer, "gen_seconds": gen, "train_seconds": train,
                "step_seconds": max(gen, train)}

    assert why(row(2, 8, 10, 39), row(2, 8, 10, 39), "NPU", "NPU") == \
        "the split as specified is the fastest of those tried"
    assert why(row(1, 8, 12, 39), row(2, 8, 10, 39), "NPU", "NPU") == (
        "why another split: as specified, training is the slower side (Tgen 10.00 s, "
        "Ttrain 39.00 s); rollout 2 → 1 replica keeps a step at 39.00 s with 4 NPUs fewer")
    assert why(row(1, 2, 0.08, 0.1, 1), row(2, 1, 0.06, 0.19, 1), "core", "core") == (
        "why another split: as specified, training is the slower side (Tgen 0.06 s, "
        "Ttrain 0.19 s); the trainer 1 → 2 cores, rollout 2 → 1 replica takes a step from "
        "0.19 s to 0.10 s")
    out = rljob("plan", str(REPO / "examples" / "grpo-qwen2.5-7b-ascend.yaml"))
    lines = [x for x in out.stdout.splitlines() if x.startswith(("why another", "the split"))]
    assert len(lines) == 1, out.stdout


def test_the_workload_takes_its_prompts_length_from_the_dataset():
    from rljob.cli.app import local_job
    from rljob.planner.job import PROMPT_TOKENS, dataset_prompt_tokens, job_model

    job = local_job(REPO / "examples" / "quickstart.yaml")
    tokens = dataset_prompt_tokens(job.spec)
    assert tokens is not None and 4 < tokens < 20  # "12+34=" and its specials, by character
    assert job_model(job.spec).workload.prompt_tokens == tokens
    # a hub tokenizer is not fetched for a plan: the assumed length
    hub = local_job(REPO / "examples" / "grpo-qwen2.5-7b-ascend.yaml")
    assert dataset_prompt_tokens(hub.spec) is None
    assert job_model(hub.spec).workload.prompt_tokens == PROMPT_TOKENS


def test_plan_of_roles_on_different_accelerators_keeps_two_pools(tmp_path):
    """rollout.accelerator differs from the trainer's: the plan splits each pool on its
    own (StreamRL's cross-datacenter allocation), and one --npus pool is refused."""
    import yaml

    doc = yaml.safe_load((REPO / "examples" / "grpo-qwen2.5-7b-ascend.yaml").read_text())
    doc["spec"]["rollout"]["accelerator"] = {"type": "gpu"}
    job = tmp_path / "hetero.yaml"
    job.write_text(yaml.safe_dump(doc))
    out = rljob("plan", str(job), "--json")
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    rpool, tpool = plan["current"]["rollout_npus"], plan["current"]["trainer_npus"]
    assert plan["pools"] == [rpool, tpool]
    assert plan["plan"]["rollout_npus"] <= rpool and plan["plan"]["trainer_npus"] <= tpool
    table = rljob("plan", str(job))
    assert "GPU" in table.stdout and "separate pools" in table.stdout
    bad = rljob("plan", str(job), "--npus", "32")
    assert bad.returncode == 2 and "--cross ROLLOUT,TRAINER" in bad.stderr
