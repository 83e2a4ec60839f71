"""Rows of the dataset's JSONL and parquet files, each with where it came from (``FILE:LINE`` or
``FILE:row N``), and the field checks the loader applies to them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Iterator

from eval.bcp.data_types import DataError


def read_jsonl(path: Path) -> Iterator[tuple[int, dict]]:
    """(line number, object) of each non-blank line; a line that is not a JSON object is a DataError."""
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}:{lineno}: not JSON ({exc.msg})") from None
            if not isinstance(row, dict):
                raise DataError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
            yield lineno, row


def read_parquet(paths: list[Path], columns: list[str] | None) -> Iterator[tuple[str, dict]]:
    import pyarrow.parquet as pq

    for path in paths:
        table = pq.read_table(path, columns=columns)
        for i, row in enumerate(table.to_pylist()):
            yield f"{path}:row {i}", row


def rows(base: Path, stem: str, columns: list[str] | None) -> tuple[str, Iterator[tuple[str, dict]]] | None:
    """(source, rows) of ``base/stem.jsonl``, ``base/stem.parquet`` or ``base/stem/*.parquet``
    (the first found); None when there is none."""
    jsonl = base / f"{stem}.jsonl"
    if jsonl.is_file():
        return str(jsonl), ((f"{jsonl}:{n}", r) for n, r in read_jsonl(jsonl))
    parquet = base / f"{stem}.parquet"
    if parquet.is_file():
        return str(parquet), read_parquet([parquet], columns)
    shards = sorted((base / stem).glob("*.parquet")) if (base / stem).is_dir() else []
    if shards:
        return str(base / stem), read_parquet(shards, columns)
    return None


def require(row: dict, keys: Iterable[str], where: str) -> None:
    """Each of ``keys`` is present and not null in ``row``."""
    missing = [k for k in keys if k not in row or row[k] is None]
    if missing:
        raise DataError(f"{where}: missing field(s) {', '.join(missing)}")


def docids(row: dict, key: str, where: str) -> tuple[str, ...]:
    """The docids of ``row[key]``, a list of ``{docid, text[, url]}`` (absent: none)."""
    docs = row.get(key) or []
    if not isinstance(docs, list):
        raise DataError(f"{where}: {key} must be a list of {{docid, text}}")
    out = []
    for d in docs:
        if not isinstance(d, dict) or d.get("docid") is None:
            raise DataError(f"{where}: an entry of {key} has no docid")
        out.append(str(d["docid"]))
    return tuple(out)
