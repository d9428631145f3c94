# SPDX-License-Identifier: Apache-2.0
"""Which rounding of the fused path's 16-row walk the output error comes from (CPU, float64).

Usage (repo root): PYTHONPATH=.:generated python tools/walk_error_budget.py

Builds kda_intra's workspace in float64 (kdagen.reference.intra_workspace_reference) for a random two-sequence
batch (K = V = 128, bounded gate, L2 norm, an initial state) and walks it in float64 with the roundings the
kernels make switched on or off one at a time: the bf16 workspace (each tensor alone), the bf16 copy of the state
in its products, bf16 v_new, the bf16 output. Prints the relative L2 error of the output and the final state
against the float64 prefill (docs/perf-archive.md, "Where the fused path's output error comes from"). The kernels'
own operand roundings inside kda_intra (its bf16 Aqk / Akk operands) are not modelled: the workspace here is exact
before it is rounded.
"""

from __future__ import annotations

import torch

from kdagen.reference import chunk_kda_prefill_reference, intra_workspace_reference, rel_l2
from kdagen.runtime.metadata import prepare_chunk_offsets

H, K, V = 2, 128, 128
LENS = [700, 333]


def bf(t: torch.Tensor) -> torch.Tensor:
    return t.bfloat16().double()


def main() -> None:
    g = torch.Generator().manual_seed(0)
    T = sum(LENS)

    def rn(*s):
        return torch.randn(*s, generator=g)

    x = dict(q=rn(1, T, H, K).bfloat16(), k=rn(1, T, H, K).bfloat16(), v=rn(1, T, H, V).bfloat16(),
             raw_g=rn(1, T, H, K).bfloat16(), raw_beta=rn(1, T, H).bfloat16(), A_log=torch.rand(H, generator=g),
             g_bias=torch.rand(H * K, generator=g))
    cu = torch.tensor([0] + torch.tensor(LENS).cumsum(0).tolist(), dtype=torch.int32)
    h0 = rn(len(LENS), H, V, K)
    ref_o, ref_s = chunk_kda_prefill_reference(**x, initial_state=h0, output_final_state=True, lower_bound=-5.0,
                                               use_qk_l2norm_in_kernel=True, cu_seqlens=cu)
    ws64 = intra_workspace_reference(x["q"], x["k"], x["v"], x["raw_g"], x["raw_beta"], x["A_log"], x["g_bias"],
                                     K ** -0.5, -5.0, cu)
    co = prepare_chunk_offsets(cu, 64).tolist()
    c = cu.tolist()

    def walk(exact_ws=(), state=True, vnew=True, out=True):
        ws = {n: (t.double() if n in exact_ws or n == "decay" else bf(t)) for n, t in ws64.items()}
        o = torch.zeros(1, T, H, V, dtype=torch.float64)
        st = torch.zeros(len(LENS), H, V, K, dtype=torch.float64)
        for n in range(len(LENS)):
            for h in range(H):
                S = h0[n, h].double()
                for i in range((c[n + 1] - c[n] + 15) // 16):
                    t0 = c[n] + 16 * i
                    t1 = min(t0 + 16, c[n + 1])
                    w, qg, kg, u = (ws[m][t0:t1, h] for m in ("w", "qg", "kg", "u"))
                    a = ws["aqk"][t0:t1, h, :t1 - t0].tril()
                    Sb = bf(S) if state else S
                    vn = u - w @ Sb.T
                    vn = bf(vn) if vnew else vn
                    oo = qg @ Sb.T * K ** -0.5 + a @ vn
                    o[0, t0:t1, h] = bf(oo) if out else oo
                    S = S * ws["decay"][co[n] * 4 + i, h][None, :] + vn.T @ kg
                st[n, h] = S
        return rel_l2(o, ref_o), rel_l2(st, ref_s)

    rows = [("every rounding (the kernels')", walk()),
            ("state exact in its products", walk(state=False)),
            ("v_new exact", walk(vnew=False)),
            ("output not rounded", walk(out=False)),
            ("workspace exact", walk(exact_ws=("qg", "w", "kg", "u", "aqk")))]
    rows += [(f"{n} exact", walk(exact_ws=(n,))) for n in ("qg", "w", "kg", "u", "aqk")]
    print(f"{'':34s} {'output':>9s} {'state':>9s}")
    for name, (eo, es) in rows:
        print(f"{name:34s} {eo:9.3e} {es:9.3e}")


if __name__ == "__main__":
    main()
