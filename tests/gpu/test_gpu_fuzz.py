# SPDX-License-Identifier: Apache-2.0
"""The H200 sweep: tests/interp/test_fuzz.py's random ragged batches on the GPU, through every pipeline.

Each example draws one interpreter-fuzz case (variant, 1-4 sequences of 0 to 2.5 chunks, heads, both
gates, g_bias or not, dense / final-only / cache state, packed or batched) plus the route:
- the Triton path (chunk_kda_prefill as vLLM calls it);
- the HIP kernels: three in four fused draws are made to meet their preconditions (packed with cu_seqlens, the
  bounded gate at -5.0 >= -5.415, g_bias, the L2 norm in kernel, a hip variant for K/V/dtype) and run a plan
  with pipeline="hip_intra+hip_walk" wherever the HIP library builds here (can_use_fused_kda_chunk), so the
  HIP kernels are forced, never left to the chooser;
- use_fused_chunk=True on the rest, which must fall back to the Triton path correctly.
The count of cases per route is printed at the end of the session (tests/conftest.py). Inputs are moved to the
GPU (strided projections become dense there; the strided cases live in test_gpu_numerics.py and
test_fused_path.py). Outputs are checked on their conditioned error (Note [Conditioned output error] in
tests/tolerances.py): a one-token output that is a near-cancellation of its terms is judged against their
rounding. KDAGEN_GPU_FUZZ_EXAMPLES sets the count (default 300); derandomized, so every run sweeps the same
cases.
"""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

import kdagen_kernels
from kdagen.runtime import fused_path
from kdagen.runtime.pipeline import INTRA_MIN_LOWER_BOUND
from kdagen.runtime.registry import TORCH_DTYPES
from tests.interp.test_fuzz import _build, cases
from tests.kda_cases import poisoned_out
from tests.tolerances import check, check_output, output_terms

pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
                                reason="needs a GPU (and not the interpreter)")
DEV = "cuda"
EXAMPLES = int(os.environ.get("KDAGEN_GPU_FUZZ_EXAMPLES", "300"))
TRITON = {e.name: e for e in kdagen_kernels.VARIANTS if e.backend == "triton"}
HIP_PIPELINE = "hip_intra+hip_walk"
HIP_DIMS = {(e.head_dim_k, e.head_dim_v, e.dtype) for e in kdagen_kernels.VARIANTS if e.backend == "hip"}
FUSABLE = sorted(name for name, e in TRITON.items() if (e.head_dim_k, e.head_dim_v, e.dtype) in HIP_DIMS)


def _to(x, dev):
    return x.to(dev) if isinstance(x, torch.Tensor) else x


@st.composite
def routes(draw) -> tuple[dict, str]:
    """A case and its route: "triton", "hip" (the case meets the HIP kernels' preconditions) or "fused asked"
    (use_fused_chunk=True on a case that may not)."""
    case = draw(cases())
    if not draw(st.booleans()):
        return case, "triton"
    if FUSABLE and draw(st.integers(0, 3)) > 0:
        case.update(variant=draw(st.sampled_from(FUSABLE)), layout="packed", lower_bound=-5.0, g_bias=True)
        return case, "hip"
    return case, "fused asked"


def _hip_builds(e) -> bool:
    return kdagen_kernels.can_use_fused_kda_chunk(e.head_dim_k, e.head_dim_v, TORCH_DTYPES[e.dtype], e.chunk_size)


def _meets_hip(case: dict) -> bool:
    """The HIP kernels' preconditions (the L2 norm in kernel is in every case)."""
    return (case["variant"] in FUSABLE and case["layout"] == "packed" and case["g_bias"]
            and case["lower_bound"] is not None and case["lower_bound"] >= INTRA_MIN_LOWER_BOUND)


def _run_hip_plan(args: dict, e) -> tuple[torch.Tensor, torch.Tensor | None, object]:
    """One plan with the HIP kernels forced, run once, with a spy proving both HIP kernels were launched:
    (output, final state or None, plan)."""
    cu = args["cu_seqlens"]
    plan = kdagen_kernels.plan_kda_prefill(
        cu, cu.cpu(), num_heads=args["q"].shape[2], head_dim_k=e.head_dim_k, head_dim_v=e.head_dim_v,
        dtype=args["q"].dtype, device=args["q"].device, lower_bound=args["lower_bound"], has_g_bias=True,
        use_qk_l2norm_in_kernel=True, state_indices=args.get("state_indices"),
        has_initial_state=args.get("has_initial_state"), output_final_state=args.get("output_final_state", False),
        use_fused_chunk=True, pipeline=HIP_PIPELINE)
    launched: list[str] = []
    with pytest.MonkeyPatch.context() as m:
        for cls in (fused_path.HipIntraLaunch, fused_path.HipWalkLaunch, fused_path.HipPairLaunch):
            m.setattr(cls, "__call__", _recording(cls.__call__, cls.__name__, launched))
        o, s = plan.run(args["q"], args["k"], args["v"], args["raw_g"], args["raw_beta"], args["A_log"],
                        args["g_bias"], initial_state=args.get("initial_state"), out=poisoned_out(args["v"]),
                        state_cache=args.get("state_cache"))
    assert plan.pipeline.name == HIP_PIPELINE and plan.lib is not None, plan.describe()
    if args["cu_seqlens"][-1] > 0:
        assert set(launched) == {"HipPairLaunch"}, f"launched {launched}: {plan.describe()}"
    return o, s, plan


def _recording(call, name: str, log: list[str]):
    def spy(self, *a, **kw):
        log.append(name)
        return call(self, *a, **kw)

    return spy


@settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(drawn=routes())
def test_random_ragged_batches_every_route(drawn, pipelines_ran):
    case, route = drawn
    e = TRITON[case["variant"]]
    if route == "hip" and not _hip_builds(e):
        route = "fused asked"  # no HIP library on this machine: the contract is the Triton path
    note(f"case: {case} route={route}")
    args, ref_args = _build(case)
    ref_o, ref_s, terms = output_terms(**ref_args)
    args = {k: _to(v, DEV) for k, v in args.items()}
    if route == "hip":
        o, s, plan = _run_hip_plan(args, e)
        label = f"{HIP_PIPELINE} ({plan.entry.name})"
    else:
        out = poisoned_out(args["v"])
        o, s = kdagen_kernels.chunk_kda_prefill(**args, out=out, use_fused_chunk=route == "fused asked")
        assert o is out
        label = "Triton path"
        if route == "fused asked":
            # The chooser may take the HIP kernels where their preconditions hold: judge those on fused-gpu.
            label = f"use_fused_chunk=True, auto ({'HIP preconditions met' if _meets_hip(case) else 'Triton'})"
    torch.cuda.synchronize()
    pipelines_ran[f"test_gpu_fuzz: {label}"] += 1
    tag = f"{case} route={route}"
    path = "fused-gpu" if route == "hip" or (route == "fused asked" and _meets_hip(case)) else "triton-gpu"
    check_output(f"output of {tag}", o.cpu(), ref_o, terms, e.head_dim_k, (path, e.dtype, "output"))
    if case["state"] == "cache":
        assert s is None
        cache, ref_cache = args["state_cache"].cpu(), ref_args["state_cache"]
        for r in case["rows"]:
            check(f"cache row {r} of {tag}", cache[r], ref_cache[r], (path, e.dtype, "final_state"))
        for r in sorted(set(range(case["slots"])) - set(case["rows"])):
            assert torch.equal(cache[r], ref_cache[r]) or (cache[r].isnan().all() and ref_cache[r].isnan().all()), \
                f"cache row {r} outside state_indices changed: {tag}"
    elif case["state"] in ("dense", "final_only"):
        check(f"final state of {tag}", s.cpu(), ref_s, (path, e.dtype, "final_state"))
    else:
        assert s is None
