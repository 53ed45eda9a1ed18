"""The run directory's layout has one home: RunDir names every path and finds the
complete checkpoints."""

from __future__ import annotations

from rljob.infra.rundir import RunDir, step_of


def test_paths_are_the_documented_layout(tmp_path):
    run = RunDir(tmp_path)
    rel = {k: str(getattr(run, k).relative_to(tmp_path)) for k in (
        "job_file", "metrics", "tensorboard", "wandb", "wandb_id", "final", "reward_plot",
        "timeline_plot", "events_log")}
    assert rel == {"job_file": "job.yaml", "metrics": "metrics.jsonl",
                   "tensorboard": "tensorboard", "wandb": "wandb", "wandb_id": "wandb-run-id",
                   "final": "final", "reward_plot": "reward.png",
                   "timeline_plot": "timeline.png", "events_log": "logs/events.log"}
    assert run.span_file("trainer-0") == tmp_path / "spans" / "trainer-0.jsonl"
    assert run.log("rollout-1") == tmp_path / "logs" / "rollout-1.log"
    assert run.checkpoint(12) == tmp_path / "checkpoints" / "step-12"
    assert run.critic_checkpoint(3) == tmp_path / "checkpoints" / "critic" / "step-3.pt"
    assert RunDir.of(None) is None and RunDir.of(run) is run
    assert RunDir.of(str(tmp_path)) == run


def test_only_complete_checkpoints_count_in_step_order(tmp_path):
    run = RunDir(tmp_path)
    assert run.checkpoint_steps() == [] and run.critic_checkpoint_files() == []
    for step, name in ((9, "policy.pt"), (10, "policy.pt"), (11, "policy.pt.partial"),
                       (2, "mcore-tp0.pt")):
        run.checkpoint(step).mkdir(parents=True)
        (run.checkpoint(step) / name).write_bytes(b"x")
    assert run.checkpoint_steps() == [2, 9, 10]  # numeric order; 11 was cut short
    assert run.checkpoint_steps("policy.pt") == [9, 10]
    run.critic_checkpoints.mkdir(parents=True)
    for step in (10, 9):
        run.critic_checkpoint(step).write_bytes(b"x")
    (run.critic_checkpoints / "step-11.pt.partial").write_bytes(b"x")
    assert [step_of(p) for p in run.critic_checkpoint_files()] == [9, 10]
    assert run.outputs() == []
    run.metrics.write_text("{}\n")
    run.final.mkdir()
    assert run.outputs() == ["metrics.jsonl", "final/"]


def test_a_metrics_line_still_being_written_is_left_for_the_next_read(tmp_path):
    """A live view reads metrics.jsonl while the trainer appends: a last line without
    its newline (half of a write) is not a step yet, and never a crash."""
    import json

    from rljob.local import read_metrics

    path = tmp_path / "metrics.jsonl"
    whole = json.dumps({"step": 1, "reward_mean": 0.5}) + "\n"
    path.write_text(whole + json.dumps({"step": 2, "reward_mean": 0.6})[:9])
    assert [m["step"] for m in read_metrics(tmp_path)] == [1]
    path.write_text(whole + json.dumps({"step": 2, "reward_mean": 0.6}) + "\n")
    assert [m["step"] for m in read_metrics(tmp_path)] == [1, 2]
