"""Prometheus metrics of the job's workers (each worker serves its own registry)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server


# the trainer's off-policy figures of a step (trainer/algorithms.py: OffPolicyStats):
# metrics.jsonl key → (series, help)
OFF_POLICY = {
    "is_weight_mean": ("rljob_job_importance_weight_mean",
                       "Mean behaviour-to-trainer importance weight of the last step's tokens"),
    "is_weight_max": ("rljob_job_importance_weight_max",
                      "Largest importance weight of the last step"),
    "is_capped": ("rljob_job_importance_capped_ratio",
                  "Share of the last step's tokens whose importance weight was above the cap"),
    "is_ess": ("rljob_job_importance_ess_ratio",
               "Effective sample size of the last step's importance weights, over its tokens"),
    "logp_mismatch_mean": ("rljob_job_logprob_mismatch_nats",
                           "Mean |rollout - trainer log-prob| of the last step's fresh tokens "
                           "(engine mismatch)"),
    "logp_mismatch_max": ("rljob_job_logprob_mismatch_max_nats",
                          "Largest |rollout - trainer log-prob| of the last step's fresh tokens"),
}


class WorkerMetrics:
    """A worker's series, labelled `worker` (rollout-0, trainer-0, driver; never `job`,
    which belongs to the scrape). Totals are counters (`rate()` makes the rates);
    the step's figures have the names the TransferQueue controller and the operator
    give the same figures (`rljob_job_*`)."""

    def __init__(self, worker: str, port: int | None):
        reg = self.registry = CollectorRegistry()
        role = worker.split("-")[0]
        verb = {"rollout": "generated", "trainer": "trained", "reward": "scored"}.get(
            role, "processed")

        def one(kind, name: str, doc: str):
            return kind(name, doc, ["worker"], registry=reg).labels(worker)

        self.samples = one(Counter, f"rljob_{verb}_samples",
                           f"Samples {verb} by this worker")
        self.tokens = one(Counter, f"rljob_{verb}_tokens",
                          f"Response tokens {verb} by this worker")
        self.dropped = one(Counter, "rljob_dropped_samples",
                           "Generated (reward: scored) samples refused because their lease "
                           "had expired")
        self.given_back = one(Counter, "rljob_rows_given_back",
                              "Claimed rows given back unstarted: their step was beyond what "
                              "the weights held may train within maxStaleness")
        self.version = one(Gauge, "rljob_weights_version", "Weights version held")
        self.step = one(Gauge, "rljob_released_step" if role == "driver" else "rljob_job_step",
                        "Last step put (driver: its prompts, a step before their release) "
                        "or trained (trainer)")
        self.reward = one(Gauge, "rljob_job_reward_mean", "Mean reward of the last step")
        self.staleness = one(Gauge, "rljob_job_staleness_mean",
                             "Mean staleness of the last step")
        self.gen_seconds = one(Gauge, "rljob_job_gen_seconds", "Tgen of the last step")
        self.train_seconds = one(Gauge, "rljob_job_train_seconds", "Ttrain of the last step")
        # metrics.jsonl key → its gauge: the last step's off-policy figures
        self.off_policy = {key: one(Gauge, name, doc) for key, (name, doc) in OFF_POLICY.items()}
        self.inflight = one(Gauge, "rljob_rollout_sequences_in_flight",
                            "Sequences a concurrent rollout engine is generating")
        buckets = (0.01, 0.03, 0.1, 0.3, 1, 3, 10, 30, 100)
        self.weight_swap = Histogram(
            "rljob_weight_swap_seconds", "A rollout's weight update: generations in flight "
            "finishing plus the load", ["worker"], buckets=buckets, registry=reg).labels(worker)
        self.weight_drain = Histogram(
            "rljob_weight_drain_seconds", "Of a rollout's weight update: waiting for the "
            "generations in flight", ["worker"], buckets=buckets, registry=reg).labels(worker)
        self.weight_transfer = Histogram(
            "rljob_weight_transfer_seconds", "A rollout's weight update: moving the version "
            "from the trainer (gRPC stream or collective broadcast)", ["worker"],
            buckets=buckets, registry=reg).labels(worker)
        self.weight_bytes = one(Counter, "rljob_weight_update_bytes", "Bytes of the weight "
                                "versions a rollout loaded (model.lora: the adapter's, the "
                                "base once a trainer life)")
        # a reward replica's scorer: the service's calls (reward.url) or the model's
        # forwards (reward.model)
        self.reward_request = Histogram(
            "rljob_reward_request_seconds", "One call of the scorer: an attempt of the "
            "scoring service's (reward.url), a batch's forward of the reward model "
            "(reward.model)", ["worker"], buckets=buckets, registry=reg).labels(worker)
        self.reward_retries = one(Counter, "rljob_reward_retries", "Calls of the scoring "
                                  "service tried again (no connection, time limit, 5xx, 429)")
        self.reward_failures = one(Counter, "rljob_reward_failures", "Samples that scored "
                                   "reward.url.failureScore: their call failed for good "
                                   "(reward.model: that its text could not be scored)")
        # episodes (rollout.environment): a rollout's tool calls and turns
        self.tool_calls = one(Counter, "rljob_tool_calls", "Tool calls the environments "
                              "answered in this worker's episodes")
        self.tool_errors = one(Counter, "rljob_tool_errors", "Tool calls that ended in an "
                               "error (a limit passed, a bad call)")
        self.malformed_calls = one(Counter, "rljob_malformed_tool_calls", "Tool calls the "
                                   "tool-call parser could not read (answered with an error)")
        self.tool_seconds = one(Counter, "rljob_tool_seconds", "Seconds the tools ran")
        self.episode_errors = one(Counter, "rljob_episode_errors", "Episodes an environment "
                                  "ended with an error (it raised, failed to start)")
        self.observation_tokens = one(Counter, "rljob_observation_tokens", "Tokens the "
                                      "environments appended (never trained on)")
        self.episode_turns = Histogram(
            "rljob_episode_turns", "The model's turns per episode", ["worker"],
            buckets=(1, 2, 3, 4, 6, 8, 16, 32, 64), registry=reg).labels(worker)
        self.episode_tokens = Histogram(
            "rljob_episode_tokens", "An episode's response tokens (the model's and the "
            "observations')", ["worker"],
            buckets=(16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768),
            registry=reg).labels(worker)
        if port:
            start_http_server(port, registry=reg)

    def count_episodes(self, records: list[dict], lengths: list[int]) -> None:
        """Finished episodes (their records, rollout.episodes.episode_record, and
        their response lengths in tokens)."""
        for e, length in zip(records, lengths):
            self.episode_tokens.observe(length)
            self.tool_calls.inc(e["tool_calls"])
            self.tool_errors.inc(e["tool_errors"])
            self.malformed_calls.inc(e.get("malformed_calls", 0))
            self.tool_seconds.inc(e["tool_seconds"])
            self.episode_errors.inc(bool(e["error"]))
            self.observation_tokens.inc(e["observation_tokens"])
            self.episode_turns.observe(e["turns"])
