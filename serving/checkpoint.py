"""What a checkpoint declares about itself, read before SGLang loads it (no download).

The launcher refuses settings a policy cannot honour before the model loads (minutes for a 27B
model); a quantized checkpoint declares its format in ``config.json``'s ``quantization_config``,
which SGLang reads only while loading. This reads it from a local directory, or from the Hugging
Face cache for a hub name, and says nothing (None) when the file is not at hand.
"""

from __future__ import annotations

import json
import os


def config_json(model_path: str, revision: str | None = None) -> dict | None:
    """The checkpoint's ``config.json`` as a dict; None when it is not on this machine."""
    path = os.path.join(model_path, "config.json")
    if not os.path.isfile(path):
        path = _cached(model_path, revision)
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


def _cached(repo_id: str, revision: str | None) -> str | None:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    try:
        found = try_to_load_from_cache(repo_id, "config.json", revision=revision)
    except Exception:  # an invalid repo id (a path that does not exist) is not ours to report
        return None
    return found if isinstance(found, str) else None
