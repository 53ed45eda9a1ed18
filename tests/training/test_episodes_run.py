"""Episodes for real: `rljob run` of examples/agentic-calculator.yaml (a short warm-up
on its demonstrated episodes, two RL steps): the policy calls the calculator, the
observations are appended and counted, the trainer trains on the rows, and each
step's figures say how the episodes went. And examples/agentic-tools.yaml (the
model's own tool calls) with its calculator served over MCP."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

from tests.training.test_runtime import metrics, rljob_run, tensorboard_scalars

REPO = Path(__file__).resolve().parents[2]


def test_the_agentic_example_runs_episodes_with_the_calculator(tmp_path):
    doc = yaml.safe_load((REPO / "examples" / "agentic-calculator.yaml").read_text())
    spec = doc["spec"]
    spec["model"]["path"] = f"random:{REPO / 'examples/models/tiny-qwen2'}"
    spec["dataset"]["path"] = str(REPO / "examples/data/calc.jsonl")
    spec["model"]["warmupSteps"] = 80
    spec["algorithm"].update({"promptsPerStep": 4, "samplesPerMicroBatch": 32, "maxSteps": 2})
    job = tmp_path / "agentic.yaml"
    job.write_text(yaml.safe_dump(doc))
    run = tmp_path / "run"
    rljob_run(job, run, timeout=400)
    steps = metrics(run)
    assert len(steps) == 2 and (run / "final" / "model.safetensors").exists()
    errors = [line for log in (run / "logs").glob("rollout-*.log")
              for line in log.read_text().splitlines() if "environment error" in line]
    for m in steps:
        assert m["samples"] == 32 and m["episode_errors"] == 0, errors
        assert m["tool_calls"] > 0 and m["observation_tokens"] > 0, m
        assert 1 <= m["turns_mean"] <= m["turns_max"] <= 3
        assert m["response_length"] <= 40  # maxNewTokens caps the whole episode
    spans = [json.loads(x) for x in (run / "spans" / "rollout-0.jsonl").read_text().splitlines()]
    episodes = [s["info"]["episodes"] for s in spans if s["kind"] == "generate"]
    assert episodes and sum(e["tool_calls"] for e in episodes) >= steps[0]["tool_calls"]
    # each tool call a span on the timeline, inside its batch's generation
    tools = [s for s in spans if s["kind"] == "tool"]
    assert len(tools) == sum(e["tool_calls"] for e in episodes)
    gens = [s for s in spans if s["kind"] == "generate"]
    assert all(any(g["start"] <= t["start"] <= t["end"] <= g["end"] for g in gens)
               for t in tools)
    assert [v for _, v in tensorboard_scalars(run, "episodes/tool_calls")] == [
        m["tool_calls"] for m in steps]


def test_a_native_tools_job_calls_the_tool_of_its_mcp_server(tmp_path):
    """examples/agentic-tools.yaml with its one tool served by an MCP server
    (examples/tools/calculator_server.py in rollout.mcpServers, no built-in tool), from the
    example's policy after its warm-up (tests/zoo.tool_caller, made once): the
    driver and the trainer list the server's tool to announce it, the rollout calls
    it over stdio, and the job runs to the end. Every call that reads and is not an
    error was answered by the server: the job has no other tool."""
    from tests import zoo

    doc = yaml.safe_load((REPO / "examples" / "agentic-tools.yaml").read_text())
    spec = doc["spec"]
    spec["model"] = {"path": str(zoo.tool_caller()), "dtype": "float32"}
    spec["dataset"] = {"path": str(REPO / "examples/data/calc-tools.jsonl")}  # no warm-up
    spec["algorithm"].update({"promptsPerStep": 4, "maxSteps": 2})
    spec["rollout"]["tools"] = []
    spec["rollout"]["mcpServers"] = [{
        "name": "calc",
        "command": [sys.executable, str(REPO / "examples/tools/calculator_server.py")],
        "env": {"MCP_CALCULATOR_LOG": str(tmp_path / "calls.log")}, "timeoutSeconds": 60}]
    job = tmp_path / "mcp.yaml"
    job.write_text(yaml.safe_dump(doc))
    run = tmp_path / "run"
    rljob_run(job, run, timeout=400)
    steps = metrics(run)
    print("MCP job's episodes:", [{k: m[k] for k in ("reward_mean", "tool_calls",
                                                     "malformed_calls", "tool_errors")}
                                  for m in steps])
    assert [m["step"] for m in steps] == [1, 2]
    answered = sum(m["tool_calls"] - m["tool_errors"] for m in steps)
    assert answered >= 8, steps  # of 64 episodes
    # each answered call reached the server (which saw the calls that fail there too),
    # and only the rollout called: the driver and the trainer list the tool
    calls = (tmp_path / "calls.log").read_text().splitlines()
    assert answered <= len(calls) <= sum(m["tool_calls"] - m["malformed_calls"]
                                         for m in steps), (calls, steps)
    for m in steps:
        assert m["episode_errors"] == 0 and m["observation_tokens"] > 0, m
    spans = [json.loads(x) for x in (run / "spans" / "rollout-0.jsonl").read_text().splitlines()]
    episodes = [s["info"]["episodes"] for s in spans if s["kind"] == "generate"]
    assert len([s for s in spans if s["kind"] == "tool"]) == sum(e["tool_calls"]
                                                                 for e in episodes)
