# SPDX-License-Identifier: Apache-2.0
"""Triton path on a real GPU (the H200): the shapes of vLLM's KDA chunk tests (H = 12), every
generated variant on a ragged batch, the features, and, when fla-core is importable, FLA's chunk_kda
on the same inputs. Tolerances: tests/kda_cases.py.
"""

from __future__ import annotations

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("no GPU", allow_module_level=True)

import kdagen_kernels
from kdagen.reference import chunk_kda_prefill_reference, rel_l2
from tests.kda_cases import make_inputs, poisoned_out
from tests.tolerances import check, within

DEV = "cuda"
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
KIMI = next(e for e in kdagen_kernels.VARIANTS
            if (e.backend, e.dtype, e.head_dim_k, e.head_dim_v, e.chunk_size) == ("triton", "bf16", 128, 128, 64))
OUT, STATE = ("triton-gpu", "bf16", "output"), ("triton-gpu", "bf16", "final_state")
SEQLENS = [[1], [64], [1024], [4096], [513, 64, 1, 1200], [512] * 6]

try:
    from fla.ops.kda import chunk_kda as fla_chunk_kda
except Exception:  # fla-core is optional
    fla_chunk_kda = None


def _run_and_check(args, dtype: str, label: str, *, adversarial: bool = False):
    ref_o, ref_s = chunk_kda_prefill_reference(**args)
    out = poisoned_out(args["v"])
    o, s = kdagen_kernels.chunk_kda_prefill(**args, out=out)
    torch.cuda.synchronize()
    qo, qs = ("adversarial", "adversarial") if adversarial else ("output", "final_state")
    eo = check(f"{label} output", o, ref_o, ("triton-gpu", dtype, qo))
    es = check(f"{label} final state", s, ref_s, ("triton-gpu", dtype, qs)) if ref_s is not None else float("nan")
    print(f"\n  {label}: rel L2 output {eo:.2e}, final state {es:.2e}", end="")
    return o, s, ref_o, ref_s


@pytest.mark.parametrize("lens", SEQLENS, ids=lambda L: "x".join(map(str, L[:4])) + ("..." if len(L) > 4 else ""))
def test_vllm_shapes_h12(lens):
    args = make_inputs(lens, 12, 128, 128, torch.bfloat16, DEV, seed=len(lens) + sum(lens))
    _run_and_check(args, "bf16", f"H=12 lens={lens[:4]}")


@pytest.mark.parametrize("e", [e for e in kdagen_kernels.VARIANTS if e.backend == "triton"], ids=lambda e: e.name)
# -5 and -8 take the two matrix-unit forms of the prologue's diagonal blocks, softplus the exact one
# (kdagen.runtime.triton_path.diag_ref).
@pytest.mark.parametrize("lower_bound", [-5.0, -8.0, None], ids=["lower_bound_gate", "lower_bound_-8", "softplus_gate"])
def test_every_variant_ragged(e, lower_bound):
    c = e.chunk_size
    args = make_inputs([3 * c + 7, 0, 1, c, 200], 4, e.head_dim_k, e.head_dim_v, DTYPES[e.dtype], DEV,
                       lower_bound=lower_bound, seed=11)
    _run_and_check(args, e.dtype, e.name)


def test_adversarial_regime():
    # Near-duplicate keys, real K3 gate biases in [-7.8, -1.4], beta near 0.95, T = 1088.
    args = make_inputs([1088], 12, 128, 128, torch.bfloat16, DEV, adversarial=True, seed=5)
    _run_and_check(args, "bf16", "adversarial", adversarial=True)


def test_strided_raw_projections_and_strided_out():
    args = make_inputs([300, 5, 77], 12, 128, 128, torch.bfloat16, DEV, strided=True, seed=6)
    assert not args["raw_g"].is_contiguous() and args["raw_beta"].stride(1) == 12 * 128 + 12 + 5
    ref_o, ref_s = chunk_kda_prefill_reference(**args)
    big = torch.full((1, 382, 12, 160), float("nan"), dtype=torch.bfloat16, device=DEV)
    out = big[..., 16:144]
    o, s = kdagen_kernels.chunk_kda_prefill(**args, out=out)
    assert o.data_ptr() == out.data_ptr()
    check("strided out", o, ref_o, OUT)
    check("strided final state", s, ref_s, STATE)
    assert torch.isnan(big[..., :16]).all() and torch.isnan(big[..., 144:]).all()


def test_state_cache_in_place():
    args = make_inputs([700, 0, 1, 130], 12, 128, 128, torch.bfloat16, DEV, seed=7)
    h0 = args.pop("initial_state")
    args.pop("output_final_state")
    cache = torch.randn(9, 12, 128, 128, device=DEV)
    rows = torch.tensor([7, 0, 3, 4], dtype=torch.int32, device=DEV)
    flags = torch.tensor([True, False, True, False], device=DEV)
    cache[rows.long()] = h0
    cache[0] = float("nan")
    cache[4] = float("nan")
    before = cache.clone()
    ref_cache = cache.clone()
    ref_o, _ = chunk_kda_prefill_reference(**args, state_cache=ref_cache, state_indices=rows,
                                           has_initial_state=flags)
    o, s = kdagen_kernels.chunk_kda_prefill(**args, state_cache=cache, state_indices=rows, has_initial_state=flags,
                                            out=poisoned_out(args["v"]))
    assert s is None
    check("state-cache output", o, ref_o, OUT)
    for r in (7, 0, 3, 4):
        check(f"cache row {r}", cache[r], ref_cache[r].float(), STATE)
    for r in (1, 2, 5, 6, 8):
        assert torch.equal(cache[r], before[r])


@pytest.mark.parametrize("groups", ["1", "2", "7", "32"])
def test_group_counts_match_reference(monkeypatch, groups):
    # The two-pass walk at forced group counts (auto picks G > 1 for the [1024] and [4096] shapes above),
    # with a paged state cache: ragged groups, more groups than a sequence has chunks, T = 0 and T = 1.
    monkeypatch.setenv("KDAGEN_TRITON_GROUPS", groups)
    args = make_inputs([2000, 0, 1, 700, 64], 12, 128, 128, torch.bfloat16, DEV, seed=31)
    h0 = args.pop("initial_state")
    args.pop("output_final_state")
    cache = torch.randn(8, 12, 128, 128, device=DEV)
    rows = torch.tensor([6, 0, 2, 3, 5], dtype=torch.int32, device=DEV)
    flags = torch.tensor([True, True, False, True, False], device=DEV)
    cache[rows.long()] = h0
    cache[2] = float("nan")
    before = cache.clone()
    ref_cache = cache.clone()
    ref_o, _ = chunk_kda_prefill_reference(**args, state_cache=ref_cache, state_indices=rows,
                                           has_initial_state=flags)
    o, _ = kdagen_kernels.chunk_kda_prefill(**args, state_cache=cache, state_indices=rows, has_initial_state=flags,
                                            out=poisoned_out(args["v"]))
    eo = check(f"G={groups} output", o, ref_o, OUT)
    es = max(check(f"G={groups} cache row {r}", cache[r], ref_cache[r].float(), STATE)
             for r in (6, 0, 2, 3, 5))
    print(f"\n  G={groups}: rel L2 output {eo:.2e}, worst state row {es:.2e}", end="")
    for r in (1, 4, 7):
        assert torch.equal(cache[r], before[r])
    # The T = 0 sequence (row 0, flag set) passes its initial state through bit for bit: empty groups
    # are skipped by the scan, not multiplied by I on tf32x3.
    assert torch.equal(cache[0], before[0])


@pytest.mark.parametrize("e", [e for e in kdagen_kernels.VARIANTS if e.backend == "triton"], ids=lambda e: e.name)
def test_every_variant_group_scan(monkeypatch, e):
    # Every variant (K != V, fp16, K = 64) through the grouped walk: auto keeps G = 1 on these small batches.
    monkeypatch.setenv("KDAGEN_TRITON_GROUPS", "3")
    c = e.chunk_size
    args = make_inputs([5 * c + 7, 0, 1, c, 200], 4, e.head_dim_k, e.head_dim_v, DTYPES[e.dtype], DEV, seed=12)
    _run_and_check(args, e.dtype, f"{e.name} G=3")


def test_device_metadata_and_graph_capture_equal_eager():
    args = make_inputs([513, 64, 1, 1200], 12, 128, 128, torch.bfloat16, DEV, seed=8)
    ci, co = kdagen_kernels.prepare_chunk_metadata_device(args["cu_seqlens"], args["cu_seqlens"].cpu(), 64)
    o_eager, s_eager = kdagen_kernels.chunk_kda_prefill(**args, chunk_indices=ci, chunk_offsets=co,
                                                        out=poisoned_out(args["v"]))
    out = poisoned_out(o_eager)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):  # warm up (compile) outside the capture
        kdagen_kernels.chunk_kda_prefill(**args, chunk_indices=ci, chunk_offsets=co, out=out)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _, s_graph = kdagen_kernels.chunk_kda_prefill(**args, chunk_indices=ci, chunk_offsets=co, out=out)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, o_eager) and torch.equal(s_graph, s_eager)


@pytest.mark.skipif(fla_chunk_kda is None, reason="fla-core not importable")
@pytest.mark.parametrize("lens", [[4096], [513, 64, 1, 1200]], ids=["4096", "ragged"])
def test_error_no_worse_than_fla(lens):
    args = make_inputs(lens, 12, 128, 128, torch.bfloat16, DEV, seed=9)
    ref_o, ref_s = chunk_kda_prefill_reference(**args)
    o, s = kdagen_kernels.chunk_kda_prefill(**args, out=poisoned_out(args["v"]))
    fo, fs = fla_chunk_kda(
        q=args["q"], k=args["k"], v=args["v"], g=args["raw_g"], beta=args["raw_beta"],
        initial_state=args["initial_state"], output_final_state=True, use_qk_l2norm_in_kernel=True,
        use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True, safe_gate=True, lower_bound=-5.0,
        state_v_first=True, cu_seqlens=args["cu_seqlens"].long(), A_log=args["A_log"], dt_bias=args["g_bias"])
    errs = {"ours_o": rel_l2(o, ref_o), "fla_o": rel_l2(fo, ref_o),
            "ours_s": rel_l2(s, ref_s), "fla_s": rel_l2(fs, ref_s)}
    print(f"\n  vs FLA {lens[:4]}: " + ", ".join(f"{k} {v:.2e}" for k, v in errs.items()), end="")
    for q in ("o", "s"):  # our error over FLA's on the same inputs
        within(f"error ratio to FLA ({q}) {errs}", errs[f"ours_{q}"] / errs[f"fla_{q}"],
               ("triton-gpu", "bf16", "ratio_to_fla"))
