"""The check's servers: the patched launcher on the tiny model, with settings sized for it, and
what every server step reads back (resolved settings, the decode log, the fatal lines).

Every server runs with ``--serving-profile`` (``matched`` unless a step says otherwise), so on
CUDA it gets the settings a comparison of the policies gets (deterministic kernels, Triton
attention and GDN prefill, page 1, no overlap, no_buffer states). Pools are capped because the
tiny model would otherwise get a KV pool of hundreds of millions of rows on a 141 GB GPU.
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from typing import Iterator

from eval import http
from eval.server import ServerProcess

# Servers after the start-up step's warm-up find SGLang's JIT and Triton kernels compiled on disk;
# the tiny model then starts within a minute on one GPU. The warm-up's first start gets its own
# (startup.FIRST_START_TIMEOUT_S).
STARTUP_TIMEOUT_S = 240.0
STATE_SLOTS = 32  # recurrent-state slots (SGLang's Mamba pool), as the engine tests
# SGLang's own idle leak check, strict: a KV slot or state slot not returned stops the scheduler.
STRICT_ENV = {"SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE": "1"}
DECODE_LINE = re.compile(r"Decode batch.*?#running-req: (\d+)")
GRAPH_FLAG = re.compile(r"Decode batch.*?(?:cuda|cpu) graph: (True|False)")


def device_args(cuda: bool) -> list[str]:
    """bf16 on CUDA (the checkpoint's dtype, what a GPU serves), the KV cache spelled ``bf16`` (SGLang's
    alias, which exact once refused); CPU keeps its fp32 default."""
    return ["--dtype", "bfloat16", "--kv-cache-dtype", "bf16"] if cuda else []


@contextmanager
def serving(ctx, name: str, args: list[str], total_tokens: int, running: int = 8,
            startup_timeout: float = STARTUP_TIMEOUT_S) -> Iterator[ServerProcess]:
    """A started server (log in ``<out>/logs/<name>.log``), stopped on leaving the block."""
    caps = ["--max-running-requests", str(running), "--max-mamba-cache-size", str(STATE_SLOTS),
            "--max-total-tokens", str(total_tokens)]
    server = ServerProcess(
        model_path=str(ctx.model_dir()), log_path=ctx.log_dir / f"{name}.log",
        extra_args=[*caps, *device_args(ctx.cuda), *args],
        env=dict(STRICT_ENV), graceful_stop=False, startup_timeout=startup_timeout,
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()


def server_info(server: ServerProcess) -> dict:
    """SGLang's resolved settings (``/server_info``, an admin route: with the server's key)."""
    return http.get_json(server.url + "/server_info", timeout=60, headers=server.admin_headers())


def check_profile(checks, info: dict, name: str, cuda: bool) -> None:
    """The server resolved the serving profile's settings (and bf16 on CUDA)."""
    from serving import launch_args, profile

    wrong = launch_args.resolved_setting_problems(profile.get(name).settings(cuda), info)
    checks.expect(not wrong, f"resolved settings are --serving-profile {name}'s" + (f"; {'; '.join(wrong)}" if wrong else ""))
    checks.note("resolved", {key: info.get(key) for key in
                             ("dtype", "attention_backend", "linear_attn_prefill_backend", "sampling_backend",
                              "enable_deterministic_inference", "cuda_graph_backend_decode", "disable_cuda_graph",
                              "page_size", "mamba_radix_cache_strategy", "disable_overlap_schedule",
                              "chunked_prefill_size", "device")})
    if cuda:
        checks.expect(info.get("dtype") == "bfloat16", f"served in bf16 (dtype {info.get('dtype')})")


def check_clean_log(checks, server: ServerProcess) -> None:
    """No traceback, leak report or dropped executor in the server's log."""
    fatal = server.fatal_lines()
    checks.expect(not fatal, f"no fatal line in {server.log_path.name}" + (f": {fatal[0]}" if fatal else ""))


def decode_batch_sizes(log_text: str) -> set[int]:
    """Batch sizes of the decode steps logged (``--decode-log-interval 1`` logs every step)."""
    return {int(n) for n in DECODE_LINE.findall(log_text)}


def graph_flags(log_text: str) -> list[bool]:
    """Whether each logged decode step ran a CUDA graph."""
    return [flag == "True" for flag in GRAPH_FLAG.findall(log_text)]
