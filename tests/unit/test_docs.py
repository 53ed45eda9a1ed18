"""The documentation: the site builds strictly (a broken link, anchor or page fails it),
the job reference is what the models generate and leaves no field undescribed, and the
README stays short with every link resolving."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path


from rljob.api.crd import openapi_schema
from rljob.api.reference import job_reference, undescribed

REPO = Path(__file__).resolve().parents[2]
MKDOCS = [sys.executable, "-m", "mkdocs", "build", "--strict"]
ENV = dict(os.environ, NO_MKDOCS_2_WARNING="1")


def _build(root: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*MKDOCS, "-f", str(root / "mkdocs.yml"), "-d", str(site)],
                          capture_output=True, text=True, timeout=300, env=ENV)


def test_every_spec_field_has_a_description():
    assert undescribed(openapi_schema()["properties"]["spec"]) == []


def test_the_committed_job_reference_is_the_generated_one():
    committed = (REPO / "docs/reference/job.md").read_text(encoding="utf-8")
    assert committed == job_reference(openapi_schema()["properties"]["spec"]), (
        "docs/reference/job.md is stale: python -m rljob.api.reference > docs/reference/job.md")


def test_undescribed_names_a_field_without_text():
    node = {"properties": {"a": {"description": "x", "properties": {"b": {"type": "string"}}},
                           "c": {"type": "array", "items": {"properties": {"d": {}}}}}}
    assert undescribed(node) == ["spec.a.b", "spec.c", "spec.c[].d"]


def test_the_site_builds_strictly_and_a_broken_link_fails_it(tmp_path):
    out = _build(REPO, tmp_path / "site")
    assert out.returncode == 0, out.stderr[-3000:]
    page = (tmp_path / "site/reference/job/index.html").read_text()
    # field names and defaults keep whole in the tables (docs/stylesheets/extra.css)
    assert "stylesheets/extra.css" in page
    css = (tmp_path / "site/stylesheets/extra.css").read_text()
    assert re.search(r"table:not\(\[class\]\) code \{[^}]*white-space: nowrap", css), css

    copy = tmp_path / "copy"
    shutil.copytree(REPO / "docs", copy / "docs")
    shutil.copy(REPO / "mkdocs.yml", copy / "mkdocs.yml")
    page = copy / "docs/getting-started.md"
    page.write_text(page.read_text() + "\nSee [the missing page](no-such-page.md).\n")
    out = _build(copy, tmp_path / "site2")
    assert out.returncode != 0
    assert "no-such-page.md" in out.stderr


def test_the_readme_is_short_and_its_links_resolve():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) < 200
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    assert targets
    missing = [t for t in targets if not t.startswith("http") and not (REPO / t).exists()]
    assert not missing, missing


def _model_bounds(model, path: str) -> dict[str, set[tuple[str, float]]]:
    """Each field's bounds as its model states them ((symbol, value) pairs), by wire
    path, through nested models and lists of them."""
    import types
    import typing

    from pydantic import BaseModel

    symbols = {"ge": "≥", "gt": ">", "le": "≤", "lt": "<"}
    out: dict[str, set[tuple[str, float]]] = {}
    for name, field in model.model_fields.items():
        here = f"{path}.{field.alias or name}"
        out[here] = {(sym, float(getattr(m, attr))) for m in field.metadata
                     for attr, sym in symbols.items() if getattr(m, attr, None) is not None}
        ann = field.annotation
        stack = [ann]
        while stack:
            a = stack.pop()
            if isinstance(a, type) and issubclass(a, BaseModel):
                out.update(_model_bounds(a, here + ("[]" if ann is not a and
                                                    typing.get_origin(ann) is list else "")))
            elif isinstance(a, types.UnionType) or typing.get_origin(a) in (typing.Union, list):
                stack.extend(typing.get_args(a))
    return out


def _reference_bounds(text: str) -> dict[str, set[tuple[str, float]]]:
    """Each field's bounds as the committed reference prints them, by wire path."""
    out, section = {}, None
    for line in text.splitlines():
        if re.match(r"#{2,6} `", line):  # a section's heading: its own name
            section = re.match(r"#+ `([^`]+)`", line)[1]
        elif re.fullmatch(r"`spec[^`]*`", line):  # and its whole path, below it
            section = line.strip("`")
        elif section and line.startswith("| ") and not line.startswith(("| field", "|---")):
            cells = [c.strip() for c in line.strip("|").split(" | ")]
            key = re.search(r"`([^`]+)`", cells[0])[1]
            bounds = re.search(r"\(([^()]*[≥>≤<] [^()]*)\)$", cells[1])
            out[f"{section}.{key}"] = {(b.split()[0], float(b.split()[1]))
                                       for b in bounds[1].split(", ")} if bounds else set()
    return out


def test_the_references_contents_name_each_object_under_its_parent():
    """The page's headings (its contents list) are each object's own name, one level
    deeper than its parent's, each with its whole path below it and as its anchor."""
    from rljob.api.reference import _anchor

    lines = (REPO / "docs/reference/job.md").read_text(encoding="utf-8").splitlines()
    heads = [(i, re.fullmatch(r"(#{2,6}) `([^`]+)` \{#([a-z0-9_-]+)\}", line))
             for i, line in enumerate(lines) if line.startswith("##")]
    assert heads and all(m for _, m in heads), [lines[i] for i, m in heads if not m]
    paths = []
    for i, m in heads:
        level, name, anchor = len(m[1]), m[2], m[3]
        path = lines[i + 2].strip("`") if level > 2 else name
        assert path.split(".")[-1] == name and len(path.split(".")) == level - 1, (i, path)
        assert anchor == _anchor(path)
        paths.append(path)
    assert len(paths) == len(set(paths)) > 40 and paths[0] == "spec"


def test_every_bound_in_the_reference_is_the_models():
    """`clipRatio` must read (> 0, < 1) as the model says `gt=0, lt=1`: each field's
    bounds in docs/reference/job.md are exactly the ones its model states."""
    from rljob.api.spec import RLJobSpec

    model = _model_bounds(RLJobSpec, "spec")
    page = _reference_bounds((REPO / "docs/reference/job.md").read_text(encoding="utf-8"))
    assert page["spec.algorithm.clipRatio"] == {(">", 0.0), ("<", 1.0)}
    checked = [p for p in page if p in model]
    assert len(checked) > 100, len(checked)  # the page's rows are the model's fields
    wrong = {p: (page[p], model[p]) for p in checked if page[p] != model[p]}
    assert wrong == {}


def test_the_cluster_guide_gives_the_commands_its_journey_test_walks(tmp_path):
    """The node tier runs the cluster guide's own commands (tests/cluster/guide.py):
    they parse into the build piped into the push, `helm install` with the values the
    push prints (which the chart has), the claim, the job and the watch; a section
    without its shell block is one clear error."""
    import yaml

    from tests.cluster import guide
    from tests.cluster.test_e2e import IMAGES, INSTALL

    build, push = guide.command(IMAGES, "sudo python -m images.build").split(" | ")
    assert guide.argv(push, {guide.REGISTRY: "127.0.0.1:5000/rljob"}) == [
        "python", "-m", "images.push", "127.0.0.1:5000/rljob"]
    assert guide.argv(build, {})[-2:] == ["runtime", "operator"]
    helm, claim, job, watch = guide.commands(INSTALL)
    sets = dict(w.split("=", 1) for w in guide.argv(helm, {})[1:] if "=" in w)
    assert sets == {"image.repository": f"{guide.REGISTRY}/operator",
                    "image.digest": "sha256:d690..."}
    values = yaml.safe_load((REPO / "charts/rljob-operator/values.yaml").read_text())
    assert {"repository", "digest"} <= set(values["image"])
    for line in (claim, job):
        assert (REPO / guide.argv(line, {})[-1]).is_file(), line
    assert watch == "kubectl get rljobs -w"
    page = tmp_path / "page.md"
    page.write_text("# t\n\n## Install\n\nno block\n\n## Next\n\n```sh\nls\n```\n")
    try:
        guide.commands("Install", page)
    except ValueError as exc:
        assert str(exc) == "page.md: no ```sh block under '## Install'"
    else:
        raise AssertionError("a section without a shell block parsed")
