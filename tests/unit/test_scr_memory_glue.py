"""``patches/scr_tensors.py`` at start-up: the stores are sized off SGLang's pools (the policy's
``side_stores`` decision), checked against
a faked free-memory figure, refused with the launcher's exit-2 message when short, and not
allocated at all while SCR is switched off (``docs/scr.md`` §5.4). Small CPU tensors, no server."""

from __future__ import annotations

import logging
from types import SimpleNamespace as NS

import pytest
import torch

from patches import scr_tensors
from scr.memory import GIB, MIB, ScrMemory
from scr import lines as scr_lines
from scr.policy import ScrPolicy
from scr.settings import ScrConfig
from serving import refusals

LAYERS = (3, 7)
POOL_ROWS, KV_HEADS, HEAD_DIM = 40, 2, 16  # 2 layers x (K+V) x 2 x 16 x 4 B = 512 B/token
CPU_MARGIN = 512 * MIB  # scr.memory.activation_margin_bytes on the CPU


class KVPool:
    full_attention_layer_id_mapping = {layer: i for i, layer in enumerate(LAYERS)}

    def __init__(self):
        self.kv = {layer: (torch.zeros(POOL_ROWS, KV_HEADS, HEAD_DIM), torch.zeros(POOL_ROWS, KV_HEADS, HEAD_DIM))
                   for layer in LAYERS}

    def get_kv_buffer(self, layer):
        return self.kv[layer]


def scheduler(hybrid: bool = True, server_args=None):
    pool = KVPool()
    mamba = NS(mamba_cache=NS(conv=[torch.zeros(3, 8, 6, 3, dtype=torch.bfloat16)],
                              temporal=torch.zeros(3, 8, 2, 4, 4))) if hybrid else None
    return NS(token_to_kv_pool_allocator=NS(get_kvcache=lambda: pool),
              req_to_token_pool=NS(req_to_token=torch.zeros(4, 64, dtype=torch.int32), mamba_pool=mamba),
              model_config=NS(hf_text_config=None, context_len=64), tp_worker=NS(model_runner=NS(model=None)),
              server_args=server_args or NS(chunked_prefill_size=512, tp_size=1, pp_size=1, mem_fraction_static=0.75))


@pytest.fixture(autouse=True)
def fixed_rotary(monkeypatch):
    """The rotary lookup needs a real model; a table stands in for it."""
    monkeypatch.setattr(scr_tensors, "text_rotary", lambda *args, **kwargs: NS(cos_sin_cache=torch.zeros(64, 8)))


@pytest.fixture
def refusal_file(tmp_path, monkeypatch):
    path = tmp_path / "refusal.txt"
    path.write_text("")
    monkeypatch.setenv(refusals.REFUSAL_ENV, str(path))
    return path


def plenty(device):
    return 64 * GIB, 128 * GIB


def never(device):
    raise AssertionError("free memory measured while SCR is off")


def expected_sizes(config: ScrConfig, hybrid: bool = True) -> ScrMemory:
    kv = len(LAYERS) * 2 * KV_HEADS * HEAD_DIM * 4
    state = 3 * (6 * 3 * 2 + 2 * 4 * 4 * 4) if hybrid else 0  # [layers, slots, 6, 3] bf16 + [layers, slots, 2, 4, 4] fp32
    return ScrMemory(config.side_sessions, config.side_tokens, kv, state)


def sizes(tensors) -> tuple:
    """What the tensors were told to allocate: (slots, tokens, K/V bytes per row, shadow bytes)."""
    stores = tensors.stores
    return stores.slots, stores.tokens, tensors.kv_bytes_per_token, tensors.shadow_bytes


@pytest.mark.parametrize("hybrid", [True, False], ids=["hybrid", "dense"])
def test_sizes_read_off_the_pools_are_what_gets_allocated(hybrid):
    config = ScrConfig(side_sessions=3, side_tokens=10)
    tensors = scr_tensors.ScrTensors(scheduler(hybrid), ScrPolicy(config), measure=plenty)
    expected = expected_sizes(config, hybrid)
    assert sizes(tensors) == (3, 10, expected.kv_bytes_per_token, expected.shadow_bytes)
    side = sum(t.numel() * t.element_size() for pair in tensors.side.kv for t in pair)
    assert side == expected.side_bytes and tensors.side.bytes_per_token == expected.kv_bytes_per_token
    if hybrid:
        assert sum(t.numel() * t.element_size() for t in tensors.shadow.parts) == expected.shadow_bytes > 0
    else:
        assert tensors.shadow is None


def test_ssm_off_sizes_and_allocates_no_shadow():
    tensors = scr_tensors.ScrTensors(scheduler(), ScrPolicy(ScrConfig(ssm=False, side_sessions=2, side_tokens=5)), measure=plenty)
    assert tensors.shadow is None and tensors.shadow_bytes == 0 and not tensors.stores.states


def test_switched_off_allocates_and_measures_nothing(monkeypatch, caplog):
    def no_alloc(*args, **kwargs):
        raise AssertionError("allocated while SCR is off")

    monkeypatch.setattr(scr_tensors, "SideBuffer", no_alloc)
    monkeypatch.setattr(scr_tensors, "StateShadow", no_alloc)
    with caplog.at_level(logging.INFO, logger=scr_tensors.__name__):
        tensors = scr_tensors.ScrTensors(scheduler(), ScrPolicy(ScrConfig(enabled=False)), measure=never)
    assert tensors.side is None and tensors.shadow is None and not tensors.stores.allocate
    expected = expected_sizes(ScrConfig())  # still known, for the line
    assert sizes(tensors) == (expected.slots, expected.tokens, expected.kv_bytes_per_token, expected.shadow_bytes)
    assert "scr: switched off (enabled=False): no side buffer or state shadow allocated" in caplog.text


def test_short_memory_refuses_before_allocating(monkeypatch, refusal_file):
    def no_alloc(*args, **kwargs):
        raise AssertionError("allocated although the check failed")

    monkeypatch.setattr(scr_tensors, "SideBuffer", no_alloc)
    config = ScrConfig(side_sessions=4, side_tokens=1000)
    need = expected_sizes(config).total_bytes
    with pytest.raises(SystemExit) as stopped:
        scr_tensors.ScrTensors(scheduler(), ScrPolicy(config), measure=lambda device: (need + CPU_MARGIN - 1, 4 * GIB))
    [message] = refusals.reasons(str(refusal_file))
    assert str(stopped.value) == f"cache-policy overlay: {message}"
    assert message.startswith("SCR needs 0.00 GiB on cpu outside SGLang's pools (side buffer 0.00 GiB = 4 slots x "
                              "1000 tokens x 0.5 KiB/token, state shadow 0.00 GiB = 4 slots x 0.0 MiB) and keeps "
                              "0.50 GiB free for SGLang's activations")
    assert "short by 0.00 GiB" in message
    assert "side_tokens (--cache-policy-set side_tokens=N, or KVREUSE_SIDE_TOKENS): at most 999 fit" in message
    assert "side_sessions (--cache-policy-set side_sessions=N, or KVREUSE_SIDE_SESSIONS): at most 3 fit" in message
    assert "--mem-fraction-static (now 0.75; about 0.74 leaves room)" in message


def test_exactly_the_margin_left_is_enough(refusal_file, caplog):
    config = ScrConfig(side_sessions=4, side_tokens=1000)
    need = expected_sizes(config).total_bytes
    with caplog.at_level(logging.INFO, logger=scr_tensors.__name__):
        tensors = scr_tensors.ScrTensors(scheduler(), ScrPolicy(config), measure=lambda device: (need + CPU_MARGIN, 4 * GIB))
    assert tensors.side is not None and refusal_file.read_text() == ""
    assert "scr: allocating 0.00 GiB on cpu outside SGLang's pools (side buffer" in caplog.text
    assert "0.50 GiB kept for activations" in caplog.text


def test_gpu_margin_follows_the_chunk_size_and_ranks(monkeypatch):
    """On CUDA the margin is SGLang's activation estimate, read from the scheduler's server args."""
    seen = []
    monkeypatch.setattr(scr_lines, "memory_problem", lambda memory, free, margin, where, **kw: seen.append(margin))
    args = NS(chunked_prefill_size=8192, tp_size=2, pp_size=1, mem_fraction_static=0.8)
    costs = scr_tensors.store_costs([], None, torch.device("cuda", 0), args, measure=plenty)
    scr_tensors.decide_stores(ScrPolicy(ScrConfig(side_sessions=1, side_tokens=1)), costs)
    assert seen == [int((512 + 8192 * 1.5 + 2 * 128) * MIB)]


def test_unknown_free_memory_allocates_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING, logger=scr_tensors.__name__):
        tensors = scr_tensors.ScrTensors(scheduler(), ScrPolicy(ScrConfig(side_sessions=2, side_tokens=5)),
                                         measure=lambda device: None)
    assert tensors.side is not None
    assert "unchecked: the free memory there is unknown" in caplog.text


def test_cpu_free_memory_is_the_hosts():
    found = scr_tensors.free_memory(torch.device("cpu"))
    if found is None:
        pytest.skip("no /proc/meminfo here")
    free, total = found
    assert 0 < free <= total
