"""Native tool calls (rollout.environment: tools): function schemas from a file's
functions and the built-ins, the parsers on each family's own call format
(malformed and several calls), the environment's answers in order, and
token-in/token-out: an episode's tokens equal what the zoo family's chat template
renders for the same conversation (Qwen2.5, Llama 3.1, Qwen3), on both episode
drivers (a batch engine's and a concurrent engine's)."""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from rljob.environments import ToolCalling, environment_factory
from rljob.environments.chat import ChatTurns
from rljob.rollout.engine import Generation, RolloutEngine, SamplingParams
from rljob.rollout.episodes import episode_group, episode_record, run_episodes
from rljob.tools.functions import from_function, resolve, schema_problems
from rljob.tools.parsers import TOOL_PARSERS, CallError, ToolCall
from tests import zoo

REPO = Path(__file__).resolve().parents[2]


def lookup(city: str, unit: str = "celsius") -> str:
    """The temperature of a city.

    Args:
        city: The city's name.
        unit: celsius or fahrenheit.
    """
    if city == "Nowhere":
        raise KeyError(city)
    return f"21 {unit}"


def test_a_functions_schema_comes_from_its_signature_and_docstring():
    tool = from_function(lookup)
    fn = tool.schema["function"]
    assert fn["name"] == "lookup" and fn["description"] == "The temperature of a city."
    assert fn["parameters"]["required"] == ["city"]
    assert fn["parameters"]["properties"]["unit"] == {"type": "string",
                                                      "description": "celsius or fahrenheit."}
    assert schema_problems(tool.schema) == []
    assert tool({"city": "Oslo"}).output == "21 celsius"
    # what the model gets wrong is an error message, never an exception
    assert tool({}).error == "lookup: missing argument 'city'"
    assert tool({"city": "Oslo", "when": "now"}).error == "lookup: no argument 'when'"
    assert tool({"city": "Nowhere"}).error == "KeyError: 'Nowhere'"


def test_the_builtins_are_function_tools_and_bad_schemas_are_named():
    calc, py = resolve(["calculator", "python"])
    assert calc({"expression": "(12 + 7) * 3"}).output == "57"
    assert calc({"expression": "import os"}).error
    assert calc.schema["function"]["parameters"]["required"] == ["expression"]
    assert py.name == "python"
    assert schema_problems({"type": "function", "function": {
        "name": "has space", "parameters": {"type": "object", "properties": {},
                                            "required": ["x"]}}}) == [
        "function.name 'has space' is not 1-64 letters, digits, _ or -",
        "function.parameters.required names 'x', not a property"]
    with pytest.raises(ValueError, match="two tools are named 'calculator'"):
        resolve(["calculator", "calculator"])
    with pytest.raises(ValueError, match="rollout.tools 'nope' is not available"):
        resolve(["nope"])


def test_hermes_reads_several_calls_and_names_the_malformed_one():
    parse = TOOL_PARSERS.get("hermes")().parse
    text = ('<think>two sums</think>\n<tool_call>\n{"name": "calculator", "arguments": '
            '{"expression": "3+4"}}\n</tool_call>\n<tool_call>\n{"name": "calculator", '
            '"arguments": "{\\"expression\\": \\"2*5\\"}"}\n</tool_call>\n'
            '<tool_call>{"name": "calculator", "arguments": {"expression": </tool_call>'
            '<tool_call>{"arguments": {}}</tool_call><tool_call>{"name": "python", "arguments": {"code"')
    calls = parse(text)
    assert calls[:2] == [ToolCall("calculator", {"expression": "3+4"}),
                         ToolCall("calculator", {"expression": "2*5"})]
    assert [type(c) for c in calls[2:]] == [CallError] * 3
    assert calls[2].message.startswith("tool call 3 is not JSON")
    assert calls[3].message.startswith('tool call 4 has no "name"')
    assert calls[4].message.startswith("tool call 5 is not JSON")  # cut off: no closing tag
    assert parse("The answer is 7.") == []


def test_llama3_json_reads_a_bare_object_and_several_separated_by_semicolons():
    parse = TOOL_PARSERS.get("llama3_json")().parse
    assert parse('{"name": "calculator", "parameters": {"expression": "3+4"}}') == [
        ToolCall("calculator", {"expression": "3+4"})]
    assert parse('<|python_tag|>{"name": "a", "parameters": {}}; {"name": "b", '
                 '"arguments": {"x": 1}}') == [ToolCall("a", {}), ToolCall("b", {"x": 1})]
    assert parse("It is 7.") == []
    [bad] = parse('{"name": "calculator", "parameters": {"expression": ')
    assert isinstance(bad, CallError) and bad.message.startswith("tool call 1 is not JSON")
    calls = parse('{"name": "a", "parameters": {}} and then some words')
    assert calls[0] == ToolCall("a", {}) and isinstance(calls[1], CallError)


def test_the_environment_answers_each_call_in_order():
    env_class = environment_factory("tools", resolve(["calculator"]), "hermes")
    assert issubclass(env_class, ToolCalling)
    env = env_class({"prompt": "p", "answer": "17"})
    turn = ('<tool_call>{"name": "calculator", "arguments": {"expression": "3+4"}}</tool_call>'
            '<tool_call>{"name": "weather", "arguments": {}}</tool_call>'
            '<tool_call>{"name": "calculator", "arguments": {"expression": "1/0"}}</tool_call>'
            '<tool_call>not json</tool_call>'
            '<tool_call>{"name": "calculator", "arguments": {"expression": "2*5"}}</tool_call>')
    reply = env.step(turn)
    assert not reply.done and reply.calls == 5 and reply.call_errors == 3
    assert reply.malformed == 1
    assert reply.messages[0] == "7" and reply.messages[4] == "10"
    assert reply.messages[1] == "error: no tool is named 'weather': call one of calculator"
    assert reply.messages[2] == "error: division by zero"
    assert reply.messages[3].startswith("error: tool call 4 is not JSON")
    assert env.step("It is 17.").done
    with pytest.raises(ValueError, match="list the tools the model may call"):
        environment_factory("tools", [], "hermes")
    with pytest.raises(ValueError, match="rollout.toolParser 'nope' is not available"):
        environment_factory("tools", resolve(["calculator"]), "nope")


# --- token-in/token-out on each family's template ------------------------------------

CALLS = [("calculator", {"expression": "3+4"}), ("calculator", {"expression": "2*5"})]


def _family(name: str):
    llama = name == "llama3"
    tok = zoo._tokenizer("bytefallback" if llama else "bytelevel", 400, zoo.TEMPLATES[name],
                         tuple(zoo.LLAMA_ADDED if llama else zoo.QWEN_ADDED))
    if llama:
        first = "; ".join(json.dumps({"name": n, "parameters": a}) for n, a in CALLS)
        parser = "llama3_json"
    else:
        first = "\n".join("<tool_call>\n" + json.dumps({"name": n, "arguments": a})
                          + "\n</tool_call>" for n, a in CALLS)
        parser = "hermes"
    last = "The sum is 17."
    if name == "qwen3":  # the think blocks of the episode's turns are kept (one user turn)
        first = "<think>\nTwo products first.\n</think>\n\n" + first
        last = "<think>\n7 + 10\n</think>\n\n" + last
    return tok, parser, [first, last]


class Scripted(RolloutEngine):
    """The batch engine's turns: the script's next text, as the model's ids."""

    def __init__(self, tok, turns):
        self.tok, self.turns, self.calls = tok, turns, 0

    def ids(self, k):
        return self.tok.encode(self.turns[k], add_special_tokens=False) + [self.tok.eos_token_id]

    def generate(self, prompts, params):
        ids = self.ids(min(self.calls, len(self.turns) - 1))
        self.calls += 1
        return [[Generation(ids, [-0.25] * len(ids)) for _ in range(params.n)] for _ in prompts]

    def load_weights(self, state_dict, version, epoch=0):
        pass


@pytest.mark.parametrize("family", zoo.MODELS)
@pytest.mark.parametrize("driver", ["batch", "concurrent"])
def test_an_episodes_tokens_are_the_templates_rendering_of_its_conversation(family, driver):
    from rljob.inputs.data import prompt_ids

    tok, parser, turns = _family(family)
    tools = resolve(["calculator"])
    schemas = [t.schema for t in tools]
    make_env = environment_factory("tools", tools, parser)
    prompt = prompt_ids(tok, "What is 3+4 plus 2*5?", schemas)
    engine = Scripted(tok, turns)
    if driver == "batch":
        [[e]] = run_episodes(engine, tok, [prompt], [{"prompt": "q", "answer": "17"}],
                             SamplingParams(n=1, seeds=(3,)), make_env, 4, 512)
    else:
        async def turn(prefix, room, seed, stop):
            k = sum(1 for t in prefix if t == tok.eos_token_id)  # the model's turns so far
            k -= prompt.count(tok.eos_token_id)
            ids = engine.ids(min(k, len(turns) - 1))[:room]
            return Generation(ids, [-0.25] * len(ids))

        with ThreadPoolExecutor(2) as pool:
            [e] = asyncio.run(episode_group(turn, tok, prompt, {"prompt": "q"}, 1, 3, make_env,
                                            4, 512, pool, ChatTurns.of(tok, schemas)))
    assert e.done and not e.error and e.tool_calls == 2 and e.tool_errors == 0

    # the conversation as the template writes it, through the model's last EOS
    talk = [{"role": "user", "content": "What is 3+4 plus 2*5?"},
            {"role": "assistant", "content": turns[0]},
            {"role": "tool", "content": "7"}, {"role": "tool", "content": "10"},
            {"role": "assistant", "content": turns[1]}]
    text = tok.apply_chat_template(talk, tools=schemas, tokenize=False)
    eos = tok.decode([tok.eos_token_id])
    text = text[:text.rindex(eos) + len(eos)]
    ids = e.prompt_ids + e.response_ids
    assert tok.decode(ids) == text
    assert ids == tok.encode(text, add_special_tokens=False)
    # the model's tokens are trained on, the template's between them never
    model = [t for t, m in zip(e.response_ids, e.loss_mask) if m]
    assert model == engine.ids(0) + engine.ids(1)
    assert tok.decode([t for t, m in zip(e.response_ids, e.loss_mask) if not m]).count(
        "7") >= 1
    assert episode_record(e)["malformed_calls"] == 0


def test_the_turn_end_tokens_are_the_eos_and_llama_3_1s_eom_where_the_tokenizer_has_it():
    from rljob.inputs.models import CharTokenizer, turn_end_ids

    llama, _, _ = _family("llama3")
    eom = llama.convert_tokens_to_ids("<|eom_id|>")
    assert turn_end_ids(llama) == (llama.eos_token_id, eom) and eom != llama.eos_token_id
    qwen, _, _ = _family("qwen2.5")
    assert turn_end_ids(qwen) == (qwen.eos_token_id,)
    assert turn_end_ids(CharTokenizer()) == (CharTokenizer().eos_token_id,)


@pytest.mark.parametrize("driver", ["batch", "concurrent"])
def test_a_llama_3_1_call_that_ends_its_turn_with_eom_gets_its_answer_as_ipython(driver):
    """Llama 3.1 ends a turn that calls a tool after `<|python_tag|>` with `<|eom_id|>`
    (not its EOS, `<|eot_id|>`): the turn ends there, the call is read without the end
    token, and the answer goes in as the template's ipython message right after the
    model's `<|eom_id|>` (no `<|eot_id|>` the model did not write); the model then
    answers and its EOS ends the episode."""
    from rljob.inputs.data import prompt_ids

    tok, parser, _ = _family("llama3")
    eom = tok.convert_tokens_to_ids("<|eom_id|>")
    call = "<|python_tag|>" + json.dumps({"name": "calculator",
                                          "parameters": {"expression": "3+4"}})
    turns = [tok.encode(call, add_special_tokens=False) + [eom],
             tok.encode("It is 7.", add_special_tokens=False) + [tok.eos_token_id]]
    tools = resolve(["calculator"])
    schemas = [t.schema for t in tools]
    make_env = environment_factory("tools", tools, parser)
    prompt = prompt_ids(tok, "What is 3+4?", schemas)

    class Turns(Scripted):
        def ids(self, k):
            return list(turns[k])

    engine = Turns(tok, turns)
    if driver == "batch":
        [[e]] = run_episodes(engine, tok, [prompt], [{"prompt": "q", "answer": "7"}],
                             SamplingParams(n=1, seeds=(3,)), make_env, 4, 512)
    else:
        async def turn(prefix, room, seed, stop):
            ids = turns[min(sum(1 for t in prefix if t == eom), 1)][:room]
            return Generation(ids, [-0.25] * len(ids))

        with ThreadPoolExecutor(2) as pool:
            [e] = asyncio.run(episode_group(turn, tok, prompt, {"prompt": "q"}, 1, 3, make_env,
                                            4, 512, pool, ChatTurns.of(tok, schemas)))
    assert e.done and not e.error, e.error
    assert e.tool_calls == 1 and e.tool_errors == 0 and e.malformed_calls == 0
    assert e.turns == [call, "It is 7."]  # the turns' text without their end tokens
    text = tok.decode(e.response_ids)
    assert text == (call + "<|eom_id|><|start_header_id|>ipython<|end_header_id|>\n\n7"
                    "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nIt is 7."
                    "<|eot_id|>"), text
    model = [t for t, m in zip(e.response_ids, e.loss_mask) if m]
    assert model == turns[0] + turns[1]  # the model's tokens, its eom included


def test_the_warm_up_teaches_a_demonstrated_native_episode_as_the_episode_samples_it():
    """A demonstration of native calls: the model's end token after each call turn is
    taught (the turn ends there; there is no stop text), the tool messages of one turn
    go in together as the template writes them, and the result equals an episode's
    tokens for the same conversation."""
    from types import SimpleNamespace

    from rljob.inputs.data import prompt_ids
    from rljob.trainer.warmup import target_ids

    tok, parser, turns = _family("qwen2.5")
    schemas = [t.schema for t in resolve(["calculator"])]
    shown = [{"role": "assistant", "content": turns[0]}, {"role": "tool", "content": "7"},
             {"role": "tool", "content": "10"}, {"role": "assistant", "content": turns[1]}]
    ids, mask = target_ids(tok, ChatTurns.of(tok, schemas),
                           SimpleNamespace(answer="17", extra={"demonstration": shown}),
                           eos_ends_turns=True)
    talk = [{"role": "user", "content": "q"}, *shown]
    text = tok.apply_chat_template(talk, tools=schemas, tokenize=False)
    prompt = prompt_ids(tok, "q", schemas)
    assert prompt + ids == tok.encode(text.removesuffix("\n"), add_special_tokens=False)
    eos = tok.eos_token_id
    taught = [t for t, m in zip(ids, mask) if m]
    assert taught == Scripted(tok, turns).ids(0) + Scripted(tok, turns).ids(1)
    assert [t for t, m in zip(ids, mask) if t == eos and m] == [eos, eos]


def test_validate_names_each_tools_mistake_in_one_line(tmp_path):
    """`rljob validate` on a tools job: an unknown tool, a parser that does not exist,
    tools on a single-turn job, a tokenizer with no template to announce them, and a
    prompt that with its announcement passes the model's context."""
    from rljob.preflight import check_text_here

    base = (REPO / "examples/agentic-tools.yaml").read_text()
    (tmp_path / "models").symlink_to(REPO / "examples/models")
    (tmp_path / "data").symlink_to(REPO / "examples/data")
    assert check_text_here(base, tmp_path) == []

    def problems(old, new):
        assert old in base
        return check_text_here(base.replace(old, new), tmp_path)

    assert problems("tools: [calculator]", "tools: [calculator, nope]") == [
        "rollout.tools 'nope' is not available here: use one of calculator, python, "
        "module:attribute or path/to/file.py:attribute"]
    assert problems("toolParser: hermes", "toolParser: hermez")[0].startswith(
        "rollout.toolParser 'hermez' is not available here")
    assert problems("environment: tools", "environment: single_turn") == [
        "rollout.tools: a single_turn job calls no tool: set rollout.environment to tools "
        "(or your environment)"]
    assert problems("path: random:models/tiny-chat",
                    "path: random:models/tiny-chat\n    tokenizer: builtin:char") == [
        "rollout.tools: the tokenizer has no chat template to announce the tools with: "
        "use a chat model's tokenizer (model.tokenizer)"]
    # the announcement is part of the prompt: the longest is 146 tokens of 256 positions;
    # the job's tools are resolved once for every check (an MCP server is asked once)
    import rljob.tools.catalog as catalog

    resolved = []
    real = catalog.job_tools
    catalog.job_tools = lambda rollout: resolved.append(rollout) or real(rollout)
    try:
        [long] = problems("maxNewTokens: 48", "maxNewTokens: 150")
    finally:
        catalog.job_tools = real
    assert len(resolved) == 1
    assert long.startswith("rollout.maxNewTokens: 150 new tokens after the longest prompt "
                           "(146 tokens) need 296 positions")


def test_the_shipped_chat_tokenizer_is_the_zoos(tmp_path):
    """examples/models/tiny-chat's tokenizer is what `python -m tests.zoo
    --chat-tokenizer DIR` makes (Qwen2.5's tool format; rebuilt the same way)."""
    zoo.chat_tokenizer(tmp_path)
    for name in ("tokenizer.json", "chat_template.jinja"):
        assert (tmp_path / name).read_text() == (
            REPO / "examples/models/tiny-chat" / name).read_text(), name
