"""How an agent run's earlier turns are rendered: ``default`` or ``preserve`` (``--render`` of
``eval.traces synth``, ``eval.bcp.run run`` and ``eval.bench_policies``).

The name travels with the run (a trace line's ``meta.render``, a run manifest's ``render``, a
benchmark's ``bench.json``) because the two forms are different experiments: the model is shown
different prompts, so neither the cache numbers nor the accuracy of one pair with the other's.

* ``default`` (``chat_template_kwargs.preserve_thinking = false``, what the server does unasked):
  Qwen3.6's chat template (``docs/model.md`` §6.4) strips the reasoning of every assistant turn
  before the last real user query. Once a new user turn follows (a harness nudge, a notice, the
  rollback ledger: plain user turns in the CLM agent), the earlier turns are re-rendered without
  their ``<think>`` blocks, so the prompt changes in the middle, not only at the end or where the
  agent edited its context, and a prefix cache loses everything after the first stripped turn.
  The model sees only its reasoning since the last user query.
* ``preserve`` (``preserve_thinking = true``): every earlier assistant turn is sent as it was
  first rendered, with its reasoning, so a conversation's prompts only grow, except where the
  agent itself edits its context (or is rolled back). The template never rewrites old turns.
  The model sees more tokens: all of its old reasoning, which also fills the context budget
  sooner (more nudges and edits).

What that does to accuracy is an open question for a GPU run with the real model (Qwen3.6 on
BrowseComp-Plus, ``eval.bcp.run`` once per rendering); the tiny random model of the CPU benchmark
measures only the cost side and cannot say. Standard library only: the trace format and the
manifest read it.
"""

from __future__ import annotations

DEFAULT = "default"
PRESERVE = "preserve"
RENDERINGS = (DEFAULT, PRESERVE)


def check(name: str) -> str:
    """``name`` when it is a rendering, else ``ValueError`` naming the choices."""
    if name not in RENDERINGS:
        raise ValueError(f"rendering {name!r}: choose from {', '.join(RENDERINGS)}")
    return name


def preserve_thinking(name: str) -> bool:
    """The ``preserve_thinking`` chat-template flag of rendering ``name``."""
    return check(name) == PRESERVE


def chat_template_kwargs(name: str, enable_thinking: bool = True) -> dict:
    """The ``chat_template_kwargs`` a request of rendering ``name`` carries (thinking on, as
    ``eval/bcp/bcp.yaml``, unless told)."""
    return {"enable_thinking": enable_thinking, "preserve_thinking": preserve_thinking(name)}


def from_kwargs(kwargs: dict | None) -> str:
    """The rendering that ``chat_template_kwargs`` ask for: ``preserve`` when ``preserve_thinking``
    is true, else ``default`` (no kwargs at all is the template's default: stripping)."""
    return PRESERVE if (kwargs or {}).get("preserve_thinking") else DEFAULT
