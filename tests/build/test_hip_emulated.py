# SPDX-License-Identifier: Apache-2.0
"""The generated fused HIP kernels' own code, run on the CPU: g++ builds a generated source against a
test-only port header (tests/build/hip_emulation/: one std::thread per GPU thread, std::barrier for
__syncthreads and per wave), and the results are compared with the float64 reference. This checks
indexing, masking, state modes and checkpoint semantics of the kernel code, not GPU-specific behaviour
(the H200 does that: tools/h200_fused_check.py).

Parametrized over the matrix layers of templates/hip/include/kda_mma.h (-DKDA_MMA_LAYER): `fma` (the
fallback, sm_90 source), `sm90_mma` (sm_90 source, mma.sync m16n8k16 fragments, warp 32), `gfx942_mfma`
(gfx942 source, 16x16x16 MFMA fragments, wave 64) and `gfx950_mfma` (gfx950 source, 16x16x32, wave 64).
The layer's own fragment index math runs (in both kernels: the prologue's Aqk/Akk off-diagonal blocks and
w/u, the recurrence's four products); the instructions are the emulation header's wave models, written
from the PTX / CDNA ISA element -> lane maps. test_mma_layer_tile checks one tile product of each layer
exactly against an fp32 product of the same bf16 operands.

The tests call the generated extern "C" launchers themselves (the emulation header runs each kernel launch
on the CPU), loaded by jit_hip.HipLibrary: argtypes from kdagen/kernels/hip.py, arguments bound by name."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from kdagen.reference import chunk_kda_prefill_reference, intra_workspace_reference, rel_l2
from kdagen.runtime.jit_hip import HipLibrary
from kdagen.runtime.metadata import prepare_chunk_indices, prepare_chunk_offsets
from kdagen.targets import TARGETS
from tests.tolerances import within

ROOT = Path(__file__).resolve().parents[2]
EMU = Path(__file__).resolve().parent / "hip_emulation"
HIP = ROOT / "generated" / "kdagen_kernels" / "hip"
CXX = shutil.which("g++")

pytestmark = pytest.mark.skipif(CXX is None, reason="g++ (C++20) not found")

# layer id -> (KDA_MMA_LAYER, target whose generated source is built): the FMA fallback, then each target's own.
LAYERS = {"fma": (0, "sm_90"), **{name: (TARGETS[t].hip_mma_layer, t) for name, t in
                                  (("sm90_mma", "sm_90"), ("gfx942_mfma", "gfx942"), ("gfx950_mfma", "gfx950"))}}
OUT, STATE, VS_ONE = (("hip-emulated", "bf16", q) for q in ("output", "final_state", "vs_one_group"))


def _so(K, V, layer, tmp_path_factory) -> tuple[Path, str]:
    num, target = LAYERS[layer]
    src = HIP / f"kda_chunk_fwd__hip__bf16__k{K}_v{V}_c64__{target}.hip"
    so = tmp_path_factory.mktemp(f"emu_{layer}") / "emu.so"
    r = subprocess.run([CXX, "-std=c++20", "-O2", "-pthread", "-shared", "-fPIC", f"-I{EMU}", f"-I{HIP / 'include'}",
                        f"-DKDA_MMA_LAYER={num}", f'-DKDA_SOURCE="{src}"', "-o", str(so), str(EMU / "driver.cpp")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return so, target


def _build(K, V, layer, tmp_path_factory) -> HipLibrary:
    so, target = _so(K, V, layer, tmp_path_factory)
    lib = HipLibrary(so, f"emulated {layer}", target)
    assert (lib.head_dim_k, lib.head_dim_v, lib.chunk_size) == (K, V, 64)
    return lib


@pytest.fixture(scope="module", params=[(128, 256, layer) for layer in LAYERS],
                ids=lambda p: f"k{p[0]}_v{p[1]}-{p[2]}")
def emu(request, tmp_path_factory):
    K, V, layer = request.param
    return _build(K, V, layer, tmp_path_factory), K, V


def _ptr(t: torch.Tensor | None) -> int | None:
    return t.data_ptr() if t is not None else None


def _stride0(t: torch.Tensor | None) -> int:
    return t.stride(0) if t is not None else 0


def group_workspace(groups: int, N: int, H: int, K: int, V: int) -> torch.Tensor:
    """The launcher's group workspace: (G - 1) N H (V + K) K operator rows, then G N H V K start states."""
    return torch.full(((groups - 1) * N * H * (V + K) * K + groups * N * H * V * K,), float("nan"))


def _prologue(lib: HipLibrary, K, V, x, lower_bound):
    """kda_prologue_launch into NaN-poisoned workspaces; returns them and the chunk indices."""
    q, k, v, g, b = x["q"], x["k"], x["v"], x["raw_g"], x["raw_beta"]
    T, H = q.shape[1], q.shape[2]
    ci = prepare_chunk_indices(x["cu_seqlens"], 64).to(torch.int32).contiguous()
    ws = {n: torch.full((T, H, d), float("nan"), dtype=torch.bfloat16)
          for n, d in (("qg", K), ("w", K), ("kg", K), ("u", V), ("aqk", 64))}
    ws["decay"] = torch.full((max(ci.shape[0], 1), H, K), float("nan"))
    lib.prologue(dict(
        q=q.data_ptr(), k=k.data_ptr(), v=v.data_ptr(), g=g.data_ptr(), beta=b.data_ptr(), A_log=x["A_log"].data_ptr(),
        g_bias=x["g_bias"].data_ptr(), cu_seqlens=x["cu_seqlens"].data_ptr(), chunk_indices=ci.data_ptr(),
        **{n: t.data_ptr() for n, t in ws.items()},
        sq_t=q.stride(1), sq_h=q.stride(2), sk_t=k.stride(1), sk_h=k.stride(2), sv_t=v.stride(1), sv_h=v.stride(2),
        sg_t=g.stride(1), sg_h=g.stride(2), sb_t=b.stride(1), sb_h=b.stride(2),
        num_chunks=ci.shape[0], H=H, scale=K ** -0.5, lower_bound=lower_bound if lower_bound is not None else 0.0,
        lower_bound_gate=int(lower_bound is not None), use_l2norm=1, stream=None))
    return ws


def run(emu, x, *, lower_bound, h0=None, ckpt=None, ck_off=None, groups=1, cache=None, cache_idx=None,
        has_init=None):
    lib, K, V = emu
    T, H = x["q"].shape[1], x["q"].shape[2]
    cu = x["cu_seqlens"]
    N = cu.numel() - 1
    co = prepare_chunk_offsets(cu, 64).to(torch.int64).contiguous()
    ws = _prologue(lib, K, V, x, lower_bound)
    out = torch.full((1, T, H, V), float("nan"), dtype=torch.bfloat16)
    ht = torch.full((N, H, V, K), float("nan")) if cache is None else None
    gws = group_workspace(groups, N, H, K, V) if groups > 1 else None
    flags = has_init.to(torch.uint8).contiguous() if has_init is not None else None
    idx = cache_idx.to(torch.int32).contiguous() if cache_idx is not None else None
    lib.recurrence(dict(
        **{n: ws[n].data_ptr() for n in ("qg", "w", "kg", "u", "aqk", "decay")},
        out=out.data_ptr(), so_t=out.stride(1), so_h=out.stride(2), cu_seqlens=cu.data_ptr(),
        chunk_offsets=co.data_ptr(), h0=_ptr(h0), sh0_n=_stride0(h0), ht=_ptr(ht), sht_n=_stride0(ht),
        cache=_ptr(cache), sc_n=_stride0(cache), n_slots=cache.shape[0] if cache is not None else 0,
        cache_idx=_ptr(idx), has_init=_ptr(flags), ckpt=_ptr(ckpt), sck_n=_stride0(ckpt),
        n_ckpt_rows=ckpt.shape[0] if ckpt is not None else 0, ckpt_off=_ptr(ck_off), ckpt_idx=None,
        num_seqs=N, H=H, scale=K ** -0.5, groups=groups, group_ws=_ptr(gws), stream=None))
    return out, ht


def make(seqlens, H, K, V, seed=0):
    g = torch.Generator().manual_seed(seed)
    T = sum(seqlens)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    return dict(q=(r(1, T, H, K) * 0.5).bfloat16(), k=(r(1, T, H, K) * 0.5).bfloat16(), v=(r(1, T, H, V) * 0.5).bfloat16(),
                raw_g=r(1, T, H, K).bfloat16(), raw_beta=r(1, T, H).bfloat16(), A_log=r(H) * 0.5, g_bias=r(H * K) * 0.5,
                cu_seqlens=torch.tensor([0] + torch.tensor(seqlens).cumsum(0).tolist(), dtype=torch.int32))


@pytest.mark.parametrize("lower_bound", [-5.0, None], ids=["lower_bound", "softplus"])
def test_matches_reference_with_ragged_t0_and_h0(emu, lower_bound):
    _, K, V = emu
    seqlens = [70, 0, 130]
    x = make(seqlens, 2, K, V)
    h0 = torch.randn(3, 2, V, K, generator=torch.Generator().manual_seed(1)) * 0.1
    o, ht = run(emu, x, lower_bound=lower_bound, h0=h0)
    ro, rf = chunk_kda_prefill_reference(x["q"], x["k"], x["v"], x["raw_g"], x["raw_beta"], x["A_log"], x["g_bias"],
                                         initial_state=h0, output_final_state=True, lower_bound=lower_bound,
                                         use_qk_l2norm_in_kernel=True, cu_seqlens=x["cu_seqlens"])
    eo, es = rel_l2(o, ro), rel_l2(ht, rf)
    print(f"[emulated] o rel_l2={eo:.3e} state rel_l2={es:.3e}")
    within("output", eo, OUT)
    within("final state", es, STATE)
    assert torch.equal(ht[1], h0[1])  # the T = 0 sequence passes its initial state through


def test_checkpoint_is_bit_identical_to_a_truncated_prefill(emu):
    _, K, V = emu
    x = make([130, 70], 2, K, V, seed=3)
    ck = torch.full((2, 2, V, K), float("nan"))
    o, _ = run(emu, x, lower_bound=-5.0, ckpt=ck, ck_off=torch.tensor([128, 100], dtype=torch.int32))
    xt = {n: (t[:, :128] if n in ("q", "k", "v", "raw_g", "raw_beta") else t) for n, t in x.items()}
    xt["cu_seqlens"] = torch.tensor([0, 128], dtype=torch.int32)
    _, ht = run(emu, xt, lower_bound=-5.0)
    assert torch.equal(ck[0], ht[0])
    assert bool(torch.isnan(ck[1]).all())  # offset 100 is not chunk-aligned: nothing written
    assert torch.equal(o[:, :128], run(emu, xt, lower_bound=-5.0)[0])


@pytest.mark.parametrize("groups", [2, 4], ids=lambda g: f"G{g}")
def test_group_scan_matches_one_pass(emu, groups):
    """Pass 1 (B_g and the transfer rows' M_g), the fp32 scan and pass 2 against the one-pass walk: the
    same walk up to rounding. Sequence 0 has 4 chunks, 1 has 0 (every group empty: identity operators,
    its h0 passes through exactly), 2 has 2 (G = 4: two empty trailing groups)."""
    _, K, V = emu
    x = make([250, 0, 70], 1, K, V, seed=11)
    # Slow gates (about -0.01 per token): the state carries across groups, so M_g matters.
    x["raw_g"] = (x["raw_g"].float() - 6.0).bfloat16()
    h0 = torch.randn(3, 1, V, K, generator=torch.Generator().manual_seed(2)) * 0.1
    ck_off = torch.tensor([128, 0, 64], dtype=torch.int32)
    ck1, ckg = (torch.full((3, 1, V, K), float("nan")) for _ in range(2))
    o1, h1 = run(emu, x, lower_bound=-5.0, h0=h0, ckpt=ck1, ck_off=ck_off)
    og, hg = run(emu, x, lower_bound=-5.0, h0=h0, ckpt=ckg, ck_off=ck_off, groups=groups)
    eo, es, ec = rel_l2(og, o1), rel_l2(hg, h1), rel_l2(ckg[0], ck1[0])
    print(f"[emulated G={groups}] vs one pass: o {eo:.3e} state {es:.3e} checkpoint {ec:.3e}")
    within("output vs one pass", eo, VS_ONE)
    within("final state vs one pass", es, VS_ONE)
    within("checkpoint 0 vs one pass", ec, VS_ONE)
    assert torch.equal(hg[1], h0[1])
    assert bool(torch.isnan(ckg[1]).all())
    within("checkpoint 2 vs one pass", rel_l2(ckg[2], ck1[2]), VS_ONE)


@pytest.mark.parametrize("groups", [1, 3], ids=lambda g: f"G{g}")
def test_state_cache_in_place(emu, groups):
    """Rows named by cache_idx are read (has_init) and written; has_init False rows are never read (NaN
    there stays harmless), a negative index is skipped, other rows are untouched bit for bit."""
    _, K, V = emu
    x = make([130, 70, 64], 1, K, V, seed=13)
    gen = torch.Generator().manual_seed(4)
    cache = torch.randn(5, 1, V, K, generator=gen) * 0.1
    cache[3] = float("nan")  # row of a sequence with has_init False
    before = cache.clone()
    idx = torch.tensor([1, 3, -1], dtype=torch.int32)
    flags = torch.tensor([True, False, True])
    o, _ = run(emu, x, lower_bound=-5.0, cache=cache, cache_idx=idx, has_init=flags, groups=groups)
    h0 = torch.stack([before[1], torch.zeros_like(before[1]), torch.zeros_like(before[1])])
    ro, rf = chunk_kda_prefill_reference(x["q"], x["k"], x["v"], x["raw_g"], x["raw_beta"], x["A_log"], x["g_bias"],
                                         initial_state=h0, output_final_state=True, lower_bound=-5.0,
                                         use_qk_l2norm_in_kernel=True, cu_seqlens=x["cu_seqlens"])
    within("output", rel_l2(o, ro), OUT)  # sequence 2 (index -1) starts from zeros, as in the reference
    within("cache row 1", rel_l2(cache[1], rf[0]), STATE)
    within("cache row 3", rel_l2(cache[3], rf[1]), STATE)
    for row in (0, 2, 4):
        assert torch.equal(cache[row], before[row])


@pytest.mark.parametrize("layer", [layer for layer in LAYERS if layer != "fma"])
def test_mma_layer_tile(layer, tmp_path_factory):
    """One 16 x 16 x 64 tile through the layer (loads, mma16, accumulator indices) must equal the fp32
    product of the same bf16 operands (products exact, fp32 sum in k order: the models' arithmetic)."""
    lib = ctypes.CDLL(str(_so(128, 128, layer, tmp_path_factory)[0]))
    g = torch.Generator().manual_seed(7)
    A = torch.randn(16, 64, generator=g).bfloat16()
    B = torch.randn(64, 16, generator=g).bfloat16()
    C0 = torch.randn(16, 16, generator=g)
    bits = lambda t: t.contiguous().view(torch.int16)  # noqa: E731
    a, b, at, bt = bits(A), bits(B), bits(A.t()), bits(B.t())
    C1, C2 = C0.clone(), torch.zeros(16, 16)
    lib.emu_mma_tile.argtypes = [ctypes.c_void_p] * 6
    kstep = lib.emu_mma_tile(a.data_ptr(), b.data_ptr(), at.data_ptr(), bt.data_ptr(), C1.data_ptr(), C2.data_ptr())
    assert kstep == {"sm90_mma": 16, "gfx942_mfma": 16, "gfx950_mfma": 32}[layer]
    want = C0.double() + A.double() @ B.double()
    within("tile max abs error", (C1.double() - want).abs().max().item(), ("hip-emulated", "bf16", "mma_tile_abs"))
    assert torch.equal(C1, C2)
    # Exact: sequential fp32 accumulation from C in k order, as the models define the instruction.
    ref = C0.clone()
    for k in range(64):
        ref = ref + A[:, k].float()[:, None] * B[k, :].float()[None, :]
    assert torch.equal(C1, ref)


def _prologue_ws(lib, K, V, x, lower_bound):
    ws = _prologue(lib, K, V, x, lower_bound)
    cu = x["cu_seqlens"]
    # aqk: only s <= t within the chunk is defined
    pos = torch.cat([torch.arange(int(cu[i + 1] - cu[i])) % 64 for i in range(cu.numel() - 1)])
    ws["aqk"] = torch.where((torch.arange(64)[None, :] <= pos[:, None])[:, None, :], ws["aqk"].float(), 0.0)
    return ws, ws.pop("decay")


@pytest.mark.parametrize("lower_bound", [-5.0, None], ids=["lower_bound", "softplus"])
@pytest.mark.parametrize("layer", [layer for layer in LAYERS if layer != "fma"])
def test_prologue_layer_matches_fma(layer, lower_bound, tmp_path_factory):
    """The prologue's matrix-layer products (off-diagonal Aqk/Akk blocks from bf16 operands, w/u from a
    bf16 T) against the FMA fallback's fp32 ones, workspace tensor by tensor: equal up to bf16 operand
    rounding; qg, kg and decay (no products) bit-identical."""
    K, V = 128, 256
    x = make([70, 0, 130], 2, K, V, seed=5)
    ref, rdec = _prologue_ws(_build(K, V, "fma", tmp_path_factory), K, V, x, lower_bound)
    got, gdec = _prologue_ws(_build(K, V, layer, tmp_path_factory), K, V, x, lower_bound)
    for n in ("qg", "kg"):
        assert torch.equal(got[n], ref[n]), n
    assert torch.equal(gdec, rdec)
    errs = {n: rel_l2(got[n].float(), ref[n].float()) for n in ("w", "u", "aqk")}
    print(f"[prologue {layer}] " + " ".join(f"{n} rel_l2={e:.3e}" for n, e in errs.items()))
    for n, e in errs.items():
        within(f"{n} vs the FMA layer", e, ("hip-emulated", "bf16", "vs_fma_layer"))


def _intra(lib: HipLibrary, K, V, x, lower_bound, *, strided=False):
    """kda_intra_launch into NaN-poisoned workspaces (16-row walk chunks); returns them."""
    q, k, v, g, b = x["q"], x["k"], x["v"], x["raw_g"], x["raw_beta"]
    if strided:  # views of wider projections: the kernel's element-wise loads instead of 16-byte ones
        q, k, v, g = (torch.cat([t, t[..., :4]], -1)[..., :t.shape[-1]] for t in (q, k, v, g))
    T, H = q.shape[1], q.shape[2]
    ci = prepare_chunk_indices(x["cu_seqlens"], 64).to(torch.int32).contiguous()
    ws = {n: torch.full((T, H, d), float("nan"), dtype=torch.bfloat16)
          for n, d in (("qg", K), ("w", K), ("kg", K), ("u", V), ("aqk", 16))}
    ws["decay"] = torch.full((ci.shape[0] * 4, H, K), float("nan"))
    lib.intra(dict(
        q=q.data_ptr(), k=k.data_ptr(), v=v.data_ptr(), g=g.data_ptr(), beta=b.data_ptr(), A_log=x["A_log"].data_ptr(),
        g_bias=x["g_bias"].data_ptr(), cu_seqlens=x["cu_seqlens"].data_ptr(), chunk_indices=ci.data_ptr(),
        **{n: t.data_ptr() for n, t in ws.items()},
        sq_t=q.stride(1), sq_h=q.stride(2), sk_t=k.stride(1), sk_h=k.stride(2), sv_t=v.stride(1), sv_h=v.stride(2),
        sg_t=g.stride(1), sg_h=g.stride(2), sb_t=b.stride(1), sb_h=b.stride(2),
        num_chunks=ci.shape[0], H=H, scale=K ** -0.5, lower_bound=lower_bound, stream=None))
    return ws


def test_intra_workspace_matches_reference(emu):
    """kda_intra_kernel (16-row walk chunks, shared-memory tiles) against the float64 workspace: a T = 1
    sequence, a T = 0 one, and lengths off the 16- and 64-row grids; every row of qg, kg, w, u and aqk is
    written (the NaN poison is gone), decay rows exactly where a walk chunk has rows."""
    lib, K, V = emu
    x = make([1, 0, 45, 83], 2, K, V, seed=7)
    ws = _intra(lib, K, V, x, -5.0)
    ref = intra_workspace_reference(x["q"], x["k"], x["v"], x["raw_g"], x["raw_beta"], x["A_log"], x["g_bias"],
                                    K ** -0.5, -5.0, x["cu_seqlens"])
    assert torch.equal(torch.isnan(ws["decay"]), torch.isnan(ref["decay"]))
    errs = {n: rel_l2(ws[n].double().nan_to_num(1e30), ref[n]) for n in ("qg", "kg", "w", "u", "aqk")}
    live = ~torch.isnan(ref["decay"])
    errs["decay"] = rel_l2(ws["decay"][live], ref["decay"][live])
    print("[intra] " + " ".join(f"{n}={e:.3e}" for n, e in errs.items()))
    for n, e in errs.items():
        within(f"kda_intra {n}", e, ("hip-emulated", "bf16", "intra_workspace"))
    # Strided projections take the element-wise loads: the same workspace, bit for bit.
    st = _intra(lib, K, V, x, -5.0, strided=True)
    for n in ws:
        assert torch.equal(st[n].nan_to_num(7.0), ws[n].nan_to_num(7.0)), n


def test_intra_inverse_on_correlated_keys(emu):
    """Near-duplicate keys, beta near 0.95 and slow gates: Akk's entries near beta, so T = (I + A)^-1 has large
    entries in every block (its off-diagonal 8 x 8 block included) and w, u depend on all of them. On random keys
    they are small enough that a wrong block hides in bf16 rounding; here it cannot."""
    lib, K, V = emu
    x = make([45, 83], 2, K, V, seed=9)
    g = torch.Generator().manual_seed(10)
    base = torch.randn(1, 1, 2, K, generator=g)
    x["k"] = (base + 0.05 * torch.randn(x["k"].shape, generator=g)).bfloat16()
    x["raw_beta"] = (3.0 + 0.1 * torch.randn(x["raw_beta"].shape, generator=g)).bfloat16()
    ws = _intra(lib, K, V, x, -0.5)
    ref = intra_workspace_reference(x["q"], x["k"], x["v"], x["raw_g"], x["raw_beta"], x["A_log"], x["g_bias"],
                                    K ** -0.5, -0.5, x["cu_seqlens"])
    errs = {n: rel_l2(ws[n].double().nan_to_num(1e30), ref[n]) for n in ("w", "u")}
    print("[intra, correlated keys] " + " ".join(f"{n}={e:.3e}" for n, e in errs.items()))
    for n, e in errs.items():
        within(f"kda_intra {n}, correlated keys", e, ("hip-emulated", "bf16", "intra_correlated"))


def _walk(lib: HipLibrary, K, V, x, ws, *, h0=None, cache=None, cache_idx=None, has_init=None, ckpt=None,
          ck_off=None, ck_idx=None, final=True, odd_out=False):
    """kda_walk_launch on kda_intra's workspace `ws`: a NaN-poisoned output and (dense, `final`) final state.
    odd_out: the output as a view of a wider buffer with an odd token stride (a strided `out`)."""
    T, H = x["q"].shape[1], x["q"].shape[2]
    cu = x["cu_seqlens"]
    N = cu.numel() - 1
    co = prepare_chunk_offsets(cu, 64).to(torch.int64).contiguous()
    out = torch.full((1, T, H, V), float("nan"), dtype=torch.bfloat16)
    if odd_out:
        out = torch.full((1, T, H * V + 1), float("nan"), dtype=torch.bfloat16)[..., :H * V].unflatten(-1, (H, V))
    paged = cache is not None
    ht = cache if paged else torch.full((N, H, V, K), float("nan")) if final else None
    src = cache if paged else h0
    idx = cache_idx.to(torch.int32).contiguous() if paged else None
    flags = has_init.to(torch.uint8).contiguous() if paged else None
    lib.walk(dict(
        **{n: ws[n].data_ptr() for n in ("qg", "w", "kg", "u", "aqk", "decay")},
        out=out.data_ptr(), so_t=out.stride(1), so_h=out.stride(2), cu_seqlens=cu.data_ptr(), chunk_offsets=co.data_ptr(),
        h0=_ptr(src), sh0_n=_stride0(src), sh0_h=src.stride(1) if src is not None else 0,
        state_in=2 if paged else int(h0 is not None), ht=_ptr(ht), sht_n=_stride0(ht),
        sht_h=ht.stride(1) if ht is not None else 0, state_out=2 if paged else int(ht is not None),
        state_idx=_ptr(idx), n_slots=cache.shape[0] if paged else 0, has_init=_ptr(flags),
        ckpt=_ptr(ckpt), sck_n=_stride0(ckpt), n_ckpt_rows=ckpt.shape[0] if ckpt is not None else 0,
        ckpt_off=_ptr(ck_off), ckpt_idx=_ptr(ck_idx), num_seqs=N, H=H, scale=K ** -0.5, stream=None))
    return out, ht


def _walk_lib(emu) -> HipLibrary:
    lib = emu[0]
    if lib.walk_threads == 0:
        pytest.skip("the FMA fallback has no walk (fused plans then take the Triton walk)")
    return lib


def test_walk_matches_reference(emu):
    """kda_walk_kernel on kda_intra's workspace against the float64 prefill: T = 1, T = 0 and lengths off the
    16- and 64-row grids, K != V (two V slices), a dense initial state with a padded head stride; every output
    element written, the T = 0 sequence's state passed through bit for bit."""
    lib = _walk_lib(emu)
    _, K, V = emu
    x = make([1, 0, 45, 83, 130], 2, K, V, seed=21)
    h0 = (torch.randn(5, 2, V * K + 64, generator=torch.Generator().manual_seed(22)) * 0.1)[..., :V * K]
    h0 = h0.unflatten(-1, (V, K))  # rows dense, heads V K + 64 apart
    ws = _intra(lib, K, V, x, -5.0)
    o, ht = _walk(lib, K, V, x, ws, h0=h0)
    ro, rf = chunk_kda_prefill_reference(x["q"], x["k"], x["v"], x["raw_g"], x["raw_beta"], x["A_log"], x["g_bias"],
                                         initial_state=h0, output_final_state=True, lower_bound=-5.0,
                                         use_qk_l2norm_in_kernel=True, cu_seqlens=x["cu_seqlens"])
    assert not bool(torch.isnan(o).any()) and not bool(torch.isnan(ht).any())
    eo, es = rel_l2(o, ro), rel_l2(ht, rf)
    print(f"[walk] o rel_l2={eo:.3e} state rel_l2={es:.3e}")
    within("walk output", eo, OUT)
    within("walk final state", es, STATE)
    assert torch.equal(ht[1], h0[1])
    # `out` as a strided view (odd token stride, 2-byte aligned rows only): the same bits.
    o_odd, _ = _walk(lib, K, V, x, ws, h0=h0, odd_out=True)
    assert o_odd.stride(1) % 2 == 1 and torch.equal(o_odd, o)


def test_walk_cache_and_checkpoints(emu):
    """The paged cache in place (has_init False rows never read, a negative index neither read nor written, other
    rows untouched), and checkpoints: bit-identical to the final state of a prefill cut at the offset, nothing
    written for an offset off the 64-row grid or past the end, rows by ckpt_idx."""
    lib = _walk_lib(emu)
    _, K, V = emu
    x = make([130, 70, 64], 1, K, V, seed=23)
    gen = torch.Generator().manual_seed(24)
    cache = torch.randn(5, 1, V, K, generator=gen) * 0.1
    cache[3] = float("nan")  # the row of a sequence with has_init False
    before = cache.clone()
    ck = torch.full((4, 1, V, K), float("nan"))
    ws = _intra(lib, K, V, x, -5.0)
    o, _ = _walk(lib, K, V, x, ws, cache=cache, cache_idx=torch.tensor([1, 3, -1]),
                 has_init=torch.tensor([True, False, True]), ckpt=ck, ck_off=torch.tensor([128, 100, 64], dtype=torch.int32),
                 ck_idx=torch.tensor([2, 0, -1], dtype=torch.int32))
    h0 = torch.stack([before[1], torch.zeros_like(before[1]), torch.zeros_like(before[1])])
    ro, rf = chunk_kda_prefill_reference(x["q"], x["k"], x["v"], x["raw_g"], x["raw_beta"], x["A_log"], x["g_bias"],
                                         initial_state=h0, output_final_state=True, lower_bound=-5.0,
                                         use_qk_l2norm_in_kernel=True, cu_seqlens=x["cu_seqlens"])
    within("walk output (cache)", rel_l2(o, ro), OUT)
    within("cache row 1", rel_l2(cache[1], rf[0]), STATE)
    within("cache row 3", rel_l2(cache[3], rf[1]), STATE)
    for row in (0, 2, 4):
        assert torch.equal(cache[row], before[row])
    # Checkpoint of sequence 0 after 128 tokens: the state a prefill of its first 128 tokens ends with.
    xt = {n: (t[:, :128] if n in ("q", "k", "v", "raw_g", "raw_beta") else t) for n, t in x.items()}
    xt["cu_seqlens"] = torch.tensor([0, 128], dtype=torch.int32)
    _, ht = _walk(lib, K, V, xt, _intra(lib, K, V, xt, -5.0), h0=before[1:2])
    assert torch.equal(ck[2], ht[0])
    for row in (0, 1, 3):  # offset 100 off the grid; sequence 2's row -1; row 1 and 3 named by nobody
        assert bool(torch.isnan(ck[row]).all())
