"""`rljob bench ...`: the benchmarks, which live in the `rljob_bench` package beside
the runtime (imported only when a benchmark runs)."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path

import typer

from .app import JOB_FILE, JSON_OUT, app, local_job

bench_app = typer.Typer(help="Benchmarks that print figures.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")


@bench_app.callback()
def _bench(
    examples: Path = typer.Option(Path("examples"), "--examples", help="The repository's "
                                  "examples folder: the tiny model, the datasets and the "
                                  "jobs the benchmarks run (default: ./examples)."),
) -> None:
    """Benchmarks that print figures."""
    from rljob_bench.examples import use

    use(examples)


def _fresh_dir(keep: Path | None) -> Path | None:
    """--keep names a new or empty directory: runs kept in one that holds an earlier
    benchmark's would add their metrics and timelines to its runs' (the figures then
    mix both)."""
    if keep is not None and keep.exists() and (not keep.is_dir() or any(keep.iterdir())):
        raise typer.BadParameter(f"{keep} is not an empty directory (an earlier benchmark's "
                                 "runs would mix into this one's figures): give a new or "
                                 "empty one", param_hint="--keep")
    return keep


def _keep(text: str = "Keep the run directories here (a new or empty directory).") -> Path:
    return typer.Option(None, help=text, callback=_fresh_dir)


def _check_warmup(warmup: int, steps: int) -> None:
    """--warmup leaves steps to measure (one line naming the option, else)."""
    if warmup >= steps:
        raise typer.BadParameter(f"{warmup} warm-up steps leave none of {steps} to measure",
                                 param_hint="--warmup")


def _report(bench, results: dict, json_out: bool) -> None:
    """A benchmark's results: one JSON object, or its own tables."""
    if json_out:
        import json

        typer.echo(json.dumps(results, indent=2))
    else:
        bench.render(results)


class AppendFsync(StrEnum):
    """The append-only file of the redis-server `bench transferqueue` starts."""

    always = "always"
    everysec = "everysec"
    no = "no"


@bench_app.command("transferqueue")
def bench_transferqueue(
    redis: str = typer.Option(None, help="Use this Redis URL instead of starting a redis-server."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object instead of tables."),
    quick: bool = typer.Option(False, help="A quarter of the data: a faster, noisier run."),
    appendfsync: AppendFsync = typer.Option(
        AppendFsync.always,
        help="The redis-server it starts: its append-only file synced before each answer "
             "(always, as a job's units run), once a second, or no file."),
) -> None:
    """put+get MB/s and claim latency of TransferQueue next to raw Redis."""
    from rljob_bench import transferqueue as bench

    _report(bench, bench.run(redis, quick=quick, appendfsync=appendfsync.value), json_out)


@bench_app.command("dispatch")
def bench_dispatch(
    seeds: int = typer.Option(5, help="Synthetic steps per scenario."),
    json_out: bool = JSON_OUT,
) -> None:
    """Makespan of random vs skew-aware vs oracle dispatch on a long-tail workload."""
    from rljob_bench import dispatch as bench

    _report(bench, bench.run(seeds, progress=lambda line: typer.echo(line, err=True)),
            json_out)


@bench_app.command("workflow")
def bench_workflow(
    steps: int = typer.Option(12, help="Steps per mode (the first 3 are not measured)."),
    keep: Path = _keep(),
    rounds: int = typer.Option(2, min=1, help="Rounds of the four modes; medians are printed."),
    prompts: int = typer.Option(None, min=1, help="Prompts per step (16 samples each, one "
                                "micro-batch per prompt; default: the size a short probe "
                                "of this machine finds balances generation and training)."),
    max_num_seqs: int = typer.Option(None, "--max-num-seqs", min=1,
                                     help="rollout.maxNumSeqs of the job (default: the "
                                     "spec's default)."),
    peer: str = typer.Option(None, "--peer", help="trl: also run TRL's GRPOTrainer on the "
                             "same job in each round, configured for it and at its own "
                             "defaults, and print our ratio to each (needs `pip install "
                             "trl`)."),
    algorithm: str = typer.Option("grpo", help="grpo, or ppo (the same job trained with a "
                                  "critic streaming through its own task)."),
    lend_cores: bool = typer.Option(False, "--lend-cores", help="Run our modes with "
                                    "`rljob run --lend-cores`."),
    json_out: bool = JSON_OUT,
) -> None:
    """The same small job in sync, periodic, async(1) and async(2): tokens/s, bubbles,
    speedups, bounds."""
    from rljob_bench import workflow as bench

    if algorithm not in ("grpo", "ppo"):
        raise typer.BadParameter("use grpo or ppo", param_hint="--algorithm")
    _report(bench, bench.run(steps, keep, rounds, prompts, max_num_seqs, peer, algorithm,
                             lend_cores), json_out)


@bench_app.command("updates")
def bench_updates(
    jobs: str = typer.Option(",".join(("longtail", "agentic-slow-tool", "quickstart")),
                             help="Comma-separated: longtail, agentic-slow-tool, quickstart."),
    steps: int = typer.Option(30, min=8, help="Steps per run."),
    rounds: int = typer.Option(2, min=1, help="Rounds of drain and interrupt; medians are "
                               "printed."),
    warmup: int = typer.Option(5, min=1, help="Steps not measured at the start of a run."),
    tool_seconds: float = typer.Option(2.0, min=0.0, help="Seconds each call of the slow "
                                       "tool takes (agentic-slow-tool)."),
    engine: str = typer.Option("hf", help="rollout.engine of every run: hf, or vllm (in an "
                               "environment with vLLM)."),
    keep: Path = _keep(),
    json_out: bool = JSON_OUT,
) -> None:
    """Drain against interrupt (workflow.weightUpdate) recomputing and keeping the
    interrupted samples' cache (workflow.interruptCache) on the long-tail, slow-tool agentic
    and quickstart jobs in async(1): tokens/s, update latency, rollout idle share,
    per-token staleness, reward."""
    from rljob_bench import updates as bench

    names = [j.strip() for j in jobs.split(",") if j.strip()]
    unknown = [j for j in names if j not in bench.JOBS]
    if unknown or not names:
        raise typer.BadParameter(f"{', '.join(unknown) or 'none given'}: use "
                                 + ", ".join(bench.JOBS), param_hint="--jobs")
    _check_warmup(warmup, steps)
    if engine not in ("hf", "vllm"):
        raise typer.BadParameter("use hf or vllm", param_hint="--engine")
    _report(bench, bench.run(names, steps, rounds, warmup, tool_seconds, keep,
                             progress=lambda line: typer.echo(line, err=True), engine=engine),
            json_out)


@bench_app.command("offpolicy")
def bench_offpolicy(
    file: Path = JOB_FILE,
    steps: int = typer.Option(None, min=1, help="Steps per run (default: the job's "
                              "algorithm.maxSteps)."),
    last: int = typer.Option(30, min=1, help="The reward compared is the mean of this many "
                             "last steps."),
    seeds: int = typer.Option(1, min=1, help="Runs per configuration, each with its own "
                              "algorithm.seed; their means are printed."),
    temperature: float = typer.Option(None, help="rollout.temperature of every run."),
    top_p: float = typer.Option(None, "--top-p", help="rollout.topP of every run."),
    keep: Path = _keep(),
    json_out: bool = JSON_OUT,
) -> None:
    """The job in sync, then async(1) and async(2) under each offPolicyCorrection (none,
    tis, mis): the reward of the last steps next to sync's, the clipped share, the
    importance weights and the engine mismatch."""
    from rljob_bench import offpolicy as bench

    job = local_job(file)
    _report(bench, bench.run(job, str(file), steps, last, seeds, temperature, top_p,
                             keep=keep, progress=lambda line: typer.echo(line, err=True)),
            json_out)


@bench_app.command("engines")
def bench_engines(
    steps: int = typer.Option(20, min=5, help="Steps per engine (the first 3 are not "
                              "measured)."),
    rounds: int = typer.Option(1, min=1, help="Rounds of the two engines; medians are "
                               "printed."),
    max_num_seqs: int = typer.Option(256, "--max-num-seqs", min=1,
                                     help="rollout.maxNumSeqs of the job."),
    keep: Path = _keep(),
    json_out: bool = JSON_OUT,
) -> None:
    """The same small job with the hf and the vllm rollout engine: generated tokens/s,
    weight-update seconds, steps/s."""
    from rljob_bench import engines as bench

    _report(bench, bench.run(steps, rounds, max_num_seqs, keep), json_out)


@bench_app.command("optimisations")
def bench_optimisations(
    steps: int = typer.Option(12, min=4, help="Steps per configuration (the first 2 are "
                              "not measured)."),
    rounds: int = typer.Option(2, min=1, help="Rounds of every configuration; medians are "
                               "printed."),
    config: list[str] = typer.Option([], "--config", metavar="NAME",
                                     help="Run only these configurations (repeat)."),
    keep: Path = _keep(),
    json_out: bool = JSON_OUT,
) -> None:
    """The papers' mechanisms, each off and on side by side: skew-aware dispatch (and an
    oracle ranker; one and two replicas), arrival-order micro-batches, StreamRL's ablation
    (sync, + skew-aware, + streaming, + async), sequence packing, shared-prompt attention
    and the token-balanced data-parallel split."""
    from rljob_bench import optimisations as bench

    _report(bench, bench.run(steps, rounds, keep, config or None), json_out)


@bench_app.command("weights")
def bench_weights(
    rounds: int = typer.Option(3, min=1, help="Versions sent over each transport; medians "
                               "are printed."),
    layers: int = typer.Option(None, min=1, help="Transformer layers (the model's own "
                               "by default)."),
    dtype: str = typer.Option("bfloat16", help="The weights' dtype."),
    model: str = typer.Option("qwen2.5-0.5b", help="Whose shapes: quickstart, "
                              "qwen2.5-0.5b or qwen2.5-7b."),
    lora: int = typer.Option(None, min=1, help="Also a LoRA job's update: the adapter of "
                             "this rank alone."),
    json_out: bool = JSON_OUT,
) -> None:
    """One weight version to a replica in another process over grpc and collective
    (gloo): publish, transfer and update seconds side by side; with --lora a LoRA
    update's beside them."""
    from rljob_bench import weights as bench

    if model not in bench.MODELS:
        raise typer.BadParameter(f"one of {', '.join(bench.MODELS)}", param_hint="--model")
    _report(bench, bench.run(rounds, layers, dtype, model, lora), json_out)


@bench_app.command("calibration")
def bench_calibration(
    steps: int = typer.Option(12, min=5, help="Steps of each mode's run."),
    keep: Path = _keep("Keep the runs in this directory (a new or empty one)."),
    json_out: bool = JSON_OUT,
) -> None:
    """The bench workflow job in sync, periodic and async(1): measured seconds a step
    against the simulator's, fed with the runs' live profiles."""
    from rljob_bench import calibration as bench

    _report(bench, bench.run(steps, keep), json_out)


@bench_app.command("weight-memory")
def bench_weight_memory(
    tp: int = typer.Option(2, min=1, help="The vLLM replica's tensor-parallel workers."),
    bucket_mb: int = typer.Option(16, min=1, help="The collective path's bucket size, MB."),
    json_out: bool = JSON_OUT,
) -> None:
    """One weight update to a tensor-parallel vLLM replica (needs vLLM), over grpc and
    collective: each worker's peak memory growth during it."""
    from rljob_bench import weight_memory as bench

    _report(bench, bench.run(tp, bucket_mb), json_out)


@bench_app.command("trainer")
def bench_trainer(
    engines: str = typer.Option("torch,megatron", help="Trainer engines, comma-separated "
                                "(torch, megatron, torch-lora: the torch engine training "
                                "a LoRA adapter)."),
    accelerator: str = typer.Option("cpu", help="cpu, or gpu (the first CUDA device)."),
    model: str = typer.Option("tiny", help="tiny (examples/models/tiny-qwen2) or qwen2-0.5b "
                              "(Qwen2-0.5B's shapes); random init either way."),
    steps: int = typer.Option(5, min=1, help="Timed optimizer steps; medians are printed."),
    warmup: int = typer.Option(2, min=0, help="Optimizer steps before the timed ones."),
    prompt_len: int = typer.Option(16, "--prompt-len", min=1, help="Prompt tokens per sample."),
    response_len: int = typer.Option(32, "--response-len", min=1,
                                     help="Response tokens per sample."),
    group: int = typer.Option(8, min=2, help="Samples per prompt (GRPO's group)."),
    micro_batch: int = typer.Option(8, "--micro-batch", min=1,
                                    help="Samples per micro-batch."),
    micro_batches: int = typer.Option(2, "--micro-batches", min=1,
                                      help="Micro-batches per optimizer step."),
    lora_rank: int = typer.Option(16, "--lora-rank", min=1, help="torch-lora's adapter "
                                  "rank (alpha twice it)."),
    json_out: bool = JSON_OUT,
) -> None:
    """The trainer's GRPO step with each trainer engine (torch, megatron, torch-lora) side
    by side: step seconds, trained tokens/s, peak device and host memory, optimizer
    state."""
    from rljob_bench import trainer as bench

    names = tuple(e.strip() for e in engines.split(",") if e.strip())
    try:
        results = bench.run(names, accelerator, model, steps, warmup, prompt_len, response_len,
                            group, micro_batch, micro_batches, lora_rank)
    except ValueError as exc:
        typer.echo(f"bench trainer: {exc}", err=True)
        raise typer.Exit(2) from None
    _report(bench, results, json_out)


@bench_app.command("peer")
def bench_peer(
    accelerator: str = typer.Option("cpu", help="cpu, or gpu (the first CUDA device; "
                                    "trainer and rollout share it)."),
    model: str = typer.Option("tiny", help="tiny (examples/models/tiny-qwen2) or qwen2-0.5b "
                              "(Qwen2-0.5B's layers, the character vocabulary); random init."),
    steps: int = typer.Option(10, min=2, help="Steps per run."),
    warmup: int = typer.Option(3, min=1, help="Steps not measured at the start of a run."),
    prompts: int = typer.Option(16, min=1, help="Prompts per step."),
    group: int = typer.Option(8, min=2, help="Samples per prompt (GRPO's group)."),
    max_new_tokens: int = typer.Option(22, "--max-new-tokens", min=1,
                                       help="rollout.maxNewTokens (the tiny model's context "
                                       "is 64 tokens)."),
    micro_batch: int = typer.Option(16, "--micro-batch", min=1,
                                    help="algorithm.samplesPerMicroBatch."),
    peer: bool = typer.Option(True, "--peer/--no-peer", help="Also run TRL's GRPOTrainer "
                              "on the job (needs `pip install trl`)."),
    keep: Path = _keep(),
    json_out: bool = JSON_OUT,
) -> None:
    """One GRPO job by `rljob run` in sync and async(1) and by TRL's GRPOTrainer, side by
    side on one device: tokens/s, step seconds, Tgen, Ttrain, async's bound, each ratio
    to TRL, and where a step goes."""
    from rljob_bench import peer as bench

    if accelerator not in ("cpu", "gpu"):
        raise typer.BadParameter("use cpu or gpu", param_hint="--accelerator")
    _check_warmup(warmup, steps)
    if (prompts * group) % micro_batch:
        raise typer.BadParameter(f"{prompts} × {group} samples a step do not split into "
                                 f"micro-batches of {micro_batch}", param_hint="--micro-batch")
    _report(bench, bench.run(accelerator, model, steps, warmup, prompts, group, max_new_tokens,
                             micro_batch, keep, peer), json_out)


@bench_app.command("security")
def bench_security(
    steps: int = typer.Option(24, min=3, help="Steps per run of the quickstart."),
    warmup: int = typer.Option(4, min=1, help="Steps not measured at the start of a run."),
    rounds: int = typer.Option(2, min=1, help="Rounds of off and on, alternating; medians "
                               "are printed."),
    quick: bool = typer.Option(False, help="An eighth of the TransferQueue's bytes, one "
                               "round of it, and a tenth of the quickstart's warm-up."),
    keep: Path = _keep(),
    json_out: bool = JSON_OUT,
) -> None:
    """What the job's credentials cost: the quickstart's tokens/s with the job token and
    TLS off and on, and the TransferQueue's 64 KB put+get and claim latency with none,
    the token, and the token and TLS."""
    from rljob_bench import security as bench

    _check_warmup(warmup, steps)
    _report(bench, bench.run(steps, warmup, rounds, keep, quick), json_out)


@bench_app.command("overhead")
def bench_overhead(
    steps: int = typer.Option(30, min=3, help="Steps per mode."),
    warmup: int = typer.Option(5, min=1, help="Steps not measured at the start of a run."),
    rounds: int = typer.Option(1, min=1, help="Rounds of the three modes; medians are "
                               "printed."),
    modes: str = typer.Option("sync,periodic,async", help="Comma-separated: sync, periodic, "
                              "async (maxStaleness 1)."),
    keep: Path = _keep(),
    json_out: bool = JSON_OUT,
) -> None:
    """The orchestration's milliseconds a step (claims, puts, acks, weight publication,
    version waits) in sync, periodic and async(1), with a nano model's compute taken
    out."""
    from rljob_bench import overhead as bench

    _check_warmup(warmup, steps)
    names = tuple(m.strip() for m in modes.split(",") if m.strip())
    unknown = sorted(set(names) - {m for m, _ in bench.MODES})
    if unknown or not names:
        raise typer.BadParameter(f"{', '.join(unknown) or 'none given'}: use sync, periodic, "
                                 "async", param_hint="--modes")
    _report(bench, bench.run(steps, warmup, rounds, keep, names), json_out)
