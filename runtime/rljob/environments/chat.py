"""How an environment's reply joins an episode, as the model's chat template writes it.

A model with a chat template saw its prompt rendered as a user turn with the
assistant's generation prompt (inputs/data.render_prompt); its turn ends at its
end-of-turn token (the tokenizer's EOS: `<|im_end|>`, `<|eot_id|>`; or Llama 3.1's
`<|eom_id|>` after a `<|python_tag|>` call, inputs/models.turn_end_ids) or at the
environment's stop text. A reply then goes in as the template writes tool
messages: the assistant's turn closed (what the template puts after an assistant
message: `<|im_end|>\\n`, less the EOS the model wrote itself), one tool message
per content (`<|im_start|>tool\\n...<|im_end|>\\n`; Qwen2.5's template writes them
as one user turn of `<tool_response>` blocks) and the assistant's generation prompt
again. The pieces are read from the template by rendering a conversation with
markers, with the job's tools announced as its prompts announce them (pure but for
the template), once per number of messages. A tokenizer without a chat template
(the built-in character tokenizer) appends the reply's text as it is, and its EOS
ends the episode.
"""

from __future__ import annotations

from dataclasses import dataclass, field

USER, ASSISTANT, TOOL = "\u2063USER\u2063", "\u2063ASSISTANT\u2063", "\u2063TOOL\u2063"


def _tool_marker(i: int) -> str:
    return f"\u2063TOOL{i}\u2063"


class ChatTemplateError(ValueError):
    """The chat template cannot write a tool reply after an assistant turn."""


@dataclass(frozen=True)
class ChatTurns:
    close: str  # what ends an assistant message (the EOS text first, where it is)
    open: str  # what comes before a tool message's content
    after: str  # what follows it, through the assistant's generation prompt
    eos_text: str
    role: str = "tool"  # the role replies go in as ("user" where the template has no tool)
    tok: object = field(default=None, repr=False, compare=False)
    tools: list | None = field(default=None, repr=False, compare=False)
    _many: dict = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def of(cls, tok, tools: list[dict] | None = None) -> ChatTurns | None:
        """The pieces of `tok`'s chat template (`tools`: the function schemas the
        job's prompts announce); None without one. A template that renders neither
        a `tool` nor a `user` message after an assistant message as an extension
        of the conversation before is refused in one line."""
        if not getattr(tok, "chat_template", None):
            return None
        problems = []
        for role in ("tool", "user"):
            try:
                pieces, close = _render(tok, tools, role, 1)
            except _Refused as exc:
                problems.append(str(exc))
                continue
            eos_text = tok.decode([tok.eos_token_id]) if tok.eos_token_id is not None else ""
            return cls(close, pieces[0], pieces[1], eos_text, role, tok, tools)
        raise ChatTemplateError("the model's chat template cannot write an environment's "
                                "reply after the model's turn (" + "; ".join(problems)
                                + "): give the tokenizer a template that renders a tool "
                                "or user message after an assistant message")

    def pieces(self, k: int) -> list[str]:
        """The k + 1 texts around k tool messages' contents after an assistant
        turn, through the next generation prompt (a template may join consecutive
        tool messages: Qwen's writes them in one user turn)."""
        if k == 1:
            return [self.open, self.after]
        if k not in self._many:
            self._many[k] = _render(self.tok, self.tools, self.role, k)[0]
        return self._many[k]

    def observation(self, content: str | list[str], ended_at_eos: bool) -> str:
        """The text appended after a model turn: its close (less the EOS, when the
        model ended its turn with an end token of its own: the EOS, or `<|eom_id|>`
        in its place), the reply as tool messages (one per content), the next turn's
        opening."""
        contents = [content] if isinstance(content, str) else list(content)
        close = self.close
        if ended_at_eos and self.eos_text and close.startswith(self.eos_text):
            close = close[len(self.eos_text):]
        pieces = self.pieces(len(contents))
        return close + "".join(p + c for p, c in zip(pieces, contents)) + pieces[-1]


class _Refused(Exception):
    pass


def _render(tok, tools: list[dict] | None, role: str, k: int) -> tuple[list[str], str]:
    """The template's texts around k `role` messages after an assistant turn, and
    what closes that turn; _Refused where the template cannot extend the talk."""
    talk = [{"role": "user", "content": USER}, {"role": "assistant", "content": ASSISTANT}]
    markers = [_tool_marker(i) for i in range(k)]
    extra = {"tools": tools} if tools else {}
    try:
        base = tok.apply_chat_template(talk, tokenize=False, **extra)
        full = tok.apply_chat_template(talk + [{"role": role, "content": m} for m in markers],
                                       tokenize=False, add_generation_prompt=True, **extra)
    except Exception as exc:  # noqa: BLE001 - a template that refuses the role
        raise _Refused(f"a {role} message: {type(exc).__name__}: {exc}") from None
    close = base[base.rindex(ASSISTANT) + len(ASSISTANT):]
    # the talk up to the assistant's content must be what the model saw, and the
    # assistant's turn must close as it does when it is the last message
    head = base[:base.rindex(ASSISTANT) + len(ASSISTANT)]
    if not full.startswith(head + close) or any(m not in full[len(head):] for m in markers):
        raise _Refused(f"a {role} message rewrites the conversation before it")
    rest, pieces = full[len(head) + len(close):], []
    for m in markers:
        before, _, rest = rest.partition(m)
        pieces.append(before)
    return pieces + [rest], close


def observation_ids(tok, chat: ChatTurns | None, content: str | list[str],
                    ended_at_eos: bool) -> list[int]:
    """The tokens of a reply after a model turn: `content`, one tool message or a
    list of them (the template's pieces with a chat template, the text alone
    without: several contents on lines of their own)."""
    if chat is not None:
        text = chat.observation(content, ended_at_eos)
    else:
        text = content if isinstance(content, str) else "\n".join(content)
    return tok.encode(text, add_special_tokens=False)
