"""Agent settings for BrowseComp-Plus runs, read from a YAML file (default ``eval/bcp/bcp.yaml``).

The keys mirror the CLM authors' ``configs/bcp.yaml`` (``docs/eval.md`` §2.2) plus what the BCP
harness fixes (search k, snippet length, get_document; §1.5) and what the server must be told
(``enable_thinking``/``preserve_thinking``, ``cache_salt``). ``AgentConfig.fingerprint`` hashes
the resolved values; it goes into the run manifest, and ``compare`` refuses runs whose
fingerprints differ.
"""
# Spec: docs/eval.md

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_CONFIG = Path(__file__).with_name("bcp.yaml")

MODES = ("plain", "clm")
FINISH_POLICIES = ("text", "submit")
EDIT_GATES = ("shrink", "fit")
TOOL_PROTOCOLS = ("auto", "native", "text")


@dataclass(frozen=True)
class SearchConfig:
    k: int = 5
    snippet_max_tokens: int = 512
    get_document: bool = True


@dataclass(frozen=True)
class AgentConfig:
    mode: str = "clm"
    finish_policy: str = "submit"
    max_steps: int = 100
    max_tokens: int = 4096
    temperature: float = 0.7
    top_p: float = 0.95
    top_k: int | None = None
    seed: int | None = None
    enable_thinking: bool = True
    preserve_thinking: bool = False
    cache_salt: str | None = None
    tool_protocol: str = "auto"
    observation_max_chars: int = 60000
    edit_gate: str = "shrink"
    context_budget_tokens: int = 28672
    context_budget_reserve_tokens: int = 2048
    nudge_ratios: tuple[float, ...] = (0.25, 0.5, 0.75)
    persistent_nudge_ratio: float = 0.9
    max_num_retry_on_limit: int = 6
    retry_edit_margin_tokens: int = 2048
    finalize_nudge_turns: int = 3
    lm_call_cap: int | None = None  # default 2 * max_steps + 24 (CLM)
    request_timeout_s: float = 600.0
    max_retries: int = 5
    search: SearchConfig = field(default_factory=SearchConfig)

    def __post_init__(self):
        for name, allowed in (("mode", MODES), ("finish_policy", FINISH_POLICIES), ("edit_gate", EDIT_GATES),
                              ("tool_protocol", TOOL_PROTOCOLS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, not {getattr(self, name)!r}")
        if self.mode == "plain" and self.finish_policy != "text":
            raise ValueError("mode plain answers in text: finish_policy must be 'text'")
        if self.max_steps < 1 or self.max_tokens < 1:
            raise ValueError("max_steps and max_tokens must be positive")
        if not 0 < self.context_budget_reserve_tokens < self.context_budget_tokens:
            raise ValueError("context_budget_reserve_tokens must lie between 0 and context_budget_tokens")
        if any(not 0 < r < 1 for r in self.nudge_ratios) or list(self.nudge_ratios) != sorted(self.nudge_ratios):
            raise ValueError(f"nudge_ratios must be increasing fractions in (0, 1): {self.nudge_ratios}")

    # ---- derived values (CLM's)

    @property
    def strict_target(self) -> int:
        """The enforced context limit: budget minus reserve (26,624 with the authors' values)."""
        return self.context_budget_tokens - self.context_budget_reserve_tokens

    @property
    def call_cap(self) -> int:
        return self.lm_call_cap if self.lm_call_cap is not None else 2 * self.max_steps + 24

    @property
    def max_total_iters(self) -> int:
        return 2 * self.max_steps + 8 + min(self.max_num_retry_on_limit, self.max_steps)

    @property
    def chat_template_kwargs(self) -> dict:
        return {"enable_thinking": self.enable_thinking, "preserve_thinking": self.preserve_thinking}

    def sampling(self) -> dict:
        params: dict[str, Any] = {"temperature": self.temperature, "top_p": self.top_p, "max_tokens": self.max_tokens}
        if self.top_k is not None:
            params["top_k"] = self.top_k
        if self.seed is not None:
            params["seed"] = self.seed
        return params

    def to_dict(self) -> dict:
        data = dataclasses.asdict(self)
        data["nudge_ratios"] = list(self.nudge_ratios)
        return data

    def fingerprint(self) -> str:
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()[:16]

    def replace(self, **changes) -> "AgentConfig":
        return dataclasses.replace(self, **changes)


def config_from_dict(data: dict) -> AgentConfig:
    data = dict(data or {})
    known = {f.name for f in dataclasses.fields(AgentConfig)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"unknown agent config keys {unknown}; valid: {sorted(known)}")
    search = data.pop("search", None) or {}
    unknown = sorted(set(search) - {f.name for f in dataclasses.fields(SearchConfig)})
    if unknown:
        raise ValueError(f"unknown search config keys {unknown}")
    if "nudge_ratios" in data:
        ratios = data["nudge_ratios"]
        if isinstance(ratios, str):  # the authors' "0.25,0.5,0.75"
            ratios = [float(r) for r in ratios.split(",") if r.strip()]
        data["nudge_ratios"] = tuple(float(r) for r in ratios)
    return AgentConfig(**data, search=SearchConfig(**search))


def load_config(path: Path | str | None = None, overrides: dict | None = None) -> AgentConfig:
    """The YAML file (``DEFAULT_CONFIG`` when None) with ``overrides`` applied on top."""
    import yaml

    data = yaml.safe_load(Path(path or DEFAULT_CONFIG).read_text()) or {}
    for key, value in (overrides or {}).items():
        if key.startswith("search."):
            data.setdefault("search", {})[key.split(".", 1)[1]] = value
        else:
            data[key] = value
    return config_from_dict(data)


def override_value(raw: str) -> Any:
    """The VALUE of a ``--set KEY=VALUE``, read as YAML (numbers, true/false, null, lists); a value
    YAML cannot read is a ``ValueError``."""
    import yaml

    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        raise ValueError(f"{raw!r} is not a YAML value ({' '.join(str(exc).split())})") from None
