"""The chart's Grafana dashboard plots series that exist: every metric name in its
queries is one a component of the job serves (rollout, trainer and driver workers,
the TransferQueue controller, the operator), read from their real registries."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest

from rljob.transferqueue.metrics import ControllerCollector
from rljob.transferqueue.service import TransferQueueService
from rljob.transferqueue.units import UnitConfig
from rljob.infra.worker_metrics import WorkerMetrics

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "charts/rljob-operator/dashboards/rljob.json"


def served_names() -> set[str]:
    registries = [WorkerMetrics(w, None).registry for w in ("rollout-0", "trainer-0", "driver")]
    tq = CollectorRegistry()
    tq.register(ControllerCollector(TransferQueueService("j", [UnitConfig("memory")])))
    registries.append(tq)
    from rljob_operator import metrics as operator_metrics  # noqa: F401 - the default registry

    from prometheus_client import REGISTRY
    registries.append(REGISTRY)
    names = set()
    for reg in registries:
        for fam in reg.collect():
            names |= {s.name for s in fam.samples}
            names.add(fam.name)
    # series that appear with their first sample (labelled gauges, per-task families)
    text = b"".join(generate_latest(r) for r in registries).decode()
    names |= set(re.findall(r"^# TYPE (\w+)", text, re.M))
    return names


def queries() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    exprs += [v["definition"] for v in dash["templating"]["list"] if "definition" in v]
    return exprs


def test_every_series_the_dashboard_queries_is_served():
    served = served_names()
    used = {m for e in queries() for m in re.findall(r"\brljob_\w+", e)}
    assert len(used) >= 20
    # labelled families with no sample yet still name their suffixes
    missing = {m for m in used
               if m not in served and re.sub(r"_(bucket|total|sum|count)$", "", m) not in served}
    assert not missing, f"the dashboard queries series nothing serves: {sorted(missing)}"


def test_the_chart_ships_it_as_a_sidecar_configmap():
    tpl = (REPO / "charts/rljob-operator/templates/grafana-dashboard.yaml").read_text()
    assert '.Files.Get "dashboards/rljob.json"' in tpl
    dash = json.loads(DASHBOARD.read_text())
    variables = {v["name"] for v in dash["templating"]["list"]}
    assert {"datasource", "namespace", "rljob"} <= variables
    assert len({p["id"] for p in dash["panels"]}) == len(dash["panels"])
