"""A text-only checkpoint is served text-only, on every platform.

SGLang 0.5.16 turns multimodal serving on for every ``*ForConditionalGeneration`` architecture it
does not list (``ModelConfig``: ``enable_multimodal=None`` becomes True for Qwen3.5/3.6), and then
the tokenizer manager and each scheduler build an image processor from the checkpoint
(``get_processor``). A checkpoint without processor configs, such as the tiny test model, makes
transformers raise ``OSError: Can't load image processor``, which SGLang does not catch (it catches
``ValueError``), so the server dies at start-up; 0.5.16 has no flag that turns multimodal off.

The choice here (rather than shipping processor configs with the tiny model): the checkpoint's own
files decide. Where the user left ``--enable-multimodal`` unset and the checkpoint ships none of
``serving.checkpoint.PROCESSOR_FILES``, a BEFORE hook on ``ServerArgs.__post_init__`` sets
``enable_multimodal=False``. A real multimodal checkpoint (it ships ``preprocessor_config.json``)
is served as SGLang would serve it, and the tiny model takes the same text-only path on CUDA that
it takes on CPU, so the CPU suite predicts what the GPU runs (with processor configs it would take
the multimodal path on CUDA only). Fake processor configs would also claim an image ability the
model does not have.

``python -m patches.text_only MODEL_DIR`` runs SGLang's own model-config and tokenizer/processor
loading for a checkpoint as a server on CUDA would, without a GPU or a server (none of it touches
the device), and prints one JSON line: what ``eval.gpu_check`` and the tests call.
"""

from __future__ import annotations

import json
import logging
import sys

from serving import checkpoint

logger = logging.getLogger(__name__)

SERVER_ARGS_POST_INIT = "sglang.srt.server_args.ServerArgs.__post_init__"
# One line at start-up when the rule applies (format fixed: operators grep it).
TEXT_ONLY_LINE = ("[cache-policy] text-only checkpoint {path}: no {files}, so multimodal input is off "
                  "(pass --enable-multimodal to serve it multimodal)")


def text_only_default(server_args) -> str | None:
    """Set ``enable_multimodal=False`` on ``server_args`` when the user left it unset and the
    checkpoint is text-only; returns the line that says so, or None when nothing changed."""
    if getattr(server_args, "enable_multimodal", None) is not None:
        return None
    path = getattr(server_args, "model_path", None)
    if not path or checkpoint.is_text_only(path, getattr(server_args, "revision", None)) is not True:
        return None
    server_args.enable_multimodal = False
    return TEXT_ONLY_LINE.format(path=path, files=" or ".join(checkpoint.PROCESSOR_FILES))


def _before_post_init(self, *args, **kwargs):
    line = text_only_default(self)
    if line:
        print(line, file=sys.stderr, flush=True)  # SGLang configures logging after the plugins load
    return None


def install(register) -> list[str]:
    """Register the rule; ``register(target, hook, kind)`` as in ``patches.plugin``."""
    register(SERVER_ARGS_POST_INIT, _before_post_init, "before")
    return [SERVER_ARGS_POST_INIT]


def default_server_args(model_path: str):
    """Every ``ServerArgs`` field at SGLang's default (no ``__post_init__``: that one resolves the
    device), with ``model_path`` and ``tokenizer_path`` set: the values a CUDA server starts from."""
    import dataclasses
    import types

    from sglang.srt.server_args import ServerArgs

    values = {}
    for field in dataclasses.fields(ServerArgs):
        if field.default is not dataclasses.MISSING:
            values[field.name] = field.default
        elif field.default_factory is not dataclasses.MISSING:
            values[field.name] = field.default_factory()
    values.update(model_path=model_path, tokenizer_path=model_path)
    return types.SimpleNamespace(**values)


def load_as_sglang_does(server_args) -> dict:
    """SGLang 0.5.16's ``ModelConfig.from_server_args``, ``TokenizerManager.init_tokenizer_and_processor``
    and ``Scheduler.init_tokenizer`` for ``server_args`` (e.g. ``default_server_args``, after whatever
    hooks the caller applied): what the server's start-up does before any weight reaches the
    device. Returns what each step gave or raised, and whether all of them loaded."""
    import types

    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.managers.tokenizer_manager import TokenizerManager

    out = {"enable_multimodal": server_args.enable_multimodal}
    config = ModelConfig.from_server_args(server_args)
    out["is_multimodal"] = bool(config.is_multimodal)
    for name, load in (("tokenizer_manager", TokenizerManager.init_tokenizer_and_processor),
                       ("scheduler", Scheduler.init_tokenizer)):
        holder = types.SimpleNamespace(server_args=server_args, model_config=config)
        try:
            load(holder)
        except Exception as exc:  # noqa: BLE001 - what a server's start-up would die of
            out[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
        else:
            out[name] = f"loaded {type(holder.tokenizer).__name__}"
    out["loads"] = all(str(out[name]).startswith("loaded") for name in ("tokenizer_manager", "scheduler"))
    return out


RESULT_PREFIX = "TEXT_ONLY_RESULT "


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) not in (1, 2) or (len(argv) == 2 and argv[1] != "--without-rule"):
        print("usage: python -m patches.text_only MODEL_DIR [--without-rule]", file=sys.stderr)
        return 2
    server_args = default_server_args(argv[0])
    rule = text_only_default(server_args) if len(argv) == 1 else None
    result = {"rule": rule, **load_as_sglang_does(server_args)}
    print(RESULT_PREFIX + json.dumps(result), flush=True)
    return 0 if result["loads"] else 1


if __name__ == "__main__":
    sys.exit(main())
