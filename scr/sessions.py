"""Conversation sessions: content matching, LRU, side-slot ownership (``docs/scr.md`` §4, §5.1, §5.2).

SCR attaches a request to a conversation by content, not by id (the CLM agent sends neither rid
nor salt). A session remembers the conversation's previous prompt (to diff against) and, once it
holds a side-buffer slot, the token ids of the K/V rows stored there. Everything here is plain
data over token lists; the executor owns the tensors and copies what ``finish`` tells it to.

Namespaces: a session belongs to the ``cache_salt``/``extra_key`` of the request that created it
(None for unsalted requests). Matching only ever looks at sessions of the request's own namespace,
so different salts never share a session, a side slot or a recurrent-state snapshot.

Side slots are indices ``0 .. side_sessions-1``. The recurrent-state shadow uses the same index
(§9.1), so a session needs a slot to hold either.

Positions are not stored: the spec's ``positions`` list is always ``0 .. len-1`` (§6.3), so the
old position of side row ``k`` is ``k``.
"""
# Spec: docs/scr.md

from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import Iterator, Sequence

from policy.tokens import common_prefix_len
from scr.settings import ScrConfig
from scr.side import SlotList, copy_range


@dataclass(slots=True)
class Session:
    """One tracked conversation (§4.1). Owned by ``SessionTable``: read it, change it through the table."""

    sid: str  # "s" + 6-digit per-table counter
    key: str | None  # namespace: the request's cache_salt / extra_key
    token_ids: tuple[int, ...] = ()  # previous prompt (no reply); empty = can never match again
    side_slot: int | None = None
    n_side: int = 0  # rows stored in the side slot
    side_ids: tuple[int, ...] = ()  # token ids of those rows: previous prompt + reply, committed
    state_tokens: int = -1  # tokens the saved recurrent state covers; -1 = none or stale
    inflight: int = 0  # requests of this conversation currently in the engine
    identity: str | None = None  # the conversation the requests named (``session_identity``), None: by content


@dataclass(frozen=True, slots=True)
class MatchReport:
    """Outcome of ``SessionTable.match_report``, with the counts of the authors' ``match:`` debug line."""

    session: Session | None
    reason: str  # "matched" | "no_candidate" | "below_floor" | "ambiguous" | "identity" (named by the request)
    candidates: int = 0  # same namespace, non-empty previous prompt
    short: int = 0  # common prefix below match_min_tokens
    weak: int = 0  # prefix share and overlap both low
    slotted: int = 0  # competed (held a side slot)
    best_ratio: float = 0.0  # the winner's overall overlap (0 when none competed)
    best_unslotted: float = 0.0  # best overlap among passing sessions without a slot


@dataclass(frozen=True, slots=True)
class Dropped:
    """A session's private data was released (§4.5): ``side_slot`` (if any) is free again."""

    sid: str
    side_slot: int | None
    n_side: int
    evicted: bool  # removed from the table (LRU) rather than only cleared


@dataclass(frozen=True, slots=True)
class SessionAdmission:
    """What ``admit`` did for one request (§4.2 steps 4-7)."""

    session: Session
    created: bool
    previous_tokens: tuple[int, ...]  # the old prompt to diff against; n_old = len()
    num_sessions: int  # table size after find/create, before eviction (``nsess=`` of the trace)
    evicted: tuple[Dropped, ...]
    match: MatchReport


@dataclass(frozen=True, slots=True)
class Store:
    """What to copy into the side buffer at a release (§5.2)::

        committed  |0 ........ keep|keep ......... end|end ...... len(committed)|
                    already stored   copy pool KV       beyond side_tokens: the
                    (same token ids) src[keep:end] ->   conversation is dropped
                                     slot rows [keep,end)

    ``slot`` is None when nothing is copied (no slot free, or oversize); ``dropped`` is then set.
    """

    sid: str
    slot: int | None
    keep: int
    end: int
    prev: int  # n_side before this store
    acquired: bool  # the slot was taken from the free list by this store
    dropped: Dropped | None
    reason: str  # "stored" | "no_free_slot" | "oversize"


class SessionTable:
    """Sessions of one scheduler process, in LRU order (oldest first), and who holds which side slot.

    Slots come from ``scr.side.SlotList`` (first free slot out, released slots to the back, §5.1).
    """

    def __init__(self, config: ScrConfig):
        self._config = config
        self._sessions: OrderedDict[str, Session] = OrderedDict()
        self._next_id = 1
        self._slots = SlotList(config.side_sessions)
        self._held = 0

    def __len__(self) -> int:
        return len(self._sessions)

    def __iter__(self) -> Iterator[Session]:
        return iter(list(self._sessions.values()))

    def get(self, sid: str) -> Session | None:
        return self._sessions.get(sid)

    @property
    def free_slots(self) -> tuple[int, ...]:
        return tuple(self._slots.free)

    @property
    def held(self) -> int:
        """Side rows currently stored, over all slots."""
        return self._held

    def owner(self, slot: int) -> str | None:
        """Session holding ``slot``, for the guard before a relocation (§7.5 step 5); None when free."""
        return self._slots.owner.get(slot)

    def generation(self, slot: int) -> int:
        """How many times ``slot`` was acquired: a plan pins it with the slot (``scr.side.SlotList``)."""
        return self._slots.generation[slot]

    def holds(self, sid: str, slot: int | None, generation: int) -> bool:
        """True when session ``sid`` still holds the very slot acquisition a plan pinned: same
        owner, same slot, no release in between. A relocation or restore needs this (tenant isolation)."""
        session = self._sessions.get(sid)
        return (slot is not None and session is not None and session.side_slot == slot
                and self._slots.owner.get(slot) == sid and self._slots.generation[slot] == generation)

    def match(self, tokens: Sequence[int], namespace: str | None) -> Session | None:
        """The session ``tokens`` continues, or None (§4.3). Pure: nothing changes."""
        return self.match_report(tokens, namespace).session

    def match_report(self, tokens: Sequence[int], namespace: str | None) -> MatchReport:
        """``match`` with the counts behind the decision (§4.3). Pure. Sessions that a request named
        (``identity``) are not candidates: their conversation says which requests belong to them."""
        cfg = self._config
        window = tokens[: cfg.match_window]
        # The new prompt's count table is built once per request, not per candidate.
        new_counts = Counter(tokens)
        counts = Counter()
        best: Session | None = None
        best_key = (0, 0.0)
        best_unslotted = 0.0
        for session in self._sessions.values():
            # None matches only None: a salt never sees another salt's sessions.
            if session.key != namespace or not session.token_ids or session.identity is not None:
                continue
            counts["candidates"] += 1
            verdict, n, r_all = self._score(session.token_ids, window, new_counts, len(tokens))
            if verdict:
                counts[verdict] += 1
            elif session.side_slot is None:
                # Without a slot there is nothing private to reuse; it only counts for ambiguity.
                best_unslotted = max(best_unslotted, r_all)
            else:
                counts["slotted"] += 1
                # Largest common prefix wins, then larger overlap; a full tie keeps the older session.
                if (n, r_all) > best_key:
                    best, best_key = session, (n, r_all)
        return self._decide(best, best_key[1], best_unslotted, counts)

    def _score(self, old: Sequence[int], window: Sequence[int], new_counts: Counter, new_len: int):
        """One candidate (§4.3 steps 1-5) -> (verdict, n, r_all); verdict "short", "weak" or "" (passes)."""
        cfg = self._config
        n = common_prefix_len(old[: cfg.match_window], window)
        if n < cfg.match_min_tokens:
            return "short", n, 0.0
        r_pre = n / len(old)
        r_all = _quick_ratio(old, new_counts, new_len)
        # Weak only if both are low: a long shared prefix or a high overall overlap keeps it.
        if r_pre < cfg.match_min_prefix_frac and r_all < cfg.match_min_overlap:
            return "weak", n, r_all
        return "", n, r_all

    def _decide(self, best: Session | None, best_ratio: float, best_unslotted: float, counts: Counter) -> MatchReport:
        """The floor and ambiguity tests on the winner (§4.3, after the loop)."""
        cfg = self._config
        report = dict(counts, best_ratio=best_ratio, best_unslotted=best_unslotted)
        if best is None:
            return MatchReport(None, "no_candidate", **report)
        if best_ratio < cfg.match_min_ratio:
            return MatchReport(None, "below_floor", **report)
        # A clearly better conversation without a slot means this prompt may belong to it instead.
        if best_unslotted > best_ratio + cfg.match_ambig_margin:
            return MatchReport(None, "ambiguous", **report)
        return MatchReport(best, "matched", **report)

    def by_identity(self, namespace: str | None, identity: str) -> MatchReport:
        """The session the request names (``session_identity`` is not "content"), or none yet."""
        for session in self._sessions.values():
            if session.key == namespace and session.identity == identity:
                return MatchReport(session, "identity", candidates=1)
        return MatchReport(None, "no_candidate")

    def admit(self, tokens: Sequence[int], namespace: str | None, identity: str | None = None) -> SessionAdmission:
        """Attach a new request to its session (§4.2 steps 4-7); mutates the table.

        Finds the session (or creates one), makes it the newest, stores ``tokens`` as its prompt
        (the spec stores it at the end of the intercept on every path; nothing in between reads
        it), counts the request in flight, then evicts over ``max_sessions`` (§4.4). Not called
        for ``kvreuse:off`` requests. ``identity``: the conversation the request names
        (``request_identity``); its session is found by that name, never by content.
        """
        report = self.by_identity(namespace, identity) if identity is not None else self.match_report(tokens, namespace)
        session = report.session
        created = session is None
        if session is None:
            session = Session(sid=f"s{self._next_id:06d}", key=namespace, identity=identity)
            self._next_id += 1
            self._sessions[session.sid] = session
        else:
            self._sessions.move_to_end(session.sid)
        previous = session.token_ids
        num_sessions = len(self._sessions)
        session.token_ids = tuple(tokens)
        session.inflight += 1
        evicted = self._evict(keep=session.sid)
        return SessionAdmission(session, created, previous, num_sessions, evicted, report)

    def _evict(self, keep: str) -> tuple[Dropped, ...]:
        """Drop the oldest idle sessions while over ``max_sessions`` (§4.4).

        Sessions with a request in flight are skipped, so the cap can be exceeded for a while.
        ``keep`` (the session being admitted) is never evicted: the spec evicts before counting
        the new request in flight, which could orphan it when every older session is busy.
        """
        dropped = []
        for sid in list(self._sessions):
            if len(self._sessions) <= self._config.max_sessions:
                break
            session = self._sessions[sid]
            if sid == keep or session.inflight > 0:
                continue
            dropped.append(self._drop(session, evicted=True))
            del self._sessions[sid]
        return tuple(dropped)

    def acquire_slot(self, sid: str) -> int | None:
        """Give the session a side slot if it has none (§5.1); returns the slot, None if none is free.

        A freshly acquired slot holds nothing of this session yet: its rows and its state-shadow
        row were last written by whoever held it before, so the session's record of stored ids
        and saved state starts empty."""
        session = self._sessions[sid]
        if session.side_slot is None:
            session.side_slot = self._slots.acquire(sid)
            session.side_ids, session.n_side, session.state_tokens = (), 0, -1
        return session.side_slot

    def drop_private(self, sid: str) -> Dropped:
        """Release the session's slot and forget its prompt (§4.5); it stays in the LRU, unmatchable."""
        return self._drop(self._sessions[sid], evicted=False)

    def _drop(self, session: Session, evicted: bool) -> Dropped:
        slot, n_side = session.side_slot, session.n_side
        if slot is not None:
            self._slots.release(slot)
        self._held -= n_side
        # Everything that described the slot's content goes with it: stale side ids or a stale
        # state count would let a later slot (maybe written by another tenant) pass for this one.
        session.side_slot, session.n_side, session.token_ids = None, 0, ()
        session.side_ids, session.state_tokens = (), -1
        return Dropped(session.sid, slot, n_side, evicted)

    def set_state_tokens(self, sid: str, n_tokens: int) -> None:
        """Record how many tokens the saved recurrent state covers; -1 marks it missing or stale (§9.2)."""
        self._sessions[sid].state_tokens = n_tokens

    def finish(self, sid: str, committed: Sequence[int], store: bool = True) -> Store | None:
        """A request of this session left the engine (§5.2); mutates the table.

        ``committed`` = (prompt + output)[:kv_committed_len], the token ids whose KV the request
        holds. Counts the request out of ``inflight``; with ``store`` (the side buffer exists)
        also decides the incremental copy into the session's slot. Returns None without ``store``.
        """
        session = self._sessions[sid]
        session.inflight -= 1
        if not store:
            return None
        acquired = session.side_slot is None
        if self.acquire_slot(sid) is None:
            return Store(sid, None, 0, 0, 0, False, self._drop(session, evicted=False), "no_free_slot")
        prev = session.n_side
        # Rows below ``keep`` hold the same token ids, so their K/V is assumed identical; not compared.
        rows = copy_range(session.side_ids, prev, committed, self._config.side_tokens)
        keep, end = rows.keep, rows.end
        session.side_ids, session.n_side = tuple(committed[:end]), end
        self._held += end - prev
        if rows.oversize:
            # Longer than a slot: the conversation gets no SCR. The spec copies, then drops; the
            # copy is skipped here because the freed slot's next owner rewrites it from row 0.
            return Store(sid, None, keep, end, prev, acquired, self._drop(session, evicted=False), "oversize")
        return Store(sid, session.side_slot, keep, end, prev, acquired, None, "stored")

    def check(self) -> None:
        """Raise ``AssertionError`` if slot ownership or the held count is inconsistent."""
        owned = {s.side_slot: s.sid for s in self._sessions.values() if s.side_slot is not None}
        free = list(self._slots.free)
        assert owned == self._slots.owner, f"slot owners {self._slots.owner} != sessions' slots {owned}"
        assert not set(owned) & set(free), f"slots both owned and free: {owned} {free}"
        assert len(owned) + len(free) == self._config.side_sessions, "a side slot leaked"
        assert all(s.inflight >= 0 for s in self._sessions.values()), "a request was counted out twice"
        held = sum(s.n_side for s in self._sessions.values())
        assert held == self._held, f"held {self._held} != rows in sessions {held}"


def _quick_ratio(old: Sequence[int], new_counts: Counter, new_len: int) -> float:
    """difflib's ``SequenceMatcher(None, old, new).quick_ratio()``: 2 * |multiset intersection| / total."""
    matches = sum((Counter(old) & new_counts).values())
    total = len(old) + new_len
    return 2.0 * matches / total if total else 1.0


def request_identity(mode: str, rid: str, session_id: str | None) -> str | None:
    """The conversation a request names under ``session_identity`` = ``mode``, or None (content
    matching): SGLang's ``session_id`` field, or the rid up to its last "." (``<run>.<conv>.<turn>``
    as the replay and the BCP harness write them; ``eval.cluster`` routes on the same prefix)."""
    if mode == "session_id":
        return session_id or None
    if mode == "rid":
        return rid.rpartition(".")[0] or None
    return None
