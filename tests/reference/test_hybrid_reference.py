"""The explicit-cache reference (tests/reference/hybrid_reference.py) against transformers' own forward, and
its cache helpers and key re-rotation.

Observed on the tiny model (fp32, CPU): cold read of 300 tokens vs ``model(input_ids).logits`` max |diff|
2.5e-5 (logits up to ~17); its caches vs transformers' DynamicCache <= 9e-6 (keys, magnitude ~8; GDN conv and
recurrent states <= 3e-6); reads split at 1/63/64/200 vs one read: bit-identical logits, K/V and GDN states
(the reference computes each row independently of the split, see hybrid_reference); teacher-forced decode
vs transformers' full forward <= 6e-6 in logprob, and a decoded cache equals a cold read bit for bit;
re-rotation vs fp64 RoPE at the new position <= 1e-6 (a wrong theta gives >= 0.4); chunked GDN form vs
recurrent 2e-5 in logits.
"""

from __future__ import annotations

import pytest
import torch
from transformers.models.qwen3_5.modeling_qwen3_5 import apply_rotary_pos_emb

from tests.reference.hybrid_reference import Cache, Reference, inv_freq_fp64, rerotate

HF_TOLERANCE = 1e-4  # reference vs transformers' fp32 forward (different summation orders, chunked GDN)
HF_CACHE_TOLERANCE = 5e-5  # reference caches vs transformers' DynamicCache (keys reach ~8 in magnitude)
SPLIT_TOLERANCE = 1e-5  # reference vs itself, prompt read in pieces
STATE_TOLERANCE = 1e-6
ROPE_TOLERANCE = 1e-5
SPLITS = (1, 63, 64, 200)


def maxdiff(a, b) -> float:
    if isinstance(a, (list, tuple)):
        return max((maxdiff(x, y) for x, y in zip(a, b, strict=True)), default=0.0)
    assert a.shape == b.shape, (a.shape, b.shape)
    return (a.float() - b.float()).abs().max().item() if a.numel() else 0.0


def random_ids(n: int, seed: int) -> list[int]:
    return torch.randint(0, 480, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def pieces(ids, splits):
    bounds = [0, *splits, len(ids)]
    return [ids[a:b] for a, b in zip(bounds, bounds[1:])]


@pytest.fixture(scope="module")
def ref(tiny_model_dir) -> Reference:
    torch.set_grad_enabled(False)
    return Reference(tiny_model_dir)


@pytest.fixture(scope="module")
def prompt() -> list[int]:
    return random_ids(300, seed=1)


@pytest.fixture(scope="module")
def cold(ref, prompt) -> tuple[Cache, torch.Tensor]:
    cache = ref.empty()
    logits = ref.read(cache, prompt)
    return cache, logits


# 1. the explicit-cache forward is the model ------------------------------------------------------------


def test_layout(ref):
    assert ref.attention_layers == [3, 7] and ref.linear_layers == [0, 1, 2, 4, 5, 6]
    assert ref.rotary_dim == 8 and ref.rope_theta == 1e7 and ref.head_dim == 32
    cache = ref.empty()
    assert cache.length == 0 and [tuple(k.shape) for k in cache.keys] == [(0, 2, 32)] * 2
    assert [tuple(c.shape) for c in cache.conv] == [(128, 3)] * 6
    assert [tuple(s.shape) for s in cache.recurrent] == [(4, 16, 16)] * 6
    assert all(t.dtype == torch.float32 for t in (*cache.keys, *cache.conv, *cache.recurrent))


def test_cold_read_equals_transformers_forward(ref, prompt, cold):
    cache, logits = cold
    hf = ref.hf_forward(prompt, use_cache=True)
    assert logits.shape == (len(prompt), ref.vocab_size) and logits.dtype == torch.float32
    assert maxdiff(logits, hf.logits[0]) < HF_TOLERANCE
    assert cache.length == len(prompt)
    # The caches hold what transformers' DynamicCache holds: post-RoPE keys, values, the last kernel-1 raw
    # in_proj_qkv rows (transformers keeps kernel columns; its first one is redundant), K-major fp32 states.
    pkv = hf.past_key_values
    for slot, layer in enumerate(ref.attention_layers):
        assert maxdiff(cache.keys[slot], pkv.layers[layer].keys[0].transpose(0, 1)) < HF_CACHE_TOLERANCE
        assert maxdiff(cache.values[slot], pkv.layers[layer].values[0].transpose(0, 1)) < HF_CACHE_TOLERANCE
    for slot, layer in enumerate(ref.linear_layers):
        assert maxdiff(cache.conv[slot], pkv.layers[layer].conv_states[0, :, 1:]) < HF_CACHE_TOLERANCE
        assert maxdiff(cache.recurrent[slot], pkv.layers[layer].recurrent_states[0]) < HF_CACHE_TOLERANCE


def test_short_cold_read_equals_transformers_forward(ref):
    ids = random_ids(2, seed=2)  # shorter than the conv kernel: the zero conv state is the left padding
    cache = ref.empty()
    assert maxdiff(ref.read(cache, ids), ref.hf_logits(ids)) < HF_TOLERANCE


# 2. reading in pieces ---------------------------------------------------------------------------------


def test_reading_in_pieces_equals_one_read(ref, prompt, cold):
    one_cache, one_logits = cold
    cache = ref.empty()
    logits = torch.cat([ref.read(cache, part) for part in pieces(prompt, SPLITS)])
    assert cache.length == len(prompt)
    assert maxdiff(logits, one_logits) < SPLIT_TOLERANCE
    assert maxdiff(cache.conv, one_cache.conv) < STATE_TOLERANCE
    assert maxdiff(cache.recurrent, one_cache.recurrent) < STATE_TOLERANCE
    assert maxdiff(cache.keys, one_cache.keys) < STATE_TOLERANCE
    assert maxdiff(cache.values, one_cache.values) < STATE_TOLERANCE


def test_chunked_gdn_equals_recurrent_gdn(ref, prompt, cold):
    """The optional chunked (WY) form of the delta rule: the same function up to fp32 rounding."""
    one_cache, one_logits = cold
    cache = ref.empty()
    ref.gdn = "chunk"
    try:
        logits = torch.cat([ref.read(cache, part) for part in pieces(prompt, SPLITS)])
    finally:
        ref.gdn = "recurrent"
    assert maxdiff(logits, one_logits) < HF_TOLERANCE
    assert maxdiff(cache.recurrent, one_cache.recurrent) < 1e-5


# 3. teacher-forced decode -------------------------------------------------------------------------------


def greedy(ref, ids, n):
    """The reference's own greedy continuation (checked against transformers' argmax below)."""
    cache = ref.empty()
    logits, out = ref.read(cache, ids)[-1], []
    for _ in range(n):
        out.append(int(logits.argmax()))
        logits = ref.read(cache, out[-1:])[0]
    return out


@pytest.mark.parametrize("kind", ["greedy", "forced"])
def test_decode_equals_transformers_forward(ref, kind):
    prompt = random_ids(120, seed=3)
    outputs = greedy(ref, prompt, 8) if kind == "greedy" else random_ids(8, seed=4)
    cache = ref.empty()
    first = ref.read(cache, prompt)[-1]
    logprobs, argmax = ref.decode(cache, first, outputs)

    hf = ref.hf_logits(prompt + outputs)[len(prompt) - 1 : -1]  # rows that predict outputs[0..7]
    hf_logprobs = torch.log_softmax(hf, dim=-1)[torch.arange(len(outputs)), torch.tensor(outputs)]
    assert len(logprobs) == len(argmax) == len(outputs)
    assert max(abs(a - b) for a, b in zip(logprobs, hf_logprobs.tolist())) < HF_TOLERANCE
    top2 = hf.topk(2, dim=-1).values
    for step, (mine, theirs) in enumerate(zip(argmax, hf.argmax(-1).tolist())):
        if top2[step, 0] - top2[step, 1] > 1e-3:  # not a near tie
            assert mine == theirs, step
    if kind == "greedy":
        assert argmax == outputs  # and (above) transformers' argmax agrees away from near ties

    # The cache now holds prompt + outputs[:-1], exactly as a cold read of those tokens would.
    assert cache.length == len(prompt) + len(outputs) - 1
    again = ref.empty()
    ref.read(again, prompt + outputs[:-1])
    assert maxdiff(cache.keys, again.keys) < STATE_TOLERANCE
    assert maxdiff(cache.recurrent, again.recurrent) < STATE_TOLERANCE
    assert maxdiff(cache.conv, again.conv) < STATE_TOLERANCE


# 4. rerotate ---------------------------------------------------------------------------------------------


def rope_fp64(keys, positions, rotary_dim, theta):
    """RoPE with float64 angles through transformers' own apply_rotary_pos_emb (rotate_half, NeoX halves)."""
    angle = positions.to(torch.float64)[:, None] * inv_freq_fp64(rotary_dim, theta)[None, :]
    emb = torch.cat([angle, angle], dim=-1)  # [n, rotary_dim]
    k = keys.transpose(0, 1)[None]  # [1, heads, n, d]
    _, out = apply_rotary_pos_emb(k, k, emb.cos().float()[None], emb.sin().float()[None])
    return out[0].transpose(0, 1)


@pytest.fixture(scope="module")
def raw_keys(ref):
    hidden = torch.randn(16, ref.config.hidden_size, generator=torch.Generator().manual_seed(5))
    return ref.pre_rope_keys(ref.attention_layers[0], hidden)  # [16, 2, 32], k_norm applied, pre-RoPE


@pytest.mark.parametrize("delta", [1, 63, 1000, -1, -250, -3000])
def test_rerotate_equals_rope_at_the_new_position(ref, raw_keys, delta):
    old = torch.arange(3000, 3016)
    new = old + delta
    at_old = rope_fp64(raw_keys, old, ref.rotary_dim, ref.rope_theta)
    at_new = rope_fp64(raw_keys, new, ref.rotary_dim, ref.rope_theta)
    before = at_old.clone()
    moved = rerotate(at_old, old, new, ref.rotary_dim, ref.rope_theta)
    assert maxdiff(moved, at_new) < ROPE_TOLERANCE
    assert torch.equal(at_old, before)  # input not modified
    assert torch.equal(moved[..., ref.rotary_dim :], at_old[..., ref.rotary_dim :])  # pass-through channels
    wrong = rerotate(at_old, old, new, ref.rotary_dim, 1e4)
    assert maxdiff(wrong, at_new) > 1e-2  # the comparison is sensitive to theta


def test_rerotate_zero_delta_and_round_trip(ref, cold):
    cache, _ = cold
    keys, values = cache.rows(10, 50)
    k = keys[1]
    pos = torch.arange(10, 50)
    assert torch.equal(rerotate(k, pos, pos, ref.rotary_dim, ref.rope_theta), k)
    there = rerotate(k, pos, pos + 777, ref.rotary_dim, ref.rope_theta)
    back = rerotate(there, pos + 777, pos, ref.rotary_dim, ref.rope_theta)
    assert maxdiff(back, k) < 1e-5 and maxdiff(there, k) > 1e-2
    # a scalar position broadcasts over rows
    assert torch.equal(rerotate(k, 10, 20, ref.rotary_dim, ref.rope_theta),
                       rerotate(k, torch.full((40,), 10), torch.full((40,), 20), ref.rotary_dim, ref.rope_theta))


def test_reference_keys_are_rope_of_the_pre_rope_keys(ref):
    """A cache key at row p is RoPE(p) of k_norm(k_proj(x)); moving it by rerotate matches RoPE at p'."""
    ids = random_ids(40, seed=6)
    cache = ref.empty()
    captured = {}
    layer = ref.attention_layers[0]
    norm = ref.text.layers[layer].input_layernorm
    handle = norm.register_forward_hook(lambda mod, args, out: captured.setdefault("x", out.clone()))
    try:
        ref.read(cache, ids)
    finally:
        handle.remove()
    raw = ref.pre_rope_keys(layer, captured["x"])
    pos = torch.arange(len(ids))
    assert maxdiff(cache.keys[0], rope_fp64(raw, pos, ref.rotary_dim, ref.rope_theta)) < ROPE_TOLERANCE
    moved = rerotate(cache.keys[0], pos, pos + 500, ref.rotary_dim, ref.rope_theta)
    assert maxdiff(moved, rope_fp64(raw, pos + 500, ref.rotary_dim, ref.rope_theta)) < ROPE_TOLERANCE


# 5. cache helpers ----------------------------------------------------------------------------------------


def test_clone_is_deep(ref, cold):
    cache, _ = cold
    saved = cache.clone()
    copy = cache.clone()
    for t in (*copy.keys, *copy.values, *copy.conv, *copy.recurrent):
        t.add_(1.0)
    ref.read(copy, random_ids(5, seed=7))
    assert copy.length == cache.length + 5
    assert cache.length == saved.length
    for a, b in zip((cache.keys, cache.values, cache.conv, cache.recurrent),
                    (saved.keys, saved.values, saved.conv, saved.recurrent)):
        assert all(torch.equal(x, y) for x, y in zip(a, b))


def test_with_linear_state_forks_the_gdn_state(ref, cold):
    cache, _ = cold
    other = ref.empty()
    ref.read(other, random_ids(50, seed=8))
    snapshot = other.linear_state()
    probe = random_ids(20, seed=9)

    plain = cache.clone()
    plain_logits = ref.read(plain, probe)
    forked = cache.clone()
    forked.with_linear_state(snapshot)
    assert maxdiff(forked.conv, list(snapshot[0])) == 0 and maxdiff(forked.recurrent, list(snapshot[1])) == 0
    assert maxdiff(forked.keys, cache.keys) == 0 and forked.length == cache.length  # K/V untouched
    forked_logits = ref.read(forked, probe)
    assert maxdiff(forked_logits, plain_logits) > 1e-2  # the state really was replaced
    # the snapshot is a copy: reading after the fork changed neither it nor `other`
    assert maxdiff(list(snapshot[1]), other.recurrent) == 0 and maxdiff(list(snapshot[0]), other.conv) == 0
    # restoring a cache's own snapshot is a no-op
    same = cache.clone()
    same.with_linear_state(cache.linear_state())
    assert maxdiff(ref.read(same, probe), plain_logits) == 0


def test_append_rows_keeps_the_gdn_state_and_rebuilds_the_cache(ref, cold):
    cache, _ = cold
    n = cache.length
    keys, values = cache.rows(0, n)
    rebuilt = ref.empty()
    rebuilt.with_linear_state(cache.linear_state())
    before = rebuilt.linear_state()
    rebuilt.append_rows(keys, values)
    assert rebuilt.length == n
    assert maxdiff(list(before[0]), rebuilt.conv) == 0 and maxdiff(list(before[1]), rebuilt.recurrent) == 0
    # rows() returned copies
    keys[0].add_(1.0)
    assert maxdiff(rebuilt.keys, cache.keys) == 0 and maxdiff(rebuilt.values, cache.values) == 0
    # K/V rows + GDN state are the whole cache: continuing from the rebuilt cache is continuing from the original
    probe = random_ids(10, seed=10)
    assert maxdiff(ref.read(rebuilt, probe), ref.read(cache.clone(), probe)) == 0
    with pytest.raises(IndexError):
        cache.rows(0, n + 1)
