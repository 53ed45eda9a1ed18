"""The trainer's step sinks (trainer/sinks.py): which a job gets, and the registry."""

from __future__ import annotations

import json

import pytest

from rljob.api.validation import load_rljob
from rljob.trainer.sinks import (JsonlSink, PrometheusSink, TensorBoardSink, open_sinks, sink)
from rljob.infra.worker_metrics import WorkerMetrics
from tests.unit.test_cli import REPO


def kinds(sinks):
    return [type(s) for s in sinks.sinks]


def test_a_job_gets_the_sinks_it_asks_for(tmp_path):
    spec = load_rljob(str(REPO / "examples/quickstart.yaml")).spec
    prom = WorkerMetrics("trainer-0", None)
    assert kinds(open_sinks(spec, None, 0, prom)) == [PrometheusSink]  # no run directory
    all_of_them = open_sinks(spec, tmp_path, 0, prom)
    assert kinds(all_of_them) == [JsonlSink, PrometheusSink, TensorBoardSink]
    m = {"step": 1, "samples": 4, "tokens": 12, "reward_mean": 0.5, "staleness_mean": 0.0,
         "gen_seconds": 1.0, "train_seconds": 2.0, "loss": 0.1}
    all_of_them.write(m, 1)
    all_of_them.close()
    assert json.loads((tmp_path / "metrics.jsonl").read_text()) == m
    assert prom.reward._value.get() == 0.5
    spec.logging.tensorboard = False
    assert kinds(open_sinks(spec, tmp_path, 0, None)) == [JsonlSink]
    # a resumed run drops the lines after its checkpoint
    (tmp_path / "metrics.jsonl").write_text("".join(
        json.dumps({"step": s}) + "\n" for s in (1, 2, 3)))
    open_sinks(spec, tmp_path, 2, None).close()
    assert [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [1, 2]


def test_a_sink_name_is_registered_once():
    with pytest.raises(ValueError, match="registered already"):
        sink("tensorboard")(lambda spec, run_dir, start, prom: None)
    with pytest.raises(TypeError):
        sink("not-callable")(42)
