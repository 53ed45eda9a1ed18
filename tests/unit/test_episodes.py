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
                                 "tool_seconds": round(e.tool_seconds, 6), "error": "",
                                 "observation_tokens": len(obs)}
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


def test_the_spec_takes_an_environment_and_refuses_it_on_vllm():
    import pytest
    from pydantic import ValidationError

    from rljob.api.spec import RLJobSpec

    base = {"model": {"path": "m"}, "dataset": {"path": "d.jsonl"}}
    spec = RLJobSpec.model_validate({**base, "rollout": {"environment": "calculator"}})
    assert spec.rollout.episodic and spec.rollout.max_turns == 4
    assert not RLJobSpec.model_validate(base).rollout.episodic
    with pytest.raises(ValidationError, match="rollout.environment other than single_turn "
                       "runs with rollout.engine hf"):
        RLJobSpec.model_validate({**base, "rollout": {"environment": "calculator",
                                                      "engine": "vllm"}})
