# SPDX-License-Identifier: Apache-2.0
"""Prefix-cache checkpoints on the Triton path on a real GPU (tests/interp/test_checkpoints.py in the
interpreter): bit-identical to a cut prefill at one group, within 1e-3 of it at forced and automatic
group counts, NaN-poisoned rows that no sequence snapshots into stay NaN.
"""

from __future__ import annotations

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("no GPU", allow_module_level=True)

import kdagen_kernels
from kdagen.reference import rel_l2
from tests.kda_cases import cu_of, make_inputs
from tests.tolerances import within

DEV = "cuda"
VARIANTS = [e for e in kdagen_kernels.VARIANTS
            if e.backend == "triton" and e.dtype == "bf16" and e.head_dim_k == 128]
H = 4
LENS = [4096, 0, 1, 1000, 2048, 700]
OFFSETS = [1024, 0, 0, 960, 1984, 640]
ROWS = [6, 0, 0, 2, 4, -1]  # 0: vLLM's null block for "no checkpoint"; -1 skipped
N_ROWS = 8
# Grouped snapshots round differently from one group's (bf16 products): tests/tolerances.py.
GROUPED = ("triton-gpu", "bf16", "checkpoint_vs_cut_grouped")


def _cut(e, args):
    seqs = [n for n, off in enumerate(OFFSETS) if off > 0]
    cu = args["cu_seqlens"].tolist()
    toks = torch.cat([torch.arange(cu[n], cu[n] + OFFSETS[n], device=DEV) for n in seqs])
    cut = {n: args[n][:, toks] for n in ("q", "k", "v", "raw_g", "raw_beta")}
    _, s = kdagen_kernels.chunk_kda_prefill(
        **cut, A_log=args["A_log"], g_bias=args["g_bias"], lower_bound=args["lower_bound"],
        use_qk_l2norm_in_kernel=True, cu_seqlens=cu_of([OFFSETS[n] for n in seqs], DEV),
        initial_state=args["initial_state"][seqs], output_final_state=True)
    return dict(zip(seqs, s))


@pytest.mark.parametrize("lower_bound", [-5.0, -0.03], ids=["k3_gate", "mild_gate"])
@pytest.mark.parametrize("e", VARIANTS, ids=lambda e: e.name)
def test_triton_checkpoints_match_a_cut_prefill(monkeypatch, e, lower_bound):
    args = make_inputs(LENS, H, e.head_dim_k, e.head_dim_v, torch.bfloat16, DEV, seed=51, lower_bound=lower_bound)
    monkeypatch.setenv("KDAGEN_TRITON_GROUPS", "1")
    cut = _cut(e, args)
    plain_o, plain_s = kdagen_kernels.chunk_kda_prefill(**args)
    written = {ROWS[n]: n for n in cut if ROWS[n] >= 0}
    for groups in ("1", "2", "4", "8", "auto"):
        monkeypatch.setenv("KDAGEN_TRITON_GROUPS", groups)
        ck = torch.full((N_ROWS, H, e.head_dim_v, e.head_dim_k), float("nan"), device=DEV)
        o, s = kdagen_kernels.chunk_kda_prefill(
            **args, checkpoint_state=ck, checkpoint_offsets=torch.tensor(OFFSETS, dtype=torch.int32, device=DEV),
            checkpoint_state_indices=torch.tensor(ROWS, dtype=torch.int32, device=DEV))
        torch.cuda.synchronize()
        for r in range(N_ROWS):
            if r not in written:
                assert torch.isnan(ck[r]).all(), f"G={groups}: row {r} written, no sequence snapshots into it"
        if groups == "1":
            assert torch.equal(o, plain_o) and torch.equal(s, plain_s), "checkpoints changed the output or state"
            for r, n in written.items():
                assert torch.equal(ck[r], cut[n]), f"G=1 row {r}: not the cut prefill's final state bit for bit"
            continue
        errs = {r: rel_l2(ck[r], cut[n]) for r, n in written.items()}
        print(f"\n  {e.name} lb={lower_bound} G={groups}: " + ", ".join(f"row {r} {x:.2e}" for r, x in errs.items()),
              end="")
        for r, x in errs.items():
            within(f"G={groups} row {r} vs the cut prefill", x, GROUPED)
