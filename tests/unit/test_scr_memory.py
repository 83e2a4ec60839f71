"""``scr.memory``: the sizes of SCR's side buffer and state shadow, the activation margin, and the
start-up check's verdict and message (``docs/scr.md`` §5.4). Standard library only."""

from __future__ import annotations

import pytest

from serving.host_memory import meminfo

from scr.memory import (
    GIB,
    MIB,
    ScrMemory,
    activation_margin_bytes,
    fits,
    fraction_that_fits,
    kv_bytes_per_token,
    max_side_sessions,
    max_side_tokens,
    memory_problem,
    state_bytes_per_slot,
)

# Qwen3.6-27B (docs/model.md §1): 16 full-attention layers of 4 KV heads x 256 in bf16; 48 GDN
# layers with a causal conv of 4 taps over 2*16*128 + 48*128 channels (bf16, SGLang's conv dtype)
# and a temporal state of 48 value heads x 128 x 128 in float32 (mamba_ssm_dtype).
QWEN_KV = dict(attention_layers=16, kv_heads=4, head_dim=256, element_size=2)
QWEN_STATE = dict(linear_layers=48, conv_dim=2 * 16 * 128 + 48 * 128, conv_kernel=4, value_heads=48,
                  key_head_dim=128, value_head_dim=128, conv_element_size=2, state_element_size=4)


def qwen(slots=12, tokens=30000, tp_size=1) -> ScrMemory:
    return ScrMemory(slots, tokens, kv_bytes_per_token(**QWEN_KV, tp_size=tp_size),
                     state_bytes_per_slot(**QWEN_STATE, tp_size=tp_size))


def test_qwen36_27b_at_the_authors_defaults():
    """The issue's ~22 GiB and ~1.7 GiB, exactly; the side buffer is the authors' README figure
    (``12 slots x 30000 tokens (21.97 GiB, 64.0 KiB/token)``, docs/scr.md §5.1)."""
    memory = qwen()
    assert memory.kv_bytes_per_token == 65_536  # 64 KiB/token
    assert memory.state_bytes_per_slot == 153_944_064  # 146.8125 MiB: 144 MiB temporal + 2.8125 MiB conv
    assert memory.side_bytes == 23_592_960_000
    assert memory.shadow_bytes == 1_847_328_768
    assert memory.total_bytes == 25_440_288_768
    assert f"{memory.side_bytes / GIB:.2f}" == "21.97"
    assert f"{memory.shadow_bytes / GIB:.2f}" == "1.72"
    assert f"{memory.total_bytes / GIB:.2f}" == "23.69"


def test_tensor_parallel_splits_heads_and_replicates_too_few_kv_heads():
    assert kv_bytes_per_token(**QWEN_KV, tp_size=2) == 65_536 // 2
    assert kv_bytes_per_token(**QWEN_KV, tp_size=4) == 65_536 // 4
    assert kv_bytes_per_token(**QWEN_KV, tp_size=8) == 65_536 // 4  # 4 KV heads: one per rank, replicated
    assert state_bytes_per_slot(**QWEN_STATE, tp_size=2) == 153_944_064 // 2


def test_no_shadow_means_no_state_bytes():
    memory = ScrMemory(12, 30000, 65_536)
    assert memory.shadow_bytes == 0 and memory.total_bytes == memory.side_bytes


@pytest.mark.parametrize(
    "chunk, tp, pp, mib",
    [
        pytest.param(512, 1, 1, 512 + 2048 * 1.5 + 128, id="authors-chunk-below-the-2048-floor"),
        pytest.param(None, 1, 1, 512 + 2048 * 1.5 + 128, id="unknown-chunk"),
        pytest.param(8192, 1, 1, 512 + 8192 * 1.5 + 128, id="large-chunk"),
        pytest.param(512, 2, 1, 512 + 2048 * 1.5 + 256, id="tp2"),
        pytest.param(512, 2, 2, 512 + 2048 * 1.5 + 512, id="tp2-pp2"),
    ],
)
def test_activation_margin_is_sglangs_runtime_reserve(chunk, tp, pp, mib):
    assert activation_margin_bytes(chunk, tp, pp) == int(mib * MIB)


def test_activation_margin_on_the_cpu_is_the_constant_part():
    assert activation_margin_bytes(8192, 2, 2, on_gpu=False) == 512 * MIB


@pytest.mark.parametrize(
    "spare, ok",
    [
        pytest.param(1, True, id="one-byte-spare"),
        pytest.param(0, True, id="exactly-the-margin-left"),
        pytest.param(-1, False, id="one-byte-short"),
    ],
)
def test_fits_at_the_margin_edge(spare, ok):
    memory, margin = qwen(), activation_margin_bytes(512)
    free = memory.total_bytes + margin + spare
    assert fits(memory, free, margin) is ok
    assert (memory_problem(memory, free, margin, "cuda:0") is None) is ok


def test_what_would_fit():
    memory, margin = qwen(), activation_margin_bytes(512)
    free = 20 * GIB
    tokens, sessions = max_side_tokens(memory, free, margin), max_side_sessions(memory, free, margin)
    assert fits(qwen(tokens=tokens), free, margin) and not fits(qwen(tokens=tokens + 1), free, margin)
    assert fits(qwen(slots=sessions), free, margin) and not fits(qwen(slots=sessions + 1), free, margin)
    assert (tokens, sessions) == (20008, 8)
    assert max_side_tokens(memory, GIB, margin) == 0 and max_side_sessions(memory, GIB, margin) == 0


def test_a_lower_fraction_leaves_room():
    memory, margin, total = qwen(), activation_margin_bytes(512), 80 * GIB
    free = 20 * GIB
    lowered = fraction_that_fits(memory, free, margin, 0.75, total)
    assert lowered == 0.65
    # SGLang frees about (0.75 - lowered) x total from its pools for the stores.
    assert fits(memory, free + round((0.75 - lowered) * total), margin)
    assert fraction_that_fits(memory, 0, margin, 0.2, total) is None  # nothing positive is enough


def test_the_refusal_names_the_numbers_and_the_settings_to_lower():
    memory, margin = qwen(), activation_margin_bytes(512)
    message = memory_problem(memory, 20 * GIB, margin, "cuda:0", mem_fraction_static=0.75, device_total=80 * GIB)
    assert message == (
        "SCR needs 23.69 GiB on cuda:0 outside SGLang's pools (side buffer 21.97 GiB = 12 slots x 30000 tokens "
        "x 64.0 KiB/token, state shadow 1.72 GiB = 12 slots x 146.8 MiB) and keeps 3.62 GiB free for SGLang's "
        "activations, but only 20.00 GiB is free after SGLang sized its pools: short by 7.32 GiB. Lower "
        "side_tokens (--cache-policy-set side_tokens=N, or KVREUSE_SIDE_TOKENS): at most 20008 fit with 12 slots; "
        "or side_sessions (--cache-policy-set side_sessions=N, or KVREUSE_SIDE_SESSIONS): at most 8 fit with 30000 "
        "tokens; or --mem-fraction-static (now 0.75; about 0.65 leaves room)"
    )


def test_the_refusal_without_a_shadow_fraction_or_any_room():
    message = memory_problem(ScrMemory(2, 100, 1024), 1000, 10, "cpu")
    assert "state shadow" not in message and "--mem-fraction-static" not in message
    assert "none fits with 2 slots" in message and "none fits with 100 tokens" in message
    assert "only 0.00 GiB is free" in message


@pytest.mark.parametrize(
    "text, expected",
    [
        pytest.param("MemTotal:       24576000 kB\nMemFree:  1 kB\nMemAvailable:   23552000 kB\n",
                     (23552000 * 1024, 24576000 * 1024), id="linux"),
        pytest.param("MemTotal: 100 kB\nMemFree: 50 kB\n", None, id="old-kernel-no-available"),
        pytest.param("", None, id="empty"),
        pytest.param("MemTotal: x kB\nMemAvailable: 5 kB\n", None, id="garbled"),
    ],
)
def test_meminfo(text, expected):
    assert meminfo(text) == expected
