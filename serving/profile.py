"""Serving profiles: the SGLang settings every arm of a comparison shares, so arms differ in the policy alone.

A cost or accuracy difference between two servers can be put on the cache policy only when
everything else is equal. The settings that decide numbers or speed without being a policy's own
(attention and sampling backends, batch-invariant kernels, overlap scheduling, page size, the
recurrent-state strategy, CUDA graphs) live here, in one place: the launcher adds the selected
profile's settings to every server it starts (``--serving-profile``, default ``matched``), the
benchmarks and ``eval.bcp`` record it, and ``eval.bcp.compare`` refuses arms whose resolved
settings differ (``eval/bcp/manifest.py`` compares these fields).

``matched`` gives every arm what the most demanding policy needs:
- exact's batch-invariant kernels on CUDA (``--enable-deterministic-inference``, Triton attention
  and GDN prefill, the Triton prefill truncation grid at 64 tokens). Their cost falls on radix
  and scr too: SGLang's deterministic mode is slower than its default kernels (SGLang's own
  write-up of the feature reports roughly a third less throughput; not measured here, no GPU).
- the sampling backend ``pytorch``, which deterministic inference forces anyway (SGLang would
  otherwise pick ``flashinfer`` on CUDA for radix and scr only).
- SCR's and exact's ``--page-size 1`` and ``--disable-overlap-schedule``, and ``no_buffer``
  recurrent states (exact's copies at forward ends; scr's restore has only run on it; on GPU
  ``auto`` would resolve to ``extra_buffer`` with overlap on).
- CUDA graphs off for decode and prefill, as the SCR authors serve (``--disable-cuda-graph``).

``matched-graphs`` is the same with decode CUDA graphs on for every arm (a variant, not a
default: scr under graphs is checked by ``scripts/gpu_check.sh``). ``none`` adds nothing beyond
what the policy itself requires (a single server, not a comparison).

Stdlib only: the launcher resolves the profile before SGLang is imported.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

DEFAULT = "matched"


def _frozen(mapping: dict) -> Mapping:
    return MappingProxyType(dict(mapping))


@dataclass(frozen=True)
class ServingProfile:
    """A named set of ``ServerArgs`` fields (and environment variables) every arm gets.

    ``everywhere`` applies on every device; ``on_cuda`` and ``env_on_cuda`` only when the server
    runs on CUDA (the CPU platform has one attention kernel, one sampler and no graphs)."""

    name: str
    summary: str
    everywhere: Mapping[str, object] = field(default_factory=dict)
    on_cuda: Mapping[str, object] = field(default_factory=dict)
    env_on_cuda: Mapping[str, str] = field(default_factory=dict)

    def settings(self, cuda: bool) -> dict[str, object]:
        """``ServerArgs`` field -> value for a server on CUDA (``cuda``) or on CPU."""
        return {**self.everywhere, **(self.on_cuda if cuda else {})}

    def environment(self, cuda: bool) -> dict[str, str]:
        return dict(self.env_on_cuda) if cuda else {}

    def matches(self, resolved: Mapping[str, object], cuda: bool) -> bool:
        """Whether a server's resolved settings (``/server_info``) are this profile's."""
        return all(resolved.get(key) == value for key, value in self.settings(cuda).items())


_COMMON = {
    "page_size": 1,
    "disable_overlap_schedule": True,
    "mamba_radix_cache_strategy": "no_buffer",
    "sampling_backend": "pytorch",
}
_DETERMINISTIC_CUDA = {
    "enable_deterministic_inference": True,
    "attention_backend": "triton",
    "linear_attn_prefill_backend": "triton",
    "cuda_graph_backend_prefill": "disabled",
}
# exact's pieces (64 and its multiples) stay on deterministic Triton prefill's truncation grid
# (exact_cache/invariance.py); every arm reads on the same grid.
_TRITON_GRID_ENV = {"SGLANG_TRITON_PREFILL_TRUNCATION_ALIGN_SIZE": "64"}

PROFILES: Mapping[str, ServingProfile] = _frozen({
    "matched": ServingProfile(
        "matched", "every arm: deterministic kernels, pytorch sampling, page 1, no overlap, no_buffer, no CUDA graphs",
        _frozen(_COMMON), _frozen({**_DETERMINISTIC_CUDA, "cuda_graph_backend_decode": "disabled"}),
        _frozen(_TRITON_GRID_ENV)),
    "matched-graphs": ServingProfile(
        "matched-graphs", "matched, with decode CUDA graphs on for every arm",
        _frozen(_COMMON), _frozen({**_DETERMINISTIC_CUDA, "cuda_graph_backend_decode": "full"}),
        _frozen(_TRITON_GRID_ENV)),
    "none": ServingProfile("none", "nothing beyond what the policy needs (one server, not a comparison)"),
})

# The fields a comparison must find equal between arms, whichever profile ran: every field any
# profile sets (so a ``none`` arm beside a ``matched`` one is refused too).
COMPARED_FIELDS: tuple[str, ...] = tuple(sorted({key for p in PROFILES.values()
                                                 for key in (*p.everywhere, *p.on_cuda)}))


class ProfileError(ValueError):
    """An unknown profile name, or a profile that contradicts the command line or the policy."""


def get(name: str) -> ServingProfile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ProfileError(f"--serving-profile {name!r}: unknown; valid: {', '.join(PROFILES)}") from None


def identify(resolved: Mapping[str, object]) -> str | None:
    """The name of the profile a server's resolved settings match (``device`` tells CPU from
    CUDA), the most specific first; None when none does (``none``, or a server started some other
    way: its settings are still compared field by field)."""
    cuda = str(resolved.get("device") or "cuda") == "cuda"
    for profile in sorted(PROFILES.values(), key=lambda p: -len(p.settings(cuda))):
        if profile.settings(cuda) and profile.matches(resolved, cuda):
            return profile.name
    return None


def conflicts(profile: ServingProfile, policy_settings: Mapping[str, object], cuda: bool) -> list[str]:
    """Fields where the profile and a policy's required settings disagree (a defect in one of them:
    ``tests/unit/test_serving_profile.py`` checks every registered policy against every profile)."""
    ours = profile.settings(cuda)
    return [f"{key}: profile {profile.name} gives {ours[key]!r}, the policy needs {value!r}"
            for key, value in policy_settings.items() if key in ours and ours[key] != value]


def env_problems(profile: ServingProfile, env: Mapping[str, str], cuda: bool) -> list[str]:
    """Environment variables the caller set to another value than the profile's."""
    return [f"{key}={env[key]} in the environment; profile {profile.name} needs {key}={value}"
            for key, value in profile.environment(cuda).items() if key in env and env[key] != value]
