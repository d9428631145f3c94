# SPDX-License-Identifier: Apache-2.0
"""H200 check of the fused HIP path (sm_90 build through kdagen's JIT) against the float64 reference
and the Triton path. One run prints the whole picture: a PASS/FAIL row per case (any exception is a
FAIL with its message), then fused vs Triton timings. Exit status 1 if any case failed.

    cd <repo root> && PYTHONPATH=.:generated python3 tools/h200_fused_check.py [--quick] [--no-bench]

Tolerance: relative L2 <= 1e-2 against the reference (bf16 inputs), <= 2e-2 between fused and Triton;
checkpoints must be bit-identical to the final state of a prefill cut at the offset.

The JIT builds each source with its target's matrix layer (templates/hip/include/kda_mma.h: mma.sync
m16n8k16 bf16 on sm_90); the build row reports the HMMA count of its SASS (cuobjdump from PATH or the
Triton wheel). Unless --no-fma, the FMA fallback (-DKDA_MMA_LAYER=0, built from a copy of the source) is
also checked on one ragged case and timed, so one run compares fused-MMA, fused-FMA and Triton.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

import kdagen_kernels
from kdagen.reference import chunk_kda_prefill_reference, rel_l2
from kdagen.runtime import fused_path, jit_hip
from kdagen.runtime.metadata import prepare_chunk_indices, prepare_chunk_offsets

TOL_REF = 1e-2
TOL_TRITON = 2e-2
LOWER_BOUND = -5.0
PKG = Path(kdagen_kernels.__file__).resolve().parent
DEV = torch.device("cuda")
ROWS: list[tuple[str, str, str]] = []  # (case, PASS/FAIL, detail)


def make(seqlens, H=12, K=128, V=128, seed=0, h0=True):
    g = torch.Generator(device="cpu").manual_seed(seed)
    T = sum(seqlens)

    def r(*shape, s=1.0):
        return (torch.randn(*shape, generator=g) * s).to(DEV)

    x = dict(
        q=(r(1, T, H, K) * 0.5).bfloat16(), k=(r(1, T, H, K) * 0.5).bfloat16(), v=(r(1, T, H, V) * 0.5).bfloat16(),
        raw_g=r(1, T, H, K).bfloat16(), raw_beta=r(1, T, H).bfloat16(),
        A_log=r(H, s=0.5).float(), g_bias=r(H * K, s=0.5).float(),
        cu_seqlens=torch.tensor([0] + list(torch.tensor(seqlens).cumsum(0).tolist()), dtype=torch.int32, device=DEV),
    )
    x["initial_state"] = r(len(seqlens), H, V, K, s=0.1).float() if h0 else None
    return x


def meta(cu):
    return prepare_chunk_indices(cu, 64).to(torch.int32).contiguous(), prepare_chunk_offsets(cu, 64).to(torch.int64)


def fused(lib, x, *, lower_bound=LOWER_BOUND, out=None, final=True, **extra):
    T, H = x["q"].shape[1], x["q"].shape[2]
    V, K = x["v"].shape[-1], x["q"].shape[-1]
    N = x["cu_seqlens"].numel() - 1
    ci, co = meta(x["cu_seqlens"])
    o = out if out is not None else torch.full((1, T, H, V), float("nan"), dtype=torch.bfloat16, device=DEV)
    fs = torch.full((N, H, V, K), float("nan"), device=DEV) if final else None
    fused_path.run_fused(lib, q=x["q"], k=x["k"], v=x["v"], raw_g=x["raw_g"], raw_beta=x["raw_beta"],
                         A_log=x["A_log"], g_bias=x["g_bias"], scale=K ** -0.5, lower_bound=lower_bound,
                         cu_seqlens=x["cu_seqlens"], chunk_indices=ci, chunk_offsets=co, out=o,
                         initial_state=extra.pop("initial_state", x["initial_state"]), final_state=fs, **extra)
    torch.cuda.synchronize()
    return o, fs


def reference(x, *, lower_bound=LOWER_BOUND, **kw):
    return chunk_kda_prefill_reference(
        x["q"], x["k"], x["v"], x["raw_g"], x["raw_beta"], x["A_log"], x["g_bias"],
        initial_state=kw.pop("initial_state", x["initial_state"]), output_final_state=kw.pop("final", True),
        lower_bound=lower_bound, use_qk_l2norm_in_kernel=True, cu_seqlens=x["cu_seqlens"], **kw)


def triton(x, *, lower_bound=LOWER_BOUND):
    return kdagen_kernels.chunk_kda_prefill(
        x["q"], x["k"], x["v"], x["raw_g"], x["raw_beta"], x["A_log"], x["g_bias"],
        initial_state=x["initial_state"], output_final_state=True, lower_bound=lower_bound,
        use_qk_l2norm_in_kernel=True, cu_seqlens=x["cu_seqlens"])


def case(name):
    def deco(fn):
        def run(*a, **kw):
            t0 = time.time()
            try:
                detail = fn(*a, **kw)
                ROWS.append((name, "PASS", f"{detail} ({time.time() - t0:.1f}s)"))
            except Exception as exc:  # noqa: BLE001 - every failure is reported, the run goes on
                tb = traceback.format_exc(limit=3).strip().splitlines()
                ROWS.append((name, "FAIL", f"{type(exc).__name__}: {exc}".replace("\n", " | ")[:600]
                             + f"  [{tb[-3].strip() if len(tb) >= 3 else ''}]"))
            finally:
                torch.cuda.empty_cache()
        return run
    return deco


def check(errs: dict[str, float], tol: dict[str, float]) -> str:
    bad = {k: e for k, e in errs.items() if not e <= tol[k]}
    text = " ".join(f"{k}={e:.2e}" for k, e in errs.items())
    if bad:
        raise AssertionError(f"over tolerance: {text}")
    return text


def sass_hmma(lib) -> str:
    dump = os.environ.get("KDAGEN_CUOBJDUMP") or shutil.which("cuobjdump")
    if not dump:
        try:
            import triton
            cand = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
            dump = str(cand) if cand.is_file() else None
        except ImportError:
            dump = None
    if not dump:
        return "hmma=? (no cuobjdump)"
    r = subprocess.run([dump, "-sass", str(lib.path)], capture_output=True, text=True)
    return f"hmma={len(re.findall(r'HMMA[.]16816[.]F32[.]BF16', r.stdout))}" if r.returncode == 0 else "hmma=?"


def load_fma(K=128, V=128):
    """The FMA fallback of the same generated source: a copy with KDA_MMA_LAYER forced to 0."""
    src = fused_path.source_path(PKG, K, V, "sm_90")
    tmp = Path(tempfile.mkdtemp(prefix="kdagen_fma_"))
    copy = tmp / (src.stem + "__fma.hip")
    copy.write_text("#define KDA_MMA_LAYER 0\n" + src.read_text())
    return jit_hip.load_library(copy, "sm_90", variant=src.stem + "__fma", include_dir=src.parent / "include")


def numerics(libs, seqlens, K=128, V=128, lower_bound=LOWER_BOUND, h0=True, with_triton=True):
    x = make(seqlens, K=K, V=V, h0=h0)
    o, fs = fused(libs[(K, V)], x, lower_bound=lower_bound)
    ro, rf = reference(x, lower_bound=lower_bound)
    errs = {"o/ref": rel_l2(o, ro), "ht/ref": rel_l2(fs, rf)}
    tol = {"o/ref": TOL_REF, "ht/ref": TOL_REF, "o/triton": TOL_TRITON, "ht/triton": TOL_TRITON}
    if with_triton:
        to, tf = triton(x, lower_bound=lower_bound)
        errs.update({"o/triton": rel_l2(o, to), "ht/triton": rel_l2(fs, tf)})
        errs["(triton o/ref)"] = rel_l2(to, ro)
        tol["(triton o/ref)"] = float("inf")
    return check(errs, tol)


def t0_sequences(libs):
    x = make([100, 0, 70, 0], h0=True)
    o, fs = fused(libs[(128, 128)], x)
    ro, rf = reference(x)
    assert torch.equal(fs[1], x["initial_state"][1]) and torch.equal(fs[3], x["initial_state"][3]), \
        "a T=0 sequence did not pass its initial state through"
    x2 = dict(x, initial_state=None)
    _, fs2 = fused(libs[(128, 128)], x2)
    assert torch.count_nonzero(fs2[1]) == 0, "a T=0 sequence without h0 did not write zeros"
    return check({"o/ref": rel_l2(o, ro), "ht/ref": rel_l2(fs, rf)}, {"o/ref": TOL_REF, "ht/ref": TOL_REF})


def state_cache(libs, K=128, V=128):
    lib = libs[(K, V)]
    x = make([300, 65, 1, 130], K=K, V=V, h0=False)
    H = x["q"].shape[2]
    slots = 9
    cache = torch.randn(slots, H, V, K, device=DEV) * 0.1
    before = cache.clone()
    idx = torch.tensor([5, -1, 2, 7], dtype=torch.int32, device=DEV)
    flags = torch.tensor([True, True, False, True], device=DEV)
    T, N = x["q"].shape[1], 4
    o = torch.full((1, T, H, V), float("nan"), dtype=torch.bfloat16, device=DEV)
    ci, co = meta(x["cu_seqlens"])
    fused_path.run_fused(lib, q=x["q"], k=x["k"], v=x["v"], raw_g=x["raw_g"], raw_beta=x["raw_beta"],
                         A_log=x["A_log"], g_bias=x["g_bias"], scale=K ** -0.5, lower_bound=LOWER_BOUND,
                         cu_seqlens=x["cu_seqlens"], chunk_indices=ci, chunk_offsets=co, out=o,
                         state_cache=cache, state_indices=idx, has_initial_state=flags)
    torch.cuda.synchronize()
    # Reference: rows read only where the flag is set and the index is valid; -1 starts from zeros.
    h0 = torch.zeros(N, H, V, K, device=DEV)
    h0[0], h0[3] = before[5], before[7]
    ro, rf = reference(dict(x, initial_state=h0))
    untouched = [s for s in range(slots) if s not in (5, 2, 7)]
    assert torch.equal(cache[untouched], before[untouched]), "rows outside state_indices changed"
    errs = {"o/ref": rel_l2(o, ro), "row5/ref": rel_l2(cache[5], rf[0]), "row2/ref": rel_l2(cache[2], rf[2]),
            "row7/ref": rel_l2(cache[7], rf[3])}
    return check(errs, dict.fromkeys(errs, TOL_REF)) + " untouched-rows=exact"


def checkpoints(libs, K=128, V=128):
    lib = libs[(K, V)]
    seqlens = [300, 200, 65, 128, 90]
    offs = [128, 192, 64, 128, 100]  # the last two are not < T / not aligned: nothing written
    x = make(seqlens, K=K, V=V)
    H, N = x["q"].shape[2], len(seqlens)
    ck = torch.full((N + 2, H, V, K), float("nan"), device=DEV)
    rows = torch.tensor([6, 0, 3, 1, 2], dtype=torch.int32, device=DEV)
    o_ck, f_ck = fused(lib, x, checkpoint_state=ck, checkpoint_offsets=torch.tensor(offs, dtype=torch.int32, device=DEV),
                       checkpoint_state_indices=rows, groups=1)
    o_plain, f_plain = fused(lib, x, groups=1)
    assert torch.equal(o_ck, o_plain) and torch.equal(f_ck, f_plain), "exporting checkpoints changed the output/state"
    # Truncated prefill: each sequence cut at its offset (valid ones), same initial states.
    valid = [n for n in range(N) if 0 < offs[n] < seqlens[n] and offs[n] % 64 == 0]
    cu = x["cu_seqlens"].tolist()
    sel = torch.cat([torch.arange(cu[n], cu[n] + offs[n]) for n in valid]).to(DEV)
    xt = {k: (t[:, sel] if k in ("q", "k", "v", "raw_g", "raw_beta") else t) for k, t in x.items()}
    xt["cu_seqlens"] = torch.tensor([0] + list(torch.tensor([offs[n] for n in valid]).cumsum(0).tolist()),
                                    dtype=torch.int32, device=DEV)
    xt["initial_state"] = x["initial_state"][valid].contiguous()
    _, ft = fused(lib, xt, groups=1)
    for j, n in enumerate(valid):
        r = int(rows[n])
        assert torch.equal(ck[r], ft[j]), f"checkpoint of sequence {n} (row {r}) is not bit-identical: " \
            f"max diff {(ck[r] - ft[j]).abs().max().item():.3e}"
    untouched = [r for r in range(N + 2) if r not in [int(rows[n]) for n in valid]]
    assert bool(torch.isnan(ck[untouched]).all()), "a checkpoint row that should not be written was written"
    return f"{len(valid)} snapshots bit-exact, {len(untouched)} rows untouched, export does not perturb"


def group_counts(libs, seqlens, groups=(2, 4, 8, 40)):
    """The two-pass group scan against the one-pass walk (and the reference), slow gates so the state
    carries across groups; the chunk count is below 40, so some groups are empty."""
    lib = libs[(128, 128)]
    x = make(seqlens)
    x["raw_g"] = (x["raw_g"].float() - 6.0).bfloat16()
    o1, f1 = fused(lib, x, groups=1)
    ro, rf = reference(x)
    errs, tol = {"G1 o/ref": rel_l2(o1, ro), "G1 ht/ref": rel_l2(f1, rf)}, {}
    for g in groups:
        og, fg = fused(lib, x, groups=g)
        errs[f"G{g} o/G1"] = rel_l2(og, o1)
        errs[f"G{g} ht/G1"] = rel_l2(fg, f1)
        errs[f"G{g} o/ref"] = rel_l2(og, ro)
    tol = {k: (TOL_REF if "ref" in k else 5e-3) for k in errs}
    return check(errs, tol)


def strided_out(libs):
    lib = libs[(128, 128)]
    x = make([513, 64, 1, 200])
    T, H = x["q"].shape[1], x["q"].shape[2]
    big = torch.full((1, H, T, 128 + 16), -7.0, dtype=torch.bfloat16, device=DEV)
    out = big[..., 8:136].permute(0, 2, 1, 3)  # token stride 144, head stride T * 144
    # raw_g / raw_beta as strided slices of wider projections.
    gw = torch.randn(1, T, H, 160, device=DEV).bfloat16()
    gw[..., :128] = x["raw_g"]
    bw = torch.randn(1, T, H * 3, device=DEV).bfloat16()
    bw[..., 1::3] = x["raw_beta"]
    xs = dict(x, raw_g=gw[..., :128], raw_beta=bw[..., 1::3])
    o_ref, _ = fused(lib, x)
    fused(lib, xs, out=out)
    assert torch.equal(out, o_ref), "strided out / strided raw_g, raw_beta differ from the dense run"
    assert bool((big[..., :8] == -7).all() and (big[..., 136:] == -7).all()), "wrote outside the out view"
    return f"out strides {out.stride()}, raw_g/raw_beta strided: identical to dense"


SHAPES = [(h, t, n) for h in (12, 32, 96) for (t, n) in ((4096, 1), (16384, 1), (65536, 1), (16384, 16), (65536, 64))]


def bench(libs, H, T, N, fma_lib=None, groups=None):
    import triton.testing as tt
    seqlens = [T // N] * N
    K = V = 128
    Ttot = sum(seqlens)
    x = dict(
        q=torch.randn(1, Ttot, H, K, device=DEV, dtype=torch.bfloat16) * 0.5,
        k=torch.randn(1, Ttot, H, K, device=DEV, dtype=torch.bfloat16) * 0.5,
        v=torch.randn(1, Ttot, H, V, device=DEV, dtype=torch.bfloat16) * 0.5,
        raw_g=torch.randn(1, Ttot, H, K, device=DEV, dtype=torch.bfloat16),
        raw_beta=torch.randn(1, Ttot, H, device=DEV, dtype=torch.bfloat16),
        A_log=torch.randn(H, device=DEV) * 0.5, g_bias=torch.randn(H * K, device=DEV) * 0.5,
        cu_seqlens=torch.arange(N + 1, dtype=torch.int32, device=DEV) * (Ttot // N), initial_state=None)
    ci, co = meta(x["cu_seqlens"])
    out = torch.empty(1, Ttot, H, V, dtype=torch.bfloat16, device=DEV)
    lib = libs[(K, V)]

    def f():
        fused_path.run_fused(lib, q=x["q"], k=x["k"], v=x["v"], raw_g=x["raw_g"], raw_beta=x["raw_beta"],
                             A_log=x["A_log"], g_bias=x["g_bias"], scale=K ** -0.5, lower_bound=LOWER_BOUND,
                             cu_seqlens=x["cu_seqlens"], chunk_indices=ci, chunk_offsets=co, out=out,
                             groups=groups)

    def t():
        kdagen_kernels.chunk_kda_prefill(x["q"], x["k"], x["v"], x["raw_g"], x["raw_beta"], x["A_log"], x["g_bias"],
                                         lower_bound=LOWER_BOUND, use_qk_l2norm_in_kernel=True,
                                         cu_seqlens=x["cu_seqlens"], chunk_indices=ci, chunk_offsets=co, out=out)
    ms_f = tt.do_bench(f, return_mode="median")
    ms_t = tt.do_bench(t, return_mode="median")
    ms_fma = None
    if fma_lib is not None:
        lib = fma_lib
        ms_fma = tt.do_bench(f, return_mode="median")
    return ms_f, ms_t, ms_fma


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="skip the [1024] and long cases")
    ap.add_argument("--no-bench", action="store_true")
    ap.add_argument("--no-fma", action="store_true", help="skip the FMA-fallback build, check and timing")
    ap.add_argument("--all-shapes", action="store_true", help="time every performance.md shape")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    print(f"torch {torch.__version__}, device {torch.cuda.get_device_name()}", flush=True)
    libs = {}
    for K, V in ((128, 128), (128, 256)):
        t0 = time.time()
        try:
            libs[(K, V)] = fused_path.load_fused(PKG, K, V, "sm_90")
            sm = libs[(K, V)].smem_bytes()
            ROWS.append((f"build k{K}_v{V} sm_90", "PASS", f"{time.time() - t0:.1f}s smem={sm} "
                         f"{sass_hmma(libs[(K, V)])} {libs[(K, V)].path}"))
        except Exception as exc:  # noqa: BLE001
            ROWS.append((f"build k{K}_v{V} sm_90", "FAIL", f"{type(exc).__name__}: {exc}"[:2000]))
    fma_lib = None
    if not args.no_fma:
        t0 = time.time()
        try:
            fma_lib = load_fma()
            ROWS.append(("build k128_v128 sm_90 FMA fallback", "PASS", f"{time.time() - t0:.1f}s {sass_hmma(fma_lib)}"))
            case("numerics FMA fallback [513, 64, 1, 1200]")(numerics)({(128, 128): fma_lib}, [513, 64, 1, 1200])
        except Exception as exc:  # noqa: BLE001
            ROWS.append(("build k128_v128 sm_90 FMA fallback", "FAIL", f"{type(exc).__name__}: {exc}"[:2000]))
    seqsets = [[1], [64], [513, 64, 1, 1200]] + ([] if args.quick else [[1024]])
    for s in seqsets:
        case(f"numerics H=12 K=V=128 {s}")(numerics)(libs, s)
    case("numerics no h0 [513, 64, 1, 1200]")(numerics)(libs, [513, 64, 1, 1200], h0=False)
    case("numerics K=128 V=256 [513, 64, 1, 200]")(numerics)(libs, [513, 64, 1, 200], K=128, V=256)
    case("numerics softplus gate [300, 70]")(numerics)(libs, [300, 70], lower_bound=None)
    case("T=0 sequences [100, 0, 70, 0]")(t0_sequences)(libs)
    case("state_cache K=V=128")(state_cache)(libs)
    case("state_cache K=128 V=256")(state_cache)(libs, 128, 256)
    case("checkpoints bit-exact K=V=128")(checkpoints)(libs)
    case("checkpoints bit-exact K=128 V=256")(checkpoints)(libs, 128, 256)
    case("out strided view + strided raw_g/raw_beta")(strided_out)(libs)
    case("group scan G=2,4,8,40 [1024, 300]")(group_counts)(libs, [1024, 300])
    case("group scan G=2,4,8,40 [2000]")(group_counts)(libs, [2000])

    width = max(len(r[0]) for r in ROWS)
    print("\n" + "=" * 100)
    for name, status, detail in ROWS:
        print(f"{status}  {name:{width}s}  {detail}")
    failed = sum(r[1] == "FAIL" for r in ROWS)
    if not args.no_bench and (128, 128) in libs:
        print("\ntimes (triton.testing.do_bench median, eager, Python included):")
        lib = libs[(128, 128)]
        print(f"  recurrence: V slice {lib.v_slice}, {lib.recurrence_blocks_per_sm()} blocks/SM, "
              f"smem {lib.smem_bytes()}")
        for H, T, N in (SHAPES if args.all_shapes else ((12, 4096, 1), (12, 65536, 1), (96, 16384, 16))):
            try:
                G = fused_path.choose_groups(N, H, -(-T // N // 64) * N, 128, 128, lib.v_slice,
                                             torch.cuda.get_device_properties(0).multi_processor_count,
                                             lib.recurrence_blocks_per_sm())
                ms_f, ms_t, ms_fma = bench(libs, H, T, N, fma_lib if H * T <= 12 * 4096 else None)
                g1 = f"   fused G=1 {bench(libs, H, T, N, groups=1)[0]:8.3f} ms" if G > 1 else ""
                fma_txt = f"   fused-FMA {ms_fma:9.3f} ms" if ms_fma is not None else ""
                print(f"  H={H:3d} T={T:6d} N={N:3d}: fused {ms_f:8.3f} ms (G={G:2d})   triton {ms_t:8.3f} ms   "
                      f"fused/triton {ms_f / ms_t:5.2f}x{g1}{fma_txt}", flush=True)
            except Exception as exc:  # noqa: BLE001
                print(f"  H={H} T={T} N={N}: FAILED {type(exc).__name__}: {exc}"[:400])
            torch.cuda.empty_cache()
    print(f"\n{len(ROWS) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
