"""The policies' one collective under TP: each rank's two-int64 row (meaning: ``policy/ranks.py``)."""

import torch


def all_gather_rows(row: tuple[int, int], size: int, group) -> list[tuple[int, int]]:
    """Every rank's ``row`` by rank, over the TP CPU ``group`` (gloo); one rank: no collective."""
    rows = [torch.tensor(row, dtype=torch.int64) for _ in range(size)]
    if size > 1:
        torch.distributed.all_gather(rows, rows[0].clone(), group=group)
    return [(int(r[0]), int(r[1])) for r in rows]
