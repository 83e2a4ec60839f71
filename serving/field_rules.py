"""Field rules: what one request field may hold, as small functions listed in tables.

A rule takes a field's value and the request's ``Context`` and returns what is wrong with the
value (the text after ``"<field>: "``), or None. ``check_field`` raises ``RequestError`` for the
first rule a value breaks; an absent field (None) passes every rule, since SGLang fills it in.
The tables list the rules in the order they are checked, and that order is part of the
interface: with two bad fields the client is told about the first one found.

The limits these rules set (everything else is SGLang's own range):

| limit                      | value      | why                                                          |
|----------------------------|------------|--------------------------------------------------------------|
| ``MAX_EXTRA_KEY_CHARS``    | 256        | each namespace name (``extra_key``, ``cache_salt``; ``policy/namespace.py``) is part of every radix-tree key and is written to the events file (``cache_salt``); a namespace name needs no more |
| ``MAX_N``                  | 128        | ``n`` copies the request n times in the HTTP process before anything is checked (n = 1000 of 2 tokens kept the CPU server busy past a 60 s client timeout; n = 10**9 would exhaust its memory) |
| ``MAX_ABS_LOGIT_BIAS``     | 100        | OpenAI's documented range; a NaN, infinite or huge (1e308) bias made the sampler fail in the scheduler |
| ``MIN_REPETITION_PENALTY`` | 1e-3       | SGLang accepts (0, 2]; a tiny penalty divides logits into inf (scheduler crash seen at 1e-300) |
| ``MAX_TOP_K``              | 2**31 - 1  | top_k is an int32 tensor in the scheduler (crash seen at 2**40); -1 still means all |
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from policy.namespace import MAX_NAME_CHARS, name_problem, split_namespace

MAX_EXTRA_KEY_CHARS = MAX_NAME_CHARS  # policy/namespace.py: non-empty, no control characters
MAX_N = 128
MAX_ABS_LOGIT_BIAS = 100.0
MIN_REPETITION_PENALTY = 1e-3
MAX_TOP_K = 2**31 - 1

GRAMMAR_FIELDS = ("json_schema", "regex", "ebnf", "structural_tag")


class RequestError(ValueError):
    """A request the server refuses; SGLang's HTTP layer answers a ``ValueError`` with a 400
    whose message is the error text, so every message starts with the field it is about."""


@dataclass(frozen=True)
class Context:
    """What a rule may compare a value with: the model's vocabulary, why the server cannot
    constrain decoding (None: it can), the prompt the value belongs to (length unknown until
    text is tokenized: None), and the server's stop-regex matcher's verdict on a pattern
    (``patches/stop_regex.pattern_problem``; None: Python's ``re`` alone decides)."""

    vocab_size: int = 0
    no_grammar: str | None = None
    prompt_len: int | None = None
    return_logprob: Any = True
    regex_problem: Callable[[str], "str | None"] | None = None


Rule = Callable[[Any, Context], "str | None"]
ANYWHERE = Context()


def check_field(field: str, value, rules: tuple[Rule, ...], context: Context = ANYWHERE) -> None:
    """Raise ``RequestError("<field>: <problem>")`` for the first of ``rules`` that ``value``
    breaks; None (the field is absent) is accepted."""
    if value is None:
        return
    for rule in rules:
        problem = rule(value, context)
        if problem is not None:
            raise RequestError(f"{field}: {problem}")


def is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def outside_vocabulary(token, vocab_size: int) -> str:
    return f"token id {token} is outside the vocabulary [0, {vocab_size})"


def token_position_problem(ids, vocab_size: int) -> str | None:
    """The first entry of ``ids`` that is not an integer token id in [0, vocab_size)."""
    for position, token in enumerate(ids):
        if not is_int(token):
            return f"position {position} is {shown(token)}, not an integer token id"
        if not 0 <= token < vocab_size:
            return f"token id {token} at position {position} is outside the vocabulary [0, {vocab_size})"
    return None


def shown(value) -> str:
    """A value for an error message: a scalar's repr (at most 80 characters); a list or an object
    by its kind and size, never its repr (a list nested 900 deep has no repr: RecursionError)."""
    if isinstance(value, list):
        return f"a list of {len(value)}"
    if isinstance(value, Mapping):
        return f"an object of {len(value)} keys"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def integer(value, context: Context) -> str | None:
    return None if is_int(value) else f"must be an integer, got {value!r}"


def number(value, context: Context) -> str | None:
    return None if is_number(value) else f"must be a number, got {value!r}"


def boolean(value, context: Context) -> str | None:
    return None if isinstance(value, bool) else f"must be true or false, got {value!r}"


def string(value, context: Context) -> str | None:
    return None if isinstance(value, str) else f"must be a string, got {type(value).__name__}"


def mapping(value, context: Context) -> str | None:
    return None if isinstance(value, Mapping) else f"must be an object, got {type(value).__name__}"


def grammar_available(value, context: Context) -> str | None:
    return context.no_grammar or None


def parallel_n(value, context: Context) -> str | None:
    if is_int(value) and 1 <= value <= MAX_N:
        return None
    return f"must be an integer in [1, {MAX_N}], got {value!r}"


def logprob_start(value, context: Context) -> str | None:
    """-1 (no prompt logprobs) or a prompt position in [0, prompt length] (the length itself: no
    prompt logprobs). Below -1 failed an assertion in the scheduler. Past the prompt's end SGLang's
    scheduler refuses it too, but only once the request is there: the other requests of a batch
    were sent already and are computed for nobody. Not used unless ``return_logprob``."""
    if value < -1:
        return f"must be -1 (none) or a prompt position >= 0, got {value}"
    if context.prompt_len is not None and context.return_logprob and value > context.prompt_len:
        return f"{value} is past the end of the prompt ({context.prompt_len} tokens)"
    return None


def top_logprobs(value, context: Context) -> str | None:
    if 0 <= value <= context.vocab_size:
        return None
    return f"must be in [0, {context.vocab_size}] (the vocabulary size), got {value}"


def refused_token_ids_logprob(value, context: Context) -> str | None:
    """Refused outright. SGLang 0.5.16 keeps these logprobs as tensors and a request without
    them as ``[]`` in the same batch lists; a prefill or decode batch that mixes the two (any
    concurrent request without ``token_ids_logprob``, once one of them returns logprobs) fails
    in the scheduler with ``AttributeError: 'list' object has no attribute 'tolist'`` and the
    server exits. A per-request check cannot keep such requests apart. (SGLang turns a single
    request's ``[]`` into None; a batch entry ``[]`` reaches the scheduler as a request with them.)"""
    return ("not accepted by this server: SGLang 0.5.16's scheduler fails on a batch that mixes "
            "requests with and without token_ids_logprob (the server exits); use top_logprobs_num")


def namespace_key(value, context: Context) -> str | None:
    """A request's cache namespace (SGLang's ``extra_key``): a name from ``/generate``, or what
    ``policy.namespace.namespace`` made of an OpenAI request's two names; each part must pass
    ``policy.namespace.name_problem``."""
    for part in split_namespace(value):
        problem = name_problem(part)
        if problem is not None:
            return problem
    return None


def top_k_range(value, context: Context) -> str | None:
    return None if value <= MAX_TOP_K else f"must be -1 (all) or in [1, {MAX_TOP_K}], got {value}"


def repetition_penalty_floor(value, context: Context) -> str | None:
    if 0 < value < MIN_REPETITION_PENALTY:
        return f"must be in [{MIN_REPETITION_PENALTY}, 2], got {value}"
    return None


def strings(value, context: Context) -> str | None:
    if isinstance(value, str) or (isinstance(value, list) and all(isinstance(v, str) for v in value)):
        return None
    return f"must be a string or a list of strings, got {value!r:.80}"


def regular_expressions(value, context: Context) -> str | None:
    problem = strings(value, context)
    if problem is not None:
        return problem
    for pattern in [value] if isinstance(value, str) else value:
        try:
            # SGLang parses it with Python's parser to size the tail it matches; parsed, not compiled:
            # re.compile would keep it in the re module's cache (512 entries, unbounded in bytes).
            re._parser.parse(pattern)
        except Exception as exc:  # noqa: BLE001 - re.error, RecursionError, OverflowError
            return f"{pattern!r:.80} is not a valid regular expression: {exc}"
        problem = context.regex_problem(pattern) if context.regex_problem is not None else None
        if problem is not None:
            return problem
    return None


def stop_token_ids(value, context: Context) -> str | None:
    if not (isinstance(value, list) and all(is_int(t) for t in value)):
        return f"must be a list of integer token ids, got {value!r:.80}"
    # min_new_tokens indexes the logits with them (crash seen at 10**9)
    bad = [token for token in value if not 0 <= token < context.vocab_size]
    return outside_vocabulary(bad[0], context.vocab_size) if bad else None


def logit_bias(value, context: Context) -> str | None:
    if not isinstance(value, Mapping):
        return f"must be an object mapping token ids to numbers, got {type(value).__name__}"
    for token, bias in value.items():
        if not is_number(bias) or not math.isfinite(bias) or abs(bias) > MAX_ABS_LOGIT_BIAS:
            return (f"the bias of token {token} must be a number in "
                    f"[-{MAX_ABS_LOGIT_BIAS:g}, {MAX_ABS_LOGIT_BIAS:g}], got {bias!r}")
        try:
            token_id = int(token)
        except (TypeError, ValueError):
            return f"key {token!r} is not a token id"
        if not 0 <= token_id < context.vocab_size:
            return outside_vocabulary(token_id, context.vocab_size)
    return None


# One request's sampling params: (name, rule) rows in the order they are checked. Every type row
# comes before any range row, so a range rule may assume its value's type.
SAMPLING_RULES: tuple[tuple[str, Rule], ...] = (
    *((name, integer) for name in ("max_new_tokens", "top_k", "n")),
    *((name, number) for name in (
        "temperature", "top_p", "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty")),
    *((name, boolean) for name in (
        "ignore_eos", "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim")),
    *((name, string) for name in GRAMMAR_FIELDS),
    *((name, grammar_available) for name in GRAMMAR_FIELDS),
    ("top_k", top_k_range),
    ("repetition_penalty", repetition_penalty_floor),
    ("stop", strings),
    ("stop_regex", regular_expressions),
    ("stop_token_ids", stop_token_ids),
    ("logit_bias", logit_bias),
)

# The per-prompt scalar fields of a generate request: name -> its rules, first broken one reported.
PROMPT_RULES: dict[str, tuple[Rule, ...]] = {
    "logprob_start_len": (integer, logprob_start),
    "top_logprobs_num": (integer, top_logprobs),
    "token_ids_logprob": (refused_token_ids_logprob,),
    "extra_key": (string, namespace_key),
}
