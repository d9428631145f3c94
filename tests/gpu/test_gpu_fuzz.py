# SPDX-License-Identifier: Apache-2.0
"""The H200 sweep: tests/interp/test_fuzz.py's random ragged batches on the GPU, through both paths.

Each example draws one interpreter-fuzz case (variant, 1-4 sequences of 0 to 2.5 chunks, heads, both
gates, g_bias or not, dense / final-only / cache state, packed or batched) plus the path: Triton, or
use_fused_chunk=True, which runs the fused HIP path whenever its preconditions hold for the case
(cu_seqlens, lower_bound, g_bias, a hip variant for K/V/dtype) and the Triton path otherwise; the
test records which ran. Inputs are moved to the GPU (strided projections become dense there; the
strided cases live in test_gpu_numerics.py and test_fused_path.py). Tolerances: tests/tolerances.py.
KDAGEN_GPU_FUZZ_EXAMPLES sets the count (default 300); derandomized, so every run sweeps the same cases.
"""

from __future__ import annotations

import os
from collections import Counter

import pytest
import torch
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

import kdagen_kernels
from kdagen.reference import chunk_kda_prefill_reference
from kdagen.runtime import fused_path
from tests.interp.test_fuzz import _build, cases
from tests.kda_cases import poisoned_out
from tests.tolerances import check

pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
                                reason="needs a GPU (and not the interpreter)")
DEV = "cuda"
EXAMPLES = int(os.environ.get("KDAGEN_GPU_FUZZ_EXAMPLES", "300"))
RAN: Counter = Counter()
TRITON_DTYPES = {e.name: e.dtype for e in kdagen_kernels.VARIANTS if e.backend == "triton"}


def _to(x, dev):
    return x.to(dev) if isinstance(x, torch.Tensor) else x


@pytest.fixture(scope="module", autouse=True)
def report():
    yield
    print(f"\n[gpu fuzz] {sum(RAN.values())} cases: " + ", ".join(f"{k} {v}" for k, v in sorted(RAN.items())))


HIP_DIMS = {(e.head_dim_k, e.head_dim_v, e.dtype) for e in kdagen_kernels.VARIANTS if e.backend == "hip"}
FUSABLE = sorted(e.name for e in kdagen_kernels.VARIANTS
                 if e.backend == "triton" and (e.head_dim_k, e.head_dim_v, e.dtype) in HIP_DIMS)


@st.composite
def both_paths(draw) -> tuple[dict, bool]:
    """A case and the path; three in four fused cases meet the fused preconditions (the rest show that
    use_fused_chunk=True falls back to the Triton path correctly)."""
    case = draw(cases())
    fused = draw(st.booleans())
    if fused and FUSABLE and draw(st.integers(0, 3)) > 0:
        case.update(variant=draw(st.sampled_from(FUSABLE)), layout="packed", lower_bound=-5.0, g_bias=True)
    return case, fused


@settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(drawn=both_paths())
def test_random_ragged_batches_both_paths(drawn):
    case, fused = drawn
    note(f"case: {case} fused={fused}")
    args, ref_args = _build(case)
    ref_o, ref_s = chunk_kda_prefill_reference(**ref_args)
    args = {k: _to(v, DEV) for k, v in args.items()}
    calls = []
    # A fused plan launches the HIP kda_intra_kernel where its pipeline has it (Note [Pipelines]).
    real_intra = fused_path.HipIntraLaunch.__call__

    def spy_intra(self, *a, **kw):
        calls.append(1)
        return real_intra(self, *a, **kw)

    fused_path.HipIntraLaunch.__call__ = spy_intra
    try:
        out = poisoned_out(args["v"])
        o, s = kdagen_kernels.chunk_kda_prefill(**args, out=out, use_fused_chunk=fused)
        torch.cuda.synchronize()
    finally:
        fused_path.HipIntraLaunch.__call__ = real_intra
    RAN["fused" if calls else ("triton (fused asked)" if fused else "triton")] += 1
    assert o is out
    tag = f"{case} fused={fused} ran={'fused' if calls else 'triton'}"
    path, dtype = ("fused-gpu" if calls else "triton-gpu"), TRITON_DTYPES[case["variant"]]
    check(f"output of {tag}", o.cpu(), ref_o, (path, dtype, "output"))
    if case["state"] == "cache":
        assert s is None
        cache, ref_cache = args["state_cache"].cpu(), ref_args["state_cache"]
        for r in case["rows"]:
            check(f"cache row {r} of {tag}", cache[r], ref_cache[r], (path, dtype, "final_state"))
        for r in sorted(set(range(case["slots"])) - set(case["rows"])):
            assert torch.equal(cache[r], ref_cache[r]) or (cache[r].isnan().all() and ref_cache[r].isnan().all()), \
                f"cache row {r} outside state_indices changed: {tag}"
    elif case["state"] in ("dense", "final_only"):
        check(f"final state of {tag}", s.cpu(), ref_s, (path, dtype, "final_state"))
    else:
        assert s is None
