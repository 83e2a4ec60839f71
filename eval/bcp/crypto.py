"""BrowseComp-Plus's encryption of its query records (docs/eval.md §1.3), and where the password
comes from.

Every string of a record except those under the ``query_id`` key is base64-encoded ciphertext;
plaintext = ciphertext XOR keystream, keystream = SHA-256(password) repeated to the ciphertext's
length; UTF-8. The password is the BrowseComp canary string (the ``DEFAULT_CANARY`` of BCP's
``scripts_build_index/decrypt_dataset.py``). It is never written in this repository: pass
``password=``, set ``$BCP_CANARY``, or (fixtures, fake password) put it in ``DIR/canary.txt``; that
is also the lookup order (:func:`resolve_password`).
"""
# Spec: docs/eval.md

from __future__ import annotations

import base64
import hashlib
import os
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from eval.bcp.data_types import DataError

PASSWORD_ENV = "BCP_CANARY"
PASSWORD_FILE = "canary.txt"
SKIP_KEYS = frozenset({"query_id"})


def _keystream(password: str, length: int) -> np.ndarray:
    digest = np.frombuffer(hashlib.sha256(password.encode("utf-8")).digest(), dtype=np.uint8)
    return np.resize(digest, length)


def _xor(data: bytes, password: str) -> bytes:
    buf = np.frombuffer(data, dtype=np.uint8)
    return (buf ^ _keystream(password, len(buf))).tobytes()


def encrypt_string(plaintext: str, password: str) -> str:
    """base64(UTF-8(plaintext) XOR SHA-256(password) repeated); the inverse of decrypt_string."""
    return base64.b64encode(_xor(plaintext.encode("utf-8"), password)).decode("ascii")


def decrypt_string(ciphertext: str, password: str) -> str:
    """§1.3: base64-decode, XOR with the repeated SHA-256 digest of the password, UTF-8 decode."""
    try:
        raw = base64.b64decode(ciphertext, validate=True)
    except (ValueError, TypeError) as exc:
        raise DataError(f"not base64 ciphertext ({exc}); is the file already decrypted?") from None
    try:
        return _xor(raw, password).decode("utf-8")
    except UnicodeDecodeError:
        raise DataError("ciphertext does not decrypt to UTF-8: wrong password?") from None


def _walk(value: Any, fn, skip: frozenset[str]) -> Any:
    if isinstance(value, str):
        return fn(value)
    if isinstance(value, dict):
        return {k: (v if k in skip else _walk(v, fn, skip)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_walk(v, fn, skip) for v in value]
    return value


def encrypt_record(record: dict, password: str, skip: Iterable[str] = SKIP_KEYS) -> dict:
    """Encrypt every string in ``record`` (recursively) except values under a ``skip`` key."""
    return _walk(record, lambda s: encrypt_string(s, password), frozenset(skip))


def decrypt_record(record: dict, password: str, skip: Iterable[str] = SKIP_KEYS) -> dict:
    """Decrypt every string in ``record`` (recursively) except values under a ``skip`` key (§1.3)."""
    return _walk(record, lambda s: decrypt_string(s, password), frozenset(skip))


def resolve_password(base: Path, password: str | None) -> str:
    """The password: ``password``, else ``$BCP_CANARY``, else ``base/canary.txt``; none is a DataError."""
    if password:
        return password
    if os.environ.get(PASSWORD_ENV):
        return os.environ[PASSWORD_ENV]
    file = base / PASSWORD_FILE
    if file.is_file():
        return file.read_text(encoding="utf-8").strip()
    raise DataError(
        f"{base}: the query records are encrypted; pass password=..., set ${PASSWORD_ENV}, or "
        f"write {PASSWORD_FILE} (the password is DEFAULT_CANARY of BCP's decrypt_dataset.py)"
    )
