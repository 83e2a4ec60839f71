"""LLM-as-judge for BCP answers: grader prompts, a strict parser, a cached client (docs/eval.md §1.8).

Templates. BCP ships two graders (§1.8): BrowseComp's original and the BCP repo's default; both
ask for ``extracted_final_answer``, ``reasoning``, ``correct: yes/no`` and ``confidence`` (100 if
the response gives none). :data:`TEMPLATES` holds our own wording of each, written from that
description (no upstream text is copied): ``"bcp"`` (default) accepts semantic equivalence,
string variants and more precise answers whose extra detail is right, and asks the judge to
repeat the correct answer; ``"browsecomp"`` looks only for meaningful differences with a small
numeric tolerance. For parity with the published prompts pass their text as ``template=`` (any
string with ``{question}``, ``{response}`` and ``{correct_answer}``).

Decoding. The CLM paper's judge is Qwen3.5-27B at temperature 0 (§1.8 [R]); the BCP default is
Qwen3-32B at T=0.7 with thinking off. Here: temperature 0, ``max_tokens`` 4096, and
``chat_template_kwargs.enable_thinking = False`` unless configured [U for the paper]. The judge
runs on its own endpoint, never on the server under test (§5.4 step 6), and sees only
(question, response, correct answer).

Parser (:func:`parse_judgment`). Labels may be written ``**label:**``, ``**label**:`` or
``label:`` (BCP's three forms), optionally after a list bullet; a value runs to the next label (the repeated
``[correct_answer]:`` the BCP grader asks for is a label too, so it ends the extracted answer).
Text up to the last ``</think>`` is ignored. It raises :class:`JudgmentParseError` when the
verdict is missing, not yes/no, or given twice with different values, or when a confidence is
present but not a number; confidence is clipped to [0, 100] and is 100 when absent (§1.8).
:meth:`Judge.judge` turns a parse error into a result with ``error`` set, which scores as wrong
(§1.9).

Cache. Judgments are appended to a JSONL file keyed by sha256 of (question, response, correct
answer, judge model) plus the template text and decoding settings, so a rerun never calls the
judge again for the same input and a changed template is never served an old verdict. The raw
judge text is stored and re-parsed on a hit.
"""
# Spec: docs/eval.md

from __future__ import annotations

import hashlib
import json
import re
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from eval import http

BCP_TEMPLATE = """\
You are grading a response to a question against the question's correct answer.

[question]: {question}

[response]: {response}

[correct_answer]: {correct_answer}

Grade the response only against [correct_answer]. Do not solve the question yourself and do not \
use outside knowledge. Write your judgment in exactly this format:

extracted_final_answer: the final exact answer taken from [response], or None if the response \
gives no final answer.

[correct_answer]: repeat the correct answer given above.

reasoning: explain whether extracted_final_answer matches [correct_answer]. It matches when it is \
semantically equivalent, when it differs only in form (spelling variants, abbreviations, \
formatting, units written differently), or when it is more precise or more detailed than \
[correct_answer] and the extra detail is right. It does not match when it differs in substance, \
is vague or ambiguous, or names several candidates.

correct: yes if extracted_final_answer matches [correct_answer] as described above, otherwise no.

confidence: the confidence score between 0% and 100% stated in [response], or 100 if the response \
states none.
"""

BROWSECOMP_TEMPLATE = """\
Decide whether the response below answers the question correctly, using the correct answer as \
the reference.

[question]: {question}

[response]: {response}

[correct_answer]: {correct_answer}

Reply in exactly this format:

extracted_final_answer: the final exact answer stated in [response], copied as written, or None \
if there is none.

reasoning: compare extracted_final_answer with [correct_answer], looking only for meaningful \
differences. Do not re-solve the question or argue for a different answer. A numerical answer \
within a small margin of [correct_answer] counts as matching; any other inconsistency, ambiguity \
or non-equivalence counts as a difference.

correct: yes if extracted_final_answer matches [correct_answer] up to the allowance above, \
otherwise no.

confidence: the confidence score between 0% and 100% given in [response], or 100 if none is given.
"""

TEMPLATES = {"bcp": BCP_TEMPLATE, "browsecomp": BROWSECOMP_TEMPLATE}
_PLACEHOLDER = re.compile(r"\{(question|response|correct_answer)\}")
_LABEL = re.compile(
    r"^[ \t]*(?:(?:[-+]|\d+[.)])[ \t]+)?(?:\*\*)?[ \t]*\[?"
    r"(?P<name>extracted[_ ]final[_ ]answer|correct[_ ]answer|reasoning|correct|confidence)"
    r"\]?[ \t]*(?:\*\*)?[ \t]*:[ \t]*(?:\*\*)?",
    re.IGNORECASE | re.MULTILINE,
)
_VERDICT = re.compile(r"^(yes|no)\b", re.IGNORECASE)
_NUMBER = re.compile(r"^[-+]?\d+(?:\.\d+)?")


class JudgmentParseError(ValueError):
    """The judge's reply does not follow the grader format."""


class JudgeError(RuntimeError):
    """The judge endpoint returned something that is not a chat completion."""


@dataclass(frozen=True)
class Judgment:
    correct: bool
    extracted_answer: str | None
    confidence: float
    reasoning: str


@dataclass(frozen=True)
class JudgeResult:
    judgment: Judgment | None
    raw: str
    error: str | None
    cached: bool
    key: str

    @property
    def correct(self) -> bool:
        """Parse errors count as wrong (§1.9)."""
        return self.judgment is not None and self.judgment.correct

    @property
    def confidence(self) -> float | None:
        return self.judgment.confidence if self.judgment is not None else None


def render(template: str, question: str, response: str, correct_answer: str) -> str:
    """Fill the three placeholders in one pass (braces inside the response stay as written)."""
    values = {"question": question, "response": response, "correct_answer": correct_answer}
    missing = [k for k in values if "{" + k + "}" not in template]
    if missing:
        raise ValueError(f"template lacks placeholder(s) {missing}")
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], template)


def _clean(value: str) -> str:
    return value.strip().strip("*").strip()


def _sections(text: str) -> dict[str, list[str]]:
    matches = list(_LABEL.finditer(text))
    out: dict[str, list[str]] = {}
    for m, nxt in zip(matches, matches[1:] + [None]):
        name = m.group("name").lower().replace(" ", "_")
        out.setdefault(name, []).append(_clean(text[m.end(): nxt.start() if nxt else len(text)]))
    return out


def _verdict(values: list[str]) -> bool:
    verdicts = set()
    for v in values:
        m = _VERDICT.match(v.strip("*_`'\"[]() \t\n"))
        if not m:
            raise JudgmentParseError(f"verdict {v[:40]!r} is not yes/no")
        verdicts.add(m.group(1).lower() == "yes")
    if len(verdicts) != 1:
        raise JudgmentParseError("conflicting verdicts")
    return verdicts.pop()


def _confidence(values: list[str]) -> float:
    if not values:
        return 100.0
    numbers = set()
    for v in values:
        m = _NUMBER.match(v.strip("*_`'\"[]() \t\n"))
        if not m:
            raise JudgmentParseError(f"confidence {v[:40]!r} is not a number")
        numbers.add(min(100.0, max(0.0, float(m.group(0)))))
    if len(numbers) != 1:
        raise JudgmentParseError("conflicting confidences")
    return numbers.pop()


def parse_judgment(text: str) -> Judgment:
    """Parse a grader reply; raises JudgmentParseError on anything not in the format."""
    if "</think>" in text:
        text = text.rsplit("</think>", 1)[1]
    elif "<think>" in text:
        raise JudgmentParseError("unterminated <think> block")
    sections = _sections(text)
    if "correct" not in sections:
        raise JudgmentParseError("no 'correct:' verdict")
    extracted = sections.get("extracted_final_answer")
    return Judgment(
        correct=_verdict(sections["correct"]),
        extracted_answer=extracted[0] if extracted else None,
        confidence=_confidence(sections.get("confidence", [])),
        reasoning="\n".join(sections.get("reasoning", [])),
    )


def chat_completions_url(url: str) -> str:
    url = url.rstrip("/")
    if url.endswith("/chat/completions"):
        return url
    return url + ("/chat/completions" if url.endswith("/v1") else "/v1/chat/completions")


def http_post(url: str, timeout: float = 600.0) -> Callable[[dict], dict]:
    """A ``post`` for :class:`Judge` that sends the payload to an OpenAI-compatible server."""
    endpoint = chat_completions_url(url)

    def post(payload: dict) -> dict:
        return http.post_json(endpoint, payload, timeout)

    return post


class Judge:
    """Grades (question, response, correct answer) with a judge model; verdicts cached on disk."""

    def __init__(self, post: Callable[[dict], dict] | str, model: str, cache_path: Path | None, *,
                 template: str = "bcp", max_tokens: int = 4096, temperature: float = 0.0,
                 enable_thinking: bool | None = False):
        self._post = http_post(post) if isinstance(post, str) else post
        self.model = model
        self.template = TEMPLATES.get(template, template)
        render(self.template, "", "", "")  # fail now on a template without placeholders
        self.decoding = {"temperature": temperature, "max_tokens": max_tokens, "enable_thinking": enable_thinking}
        self.cache_path = Path(cache_path) if cache_path is not None else None
        self._lock = threading.Lock()
        self._cache = self._load_cache()
        self.num_calls = 0

    def _load_cache(self) -> dict[str, str]:
        cache: dict[str, str] = {}
        if self.cache_path is None or not self.cache_path.is_file():
            return cache
        for lineno, line in enumerate(self.cache_path.read_text(encoding="utf-8").splitlines(), 1):
            try:
                row = json.loads(line)
                cache[row["key"]] = row["raw"]
            except (json.JSONDecodeError, KeyError, TypeError):
                warnings.warn(f"{self.cache_path}:{lineno}: unreadable cache line skipped")
        return cache

    def key(self, question: str, response: str, correct_answer: str) -> str:
        parts = [question, response, correct_answer, self.model, self.template, self.decoding]
        return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()

    def payload(self, prompt: str) -> dict:
        body = {"model": self.model, "messages": [{"role": "user", "content": prompt}],
                "temperature": self.decoding["temperature"], "max_tokens": self.decoding["max_tokens"]}
        if self.decoding["enable_thinking"] is not None:
            body["chat_template_kwargs"] = {"enable_thinking": self.decoding["enable_thinking"]}
        return body

    def judge(self, question: str, response: str, correct_answer: str) -> JudgeResult:
        key = self.key(question, response, correct_answer)
        with self._lock:
            raw = self._cache.get(key)
        cached = raw is not None
        if not cached:
            raw = self._call(render(self.template, question, response, correct_answer))
            self._store(key, raw)
        try:
            return JudgeResult(parse_judgment(raw), raw, None, cached, key)
        except JudgmentParseError as exc:
            return JudgeResult(None, raw, str(exc), cached, key)

    def _call(self, prompt: str) -> str:
        reply = self._post(self.payload(prompt))
        self.num_calls += 1
        try:
            content = reply["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            raise JudgeError(f"not a chat completion: {str(reply)[:200]}") from None
        return content or ""

    def _store(self, key: str, raw: str) -> None:
        with self._lock:
            self._cache[key] = raw
            if self.cache_path is not None:
                self.cache_path.parent.mkdir(parents=True, exist_ok=True)
                with self.cache_path.open("a", encoding="utf-8") as f:
                    f.write(json.dumps({"key": key, "model": self.model, "raw": raw}) + "\n")
