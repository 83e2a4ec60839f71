"""Which tokenizer cuts the search tool's snippets (``docs/eval.md`` §1.5).

BCP's search tool shows the first 512 *tokens* of a document under a tokenizer (Qwen3-0.6B's),
decoded back to text. A run cuts by tokens whenever a tokenizer can be loaded from a local path,
by default the served model's (its ``tokenizer_path`` or ``model_path`` from ``/server_info``):
there is no hub access here, so a name that is not a local directory is not a tokenizer. Without
one the snippet falls back to whitespace words, which is NOT the benchmark's unit; the manifest
says which (``retrieval.snippet_unit``: ``"tokens:<tokenizer>"`` or ``"words"``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

AUTO = "auto"
WORDS = "words"
QWEN = "qwen"  # Qwen3.5/3.6's own tokenizer, built offline (eval/qwen_tokenizer.py)


class TokenizerError(ValueError):
    """A tokenizer that was asked for by path and does not load; the message says why."""


def snippet_unit(tokenizer_name: str | None) -> str:
    """The manifest's ``snippet_unit``: ``tokens:<tokenizer>`` or ``words``."""
    return f"tokens:{tokenizer_name}" if tokenizer_name else WORDS


def served_tokenizer_path(server_args: dict) -> str | None:
    """The served model's tokenizer when it is a local directory (``tokenizer_path`` first)."""
    for key in ("tokenizer_path", "model_path"):
        path = server_args.get(key)
        if isinstance(path, str) and path and Path(path).is_dir():
            return path
    return None


def load_tokenizer(path: str) -> Any:
    """``transformers.AutoTokenizer`` from a local directory, never from the hub."""
    if not Path(path).is_dir():
        raise TokenizerError(f"snippet tokenizer {path}: not a local directory (no hub access here)")
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception as exc:  # transformers raises many types for a directory without a tokenizer
        raise TokenizerError(f"snippet tokenizer {path}: does not load ({type(exc).__name__}: {exc})") from None


def choose_tokenizer(choice: str, server_args: dict, warn: Callable[[str], None]) -> tuple[Any, str | None]:
    """(tokenizer, its name) for the snippets, or (None, None) for words.

    ``choice`` is ``auto`` (the served model's tokenizer if it loads, else words, with a warning),
    ``words``, ``qwen`` (Qwen3.6's own, as the synthetic traces use; ``eval/qwen_tokenizer.py``), or
    a local tokenizer directory (which must load: ``TokenizerError``)."""
    if choice == WORDS:
        return None, None
    if choice == QWEN:
        from eval import qwen_tokenizer

        path = str(qwen_tokenizer.cached(Path(__file__).resolve().parents[2] / ".artifacts"))
        return load_tokenizer(path), "qwen3.6"
    if choice != AUTO:
        return load_tokenizer(choice), choice
    path = served_tokenizer_path(server_args)
    if path is None:
        warn("no local tokenizer for the served model: snippets are cut by whitespace words, not "
             "tokens (give --snippet-tokenizer DIR)")
        return None, None
    try:
        return load_tokenizer(path), path
    except TokenizerError as exc:
        warn(f"{exc}; snippets are cut by words")
        return None, None
