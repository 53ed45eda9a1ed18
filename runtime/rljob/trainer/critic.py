"""PPO's critic: a value model that scores samples through the TransferQueue's
`critic` task while the rollouts generate and the actor trains.

It pulls each finished sample (response_ids and reward written) as soon as it
exists, computes its values V(s_t) over the response tokens, GAE advantages and
returns (the `gae` advantage estimator, algorithms.py), and writes them back as the
row's `values`, `advantages`, `returns` and `critic_version`; the actor's `train`
task waits for `advantages`. Once every sample of step t is scored the critic learns
from them,
an optimizer step per micro-batch (`samplesPerMicroBatch`, in slot order) on PPO's
clipped value loss: from the second micro-batch on its values have moved from the
ones it scored with, and `valueClip` bounds how far each may go. It becomes version
t + 1, checkpoints itself and only then acks the step's rows: a critic that dies
re-scores what its last checkpoint had not learnt from.

Versions follow the policy's: step t's samples are all scored by critic t, in
every workflow mode, and each sample is scored with the samples of its group (a
claim brings whole groups), so a periodic run's critic sees exactly the inputs
of a sync run's and makes the same updates. A row of an earlier step that
comes back (the actor refused it and the rollouts made it again) is scored by
the current critic and acked at once; rows of later steps wait, leased, for
their step.

The critic runs on rank 0 of the trainer, in its process and on its device (a
thread: the value model is as big as the policy, and its passes release the
interpreter while torch computes), initialised from the policy's weights after
warm-up with a zeroed value head. Its checkpoints are `checkpoints/critic/step-N.pt`,
kept back to the actor's newest checkpoint: a resumed trainer at step s restores the
critic of version s (never one that learnt from steps the actor has not), and a run
that does not resume starts a fresh critic.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict

import numpy as np
import torch

from ..api.spec import RLJobSpec
from ..infra.rundir import PARTIAL, RunDir, step_of
from ..infra.timeline import SpanLog
from ..transferqueue import TransferQueueClient
from ..transferqueue.consumer import LeaseKeeper, ride_out, warn
from ..transferqueue.dataplane import Batch
from ..workflow.tasks import critic_reads
from .algorithms import advantage_estimator, value_loss
from .batch import make_batch

log = logging.getLogger("rljob.critic")


def checkpoint_to_restore(files: list, at_most: int):
    """The newest of the critic's checkpoint `files` (oldest first) whose version is
    at most the actor's step `at_most`, or None (pure)."""
    fit = [f for f in files if step_of(f) <= at_most]
    return fit[-1] if fit else None


def checkpoints_to_drop(files: list, version: int, actor_steps: list[int]) -> list:
    """Which critic checkpoints to delete once version `version` is saved: those of
    later versions (an earlier life's) and those older than the actor's newest
    checkpoint at or below `version` (a resume never goes back further) (pure)."""
    floor = max((s for s in actor_steps if s <= version), default=0)
    return [f for f in files if step_of(f) > version or step_of(f) < floor]


def fit_values(model: ValueModel, opt, samples: list[dict], micro: int, pad_id: int,
               device, clip: float, max_grad_norm: float) -> tuple[float, float]:
    """PPO's value update over one step's scored samples: an optimizer step per
    micro-batch of `micro` samples, each on the clipped value loss against the values
    the samples were scored with. Returns the mean loss and the clipped share of
    tokens."""
    model.train()
    loss_sum = clip_sum = 0.0
    for start in range(0, len(samples), micro):
        chunk = samples[start:start + micro]
        mb = make_batch([s["prompt"] for s in chunk], [s["response"] for s in chunk],
                        pad_id, loss_masks=[s.get("loss_mask") for s in chunk]).to(device)
        opt.zero_grad()
        values = response_values(model, mb)
        old = torch.zeros_like(values)
        returns = torch.zeros_like(values)
        for k, s in enumerate(chunk):
            pos = mb.mask[k].nonzero().squeeze(1)
            old[k, pos] = s["values"].to(values.device)
            returns[k, pos] = s["returns"].to(values.device)
        loss, frac = value_loss(values, old, returns, mb.loss_mask, clip, len(chunk))
        loss.backward()
        if max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        opt.step()
        loss_sum += float(loss.detach()) * len(chunk) / len(samples)
        clip_sum += frac * len(chunk) / len(samples)
    return loss_sum, clip_sum


class ValueModel(torch.nn.Module):
    """The policy's architecture with a scalar head in place of the LM head:
    V at every position (the state before the next token)."""

    def __init__(self, lm: torch.nn.Module):
        super().__init__()
        self.body = lm.base_model  # the decoder: the LM head is left out
        self.head = torch.nn.Linear(lm.config.hidden_size, 1)
        torch.nn.init.zeros_(self.head.weight)  # values start at 0: plain returns
        torch.nn.init.zeros_(self.head.bias)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        hidden = self.body(input_ids=input_ids).last_hidden_state
        return self.head(hidden.float()).squeeze(-1)  # [B, L]


def response_values(model: ValueModel, batch) -> torch.Tensor:
    """Values aligned with the batch's response mask: [B, L-1], V(s) before each token."""
    return model(batch.input_ids)[:, :-1]


class Critic:
    """Scores and learns step by step (see the module docstring); `start()` runs it
    in a thread, `check()` re-raises its failure in the caller."""

    def __init__(self, spec: RLJobSpec, model: ValueModel, device, tq: TransferQueueClient,
                 pad_id: int, run: RunDir | None, version: int = 0,
                 opt_state: dict | None = None, spans: SpanLog | None = None):
        self.spec, self.model, self.device, self.tq = spec, model.to(device), device, tq
        # on the trainer's row of the timeline (the critic is a thread of its process)
        self.spans = spans or SpanLog(None, "critic")
        self.reads = critic_reads(spec)
        self.pad_id, self.run, self.version = pad_id, run, version
        algo = spec.algorithm
        self.n, self.mb, self.g = algo.samples_per_step, algo.micro_samples, algo.group_size
        self.estimator = advantage_estimator(algo)  # gae: per token, from the values
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=algo.critic_lr, weight_decay=0.0)
        if opt_state is not None:
            self.opt.load_state_dict(opt_state)
        self.keeper = LeaseKeeper(tq)
        self.waiting: dict[int, list] = defaultdict(list)  # step → (batch, rows) of later steps
        self.unacked: dict[str, tuple[Batch, set[int]]] = {}  # lease → its batch, rows left
        self.history: dict[int, dict] = {}  # version → the update that made it
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- life ------------------------------------------------------------------
    @classmethod
    def restore(cls, spec: RLJobSpec, lm: torch.nn.Module, device, tq: TransferQueueClient,
                pad_id: int, run: RunDir | None, start: int, resume: bool,
                spans: SpanLog | None = None) -> Critic:
        """With `resume`: from the newest critic checkpoint of a version at most the
        trainer's step `start`; else (or without one) a fresh head on `lm` (the
        policy's weights). It starts at the trainer's step if that is further on (a
        table that was lost starts again there)."""
        model = ValueModel(lm)
        version, opt_state = 0, None
        found = (checkpoint_to_restore(run.critic_checkpoint_files(), start)
                 if run and resume else None)
        if found is not None:
            ck = torch.load(found, weights_only=True, map_location="cpu")
            model.load_state_dict(ck["model"])
            version, opt_state = ck["version"], ck["optimizer"]
            log.info("critic: resumed at version %d from %s", version, found)
        return cls(spec, model, device, tq, pad_id, run, max(version, start), opt_state, spans)

    def start(self, steps: int) -> Critic:
        self._thread = threading.Thread(target=self._run, args=(steps,), name="rljob-critic",
                                        daemon=True)
        self._thread.start()
        return self

    def check(self) -> None:
        if self.error is not None:
            raise RuntimeError(f"the critic failed: {self.error!r}") from self.error

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self.keeper.close()

    def _run(self, steps: int) -> None:
        try:
            while self.version < steps and not self._stop.is_set():
                self.step(self.version)
        except _Stopped:
            pass
        except BaseException as exc:  # noqa: BLE001 - the trainer re-raises it (check())
            log.exception("the critic failed")
            self.error = exc

    # ---- one step ------------------------------------------------------------------
    def step(self, t: int) -> None:
        """Score every sample of step t with critic t, then learn from them (→ t + 1)."""
        scored: dict[int, dict] = {}  # slot → what the update needs
        for batch, rows in self.waiting.pop(t, []):
            with self.spans.span("value", t):
                scored.update(self._score(batch, rows))
        while len(scored) < self.n:
            if self._stop.is_set():
                raise _Stopped
            batch = self._claim()
            by_step: dict[int, list[int]] = defaultdict(list)
            for i, row in enumerate(batch.rows):
                by_step[row.partition].append(i)
            for p, rows in sorted(by_step.items()):
                if p == t:
                    with self.spans.span("value", t):
                        scored.update(self._score(batch, rows))
                elif p > t:  # leased until its step comes
                    self.waiting[p].append((batch, rows))
                else:  # made again after its step was learnt from: scored, not learnt
                    with self.spans.span("value", p):
                        self._score(batch, rows)
                    self._ack(batch, [batch.rows[i].index for i in rows])
        with self.spans.span("value-update", t):
            self._learn(t, [scored[s] for s in sorted(scored)])

    def _claim(self) -> Batch:
        while True:
            batch = ride_out(lambda: self.tq.claim_get("critic", self.n, self.reads,
                                                       policy="group", wait=1.0, min_count=1),
                             away=warn(log), stop=self._stop, once=True)
            if batch is None:  # the controller was away: claim again
                continue
            if batch.rows:
                self.keeper.hold(batch)
                self.unacked[batch.lease] = (batch, set(batch.indices))
                return batch
            if self._stop.is_set():
                raise _Stopped

    @torch.no_grad()
    def _score(self, batch: Batch, rows: list[int]) -> dict[int, dict]:
        """Values, advantages and returns of `rows` of a claimed batch, a group at a time,
        written back under the batch's lease."""
        algo, d = self.spec.algorithm, batch.data
        out: dict[int, dict] = {}
        groups: dict[int, list[int]] = defaultdict(list)
        for i in rows:
            groups[batch.rows[i].group].append(i)
        self.model.eval()
        for members in groups.values():
            prompts = [d["prompt_ids"][i].tolist() for i in members]
            responses = [d["response_ids"][i].tolist() for i in members]
            mb = make_batch(prompts, responses, self.pad_id).to(self.device)
            values = response_values(self.model, mb)
            for k, i in enumerate(members):
                pos = mb.mask[k].nonzero().squeeze(1)
                v = values[k, pos].float().cpu()
                adv, ret = self.estimator.of_response(float(d["reward"][i]), v,
                                                      algo.gamma, algo.lam)
                out[int(d["slot"][i])] = {"prompt": prompts[k], "response": responses[k],
                                          "index": batch.rows[i].index, "lease": batch.lease,
                                          "values": v, "advantages": adv, "returns": ret,
                                          "loss_mask": (d["loss_mask"][i].tolist()
                                                        if "loss_mask" in d else None)}
            indices = [batch.rows[i].index for i in members]
            slots = [int(d["slot"][i]) for i in members]
            self.tq.write(indices, {
                "values": [out[s]["values"].numpy().astype(np.float32) for s in slots],
                "advantages": [out[s]["advantages"].numpy().astype(np.float32) for s in slots],
                "returns": [out[s]["returns"].numpy().astype(np.float32) for s in slots],
                "critic_version": [self.version] * len(members),
            }, lease=batch)
        return out

    def _learn(self, t: int, samples: list[dict]) -> None:
        """The value update over the step's samples (`fit_values`), checkpoint, ack."""
        algo = self.spec.algorithm
        t0 = time.time()
        loss_sum, clip_sum = fit_values(self.model, self.opt, samples, self.mb, self.pad_id,
                                        self.device, algo.value_clip, algo.max_grad_norm)
        self.version = t + 1
        self._checkpoint()
        by_lease: dict[str, list[int]] = defaultdict(list)
        for s in samples:
            by_lease[s["lease"]].append(s["index"])
        for lease, indices in by_lease.items():
            self._ack(self.unacked[lease][0], indices)
        record = {"step": t + 1, "value_loss": loss_sum, "value_clip": clip_sum,
                  "values_mean": float(torch.cat([s["values"] for s in samples]).mean()),
                  "seconds": time.time() - t0}
        self.history[self.version] = record
        log.info("critic: step %d value loss %.4f (clipped %.2f), version %d",
                 t + 1, loss_sum, clip_sum, self.version)

    def _ack(self, batch: Batch, indices: list[int]) -> None:
        self.tq.ack(batch, indices)
        _, left = self.unacked[batch.lease]
        left -= set(indices)
        if not left:
            del self.unacked[batch.lease]
            self.keeper.drop(batch)

    def _checkpoint(self) -> None:
        if self.run is None:
            return
        path = self.run.critic_checkpoint(self.version)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + PARTIAL)
        torch.save({"model": self.model.state_dict(), "optimizer": self.opt.state_dict(),
                    "version": self.version}, tmp)
        tmp.rename(path)
        for old in checkpoints_to_drop(self.run.critic_checkpoint_files(), self.version,
                                       self.run.checkpoint_steps()):
            old.unlink(missing_ok=True)


class _Stopped(Exception):
    pass
