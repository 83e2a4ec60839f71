"""Scenarios and arms of ``python -m eval.fidelity``: what is sent, under which salt.

A **scenario** is one conversation of token-id prompts: turn 1, then turns that (typically) delete
a span from the middle of the previous prompt and append new text, as an agent editing its context.
Every turn after the first is measured. An **arm** is a per-request knob salt prefix
(``scr/knobs.py`` ``parse_request_knobs``); each arm replays the whole conversation in its own
namespace.

Namespaces. A salt is also the request's namespace on the server (radix tree, SCR sessions, side
slots, state snapshots), so every arm of every scenario of every run gets a distinct salt
(``arm_salt``): a knob salt gets one more item, ``fidelity=<run>.<scenario>.<arm>``, which
``parse_request_knobs`` ignores as an unknown knob (the whole salt stays the namespace); a salt
without ``kvreuse:`` gets ``.fidelity.<tag>`` appended. ``kvreuse:off`` cannot carry a suffix (the
server matches it exactly), so every run would share its namespace and radix entries: it is refused
as an arm; a plain radix baseline belongs on a ``--cache-policy radix`` server. Cold reads use a
fresh salt per request (``cold_salt``), so nothing is reused for them.

On ``/generate`` the salt travels as ``extra_key``: SGLang 0.5.16's ``GenerateReqInput`` has no
``cache_salt`` field (the OpenAI layer folds ``cache_salt`` into ``extra_key``).
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scr.knobs import KNOB_PREFIX, UnsupportedKnob, parse_request_knobs

KNOBS_PREFIX = KNOB_PREFIX + "knobs:"
SUFFIX_KNOB = "fidelity"  # not a knob of scr/knobs.py: ignored by the server, kept in the namespace
NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
# Generated prompts use ids [10, 400), like tests/engine/prompts.py: inside the tiny model's
# 480-token tokenizer and clear of its special tokens.
TOKEN_LOW, TOKEN_HIGH = 10, 400


class ScenarioError(ValueError):
    """A scenario file (or built-in spec) that does not follow the schema; one line, with the JSON path."""


@dataclass(frozen=True)
class Arm:
    name: str
    salt: str = ""  # "" = no knobs; "kvreuse:knobs:k=v,..." = per-request knobs; other text = plain namespace

    @property
    def knobs(self) -> dict[str, Any]:
        """ScrConfig fields this arm overrides (empty: the server's settings)."""
        return dict(parse_request_knobs(self.salt).overrides) if self.salt.startswith(KNOBS_PREFIX) else {}


DEFAULT_ARMS = (
    Arm("fork"),  # no knobs: the server's ssm_mode (default fork) and re-rotation on
    Arm("none", KNOBS_PREFIX + "ssm=none"),  # relocate without restoring the recurrent state
    Arm("norerot", KNOBS_PREFIX + "rerot=0"),  # relocate without re-rotating the keys (ablation)
)


@dataclass(frozen=True)
class Scenario:
    name: str
    turns: tuple[tuple[int, ...], ...]
    arms: tuple[Arm, ...] = field(default=DEFAULT_ARMS)


def prompt_ids(seed: int, length: int) -> list[int]:
    """Deterministic ids in [10, 400), the same generator as ``tests/engine/prompts.py``."""
    rng = random.Random(seed)
    return [rng.randrange(TOKEN_LOW, TOKEN_HIGH) for _ in range(length)]


def change_kind(previous: tuple[int, ...], prompt: tuple[int, ...]) -> str:
    """``append`` when ``prompt`` extends ``previous`` unchanged, otherwise ``edited``."""
    return "append" if prompt[: len(previous)] == previous and len(prompt) >= len(previous) else "edited"


def arm_salt(arm: Arm, tag: str) -> str:
    """The arm's salt made unique by ``tag`` (``<run>.<scenario>.<arm>``), knobs unchanged."""
    if "," in tag or "=" in tag:
        raise ValueError(f"tag {tag!r} must not contain ',' or '='")
    if not arm.salt:
        return f"fidelity.{tag}"
    if arm.salt.startswith(KNOBS_PREFIX):
        sep = "" if arm.salt.endswith((":", ",")) else ","
        return f"{arm.salt}{sep}{SUFFIX_KNOB}={tag}"
    return f"{arm.salt}.fidelity.{tag}"


def cold_salt(run: str, scenario: str, turn: int) -> str:
    """A fresh namespace for one cold read: no session, no radix entry to match."""
    return f"fidelity-cold.{run}.{scenario}.{turn}"


# The built-in set, in the file schema. Every edit keeps the first >= 1024 tokens, so the server
# matches the conversation's session (docs/scr.md §4.3); the moved shares spread from ~8% to ~58%.
# Nine arm conversations (3 scenarios x 3 arms) fit the default 12 side slots on a fresh server.
DEFAULT_SPEC: dict = {
    "scenarios": [
        # tests/engine/test_scr_server.py conversation(): a middle deletion, then a late one.
        {"name": "mid", "seed": 11, "first": 2400, "edits": [
            {"delete": [[1400, 1600]], "append": 40},
            {"delete": [[1950, 2050]], "append": 40},
        ]},
        # Two deleted sections in one turn: two relocated blocks.
        {"name": "two-cuts", "seed": 31, "first": 2400, "edits": [
            {"delete": [[1300, 1400], [1900, 2000]], "append": 40},
        ]},
        # An early deletion: most of the prompt is relocated.
        {"name": "early-cut", "seed": 51, "first": 3000, "edits": [
            {"delete": [[1100, 1400]], "append": 40},
        ]},
    ],
}


def default_scenarios() -> list[Scenario]:
    return parse_spec(DEFAULT_SPEC, "built-in scenarios")


def load_scenarios(path: str | Path) -> list[Scenario]:
    """Scenarios from a JSON file (schema: ``eval/fidelity/__init__.py``); raises ``ScenarioError``."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ScenarioError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ScenarioError(f"{path}: not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    return parse_spec(data, str(path))


def parse_spec(data: Any, source: str) -> list[Scenario]:
    def fail(where: str, problem: str) -> ScenarioError:
        return ScenarioError(f"{source}: {where}: {problem}")

    if not isinstance(data, dict):
        raise fail("top level", "expected an object with a 'scenarios' list")
    unknown = set(data) - {"scenarios", "arms"}
    if unknown:
        raise fail("top level", f"unknown keys {sorted(unknown)} (expected 'scenarios', 'arms')")
    arms = _arms(data["arms"], "arms", fail) if "arms" in data else DEFAULT_ARMS
    items = data.get("scenarios")
    if not isinstance(items, list) or not items:
        raise fail("scenarios", "expected a non-empty list")
    scenarios, names = [], set()
    for i, item in enumerate(items):
        where = f"scenarios[{i}]"
        scenario = _scenario(item, where, arms, fail)
        if scenario.name in names:
            raise fail(f"{where}.name", f"{scenario.name!r} repeats")
        names.add(scenario.name)
        scenarios.append(scenario)
    return scenarios


def _name(value: Any, where: str, fail) -> str:
    if not isinstance(value, str) or not NAME_RE.match(value):
        raise fail(where, f"{value!r}: expected 1-64 characters of A-Z a-z 0-9 _ -")
    return value


def _int(value: Any, where: str, fail, low: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise fail(where, f"{value!r}: expected an integer >= {low}")
    return value


def _arms(value: Any, where: str, fail) -> tuple[Arm, ...]:
    if not isinstance(value, list) or not value:
        raise fail(where, "expected a non-empty list of {'name': ..., 'salt': ...}")
    arms, names = [], set()
    for i, item in enumerate(value):
        at = f"{where}[{i}]"
        if not isinstance(item, dict) or set(item) - {"name", "salt"} or "name" not in item:
            raise fail(at, "expected {'name': NAME, 'salt': KNOB_SALT}")
        name = _name(item["name"], f"{at}.name", fail)
        if name in names:
            raise fail(f"{at}.name", f"{name!r} repeats")
        names.add(name)
        salt = item.get("salt", "")
        if not isinstance(salt, str):
            raise fail(f"{at}.salt", f"{salt!r}: expected a string")
        problem = salt_problem(salt)
        if problem:
            raise fail(f"{at}.salt", problem)
        arms.append(Arm(name, salt))
    return tuple(arms)


def salt_problem(salt: str) -> str | None:
    """Why ``salt`` cannot be an arm's salt prefix, or None."""
    if salt.startswith(KNOB_PREFIX) and not salt.startswith(KNOBS_PREFIX):
        return (f"{salt!r}: only 'kvreuse:knobs:...' can carry the per-run suffix that keeps arms and runs "
                "apart ('kvreuse:off' is matched exactly, so all its requests would share one namespace; "
                "measure plain radix on a --cache-policy radix server)")
    try:
        knobs = parse_request_knobs(salt)
    except UnsupportedKnob as exc:
        return f"{salt!r}: {exc}"
    if knobs.ignored:
        items = "; ".join(f"{item!r}: {why}" for item, why in knobs.ignored)
        return f"{salt!r}: the server would ignore {items}"
    return None


def _scenario(item: Any, where: str, default_arms: tuple[Arm, ...], fail) -> Scenario:
    if not isinstance(item, dict):
        raise fail(where, "expected an object")
    allowed = {"name", "arms", "turns", "seed", "first", "edits"}
    unknown = set(item) - allowed
    if unknown:
        raise fail(where, f"unknown keys {sorted(unknown)}")
    if "name" not in item:
        raise fail(where, "missing 'name'")
    name = _name(item["name"], f"{where}.name", fail)
    arms = _arms(item["arms"], f"{where}.arms", fail) if "arms" in item else default_arms
    generated = {"seed", "first", "edits"} & set(item)
    if "turns" in item:
        if generated:
            raise fail(where, f"give either 'turns' or 'seed'/'first'/'edits', not both ({sorted(generated)})")
        turns = _explicit_turns(item["turns"], f"{where}.turns", fail)
    elif generated:
        turns = _generated_turns(item, where, fail)
    else:
        raise fail(where, "needs 'turns' (token-id prompts) or 'seed', 'first' and 'edits'")
    return Scenario(name, turns, arms)


def _explicit_turns(value: Any, where: str, fail) -> tuple[tuple[int, ...], ...]:
    if not isinstance(value, list) or len(value) < 2:
        raise fail(where, "expected a list of at least two prompts (turn 1, then the measured turns)")
    turns = []
    for i, prompt in enumerate(value):
        if not isinstance(prompt, list) or not prompt:
            raise fail(f"{where}[{i}]", "expected a non-empty list of token ids")
        for j, token in enumerate(prompt):
            if isinstance(token, bool) or not isinstance(token, int) or token < 0:
                raise fail(f"{where}[{i}][{j}]", f"{token!r}: expected a token id (integer >= 0)")
        turns.append(tuple(prompt))
    return tuple(turns)


def _generated_turns(item: dict, where: str, fail) -> tuple[tuple[int, ...], ...]:
    for key in ("seed", "first", "edits"):
        if key not in item:
            raise fail(where, f"missing {key!r} (a generated scenario needs 'seed', 'first' and 'edits')")
    seed = _int(item["seed"], f"{where}.seed", fail)
    first = _int(item["first"], f"{where}.first", fail, low=1)
    edits = item["edits"]
    if not isinstance(edits, list) or not edits:
        raise fail(f"{where}.edits", "expected a non-empty list of {'delete': [[start, end], ...], 'append': N}")
    turns = [tuple(prompt_ids(seed, first))]
    for k, edit in enumerate(edits, 1):
        at = f"{where}.edits[{k - 1}]"
        if not isinstance(edit, dict) or set(edit) - {"delete", "append"}:
            raise fail(at, "expected {'delete': [[start, end], ...], 'append': N}")
        previous = turns[-1]
        spans = _spans(edit.get("delete", []), f"{at}.delete", len(previous), fail)
        append = _int(edit.get("append", 0), f"{at}.append", fail)
        if not spans and not append:
            raise fail(at, "deletes nothing and appends nothing")
        kept, start = [], 0
        for lo, hi in spans:
            kept.extend(previous[start:lo])
            start = hi
        kept.extend(previous[start:])
        prompt = tuple(kept) + tuple(prompt_ids(seed + k, append))
        if not prompt:
            raise fail(at, "leaves an empty prompt")
        turns.append(prompt)
    return tuple(turns)


def _spans(value: Any, where: str, length: int, fail) -> list[tuple[int, int]]:
    """Half-open spans ``[start, end)`` of the previous turn's prompt: sorted, disjoint, inside it."""
    if not isinstance(value, list):
        raise fail(where, "expected a list of [start, end] pairs")
    spans, end_before = [], 0
    for i, span in enumerate(value):
        at = f"{where}[{i}]"
        if not (isinstance(span, list) and len(span) == 2):
            raise fail(at, f"{span!r}: expected [start, end]")
        lo, hi = (_int(v, at, fail) for v in span)
        if not lo < hi <= length:
            raise fail(at, f"[{lo}, {hi}): expected start < end <= {length} (the previous prompt's length)")
        if lo < end_before:
            raise fail(at, f"[{lo}, {hi}) overlaps or precedes the span before it")
        spans.append((lo, hi))
        end_before = hi
    return spans
