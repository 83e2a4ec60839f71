"""Value objects and the one interface every cache policy implements.

A policy never sees a tensor or an SGLang object. For each request the engine describes what
it holds (``Arrival``); the policy answers with a ``Plan`` (data), which the one executor in
``patches/`` walks; when the request leaves, the engine reports a ``Release``.

Ranges are half-open token positions in the prompt. A plan's steps cover ``[resume, len)`` in
order: each position is either read (``Read``: SGLang's "extend") or moved in from a policy's
side store (``Relocate``); ``Snapshot`` and ``Restore`` stand between them and cover nothing::

    prompt |0 ..... resume|resume .. stop|stop .. stop+rows|stop+rows .......... len(tokens)|
            reused (tree)   Read            Relocate (moved)   Read
                                            [Restore at stop+rows]

When a plan is made decides how its ``resume`` is read (``Plan.resume_limit``): a plan made at
or inside the prefix match resumes at ``resume``; a plan made when the request is queued, before
any match (SCR's), resumes wherever the tree's match ends, at most ``resume_limit`` (its first
``Read`` then starts there; past the limit its relocations are dropped, ``scr.cursor``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Mapping, Protocol, Union


@dataclass(frozen=True, slots=True)
class Arrival:
    """A request about to be scheduled, as the engine sees it."""

    rid: str
    tokens: tuple[int, ...]  # full prompt token ids
    cache_key: str | None  # namespace (cache_salt / extra_key); different keys share nothing
    tree_hit: int  # prefix length the engine's own match would serve (its deepest usable state)
    tree_match: int = 0  # longest prefix of tokens[:-1] whose KV the tree holds
    tree_states: tuple[int, ...] = ()  # depths <= tree_match on that path holding a state snapshot
    session_id: str | None = None  # the conversation the client names (SGLang's ``session_id``), if any


@dataclass(frozen=True, slots=True)
class Read:
    """Run the model over prompt positions ``[start, end)``."""

    start: int
    end: int


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Keep the recurrent state (and the KV before it) at ``at``, a position the Read before it
    reaches: its end, or (a policy whose engine keeps states inside a forward, exact's
    ``keeps=inside``) a point it crosses, ``start < at <= end``. One Read may be followed by
    several Snapshots, ascending; no two Snapshots of a plan share a position."""

    at: int
    kind: str


@dataclass(frozen=True, slots=True)
class Relocate:
    """Place ``rows`` K/V rows the policy keeps in side slot ``slot`` (its positions
    ``[source, source + rows)``) at prompt positions ``[at, at + rows)``, keys re-rotated by
    ``at - source``; the forward after them reads on from ``at + rows``."""

    at: int
    rows: int
    source: int
    slot: int

    @property
    def end(self) -> int:
        return self.at + self.rows


@dataclass(frozen=True, slots=True)
class Restore:
    """With the ``Relocate`` that ends at ``at``, replace the request's recurrent state by the one
    the policy saved in side slot ``slot`` (an approximation the policy chose: SCR's ``fork``)."""

    at: int
    slot: int


Step = Union[Read, Snapshot, Relocate, Restore]


@dataclass(frozen=True)
class Admission:
    """What a policy that plans at enqueue decided when it admitted a request, beside its steps
    (``Plan.admission``): ``kind`` names the decision (SCR: ``off``, ``cold``, ``passthrough``,
    ``no_plan``, ``plan``). A policy extends it with what its own step carrier reads (SCR:
    ``scr.intercept.Intercept``); the executor never reads it."""

    kind: str


@dataclass(frozen=True, slots=True)
class Plan:
    """What to do for one request: reuse ``[0, resume)`` from the prefix tree, then ``steps``.

    ``resume_limit``: None for a plan made at or inside the prefix match (it resumes at
    ``resume``); for a plan made at enqueue, before the match, the deepest tree hit it still holds
    for, its first ``Read`` then starting wherever the match ends.
    ``admission``: a plan made at enqueue carries what the policy decided (``Admission``) to its
    step carrier (``policy.carrier``); None for every other plan."""

    rid: str
    resume: int
    steps: tuple[Step, ...]
    resume_limit: int | None = None
    admission: Admission | None = None

    def validate(self, prompt_len: int) -> None:
        """Raise ``ValueError`` unless the Read and Relocate steps tile ``[resume, prompt_len)`` in
        order, each Snapshot follows (directly or after other Snapshots of it) the Read whose
        ``(start, end]`` holds its position, the Snapshots after one Read ascending and no two at
        one position, each Restore follows the Relocate that ends where it is made, and a Relocate
        is followed by a read."""
        if not 0 <= self.resume <= prompt_len:
            raise ValueError(f"plan {self.rid}: resume {self.resume} outside [0, {prompt_len}]")
        if self.resume_limit is not None and not self.resume <= self.resume_limit <= prompt_len:
            raise ValueError(f"plan {self.rid}: resume limit {self.resume_limit} outside [{self.resume}, {prompt_len}]")
        cursor, previous = self.resume, None
        # The Read the next Snapshot may follow, and its last Snapshot: Reads tile the prompt in
        # order and a Read's Snapshots ascend, so no two Snapshots of a plan can share a position.
        read, kept_to = None, None
        for step in self.steps:
            if isinstance(step, Snapshot):
                if (read is None or not read.start < step.at <= read.end
                        or (kept_to is not None and step.at <= kept_to)):
                    raise ValueError(f"plan {self.rid}: snapshot at {step.at} is not within the read forward before it")
                kept_to = step.at
            elif isinstance(step, Restore):
                if not isinstance(previous, Relocate) or step.at != cursor:
                    raise ValueError(f"plan {self.rid}: restore at {step.at} does not follow a relocation ending there")
            elif isinstance(step, Relocate):
                if step.at != cursor or step.rows <= 0 or step.source < 0:
                    raise ValueError(f"plan {self.rid}: relocation of {step.rows} rows at {step.at} "
                                     f"does not continue at {cursor}")
                cursor = step.end
            else:
                if step.start != cursor or step.end <= step.start:
                    raise ValueError(
                        f"plan {self.rid}: step [{step.start}, {step.end}) does not continue at {cursor}"
                    )
                cursor = step.end
            if not isinstance(step, Snapshot):
                read, kept_to = (step, None) if isinstance(step, Read) else (None, None)
            previous = step
        if cursor != prompt_len:
            raise ValueError(f"plan {self.rid}: steps end at {cursor}, prompt has {prompt_len}")
        if any(isinstance(s, Relocate) for s in self.steps) and not isinstance(self._last_cover(), Read):
            raise ValueError(f"plan {self.rid}: a relocation must be followed by a read (the logits come from a forward)")

    def _last_cover(self) -> Step | None:
        return next((s for s in reversed(self.steps) if isinstance(s, (Read, Relocate))), None)

    def relocations(self) -> list[tuple[Relocate, bool]]:
        """Each Relocate, in order, and whether a Restore goes with it."""
        out: list[tuple[Relocate, bool]] = []
        for step in self.steps:
            if isinstance(step, Relocate):
                out.append((step, False))
            elif isinstance(step, Restore) and out:
                out[-1] = (out[-1][0], True)
        return out

    def snapshots(self) -> dict[int, str]:
        """Where this plan keeps states: position -> kind."""
        return {step.at: step.kind for step in self.steps if isinstance(step, Snapshot)}

    def forwards(self) -> list[tuple[int, int]]:
        """The ``[start, end)`` of each Read, in order."""
        return [(step.start, step.end) for step in self.steps if isinstance(step, Read)]


@dataclass(frozen=True, slots=True)
class Release:
    """A request that finished or was aborted."""

    rid: str
    prompt_tokens: int
    decode_tokens: int


class RequestRefused(ValueError):
    """``plan`` refuses a request that asks for something this policy will not serve (SCR: a
    ``cache_salt`` knob for a path it does not implement): the client gets a 400 naming ``field``,
    rather than a silently different answer."""

    field = "request"


# When a policy plans (``CachePolicy.plans_at``), which decides the hook set that runs it:
# "match": after SGLang's own prefix match, reads only (radix and any plain policy);
# "tree": inside the exact radix tree's match, with Snapshot steps (``Arrival.tree_match`` and
#   ``tree_states`` filled; ``tree_keys`` consulted);
# "enqueue": when the request is queued, before any match; its Relocate/Restore steps are carried
#   out by the policy's step carrier (a ``policy.carrier.StepPolicy``: SCR).
PLANS_AT = ("match", "tree", "enqueue")


class CachePolicy(Protocol):
    """What ``patches/`` calls on every policy; nothing else of a policy object is read there. New
    needs become fields or step kinds, not methods. A policy that plans at enqueue adds the two
    members of ``policy.carrier.StepPolicy``.

    The members after ``check`` are optional for a policy: ``PolicyDefaults`` gives them their
    defaults, so a policy inherits it and the launcher and executor call them without probing."""

    name: ClassVar[str]
    plans_at: ClassVar[str]

    def plan(self, arrival: Arrival) -> Plan: ...

    def release(self, release: Release) -> None: ...

    def check(self) -> None:
        """Raise ``AssertionError`` on a broken internal invariant (called at idle and in tests)."""
        ...

    def server_settings(self) -> dict[str, object]: ...

    def server_defaults(self) -> dict[str, object]: ...

    def startup_problems(self, settings: Mapping[str, object], env: Mapping[str, str], on_cuda: bool) -> list[str]: ...

    def kernel_premises(self) -> tuple[str, ...]: ...

    def snapshot_budget(self) -> int: ...

    def token_lookups(self) -> dict[str, str]: ...

    def tree_keys(self, prompt, ids) -> list[int] | None: ...

    def snapshot_file(self, rid: str, position: int, tp_rank: int) -> str | None: ...


# ``startup_problems``' settings hold the resolved ``ServerArgs`` fields plus these: the
# checkpoint's declared quantization (``config.json``'s ``quant_method``, lower case; None when
# unquantized or not on this machine), which SGLang reads only while loading the model;
CHECKPOINT_QUANTIZATION = "checkpoint_quantization"
# and, for a policy whose ``kernel_premises()`` names ``SPLIT_INVARIANCE``, what the launcher found
# on the serving device: kernel name -> what differed when its forward was split on the 64-token
# grid (empty: every kernel checked gave the same bits).
KERNEL_SPLIT_FAILURES = "kernel_split_failures"
SPLIT_INVARIANCE = "split_invariance"
# The one entry of KERNEL_SPLIT_FAILURES that is not the split invariance: keeping a state inside a
# forward (exact's keeps=inside) did not give the state a forward that ended there leaves.
KEEPING_KERNEL = "gdn_keeping"


class PolicyDefaults:
    """Defaults of the optional ``CachePolicy`` members: the policy plans after SGLang's match and
    needs nothing from SGLang."""

    plans_at: ClassVar[str] = "match"

    def server_settings(self) -> dict[str, object]:
        """SGLang settings (``ServerArgs`` field -> value) the policy needs. The launcher adds them
        to the command line, and exits with status 2 when the command line or SGLang's resolved
        settings disagree. Default: none."""
        return {}

    def server_defaults(self) -> dict[str, object]:
        """SGLang settings the launcher adds only when the command line does not give them."""
        return {}

    def startup_problems(self, settings: Mapping[str, object], env: Mapping[str, str], on_cuda: bool) -> list[str]:
        """Why the resolved server (``ServerArgs`` fields, environment, CUDA present) cannot give
        this policy's guarantees, one message each; the launcher refuses to start on any."""
        return []

    def kernel_premises(self) -> tuple[str, ...]:
        """Kernel properties the policy's guarantee rests on, which the launcher checks on the
        serving device before it serves (``SPLIT_INVARIANCE``: the answer arrives in the settings
        as ``KERNEL_SPLIT_FAILURES``). Default: none."""
        return ()

    def snapshot_budget(self) -> int:
        """Recurrent-state snapshots the policy keeps in SGLang's Mamba pool; the launcher sizes
        the pool as this plus one working slot per running request. 0 leaves SGLang's sizing."""
        return 0

    def token_lookups(self) -> dict[str, str]:
        """Config fields that hold a token id the launcher must look up in the served tokenizer:
        field -> token text. The launcher sets each field before the servers start. Default: none."""
        return {}

    def tree_keys(self, prompt, ids) -> list[int] | None:
        """The keys the tree files ``ids`` (a prefix of ``prompt``, or longer) under, for a policy
        that plans inside the tree; None: the token ids themselves."""
        return None

    def snapshot_file(self, rid: str, position: int, tp_rank: int) -> str | None:
        """Where the tree writes rank ``tp_rank``'s copy of the state kept for ``rid`` at
        ``position``, for a check outside the server; None (the default): it writes none."""
        return None
