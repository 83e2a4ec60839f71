"""What a checkpoint declares about itself, read before SGLang loads it (no download).

The launcher refuses settings a policy cannot honour before the model loads (minutes for a 27B
model); a quantized checkpoint declares its format in ``config.json``'s ``quantization_config``,
which SGLang reads only while loading. This reads it from a local directory, or from the Hugging
Face cache for a hub name, and says nothing (None) when the file is not at hand. Standard library
only (``serving/`` imports no third-party package): the cache layout is read directly.
"""

from __future__ import annotations

import json
import os


def config_json(model_path: str, revision: str | None = None) -> dict | None:
    """The checkpoint's ``config.json`` as a dict; None when it is not on this machine."""
    path = os.path.join(model_path, "config.json")
    if not os.path.isfile(path):
        path = cached_file(model_path, "config.json", revision)
    if not path:
        return None
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def quantization(config: dict | None) -> str | None:
    """``quantization_config.quant_method`` (also under ``text_config``), lower case; None if unquantized."""
    if not config:
        return None
    for holder in (config, config.get("text_config") or {}):
        quant = holder.get("quantization_config") if isinstance(holder, dict) else None
        if isinstance(quant, dict):
            method = quant.get("quant_method") or quant.get("quant_algo") or "unknown"
            return str(method).lower()
    return None


def hub_cache(env: dict | None = None) -> str:
    """The Hugging Face hub cache folder: ``HF_HUB_CACHE``, else ``$HF_HOME/hub``, else
    ``~/.cache/huggingface/hub`` (huggingface_hub's own order)."""
    env = os.environ if env is None else env
    if env.get("HF_HUB_CACHE"):
        return env["HF_HUB_CACHE"]
    home = env.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    return os.path.join(home, "hub")


def cached_file(repo_id: str, filename: str, revision: str | None = None, cache: str | None = None) -> str | None:
    """``filename`` of hub model ``repo_id`` in the cache (``models--org--name/snapshots/<commit>/``,
    the commit read from ``refs/<revision or main>`` unless ``revision`` is a commit); None if absent."""
    if repo_id.count("/") != 1 or repo_id.startswith((".", "/")):
        return None
    folder = os.path.join(cache or hub_cache(), "models--" + repo_id.replace("/", "--"))
    commit = revision or "main"
    ref = os.path.join(folder, "refs", commit)
    if os.path.isfile(ref):
        with open(ref) as f:
            commit = f.read().strip()
    path = os.path.join(folder, "snapshots", commit, filename)
    return path if os.path.isfile(path) else None


# The files transformers' AutoProcessor / AutoImageProcessor / AutoVideoProcessor read; a multimodal
# checkpoint (the real Qwen3.5/3.6 ones) ships at least ``preprocessor_config.json``.
PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json", "video_preprocessor_config.json")


def is_text_only(model_path: str, revision: str | None = None) -> bool | None:
    """True when the checkpoint is on this machine and ships no processor config (so an image
    processor cannot be built from it), False when it ships one, None when it is not at hand."""
    if config_json(model_path, revision) is None:
        return None
    for name in PROCESSOR_FILES:
        local = os.path.join(model_path, name)
        if os.path.isfile(local) or cached_file(model_path, name, revision):
            return False
    return True
