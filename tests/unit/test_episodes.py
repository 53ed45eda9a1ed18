"""Episodes (rollout/episodes.py) with a scripted engine: a turn is cut at its
environment's stop text, the observation is appended with loss mask 0 and log-prob 0,
the next turn continues from the whole prefix; an environment that raises, answers
nonsense, fails to start or never ends an episode ends that episode only (with its
error, or at maxTurns), and the response never passes the budget."""

from __future__ import annotations

from rljob.environments import Calculator, Environment, Reply, SingleTurn
from rljob.inputs.models import CharTokenizer
from rljob.rollout.engine import Generation, RolloutEngine, SamplingParams
from rljob.rollout.episodes import episode_record, run_episodes

TOK = CharTokenizer()
EOS = TOK.eos_token_id


def enc(text: str) -> list[int]:
    return TOK.encode(text, add_special_tokens=False)


class Scripted(RolloutEngine):
    """Answers each call with the next text of a script (per row), as token ids."""

    def __init__(self, turns: list[str]):
        self.turns, self.calls, self.contexts = turns, 0, []

    def generate(self, prompts, params):
        text = self.turns[min(self.calls, len(self.turns) - 1)]
        self.calls += 1
        self.contexts.append([TOK.decode(p) for p in prompts])
        ids = (enc(text.removesuffix("<eos>")) + ([EOS] if text.endswith("<eos>") else []))
        ids = ids[:params.max_new_tokens]
        return [[Generation(list(ids), [-0.5] * len(ids)) for _ in range(params.n)]
                for _ in prompts]

    def load_weights(self, state_dict, version, epoch=0):
        pass


ROW = {"prompt": "2+3=", "answer": "5"}


def run(engine, env, n=2, max_turns=4, budget=64):
    return run_episodes(engine, TOK, [enc("2+3=")], [ROW], SamplingParams(n=n, seeds=(7,)),
                        env, max_turns, budget)


def test_a_calculator_episode_masks_the_observation():
    engine = Scripted(["<calc>2+3</calc>and more", "5<eos>"])
    [group] = run(engine, Calculator)
    assert len(group) == 2
    e = group[0]
    model1, obs, model2 = enc("<calc>2+3</calc>"), enc("<res>5</res>"), enc("5") + [EOS]
    assert e.response_ids == model1 + obs + model2
    assert e.loss_mask == [1] * len(model1) + [0] * len(obs) + [1] * len(model2)
    assert e.logprobs == [-0.5] * len(model1) + [0.0] * len(obs) + [-0.5] * len(model2)
    assert e.turns == ["<calc>2+3</calc>", "5"] and e.text == "5"
    assert episode_record(e) == {"turns": 2, "tool_calls": 1, "tool_errors": 0,
                                 "malformed_calls": 0, "tool_seconds": round(e.tool_seconds, 6), "error": "",
                                 "observation_tokens": len(obs), "env_reward": 0.0}
    # the second turn continued from the prompt, the model's call and the observation
    assert engine.contexts[1] == ["2+3=<calc>2+3</calc><res>5</res>"] * 2


def test_a_bad_call_is_an_error_observation_and_the_episode_goes_on():
    [group] = run(Scripted(["<calc>__import__('os')</calc>", "7<eos>"]), Calculator, budget=128)
    e = group[0]
    assert "<res>error: not arithmetic" in TOK.decode(e.response_ids)
    assert (e.tool_calls, e.tool_errors, e.error, e.text) == (1, 1, "", "7")


class Raises(Environment):
    def step(self, turn):
        raise RuntimeError("the environment broke")


class Nonsense(Environment):
    def step(self, turn):
        return "not a reply"


class NeverEnds(Environment):
    def step(self, turn):
        return Reply("<obs>more</obs>", done=False)


class WontStart(Environment):
    def __init__(self, row):
        raise KeyError("tests")

    def step(self, turn):
        return Reply()


def test_an_environment_that_raises_or_answers_nonsense_ends_its_episode_with_the_error():
    for env, error in ((Raises, "Raises.step: RuntimeError: the environment broke"),
                       (Nonsense, "Nonsense.step: TypeError: step returned str, not a Reply")):
        [group] = run(Scripted(["4"]), env)
        assert [e.error for e in group] == [error] * 2
        assert group[0].response_ids == enc("4") and group[0].loss_mask == [1]


def test_an_environment_that_never_ends_stops_at_max_turns_and_within_the_budget():
    [group] = run(Scripted(["abc"]), NeverEnds, max_turns=3, budget=64)
    e = group[0]
    assert len(e.turns) == 3 and e.done and e.tool_calls == 2
    assert TOK.decode(e.response_ids) == "abc<obs>more</obs>abc<obs>more</obs>abc"
    [group] = run(Scripted(["abcdefghij"]), NeverEnds, max_turns=10, budget=25)
    assert all(len(x.response_ids) <= 25 for x in group)
    assert len(group[0].response_ids) == len(group[0].loss_mask) == len(group[0].logprobs)


def test_an_environment_that_fails_to_start_takes_one_turn_with_its_error():
    [group] = run(Scripted(["9<eos>"]), WontStart)
    assert group[0].error.startswith("the environment failed to start: KeyError")
    assert len(group[0].turns) == 1


def test_single_turn_is_the_generation_itself():
    engine = Scripted(["12<eos>"])
    [group] = run(engine, SingleTurn)
    assert group[0].response_ids == enc("12") + [EOS] and group[0].loss_mask == [1, 1, 1]
    assert engine.calls == 1


def test_the_spec_takes_an_environment_on_either_engine():
    from rljob.api.spec import RLJobSpec

    base = {"model": {"path": "m"}, "dataset": {"path": "d.jsonl"}}
    spec = RLJobSpec.model_validate({**base, "rollout": {"environment": "calculator"}})
    assert spec.rollout.episodic and spec.rollout.max_turns == 4
    assert not RLJobSpec.model_validate(base).rollout.episodic
    on_vllm = RLJobSpec.model_validate({**base, "rollout": {"environment": "python",
                                                            "engine": "vllm"}})
    assert on_vllm.rollout.episodic


def test_the_engine_is_told_the_environments_stop_text():
    engine = Scripted(["<calc>1+1</calc>", "2<eos>"])
    engine.params = []
    generate = engine.generate
    engine.generate = lambda prompts, params: (engine.params.append(params),
                                               generate(prompts, params))[1]
    run(engine, Calculator)
    assert [p.stop for p in engine.params] == ["</calc>", "</calc>"]


class Rewarding(Environment):
    """Rewards each call with 0.25 and ends after two."""

    stop = "!"

    def step(self, turn):
        calls = getattr(self, "calls", 0) + 1
        self.calls = calls
        return Reply("ok", done=calls > 2, reward=0.25)


def test_an_environments_rewards_are_summed_over_the_episode():
    [group] = run(Scripted(["a!"]), Rewarding, max_turns=8)
    e = group[0]
    assert e.env_reward == 0.75 and episode_record(e)["env_reward"] == 0.75


# ---- the concurrent driver (vLLM): each episode a task, each turn a request ----

class Slow(Calculator):
    """The calculator, slow for the prompt's first episode's only."""

    def step(self, turn):
        import time

        if self.row.get("slow") and not getattr(Slow, "taken", False):
            Slow.taken = True
            time.sleep(0.5)
        return super().step(turn)


def test_concurrent_episodes_go_on_while_one_waits_for_its_tool():
    import asyncio
    import time
    from concurrent.futures import ThreadPoolExecutor

    from rljob.rollout.episodes import episode_group

    script = {1: "<calc>2+3</calc>tail", 2: "5<eos>"}
    calls = []  # (episode's seed, turn number, when), in the order made

    async def turn(prefix, room, seed, stop):
        assert stop == "</calc>"
        text = TOK.decode(prefix)
        k = text.count("<res>") + 1
        calls.append((seed, k, time.time()))  # the tool spans' clock
        await asyncio.sleep(0.01)
        ids = (enc(script[k].removesuffix("<eos>"))
               + ([EOS] if script[k].endswith("<eos>") else []))[:room]
        return Generation(ids, [-0.5] * len(ids))

    Slow.taken = False
    with ThreadPoolExecutor(4) as pool:
        group = asyncio.run(episode_group(turn, TOK, enc("2+3="), {**ROW, "slow": True}, 3, 11,
                                          Slow, 4, 64, pool))
    assert len(group) == 3 and all(e.done and not e.error for e in group)
    for e in group:
        model1, obs, model2 = enc("<calc>2+3</calc>"), enc("<res>5</res>"), enc("5") + [EOS]
        assert e.response_ids == model1 + obs + model2
        assert e.loss_mask == [1] * len(model1) + [0] * len(obs) + [1] * len(model2)
        assert e.text == "5" and e.tool_calls == 1 and len(e.tool_spans) == 1
    # each episode's turns have seeds of their own; two episodes finished their second
    # turn while the slow one's tool still ran
    seeds = [c[0] for c in calls]
    assert len(set(seeds)) == len(seeds) == 6
    slow_done = max(t1 for e in group for _, t1 in e.tool_spans)
    assert sum(1 for _, k, when in calls if k == 2 and when < slow_done) == 2


def test_a_replicas_series_count_its_episodes():
    from prometheus_client import generate_latest

    from rljob.infra.worker_metrics import WorkerMetrics

    m = WorkerMetrics("rollout-0", None)
    engine = Scripted(["<calc>2+3</calc>", "<calc>1/0</calc>", "5<eos>"])
    [group] = run(engine, Calculator, n=2, budget=128)
    m.count_episodes([episode_record(e) for e in group], [len(e.response_ids) for e in group])
    text = generate_latest(m.registry).decode()
    assert 'rljob_tool_calls_total{worker="rollout-0"} 4.0' in text
    assert 'rljob_tool_errors_total{worker="rollout-0"} 2.0' in text  # 1/0 twice
    assert 'rljob_episode_turns_count{worker="rollout-0"} 2.0' in text
    assert 'rljob_episode_turns_sum{worker="rollout-0"} 6.0' in text
    tokens = sum(len(e.response_ids) for e in group)
    assert f'rljob_episode_tokens_sum{{worker="rollout-0"}} {float(tokens)}' in text
    obs = sum(e.loss_mask.count(0) for e in group)
    assert f'rljob_observation_tokens_total{{worker="rollout-0"}} {float(obs)}' in text
