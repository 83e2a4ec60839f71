"""The project's chat template (``eval/tiny_chat_template.jinja``, docs/model.md §6.4), which both
tokenizers carry: the tiny model's BPE (``eval/tiny_model.py``) and Qwen3.6's own
(``eval/qwen_tokenizer.py``). Its own module so that neither builder imports the other for it."""

from __future__ import annotations

from pathlib import Path

CHAT_TEMPLATE_PATH = Path(__file__).resolve().parent / "tiny_chat_template.jinja"


def read_chat_template() -> str:
    return CHAT_TEMPLATE_PATH.read_text(encoding="utf-8")
