"""What one request to a generating route may cost: the limits, each a launcher setting.

The schema (``serving/schema.py``) and the field rules (``serving/field_rules.py``) say what a
request may *hold*; these limits say how much of it the server takes in one request, so that no
single request can make every other request wait or grow a process without bound. Each is a flag
of ``python -m patches.launch_server`` (``FLAGS``); the launcher hands the resolved values to every
SGLang process as one JSON environment variable (``LIMITS_ENV``), and a request over a limit gets
a 400 whose message names the field and the flag.

| setting (flag)             | default | what it bounds, and why this default |
|----------------------------|---------|---------------------------------------|
| ``--max-request-body``     | 32 MiB  | a body's bytes, read before JSON parsing (``patches/request_bodies.py``). A full 262,144-token context is ~1.7 MB as token ids and ~1.2 MB as text, so 32 MiB is ~19 such prompts in one body. Parsing costs ~10x the bytes in memory and, for text fields SGLang parses in Python (``stop_regex``, about 0.6 us a character), CPU time on the event loop every request shares |
| ``--max-prompts``          | 64      | prompts in one request (a ``text`` / ``input_ids`` list, an OpenAI ``prompt`` list). An agent sends one prompt per call; 10,000 one-token prompts in one request made trivial requests time out at 30 s |
| ``--max-sequences``        | 256     | prompts x ``n``: SGLang copies the request per sequence in the HTTP process before anything is checked; 32 prompts x ``n`` = 128 made trivial requests time out at 30 s. 256 is a 64-prompt batch with 4 samples each, or best-of-16 on 16 prompts |
| ``--max-stop-regexes``     | 16      | distinct ``stop_regex`` patterns in one request (all its prompts together). Each is compiled in the HTTP process and in every scheduler, and matched after every token; agent frameworks stop on 1-4 markers (OpenAI allows 4 ``stop`` strings) |
| ``--max-stop-regex-chars`` | 16,384  | characters of those patterns together: SGLang parses each with Python's parser in the HTTP process (~0.6 us a character; a 2 MB character class compiles to 5 RE2 instructions but parses for 1.2 s). The longest realistic stop pattern is a few hundred characters |
| ``--stop-regex-max-mem``   | 256 KiB | RE2's ``max_mem`` for one pattern: its compiled program and match caches (``patches/stop_regex.py``). RE2's own default (8 MiB) compiled a 308-character pattern (a 300-code-point class repeated 1,000 times) for 0.14-0.18 s into 417,004 instructions and ~3.3 MB; 256 KiB caps a program at ~16,000 instructions (a 16,000-character literal) and a compile at ~3 ms, while a real stop pattern needs tens to hundreds |
| ``--stop-regex-cache``     | 64 MiB  | the compiled patterns each process keeps (HTTP process and every scheduler), counted at their worst case (``stop_regex_entry_bytes``: RE2 can grow a small pattern's match caches to ``max_mem``): ~190 patterns at the defaults, while an agent workload's live patterns are a handful; an evicted pattern is compiled again, never refused |

Every function here is pure: ``patches/`` reads the limits (``current``) and calls the checks.
"""

from __future__ import annotations

import functools
import json
import os
import re
from dataclasses import asdict, dataclass, fields
from typing import Iterable, Mapping

LIMITS_ENV = "CACHE_POLICY_REQUEST_LIMITS"

KIB, MIB = 1 << 10, 1 << 20
# RE2 gives a pattern's reverse program a third of ``max_mem`` besides ``max_mem`` itself, and
# keeps the pattern's text three times (Python's str, its UTF-8 copy, RE2's own copy).
RE2_MEM_FACTOR = (4, 3)
PATTERN_COPIES = 3
MIN_STOP_REGEX_MAX_MEM = 16 * KIB  # below this RE2 cannot compile a pattern of a few dozen characters


@dataclass(frozen=True)
class RequestLimits:
    """The limits one server enforces (module docstring); sizes in bytes."""

    max_body_bytes: int = 32 * MIB
    max_prompts: int = 64
    max_sequences: int = 256
    max_stop_regexes: int = 16
    max_stop_regex_chars: int = 16_384
    stop_regex_max_mem: int = 256 * KIB
    stop_regex_cache_bytes: int = 64 * MIB

    def __post_init__(self):
        problems = [f"{flag_of(name)} must be a positive integer, got {getattr(self, name)!r}"
                    for name in FLAGS if not _positive(getattr(self, name))]
        if not problems and self.stop_regex_max_mem < MIN_STOP_REGEX_MAX_MEM:
            problems.append(f"--stop-regex-max-mem must be at least {MIN_STOP_REGEX_MAX_MEM // KIB}K, "
                            f"got {self.stop_regex_max_mem}")
        if problems:
            raise ValueError("; ".join(problems))

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "RequestLimits":
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError(f"request limits must be a JSON object, got {text!r:.80}")
        unknown = sorted(set(data) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"unknown request limits {unknown}")
        return cls(**data)

    def shown(self, name: str) -> str:
        """``name``'s flag and value as an operator would type it: ``--max-prompts 64``."""
        value = getattr(self, name)
        return f"{flag_of(name)} {format_size(value) if name in SIZES else value}"


def _positive(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


# field -> the launcher flag that sets it (``serving/launch_args.add_request_limit_flags``)
FLAGS: dict[str, str] = {
    "max_body_bytes": "--max-request-body",
    "max_prompts": "--max-prompts",
    "max_sequences": "--max-sequences",
    "max_stop_regexes": "--max-stop-regexes",
    "max_stop_regex_chars": "--max-stop-regex-chars",
    "stop_regex_max_mem": "--stop-regex-max-mem",
    "stop_regex_cache_bytes": "--stop-regex-cache",
}
SIZES = frozenset({"max_body_bytes", "stop_regex_max_mem", "stop_regex_cache_bytes"})  # flags taking 32M, 256K


def flag_of(name: str) -> str:
    return FLAGS[name]


_SIZE = re.compile(r"(\d+)([KMG]?)(i?B)?", re.IGNORECASE)


def parse_size(text: str) -> int:
    """``"32M"`` -> 33554432: an integer of bytes, or with a binary suffix K, M or G (KiB, MiB, GiB
    also read). Raises ValueError for anything else."""
    match = _SIZE.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"{text!r} is not a size (an integer, optionally with K, M or G: 256K, 32M)")
    number, unit = int(match.group(1)), match.group(2).upper()
    return number << {"": 0, "K": 10, "M": 20, "G": 30}[unit]


def format_size(value: int) -> str:
    """The shortest exact spelling ``parse_size`` reads back: 33554432 -> ``"32M"``."""
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if value and value % (1 << shift) == 0:
            return f"{value >> shift}{unit}"
    return str(value)


# ---------------------------------------------------------------------------- this process's limits


def current() -> RequestLimits:
    """The limits the launcher set for this server (``LIMITS_ENV``), or the defaults when the
    server was not started by the launcher."""
    return _parsed(os.environ.get(LIMITS_ENV))


@functools.lru_cache(maxsize=4)
def _parsed(text: str | None) -> RequestLimits:
    return RequestLimits() if not text else RequestLimits.from_json(text)


# ------------------------------------------------------------------------------------ the checks


def prompt_count(text=None, input_ids=None, input_embeds=None) -> int | None:
    """How many prompts a request holds, by SGLang's rules (``GenerateReqInput._determine_batch_size``:
    the first of the three given decides; a string or a flat id list is one prompt); None: none given."""
    if text is not None:
        return 1 if isinstance(text, str) else len(text) if isinstance(text, list) else None
    if input_ids is not None:
        if not isinstance(input_ids, list):
            return None
        return 1 if not input_ids or not isinstance(input_ids[0], list) else len(input_ids)
    if isinstance(input_embeds, list):
        single = input_embeds and isinstance(input_embeds[0], list) and input_embeds[0] \
            and not isinstance(input_embeds[0][0], list)
        return 1 if single else len(input_embeds)
    return None


def batch_problem(prompts: int, n: int, limits: RequestLimits, field: str,
                  n_field: str = "sampling_params.n") -> str | None:
    """Why ``prompts`` prompts with ``n`` sequences each are too many for one request, or None.
    ``field`` names the prompt field (``text``, ``input_ids``, ``prompt``), ``n_field`` the n."""
    if prompts > limits.max_prompts:
        return (f"{field}: {prompts} prompts in one request, over the limit of {limits.max_prompts} "
                f"({limits.shown('max_prompts')}); send them in several requests")
    if prompts * n > limits.max_sequences:
        return (f"{n_field}: {prompts} prompts x n = {n} is {prompts * n} sequences in one request, "
                f"over the limit of {limits.max_sequences} ({limits.shown('max_sequences')})")
    return None


def body_batch_problem(body: Mapping, prompt_fields: tuple[str, ...], n_field: str,
                       limits: RequestLimits) -> str | None:
    """``batch_problem`` on a raw JSON body, before its schema is walked (a 32 MiB body holds
    millions of one-token prompts: walking them would hold the HTTP process for seconds).
    ``prompt_fields``: the body's prompt fields in SGLang's order (``/generate``: text, input_ids,
    input_embeds; OpenAI completions: prompt; chat: messages, one prompt); ``n_field``: a dotted path
    to ``n`` (a list on the way: its first entry, as SGLang reads ``sampling_params``)."""
    values = {name: body.get(name) for name in prompt_fields}
    if "messages" in values:  # a chat request is one prompt
        count = None if values["messages"] is None else 1
    elif "prompt" in values:  # OpenAI completions: strings are text, anything else token ids
        prompt = values["prompt"]
        textual = isinstance(prompt, str) or (isinstance(prompt, list) and prompt and isinstance(prompt[0], str))
        count = prompt_count(text=prompt) if textual else prompt_count(input_ids=prompt)
    else:
        count = prompt_count(values.get("text"), values.get("input_ids"), values.get("input_embeds"))
    if count is None:
        return None
    field = next(name for name in prompt_fields if values.get(name) is not None)
    n = body
    for part in n_field.split("."):
        n = n[0] if isinstance(n, list) and n else n
        n = n.get(part) if isinstance(n, Mapping) else None
    n = n if isinstance(n, int) and not isinstance(n, bool) and n >= 1 else 1
    return batch_problem(count, n, limits, field, n_field)


def stop_regex_problem(patterns: Iterable[str], limits: RequestLimits, field: str = "sampling_params.stop_regex") -> str | None:
    """Why one request's ``stop_regex`` patterns (every prompt's, repeats counted once) are too
    many or too long, or None. Checked before any of them is parsed or compiled."""
    distinct = list(dict.fromkeys(p for p in patterns if isinstance(p, str)))
    if len(distinct) > limits.max_stop_regexes:
        return (f"{field}: {len(distinct)} distinct patterns in one request, over the limit of "
                f"{limits.max_stop_regexes} ({limits.shown('max_stop_regexes')})")
    chars = sum(len(p) for p in distinct)
    if chars > limits.max_stop_regex_chars:
        return (f"{field}: {chars} characters of patterns in one request, over the limit of "
                f"{limits.max_stop_regex_chars} ({limits.shown('max_stop_regex_chars')})")
    return None


def stop_regexes_of(sampling_params) -> list[str]:
    """Every ``stop_regex`` pattern in one request's sampling params (a dict, or a list of them)."""
    found: list[str] = []
    for params in sampling_params if isinstance(sampling_params, list) else [sampling_params]:
        value = params.get("stop_regex") if isinstance(params, Mapping) else None
        if isinstance(value, str):
            found.append(value)
        elif isinstance(value, list):
            found += [v for v in value if isinstance(v, str)]
    return found


def body_size_problem(size: int, limits: RequestLimits, declared: bool) -> str:
    """The refusal of a body of ``size`` bytes (``declared``: its Content-Length; else the bytes
    read so far, the body being longer)."""
    amount = f"{size} bytes" if declared else f"more than {limits.max_body_bytes} bytes"
    return (f"body: {amount}, over the limit of {limits.max_body_bytes} bytes "
            f"({limits.shown('max_body_bytes')})")


def stop_regex_entry_bytes(pattern: str, max_mem: int) -> int:
    """What one compiled pattern may hold at most, as the compiled-pattern caches count it: RE2's
    ``max_mem`` for the program and its match caches (which grow while matching, up to that budget,
    whatever the program's size), a third more for the reverse program, and the pattern's text."""
    return max_mem * RE2_MEM_FACTOR[0] // RE2_MEM_FACTOR[1] + PATTERN_COPIES * len(pattern.encode("utf-8", "replace"))
