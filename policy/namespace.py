"""A request's cache namespace: one string (SGLang's ``extra_key``) from the two names a client
may give, as an injective function, so that two tenants can never share a cache by accident.

SGLang 0.5.16 joins an OpenAI request's ``cache_salt`` and ``extra_key`` with no separator
(``"AB"`` + nothing = ``"A"`` + ``"B"``), and drops an empty salt into the unsalted namespace;
both let one tenant read another's cached prefix. Here:

| route                | given                          | namespace            |
|----------------------|--------------------------------|----------------------|
| any                  | nothing                        | ``None`` (shared)    |
| ``/generate``        | ``extra_key`` k                | ``k``                |
| OpenAI               | ``cache_salt`` s               | ``s``                |
| OpenAI               | ``extra_key`` k                | ``SEP + k``          |
| OpenAI               | ``cache_salt`` s, ``extra_key`` k | ``s + SEP + k``   |

``SEP`` is U+001F (unit separator). Both names must be non-empty and free of control
characters (``name_problem``), so no name can contain ``SEP`` and the table is injective:
``split_namespace`` reads any namespace back to its one pair. ``/generate`` has a single name, its
``extra_key``, which plays the salt's part: ``/generate`` with ``extra_key`` "t" and a chat
request with ``cache_salt`` "t" are the same tenant (a client may move between the two routes),
while a chat request with ``extra_key`` "t" is not.

The empty name is refused rather than given a namespace of its own: on the OpenAI routes SGLang
reads ``""`` as "no salt", on ``/generate`` as a namespace, and a client cannot tell which it
got. The SCR knob syntax (``kvreuse:...``, ``scr/knobs.py``) is read from the salt part.
"""

from __future__ import annotations

SEP = "\x1f"
MAX_NAME_CHARS = 256


def name_problem(name) -> str | None:
    """Why ``name`` cannot be a ``cache_salt`` / ``extra_key``, or None (None itself: no name)."""
    if name is None:
        return None
    if not isinstance(name, str):
        return f"must be a string, got {type(name).__name__}"
    if name == "":
        return "must not be empty (omit it for the shared namespace)"
    if len(name) > MAX_NAME_CHARS:
        return f"{len(name)} characters, at most {MAX_NAME_CHARS} are allowed"
    bad = next((c for c in name if ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F), None)
    if bad is not None:
        return f"must not contain control characters (U+{ord(bad):04X} at index {name.index(bad)})"
    return None


def namespace(cache_salt: str | None, extra_key: str | None) -> str | None:
    """The namespace of a request with these names (each already passed ``name_problem``)."""
    for name in (cache_salt, extra_key):
        problem = name_problem(name)
        if problem is not None:
            raise ValueError(problem)
    if extra_key is None:
        return cache_salt
    return f"{cache_salt or ''}{SEP}{extra_key}"


def split_namespace(key: str | None) -> tuple[str | None, str | None]:
    """Inverse of ``namespace``: ``(cache_salt, extra_key)``."""
    if key is None or SEP not in key:
        return key, None
    salt, _, extra = key.partition(SEP)
    return (salt or None), extra


def salt_of(key: str | None) -> str | None:
    """The salt part of a namespace (where the SCR knobs are read)."""
    return split_namespace(key)[0]
