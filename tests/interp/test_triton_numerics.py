# SPDX-License-Identifier: Apache-2.0
"""Triton path numerics in the interpreter against the float64 reference, for every generated variant.

Runs under TRITON_INTERPRET=1 on CPU tensors. Shapes stay small (the interpreter runs programs one
after another); every variant of the registry is covered, so a new spec variant is tested here
without touching this file.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

import kdagen_kernels
from kdagen.runtime import dispatch, planning, triton_path
from kdagen.reference import chunk_kda_prefill_reference
from kdagen.launch_knobs import dense_tuning
from kdagen.runtime import metadata as md
from tests.kda_cases import make_inputs, poisoned_out
from tests.tolerances import check

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="interpreter numerics: run with TRITON_INTERPRET=1")

TRITON = [e for e in kdagen_kernels.VARIANTS if e.backend == "triton"]
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
TB = "triton_intra_tb+triton_walk_tb"  # kda_intra_tb + kda_recurrence_tb: the walk forms u from v


def _heads(e) -> int:
    return 1 if max(e.head_dim_k, e.head_dim_v) > 128 else 2


def _lens(e) -> list[int]:
    # Ragged: a sequence spanning chunks with a ragged tail, an empty one, a single token, and one
    # exactly a chunk long.
    c = e.chunk_size
    return [c + c // 2 + 3, 0, 1, c]


def _out(e) -> tuple[str, str, str]:
    return ("triton-interp", e.dtype, "output")


def _state(e) -> tuple[str, str, str]:
    return ("triton-interp", e.dtype, "final_state")


def _run(e, args):
    ref_o, ref_s = chunk_kda_prefill_reference(**args)
    out = poisoned_out(args["v"])
    o, s = kdagen_kernels.chunk_kda_prefill(**args, out=out)
    assert o is out
    check(f"{e.name} output", o, ref_o, _out(e))
    if ref_s is not None:
        check(f"{e.name} final state", s, ref_s, _state(e))
    return o, s


@pytest.mark.parametrize("e", TRITON, ids=lambda e: e.name)
@pytest.mark.parametrize("lower_bound", [-5.0, None], ids=["lower_bound_gate", "softplus_gate"])
def test_ragged_batch_matches_reference(e, lower_bound):
    args = make_inputs(_lens(e), _heads(e), e.head_dim_k, e.head_dim_v, DTYPES[e.dtype], "cpu",
                       lower_bound=lower_bound, seed=1)
    _run(e, args)


@pytest.mark.parametrize("e", TRITON[:1], ids=lambda e: e.name)
def test_without_bias_or_initial_state(e):
    args = make_inputs([e.chunk_size + 5, 2], 2, e.head_dim_k, e.head_dim_v, DTYPES[e.dtype], "cpu",
                       g_bias=False, h0=False, seed=2)
    args["output_final_state"] = True
    _run(e, args)


def _small():
    return min(TRITON, key=lambda e: (e.dtype != "bf16", e.head_dim_k * e.head_dim_v))


def test_adversarial_regime_small():
    # Near-duplicate keys, real K3 gate biases, beta near 0.95: the inverse's hardest case.
    e = _small()
    args = make_inputs([e.chunk_size + 9, 4], 2, e.head_dim_k, e.head_dim_v, DTYPES[e.dtype], "cpu",
                       adversarial=True, seed=12)
    _run(e, args)


def test_strided_raw_projections():
    e = _small()
    args = make_inputs([40, 7], 2, e.head_dim_k, e.head_dim_v, DTYPES[e.dtype], "cpu", strided=True, seed=3)
    assert not args["raw_g"].is_contiguous() and not args["raw_beta"].is_contiguous()
    _run(e, args)


def test_out_is_a_strided_view_of_a_larger_buffer():
    e = _small()
    args = make_inputs([30, 3], 2, e.head_dim_k, e.head_dim_v, DTYPES[e.dtype], "cpu", seed=4)
    ref_o, _ = chunk_kda_prefill_reference(**args)
    big = torch.full((1, 33, 2, e.head_dim_v + 8), float("nan"), dtype=args["v"].dtype)
    out = big[..., 4:4 + e.head_dim_v]
    o, _ = kdagen_kernels.chunk_kda_prefill(**args, out=out)
    assert o.data_ptr() == out.data_ptr()
    check("strided out", o, ref_o, _out(e))
    assert torch.isnan(big[..., :4]).all() and torch.isnan(big[..., 4 + e.head_dim_v:]).all()


def test_state_cache_gather_run_scatter_in_place():
    e = _small()
    H, K, V = 2, e.head_dim_k, e.head_dim_v
    args = make_inputs([20, 0, 1, 9], H, K, V, DTYPES[e.dtype], "cpu", seed=5)
    h0 = args.pop("initial_state")
    args.pop("output_final_state")
    cache = torch.randn(7, H, V, K)
    rows = torch.tensor([5, 0, 2, 3], dtype=torch.int32)
    flags = torch.tensor([True, False, True, False])
    cache[rows.long()] = h0
    cache[0] = float("nan")  # sequence 1 starts from zero: its row must never be read
    cache[3] = float("nan")
    before = cache.clone()
    ref_cache = cache.clone()
    ref_o, none = chunk_kda_prefill_reference(**args, state_cache=ref_cache, state_indices=rows,
                                              has_initial_state=flags)
    assert none is None
    o, s = kdagen_kernels.chunk_kda_prefill(**args, state_cache=cache, state_indices=rows,
                                            has_initial_state=flags, out=poisoned_out(args["v"]))
    assert s is None
    check("state-cache output", o, ref_o, _out(e))
    for r in (5, 0, 2, 3):
        check(f"cache row {r}", cache[r], ref_cache[r].float(), _state(e))
    for r in (1, 4, 6):  # rows outside state_indices stay bit-identical
        assert torch.equal(cache[r], before[r])


def test_batch_without_cu_seqlens_equals_packed():
    e = _small()
    H, K, V = 2, e.head_dim_k, e.head_dim_v
    args = make_inputs([19, 19], H, K, V, DTYPES[e.dtype], "cpu", seed=6)
    packed_o, packed_s = kdagen_kernels.chunk_kda_prefill(**args, out=poisoned_out(args["v"]))
    batched = dict(args)
    del batched["cu_seqlens"]
    for name in ("q", "k", "v", "raw_g"):
        batched[name] = args[name].view(2, 19, H, -1)
    batched["raw_beta"] = args["raw_beta"].view(2, 19, H)
    o, s = kdagen_kernels.chunk_kda_prefill(**batched, out=poisoned_out(batched["v"]))
    assert o.shape == (2, 19, H, V)
    assert torch.equal(o.view_as(packed_o), packed_o)
    assert torch.equal(s, packed_s)


def test_prenormalized_inputs_without_in_kernel_l2norm():
    e = _small()
    args = make_inputs([25], 2, e.head_dim_k, e.head_dim_v, DTYPES[e.dtype], "cpu", seed=7)
    for name in ("q", "k"):
        x = args[name].double()
        args[name] = (x / x.norm(dim=-1, keepdim=True)).to(args[name].dtype)
    args["use_qk_l2norm_in_kernel"] = False
    _run(e, args)


BUILDERS = ("prepare_chunk_indices", "prepare_chunk_offsets", "prepare_chunk_metadata_device")


def _forbid_metadata_builders(monkeypatch) -> None:
    """Make every chunk-metadata builder raise, wherever kdagen has bound it (a module that imported it by
    name holds its own reference): a call that builds metadata itself then fails."""
    originals = [getattr(md, name) for name in BUILDERS]

    def forbidden(*a, **k):
        raise AssertionError("the runtime built chunk metadata although the caller passed it")

    for mod in [m for name, m in sys.modules.items() if name.split(".")[0] in ("kdagen", "kdagen_kernels")]:
        for name, value in list(vars(mod).items()):
            if any(value is f for f in originals):
                monkeypatch.setattr(mod, name, forbidden)


def test_caller_built_chunk_metadata_is_used(monkeypatch):
    e = next(x for x in TRITON if x.chunk_size == 64) if any(x.chunk_size == 64 for x in TRITON) else _small()
    args = make_inputs([70, 0, 5], 2, e.head_dim_k, e.head_dim_v, DTYPES[e.dtype], "cpu", seed=8)
    o2, s2 = kdagen_kernels.chunk_kda_prefill(**args, out=poisoned_out(args["v"]))
    ci, co = kdagen_kernels.prepare_chunk_metadata_device(args["cu_seqlens"], args["cu_seqlens"], e.chunk_size)
    _forbid_metadata_builders(monkeypatch)
    dispatch.clear_plans()  # the wrapper would reuse the first call's plan (Note [Plan cache])
    with pytest.raises(AssertionError, match="built chunk metadata"):  # the guard works
        kdagen_kernels.chunk_kda_prefill(**args, out=poisoned_out(args["v"]))
    o1, s1 = kdagen_kernels.chunk_kda_prefill(**args, chunk_indices=ci, chunk_offsets=co, out=poisoned_out(args["v"]))
    assert torch.equal(o1, o2) and torch.equal(s1, s2)


def test_all_empty_batch_passes_initial_state_through():
    e = _small()
    args = make_inputs([0, 0], 2, e.head_dim_k, e.head_dim_v, DTYPES[e.dtype], "cpu", seed=9)
    o, s = kdagen_kernels.chunk_kda_prefill(**args)
    assert o.shape[1] == 0
    assert torch.equal(s, args["initial_state"])


@pytest.mark.parametrize("groups", ["2", "5"])
def test_group_scan_matches_reference(monkeypatch, groups):
    # KDAGEN_TRITON_GROUPS forces the two-pass walk (on a GPU the cost model picks it for few long
    # sequences): more groups than some sequences have chunks, an empty and a one-token sequence.
    monkeypatch.setenv("KDAGEN_TRITON_GROUPS", groups)
    e = _small()
    c = e.chunk_size
    args = make_inputs([3 * c + 5, 0, 1, 2 * c], 2, e.head_dim_k, e.head_dim_v, DTYPES[e.dtype], "cpu",
                       lower_bound=None, seed=21)
    _run(e, args)


@pytest.mark.parametrize("pipeline", [None, TB], ids=["auto", "tb"])
def test_group_scan_k_ne_v(monkeypatch, pipeline):
    # Pass 1 of the tb walk forms u from v too (its transfer rows read none).
    monkeypatch.setenv("KDAGEN_TRITON_GROUPS", "3")
    if pipeline is not None:
        monkeypatch.setenv("KDAGEN_PIPELINE", pipeline)
    e = max(TRITON, key=lambda e: (e.head_dim_v - e.head_dim_k, e.dtype == "bf16"))
    assert e.head_dim_k != e.head_dim_v
    c = e.chunk_size
    args = make_inputs([2 * c + 9, 0, 1], 1, e.head_dim_k, e.head_dim_v, DTYPES[e.dtype], "cpu", seed=23)
    _, s = _run(e, args)
    # The T = 0 sequence's final state is its initial state, bit for bit, through the grouped walk.
    assert torch.equal(s[1], args["initial_state"][1])


@pytest.mark.parametrize("pipeline", [None, TB], ids=["auto", "tb"])
def test_group_scan_state_cache_in_place(monkeypatch, pipeline):
    monkeypatch.setenv("KDAGEN_TRITON_GROUPS", "3")
    if pipeline is not None:
        monkeypatch.setenv("KDAGEN_PIPELINE", pipeline)
    e = _small()
    H, K, V = 2, e.head_dim_k, e.head_dim_v
    args = make_inputs([4 * e.chunk_size - 3, 0, 9], H, K, V, DTYPES[e.dtype], "cpu", seed=22)
    h0 = args.pop("initial_state")
    args.pop("output_final_state")
    cache = torch.randn(5, H, V, K)
    rows = torch.tensor([3, 0, 1], dtype=torch.int32)
    flags = torch.tensor([True, True, False])
    cache[rows.long()] = h0
    cache[1] = float("nan")  # flag false: never read
    before = cache.clone()
    ref_cache = cache.clone()
    ref_o, _ = chunk_kda_prefill_reference(**args, state_cache=ref_cache, state_indices=rows, has_initial_state=flags)
    o, s = kdagen_kernels.chunk_kda_prefill(**args, state_cache=cache, state_indices=rows, has_initial_state=flags,
                                            out=poisoned_out(args["v"]))
    assert s is None
    check("group-scan state-cache output", o, ref_o, _out(e))
    for r in (3, 0, 1):
        check(f"cache row {r}", cache[r], ref_cache[r].float(), _state(e))
    for r in (2, 4):
        assert torch.equal(cache[r], before[r])


TARGETS = sorted({t for e in TRITON for t in e.targets})


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("wide,groups,design",
                         [(False, 3, None), (True, 1, "pair"), (True, 1, "intra"), (True, 1, "tb")],
                         ids=["small-group_scan", "k_ne_v-plain_walk-pair", "k_ne_v-plain_walk-intra",
                              "k_ne_v-plain_walk-tb"])
def test_target_tuning_block_sizes(monkeypatch, target, wide, groups, design):
    # The interpreter ignores num_warps and num_stages but not the block sizes, which change the code: each
    # target's own tuning (KDAGEN_TARGET picks it, as the device would) runs its V slices (block_v, pass 1's
    # too, intra_block_v) and column slices (prologue_block_k, wu_block_k) against the reference: the group
    # scan's three launches on the smallest variant (softplus gate: the pair), the plain walk with K != V
    # (kda_wu's and kda_intra's u slices walk V, the walk's slices a V wider than K; bounded gate). sm_90's
    # 64-row V slices on kda_intra's 32-row chunks take the walk's transposed products.
    monkeypatch.setenv("KDAGEN_TARGET", target)
    if design in ("intra", "tb"):
        # One SM: the plain walk counts as filling the GPU, so the batch takes the target's dense_* knobs.
        monkeypatch.setattr(planning, "device_sms", lambda device: 1)
    e = max(TRITON, key=lambda e: (e.head_dim_v - e.head_dim_k, e.dtype == "bf16")) if wide else _small()
    c, H, K, V = e.chunk_size, _heads(e), e.head_dim_k, e.head_dim_v
    args = make_inputs([2 * c + 9, 0, 1], H, K, V, DTYPES[e.dtype], "cpu", lower_bound=-5.0 if wide else None,
                       seed=31)
    plan = kdagen_kernels.plan_kda_prefill(
        args["cu_seqlens"], num_heads=H, head_dim_k=K, head_dim_v=V, dtype=DTYPES[e.dtype], device="cpu",
        lower_bound=args["lower_bound"], has_g_bias=True, use_qk_l2norm_in_kernel=True, output_final_state=True,
        groups=groups, **({"pipeline": TB} if design == "tb" else {"design": design}))
    mod = e.load()
    tun = mod.TUNING[target]
    assert (plan.target, plan.tuning, plan.groups, plan.design) == (target, tun, groups, design or "pair")
    walks = plan.program.walks[1]  # the dense initial state
    if plan.design == "pair":
        assert plan.program.prologue.constexprs["BLOCK_K"] == tun["prologue_block_k"]
        assert plan.program.wu.constexprs["BLOCK_K"] == tun["wu_block_k"]
        assert walks[-1].constexprs["BLOCK_V"] == min(tun["block_v"], mod.BV)
    else:
        if design == "intra":
            assert plan.program.intra.constexprs["BLOCK_V"] == min(tun["intra_block_v"], mod.BV)
        else:  # kda_intra_tb's 16-row programs take column slices
            block_k = plan.program.intra.constexprs["BLOCK_K"]
            assert block_k == triton_path.tb_block_k(dense_tuning(tun), mod.BK) < mod.BK
        # One SM, so the walks fill the GPU: the target's dense program rows (its walk steps over the chunk's
        # halves or quarters), warps and V slice.
        dense = dense_tuning(tun)
        assert plan.program.intra.constexprs["SPLIT"] == c // dense["intra_rows"] == walks[-1].constexprs["SPLIT"]
        assert plan.program.intra.options["num_warps"] == dense["intra_warps"]
        assert walks[-1].constexprs["BLOCK_V"] == min(dense["block_v"], mod.BV)
    layer = {n: args[n] for n in ("q", "k", "v", "raw_g", "raw_beta", "A_log", "g_bias")}
    o, s = plan.run(**layer, initial_state=args["initial_state"], out=poisoned_out(args["v"]))
    ref_o, ref_s = chunk_kda_prefill_reference(**args)
    check(f"{e.name} on {target}'s tuning, output", o, ref_o, _out(e))
    check(f"{e.name} on {target}'s tuning, final state", s, ref_s, _state(e))


@pytest.mark.parametrize("design", ["intra", "pair", "tb"])
def test_both_chunk_parallel_designs_match_reference(design):
    # Half-chunk edges: sequences ending on a 32-row boundary (96), inside a first half (31, 33), a 64-row
    # chunk whose second half is empty (70 = 64 + 6), T = 0 and T = 1; K != V. The walk of "intra" steps
    # over half chunks while the metadata counts vLLM's 64-row chunks.
    e = next(e for e in TRITON if e.head_dim_k != e.head_dim_v and e.chunk_size == 64)
    args = make_inputs([96, 70, 0, 1, 33, 31], 1, e.head_dim_k, e.head_dim_v, DTYPES[e.dtype], "cpu", seed=21)
    ref_o, ref_s = chunk_kda_prefill_reference(**args)
    cu = args["cu_seqlens"]
    plan = kdagen_kernels.plan_kda_prefill(
        cu, cu, num_heads=1, head_dim_k=e.head_dim_k, head_dim_v=e.head_dim_v, dtype=DTYPES[e.dtype],
        lower_bound=args["lower_bound"], has_g_bias=True, use_qk_l2norm_in_kernel=True, output_final_state=True,
        **({"pipeline": TB} if design == "tb" else {"design": design}))
    assert plan.design == design
    o, s = plan.run(args["q"], args["k"], args["v"], args["raw_g"], args["raw_beta"], args["A_log"], args["g_bias"],
                    initial_state=args["initial_state"], out=poisoned_out(args["v"]))
    check(f"{design} output", o, ref_o, _out(e))
    check(f"{design} final state", s, ref_s, _state(e))


def test_intra_design_refused_where_it_does_not_fit():
    e = _small()
    args = make_inputs([5], 1, e.head_dim_k, e.head_dim_v, DTYPES[e.dtype], "cpu", lower_bound=-8.0, seed=22)
    cu = args["cu_seqlens"]
    with pytest.raises(ValueError, match="triton_intra cannot take this batch: the gate is not bounded"):
        kdagen_kernels.plan_kda_prefill(cu, cu, num_heads=1, head_dim_k=e.head_dim_k, head_dim_v=e.head_dim_v,
                                        dtype=DTYPES[e.dtype], lower_bound=-8.0, has_g_bias=True,
                                        use_qk_l2norm_in_kernel=True, design="intra")
    plan = kdagen_kernels.plan_kda_prefill(cu, cu, num_heads=1, head_dim_k=e.head_dim_k, head_dim_v=e.head_dim_v,
                                           dtype=DTYPES[e.dtype], lower_bound=-8.0, has_g_bias=True,
                                           use_qk_l2norm_in_kernel=True)
    assert plan.design == "pair"
