# SPDX-License-Identifier: Apache-2.0
"""`python -m kdagen demo`: a small ragged prefill through the generated package, checked against the
float64 reference. On the GPU when there is one, else in Triton's CPU interpreter."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from kdagen.cli import add_command


def _demo() -> int:
    import torch

    import kdagen_kernels
    from kdagen.reference import chunk_kda_prefill_reference, rel_l2

    dev = "cuda" if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1" else "cpu"
    H, K, V = 4, 128, 128
    lens = [100, 0, 1, 64] if dev == "cpu" else [1000, 0, 1, 64, 3000]
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32, device=dev)
    T = int(cu[-1])
    g = torch.Generator(device="cpu").manual_seed(0)

    def rn(*s):
        return torch.randn(*s, generator=g).to(dev)

    args = dict(q=rn(1, T, H, K).bfloat16(), k=rn(1, T, H, K).bfloat16(), v=rn(1, T, H, V).bfloat16(),
                raw_g=rn(1, T, H, K).bfloat16(), raw_beta=rn(1, T, H).bfloat16(), A_log=rn(H).abs(),
                g_bias=rn(H * K), initial_state=0.1 * rn(len(lens), H, V, K), output_final_state=True,
                lower_bound=-5.0, use_qk_l2norm_in_kernel=True, cu_seqlens=cu)
    where = torch.cuda.get_device_name() if dev == "cuda" else "the Triton interpreter (CPU)"
    print(f"kdagen demo: chunk_kda_prefill on {where}: H={H} K={K} V={V} sequence lengths {lens}")
    t0 = time.perf_counter()
    o, s = kdagen_kernels.chunk_kda_prefill(**args)
    if dev == "cuda":
        torch.cuda.synchronize()
    t1 = time.perf_counter()
    ref_o, ref_s = chunk_kda_prefill_reference(**args)
    eo, es = rel_l2(o, ref_o), rel_l2(s, ref_s)
    why = "first call: includes Triton's compile" if dev == "cuda" else "interpreted on the CPU: slow, nothing compiles"
    print(f"  output {tuple(o.shape)} {o.dtype}, final state {tuple(s.shape)} {s.dtype} in {t1 - t0:.2f} s ({why})")
    print(f"  relative L2 error vs the float64 reference: output {eo:.2e}, final state {es:.2e}")
    ok = eo < 1e-2 and es < 1e-2
    print("  OK" if ok else "  MISMATCH")
    return 0 if ok else 1


def _run(args: argparse.Namespace) -> int:
    import torch

    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        # The interpreter must be chosen before triton is imported: rerun in a fresh process.
        env = dict(os.environ, TRITON_INTERPRET="1")
        return subprocess.call([sys.executable, "-m", "kdagen", "demo"], env=env)
    return _demo()


add_command("demo", "run a small prefill through kdagen_kernels and check it against the reference", None, _run)
