"""`rljob crd` and `rljob validate` as a user runs them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.cases import INVALID, TEN_LINE_YAML

REPO = Path(__file__).resolve().parents[2]


def rljob(*args, input=None, cwd=REPO, env=None):
    return subprocess.run([sys.executable, "-m", "rljob", *args], capture_output=True,
                          text=True, input=input, cwd=cwd, timeout=120, env=env)


def test_validate_accepts_examples():
    # but the one whose reward model its script trains first (tests/unit/test_reward_model.py)
    examples = sorted(str(p) for p in (REPO / "examples").glob("*.yaml")
                      if p.name != "quickstart-reward-model.yaml")
    out = rljob("validate", *examples)
    assert out.returncode == 0, out.stderr
    assert len(examples) >= 4 and out.stdout.count(": valid") == len(examples)


def test_validate_reports_one_line_per_problem(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("---\n".join(json.dumps(c.document()) + "\n" for c in INVALID[:3]))
    good = tmp_path / "good.yaml"
    good.write_text(TEN_LINE_YAML)
    out = rljob("validate", "--cluster", str(good), str(bad))  # good's paths are the pods'
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 3 and all(line.startswith(f"{bad}: ") for line in lines)
    assert INVALID[0].said in lines[0]
    assert f"{good}: valid" in out.stdout


def test_validate_never_tracebacks(tmp_path):
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    for args in (["validate", str(tmp_path / "nope.yaml")], ["validate", str(binary)],
                 ["validate", "-"]):
        out = rljob(*args, input="key: [1, 2")
        assert out.returncode == 1
        assert "Traceback" not in out.stderr and out.stderr.strip(), out.stderr


def test_crd_check_detects_drift(tmp_path):
    target = tmp_path / "rljob.yaml"
    assert rljob("crd", "-o", str(target)).returncode == 0
    assert rljob("crd", "--check", "-o", str(target)).returncode == 0
    target.write_text(target.read_text().replace("maxLength: 512", "maxLength: 513", 1))
    out = rljob("crd", "--check", "-o", str(target))
    assert out.returncode == 1 and "out of date" in out.stderr


def _job(tmp_path, spec: str, name: str = "t") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(f"apiVersion: rljob.dev/v1alpha1\nkind: RLJob\nmetadata:\n  name: {name}\n"
                    f"spec:\n{spec}")
    return path


def test_validate_reports_every_problem_on_this_machine_at_once(tmp_path):
    """Offline checks against this machine, all in one run: a model directory, a
    dataset and a reward that do not exist, a name that is no DNS label; each line
    names the field and the fix. --cluster leaves the paths to the pods."""
    bad = _job(tmp_path, "  model: {path: 'random:no/model', tokenizer: 'builtin:char'}\n"
                         "  dataset: {path: data/none.jsonl}\n"
                         "  reward: {name: 'nosuchmod:score'}\n", name="Bad_Name")
    out = rljob("validate", str(bad), cwd=REPO)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 4, lines
    assert "metadata.name must be a DNS label" in lines[0]
    assert lines[1].startswith(f"{bad}: model.path: {tmp_path / 'no/model'} is not a directory")
    assert f"dataset.path: '{tmp_path / 'data/none.jsonl'}' does not exist" in lines[2]
    assert "reward.name: reward 'nosuchmod:score': cannot import 'nosuchmod'" in lines[3]
    out = rljob("validate", "--cluster", str(bad))
    assert out.returncode == 1 and len(out.stderr.strip().splitlines()) == 1  # the name


def test_validate_suggests_the_field_an_unknown_one_meant(tmp_path):
    bad = _job(tmp_path, "  model: {path: 'random:x'}\n  dataset: {path: d.jsonl}\n"
                         "  algorithm: {learningRate: 1.0e-5, maxstep: 3, num_generations: 4}\n")
    out = rljob("validate", "--cluster", str(bad))  # the schema's problems only
    assert out.returncode == 1
    assert out.stderr.strip().splitlines() == [
        f'{bad}: unknown field "spec.algorithm.learningRate" (did you mean "lr"?)',
        f'{bad}: unknown field "spec.algorithm.maxstep" (did you mean "maxSteps"?)',
        f'{bad}: unknown field "spec.algorithm.num_generations" (did you mean "groupSize"?)']


def test_validate_says_mistakes_of_every_kind_in_one_run(tmp_path):
    """Five mistakes of five kinds, five lines in one run: an apiVersion not served
    hides nothing, a field put in the wrong object names where it belongs, a bound
    and an enum the schema refuses, a rule of the whole object with no `<nil>:`
    before it, and a file that is not there (the files are checked although the
    schema refused the document)."""
    bad = tmp_path / "five.yaml"
    bad.write_text("apiVersion: rljob.dev/v1\nkind: RLJob\nmetadata:\n  name: Bad_Name\n"
                   "spec:\n  lr: 1.0e-5\n"
                   f"  model: {{path: 'random:{REPO / 'examples/models/tiny-qwen2'}', "
                   "tokenizer: 'builtin:char'}\n"
                   "  dataset: {path: data/none.jsonl}\n"
                   "  algorithm: {clipRatio: 3}\n")
    out = rljob("validate", str(bad))
    assert out.returncode == 1 and "Traceback" not in out.stderr
    lines = [line.removeprefix(f"{bad}: ") for line in out.stderr.strip().splitlines()]
    assert lines == [
        "document 1: apiVersion 'rljob.dev/v1' is not served: use apiVersion: "
        "rljob.dev/v1alpha1",
        'unknown field "spec.lr" (did you mean "spec.algorithm.lr"?)',
        "spec.algorithm.clipRatio: Invalid value: 3: spec.algorithm.clipRatio in body should "
        "be less than 1",
        "metadata.name must be a DNS label: lowercase letters, digits and '-', starting with "
        "a letter and ending with a letter or digit, e.g. grpo-qwen-7b (the job's services "
        "are named after it)",
        f"dataset.path: '{tmp_path / 'data/none.jsonl'}' does not exist (relative paths are "
        f"read from {tmp_path}); give the JSONL or Parquet file of prompts"], lines
    assert not any(line.startswith("<nil>") for line in lines)


def test_validate_checks_the_dataset_keys_rows_and_context_with_numbers(tmp_path):
    model = f"random:{REPO / 'examples/models/tiny-qwen2'}"
    data = tmp_path / "q.jsonl"
    data.write_text('{"question": "1+1=", "solution": "2"}\n\n{"question": "2+2="\n')
    job = _job(tmp_path, f"  model: {{path: '{model}', tokenizer: 'builtin:char'}}\n"
                         "  dataset: {path: q.jsonl}\n")
    out = rljob("validate", str(job))
    assert out.returncode == 1
    assert "q.jsonl' line 3 is not JSON" in out.stderr  # the file's own line number
    data.write_text('{"question": "1+1=", "solution": "2"}\n')
    out = rljob("validate", str(job))
    assert ("rows have no key 'prompt', 'answer' (their keys: question, solution); set "
            "dataset.promptKey / dataset.answerKey") in out.stderr
    data.write_text('{"prompt": "12+34=", "answer": "46"}\n')
    out = rljob("validate", str(job))  # maxNewTokens 256 on a 64-position model
    assert out.returncode == 1
    assert ("rollout.maxNewTokens: 256 new tokens after the longest prompt (7 tokens) need "
            "263 positions, but the model has 64 (max_position_embeddings); set "
            "rollout.maxNewTokens to at most 57") in out.stderr


def test_validate_checks_the_warm_up_file_as_the_dataset(tmp_path):
    """dataset.warmupPath is read here as dataset.path is: a file that is missing, a
    row without the answer and a prompt past the model's context each get a line
    naming dataset.warmupPath; a warmupPath with no warm-up to read it is refused."""
    model = f"random:{REPO / 'examples/models/tiny-qwen2'}"
    (tmp_path / "q.jsonl").write_text('{"prompt": "12+34=", "answer": "46"}\n')

    def validate(warmup: str, steps: int = 5) -> list[str]:
        job = _job(tmp_path, f"  model: {{path: '{model}', tokenizer: 'builtin:char', "
                             f"warmupSteps: {steps}}}\n"
                             f"  dataset: {{path: q.jsonl, warmupPath: {warmup}}}\n"
                             "  rollout: {maxNewTokens: 16}\n")
        out = rljob("validate", str(job))
        assert "Traceback" not in out.stderr
        return [line.removeprefix(f"{job}: ") for line in out.stderr.strip().splitlines()]

    assert validate("none.jsonl") == [
        f"dataset.warmupPath: '{tmp_path / 'none.jsonl'}' does not exist (relative paths are "
        f"read from {tmp_path}); give the JSONL or Parquet file of the warm-up's rows"]
    (tmp_path / "shown.jsonl").write_text('{"prompt": "1+1=", "answer": "2"}\n'
                                          '{"prompt": "2+2="}\n')
    assert validate("shown.jsonl") == [
        f"dataset.warmupPath: '{tmp_path / 'shown.jsonl'}' line 2 has no key 'answer' (the "
        "first row has it): every row needs dataset.promptKey and dataset.answerKey"]
    (tmp_path / "shown.jsonl").write_text(json.dumps({"prompt": "1+" * 40, "answer": "2"}))
    assert validate("shown.jsonl") == [
        "dataset.warmupPath: the longest prompt is 81 tokens, but the model has 64 positions "
        "(max_position_embeddings): shorten the prompts or use a model with a longer context"]
    (tmp_path / "shown.jsonl").write_text('{"prompt": "1+1=", "answer": "2"}\n')
    assert validate("shown.jsonl") == []
    assert validate("shown.jsonl", steps=0) == [
        "spec.dataset.warmupPath: dataset.warmupPath is read by the warm-up only, and "
        "model.warmupSteps is 0: set model.warmupSteps, or remove dataset.warmupPath"]


def test_run_refuses_a_bad_job_before_starting_anything(tmp_path):
    bad = _job(tmp_path, "  model: {path: 'random:nope', tokenizer: 'builtin:char'}\n"
                         "  dataset: {path: none.jsonl}\n")
    out = rljob("run", str(bad), "--run-dir", str(tmp_path / "run"))
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "model.path" in out.stderr and "dataset.path" in out.stderr
    assert not (tmp_path / "run").exists()  # nothing started, nothing written


def test_relative_paths_are_read_from_the_job_files_directory(tmp_path):
    """examples/quickstart.yaml names data/arith.jsonl: valid from any directory."""
    out = rljob("validate", str(REPO / "examples" / "quickstart.yaml"), cwd=tmp_path)
    assert out.returncode == 0, out.stderr


def test_help_reads_like_a_unix_tool():
    out = rljob("run", "-h")
    assert out.returncode == 0
    assert out.stdout.startswith("Usage: rljob run [OPTIONS] FILE\n")
    assert "--max-steps N" in out.stdout and "--redis URL" in out.stdout
    assert not any(tag in out.stdout for tag in ("<int>", "<path>", "<bool>", "{file}", "list["))
    top = rljob("--help")
    assert "--version" in top.stdout and "--debug" in top.stdout
    assert rljob("--version").stdout == f"rljob {__import__('rljob').__version__}\n"


def test_an_unexpected_error_is_one_line_unless_debug(tmp_path):
    args = ("simulate", str(REPO / "examples" / "quickstart.yaml"), "-o",
            str(tmp_path / "no" / "such" / "dir" / "sim.png"))
    out = rljob(*args)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rljob: error: FileNotFoundError: ")
    assert "--debug" in lines[0]
    debug = rljob("--debug", *args)
    assert debug.returncode == 1 and "Traceback" in debug.stderr


def test_a_cross_field_problem_gives_its_numbers(tmp_path):
    bad = _job(tmp_path, "  model: {path: 'random:x'}\n  dataset: {path: d.jsonl}\n"
                         "  algorithm: {promptsPerStep: 3, groupSize: 4, samplesPerMicroBatch: 5}\n")
    out = rljob("validate", "--cluster", str(bad))
    assert out.returncode == 1
    assert ("algorithm.samplesPerMicroBatch must divide algorithm.promptsPerStep × "
            "algorithm.groupSize (the samples trained per step) (3 prompts × 4 = 12 samples "
            "per step, micro-batches of 5)") in out.stderr


def test_the_pods_preflight_writes_its_problems_as_the_termination_message(tmp_path):
    """`rljob worker preflight` (trainer rank 0's init container): paths on PVCs are
    checked too (they are mounted there); problems exit 3 and go to the termination
    log, one per line."""
    data = tmp_path / "q.jsonl"
    data.write_text('{"question": "1+1=", "answer": "2"}\n')
    model = REPO / "examples/models/tiny-qwen2"
    job = _job(tmp_path, f"  model: {{path: 'random:{model}', tokenizer: 'builtin:char'}}\n"
                         f"  dataset: {{path: {data}, pvc: prompts}}\n"
                         "  rollout: {maxNewTokens: 8}\n")
    log = tmp_path / "termination-log"
    out = rljob("worker", "preflight", "--job", str(job), "--termination-log", str(log))
    assert out.returncode == 3, out.stderr
    assert "Traceback" not in out.stderr
    assert log.read_text().splitlines() == [
        f"dataset.path: '{data}': rows have no key 'prompt' (their keys: answer, question); "
        "set dataset.promptKey / dataset.answerKey to the prompt's and the answer's keys"]
    assert rljob("validate", str(job)).returncode == 0  # outside the pod the PVC is not here
    data.write_text('{"prompt": "1+1=", "answer": "2"}\n')
    out = rljob("worker", "preflight", "--job", str(job), "--termination-log", str(log))
    assert out.returncode == 0, out.stderr


def test_wandb_online_without_a_key_is_refused_before_start(tmp_path):
    import os

    model = REPO / "examples/models/tiny-qwen2"
    job = _job(tmp_path, f"  model: {{path: 'random:{model}', tokenizer: 'builtin:char'}}\n"
                         f"  dataset: {{path: {REPO / 'examples/data/arith.jsonl'}}}\n"
                         "  rollout: {maxNewTokens: 8}\n"
                         "  logging: {wandb: {project: p}}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env["HOME"] = str(tmp_path)  # no ~/.netrc from `wandb login`
    out = rljob("validate", str(job), env=env)
    assert out.returncode == 1
    assert out.stderr.strip().splitlines() == [
        f"{job}: logging.wandb: mode online needs a W&B API key: set WANDB_API_KEY (on a "
        "cluster: logging.wandb.apiKeySecret), run `wandb login`, or use mode: offline"]
    assert rljob("validate", str(job), env={**env, "WANDB_API_KEY": "x" * 40}).returncode == 0


def test_validate_reports_the_rest_beside_unknown_fields_and_each_bad_input(tmp_path):
    """An unknown field does not hide the other problems; a later dataset row without
    the keys, a local model path that is missing beside its directory, and a reward
    module that breaks on import each get their line."""
    (tmp_path / "models").mkdir()
    (tmp_path / "data").mkdir()
    (tmp_path / "data/d.jsonl").write_text('{"prompt": "1+1=", "answer": "2"}\n\n'
                                           '{"prompt": "2+2="}\n')
    (tmp_path / "badreward.py").write_text("def score(:\n")
    job = _job(tmp_path, "  model: {path: models/nothere, tokenizer: 'builtin:char'}\n"
                         "  dataset: {path: data/d.jsonl}\n"
                         "  reward: {name: 'badreward:score'}\n"
                         "  algorithm: {learningRate: 1.0e-5, groupSize: 1}\n")
    out = rljob("validate", str(job), cwd=tmp_path)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    lines = [line.removeprefix(f"{job}: ") for line in out.stderr.strip().splitlines()]
    assert lines[0] == 'unknown field "spec.algorithm.learningRate" (did you mean "lr"?)'
    assert lines[1] == ("spec.algorithm.groupSize: algorithm.groupSize must be at least 2 when "
                        "algorithm.name is grpo (group-relative advantages need two or more "
                        "responses per prompt)")
    assert lines[2].startswith(f"model.path: {tmp_path / 'models/nothere'} is not a directory")
    assert lines[3] == (f"dataset.path: '{tmp_path / 'data/d.jsonl'}' line 3 has no key "
                        "'answer' (the first row has it): every row needs dataset.promptKey "
                        "and dataset.answerKey")
    assert lines[4].startswith("reward.name: reward 'badreward:score': cannot import "
                               "'badreward' (SyntaxError: ")
    assert len(lines) == 5


def test_run_refuses_a_torch_profile_range_it_cannot_read_before_starting_anything(tmp_path):
    for bad in ("3-1", "two"):
        out = rljob("run", str(REPO / "examples/quickstart.yaml"), "--run-dir",
                    str(tmp_path / "run"), "--torch-profile", bad)
        assert out.returncode == 2 and "Traceback" not in out.stderr
        assert "--torch-profile" in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()  # nothing started, nothing written


def test_run_checks_paths_on_a_pvc_too(tmp_path):
    """A local run reads every path on this machine: a PVC's path that is not here is
    refused before anything starts (validate leaves it to the pods)."""
    job = _job(tmp_path, "  model: {path: 'random:" + str(REPO / "examples/models/tiny-qwen2")
               + "', tokenizer: 'builtin:char'}\n"
               "  dataset: {path: /data/none.jsonl, pvc: datasets}\n")
    out = rljob("run", str(job), "--run-dir", str(tmp_path / "run"))
    assert out.returncode == 1 and "dataset.path: '/data/none.jsonl' does not exist" in out.stderr
    assert not (tmp_path / "run").exists()
    assert "/data/none.jsonl" not in rljob("validate", str(job)).stderr


def test_validate_resolves_the_length_predictor(tmp_path):
    """rollout.lengthPredictor under skew-aware dispatch: a name or module:Class that
    does not resolve is one line naming the field; the benchmarks' oracle resolves."""
    spec = ("  model: {path: 'random:%s', tokenizer: 'builtin:char'}\n"
            "  dataset: {path: %s}\n"
            "  rollout: {dispatch: skew_aware, maxNewTokens: 8, lengthPredictor: '%s'}\n")
    model, data = REPO / "examples/models/tiny-qwen2", REPO / "examples/data/arith.jsonl"
    bad = _job(tmp_path, spec % (model, data, "nosuchmod:Predictor"), name="bad")
    out = rljob("validate", str(bad))
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines() == [
        f"{bad}: rollout.lengthPredictor: rollout.lengthPredictor 'nosuchmod:Predictor': "
        "cannot import it: ModuleNotFoundError: No module named 'nosuchmod'"]
    wrong = _job(tmp_path, spec % (model, data, "rljob.reward:get_reward"), name="wrong")
    assert "is not a LengthPredictor" in rljob("validate", str(wrong)).stderr
    good = _job(tmp_path, spec % (model, data, "rljob_bench.oracle:AnswerLength"), name="good")
    out = rljob("validate", str(good))
    assert out.returncode == 0, out.stderr


def test_validate_starts_the_environment_on_the_first_row(tmp_path):
    """rollout.environment: one that does not resolve, or fails to start on the
    dataset's first row, is one line naming the field."""
    (tmp_path / "env.py").write_text(
        "from rljob.environments import Environment\n"
        "class NeedsTests(Environment):\n"
        "    def __init__(self, row):\n"
        "        self.tests = row['tests']\n"
        "    def step(self, turn):\n"
        "        raise NotImplementedError\n")
    spec = ("  model: {path: 'random:%s', tokenizer: 'builtin:char'}\n"
            "  dataset: {path: %s}\n"
            "  rollout: {maxNewTokens: 8, environment: '%s'}\n")
    model, data = REPO / "examples/models/tiny-qwen2", REPO / "examples/data/arith.jsonl"
    import os

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(tmp_path)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])}
    bad = _job(tmp_path, spec % (model, data, "env:NeedsTests"), name="bad")
    out = rljob("validate", str(bad), env=env)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines() == [
        f"{bad}: rollout.environment: env:NeedsTests fails to start on the dataset's first "
        "row: KeyError: 'tests'"]
    missing = _job(tmp_path, spec % (model, data, "nowhere"), name="missing")
    assert "rollout.environment 'nowhere' is not available here" in rljob(
        "validate", str(missing)).stderr


def test_an_environment_in_a_file_beside_the_job_is_found_from_anywhere(tmp_path):
    """rollout.environment: path/to/file.py:Class, relative to the job file (as a
    reward file is): `rljob validate` run from another directory starts it on the
    first row, the file importing a helper beside it; a file that is not there is
    one line."""
    envs = tmp_path / "envs"
    envs.mkdir()
    (envs / "helper.py").write_text("TAG = '</go>'\n")
    (envs / "guess.py").write_text(
        "from helper import TAG\n"
        "from rljob.environments import Environment, Reply\n"
        "class Guess(Environment):\n"
        "    stop = TAG\n"
        "    def __init__(self, row):\n"
        "        super().__init__(row)\n"
        "        self.target = row['answer']\n"
        "    def step(self, turn):\n"
        "        return Reply(done=True)\n")
    spec = ("  model: {path: 'random:%s', tokenizer: 'builtin:char'}\n"
            "  dataset: {path: %s}\n"
            "  rollout: {maxNewTokens: 8, environment: '%s'}\n")
    model, data = REPO / "examples/models/tiny-qwen2", REPO / "examples/data/arith.jsonl"
    good = _job(tmp_path, spec % (model, data, "envs/guess.py:Guess"), name="good")
    out = rljob("validate", str(good), cwd="/")
    assert out.returncode == 0, out.stderr
    from rljob.api.validation import load_rljob
    from rljob.environments import ENVIRONMENTS
    from rljob.preflight import resolve_paths

    job = resolve_paths(load_rljob(good), good.parent)
    assert job.spec.rollout.environment == f"{envs / 'guess.py'}:Guess"
    env = ENVIRONMENTS.get(job.spec.rollout.environment)({"prompt": "1+1=", "answer": "2"})
    assert env.stop == "</go>" and env.target == "2"
    gone = _job(tmp_path, spec % (model, data, "envs/gone.py:Guess"), name="gone")
    out = rljob("validate", str(gone))
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines() == [
        f"{gone}: rollout.environment: rollout.environment '{envs / 'gone.py'}:Guess': "
        f"cannot import it: FileNotFoundError: {envs / 'gone.py'} is not a file"]


def test_a_benchmark_keeps_its_runs_only_in_a_new_or_empty_directory(tmp_path):
    """An earlier benchmark's runs in the --keep directory would add their metrics and
    timelines to the new runs' figures: refused with one line, before any run starts."""
    kept = tmp_path / "kept"
    (kept / "round-0" / "sync" / "spans").mkdir(parents=True)
    for command in (["overhead"], ["workflow"]):
        out = rljob("bench", *command, "--keep", str(kept))
        assert out.returncode == 2, out.stdout + out.stderr
        assert "--keep" in out.stderr and "not an empty directory" in out.stderr
        assert "Traceback" not in out.stderr
    assert sorted(p.name for p in kept.rglob("*")) == ["round-0", "spans", "sync"]


def test_bench_overhead_names_the_field_a_problem_is_in(tmp_path):
    """An unknown mode is --modes' problem; a missing examples folder is named as such
    (not blamed on --modes); each one line, before any run starts."""
    out = rljob("bench", "overhead", "--modes", "sync,fast")
    assert out.returncode == 2 and "--modes" in out.stderr and "fast" in out.stderr
    out = rljob("bench", "overhead", "--steps", "4", "--warmup", "1", cwd=tmp_path)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "--modes" not in out.stderr and "rljob bench --examples DIR" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
