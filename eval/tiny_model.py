"""Build a tiny random-weight Qwen3.5/Qwen3.6-architecture hybrid model that SGLang 0.5.16 can serve.

Usage::

    python scripts/make_tiny_model.py OUT_DIR [--seed N] [--max-positions N] [--vocab-size N] [--no-check]

The build is offline (``HF_HUB_OFFLINE=1``; it reads nothing but the Python stdlib sources and
``eval/tiny_chat_template.jinja``) and deterministic: the same seed gives the same bytes in every file.
It takes a few seconds on 2 CPU cores. ``build(out_dir, seed)`` is the importable entry point;
``build_tokenizer(out_dir)`` writes only the tokenizer files (enough for chat-template tests).
``cached_build(artifacts, ...)`` builds once per builder content and options (the demo and tests).

What is written to OUT_DIR: ``config.json``, ``generation_config.json``, ``model.safetensors`` (bfloat16),
``tokenizer.json``, ``tokenizer_config.json``, ``chat_template.jinja``.

Why each choice was made
------------------------
Architecture (see docs/model.md §1, §6.1).
    Every structural feature of Qwen3.6-27B is kept, only smaller: 8 layers ``l,l,l,f,l,l,l,f`` (three
    Gated-DeltaNet layers, then one gated full-attention layer, as in the real 3:1 pattern), so there are two
    full-attention layers and two groups of GDN layers; GQA (4 query heads, 2 KV heads); gated attention
    (``q_proj`` emits query + sigmoid gate per head); q/k RMSNorm; partial NeoX RoPE (rotary dim
    32 * 0.25 = 8) with ``rope_theta`` 1e7; untied ``lm_head``; zero-centred (1 + w) RMSNorms; a dense SwiGLU
    MLP in every layer. GDN: 2 key heads and 4 value heads (grouped value attention; SGLang's kernels accept
    a value/key ratio of 1, 2 or 4, so the real 3 is not possible here), head dims 16, conv kernel 4.
    ``vocab_size`` 512 >= the 480-token tokenizer (the rest are unused rows, like the padded real vocab).
    ``max_position_embeddings`` 8192 leaves room for long-context tests.

Variants (``--max-positions N``, ``--vocab-size N``; the defaults give exactly the files above).
    ``--max-positions`` sets ``max_position_embeddings`` (and the tokenizer's ``model_max_length``):
    SGLang refuses a ``--context-length`` beyond it, and sizes the rotary cos/sin table by it (SCR's
    re-rotation needs the table to cover the context length, ``patches/rope.py``).
    ``LONG_CONTEXT_POSITIONS`` (131,072) is the long-context variant: ``cached_build(artifacts,
    max_positions=LONG_CONTEXT_POSITIONS)``. ``--vocab-size`` (at least the tokenizer's 480) sizes
    the embedding and ``lm_head``, so token ids of a real tokenizer (151,936 or 248,320 for
    Qwen3.5/3.6) can be replayed from a recorded trace; the extra rows are drawn like the others.
    The tokenizer itself is unchanged (the model's ids beyond 480 decode to nothing).

Checkpoint form (docs/cpu.md §4 B1).
    SGLang 0.5.16 registers only ``Qwen3_5ForConditionalGeneration`` for Qwen3.5 (its ``Qwen3_5ForCausalLM``
    is a backbone without ``lm_head``), so the model is saved in that form, like the real checkpoints:
    ``model_type`` ``qwen3_5``, a ``text_config`` and a minimal ``vision_config`` (1 block, width 32,
    2 heads, 16 position embeddings, ``deepstack_visual_indexes: []`` so SGLang builds no deepstack mergers).
    transformers 5.12.1 saves the weights as ``model.language_model.*``, ``model.visual.*`` and
    ``lm_head.weight``; SGLang's ``Qwen3_5ForConditionalGeneration.load_weights`` maps
    ``model.language_model.`` to ``model.``, fuses ``in_proj_qkv``+``in_proj_z`` into ``in_proj_qkvz``,
    ``in_proj_b``+``in_proj_a`` into ``in_proj_ba``, q/k/v into ``qkv_proj``, gate/up into ``gate_up_proj``,
    and maps the vision tower ``model.visual.*`` to ``visual.*`` (``attn.qkv`` -> ``attn.qkv_proj``).
    Serve it text-only (``enable_multimodal=False``): there is no image processor config.

config.json edits (read by SGLang, ignored by transformers; docs/cpu.md §2).
    ``text_config.full_attention_interval = 4``: SGLang derives the layer pattern from it and ignores
    ``layer_types``; without it SGLang 0.5.16 fails with ``AttributeError: 'Qwen3_5TextConfig' object has no
    attribute 'full_attention_interval'`` (checked). ``rope_theta = 1e7`` in ``text_config`` and at top
    level: SGLang 0.5.16 reads the value from ``rope_parameters`` (checked: 1e7 even without the edit), but
    code paths that look for a plain ``rope_theta`` fall back to 10000, which the project's CPU study hit.
    ``attn_output_gate = true``, ``output_gate_type = "swish"`` and ``mamba_ssm_dtype = "float32"`` state
    explicitly what SGLang would otherwise take from code defaults, with the real Qwen3.6 values.
    No ``mrope_section``: text-only input makes MRoPE equal plain 1-D RoPE, and without it SGLang uses its
    plain rotary embedding.
    Checked by loading the saved model through SGLang 0.5.16's own ``get_model`` on CPU: every tensor
    (fused ``in_proj_qkvz``/``in_proj_ba``/``qkv_proj``/``gate_up_proj``, conv, ``A_log``, norms, vision
    tower) arrives equal to the checkpoint, with no "not found in params_dict" warning.

Weights.
    The default init (std 0.02 linears, RMSNorm weights exactly 0, GDN norm 1, ``dt_bias`` 1,
    ``A_log = log U(0, 16)``) is too weak for cache/state tests: the residual stream is almost the current
    token's embedding, so greedy decoding quickly falls into a short loop and the output hardly depends on
    earlier tokens; the GDN state decays within a few tokens, so chunk-boundary or state-restore bugs could
    hide (docs/model.md §6.1). So every parameter is redrawn:
    * matrices and conv kernels: N(0, 1/fan_in), so every sub-layer really mixes the context; the three
      matrices that write into the residual stream (``o_proj``, ``out_proj``, ``down_proj``) get the
      GPT-2-style extra factor 1/sqrt(2 * layers) = 0.25. With gain 1 there instead, the model is chaotic:
      bf16 and fp32 logits differed by ~5 % of their std and greedy bf16 vs fp32 diverged after one token on a
      388-token prompt; with 0.25 the difference is ~1 % and 32 greedy tokens agree (seed 0).
    * embeddings N(0, 1); ``lm_head`` N(0, LOGIT_STD^2 / hidden), i.e. logits with std ~4 (mean top-1
      probability ~0.4 at temperature 1: neither uniform nor one-hot).
    * 1-D parameters (norm weights, ``dt_bias``, vision biases): their default plus N(0, 0.1^2) noise, so no
      norm is an exact identity. Exception: ``q_norm``/``k_norm`` weights (applied as 1 + w) are centred on
      w = 1, i.e. q and k are doubled and attention scores have std ~4 instead of ~1, so a head focuses on a
      few positions (as trained models do) instead of averaging the whole prefix. This makes far context
      matter: replacing a 288-token prefix changes the logits of tokens 16-100 positions later by 12-14 % of
      their std (25 % argmax flips), against 3-4 % (0-8 %) with w ~ 0, while bf16 noise stays ~1 %.
    * ``A_log = log U(0.01, 1)``: the GDN state keeps a long memory (decay per token
      exp(-A * softplus(a + dt_bias)) with A <= 1 instead of up to 16).
    Each parameter is drawn from its own ``torch.Generator`` seeded from sha256(seed, parameter name), so the
    weights depend on neither transformers' init order nor its RNG use (``torch.manual_seed(seed)`` is still
    set, and ``torch.use_deterministic_algorithms(True)`` while initialising). The model is saved in bfloat16
    with ``safe_serialization=True``, like the real checkpoint (``A_log`` and ``dt_bias`` included).
    ``generation_config.json`` has only eos ``[<|im_end|>, <|endoftext|>]`` and pad, no sampling defaults
    (SGLang would otherwise apply them to requests that do not set temperature).

Tokenizer (docs/model.md §6.3).
    Byte-level BPE trained with ``tokenizers`` on a fixed, sorted list of 40 Python stdlib sources (picked
    by name relative to ``sysconfig.get_paths()["stdlib"]``, read as UTF-8, fed in that order), with the
    real Qwen pipeline: NFC normalizer, the Qwen ``Split`` regex (isolated) followed by
    ``ByteLevel(add_prefix_space=False, use_regex=False)``, and a ``ByteLevel`` decoder. 471 BPE tokens
    (256 bytes + 215 merges) plus 9 added tokens = 480; the added tokens come last, as in the real
    tokenizer: ``<|endoftext|>`` (pad), ``<|im_start|>``, ``<|im_end|>`` (eos) are special;
    ``<think>``, ``</think>``, ``<tool_call>``, ``</tool_call>``, ``<tool_response>``, ``</tool_response>``
    are added but not special, as in Qwen, so ``skip_special_tokens`` keeps them in decoded text for
    reasoning/tool parsers. The trainer output was checked to be byte-identical across processes, also with
    ``RAYON_NUM_THREADS=8``; the script still sets ``RAYON_NUM_THREADS=1`` (if unset, and before
    ``tokenizers`` is imported) as a second line of defence. Caveat: the
    corpus is the running Python's stdlib, so another Python version gives a different (still
    deterministic) tokenizer; the corpus sha256 is printed by ``main``.

Chat template (docs/model.md §6.4): ``eval/tiny_chat_template.jinja``, written from the Qwen3.6 rules
    (reasoning of assistant turns at or before the last real user query is dropped unless
    ``preserve_thinking``; tool calls in the XML form; tool results in a ``user`` turn). It is copied
    verbatim into the tokenizer so that it can be reviewed as its own file.
"""

from __future__ import annotations

import os

# Must be set before `tokenizers` (or transformers, which imports it) starts its thread pool.
if not os.environ.get("RAYON_NUM_THREADS"):
    os.environ["RAYON_NUM_THREADS"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import argparse
import hashlib
import json
import math
import sys
import sysconfig
from pathlib import Path

from eval.chat_template import CHAT_TEMPLATE_PATH, read_chat_template

# Relative to sysconfig.get_paths()["stdlib"]; all exist in CPython 3.9-3.13. Sorted; fed in this order.
CORPUS_FILES = (
    "abc.py", "argparse.py", "ast.py", "base64.py", "bisect.py", "calendar.py", "codecs.py",
    "colorsys.py", "contextlib.py", "copy.py", "csv.py", "dataclasses.py", "difflib.py", "enum.py",
    "fnmatch.py", "fractions.py", "functools.py", "getopt.py", "gettext.py", "glob.py", "heapq.py",
    "hmac.py", "json/__init__.py", "json/decoder.py", "json/encoder.py", "keyword.py", "linecache.py",
    "numbers.py", "operator.py", "pprint.py", "queue.py", "random.py", "shlex.py", "string.py",
    "textwrap.py", "tokenize.py", "types.py", "warnings.py", "weakref.py", "zipapp.py",
)

# The Qwen3.5 pre-tokenizer regex (docs/model.md §6.3).
PRETOKENIZE_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

BPE_VOCAB_SIZE = 471  # 256 byte symbols + 215 merges; + 9 added tokens = 480
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
MARKUP_TOKENS = (
    "<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
)
EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"

VOCAB_SIZE = 512
TOKENIZER_SIZE = BPE_VOCAB_SIZE + len(SPECIAL_TOKENS) + len(MARKUP_TOKENS)  # 480
MAX_POSITIONS = 8192
LONG_CONTEXT_POSITIONS = 131072
HIDDEN = 64
ROPE_THETA = 1e7
FULL_ATTENTION_INTERVAL = 4
NUM_LAYERS = 8
LOGIT_STD = 4.0  # std of the logits at init (lm_head std = LOGIT_STD / sqrt(HIDDEN))
ONE_D_NOISE_STD = 0.1
A_RANGE = (0.01, 1.0)
# Matrices that write into the residual stream get N(0, (RESIDUAL_OUT_GAIN^2) / fan_in) (GPT-2 style 1/sqrt(2L)).
RESIDUAL_OUT_PROJ = ("self_attn.o_proj.weight", "linear_attn.out_proj.weight", "mlp.down_proj.weight")
RESIDUAL_OUT_GAIN = 1.0 / math.sqrt(2 * NUM_LAYERS)
# q_norm / k_norm are (1 + w) norms: w ~ 1 doubles q and k, so attention scores have std ~4 instead of ~1.
QK_NORM_WEIGHT = 1.0


QWEN_VOCAB_SIZE = 248_320  # Qwen3.6-27B's padded vocabulary
TOKENIZERS = ("tiny", "qwen")  # the 480-token BPE of this module; Qwen3.5/3.6's own (eval/qwen_tokenizer.py)
QWEN_TOKENIZER_SIZE = 248_077  # 248,044 base ids + 33 special tokens


def check_options(vocab_size: int, max_positions: int, tokenizer: str = "tiny") -> None:
    """ValueError naming the option when a variant cannot be built or served."""
    if tokenizer not in TOKENIZERS:
        raise ValueError(f"tokenizer {tokenizer!r}: one of {', '.join(TOKENIZERS)}")
    size = QWEN_TOKENIZER_SIZE if tokenizer == "qwen" else TOKENIZER_SIZE
    if not isinstance(vocab_size, int) or vocab_size < size:
        raise ValueError(f"vocab_size {vocab_size!r} is smaller than the tokenizer's {size} tokens ({tokenizer})")
    if not isinstance(max_positions, int) or max_positions < 1:
        raise ValueError(f"max_positions {max_positions!r} must be a positive integer")


def text_config_kwargs(eos_token_id: int, pad_token_id: int, vocab_size: int = VOCAB_SIZE,
                       max_positions: int = MAX_POSITIONS) -> dict:
    return dict(
        vocab_size=vocab_size,
        hidden_size=HIDDEN,
        intermediate_size=128,
        num_hidden_layers=NUM_LAYERS,
        layer_types=[
            "full_attention" if (i + 1) % FULL_ATTENTION_INTERVAL == 0 else "linear_attention"
            for i in range(NUM_LAYERS)
        ],
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_conv_kernel_dim=4,
        max_position_embeddings=max_positions,
        rms_norm_eps=1e-6,
        hidden_act="silu",
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA, "partial_rotary_factor": 0.25},
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        bos_token_id=None,
    )


VISION_CONFIG = dict(
    depth=1,
    hidden_size=32,
    intermediate_size=64,
    num_heads=2,
    out_hidden_size=HIDDEN,
    patch_size=16,
    temporal_patch_size=2,
    spatial_merge_size=2,
    num_position_embeddings=16,  # a 4 x 4 grid (SGLang takes its square root)
    deepstack_visual_indexes=[],
)

# Written into config.json after save_pretrained (SGLang reads them; transformers does not need them).
SGLANG_TEXT_CONFIG_EDITS = {
    "full_attention_interval": FULL_ATTENTION_INTERVAL,
    "rope_theta": ROPE_THETA,
    "attn_output_gate": True,
    "output_gate_type": "swish",
    "mamba_ssm_dtype": "float32",
}
SGLANG_TOP_LEVEL_EDITS = {"rope_theta": ROPE_THETA}


def corpus_paths() -> list[Path]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return [stdlib / name for name in sorted(CORPUS_FILES)]


def corpus_texts() -> list[str]:
    texts = []
    for path in corpus_paths():
        if not path.is_file():
            raise FileNotFoundError(f"tokenizer corpus file missing from this Python's stdlib: {path}")
        texts.append(path.read_text(encoding="utf-8"))
    return texts


def corpus_sha256() -> str:
    h = hashlib.sha256()
    for name, text in zip(sorted(CORPUS_FILES), corpus_texts()):
        h.update(name.encode() + b"\0" + text.encode("utf-8") + b"\0")
    return h.hexdigest()


def _train_tokenizer():
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=BPE_VOCAB_SIZE,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator(corpus_texts(), trainer=trainer)
    if tok.get_vocab_size() != BPE_VOCAB_SIZE:
        raise RuntimeError(f"BPE trainer produced {tok.get_vocab_size()} tokens, expected {BPE_VOCAB_SIZE}")
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in MARKUP_TOKENS])
    return tok


def build_tokenizer(out_dir: str | Path, model_max_length: int = MAX_POSITIONS):
    """Train the tokenizer, attach the chat template and save it into out_dir. Returns the
    ``PreTrainedTokenizerFast``."""
    from transformers import PreTrainedTokenizerFast

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=_train_tokenizer(),
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        chat_template=read_chat_template(),
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
    )
    tokenizer.save_pretrained(str(out))
    return tokenizer


def _generator(seed: int, name: str):
    import torch

    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    g = torch.Generator(device="cpu")
    g.manual_seed(int.from_bytes(digest[:8], "little") & ((1 << 63) - 1))
    return g


def _init_weights(model, seed: int) -> None:
    import torch

    with torch.no_grad():
        for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            g = _generator(seed, name)

            def normal(std: float, mean: float = 0.0):
                return torch.empty(p.shape, dtype=torch.float32).normal_(mean, std, generator=g)

            if name.endswith("linear_attn.A_log"):
                lo, hi = A_RANGE
                a = torch.empty(p.shape, dtype=torch.float32).uniform_(lo, hi, generator=g)
                p.copy_(torch.log(a))
            elif name.endswith(("self_attn.q_norm.weight", "self_attn.k_norm.weight")):
                p.copy_(normal(ONE_D_NOISE_STD, mean=QK_NORM_WEIGHT))
            elif p.ndim == 1:
                p.add_(normal(ONE_D_NOISE_STD))  # around the default (0 for 1+w norms, 1 for dt_bias, ...)
            elif name.endswith(("embed_tokens.weight", "pos_embed.weight")):
                p.copy_(normal(1.0))
            elif name == "lm_head.weight":
                p.copy_(normal(LOGIT_STD / math.sqrt(p.shape[1])))
            else:
                gain = RESIDUAL_OUT_GAIN if name.endswith(RESIDUAL_OUT_PROJ) else 1.0
                p.copy_(normal(gain / math.sqrt(math.prod(p.shape[1:]))))


def _patch_config_json(path: Path) -> None:
    cfg = json.loads(path.read_text(encoding="utf-8"))
    cfg["text_config"].update(SGLANG_TEXT_CONFIG_EDITS)
    cfg.update(SGLANG_TOP_LEVEL_EDITS)
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def build(out_dir: str | Path, seed: int = 0, *, vocab_size: int = VOCAB_SIZE,
          max_positions: int = MAX_POSITIONS, tokenizer: str = "tiny") -> Path:
    """Build tokenizer + chat template + random bf16 model into out_dir (created if needed). Returns the path.
    ``tokenizer="qwen"``: Qwen3.5/3.6's own tokenizer (``eval/qwen_tokenizer.py``); ``vocab_size``
    must then cover its 248,077 ids (Qwen3.6-27B pads to 248,320)."""
    import torch
    from transformers import GenerationConfig, Qwen3_5Config, Qwen3_5ForConditionalGeneration

    check_options(vocab_size, max_positions, tokenizer)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if tokenizer == "qwen":
        from eval import qwen_tokenizer

        tokenizer = qwen_tokenizer.build(out, model_max_length=max_positions)
    else:
        tokenizer = build_tokenizer(out, model_max_length=max_positions)
    eos_id = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    pad_id = tokenizer.convert_tokens_to_ids(PAD_TOKEN)
    if len(tokenizer) > vocab_size:
        raise RuntimeError(f"tokenizer has {len(tokenizer)} tokens > vocab_size {vocab_size}")

    config = Qwen3_5Config(
        text_config=text_config_kwargs(eos_token_id=eos_id, pad_token_id=pad_id, vocab_size=vocab_size,
                                       max_positions=max_positions),
        vision_config=dict(VISION_CONFIG),
        tie_word_embeddings=False,
    )
    deterministic_before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        torch.manual_seed(seed)
        model = Qwen3_5ForConditionalGeneration(config).eval()
        _init_weights(model, seed)
    finally:
        torch.use_deterministic_algorithms(deterministic_before)
    model.generation_config = GenerationConfig(
        eos_token_id=[eos_id, pad_id], pad_token_id=pad_id, bos_token_id=None
    )
    model = model.to(torch.bfloat16)
    model.save_pretrained(str(out), safe_serialization=True)
    _patch_config_json(out / "config.json")
    os.chmod(out / "model.safetensors", 0o644)  # save_pretrained leaves it 0600, unlike the other files
    return out


def greedy_tokens(model, prompt_ids: list[int], n: int) -> list[int]:
    """Greedy decoding by full recomputation (no cache), so it does not depend on HF cache code paths."""
    import torch

    ids = list(prompt_ids)
    out = []
    with torch.no_grad():
        for _ in range(n):
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1].float()
            nxt = int(torch.argmax(logits))
            out.append(nxt)
            ids.append(nxt)
    return out


def sanity_check(out_dir: str | Path, n_tokens: int = 24) -> dict:
    """Reload in fp32 with transformers, check round-trip tokenization, finite logits, and that greedy decoding
    from a chat prompt does not collapse. Raises RuntimeError on failure; returns some numbers."""
    import torch
    from transformers import AutoTokenizer, Qwen3_5ForConditionalGeneration

    out = Path(out_dir)
    tok = AutoTokenizer.from_pretrained(str(out), local_files_only=True)
    model = Qwen3_5ForConditionalGeneration.from_pretrained(
        str(out), dtype=torch.float32, local_files_only=True
    ).eval()
    messages = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Write a Python function that returns the sum of a list."},
    ]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    if tok.decode(ids) != text:
        raise RuntimeError("decode(encode(text)) does not round-trip")
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0].float()
    if not bool(torch.isfinite(logits).all()):
        raise RuntimeError("non-finite logits")
    gen = greedy_tokens(model, ids, n_tokens)
    distinct = len(set(gen))
    if distinct < 6:
        raise RuntimeError(f"greedy decoding collapsed: {gen}")
    top2 = torch.topk(logits, 2, dim=-1).values
    return {
        "prompt_tokens": len(ids),
        "generated": gen,
        "distinct_generated": distinct,
        "logit_std": float(logits.std()),
        "median_top2_gap": float((top2[:, 0] - top2[:, 1]).median()),
        "text": tok.decode(gen),
    }


def sha256_files(out_dir: str | Path) -> dict[str, str]:
    out = Path(out_dir)
    return {
        str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(out.rglob("*"))
        if p.is_file()
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-positions", type=int, default=MAX_POSITIONS,
                        help=f"max_position_embeddings (default {MAX_POSITIONS}; the long-context variant: "
                        f"{LONG_CONTEXT_POSITIONS})")
    parser.add_argument("--vocab-size", type=int, default=VOCAB_SIZE,
                        help=f"embedding rows, at least the tokenizer's {TOKENIZER_SIZE} (default {VOCAB_SIZE}; "
                        "151936 or 248320 to replay real Qwen token ids)")
    parser.add_argument("--tokenizer", choices=TOKENIZERS, default="tiny",
                        help="tiny: the 480-token BPE (default); qwen: Qwen3.5/3.6's own (eval/qwen_tokenizer.py; "
                        f"give --vocab-size {QWEN_VOCAB_SIZE})")
    parser.add_argument("--no-check", action="store_true", help="skip the fp32 reload/generation sanity check")
    args = parser.parse_args(argv)
    try:
        check_options(args.vocab_size, args.max_positions, args.tokenizer)
    except ValueError as exc:
        parser.error(str(exc))
    out = build(args.out_dir, seed=args.seed, vocab_size=args.vocab_size, max_positions=args.max_positions,
                tokenizer=args.tokenizer)
    print(f"built {out} (seed {args.seed}, vocab {args.vocab_size}, positions {args.max_positions}); "
          f"tokenizer corpus sha256 {corpus_sha256()}")
    for name, digest in sha256_files(out).items():
        print(f"  {digest}  {name}")
    if not args.no_check:
        info = sanity_check(out)
        print(
            f"check ok: {info['distinct_generated']} distinct of {len(info['generated'])} greedy tokens, "
            f"logit std {info['logit_std']:.2f}, median top-2 gap {info['median_top2_gap']:.2f}"
        )
        print(f"  greedy text: {info['text']!r}")
    return 0



def cached_name(max_positions: int = MAX_POSITIONS, vocab_size: int = VOCAB_SIZE, tokenizer: str = "tiny") -> str:
    """``tiny-model-<digest>[-p<positions>][-v<vocab>][-qwen]``: the digest is of this builder and
    its template (a changed builder gets a new directory); a non-default option adds its suffix, so
    the variants coexist and the default keeps its plain name."""
    sources = [Path(__file__).resolve(), CHAT_TEMPLATE_PATH]
    if tokenizer == "qwen":
        sources.append(Path(__file__).resolve().with_name("qwen_tokenizer.py"))
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in sources)).hexdigest()[:12]
    name = f"tiny-model-{digest}"
    if max_positions != MAX_POSITIONS:
        name += f"-p{max_positions}"
    if vocab_size != VOCAB_SIZE:
        name += f"-v{vocab_size}"
    if tokenizer != "tiny":
        name += f"-{tokenizer}"
    return name


def cached_build(artifacts: str | Path, *, max_positions: int = MAX_POSITIONS, vocab_size: int | None = None,
                 tokenizer: str = "tiny") -> Path:
    """The model built under ``artifacts`` once per content of this builder and per options.

    The demo and the tests share it; ``cached_build(artifacts, max_positions=LONG_CONTEXT_POSITIONS)``
    is the long-context variant, ``tokenizer="qwen"`` the one that reads Qwen3.6's own token ids
    (``vocab_size`` then defaults to the real model's 248,320 rows).
    """
    import shutil

    if vocab_size is None:
        vocab_size = QWEN_VOCAB_SIZE if tokenizer == "qwen" else VOCAB_SIZE
    check_options(vocab_size, max_positions, tokenizer)
    artifacts = Path(artifacts)
    name = cached_name(max_positions, vocab_size, tokenizer)
    target = artifacts / name
    if not (target / "config.json").exists():
        print(f"[tiny-model] building into {target}", flush=True)
        scratch = artifacts / f"{name}.partial"
        shutil.rmtree(scratch, ignore_errors=True)
        build(scratch, vocab_size=vocab_size, max_positions=max_positions, tokenizer=tokenizer)
        scratch.rename(target)
    return target


if __name__ == "__main__":
    sys.exit(main())
