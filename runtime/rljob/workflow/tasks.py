"""The job's TransferQueue table: which task writes and reads which columns.

driver  → prompt, answer, extra (json: the dataset row's other keys), prompt_ids (int32), slot (int32: position in the
          step, the order micro-batches are trained in), released_at (float64)
rollout : prompt_ids → response_ids (int32), rollout_logp (float32),
          reward (float32), reward_error (json), started_at / finished_at (float64:
          the group's generation span, what Tgen is made of),
          weights_epoch (int64: the trainer life whose weights made the sample),
          gen_calls (json: the engine calls that generated the rows written
          together, on the first of them, [] on the others: a live profile's input,
          planner/live.py); with an environment (rollout.environment) also
          loss_mask (uint8, one per response token: 1 the model's, 0 an
          observation's) and episode (json: turns, tool calls and errors, seconds);
          with workflow.weightUpdate interrupt also weight_versions (json: the change
          points [position, version, epoch] of the weights its tokens came from,
          workflow/versions.py; the row's version is the first's)
reference: prompt_ids, response_ids → ref_logp (float32, one per response token: the
          frozen reference's log-probs); algorithm.klCoef > 0 with trainer.engine
          torch where rollout replicas take it too (`reference_task`), computed by
          whichever side waits (trainer/reference.py)
train   : response_ids, reward (+ the row's policy version in its metadata), and
          ref_logp when the reference task runs
lengths : response_ids (skew-aware dispatch: the length ranker reads prompt)
reward  : response_text → reward, reward_error, reward_started_at / reward_finished_at
          (float64: the batch's scoring span): with reward.url or reward.model only,
          scored by the reward replicas (scorer/worker.py); the rollout then writes
          rule_reward (float32: reward.name's score, an episode's environment reward
          added), rule_error (json) and response_text (json: the text the reward
          scores) in place of reward and reward_error, and train waits for the reward
          task's column
critic  : response_ids, reward → values, advantages, returns (float32, one per
          response token: the critic's values and GAE over them), critic_version
          (int64: the critic that scored the row); algorithm ppo only, and then
          train also reads advantages
"""

from __future__ import annotations

from ..transferqueue import TaskSpec, json_column, scalar, tensor

DRIVER = TaskSpec("driver", (), [json_column("prompt"), json_column("answer"),
                             json_column("extra"), tensor("prompt_ids", "int32"), scalar("slot", "int32"),
                             scalar("released_at", "float64")])
ROLLOUT = TaskSpec("rollout", ["prompt_ids"], [tensor("response_ids", "int32"),
                                           tensor("rollout_logp", "float32"),
                                           scalar("reward", "float32"),
                                           json_column("reward_error"),
                                           scalar("started_at", "float64"),
                                           scalar("finished_at", "float64"),
                                           scalar("weights_epoch", "int64"),
                                           json_column("gen_calls")])
# rollout.environment: an episode's tokens, the model's and its environment's
EPISODE_COLUMNS = [tensor("loss_mask", "uint8"), json_column("episode")]
# workflow.weightUpdate interrupt: the versions of a sample's tokens
VERSION_COLUMNS = [json_column("weight_versions")]
TRAIN = TaskSpec("train", ["response_ids", "reward"])
REFERENCE = TaskSpec("reference", ["response_ids"], [tensor("ref_logp", "float32")])
# rollout.dispatch skew_aware: the driver's length ranker learns from each finished
# sample (its prompt, and its response length from the row's metadata)
LENGTHS = TaskSpec("lengths", ["response_ids"])
# algorithm ppo: the critic scores each finished sample (values, GAE) as it arrives,
# and the actor update waits for its advantages
CRITIC = TaskSpec("critic", ["response_ids", "reward"], [tensor("values", "float32"),
                                                    tensor("advantages", "float32"),
                                                    tensor("returns", "float32"),
                                                    scalar("critic_version", "int64")])
TRAIN_PPO = TaskSpec("train", ["response_ids", "reward", "advantages"])
# reward.url, reward.model: the reward replicas score each finished sample (the
# rollout writes the rule's score and the text in place of the reward)
REWARD = TaskSpec("reward", ["response_text"], [scalar("reward", "float32"),
                                                json_column("reward_error"),
                                                scalar("reward_started_at", "float64"),
                                                scalar("reward_finished_at", "float64")])
RULE_COLUMNS = [scalar("rule_reward", "float32"), json_column("rule_error"),
                json_column("response_text")]
TASKS = (DRIVER, ROLLOUT, TRAIN)


def reference_in_trainer(spec) -> bool:
    """Whether the trainer computes reference log-probs with the torch engine: a KL
    term (algorithm.klCoef > 0) to a reference it holds as a transformers model
    (megatron's reference computes inside the trainer's micro-steps)."""
    return spec.algorithm.kl_coef > 0 and spec.trainer.engine == "torch"


def reference_task(spec) -> bool:
    """Whether the reference's log-probs are a task of their own, which a rollout
    replica takes too (`trainer/reference.py`): where replicas can compute the bits
    the trainer would (the hf engine, rollout and trainer on CPU: a local run's
    replicas load the reference from the run directory) and sit parked while the
    trainer has reference rows to compute: sync (between its generation and the next
    release) and async (held by the staleness bound). Everywhere else, periodic
    included (its replicas generate the next batch while the trainer computes this
    one's), the trainer computes its samples' reference log-probs itself as they
    arrive, and none of them goes through TransferQueue (`LocalReference`). So too in
    sync where no replica can take a share (`_replicas_share_reference`)."""
    return (reference_in_trainer(spec) and spec.workflow.mode in ("sync", "async")
            and spec.rollout.engine == "hf"
            and spec.accelerator_for("rollout").type == "cpu"
            and spec.accelerator_for("trainer").type == "cpu"
            and _replicas_share_reference(spec))


def reference_rows(spec) -> int:
    """Rows the trainer's reference claims take at most: a micro-batch, 16 at least."""
    return max(16, spec.algorithm.micro_samples)


def _replicas_share_reference(spec) -> bool:
    """Whether a parked replica can find reference rows the trainer has not claimed.
    Not in sync with one replica (rollout.maxReplicas 1: no scale makes it two, and
    every worker registers the same tasks) that generates its step in one batch, whose
    rows one reference claim of the trainer takes whole: the trainer's claim waits for
    that write and takes every row of it, and the replica parks with none left (the
    task then only adds a claim, a write and a second claim of the rows to each step)."""
    if spec.workflow.mode != "sync" or spec.rollout.max_replicas != 1:
        return True
    rows = spec.algorithm.samples_per_step
    one_batch = rollout_batch_rows(rows, spec.algorithm.group_size, 1,
                                   spec.rollout.max_num_seqs, "sync") >= rows
    return not (one_batch and reference_rows(spec) >= rows)


def interrupting(spec) -> bool:
    """Whether a weight update interrupts generation (its samples record the
    versions of their tokens)."""
    return spec.workflow.update_policy == "interrupt"


def reward_task(spec) -> bool:
    """Whether the reward is a task of its own (reward.url, reward.model), which the
    reward replicas take."""
    return spec.reward.streamed


def tasks_for(spec) -> tuple:
    """The job's tasks: every worker registers the same ones."""
    train = TRAIN_PPO if spec.algorithm.critic else TRAIN
    if reference_task(spec):
        train = TaskSpec("train", [*train.consumes, "ref_logp"])
    produces = ROLLOUT.produces
    if reward_task(spec):  # the rule's score and the text; the reward is the task's
        produces = [c for c in produces if c.name not in ("reward", "reward_error")] + \
            RULE_COLUMNS
    rollout = TaskSpec("rollout", ROLLOUT.consumes, [
        *produces, *(EPISODE_COLUMNS if spec.rollout.episodic else ()),
        *(VERSION_COLUMNS if interrupting(spec) else ())])
    tasks = (DRIVER, rollout, train) + ((CRITIC,) if spec.algorithm.critic else ())
    tasks += (REFERENCE,) if reference_task(spec) else ()
    tasks += (REWARD,) if reward_task(spec) else ()
    return tasks + ((LENGTHS,) if spec.rollout.dispatch == "skew_aware" else ())


def train_reads(spec) -> list[str]:
    """The columns the trainer reads (ppo: the critic's advantages too; the
    reference's log-probs when they are a task)."""
    return (TRAIN_READS + (["advantages", "critic_version"] if spec.algorithm.critic else [])
            + (["ref_logp"] if reference_task(spec) else [])
            + (["loss_mask", "episode"] if spec.rollout.episodic else [])
            + (["weight_versions"] if interrupting(spec) else [])
            + (SCORING_READS if reward_task(spec) else []))


def critic_reads(spec) -> list[str]:
    """The columns the critic reads (an episode's loss mask too)."""
    return CRITIC_READS + (["loss_mask"] if spec.rollout.episodic else [])

ROLLOUT_READS = ["prompt", "answer", "extra", "prompt_ids", "slot"]
TRAIN_READS = ["prompt_ids", "response_ids", "rollout_logp", "reward", "slot", "released_at",
               "started_at", "finished_at", "weights_epoch", "gen_calls"]
CRITIC_READS = ["prompt_ids", "response_ids", "reward", "slot"]
REFERENCE_READS = ["prompt_ids", "response_ids"]
REWARD_READS = ["prompt", "answer", "extra", "response_text", "rule_reward"]
# reward.url, reward.model: what the trainer reports of the reward task (trainer/report.py)
SCORING_READS = ["rule_reward", "reward_error", "reward_started_at", "reward_finished_at"]


PERIODIC_PIECES = 4  # periodic: rollout batches a step at least, so they overlap training


def rollout_batch_rows(samples_per_step: int, group_size: int, replicas: int,
                       max_num_seqs: int, mode: str = "async") -> int:
    """Rows a rollout replica claims and generates in one batch: whole groups, up to
    `max_num_seqs` sequences and at most the replica's share of a step. In periodic
    mode at most a PERIODIC_PIECES-th of that share: periodic overlaps generation and
    training within a step, which one batch a step cannot (measured with `rljob bench
    workflow`: one batch a step 0.79x sync, four 1.29x)."""
    per_replica = samples_per_step // max(replicas, 1)
    cap = min(per_replica, max_num_seqs)
    if mode == "periodic":
        cap = min(cap, per_replica // PERIODIC_PIECES)
    return group_size * max(1, cap // group_size)
