# SPDX-License-Identifier: Apache-2.0
"""Gates whose exp(A_log) overflows fp32 (A_log >= 88.7) against the float64 reference, in the interpreter.

exp(A_log) is formed only where it cannot overflow (docs/reference.md, "Gate saturation"): heads with
A_log = 88, 100 and 1e4 next to ordinary ones must give a finite output and final state within the usual
tolerances, for the bounded gate on both of its designs (kda_intra; the kda_prologue / kda_wu pair) and for
the softplus gate (the pair).
"""

from __future__ import annotations

import os

import pytest
import torch

import kdagen_kernels
from kdagen.reference import chunk_kda_prefill_reference
from tests.kda_cases import make_inputs, poisoned_out
from tests.tolerances import check

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="interpreter numerics: run with TRITON_INTERPRET=1")

E = min((e for e in kdagen_kernels.VARIANTS if e.backend == "triton" and e.dtype == "bf16"),
        key=lambda e: e.head_dim_k * e.head_dim_v)
# One ordinary head, one just below fp32's exp overflow, three past it (1e4 is past float64's too: its
# reference gate is then exactly 0/lower_bound or -inf, still finite decays).
A_LOG = [0.5, 88.0, 100.0, 1e4, 40.5]

# (lower_bound, pipeline): which kernels form the gate.
PATHS = {"bounded_intra": (-5.0, "triton_intra+triton_walk"),
         "bounded_intra_tb": (-5.0, "triton_intra_tb+triton_walk_tb"), "bounded_pair": (-5.0, "triton_pair+triton_walk"), "softplus": (None, "triton_pair+triton_walk")}


@pytest.mark.parametrize("path", list(PATHS))
def test_overflowing_A_log_matches_reference(path):
    lower_bound, pipeline = PATHS[path]
    H = len(A_LOG)
    args = make_inputs([E.chunk_size + 11, 1], H, E.head_dim_k, E.head_dim_v, torch.bfloat16, "cpu",
                       seed=41, lower_bound=lower_bound)
    args["A_log"] = torch.tensor(A_LOG)
    ref_o, ref_s = chunk_kda_prefill_reference(**args)
    assert torch.isfinite(ref_o).all() and torch.isfinite(ref_s).all(), "the reference itself is not finite"
    cu = args["cu_seqlens"]
    plan = kdagen_kernels.plan_kda_prefill(cu, cu, num_heads=H, head_dim_k=E.head_dim_k, head_dim_v=E.head_dim_v,
                                           lower_bound=lower_bound, has_g_bias=True, use_qk_l2norm_in_kernel=True,
                                           output_final_state=True, pipeline=pipeline)
    layer = {n: args[n] for n in ("q", "k", "v", "raw_g", "raw_beta", "A_log", "g_bias")}
    o, s = plan.run(**layer, initial_state=args["initial_state"], out=poisoned_out(args["v"]))
    assert torch.isfinite(o).all() and torch.isfinite(s).all(), f"{path}: non-finite output or state"
    check(f"{path} output", o, ref_o, ("triton-interp", "bf16", "output"))
    check(f"{path} final state", s, ref_s, ("triton-interp", "bf16", "final_state"))
