"""Value objects and the one interface every cache policy implements.

A policy never sees a tensor or an SGLang object. For each request the engine describes what
it holds (``Arrival``); the policy answers with a ``Plan`` (data), which ``patches/`` executes;
when the request leaves, the engine reports a ``Release``.

Ranges are half-open token positions in the prompt::

    prompt   |0 ............ resume|resume ........................ len(tokens)|
              reused from the cache   Extend(start=resume, end=len(tokens))
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Mapping, Protocol, Union


@dataclass(frozen=True, slots=True)
class Arrival:
    """A request about to be scheduled, as the engine sees it."""

    rid: str
    tokens: tuple[int, ...]  # full prompt token ids
    cache_key: str | None  # namespace (cache_salt / extra_key); different keys share nothing
    tree_hit: int  # prefix length the engine's own match would serve (its deepest usable state)
    tree_match: int = 0  # longest prefix of tokens[:-1] whose KV the tree holds
    tree_states: tuple[int, ...] = ()  # depths <= tree_match on that path holding a state snapshot


@dataclass(frozen=True, slots=True)
class Extend:
    """Run the model over prompt positions ``[start, end)``."""

    start: int
    end: int


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Keep the recurrent state (and the KV before it) after the forward that ends at ``at``."""

    at: int
    kind: str


Step = Union[Extend, Snapshot]


@dataclass(frozen=True, slots=True)
class Plan:
    """What to do for one request: reuse ``[0, resume)`` from the prefix tree, then ``steps``."""

    rid: str
    resume: int
    steps: tuple[Step, ...]

    def validate(self, prompt_len: int) -> None:
        """Raise ``ValueError`` unless the Extend steps tile ``[resume, prompt_len)`` in order and
        each Snapshot follows the Extend that ends where it is taken."""
        if not 0 <= self.resume <= prompt_len:
            raise ValueError(f"plan {self.rid}: resume {self.resume} outside [0, {prompt_len}]")
        cursor, seen = self.resume, set()
        for step in self.steps:
            if isinstance(step, Snapshot):
                if step.at != cursor or step.at <= self.resume or step.at in seen:
                    raise ValueError(f"plan {self.rid}: snapshot at {step.at} is not the end of a read forward")
                seen.add(step.at)
                continue
            if step.start != cursor or step.end <= step.start:
                raise ValueError(
                    f"plan {self.rid}: step [{step.start}, {step.end}) does not continue at {cursor}"
                )
            cursor = step.end
        if cursor != prompt_len:
            raise ValueError(f"plan {self.rid}: steps end at {cursor}, prompt has {prompt_len}")

    def snapshots(self) -> dict[int, str]:
        """Where this plan keeps states: position -> kind."""
        return {step.at: step.kind for step in self.steps if isinstance(step, Snapshot)}

    def forwards(self) -> list[tuple[int, int]]:
        """The ``[start, end)`` of each Extend, in order."""
        return [(step.start, step.end) for step in self.steps if isinstance(step, Extend)]


@dataclass(frozen=True, slots=True)
class Release:
    """A request that finished or was aborted."""

    rid: str
    prompt_tokens: int
    decode_tokens: int


class CachePolicy(Protocol):
    """What ``patches/`` calls. New needs become fields or step kinds, not methods.

    The last five members are optional for a policy: ``PolicyDefaults`` gives them their
    defaults, so a policy inherits it and the launcher calls them without probing."""

    name: ClassVar[str]
    config: Any

    def plan(self, arrival: Arrival) -> Plan: ...

    def release(self, release: Release) -> None: ...

    def check(self) -> None:
        """Raise ``AssertionError`` on a broken internal invariant (called at idle and in tests)."""
        ...

    def server_settings(self) -> dict[str, object]: ...

    def server_defaults(self) -> dict[str, object]: ...

    def startup_problems(self, settings: Mapping[str, object], env: Mapping[str, str], on_cuda: bool) -> list[str]: ...

    def snapshot_budget(self) -> int: ...

    def token_lookups(self) -> dict[str, str]: ...


# ``startup_problems``' settings hold the resolved ``ServerArgs`` fields plus this one: the
# checkpoint's declared quantization (``config.json``'s ``quant_method``, lower case; None when
# unquantized or not on this machine), which SGLang reads only while loading the model.
CHECKPOINT_QUANTIZATION = "checkpoint_quantization"


class PolicyDefaults:
    """Defaults of the optional ``CachePolicy`` members: the policy needs nothing from SGLang."""

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

    def snapshot_budget(self) -> int:
        """Recurrent-state snapshots the policy keeps in SGLang's Mamba pool; the launcher sizes
        the pool as this plus one working slot per running request. 0 leaves SGLang's sizing."""
        return 0

    def token_lookups(self) -> dict[str, str]:
        """Config fields that hold a token id the launcher must look up in the served tokenizer:
        field -> token text. The launcher sets each field before the servers start. Default: none."""
        return {}
