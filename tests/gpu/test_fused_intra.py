# SPDX-License-Identifier: Apache-2.0
"""kda_intra_kernel (the HIP chunk-parallel kernel on 16-row walk chunks, templates/hip/include/kda_intra.h)
on a real GPU: its workspace against the float64 one (kdagen.reference.intra_workspace_reference) on ragged
batches with T = 0 and T = 1 sequences and lengths off the 16- and 64-row grids, K = V and K != V, NaN-poisoned
outputs (tools/h200_intra_check.py times it and compares a call on its workspace with the Triton path).

Skips without CUDA, on a device target no hip variant declares, and without the compiler it needs."""

from __future__ import annotations

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("no GPU", allow_module_level=True)

from kdagen.reference import intra_workspace_reference, rel_l2
from kdagen.runtime import fused_path
from kdagen.runtime.metadata import prepare_chunk_indices
from tests.tolerances import within

KEY = ("fused-gpu", "bf16", "intra_workspace")
NAMES = ("qg", "kg", "w", "u", "aqk")


def _inputs(lens, H, K, V, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    T = sum(lens)

    def rn(*s):
        return torch.randn(*s, device="cuda", generator=g)

    cu = torch.tensor([0] + lens, device="cuda").cumsum(0).to(torch.int32)
    return dict(q=rn(1, T, H, K).bfloat16(), k=rn(1, T, H, K).bfloat16(), v=rn(1, T, H, V).bfloat16(),
                raw_g=rn(1, T, H, K).bfloat16(), raw_beta=rn(1, T, H).bfloat16(), A_log=rn(H) * 0.5,
                g_bias=rn(H * K) * 0.5, cu_seqlens=cu)


def _poisoned(T, H, K, V, n_chunks):
    ws = fused_path.intra_workspace(T, H, K, V, n_chunks, "cuda")
    for t in ws.values():
        t.fill_(float("nan"))
    return ws


@pytest.mark.parametrize("K,V", [(128, 128), (128, 256)], ids=["k128_v128", "k128_v256"])
@pytest.mark.parametrize("lens", [[1, 0, 45, 83], [1024], [513, 64, 1, 1200]], ids=["tiny", "1024", "ragged"])
def test_intra_workspace_matches_reference(libs, K, V, lens):
    H = 4
    x = _inputs(lens, H, K, V, seed=len(lens) + K + V)
    ci = prepare_chunk_indices(x["cu_seqlens"], 64).to(torch.int32).contiguous()
    T = sum(lens)
    ws = _poisoned(T, H, K, V, ci.shape[0])
    fused_path.run_intra(libs[(K, V)], ws, **x, scale=K ** -0.5, lower_bound=-5.0, chunk_indices=ci)
    ref = intra_workspace_reference(x["q"], x["k"], x["v"], x["raw_g"], x["raw_beta"], x["A_log"], x["g_bias"],
                                    K ** -0.5, -5.0, x["cu_seqlens"])
    live = ~torch.isnan(ref["decay"])
    assert torch.equal(torch.isnan(ws["decay"]), ~live)  # every live walk chunk's decay row, no other
    errs = {n: rel_l2(ws[n], ref[n]) for n in NAMES}  # an unwritten (NaN) element makes its error nan
    errs["decay"] = rel_l2(ws["decay"][live], ref["decay"][live])
    print(f"[kda_intra_kernel {K}/{V} {lens}] " + " ".join(f"{n}={e:.3e}" for n, e in errs.items()))
    for n, e in errs.items():
        within(f"kda_intra_kernel {n}", e, KEY)


def test_intra_strided_projections_match_dense(libs):
    """q, k, v, raw_g as views of wider projections: the element-wise loads, the same workspace bit for bit."""
    K = V = 128
    lens = [300, 77]
    x = _inputs(lens, 3, K, V, seed=5)
    ci = prepare_chunk_indices(x["cu_seqlens"], 64).to(torch.int32).contiguous()
    dense = _poisoned(sum(lens), 3, K, V, ci.shape[0])
    fused_path.run_intra(libs[(K, V)], dense, **x, scale=K ** -0.5, lower_bound=-5.0, chunk_indices=ci)
    y = dict(x)
    for n in ("q", "k", "v", "raw_g"):
        t = x[n]
        y[n] = torch.cat([t, t[..., :4]], -1)[..., :t.shape[-1]]  # row stride K + 4: not 16-byte aligned
        assert y[n].stride(1) % 8 != 0 or y[n].stride(2) % 8 != 0
    strided = _poisoned(sum(lens), 3, K, V, ci.shape[0])
    fused_path.run_intra(libs[(K, V)], strided, **y, scale=K ** -0.5, lower_bound=-5.0, chunk_indices=ci)
    for n in dense:
        assert torch.equal(dense[n].nan_to_num(7.0), strided[n].nan_to_num(7.0)), n


def test_intra_inverse_on_correlated_keys(libs):
    """Near-duplicate keys, beta near 0.95, slow gates: T = (I + A)^-1 has large entries in every block, so w and
    u show an error in any of them (a zeroed off-diagonal block gives 0.15 in the CPU emulation)."""
    K = V = 128
    lens = [45, 300]
    x = _inputs(lens, 2, K, V, seed=11)
    g = torch.Generator(device="cuda").manual_seed(12)
    base = torch.randn(1, 1, 2, K, device="cuda", generator=g)
    x["k"] = (base + 0.05 * torch.randn(x["k"].shape, device="cuda", generator=g)).bfloat16()
    x["raw_beta"] = (3.0 + 0.1 * torch.randn(x["raw_beta"].shape, device="cuda", generator=g)).bfloat16()
    ci = prepare_chunk_indices(x["cu_seqlens"], 64).to(torch.int32).contiguous()
    ws = _poisoned(sum(lens), 2, K, V, ci.shape[0])
    fused_path.run_intra(libs[(K, V)], ws, **x, scale=K ** -0.5, lower_bound=-0.5, chunk_indices=ci)
    ref = intra_workspace_reference(x["q"], x["k"], x["v"], x["raw_g"], x["raw_beta"], x["A_log"], x["g_bias"],
                                    K ** -0.5, -0.5, x["cu_seqlens"])
    errs = {n: rel_l2(ws[n], ref[n]) for n in ("w", "u")}
    print("[kda_intra_kernel, correlated keys] " + " ".join(f"{n}={e:.3e}" for n, e in errs.items()))
    for n, e in errs.items():
        within(f"kda_intra_kernel {n}, correlated keys", e, ("fused-gpu", "bf16", "intra_correlated"))
