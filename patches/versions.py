"""The pinned SGLang, checked against the running one (``serving/versions.py`` holds the pin)."""

from __future__ import annotations

from serving import versions as pins
from serving.versions import PINNED, VersionMismatch  # noqa: F401 - part of this module's interface


def check_pins(installed: dict[str, str | None] | None = None) -> None:
    """Raise ``VersionMismatch`` naming every pinned package whose installed version differs."""
    pins.check_pins(installed_versions() if installed is None else installed, pins.PINNED)


def installed_versions() -> dict[str, str | None]:
    """Installed versions of the pinned packages (None where a package is missing)."""
    import importlib.metadata

    found: dict[str, str | None] = {}
    for name in pins.PINNED:
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
