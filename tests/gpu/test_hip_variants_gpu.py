# SPDX-License-Identifier: Apache-2.0
"""Every hip variant of the registry with the HIP kernels forced (pipeline="hip_intra+hip_walk") on the H200,
against the float64 reference: tests/variant_cases.py's ragged batch (an empty and a one-token sequence, lengths
off the chunk grid, the paged cache with a NaN row behind a false flag and rows it must not touch, a poisoned
`out`), with a spy proving both HIP kernels ran and the plan's library being the named variant's. Tolerances:
tests/tolerances.py (fused-gpu). A variant is tested here the moment the spec declares it."""

from __future__ import annotations

import os

import pytest
import torch

import kdagen_kernels
from kdagen.runtime import fused_path
from tests.kda_cases import poisoned_out
from tests.tolerances import check, check_output, output_terms
from tests.variant_cases import inputs

pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
                                reason="needs a GPU (and not the interpreter)")

HIP_PIPELINE = "hip_intra+hip_walk"
HIP_VARIANTS = [pytest.param(e, id=e.name) for e in kdagen_kernels.VARIANTS if e.backend == "hip"]


@pytest.mark.parametrize("entry", HIP_VARIANTS)
def test_hip_variant_matches_reference_on_the_gpu(entry, monkeypatch, pipelines_ran):
    run, ref = inputs(entry, -5.0, "cuda", heads=4, scale=4)
    cu = run["cu_seqlens"]
    plan = kdagen_kernels.plan_kda_prefill(
        cu, cu.cpu(), num_heads=4, head_dim_k=entry.head_dim_k, head_dim_v=entry.head_dim_v, dtype=run["q"].dtype,
        device=run["q"].device, lower_bound=-5.0, has_g_bias=True, use_qk_l2norm_in_kernel=True,
        state_indices=run["state_indices"], has_initial_state=run["has_initial_state"], use_fused_chunk=True,
        pipeline=HIP_PIPELINE)
    assert plan.pipeline.name == HIP_PIPELINE and plan.lib is not None, plan.describe()
    assert plan.lib.name == entry.name, f"asked for {entry.name}, the plan's library is {plan.lib.name}"
    launched: list[str] = []
    for cls in (fused_path.HipIntraLaunch, fused_path.HipWalkLaunch):
        def spy(self, *a, _call=cls.__call__, _name=cls.__name__, **kw):
            launched.append(_name)
            return _call(self, *a, **kw)
        monkeypatch.setattr(cls, "__call__", spy)
    out = poisoned_out(run["v"])
    o, none = plan.run(run["q"], run["k"], run["v"], run["raw_g"], run["raw_beta"], run["A_log"], run["g_bias"],
                       out=out, state_cache=run["state_cache"])
    torch.cuda.synchronize()
    assert sorted(launched) == ["HipIntraLaunch", "HipWalkLaunch"], launched
    assert o is out and none is None
    ref_o, _, terms = output_terms(**ref)
    check_output(f"output of {entry.name}", o.cpu(), ref_o, terms, entry.head_dim_k, ("fused-gpu", entry.dtype, "output"))
    cache, ref_cache = run["state_cache"].cpu(), ref["state_cache"]
    rows = ref["state_indices"].tolist()
    for r in rows:
        check(f"cache row {r} of {entry.name}", cache[r], ref_cache[r], ("fused-gpu", entry.dtype, "final_state"))
    for r in sorted(set(range(cache.shape[0])) - set(rows)):
        assert torch.equal(cache[r], ref_cache[r]), f"cache row {r} outside state_indices changed: {entry.name}"
    pipelines_ran[f"test_hip_variants_gpu: {HIP_PIPELINE} ({entry.name})"] += 1
