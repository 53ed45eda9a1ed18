"""An environment's reply in a chat model's episode (environments/chat.py): it goes in as
the model's chat template writes a tool message after the assistant's turn, the
model's end-of-turn token ends its turn and not the episode, and a template that
cannot write a reply is refused in one line."""

from __future__ import annotations

import pytest

from rljob.environments import Calculator, Environment, Reply
from rljob.environments.chat import ChatTemplateError, ChatTurns
from rljob.rollout.engine import Generation, RolloutEngine, SamplingParams
from rljob.rollout.episodes import run_episodes
from tests.zoo import CHATML, _tokenizer

# Qwen2.5's way: a tool message is a user turn holding <tool_response> tags
QWEN25 = ("{% for m in messages %}{% if m['role'] == 'tool' %}<|im_start|>user\n"
          "<tool_response>\n{{ m['content'] }}\n</tool_response><|im_end|>\n{% else %}"
          "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endif %}{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def chatml():
    return _tokenizer("bytelevel", 400)


@pytest.fixture(scope="module")
def llama3():
    return _tokenizer("sentencepiece", 400)


def test_the_pieces_come_from_the_template(chatml, llama3):
    assert ChatTurns.of(chatml) == ChatTurns("<|im_end|>\n", "<|im_start|>tool\n",
                                             "<|im_end|>\n<|im_start|>assistant\n",
                                             "<|im_end|>")
    chatml.chat_template = QWEN25
    try:
        turns = ChatTurns.of(chatml)
    finally:
        chatml.chat_template = CHATML
    assert turns.observation("<res>5</res>", ended_at_eos=True) == (
        "\n<|im_start|>user\n<tool_response>\n<res>5</res>\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n")
    # a turn cut at the stop text (no end-of-turn token of its own) is closed first
    assert turns.observation("x", ended_at_eos=False).startswith("<|im_end|>\n<|im_start|>user")
    llama = ChatTurns.of(llama3)
    assert llama.observation("7", ended_at_eos=True) == (
        "<|start_header_id|>tool<|end_header_id|>\n\n7<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n")


def test_no_template_no_pieces_and_a_template_that_cannot_reply_is_refused(chatml):
    from rljob.inputs.models import CharTokenizer

    assert ChatTurns.of(CharTokenizer()) is None
    chatml.chat_template = ("{% for m in messages %}{% if m['role'] not in ['user', "
                            "'assistant'] %}{{ raise_exception('no such role') }}{% endif %}"
                            "{{ m['content'] }}{% endfor %}")
    try:
        ChatTurns.of(chatml)  # a user message after the assistant's: it can reply
        chatml.chat_template = ("{% for m in messages|reverse %}{{ m['content'] }}"
                                "{% endfor %}")  # rewrites what came before
        with pytest.raises(ChatTemplateError, match="cannot write an environment's reply"):
            ChatTurns.of(chatml)
    finally:
        chatml.chat_template = CHATML


class Script(RolloutEngine):
    def __init__(self, tok, turns):
        self.tok, self.turns, self.calls, self.contexts = tok, turns, 0, []

    def generate(self, prompts, params):
        ids = self.turns[min(self.calls, len(self.turns) - 1)][:params.max_new_tokens]
        self.calls += 1
        self.contexts.append([self.tok.decode(p) for p in prompts])
        return [[Generation(list(ids), [-0.5] * len(ids)) for _ in range(params.n)]
                for _ in prompts]

    def load_weights(self, state_dict, version, epoch=0):
        pass


def _episode(tok, turns, env, max_turns=4):
    prompt = tok.apply_chat_template([{"role": "user", "content": "2+3="}], tokenize=False,
                                     add_generation_prompt=True)
    engine = Script(tok, turns)
    [group] = run_episodes(engine, tok, [tok.encode(prompt, add_special_tokens=False)],
                           [{"prompt": "2+3=", "answer": "5"}],
                           SamplingParams(n=1, seeds=(3,)), env, max_turns, 128)
    return group[0], engine, prompt


def test_a_call_cut_at_its_stop_is_closed_and_answered_as_a_tool_message(chatml):
    tok = chatml

    def enc(text):
        return tok.encode(text, add_special_tokens=False)

    call = enc("<calc>2+3</calc>")  # the turn ends at the stop text
    answer = enc("5") + [tok.eos_token_id]
    e, engine, prompt = _episode(tok, [call, answer], Calculator)
    obs = enc("<|im_end|>\n<|im_start|>tool\n<res>5</res><|im_end|>\n<|im_start|>assistant\n")
    assert e.response_ids == call + obs + answer
    assert e.loss_mask == [1] * len(call) + [0] * len(obs) + [1] * len(answer)
    assert e.turns == ["<calc>2+3</calc>", "5"] and e.text == "5" and e.tool_calls == 1
    # the second turn read the first, the reply as a tool message, and its own cue
    assert engine.contexts[1] == [
        prompt + "<calc>2+3</calc><|im_end|>\n<|im_start|>tool\n<res>5</res><|im_end|>\n"
        "<|im_start|>assistant\n"]
    assert e.done and len(e.turns) == 2  # a turn without a call ended the episode


class Answers(Environment):
    """Replies to every turn (no stop text: the model's turns end at its EOS)."""

    def step(self, turn):
        return Reply("ok", done=False)


def test_a_chat_models_end_of_turn_token_ends_its_turn_not_the_episode(chatml):
    tok = chatml
    eos = tok.eos_token_id
    turn = tok.encode("hi", add_special_tokens=False) + [eos]
    e, _, _ = _episode(tok, [turn], Answers, max_turns=3)
    obs = tok.encode("\n<|im_start|>tool\nok<|im_end|>\n<|im_start|>assistant\n",
                     add_special_tokens=False)
    assert len(e.turns) == 3 and e.tool_calls == 2
    assert e.response_ids == turn + obs + turn + obs + turn
    assert e.loss_mask == ([1] * len(turn) + [0] * len(obs)) * 2 + [1] * len(turn)
    # without a chat template the EOS ends the episode (the built-in tokenizer)
    from rljob.inputs.models import CharTokenizer

    char = CharTokenizer()
    engine = Script(char, [char.encode("hi", add_special_tokens=False) + [char.eos_token_id]])
    [group] = run_episodes(engine, char, [char.encode("2+3=")], [{"prompt": "2+3="}],
                           SamplingParams(n=1, seeds=(3,)), Answers, 3, 64)
    assert len(group[0].turns) == 1 and engine.calls == 1


def test_a_demonstrated_episode_teaches_the_assistants_tokens_only(chatml):
    """The warm-up's `demonstration` as messages: joined as an episode joins its turns
    (the tool message as the template writes it), the tool's tokens masked out; a
    text demonstration teaches every token, as before."""
    from types import SimpleNamespace

    from rljob.inputs.models import CharTokenizer
    from rljob.trainer.warmup import target_ids

    shown = [{"role": "assistant", "content": "<calc>2+3</calc>"},
             {"role": "tool", "content": "<res>5</res>"},
             {"role": "assistant", "content": "5"}]
    row = SimpleNamespace(answer="5", extra={"demonstration": shown})
    tok = chatml
    ids, mask = target_ids(tok, ChatTurns.of(tok), row)

    def enc(text):
        return tok.encode(text, add_special_tokens=False)

    call, answer = enc("<calc>2+3</calc>"), enc("5") + [tok.eos_token_id]
    obs = enc("<|im_end|>\n<|im_start|>tool\n<res>5</res><|im_end|>\n<|im_start|>assistant\n")
    assert ids == call + obs + answer
    assert mask == [1] * len(call) + [0] * len(obs) + [1] * len(answer)
    char = CharTokenizer()  # no template: the reply's text as it is
    ids, mask = target_ids(char, None, row)
    assert char.decode(ids) == "<calc>2+3</calc><res>5</res>5"
    assert mask.count(0) == len("<res>5</res>")
    text = SimpleNamespace(answer="5", extra={"demonstration": "<calc>2+3</calc><res>5</res>5"})
    ids, mask = target_ids(char, None, text)
    assert mask is None and ids[-1] == char.eos_token_id
