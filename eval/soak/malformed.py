"""Malformed requests the soak interleaves with its traffic; each must be answered with a 4xx.

``--malformed safe`` sends only what stock SGLang 0.5.16 already rejects cleanly (a 400 from its
own validation), so the soak can run against an unpatched server too; ``all`` (the default) adds
the kinds that only the overlay's input validation (``patches/validation.py``) turns into a 400:
stock 0.5.16 passes token ids outside the vocabulary and negative ids to the model, which stops
the scheduler; ``none`` sends none.

Each builder returns ``(path, body)``: ``body`` is a dict sent as JSON, or ``bytes`` sent as is.
"""

from __future__ import annotations

import random
from typing import Callable

Body = dict | bytes
Builder = Callable[[random.Random, str, list[int], "MalformedContext"], tuple[str, Body]]


class MalformedContext:
    """What some builders need from the server: its context length (``/v1/models`` max_model_len)."""

    def __init__(self, context_len: int | None = None, salt: str = "soak-malformed"):
        self.context_len = context_len
        self.salt = salt


def _generate(rid: str, ids, salt, **sampling) -> dict:
    params = {"temperature": 0.0, "max_new_tokens": 4, **sampling}
    return {"rid": rid, "input_ids": ids, "extra_key": salt, "sampling_params": params}


def empty_ids(rng, rid, ids, ctx):
    return "/generate", _generate(rid, [], ctx.salt)


def max_new_tokens_negative(rng, rid, ids, ctx):
    return "/generate", _generate(rid, ids, ctx.salt, max_new_tokens=-1)


def temperature_negative(rng, rid, ids, ctx):
    return "/generate", _generate(rid, ids, ctx.salt, temperature=-0.5)


def prompt_too_long(rng, rid, ids, ctx):
    n = ctx.context_len + 16  # available() keeps this kind out when the context length is unknown
    return "/generate", _generate(rid, [rng.randrange(10, 400) for _ in range(n)], ctx.salt)


def id_over_vocab(rng, rid, ids, ctx):
    bad = list(ids)
    bad[rng.randrange(len(bad))] = 1_000_000_000  # >= any vocabulary
    return "/generate", _generate(rid, bad, ctx.salt)


def id_negative(rng, rid, ids, ctx):
    bad = list(ids)
    bad[rng.randrange(len(bad))] = -1
    return "/generate", _generate(rid, bad, ctx.salt)


def id_not_int(rng, rid, ids, ctx):
    bad: list = list(ids)
    bad[rng.randrange(len(bad))] = "x"
    return "/generate", _generate(rid, bad, ctx.salt)


def top_p_zero(rng, rid, ids, ctx):
    return "/generate", _generate(rid, ids, ctx.salt, top_p=0.0)


def max_new_tokens_not_int(rng, rid, ids, ctx):
    return "/generate", _generate(rid, ids, ctx.salt, max_new_tokens="ten")


def extra_key_wrong_type(rng, rid, ids, ctx):
    payload = _generate(rid, ids, ctx.salt)
    payload["extra_key"] = 12345
    return "/generate", payload


def cache_salt_wrong_type(rng, rid, ids, ctx):
    return "/v1/completions", {"model": "default", "prompt": ids, "max_tokens": 4, "temperature": 0.0,
                               "rid": rid, "cache_salt": {"tenant": 1}}


def logprob_start_len_past_prompt(rng, rid, ids, ctx):
    payload = _generate(rid, ids, ctx.salt)
    payload.update(return_logprob=True, logprob_start_len=len(ids) + 5)
    return "/generate", payload


def top_logprobs_num_absurd(rng, rid, ids, ctx):
    payload = _generate(rid, ids, ctx.salt)
    payload.update(return_logprob=True, top_logprobs_num=10**9)
    return "/generate", payload


def extra_key_too_long(rng, rid, ids, ctx):
    payload = _generate(rid, ids, ctx.salt)
    payload["extra_key"] = "k" * 100_000
    return "/generate", payload


def stop_token_id_over_vocab(rng, rid, ids, ctx):
    return "/generate", _generate(rid, ids, ctx.salt, stop_token_ids=[1_000_000_000])


def body_not_json(rng, rid, ids, ctx):
    return "/generate", b'{"input_ids": [11, 12, 13], "sampling_params": {'


SAFE: dict[str, Builder] = {
    "empty_ids": empty_ids,
    "max_new_tokens_negative": max_new_tokens_negative,
    "temperature_negative": temperature_negative,
    "prompt_too_long": prompt_too_long,
}
UNSAFE: dict[str, Builder] = {
    "id_over_vocab": id_over_vocab,
    "id_negative": id_negative,
    "id_not_int": id_not_int,
    "top_p_zero": top_p_zero,
    "max_new_tokens_not_int": max_new_tokens_not_int,
    "extra_key_wrong_type": extra_key_wrong_type,
    "cache_salt_wrong_type": cache_salt_wrong_type,
    "logprob_start_len_past_prompt": logprob_start_len_past_prompt,
    "top_logprobs_num_absurd": top_logprobs_num_absurd,
    "extra_key_too_long": extra_key_too_long,
    "stop_token_id_over_vocab": stop_token_id_over_vocab,
    "body_not_json": body_not_json,
}
# ``all`` starts with the two ids that stopped a stock scheduler, so that even a short run sends them.
ALL: dict[str, Builder] = {"id_over_vocab": id_over_vocab, "id_negative": id_negative, **SAFE, **UNSAFE}
SETS: dict[str, dict[str, Builder]] = {"none": {}, "safe": SAFE, "all": ALL}


def kinds(selection: str, ctx: MalformedContext) -> list[str]:
    """The kinds of ``selection`` (``none``/``safe``/``all``) that can be built against this server."""
    if selection not in SETS:
        raise ValueError(f"malformed set {selection!r}: one of {', '.join(SETS)}")
    return [k for k in SETS[selection] if k != "prompt_too_long" or ctx.context_len]


def build(kind: str, rng: random.Random, rid: str, ids: list[int], ctx: MalformedContext) -> tuple[str, Body]:
    """``ids``: a well-formed prompt to spoil (at least one token)."""
    return SETS["all"][kind](rng, rid, ids or [11, 12, 13], ctx)
