"""The one-turn chat prompt every part of the project sends: media first, then the text."""

from __future__ import annotations

from typing import Any


def chat_prompt(templater: Any, text: str, media: str | None = None, chat_template: str | None = None) -> str:
    """The prompt string vLLM's generate() takes for one user turn with `media` ("video",
    "image" or None) before `text`. templater: a tokenizer or processor (apply_chat_template);
    chat_template: a template to use instead of the templater's own."""
    parts: list[dict[str, str]] = [{"type": media}] if media else []
    messages = [{"role": "user", "content": parts + [{"type": "text", "text": text}]}]
    kw = {"chat_template": chat_template} if chat_template else {}
    return templater.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kw)
