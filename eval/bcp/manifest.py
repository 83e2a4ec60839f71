"""The run manifest (``manifest.json``, ``docs/eval.md`` §5.4): what a BCP run was, so that
``compare`` can refuse runs that differ in more than the policy, and a resumed run can refuse a
different run's directory.

``comparable`` names the parts that must be equal between arms, the rendering of earlier turns
(``manifest_render``, ``eval/render.py``) among them; the server settings are split into
those that must match (``SERVER_KEYS_MUST_MATCH``), the volatile ones left out of the manifest
(``SERVER_KEYS_VOLATILE``), and the rest, recorded and shown but not compared (a policy
legitimately brings its own, e.g. the exact launcher's chunked prefill).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

from eval import render as render_mod
from serving import profile as serving_profile
from eval.bcp import journal as journal_mod

MANIFEST = "manifest.json"
SCHEMA = 1
ROOT = Path(__file__).resolve().parents[2]

# Server settings that must be equal across the arms of a comparison; the others are recorded and
# shown, since a policy legitimately brings its own (the exact launcher sets chunked prefill etc.).
# Every field a serving profile sets is among them (``serving/profile.py``): kernels, sampling,
# graphs, overlap, page size and the recurrent-state strategy must not differ between arms.
SERVER_KEYS_MUST_MATCH = tuple(dict.fromkeys((
    "model_path", "served_model_name", "dtype", "kv_cache_dtype", "context_length", "tp_size", "dp_size",
    "tool_call_parser", "reasoning_parser", "chat_template", "mamba_ssm_dtype", "device", "sampling_backend",
    "revision", "quantization", *serving_profile.COMPARED_FIELDS)))
# Server settings that vary between launches and say nothing about the experiment.
SERVER_KEYS_VOLATILE = ("host", "port", "random_seed", "log_requests", "file_storage_path", "nccl_port",
                        "dist_init_addr", "internal_states", "decode_log_interval", "log_level")

# The code that shapes a trajectory. The git commit is recorded too, but not compared: a shared
# checkout moves on while the arms run, and what matters is that the agent's code did not change.
AGENT_CODE = ("agent.py", "question.py", "prompts.py", "clm.py", "client.py", "config.py", "tools.py",
              "retrieval.py", "snippets.py", "execute.py", "run.py")


def git_state(root: Path = ROOT) -> dict:
    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    return {"commit": git("rev-parse", "HEAD") or None, "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}


def code_fingerprint() -> str:
    h = hashlib.sha256()
    for name in AGENT_CODE:
        path = Path(__file__).with_name(name)
        h.update(name.encode() + b"\0" + (path.read_bytes() if path.exists() else b"") + b"\0")
    return h.hexdigest()[:16]


def prompts_fingerprint() -> str:
    from eval.bcp import prompts

    return hashlib.sha256(json.dumps(list(prompts.FINGERPRINTED)).encode()).hexdigest()[:16]


def dataset_fingerprint(queries, corpus_fingerprint: str) -> str:
    h = hashlib.sha256(corpus_fingerprint.encode())
    for q in queries:
        h.update(json.dumps([q.query_id, q.text, q.answer, list(q.evidence_docids), list(q.gold_docids)]).encode())
    return h.hexdigest()


def manifest_render(manifest: dict) -> str:
    """How the run rendered earlier turns (``eval/render.py``): the manifest's ``render``; a run
    from before it was recorded is what its ``chat_template_kwargs`` asked for (``default`` when
    ``preserve_thinking`` is false)."""
    return manifest.get("render") or render_mod.from_kwargs(manifest.get("agent", {}).get("chat_template_kwargs"))


def comparable(manifest: dict) -> dict:
    """The parts of a manifest that must be equal between arms of a comparison (everything but
    the policy and what a launch varies). The agent config leaves out ``preserve_thinking``: it is
    compared as ``render``, which ``compare --allow-render-mismatch`` may let through alone."""
    server_args = manifest.get("server", {}).get("args", {})
    config = manifest.get("agent", {}).get("config")
    if isinstance(config, dict):
        config = {k: v for k, v in config.items() if k != "preserve_thinking"}
    return {
        "render": manifest_render(manifest),
        "model": manifest.get("model"),
        "server_args": {k: server_args.get(k) for k in SERVER_KEYS_MUST_MATCH},
        "sglang_version": manifest.get("server", {}).get("sglang_version"),
        "server_kind": manifest.get("server", {}).get("kind"),
        "agent_config": config,
        "retrieval": manifest.get("retrieval"),
        "dataset": manifest.get("dataset", {}).get("fingerprint"),
        "questions": manifest.get("dataset", {}).get("question_ids"),
        "concurrency": manifest.get("run", {}).get("concurrency"),
        "agent_code": manifest.get("run", {}).get("code_fingerprint"),
    }


class DifferentRun(SystemExit):
    """The output directory holds another run's files (from the command line: a usage error)."""


def prepare_manifest(run_dir: Path, manifest: dict) -> None:
    """Write the manifest, or on resume check that the run is the same run (``DifferentRun``)."""
    path = run_dir / MANIFEST
    if path.exists():
        old = json.loads(path.read_text())
        if comparable(old) != comparable(manifest) or old.get("policy") != manifest.get("policy") \
                or old.get("run_id") != manifest.get("run_id"):
            diff = sorted(k for k in comparable(old) if comparable(old)[k] != comparable(manifest)[k])
            raise DifferentRun(f"{run_dir} holds a different run (differs in {diff or ['policy/run_id']}); "
                             f"use another --out")
        # Keep what earlier invocations recorded (creation time, the judge) and count the resumptions.
        manifest = {**old, **{k: v for k, v in manifest.items() if v is not None or k not in old},
                    "created": old.get("created"), "resumed": old.get("resumed", 0) + 1}
    journal_mod.write_json_atomic(path, manifest)


def load_manifest(run_dir: Path) -> dict:
    return json.loads((Path(run_dir) / MANIFEST).read_text())


def load_run(run_dir: Path) -> tuple[dict, list[dict]]:
    """A run directory's manifest and its finished run records."""
    return load_manifest(run_dir), journal_mod.Journal(run_dir).records()
