# SPDX-License-Identifier: Apache-2.0
"""kda_intra_kernel (HIP, 16-row walk chunks, templates/hip/include/kda_intra.h) against the Triton kda_intra at
16 rows on the GPU, alone and as the first half of a call (GPU).

Usage (repo root, GPU machine): PYTHONPATH=.:generated python3 tools/h200_intra_check.py [H:T:N ...]

Per shape (the bench's inputs, K = V = 128): `do_bench` medians of the HIP kernel, the Triton kda_intra with
the target's dense_* knobs (16-row programs), the Triton walk on 16-row steps, and two whole calls on one plan
at those knobs: Triton kda_intra + walk, and the HIP kernel + the same walk on the same workspace; FlashKDA's
call when `flash_kda` is importable. The last columns are the hybrid call's output and final state against
the Triton call's (relative L2).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import triton

import kdagen_kernels
from kdagen.autotune import kernel_call
from kdagen.bench import shape_inputs
from kdagen.bench_peers import flashkda_call, flashkda_inputs
from kdagen.launch_knobs import dense_tuning
from kdagen.reference import rel_l2
from kdagen.runtime import fused_path, planning
from kdagen.runtime.device import target_of
from kdagen.runtime.triton_path import workspace_layout

SHAPES = [(96, 16384, 16), (32, 16384, 16), (12, 16384, 16), (96, 4096, 1), (12, 4096, 1)]
PKG = Path(kdagen_kernels.__file__).resolve().parent


def _ms(fn) -> float:
    return triton.testing.do_bench(fn, return_mode="median")


def main() -> None:
    shapes = [tuple(int(x) for x in a.split(":")) for a in sys.argv[1:]] or SHAPES
    dev = torch.device("cuda")
    target = target_of(dev)
    entry = next(e for e in kdagen_kernels.VARIANTS if e.name == "kda_chunk_fwd__triton__bf16__k128_v128_c64")
    mod = entry.load()
    tun = dense_tuning(dict(mod.TUNING[target]))
    lib = fused_path.load_fused(PKG, 128, 128, target)
    print(f"kda_intra_kernel smem per block (prologue, recurrence, intra, walk): {lib.smem_bytes()}; Triton knobs {tun}")
    try:
        import flash_kda
    except ImportError:
        flash_kda = None
    print(f"{'H/T/N':>12s} {'hip intra':>10s} {'tri intra':>10s} {'walk':>8s} {'tri call':>9s} {'hybrid':>8s} "
          f"{'FlashKDA':>9s} {'o diff':>9s} {'ht diff':>9s}")
    for H, T, N in shapes:
        args, ci, co = shape_inputs(H, T, N)
        ci32 = ci.to(torch.int32).contiguous()
        q, k, v, cu = args["q"], args["k"], args["v"], args["cu_seqlens"]
        hip_in = dict(q=q, k=k, v=v, raw_g=args["raw_g"], raw_beta=args["raw_beta"], A_log=args["A_log"].float(),
                      g_bias=args["g_bias"].float(), scale=128 ** -0.5, lower_bound=args["lower_bound"],
                      cu_seqlens=cu, chunk_indices=ci32)
        t_tri = _ms(kernel_call(mod, tun, "intra", args, ci, co, design="intra"))
        t_walk = _ms(kernel_call(mod, tun, "recurrence", args, ci, co, design="intra"))
        plan = planning.plan_kda_prefill(
            (entry,), cu, cu.cpu(), num_heads=H, head_dim_k=128, head_dim_v=128, dtype=q.dtype,
            lower_bound=args["lower_bound"], has_g_bias=True, use_qk_l2norm_in_kernel=True, chunk_indices=ci,
            chunk_offsets=co, output_final_state=True, tuning=tun, design="intra")
        assert plan.launch_tuning["intra_rows"] == 16, plan.launch_tuning
        views = workspace_layout(mod, q.shape[1], H, ci.shape[0], N, plan.groups, q.dtype, "intra",
                                 16).views(plan.workspace)
        ws = {n: views[n] for n in ("qg", "w", "kg", "u", "aqk", "decay")}
        t_hip = _ms(lambda: fused_path.run_intra(lib, ws, **hip_in))
        out_t, out_h = torch.empty_like(v), torch.empty_like(v)
        vt, st, _, _, ht_t = plan.bind(q, k, v, args["raw_g"], args["raw_beta"], args["A_log"], args["g_bias"],
                                       128 ** -0.5, args["initial_state"], out_t, None)
        vh, sh, _, _, ht_h = plan.bind(q, k, v, args["raw_g"], args["raw_beta"], args["A_log"], args["g_bias"],
                                       128 ** -0.5, args["initial_state"], out_h, None)
        program = plan.program

        def tri_call() -> None:
            program.run(vt, st)

        def hybrid() -> None:
            fused_path.run_intra(lib, ws, **hip_in)
            for launch in program.walks[sh]:
                launch(vh)

        t_call, t_hyb = _ms(tri_call), _ms(hybrid)
        t_fk = _ms(flashkda_call(flash_kda.fwd, flashkda_inputs(args))) if flash_kda else float("nan")
        tri_call()
        o_t, s_t = out_t.clone(), ht_t.clone()
        hybrid()
        print(f"{f'{H}/{T}/{N}':>12s} {t_hip:10.3f} {t_tri:10.3f} {t_walk:8.3f} {t_call:9.3f} {t_hyb:8.3f} {t_fk:9.3f} "
              f"{rel_l2(out_h, o_t):9.2e} {rel_l2(ht_h, s_t):9.2e}", flush=True)


if __name__ == "__main__":
    main()
