"""Prompt and completion token ids of a message list, as the server renders them.

One place for the rule every trace source shares (the scripted stand-in of ``standin.py`` and the
transcript importer of ``importer.py``): a call's prompt is the chat template's rendering of the
messages before it with the generation prompt; its completion is the template's rendering of the
reply as the last turn, after that generation prompt, up to and including the end-of-turn token
(where decoding stops). Tool-call arguments reach the template as SGLang hands them over
(``serving_chat.normalize_assistant_tool_call_arguments``): JSON text is parsed into a mapping,
and text that is not a JSON object is refused, as SGLang refuses it.
"""

from __future__ import annotations

import json


def template_messages(messages: list[dict]) -> list[dict]:
    """The messages as SGLang hands them to the template: tool-call arguments parsed from JSON
    text into mappings. ``ValueError`` when an argument text is not a JSON object."""
    out = []
    for message in messages:
        if message.get("tool_calls"):
            calls = [{**c, "function": {**c["function"], "arguments": as_mapping(c["function"].get("arguments"))}}
                     for c in message["tool_calls"]]
            message = {**message, "tool_calls": calls}
        out.append(message)
    return out


def as_mapping(arguments) -> dict:
    """Tool-call arguments as a mapping (SGLang's rule: JSON text must be an object)."""
    if not isinstance(arguments, str):
        return dict(arguments or {})
    try:
        parsed = json.loads(arguments)
    except ValueError:
        raise ValueError("tool call function.arguments must be valid JSON") from None
    if not isinstance(parsed, dict):
        raise ValueError("tool call function.arguments must be a JSON object")
    return parsed


class Renderer:
    """Prompt and completion token ids under the tokenizer's chat template."""

    def __init__(self, tokenizer, chat_template_kwargs: dict):
        self.tokenizer = tokenizer
        self.kwargs = dict(chat_template_kwargs)
        self.eos_id = tokenizer.convert_tokens_to_ids(tokenizer.eos_token)

    def text(self, messages: list[dict], tools: list | None, generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(template_messages(messages), tools=tools or None, tokenize=False,
                                                  add_generation_prompt=generation_prompt, **self.kwargs)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def prompt(self, messages: list[dict], tools: list | None) -> tuple[str, list[int]]:
        text = self.text(messages, tools, True)
        return text, self.encode(text)

    def completion(self, prompt_text: str, messages: list[dict], tools: list | None, reply: dict) -> list[int]:
        """What the model emits after the generation prompt: the template's rendering of ``reply``
        as the last turn, up to and including the end-of-turn token (where decoding stops)."""
        full = self.text(messages + [reply], tools, False)
        if not full.startswith(prompt_text):
            raise ValueError("the chat template does not render the reply after the generation prompt")
        tail = full[len(prompt_text):]
        end = tail.rindex(self.tokenizer.eos_token) + len(self.tokenizer.eos_token)
        return self.encode(tail[:end])
