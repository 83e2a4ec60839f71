"""One scenario of ``test_overlay_hooks.py``, run in a fresh interpreter.

``HookRegistry``, ``patches.plugin`` and ``patches.process`` keep process-global state, so every scenario gets its own
process. Usage::

    python tests/integration/overlay_child.py SCENARIO [MODEL_DIR]

The last stdout line is ``SUMMARY_PREFIX`` followed by a JSON summary. A scenario that is meant to
stop the process prints its summary (what was raised, what HookRegistry holds) and then re-raises,
so the exit status and stderr are the ones the process would have without this script.

| scenario            | environment (set by the test)        | what runs                                        |
|---------------------|--------------------------------------|--------------------------------------------------|
| policy              | CACHE_POLICY_SPEC = radix + events   | ``load_plugins()``, then the hooks on real       |
|                     |                                      | ``UnifiedRadixCache``/``Req`` objects            |
| stock               | no CACHE_POLICY_SPEC                 | ``load_plugins()``, then ``ServerArgs`` on CPU    |
| version             | ``serving.versions.PINNED`` = 9.9.9  | ``patches.plugin.install()``                     |
| missing_hook        | ``patches.targets.RELEASE_KV`` -> a  | ``patches.plugin.install()``                     |
| missing_hook_loader | function that is not there; radix    | ``load_plugins()`` (SGLang's route)              |
| bad_spec            | CACHE_POLICY_SPEC = "not json"       | ``load_plugins()``                               |
"""

from __future__ import annotations

import json
import os
import sys
import types
from array import array

SUMMARY_PREFIX = "OVERLAY_CHILD_SUMMARY "
MISSING_TARGET = "sglang.srt.mem_cache.common.no_such_function"


def emit(summary: dict) -> None:
    print(SUMMARY_PREFIX + json.dumps(summary, sort_keys=True), flush=True)


def registry_state(originals: dict) -> dict:
    """What is registered with SGLang, which of the overlay's targets (``originals``: what each
    named before) name something else now, and whether the plugin says it installed."""
    from sglang.srt.plugins.hook_registry import HookRegistry

    from patches import plugin

    return {
        "registered": sorted(t for t, hooks in HookRegistry._hooks.items() if hooks),
        "applied": sorted(t for t, original in originals.items() if plugin._resolve(t) is not original),
        "installed": plugin._state["installed"],
    }


def run_expecting_exit(action) -> None:
    """Run ``action``; report what it raised (or that it returned), then let the exception go on."""
    from patches import plugin

    originals = {t: plugin._resolve(t) for t in expected_targets(policy=True)}
    try:
        action()
    except BaseException as exc:
        emit({"raised": type(exc).__name__, "message": str(exc), **registry_state(originals)})
        raise
    emit({"raised": None, "message": None, **registry_state(originals)})


# ---------------------------------------------------------------------- discovery


def expected_targets(policy: bool | None = None) -> list[str]:
    """The targets the plugin hooks on CPU: with the policy's when ``policy`` (default: when a spec is set)."""
    from patches import routes, targets as policy_targets, validation
    from patches.cpu import attention as cpu_attention
    from patches.cpu import platform as cpu_platform

    targets = [t for t, _ in cpu_platform.KERNEL_REPLACEMENTS] + [cpu_platform.SERVER_ARGS_POST_INIT, cpu_attention.TARGET]
    if cpu_platform.start_method() == "fork":
        targets.append(cpu_platform.ENGINE_CONFIG)
    targets += list(validation.TARGETS) + list(routes.TARGETS)
    if policy or (policy is None and os.environ.get("CACHE_POLICY_SPEC")):
        targets += [policy_targets.REQ_MATCHED, policy_targets.RELEASE_KV, policy_targets.SCHEDULER_IDLE,
                    policy_targets.SCHEDULER_INIT, policy_targets.ABORT]
    return targets


def _wraps(function, original) -> bool:
    """Whether ``original`` is down ``function``'s wrapper chain (SGLang wraps once per hook on a
    target, so two of our hooks on one target make two wrappers)."""
    while function is not original and getattr(function, "__wrapped__", None) is not None:
        function = function.__wrapped__
    return function is original


def load_through_sglang() -> dict:
    """``sglang.srt.plugins.load_plugins()`` as every SGLang process calls it; what it changed."""
    import torch

    from patches import plugin

    targets = expected_targets()
    originals = {t: plugin._resolve(t) for t in targets}

    import sglang.srt.plugins
    from sglang.srt.plugins.hook_registry import HookRegistry

    sglang.srt.plugins.load_plugins()

    per_target = {}
    for target in targets:
        now = plugin._resolve(target)
        per_target[target] = {
            "replaced": now is not originals[target],
            "wraps_original": now is not originals[target] and _wraps(now, originals[target]),
            "sources": sorted({(src.plugin_name, src.dist_name) for _, _, src in HookRegistry._hooks[target]}),
        }
    return {
        "pid": os.getpid(),
        "cuda": torch.cuda.is_available(),
        "installed_targets": list(plugin.installed_targets()),
        "state_installed": plugin._state["installed"],
        "state_cpu": plugin._state["cpu"],
        "targets": per_target,
    }


# ---------------------------------------------------------------------- real SGLang objects


def build_tree_cache():
    """UnifiedRadixCache(FULL, MAMBA) over real pools on CPU: page 1, one GDN layer, one attention
    layer, 128 KV slots, 8 recurrent-state slots, 4 request rows (docs/cpu.md §4 B4-B7)."""
    import torch
    from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateDType, Mamba2StateShape
    from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.memory_pool import HybridLinearKVPool, HybridReqToTokenPool
    from sglang.srt.mem_cache.unified_cache_components.tree_component import ComponentType
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

    shape = Mamba2StateShape.create(
        tp_world_size=1, intermediate_size=8, n_groups=1, num_heads=2, head_dim=4, state_size=4, conv_kernel=2
    )
    cache_params = Mamba2CacheParams(
        shape=shape, layers=[0], dtype=Mamba2StateDType(conv=torch.float32, temporal=torch.float32)
    )
    req_to_token_pool = HybridReqToTokenPool(
        size=4,
        mamba_size=8,
        mamba_spec_state_size=4,
        max_context_len=64,
        device="cpu",
        enable_memory_saver=False,
        cache_params=cache_params,
        mamba_layer_ids=[0],
        enable_mamba_extra_buffer=False,
        enable_overlap_schedule=False,
    )
    kv_pool = HybridLinearKVPool(
        size=128,
        dtype=torch.float32,
        page_size=1,
        head_num=1,
        head_dim=4,
        full_attention_layer_ids=[1],
        device="cpu",
        mamba_pool=req_to_token_pool.mamba_pool,
    )
    allocator = TokenToKVPoolAllocator(size=128, dtype=torch.float32, device="cpu", kvcache=kv_pool, need_sort=False)
    return UnifiedRadixCache(
        CacheInitParams(
            disable=False,
            req_to_token_pool=req_to_token_pool,
            token_to_kv_pool_allocator=allocator,
            page_size=1,
            tree_components=(ComponentType.FULL, ComponentType.MAMBA),
        )
    )


def make_req(rid: str, ids: list[int]):
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    return Req(rid, "", array("q", ids), SamplingParams(max_new_tokens=3))


def admit_and_decode(req, tree_cache, output_ids: list[int]) -> None:
    """What admission (PrefillAdder lock), ``alloc_for_extend``, ``prepare_for_extend`` and the decode
    steps do to a matched request's memory and counters; no forward pass runs.

    row of req_to_token:  |0 .. prefix (tree's slots)|prefix .. prompt (new)|prompt .. prompt+out-1 (decode)|
    The last output token's KV is never computed, so decode allocates one slot fewer than it emits.
    """
    from sglang.srt.managers.schedule_batch import ReqKvInfo

    pool = tree_cache.req_to_token_pool
    allocator = tree_cache.token_to_kv_pool_allocator
    prompt_len = len(req.origin_input_ids)
    prefix_len = len(req.prefix_indices)

    tree_cache.inc_lock_ref(req.last_node)
    pool.alloc([req])  # keeps the recurrent-state slot the match took for copy-on-write
    row = pool.req_to_token[req.req_pool_idx]
    row[:prefix_len] = req.prefix_indices
    row[prefix_len:prompt_len] = allocator.alloc(prompt_len - prefix_len)
    req.kv = ReqKvInfo(kv_allocated_len=prompt_len, swa_evicted_seqlen=0)
    req.kv_committed_len = prompt_len
    req.cached_tokens += prefix_len - req.already_computed
    req.already_computed = prompt_len

    decoded_kv = len(output_ids) - 1
    row[prompt_len : prompt_len + decoded_kv] = allocator.alloc(decoded_kv)
    req.output_ids.extend(output_ids)
    req.kv.kv_allocated_len = req.kv_committed_len = prompt_len + decoded_kv


def _scheduler_stub(attn_tp_rank: int):
    """What the plugin reads of a Scheduler: its ``ps`` (sglang ParallelState) ranks."""
    return types.SimpleNamespace(ps=types.SimpleNamespace(attn_tp_rank=attn_tp_rank, attn_cp_rank=0, pp_rank=0,
                                                          tp_rank=attn_tp_rank, tp_size=2))


def read_events(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def plan_of(executor, rid: str):
    tracked = executor._tracked.get(rid)
    if tracked is None:
        return None
    return {"resume": tracked.plan.resume, "steps": [[s.start, s.end] for s in tracked.plan.steps]}


def policy_flow(model_dir: str) -> dict:
    import torch
    import sglang.srt.mem_cache.common as mem_common
    from sglang.srt.managers.schedule_batch import FINISH_ABORT, FINISH_LENGTH
    from sglang.srt.mem_cache.base_prefix_cache import InsertParams
    from sglang.srt.mem_cache.radix_cache import RadixKey
    from sglang.srt.plugins.hook_registry import HookRegistry
    from sglang.srt.runtime_context import get_context
    from sglang.srt.server_args import ServerArgs

    from patches import plugin, process, targets

    spec = plugin.current_spec()
    server_args = ServerArgs(model_path=model_dir)
    get_context().set_server_args(server_args)  # release_kv_cache and the mamba match read it
    tree_cache = build_tree_cache()
    pool = tree_cache.req_to_token_pool
    allocator = tree_cache.token_to_kv_pool_allocator
    kv_total = allocator.available_size()
    out: dict = {"kv_total": kv_total, "events_path": spec.events_path}

    # No Scheduler is built: run the plugin's own Scheduler.__init__ AFTER hook with stand-ins.
    (init_hook,) = [hook for _, hook, _ in HookRegistry._hooks[targets.SCHEDULER_INIT]]
    init_hook(None, _scheduler_stub(attn_tp_rank=1), server_args)
    out["rank1_writes_events"] = process.executor().events is not None
    init_hook(None, _scheduler_stub(attn_tp_rank=0), server_args)
    executor = process.executor()
    out["rank0_events_file"] = executor.events.path if executor.events else None
    out["executor_policy"] = executor.policy.name

    # Prompt A (12 tokens) is in the tree: its KV and the recurrent state after its last token.
    prompt_a = list(range(10, 22))
    kv_a = allocator.alloc(len(prompt_a))
    state_a = pool.mamba_allocator.alloc(1)
    tree_cache.insert(InsertParams(key=RadixKey(array("q", prompt_a)), value=kv_a.clone(), mamba_value=state_a))

    # B = A + 5 new tokens: SGLang's match serves A.
    req_b = make_req("req-b", prompt_a + [40, 41, 42, 43, 44])
    req_b.init_next_round_input(tree_cache)
    out["b_prefix_len"] = len(req_b.prefix_indices)
    out["b_prefix_is_a"] = torch.equal(req_b.prefix_indices, kv_a)
    out["b_cow_source_is_a"] = torch.equal(req_b.mamba_cow_src_index.view(-1), state_a.view(-1))
    out["b_plan"] = plan_of(executor, "req-b")

    admit_and_decode(req_b, tree_cache, [50, 51, 52])
    out["b_cached_tokens"] = req_b.cached_tokens
    req_b.finished_reason = FINISH_LENGTH(length=3)
    out["events_before_b_release"] = len(read_events(spec.events_path))
    mem_common.release_kv_cache(req_b, tree_cache)
    out["events_after_b"] = read_events(spec.events_path)
    out["b_tracked_after_release"] = "req-b" in executor._tracked
    out["b_row_freed"] = req_b.req_pool_idx is None and req_b.kv is None
    out["kv_available_after_b"] = allocator.available_size()
    out["tree_tokens_after_b"] = tree_cache.evictable_size()

    # C shares only A's first 8 tokens; no recurrent state is stored at 8, so the hybrid match is 0.
    req_c = make_req("req-c", prompt_a[:8] + [90, 91, 92])
    req_c.init_next_round_input(tree_cache)
    out["c_prefix_len"] = len(req_c.prefix_indices)
    out["c_plan"] = plan_of(executor, "req-c")
    # Aborted while waiting: SGLang releases a never-admitted request through the same function.
    req_c.finished_reason = FINISH_ABORT()
    mem_common.release_kv_cache(req_c, tree_cache)
    out["events_after_c"] = read_events(spec.events_path)
    out["tracked_after_c"] = sorted(executor._tracked)

    # Matching without a tree cache is not a prefix match: nothing is planned.
    req_e = make_req("req-e", prompt_a + [70])
    req_e.init_next_round_input()
    out["e_tracked"] = "req-e" in executor._tracked

    # D extends B's whole sequence: the tree now serves B's 17 prompt + 2 decoded tokens.
    req_d = make_req("req-d", prompt_a + [40, 41, 42, 43, 44, 50, 51, 60])
    req_d.init_next_round_input(tree_cache)
    out["d_prefix_len"] = len(req_d.prefix_indices)
    out["d_plan"] = plan_of(executor, "req-d")
    return out


def server_args_flow(model_dir: str) -> dict:
    from sglang.srt.server_args import ServerArgs

    defaults = ServerArgs(model_path=model_dir)
    fields = (
        "device",
        "attention_backend",
        "sampling_backend",
        "disable_cuda_graph",
        "enable_multimodal",
        "mamba_radix_cache_strategy",
        "disable_overlap_schedule",
        "dtype",
    )
    out = {"defaults": {f: getattr(defaults, f) for f in fields}}
    out["conv_dtype_env"] = os.environ.get("SGLANG_MAMBA_CONV_DTYPE")
    out["explicit_bf16_dtype"] = ServerArgs(model_path=model_dir, dtype="bfloat16").dtype
    try:
        ServerArgs(model_path=model_dir, mamba_radix_cache_strategy="extra_buffer")
    except ValueError as exc:
        out["extra_buffer_error"] = str(exc)
    else:
        out["extra_buffer_error"] = None
    return out


# ---------------------------------------------------------------------- scenarios


def scenario_policy(model_dir: str) -> None:
    summary = {"discovery": load_through_sglang()}
    summary["flow"] = policy_flow(model_dir)
    emit(summary)


def scenario_stock(model_dir: str) -> None:
    summary = {"discovery": load_through_sglang()}
    summary["server_args"] = server_args_flow(model_dir)
    emit(summary)


def scenario_cuda_text_only(model_dir: str) -> None:
    """The plugin as it installs on a CUDA box (``cuda_available`` answers True, so no CPU platform
    hooks), then SGLang's start-up path of the tiny model from a CUDA server's default settings
    after the ``ServerArgs.__post_init__`` BEFORE hooks the plugin registered; beside it the same
    path with no hook, which is what SGLang alone does on CUDA."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from patches import plugin, text_only
    from patches.cpu import platform as cpu_platform

    cpu_platform.cuda_available = lambda: True
    plugin.install()
    hooked = text_only.default_server_args(model_dir)
    before = [hook for kind, hook, _ in HookRegistry._hooks[text_only.SERVER_ARGS_POST_INIT] if kind is HookType.BEFORE]
    for hook in before:
        hook(hooked)
    emit({"cpu": plugin._state["cpu"], "post_init_hooks": len(before),
          "with_overlay": text_only.load_as_sglang_does(hooked),
          "sglang_alone": text_only.load_as_sglang_does(text_only.default_server_args(model_dir))})


def scenario_version() -> None:
    from patches import plugin
    from serving import versions

    versions.PINNED = {"sglang": "9.9.9"}
    run_expecting_exit(plugin.install)


def scenario_missing_hook() -> None:
    from patches import plugin, targets

    def install():
        targets.RELEASE_KV = MISSING_TARGET
        plugin.install()

    run_expecting_exit(install)


def scenario_missing_hook_loader() -> None:
    import sglang.srt.plugins

    from patches import targets

    def load():
        targets.RELEASE_KV = MISSING_TARGET  # the entry point's plugin reads this same module object
        sglang.srt.plugins.load_plugins()

    run_expecting_exit(load)


def scenario_bad_spec() -> None:
    import sglang.srt.plugins

    run_expecting_exit(sglang.srt.plugins.load_plugins)


SCENARIOS = {
    "policy": scenario_policy,
    "stock": scenario_stock,
    "cuda_text_only": scenario_cuda_text_only,
    "version": scenario_version,
    "missing_hook": scenario_missing_hook,
    "missing_hook_loader": scenario_missing_hook_loader,
    "bad_spec": scenario_bad_spec,
}

if __name__ == "__main__":
    SCENARIOS[sys.argv[1]](*sys.argv[2:])
