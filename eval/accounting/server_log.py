"""Per-request provenance from a server log (plain SGLang, the patched server, or SCR).

The log is the interface here, so its lines are listed in full. The line formats and their
parser live in ``scr/authors_log.py`` (one template per line, shared with the server side);
this module applies the report rules (``docs/scr.md`` §12, ``docs/eval.md`` §2.6.3, §5.6).

Lines read (any text before them, such as ``[2026-01-01 12:00:00 TP0] ``, is ignored):

* SGLang's request logger, with ``--log-requests --log-requests-level 0``::

      Finish: obj=GenerateReqInput(rid='<rid>', ...), out={'meta_info': {'id': '<rid>', ...,
      'prompt_tokens': P, ..., 'completion_tokens': D, 'cached_tokens': C, ...}}

  One per finished request. The first per rid is kept (rows are in ``Finish`` order); a second
  one for the same rid is a rid collision and fails check L1. The ``'id'`` is a Python string
  literal (quotes and escapes as ``repr`` writes them) and is read with ``literal_eval``.

Rids in the ``[kvreuse]`` lines are percent-encoded where they hold a space, ``%``, a line break
or anything outside printable ASCII (``odd rid`` -> ``odd%20rid``; ``scr.authors_log.escape_word``)
and decoded on reading, so every rid joins its ``Finish`` line; ordinary ids are written as they are.
Every record of the server is one line (``patches/log_guard.py``): no request field starts a line.

The three SCR lines are read as permissively as the authors' ``analysis/scr_report.py`` reads
them (``scr.authors_log.parse_report_line``): only the fields named below in ``<>`` are needed,
in that order, and any text may stand between them. A line that carries one of their markers
(``[kvreuse-site] ``, ``[kvreuse] v6 splice OK``, ``[kvreuse] kv6trace ev=req ``) but lacks
those fields stops the ingestion with ``LogLineError`` naming the line; all other ``[kvreuse]``
lines are skipped.

* SCR's splice line, one per relocated block (``docs/scr.md`` §11.3)::

      [kvreuse] v6 splice OK: rid=<rid> sid=<sid> slot=<n> A+B'=<stop> C'=<rows> extend=<n>
      live=<P> [spliced=<count> tokens=<total>] blocks=<i>/<n>

  ``spliced``/``tokens`` are the process's running count of splices and of relocated rows, so
  consecutive lines must step by 1 and by ``C'`` (a new process starts again at 1); ``i`` runs
  1, 2, ... within a request. A dropped line breaks one of the two (check L1). A line without
  the counters (or the block index) is counted but not checked for gaps.
* SCR's request trace (``KVREUSE_TRACE=1``, §11.2), first per rid: the session id::

      [kvreuse] kv6trace ev=req rid=<rid> sid=<sid> slot=<n|None> n_new=<P> n_old=<n> nsess=<n> tag='...'

* SCR's banner (§11.1), first one: K = ``max_blocks``; booleans ``True``/``False`` (the
  authors') or ``1``/``0`` (this port's earlier banners)::

      [kvreuse-site] v6.10 splice-after-extend patches applied ... max_blocks=<K> ... splice_retry=<n>

* The patched server's start line, which names the policy and its settings (a Python dict)::

      cache policy <name> started with config {'max_blocks': 6, ...}

  Without it the policy is ``scr`` when the banner is there, else ``radix`` (stock SGLang is
  the radix policy); ``--policy`` overrides. K is the banner's ``max_blocks``, else this
  config's ``max_blocks``.

Per request: M = sum of C' over its splice lines, blocks = their count; R = C - 2·M, because
SGLang's ``cached_tokens`` counts every relocated row twice under SCR (once through the prefix
length, once by SCR's own increment; ``moved_count_in_cached=1`` for a server that counts them
once); F = P - R - M; D = completion tokens. The conversation is the rid up to its last ``.``,
else the SCR session, else the rid; the class compares R with the conversation's previous prompt
(``provenance.classify``).

Log checks (``check_log``): L1 the log is whole (no rid finishes twice, splice counters without
gaps, block indices 1..k in order, no splice line of a request that never finished); S2 every
request relocated at most K blocks (K from the banner, or ``max_blocks``; relocation with K
unknown fails).
"""
# Spec: docs/scr.md

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from typing import Iterable

from eval.accounting.provenance import QWEN36_27B_PAIR_FLOPS, Row, Served, classify_rows, conversation_of
from scr.authors_log import LogLineError, parse_report_line

_POLICY_LINE = re.compile(r"cache policy (\S+) started with config (.*)$")


@dataclass
class ParsedLog:
    finishes: list[dict] = field(default_factory=list)  # first Finish per rid, in log order
    duplicate_finishes: dict[str, int] = field(default_factory=dict)  # rid -> Finish lines seen
    splices: dict[str, list[dict]] = field(default_factory=dict)  # rid -> its splice lines, in order
    traces: dict[str, dict] = field(default_factory=dict)  # rid -> first kv6trace ev=req
    banner: dict | None = None  # first [kvreuse-site] line
    policy: str | None = None  # from "cache policy NAME started"
    policy_config: dict = field(default_factory=dict)  # that line's config
    problems: list[str] = field(default_factory=list)  # L1 failures found while reading


def parse_log(lines: Iterable[str]) -> ParsedLog:
    """Read a server log (the lines in the module doc); ``lines`` may be an open file.

    Raises ``LogLineError`` naming the file (when ``lines`` has a ``name``), the line number and
    its text for a recognised SCR line that cannot be read.
    """
    parsed = ParsedLog()
    seen: set[str] = set()
    counter: tuple[int, int] | None = None  # (spliced, tokens) of the previous splice line
    source = getattr(lines, "name", "server log")
    for number, line in enumerate(lines, 1):
        if parsed.policy is None and "cache policy " in line:
            _read_policy_line(line, parsed)
        try:
            item = parse_report_line(line)
        except LogLineError as exc:
            raise LogLineError(f"{source} line {number}: {exc}") from None
        if item is None:
            continue
        kind = item["kind"]
        if kind == "finish":
            rid = item["rid"]
            if rid in seen:
                parsed.duplicate_finishes[rid] = parsed.duplicate_finishes.get(rid, 1) + 1
                continue
            seen.add(rid)
            parsed.finishes.append(item)
        elif kind == "splice_ok":
            item["line"] = number
            parsed.splices.setdefault(item["rid"], []).append(item)
            if item["spliced"] is not None:
                counter = _step_counter(counter, item, parsed.problems)
        elif kind == "trace_req":
            parsed.traces.setdefault(item["rid"], item)
        elif kind == "scr_site" and parsed.banner is None:
            parsed.banner = item
    return parsed


def _read_policy_line(line: str, parsed: ParsedLog) -> None:
    found = _POLICY_LINE.search(line.rstrip("\r\n"))
    if found:
        parsed.policy = found.group(1)
        try:
            config = ast.literal_eval(found.group(2))
        except (ValueError, SyntaxError):
            config = {}
        parsed.policy_config = config if isinstance(config, dict) else {}


def _step_counter(previous: tuple[int, int] | None, item: dict, problems: list[str]) -> tuple[int, int]:
    spliced, tokens, rows = item["spliced"], item["spliced_tokens"], item["relocated"]
    if spliced == 1 and tokens == rows:
        return spliced, tokens  # the first splice of a (new) server process
    where = f"line {item['line']} (rid {item['rid']})"
    if previous is None:
        problems.append(f"L1 {where}: first splice line has spliced={spliced}: earlier splice lines are missing")
    elif (spliced, tokens) != (previous[0] + 1, previous[1] + rows):
        problems.append(f"L1 {where}: splice counters spliced={spliced} tokens={tokens} do not follow "
                        f"spliced={previous[0]} tokens={previous[1]} + C'={rows}: a splice line is missing")
    return spliced, tokens


def rows_from_log(parsed: ParsedLog, body_params: float, pair_flops: int = QWEN36_27B_PAIR_FLOPS, *,
                  policy: str | None = None, moved_count_in_cached: int = 2) -> list[Row]:
    name = policy or parsed.policy or ("scr" if parsed.banner else "radix")
    served = []
    for finish in parsed.finishes:
        rid = finish["rid"]
        splices = parsed.splices.get(rid, [])
        moved = sum(s["relocated"] for s in splices)
        session = parsed.traces.get(rid, {}).get("sid", "")
        reused = finish["cached_tokens"] - moved_count_in_cached * moved
        prompt = finish["prompt_tokens"]
        served.append(Served(
            rid=rid, policy=name, conversation=conversation_of(rid, session or None), prompt_tokens=prompt,
            prefix_reused=reused, moved=moved, read=prompt - reused - moved, decode=finish["completion_tokens"],
            blocks=len(splices), cached_tokens=finish["cached_tokens"], session=session,
        ))
    return classify_rows(served, body_params, pair_flops)


def max_blocks(parsed: ParsedLog, override: int | None = None) -> int | None:
    """K: the command line's value, else the banner's, else the policy config's."""
    if override is not None:
        return override
    if parsed.banner:
        return parsed.banner["max_blocks"]
    k = parsed.policy_config.get("max_blocks")
    return k if isinstance(k, int) else None


def _blocks_out_of_order(splices: list[dict]) -> bool:
    """The block indices ``i/n`` of one request's splice lines are not 1, 2, ... (a line missing or
    repeated). Lines without an index, which the report does not need, are not judged."""
    indices = [s["block"] for s in splices]
    totals = [s["num_blocks"] for s in splices]
    if None in indices or None in totals:
        return False
    return indices != list(range(1, len(splices) + 1)) or any(total < len(splices) for total in totals)


def check_log(parsed: ParsedLog, k: int | None = None) -> list[str]:
    """L1 and S2 (see the module doc); every failure as ``"<id> <what>"``."""
    failures = list(parsed.problems)
    for rid, count in parsed.duplicate_finishes.items():
        failures.append(f"L1 {rid}: {count} Finish lines for one rid (rid collision or a repeated line)")
    finished = {f["rid"] for f in parsed.finishes}
    k = max_blocks(parsed, k)
    for rid, splices in parsed.splices.items():
        if rid not in finished:
            failures.append(f"L1 {rid}: {len(splices)} splice line(s) but no Finish line")
        if _blocks_out_of_order(splices):
            listed = " ".join("{}/{}".format(s["block"], s["num_blocks"]) for s in splices)
            failures.append(f"L1 {rid}: splice blocks {listed} are not 1, 2, ... in order: "
                            "a splice line is missing or repeated")
        if k is not None and len(splices) > k:
            failures.append(f"S2 {rid}: {len(splices)} blocks relocated > K = {k}")
    if k is None and parsed.splices:
        failures.append(f"S2 {len(parsed.splices)} request(s) relocated blocks but K is unknown "
                        "(no [kvreuse-site] banner in the log; pass --max-blocks)")
    return failures
