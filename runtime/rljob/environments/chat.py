"""How an environment's reply joins an episode, as the model's chat template writes it.

A model with a chat template saw its prompt rendered as a user turn with the
assistant's generation prompt (inputs/data.render_prompt); its turn ends at its
end-of-turn token (the tokenizer's EOS: `<|im_end|>`, `<|eot_id|>`) or at the
environment's stop text. A reply then goes in as the template writes a tool
message: the assistant's turn closed (what the template puts after an assistant
message: `<|im_end|>\\n`, less the EOS the model wrote itself), the tool message
(`<|im_start|>tool\\n...<|im_end|>\\n`; Qwen2.5's template writes it as a user turn
with `<tool_response>` tags) and the assistant's generation prompt again. The
pieces are read once from the template by rendering a conversation with markers
(pure but for the template). A tokenizer without a chat template (the built-in
character tokenizer) appends the reply's text as it is, and its EOS ends the
episode.
"""

from __future__ import annotations

from dataclasses import dataclass

USER, ASSISTANT, TOOL = "\u2063USER\u2063", "\u2063ASSISTANT\u2063", "\u2063TOOL\u2063"


class ChatTemplateError(ValueError):
    """The chat template cannot write a tool reply after an assistant turn."""


@dataclass(frozen=True)
class ChatTurns:
    close: str  # what ends an assistant message (the EOS text first, where it is)
    open: str  # what comes before a tool message's content
    after: str  # what follows it, through the assistant's generation prompt
    eos_text: str

    @classmethod
    def of(cls, tok) -> ChatTurns | None:
        """The pieces of `tok`'s chat template; None without one. A template that
        renders neither a `tool` nor a `user` message after an assistant message
        as an extension of the conversation before is refused in one line."""
        if not getattr(tok, "chat_template", None):
            return None
        talk = [{"role": "user", "content": USER}, {"role": "assistant", "content": ASSISTANT}]
        problems = []
        for role in ("tool", "user"):
            try:
                base = tok.apply_chat_template(talk, tokenize=False)
                full = tok.apply_chat_template(talk + [{"role": role, "content": TOOL}],
                                               tokenize=False, add_generation_prompt=True)
            except Exception as exc:  # noqa: BLE001 - a template that refuses the role
                problems.append(f"a {role} message: {type(exc).__name__}: {exc}")
                continue
            if not full.startswith(base) or TOOL not in full[len(base):]:
                problems.append(f"a {role} message rewrites the conversation before it")
                continue
            opening, _, after = full[len(base):].partition(TOOL)
            close = base[base.rindex(ASSISTANT) + len(ASSISTANT):]
            eos_text = tok.decode([tok.eos_token_id]) if tok.eos_token_id is not None else ""
            return cls(close, opening, after, eos_text)
        raise ChatTemplateError("the model's chat template cannot write an environment's "
                                "reply after the model's turn (" + "; ".join(problems)
                                + "): give the tokenizer a template that renders a tool "
                                "or user message after an assistant message")

    def observation(self, content: str, ended_at_eos: bool) -> str:
        """The text appended after a model turn: its close (less the EOS the model
        wrote, when it did), the reply as a tool message, the next turn's opening."""
        close = self.close
        if ended_at_eos and self.eos_text and close.startswith(self.eos_text):
            close = close[len(self.eos_text):]
        return close + self.open + content + self.after


def observation_ids(tok, chat: ChatTurns | None, content: str, ended_at_eos: bool
                    ) -> list[int]:
    """The tokens of a reply `content` after a model turn (the template's pieces
    with a chat template, the text alone without)."""
    text = chat.observation(content, ended_at_eos) if chat is not None else content
    return tok.encode(text, add_special_tokens=False)
