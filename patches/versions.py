"""The upstream versions this overlay patches. A mismatch stops the server.

Only SGLang is checked: the overlay replaces SGLang functions and reads its private fields.
Triton is not patched (the CPU path replaces the Triton kernels instead of interpreting them),
so GPU installs keep whatever triton their torch wheel requires; the CPU requirements pin it.
"""

from __future__ import annotations

PINNED = {"sglang": "0.5.16"}


class VersionMismatch(RuntimeError):
    pass


def check_pins(installed: dict[str, str | None] | None = None) -> None:
    """Raise ``VersionMismatch`` naming every pinned package whose installed version differs."""
    if installed is None:
        installed = installed_versions()
    wrong = [
        f"{name}=={installed.get(name)} (pinned {want})"
        for name, want in PINNED.items()
        if installed.get(name) != want
    ]
    if wrong:
        raise VersionMismatch(
            "the cache-policy overlay patches SGLang internals and was written for "
            + ", ".join(f"{k}=={v}" for k, v in PINNED.items())
            + "; installed: "
            + ", ".join(wrong)
        )


def installed_versions() -> dict[str, str | None]:
    """Installed versions of the pinned packages (None where a package is missing)."""
    import importlib.metadata

    found: dict[str, str | None] = {}
    for name in PINNED:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    try:
        import sglang  # the version the running code reports, which is what the hooks patch
    except ImportError:
        found["sglang"] = None
    else:
        found["sglang"] = sglang.__version__
    return found
