"""Package versions: the SGLang this overlay is pinned to, and those a run's start-up record names.

Pure: the caller supplies what is installed (``patches/versions.py`` asks the running SGLang), or
``recorded_versions`` reads package metadata without importing the packages (importing SGLang or
torch takes seconds, and the launcher records versions before SGLang starts).
"""

from __future__ import annotations

import importlib.metadata
from typing import Mapping

# The overlay replaces SGLang functions and reads its private fields, so only SGLang is pinned.
# Triton is not patched (the CPU path replaces the Triton kernels instead of interpreting them).
PINNED = {"sglang": "0.5.16"}

RECORDED = {"sglang": "sglang", "torch": "torch", "transformers": "transformers",
            "overlay": "hybrid-cache-policies"}  # record key -> distribution name (pyproject.toml)


class VersionMismatch(RuntimeError):
    pass


def check_pins(installed: Mapping[str, str | None], pinned: Mapping[str, str] = PINNED) -> None:
    """Raise ``VersionMismatch`` naming every pinned package whose installed version differs."""
    wrong = [f"{name}=={installed.get(name)} (pinned {want})" for name, want in pinned.items()
             if installed.get(name) != want]
    if wrong:
        raise VersionMismatch(
            "the cache-policy overlay patches SGLang internals and was written for "
            + ", ".join(f"{k}=={v}" for k, v in pinned.items()) + "; installed: " + ", ".join(wrong)
        )


def recorded_versions() -> dict[str, str | None]:
    """Record key -> installed version, None where the distribution is not installed."""
    found: dict[str, str | None] = {}
    for key, distribution in RECORDED.items():
        try:
            found[key] = importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            found[key] = None
    return found
