# SPDX-License-Identifier: Apache-2.0
"""The float64 reference (kdagen/reference.py) against an independent chunked (WY / UT-transform)
formulation written here, plus its argument semantics: ragged batches, B > 1, state cache,
checkpoints, errors. CPU only; no Triton."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from kdagen.reference import (
    chunk_kda_prefill_reference,
    kda_gate_reference,
    l2norm_reference,
    naive_recurrent_kda,
    rel_l2,
)

F64 = torch.float64
TIGHT = 1e-11  # float64 vs float64, different algorithms


# --------------------------------------------------------------------------------------------
# Independent formulation: chunked KDA with a K-first state S [K, V] (docs/semantics.md, "The chunked form"),
# written straight from the equations, chunk 16, natural-log domain.
# --------------------------------------------------------------------------------------------
def chunked_kda_kfirst(q, k, v, g, beta, scale, S0, BT=16):
    """One sequence: q, k, g [T, H, K]; v [T, H, V]; beta [T, H]; S0 [H, K, V]. Returns (o, S)."""
    T, H, K = k.shape
    V = v.shape[-1]
    S = S0.clone()
    o = torch.zeros(T, H, V, dtype=F64)
    for c0 in range(0, T, BT):
        c1 = min(c0 + BT, T)
        L = c1 - c0
        qc, kc, vc, gc = (x[c0:c1].transpose(0, 1) for x in (q, k, v, g))  # [H, L, *]
        bc = beta[c0:c1].transpose(0, 1)  # [H, L]
        G = gc.cumsum(1)
        t_idx = torch.arange(L)
        lower_incl = t_idx[:, None] >= t_idx[None, :]
        strict = t_idx[:, None] > t_idx[None, :]
        diff = G[:, :, None, :] - G[:, None, :, :]  # [H, t, s, K]
        E = torch.exp(torch.where(lower_incl[None, :, :, None], diff, torch.zeros_like(diff)))
        Akk = bc[:, :, None] * torch.einsum("htd,hsd,htsd->hts", kc, kc, E) * strict
        Aqk = scale * torch.einsum("htd,hsd,htsd->hts", qc, kc, E) * lower_incl
        Tinv = torch.linalg.inv(torch.eye(L, dtype=F64) + Akk)
        w = Tinv @ (bc[..., None] * kc * torch.exp(G))
        u = Tinv @ (bc[..., None] * vc)
        qg = qc * torch.exp(G)
        kg = kc * torch.exp(G[:, -1:, :] - G)
        decay = torch.exp(G[:, -1, :])  # [H, K]
        v_new = u - w @ S
        o[c0:c1] = (scale * (qg @ S) + Aqk @ v_new).transpose(0, 1)
        S = decay[..., None] * S + kg.transpose(1, 2) @ v_new
    return o, S


def make_inputs(T_total, H, K, V, B=1, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)

    def rn(*shape, s=1.0):
        return (torch.randn(*shape, generator=g, dtype=torch.float64) * s).to(dtype)

    return dict(
        q=rn(B, T_total, H, K),
        k=rn(B, T_total, H, K),
        v=rn(B, T_total, H, V),
        raw_g=rn(B, T_total, H, K),
        raw_beta=rn(B, T_total, H),
        A_log=rn(H, s=0.5).float(),
        g_bias=rn(H * K, s=0.5).float(),
    )


def preprocess(inp, lower_bound, l2norm, b=0):
    """Float64 q, k, v, g, beta of batch row b (independent of the reference's own glue)."""
    q, k = inp["q"][b].double(), inp["k"][b].double()
    if l2norm:
        q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6)
        k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    H, K = q.shape[1], q.shape[2]
    z = inp["raw_g"][b].double() + inp["g_bias"].double().view(H, K)
    a = torch.exp(inp["A_log"].double()).view(H, 1)
    if lower_bound is None:
        gg = -a * torch.where(z > 20, z, torch.log1p(torch.exp(z)))
    else:
        gg = lower_bound * (1.0 / (1.0 + torch.exp(-a * z)))
    beta = 1.0 / (1.0 + torch.exp(-inp["raw_beta"][b].double()))
    return q, k, inp["v"][b].double(), gg, beta


def rand_state(N, H, V, K, seed=1):
    return torch.randn(N, H, V, K, generator=torch.Generator().manual_seed(seed), dtype=F64).float() * 0.3


# --------------------------------------------------------------------------------------------
# Numerics against the chunked formulation
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("lower_bound", [None, -5.0])
@pytest.mark.parametrize("l2norm", [False, True])
def test_single_sequence_matches_chunked_wy(lower_bound, l2norm):
    T, H, K, V = 37, 2, 32, 48
    inp = make_inputs(T, H, K, V, seed=3)
    h0 = rand_state(1, H, V, K)
    scale = 0.37
    o, ht = chunk_kda_prefill_reference(
        **inp, scale=scale, initial_state=h0, output_final_state=True,
        lower_bound=lower_bound, use_qk_l2norm_in_kernel=l2norm,
    )
    assert o.dtype == F64 and o.shape == (1, T, H, V)
    assert ht.dtype == F64 and ht.shape == (1, H, V, K)
    q, k, v, gg, beta = preprocess(inp, lower_bound, l2norm)
    o_c, S_c = chunked_kda_kfirst(q, k, v, gg, beta, scale, h0[0].double().transpose(-1, -2))
    assert rel_l2(o[0], o_c) < TIGHT
    assert rel_l2(ht[0], S_c.transpose(-1, -2)) < TIGHT  # V-first vs K-first
    # The exposed pieces agree with the whole op.
    o_n, ht_n = naive_recurrent_kda(q, k, v, gg, beta, scale, h0[0])
    assert rel_l2(o_n, o[0]) < TIGHT and rel_l2(ht_n, ht[0]) < TIGHT


def test_default_scale_and_zero_initial_state():
    T, H, K, V = 20, 1, 16, 24
    inp = make_inputs(T, H, K, V, seed=5)
    o, ht = chunk_kda_prefill_reference(**inp, output_final_state=True)
    q, k, v, gg, beta = preprocess(inp, None, False)
    o_c, S_c = chunked_kda_kfirst(q, k, v, gg, beta, K**-0.5, torch.zeros(H, K, V, dtype=F64))
    assert rel_l2(o[0], o_c) < TIGHT and rel_l2(ht[0], S_c.transpose(-1, -2)) < TIGHT
    o2, none = chunk_kda_prefill_reference(**inp)
    assert none is None and torch.equal(o2, o)


@pytest.mark.parametrize("lower_bound", [None, -5.0])
def test_ragged_batch_with_empty_and_single_token_sequences(lower_bound):
    lens = [0, 1, 21, 0, 40, 1]
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32)
    T, H, K, V = int(cu[-1]), 2, 32, 48
    inp = make_inputs(T, H, K, V, seed=7)
    h0 = rand_state(len(lens), H, V, K, seed=8)
    o, ht = chunk_kda_prefill_reference(
        **inp, initial_state=h0, output_final_state=True, lower_bound=lower_bound,
        use_qk_l2norm_in_kernel=True, cu_seqlens=cu,
    )
    q, k, v, gg, beta = preprocess(inp, lower_bound, True)
    scale = K**-0.5
    for n, ln in enumerate(lens):
        b, e = int(cu[n]), int(cu[n + 1])
        if ln == 0:
            assert torch.equal(ht[n], h0[n].double())  # T = 0: final state = initial state
            continue
        o_c, S_c = chunked_kda_kfirst(
            q[b:e], k[b:e], v[b:e], gg[b:e], beta[b:e], scale, h0[n].double().transpose(-1, -2)
        )
        assert rel_l2(o[0, b:e], o_c) < TIGHT, n
        assert rel_l2(ht[n], S_c.transpose(-1, -2)) < TIGHT, n


def test_batch_rows_equal_packed_equivalent():
    B, T, H, K, V = 3, 19, 2, 16, 8
    inp = make_inputs(T, H, K, V, B=B, seed=11)
    h0 = rand_state(B, H, V, K, seed=12)
    o_b, ht_b = chunk_kda_prefill_reference(**inp, initial_state=h0, output_final_state=True, lower_bound=-5.0)
    packed = {name: (x.reshape(1, B * T, *x.shape[2:]) if x.dim() >= 3 else x) for name, x in inp.items()}
    cu = torch.arange(B + 1, dtype=torch.int64) * T
    o_p, ht_p = chunk_kda_prefill_reference(
        **packed, initial_state=h0, output_final_state=True, lower_bound=-5.0, cu_seqlens=cu
    )
    assert o_b.shape == (B, T, H, V)
    torch.testing.assert_close(o_b.reshape(1, B * T, H, V), o_p, rtol=0, atol=1e-13)
    torch.testing.assert_close(ht_b, ht_p, rtol=0, atol=1e-13)


def test_strided_raw_g_and_raw_beta():
    T, H, K, V = 12, 2, 16, 16
    inp = make_inputs(T, H, K, V, seed=13)
    wide = torch.randn(1, T, H * K * 3 + H + 5, dtype=torch.float32)
    wide[..., 7 : 7 + H * K] = inp["raw_g"].reshape(1, T, H * K)
    wide[..., 3 * H * K : 3 * H * K + H] = inp["raw_beta"]
    strided = dict(inp, raw_g=wide[..., 7 : 7 + H * K].view(1, T, H, K), raw_beta=wide[..., 3 * H * K : 3 * H * K + H])
    assert not strided["raw_g"].is_contiguous()
    o1, _ = chunk_kda_prefill_reference(**inp, lower_bound=-5.0)
    o2, _ = chunk_kda_prefill_reference(**strided, lower_bound=-5.0)
    assert torch.equal(o1, o2)


def test_empty_batch_and_all_empty_sequences():
    H, K, V = 2, 16, 8
    inp = make_inputs(0, H, K, V)
    o, ht = chunk_kda_prefill_reference(**inp, output_final_state=True, cu_seqlens=torch.tensor([0, 0, 0]))
    assert o.shape == (1, 0, H, V) and ht.shape == (2, H, V, K) and not bool(ht.any())
    o, ht = chunk_kda_prefill_reference(**inp, output_final_state=True, cu_seqlens=torch.tensor([0]))
    assert ht.shape == (0, H, V, K)


# --------------------------------------------------------------------------------------------
# Gate, l2norm, rel_l2
# --------------------------------------------------------------------------------------------
def test_gate_forms():
    H, K = 2, 4
    A_log = torch.tensor([0.3, -0.2])
    bias = torch.linspace(-1, 1, H * K)
    raw = torch.tensor([[-3.0, 0.5, 19.0, 25.0], [1.0, -0.7, 30.0, -40.0]])
    z = raw.double() + bias.double().view(H, K)
    a = torch.exp(A_log.double()).view(H, 1)
    g = kda_gate_reference(raw, A_log, bias, None)
    expect = -a * torch.where(z > 20, z, torch.log1p(torch.exp(z)))
    torch.testing.assert_close(g, expect, rtol=1e-14, atol=0)
    assert g[0, 3].item() == -a[0, 0].item() * z[0, 3].item()  # linear above the threshold
    g_lb = kda_gate_reference(raw, A_log, bias, -5.0)
    torch.testing.assert_close(g_lb, -5.0 / (1 + torch.exp(-a * z)), rtol=1e-14, atol=0)
    assert bool((g_lb < 0).all()) and bool((g_lb > -5.0).all())
    torch.testing.assert_close(kda_gate_reference(raw, A_log, None, None), -a * F.softplus(raw.double()))


def test_l2norm_eps_inside_sqrt():
    x = torch.tensor([[3.0, 4.0], [0.0, 0.0]])
    y = l2norm_reference(x)
    assert math.isclose(y[0, 0].item(), 3.0 / math.sqrt(25.0 + 1e-6), rel_tol=1e-15)
    assert torch.equal(y[1], torch.zeros(2, dtype=F64))


def test_rel_l2():
    b = torch.tensor([3.0, 4.0])
    assert rel_l2(b, b) == 0.0
    assert math.isclose(rel_l2(torch.tensor([3.0, 5.0]), b), 0.2)
    assert math.isnan(rel_l2(torch.tensor([float("nan"), 4.0]), b))
    assert math.isinf(rel_l2(torch.tensor([float("inf"), 4.0]), b))
    assert rel_l2(torch.zeros(2), torch.zeros(2)) == 0.0
    assert math.isinf(rel_l2(torch.ones(2), torch.zeros(2)))
    with pytest.raises(ValueError, match="shapes differ"):
        rel_l2(torch.zeros(2), torch.zeros(3))


# --------------------------------------------------------------------------------------------
# State cache
# --------------------------------------------------------------------------------------------
def test_state_cache_in_place():
    lens = [9, 0, 14]
    cu = torch.tensor([0, 9, 9, 23], dtype=torch.int32)
    H, K, V = 2, 16, 24
    inp = make_inputs(23, H, K, V, seed=17)
    cache = rand_state(6, H, V, K, seed=18)
    cache[1] = float("nan")  # sequence 2 has no initial state: its row must never be read
    before = cache.clone()
    state_indices = torch.tensor([4, 0, 1], dtype=torch.int32)
    has_initial_state = torch.tensor([True, True, False])
    o, none = chunk_kda_prefill_reference(
        **inp, lower_bound=-5.0, cu_seqlens=cu, state_cache=cache,
        state_indices=state_indices, has_initial_state=has_initial_state,
    )
    assert none is None
    h0 = torch.stack([before[4], before[0], torch.zeros(H, V, K)])
    o_ref, ht_ref = chunk_kda_prefill_reference(
        **inp, lower_bound=-5.0, cu_seqlens=cu, initial_state=h0, output_final_state=True
    )
    assert torch.equal(o, o_ref)
    assert bool(torch.isfinite(o).all())
    for n, slot in enumerate([4, 0, 1]):
        assert torch.equal(cache[slot], ht_ref[n].float()), n  # cast to the cache dtype
    assert torch.equal(cache[0], before[0])  # T = 0 sequence: its initial state is written back
    for slot in (2, 3, 5):
        assert torch.equal(cache[slot], before[slot])  # rows outside state_indices untouched
    assert lens[1] == 0


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(initial_state=True), "state_cache replaces initial_state/output_final_state"),
        (dict(output_final_state=True), "state_cache replaces initial_state/output_final_state"),
        (dict(state_indices=None), "state_cache needs state_indices and has_initial_state"),
        (dict(has_initial_state=None), "state_cache needs state_indices and has_initial_state"),
    ],
)
def test_state_cache_errors(kwargs, message):
    H, K, V = 1, 8, 8
    inp = make_inputs(4, H, K, V)
    args = dict(
        state_cache=torch.zeros(2, H, V, K),
        state_indices=torch.tensor([1], dtype=torch.int32),
        has_initial_state=torch.tensor([False]),
        cu_seqlens=torch.tensor([0, 4], dtype=torch.int32),
    )
    if kwargs.get("initial_state") is True:
        kwargs = dict(initial_state=torch.zeros(1, H, V, K))
    args.update(kwargs)
    with pytest.raises(ValueError, match=message.replace("/", ".")):
        chunk_kda_prefill_reference(**inp, **args)


def test_other_argument_errors():
    H, K, V = 1, 8, 8
    inp = make_inputs(4, H, K, V, B=2)
    with pytest.raises(ValueError, match="cu_seqlens needs batch size 1"):
        chunk_kda_prefill_reference(**inp, cu_seqlens=torch.tensor([0, 4]))
    with pytest.raises(ValueError, match="checkpoint_state and checkpoint_offsets must be given together"):
        chunk_kda_prefill_reference(**inp, checkpoint_state=torch.zeros(2, H, V, K))
    with pytest.raises(ValueError, match="checkpoint_state and checkpoint_offsets must be given together"):
        chunk_kda_prefill_reference(**inp, checkpoint_offsets=torch.tensor([1, 1]))
    with pytest.raises(ValueError, match="initial_state must be"):
        chunk_kda_prefill_reference(**inp, initial_state=torch.zeros(2, H, K, V + 1))


# --------------------------------------------------------------------------------------------
# Checkpoints
# --------------------------------------------------------------------------------------------
def _truncated_final(inp, cu, n, offset, h0, **kw):
    b = int(cu[n])
    part = {name: (x[:, b : b + offset] if x.dim() >= 3 else x) for name, x in inp.items()}
    _, ht = chunk_kda_prefill_reference(**part, initial_state=h0[n : n + 1], output_final_state=True, **kw)
    return ht[0]


def test_checkpoints_equal_truncated_prefill():
    lens = [40, 7, 0, 33, 20]
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int64)
    H, K, V = 2, 16, 24
    inp = make_inputs(int(cu[-1]), H, K, V, seed=21)
    h0 = rand_state(len(lens), H, V, K, seed=22)
    kw = dict(lower_bound=-5.0, use_qk_l2norm_in_kernel=True)
    # offsets: valid, invalid (== T), none (T = 0), valid (unaligned), negative row skips it.
    offsets = torch.tensor([16, 7, 3, 5, 10], dtype=torch.int32)
    rows = torch.tensor([3, 0, 1, 6, -1], dtype=torch.int32)
    ckpt = torch.full((8, H, V, K), float("nan"))
    o_ck, ht_ck = chunk_kda_prefill_reference(
        **inp, initial_state=h0, output_final_state=True, cu_seqlens=cu,
        checkpoint_state=ckpt, checkpoint_offsets=offsets, checkpoint_state_indices=rows, **kw,
    )
    o, ht = chunk_kda_prefill_reference(**inp, initial_state=h0, output_final_state=True, cu_seqlens=cu, **kw)
    assert torch.equal(o_ck, o) and torch.equal(ht_ck, ht)  # exporting does not perturb anything
    torch.testing.assert_close(ckpt[3], _truncated_final(inp, cu, 0, 16, h0, **kw).float(), rtol=0, atol=1e-6)
    torch.testing.assert_close(ckpt[6], _truncated_final(inp, cu, 3, 5, h0, **kw).float(), rtol=0, atol=1e-6)
    for row in (0, 1, 2, 4, 5, 7):
        assert bool(torch.isnan(ckpt[row]).all()), row  # nothing else was written

    # Without checkpoint_state_indices, the row is the sequence index; float64 destination is exact.
    ckpt64 = torch.full((5, H, V, K), float("nan"), dtype=F64)
    chunk_kda_prefill_reference(
        **inp, initial_state=h0, cu_seqlens=cu, checkpoint_state=ckpt64,
        checkpoint_offsets=torch.tensor([39, 0, 0, 1, 19]), **kw,
    )
    for n, off in [(0, 39), (3, 1), (4, 19)]:
        torch.testing.assert_close(ckpt64[n], _truncated_final(inp, cu, n, off, h0, **kw), rtol=0, atol=1e-13)
    for n in (1, 2):
        assert bool(torch.isnan(ckpt64[n]).all())


def test_checkpoint_into_state_cache_rows():
    """Checkpoint rows may live in the state cache itself (vLLM passes block-table rows)."""
    cu = torch.tensor([0, 30], dtype=torch.int32)
    H, K, V = 1, 8, 16
    inp = make_inputs(30, H, K, V, seed=31)
    cache = rand_state(4, H, V, K, seed=32)
    before = cache.clone()
    chunk_kda_prefill_reference(
        **inp, cu_seqlens=cu, state_cache=cache, state_indices=torch.tensor([2]),
        has_initial_state=torch.tensor([True]), checkpoint_state=cache,
        checkpoint_offsets=torch.tensor([16]), checkpoint_state_indices=torch.tensor([3]),
    )
    h0 = before[2:3]
    torch.testing.assert_close(cache[3], _truncated_final(inp, cu, 0, 16, h0).float(), rtol=0, atol=1e-6)
    _, ht = chunk_kda_prefill_reference(**inp, cu_seqlens=cu, initial_state=h0, output_final_state=True)
    assert torch.equal(cache[2], ht[0].float())
    assert torch.equal(cache[0], before[0]) and torch.equal(cache[1], before[1])
