"""What can be checked of an RLJob on this machine before anything starts
(`rljob run`, `rljob validate`): the files it names exist and parse, the
dataset has the keys, the reward resolves, prompts plus `maxNewTokens` fit the
model's context. Every problem is reported at once, each as one line naming the
field, what is wrong (with the numbers) and the fix.

Relative paths in a job file are read from the file's directory
(`resolve_paths`); a model or tokenizer given as a hub id (`org/name`, not a
directory here) and, for `rljob validate`, anything on a PVC (`model.pvc`,
`dataset.pvc`: paths inside the pods) are left to the pods. There, `rljob worker
preflight` runs the same checks with the job's volumes mounted (`volumes_here`),
before the trainer starts: its problems end the job as Failed/PreflightFailed with
the lines as the message. `rljob run` reads every path on this machine, a PVC's
too, and checks them all.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

from .api.resource import RLJob
from .infra.registry import file_part

# `rljob worker preflight` (the trainer pod's init container): exit status and
# container name the operator reads back, and where Kubernetes takes the
# container's termination message from (at most 4096 bytes are kept)
TERMINATION_LOG = Path("/dev/termination-log")
TERMINATION_LIMIT = 4096

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
RANDOM = "random:"
BUILTIN = "builtin:"
# how many prompts the context check tokenizes (the longest of these is checked)
PROMPTS_CHECKED = 2000


def _hub_id(value: str, base: Path | None = None) -> bool:
    """`org/name` that is no path here (from `base`, else as given) and whose `org` is no
    directory here either (`models/missing` beside a `models/` directory is a local path
    that is missing): fetched where the job runs."""
    path = (base / value) if base else Path(value)
    return bool(HUB_ID.match(value)) and not path.exists() and not path.parent.is_dir()


def _local(value: str, base: Path) -> str:
    """`value` read from `base` when relative (kept when absolute)."""
    p = Path(value).expanduser()
    return str(p if p.is_absolute() else (base / p).resolve())


def _model_like(value: str, base: Path) -> str:
    """A model or tokenizer reference: random:DIR and directories from `base`; a hub
    id that is not a directory there stays as it is."""
    if value.startswith(RANDOM):
        return RANDOM + _local(value.removeprefix(RANDOM), base)
    if value.startswith(BUILTIN):
        return value
    if _hub_id(value, base):
        return value
    return _local(value, base)


def _file_ref(name: str, base: Path) -> str:
    """`path/to/file.py:attribute` (a user's reward, environment, ...) with a relative
    file read from `base`; any other name as it is."""
    file = file_part(name)
    if file is None or Path(file).is_absolute():
        return name
    return f"{(base / file).resolve()}:{name.rsplit(':', 1)[1]}"


def resolve_paths(job: RLJob, base: Path) -> RLJob:
    """The job with its relative local paths read from `base` (the job file's
    directory); paths on PVCs are the pods' and stay as they are."""
    spec = job.spec
    model = spec.model
    changes = {}
    if not model.pvc:
        changes["path"] = _model_like(model.path, base)
        if model.tokenizer:
            changes["tokenizer"] = _model_like(model.tokenizer, base)
    dataset = spec.dataset
    reward = spec.reward.model_copy(update={"name": _file_ref(spec.reward.name, base)})
    scorer = spec.reward.model
    if scorer is not None and not scorer.pvc:  # reward.model: as model.path is read
        reward = reward.model_copy(update={"model": scorer.model_copy(update={
            "path": _model_like(scorer.path, base),
            "tokenizer": scorer.tokenizer and _model_like(scorer.tokenizer, base)})})
    rollout = spec.rollout.model_copy(update={
        "environment": _file_ref(spec.rollout.environment, base),
        "tools": [_file_ref(t, base) for t in spec.rollout.tools],
        "tool_parser": _file_ref(spec.rollout.tool_parser, base),
        "mcp_servers": [s.model_copy(update={"working_dir": str((base / (s.working_dir or "."))
                                                                .resolve())})
                        for s in spec.rollout.mcp_servers],
        "length_predictor": _file_ref(spec.rollout.length_predictor, base)})
    new_spec = spec.model_copy(update={
        "reward": reward,
        "rollout": rollout,
        "model": model.model_copy(update=changes),
        "dataset": dataset if dataset.pvc else dataset.model_copy(update={
            "path": _local(dataset.path, base),
            "warmup_path": dataset.warmup_path and _local(dataset.warmup_path, base)}),
    })
    return job.model_copy(update={"spec": new_spec})


def _model_dir(spec, volumes_here: bool = False) -> Path | None:
    """The directory holding the model's config.json here (None: a hub id, or a PVC
    outside the pods)."""
    path = spec.model.path
    if spec.model.pvc and not volumes_here:
        return None
    if path.startswith(RANDOM):
        return Path(path.removeprefix(RANDOM))
    if _hub_id(path):
        return None
    return Path(path)


def _check_model(spec, where: str, volumes_here: bool,
                 problems: list[str]) -> dict | None:
    """The model directory and its config.json; the config (None when the model is
    not here or its config cannot be read)."""
    model_dir = _model_dir(spec, volumes_here)
    if model_dir is None:
        return None
    config = model_dir / "config.json"
    if not model_dir.is_dir():
        problems.append(f"model.path: {model_dir} is not a directory{where}; give a "
                        "model directory, random:DIR (a transformers config to "
                        "initialise randomly) or a hub id org/name")
    elif not config.is_file():
        problems.append(f"model.path: {model_dir} has no config.json: give a directory "
                        "saved by transformers (save_pretrained)")
    else:
        try:
            return json.loads(config.read_text())
        except (OSError, ValueError) as exc:
            problems.append(f"model.path: {config} is not valid JSON: {exc}")
    return None


def _check_tokenizer(spec, where: str, model_here: bool, problems: list[str]):
    """The tokenizer, loaded when it is here (None otherwise, or when it fails)."""
    tok_path = spec.model.tokenizer_path
    tok_dir = Path(tok_path.removeprefix(RANDOM))
    if tok_path.startswith(BUILTIN) or (model_here and tok_dir.is_dir()):
        try:
            from .inputs.models import load_tokenizer

            return load_tokenizer(spec.model)
        except Exception as exc:  # noqa: BLE001 - transformers' many ways to fail
            field = "model.tokenizer" if spec.model.tokenizer else "model.path"
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            problems.append(f"{field}: cannot load a tokenizer from {tok_path}: {first}; set "
                            "model.tokenizer (builtin:char, or a directory with tokenizer "
                            "files)")
    elif spec.model.tokenizer and model_here and not _hub_id(tok_path):
        problems.append(f"model.tokenizer: {tok_dir} is not a directory{where}")
    return None


def _check_dataset(spec, where: str, problems: list[str], warmup: bool = False):
    """The dataset's examples (None when it cannot be read); `warmup`: those of the
    file the warm-up reads (dataset.warmupPath, else dataset.path)."""
    from .inputs.data import load_examples

    dataset, name = spec.dataset.for_warmup() if warmup else (spec.dataset, "dataset.path")
    try:
        return load_examples(dataset, name)
    except ValueError as exc:
        msg = str(exc)
        if "does not exist" in msg:
            msg += (f"{where}; give the JSONL or Parquet file of "
                    + ("the warm-up's rows" if warmup else "prompts"))
        problems.append(msg.replace(f"{name} ", f"{name}: ", 1))
    return None


def _check_reward(spec, examples, problems: list[str]) -> None:
    """The reward resolves to a callable, imported as the workers import it (python -m
    rljob runs from the current directory), and returns a number when called once on
    the first dataset row (its answer as the response)."""
    from .reward import get_reward, try_reward

    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        fn = get_reward(spec.reward.name)
    except ValueError as exc:
        problems.append(f"reward.name: {exc}")
        return
    if examples:
        failed = try_reward(fn, examples[0])
        if failed:
            problems.append(f"reward.name: {spec.reward.name} fails on the dataset's first "
                            f"row: {' '.join(failed.split())}")


def _check_reward_model(spec, where: str, examples, problems: list[str]) -> None:
    """reward.model: a sequence classifier's directory (not one on its PVC, which only
    the reward pods mount), its label, its tokenizer and the template's fields."""
    from .reward.classifier import fields

    scorer = spec.reward.model
    if scorer is None:
        return
    keys = sorted((examples[0].extra or {}) if examples else {})
    unknown = sorted(fields(scorer.template) - {"prompt", "response", "answer", *keys})
    if unknown and examples:
        problems.append(f"reward.model.template: {{{unknown[0]}}} is not a field of the "
                        f"samples: use {{prompt}}, {{response}}, {{answer}} or a key of the "
                        f"dataset's rows ({', '.join(keys) or 'it has none'})")
    if scorer.pvc or _hub_id(scorer.path):
        return
    config = Path(scorer.path) / "config.json"
    try:
        doc = json.loads(config.read_text())
    except OSError:
        problems.append(f"reward.model.path: {scorer.path} has no config.json{where}: give a "
                        "sequence classifier saved by transformers (save_pretrained)")
        return
    except ValueError as exc:
        problems.append(f"reward.model.path: {config} is not valid JSON: {exc}")
        return
    kinds = doc.get("architectures") or []
    if not any(k.endswith("ForSequenceClassification") for k in kinds):
        problems.append(f"reward.model.path: {scorer.path} is a {', '.join(kinds) or 'model'}, "
                        "not a sequence classifier (…ForSequenceClassification): its "
                        "scores are what reward.model kind classifier serves")
    labels = len(doc.get("id2label") or {}) or int(doc.get("num_labels", 2))
    if labels > 1 and scorer.label >= labels:
        problems.append(f"reward.model.label: {scorer.label}, but {scorer.path} has {labels} "
                        f"labels (0 to {labels - 1})")
    try:
        from .inputs.models import load_tokenizer

        load_tokenizer(scorer)
    except Exception as exc:  # noqa: BLE001 - transformers' many ways to fail
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        problems.append(f"reward.model.tokenizer: cannot load a tokenizer from "
                        f"{scorer.tokenizer_path}: {first}")


def _check_length_predictor(spec, problems: list[str]) -> None:
    """skew-aware dispatch: the length predictor resolves (a name or module:Class)."""
    if spec.rollout.dispatch != "skew_aware":
        return
    from .workflow.lengths import LENGTH_PREDICTORS

    try:
        LENGTH_PREDICTORS.get(spec.rollout.length_predictor)
    except ValueError as exc:
        problems.append(f"rollout.lengthPredictor: {exc}")


def _check_environment(spec, examples, tok, problems: list[str]) -> list[dict] | None:
    """An environment resolves and starts on the dataset's first row; the model's
    chat template, where it has one, can write the environment's replies. Returns the
    schemas the job's prompts announce (its tools, resolved once here: an MCP server
    is asked for its tools once), None for none or where they do not resolve."""
    if not spec.rollout.episodic:
        if spec.rollout.tools or spec.rollout.mcp_servers:
            field = "rollout.tools" if spec.rollout.tools else "rollout.mcpServers"
            problems.append(f"{field}: a single_turn job calls no tool: set "
                            "rollout.environment to tools (or your environment)")
        return None
    if spec.rollout.environment == "tools" and not (spec.rollout.tools
                                                    or spec.rollout.mcp_servers):
        return None  # the spec's rule says so (rollout.tools)
    from .environments import environment_factory
    from .environments.chat import ChatTemplateError, ChatTurns
    from .tools.catalog import job_tools
    from .tools.mcp import ToolServerError

    try:
        tools = job_tools(spec.rollout)
    except (ValueError, ToolServerError) as exc:
        problems.append(str(exc))
        return None
    schemas = [t.schema for t in tools] or None
    if tok is not None:
        try:
            ChatTurns.of(tok, schemas)
        except ChatTemplateError as exc:
            problems.append(f"rollout.environment: {exc}")
        _check_announced(tok, tools, problems)

    name = spec.rollout.environment
    try:
        env = environment_factory(name, tools, spec.rollout.tool_parser)
    except ValueError as exc:
        problems.append(str(exc) if str(exc).startswith("rollout.toolParser")
                        else f"rollout.environment: {exc}")
        return schemas
    if examples:
        e = examples[0]
        try:
            env({"prompt": e.prompt, "answer": e.answer, **(e.extra or {})})
        except Exception as exc:  # noqa: BLE001 - a user's environment, one line
            problems.append(f"rollout.environment: {name} fails to start on the dataset's "
                            f"first row: {type(exc).__name__}: {' '.join(str(exc).split())}")
    return schemas


def _check_announced(tok, tools, problems: list[str]) -> None:
    """The model's chat template announces every tool of the job: its prompt,
    rendered with `tools=`, names each (a template that ignores `tools` would
    leave the model calling tools it was never shown)."""
    if not tools:
        return
    from .inputs.data import render_prompt

    if not getattr(tok, "chat_template", None):
        problems.append("rollout.tools: the tokenizer has no chat template to announce "
                        "the tools with: use a chat model's tokenizer (model.tokenizer)")
        return
    try:
        shown = render_prompt(tok, "", [t.schema for t in tools])
    except Exception as exc:  # noqa: BLE001 - a template that fails on tools=
        problems.append(f"rollout.tools: the chat template fails to announce them: "
                        f"{type(exc).__name__}: {' '.join(str(exc).split())}")
        return
    missing = [t.name for t in tools if t.name not in shown]
    if missing:
        problems.append(f"rollout.tools: the model's chat template does not announce "
                        f"{', '.join(missing)} (it ignores tools=): use a template "
                        "with tool support")


def _check_vocab(spec, config: dict, tok, problems: list[str]) -> None:
    """A checkpoint's embedding has a row for every id of its tokenizer (more rows are
    padding, never sampled: sampling.py); a `random:` config is sized to the
    tokenizer."""
    rows = config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size")
    if spec.model.path.startswith(RANDOM) or not isinstance(rows, int):
        return
    if len(tok) > rows:
        field = "model.tokenizer" if spec.model.tokenizer else "model.path"
        problems.append(
            f"{field}: the tokenizer has {len(tok)} tokens but the checkpoint's embedding "
            f"has {rows} rows (config.json vocab_size): ids from {rows} on have no "
            "embedding; use the tokenizer saved with the checkpoint")


def _prompts_fit(context: int, tok, examples, tools: list[dict] | None, field: str,
                 problems: list[str]) -> int | None:
    """The longest prompt's tokens (the prompts as they announce `tools`, the job's tool
    schemas); None, and a problem under `field`, when it leaves no position to fill."""
    from .inputs.data import prompt_ids

    longest = max(len(prompt_ids(tok, e.prompt, tools))
                  for e in examples[:PROMPTS_CHECKED])
    if longest < context:
        return longest
    problems.append(
        f"{field}: the longest prompt is {longest} tokens, but the model has "
        f"{context} positions (max_position_embeddings): shorten the prompts or use "
        "a model with a longer context")
    return None


def _check_context(spec, context: int, tok, examples, tools: list[dict] | None,
                   problems: list[str]) -> None:
    """The longest prompt plus rollout.maxNewTokens fits the model's positions."""
    longest = _prompts_fit(context, tok, examples, tools, "dataset.path", problems)
    if longest is None:
        return
    need = longest + spec.rollout.max_new_tokens
    if need > context:
        problems.append(
            f"rollout.maxNewTokens: {spec.rollout.max_new_tokens} new tokens after the "
            f"longest prompt ({longest} tokens) need {need} positions, but the model has "
            f"{context} (max_position_embeddings); set rollout.maxNewTokens to at most "
            f"{max(context - longest, 0)}")


def _check_rollout_memory(spec, config: dict, problems: list[str]) -> None:
    """vLLM's share of each rollout accelerator leaves room for a weight update and
    the runtime, and holds the weights' shard and one sequence's KV cache
    (rollout/memory.py, with the accelerator type's datasheet memory)."""
    from .rollout.memory import for_rollout
    from .weights.collective import BUCKET_BYTES

    kind = spec.accelerator_for("rollout").type
    if kind != "cpu":
        problems += for_rollout(config, spec.model.dtype, spec.rollout, kind,
                                BUCKET_BYTES).problems


def check(job: RLJob, base: Path | None = None, volumes_here: bool = False) -> list[str]:
    """Every problem of `job` (paths already resolved) that shows on this machine;
    `volumes_here`: paths on the job's PVCs are readable here too (in one of its pods,
    where they are mounted; or a local run, which reads every path on this machine)."""
    from .trainer.sinks import wandb_problems

    spec = job.spec
    problems: list[str] = []
    where = f" (relative paths are read from {base})" if base else ""
    config = _check_model(spec, where, volumes_here, problems)
    context = config.get("max_position_embeddings") if isinstance(config, dict) else None
    tok = _check_tokenizer(spec, where, volumes_here or not spec.model.pvc, problems)
    if isinstance(config, dict) and tok is not None:
        _check_vocab(spec, config, tok, problems)
    if isinstance(config, dict) and spec.trainer.engine == "megatron":
        from .trainer.mcore import architecture_problem

        problem = architecture_problem(config)
        if problem:
            problems.append(f"trainer.engine: {problem}")
    if isinstance(config, dict) and spec.rollout.engine == "vllm":
        _check_rollout_memory(spec, config, problems)
    if isinstance(config, dict) and spec.model.lora is not None:
        from .trainer.lora import lora_problems

        problems += lora_problems(spec.model.lora, config)
    readable = volumes_here or not spec.dataset.pvc
    examples = _check_dataset(spec, where, problems) if readable else None
    # the warm-up's own file, where it has one and a warm-up reads it
    shown = (_check_dataset(spec, where, problems, warmup=True)
             if readable and spec.dataset.warmup_path and spec.model.warmup_steps else None)
    _check_reward(spec, examples, problems)
    _check_reward_model(spec, where, examples, problems)
    _check_length_predictor(spec, problems)
    tools = _check_environment(spec, examples, tok, problems)
    problems += wandb_problems(spec)
    if context and tok is not None and examples:
        _check_context(spec, context, tok, examples, tools, problems)
    if context and tok is not None and shown:
        _prompts_fit(context, tok, shown, tools, "dataset.warmupPath", problems)
    return problems


def check_text_here(text: str, base: Path) -> list[str]:
    """`check` for every RLJob document of a file whose relative paths are read from
    `base`: a document with fields the schema refuses (the schema's problems) is
    checked with those fields left out, so its files are said in the same run; one
    that cannot be read as a job at all (a required field missing) is skipped."""
    from .api.validation import RLJobError, best_effort_job, parse_documents

    problems = []
    try:
        docs = parse_documents(text, str(base))
    except RLJobError:
        return []
    for i, doc in enumerate(docs, 1):
        job = best_effort_job(doc)
        if job is None:
            continue
        job = resolve_paths(job, base)
        prefix = f"document {i}: " if len(docs) > 1 else ""
        problems += [prefix + p for p in check(job, base)]
    return problems


def termination_message(problems: list[str], limit: int = TERMINATION_LIMIT) -> str:
    """The problems, one per line, cut to what Kubernetes keeps of a termination
    message (whole lines, and a count of those left off)."""
    lines: list[str] = []
    for i, p in enumerate(problems):
        tail = f"\n(and {len(problems) - i} more: see the container's log)"
        if len("\n".join([*lines, p]).encode()) + len(tail.encode()) > limit:
            return "\n".join(lines) + tail if lines else p.encode()[:limit].decode(errors="ignore")
        lines.append(p)
    return "\n".join(lines)
