"""`rljob bench workflow --peer trl`'s peer configuration (pure: no TRL import)."""

from __future__ import annotations

from tests.unit.test_cli import REPO


def test_the_trl_peer_is_configured_for_the_job():
    """`rljob bench workflow --peer trl`: TRL computes what our trainer computes (no
    activation checkpointing, constant learning rate, plain k3 KL, group-std reward
    scaling, no weight decay, the job's gradient clip, float32, its micro-batches
    accumulated into one step); at its defaults it gets the job's shape only."""
    from rljob_bench.peer_trl import FAIR, trl_settings
    from rljob_bench.workflow import bench_job

    job = bench_job("sync", None, 5, REPO, prompts=2)
    algo = job.spec.algorithm
    fair = trl_settings(job, 5, "/out")
    assert fair["activation_checkpointing"] is False and fair["lr_scheduler_type"] == "constant"
    assert fair["use_bias_correction_kl"] is False and fair["scale_rewards"] == "group"
    assert fair["weight_decay"] == 0.0 and fair["warmup_steps"] == 0
    assert (fair["max_grad_norm"], fair["beta"], fair["epsilon"], fair["learning_rate"]) == (
        algo.max_grad_norm, algo.kl_coef, algo.clip_ratio, algo.lr)
    assert fair["bf16"] is False and fair["model_init_kwargs"] == {"dtype": "float32"}
    assert (fair["per_device_train_batch_size"] * fair["gradient_accumulation_steps"]
            == fair["generation_batch_size"] == algo.samples_per_step)
    assert fair["num_generations"] == algo.group_size and fair["loss_type"] == "grpo"
    defaults = trl_settings(job, 5, "/out", fair=False)
    assert not set(FAIR) & set(defaults) and {**defaults, **FAIR} == fair


def test_the_trl_peer_runs_on_the_jobs_device_in_its_precision():
    """On a GPU job the peer trains on the GPU with bfloat16 passes over float32
    masters, as our trainer does there."""
    from rljob_bench.peer import peer_job
    from rljob_bench.peer_trl import trl_settings

    job = peer_job("sync", None, 5, REPO / "examples/models/tiny-qwen2", "gpu", 2, 8, 22, 8)
    got = trl_settings(job, 5, "/out")
    assert got["use_cpu"] is False and got["bf16"] is True
    assert got["model_init_kwargs"] == {"dtype": "float32"}
    assert job.spec.workflow.weight_transport == "grpc"  # one device: no collective
    cpu = trl_settings(peer_job("sync", None, 5, REPO / "examples/models/tiny-qwen2", "cpu",
                                2, 8, 22, 8), 5, "/out")
    assert cpu["use_cpu"] is True and cpu["bf16"] is False
