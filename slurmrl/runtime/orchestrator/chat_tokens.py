"""The tokens between two model turns of a conversation, from the model's chat template.

A multi-turn sample is one token sequence: the prompt (as the server rendered it), then each model
turn's tokens exactly as the engine sampled them, and between turns the tokens of what the chat
template writes around the environment's messages (the end of the assistant's turn the model did not
write itself, the environment's messages, the start of the next assistant turn). Only those are
tokenized here; the model's own tokens are never re-tokenized from text.

``between(convo, replies, tools, stop_text)``: render the conversation up to the assistant's last
message, and with the replies and the next generation prompt; the difference, after the text the
template closes an assistant turn with (less the model's own stop token, when it wrote it), is what
the environment adds. A template that rewrites earlier turns when later ones come (the rendering
with the replies does not start with the rendering without them) raises ``TemplateError``.
"""

from __future__ import annotations

SENTINEL = "\x00slurmrl-turn-end\x00"


class TemplateError(RuntimeError):
    """The chat template renders earlier turns differently once later ones follow."""


class ChatTokens:
    def __init__(self, tokenizer) -> None:
        self.tok = tokenizer
        self._turn_end: str | None = None

    def render(self, messages: list[dict], tools: list[dict] | None, generation_prompt: bool) -> str:
        return self.tok.apply_chat_template(messages, tools=tools, tokenize=False,
                                            add_generation_prompt=generation_prompt)

    def turn_end(self) -> str:
        """What the template writes after an assistant message's content (``<|im_end|>\\n``)."""
        if self._turn_end is None:
            text = self.render([{"role": "user", "content": "x"}, {"role": "assistant", "content": SENTINEL}],
                               None, False)
            self._turn_end = text.split(SENTINEL, 1)[1] if SENTINEL in text else ""
        return self._turn_end

    def between(self, convo: list[dict], replies: list[dict], tools: list[dict] | None, stop_text: str) -> list[int]:
        """Token ids from the end of the model's last turn (``convo`` ends with it; ``stop_text``: the text
        of the token it stopped on, "" when it stopped otherwise) to the start of its next turn."""
        head = self.render(convo, tools, False)
        full = self.render(convo + replies, tools, True)
        if not full.startswith(head):
            raise TemplateError("the chat template renders the earlier turns differently once the environment's "
                                "messages follow; token-exact multi-turn samples need a template that only appends")
        tail = self.turn_end()
        if stop_text and tail.startswith(stop_text):
            tail = tail[len(stop_text):]  # the model wrote the end of its turn itself: those tokens are its own
        head_end = len(head)
        return list(self.tok(tail + full[head_end:], add_special_tokens=False)["input_ids"])
