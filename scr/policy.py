"""``ScrPolicy``: Suffix Cache Reuse behind the ``policy.api.CachePolicy`` seam.

SCR decides in two places the common seam does not cover: when a request enters the queue
(session match, diff, block plan: ``admit``) and while the request is read (the two-phase splice,
driven by ``scr.cursor.SpliceCursor`` from ``patches/scr_runtime.py``). ``plan`` is the seam's
view of a request: resume where SGLang's prefix tree resumes, read the rest; relocation happens
inside that read. Pure Python: no SGLang, no torch.
"""

from __future__ import annotations

from typing import ClassVar, Mapping, Sequence

from policy.api import Arrival, Plan, Release
from policy.radix import tree_hit_plan
from scr.config import ScrConfig, parse_request_knobs
from scr.intercept import Intercept, intercept
from scr.sessions import SessionTable


class ScrPolicy:
    name: ClassVar[str] = "scr"
    config_class: ClassVar[type] = ScrConfig

    def __init__(self, config: ScrConfig):
        self.config = config
        self.sessions = SessionTable(config)

    # ------------------------------------------------------------------ the seam

    def plan(self, arrival: Arrival) -> Plan:
        return tree_hit_plan(arrival)

    def release(self, release: Release) -> None:
        return None

    def check(self) -> None:
        self.sessions.check()

    # ------------------------------------------------------------------ SCR's own decisions

    def admit(self, tokens: Sequence[int], cache_salt: str | None) -> Intercept:
        """§4.2: attach a new request to its conversation and plan what to relocate.

        Raises ``scr.config.UnsupportedKnob`` (a ``ValueError``), before any session changes, when
        ``cache_salt`` asks for the single-phase path (§2.3 knobs ``pin``/``v6``/``lead``/``force``).
        It is not caught here: the scheduler glue fails that one request with the message, rather
        than serving it with full SCR, which the client did not ask for.
        """
        return intercept(self.sessions, tokens, parse_request_knobs(cache_salt), self.config)

    # ------------------------------------------------------------------ server settings

    def server_settings(self) -> dict[str, object]:
        """SGLang settings the splice relies on (the launcher adds or enforces them).

        One KV slot per token (relocated rows are placed row by row), and no overlap scheduling:
        the recurrent-state restore is a copy issued from the scheduler, which must not race the
        previous forward (``scr_spec.md`` §9.6; the authors leave overlap on).
        """
        return {"page_size": 1, "disable_overlap_schedule": True}

    def server_defaults(self) -> dict[str, object]:
        """Added only when the command line does not set them: the authors' ``serve.py`` turns on
        request logging (``Finish:`` lines, metadata only) so their report can read the log."""
        return {"log_requests": True, "log_requests_level": 0}

    def startup_problems(self, settings: Mapping[str, object], env: Mapping[str, str], on_cuda: bool) -> list[str]:
        """Settings SCR does not support (``scr_spec.md`` §10.1)."""
        problems = []
        if settings.get("disable_radix_cache"):
            problems.append("--disable-radix-cache: SCR runs phase 1 on the radix cache's prefix")
        chunk = settings.get("chunked_prefill_size")
        if chunk is None or chunk <= 0:
            problems.append("chunked prefill is off: the two-phase splice needs --chunked-prefill-size > 0")
        if (settings.get("tp_size") or 1) > 1:
            problems.append("--tp-size > 1: each rank would decide splices on its own (unsupported, as upstream)")
        if settings.get("enable_hierarchical_cache"):
            problems.append("--enable-hierarchical-cache: plans would be consumed at enqueue (unsupported, as upstream)")
        if settings.get("speculative_algorithm"):
            problems.append("speculative decoding: relocated prefixes are untested with draft models")
        return problems
