# SPDX-License-Identifier: Apache-2.0
"""Property test: random ragged batches through the generated Triton variants (interpreter) against the
float64 reference.

Each example draws a variant (its K, V, dtype), 1-4 sequences of 0 to 2.5 chunks (chunk-boundary
lengths favoured), 1-2 heads (1 for a variant with K or V > 128, for speed), both gates, with or
without g_bias, a dense initial/final state, a final state only, a state cache (rows permuted, some
flags false with their rows poisoned), strided raw_g/raw_beta projections, and the packed (cu_seqlens)
or batched [B, T] layout. Tolerances: tests/tolerances.py.

Bounded for CI: derandomize=True (the same examples every run), max_examples=15, no deadline, no
example database. KDAGEN_FUZZ_EXAMPLES=<n> runs more locally; a failure prints the shrunk case.
"""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

import kdagen_kernels
from kdagen.reference import chunk_kda_prefill_reference
from tests.kda_cases import make_inputs, poisoned_out
from tests.tolerances import check

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="interpreter numerics: run with TRITON_INTERPRET=1")

TRITON = {e.name: e for e in kdagen_kernels.VARIANTS if e.backend == "triton"}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
MAX_EXAMPLES = int(os.environ.get("KDAGEN_FUZZ_EXAMPLES", "15"))


@st.composite
def cases(draw) -> dict:
    name = draw(st.sampled_from(sorted(TRITON)))
    e = TRITON[name]
    c = e.chunk_size
    n = draw(st.integers(1, 4))
    length = st.one_of(st.sampled_from([0, 1, c - 1, c, c + 1, 2 * c]), st.integers(0, 5 * c // 2))
    layout = draw(st.sampled_from(["packed", "batched"]))
    if layout == "batched":
        lens = [draw(length)] * n
    else:
        lens = draw(st.lists(length, min_size=n, max_size=n))
    state = draw(st.sampled_from(["none", "final_only", "dense", "cache"]))
    case = dict(
        variant=name, lens=lens, layout=layout,
        heads=1 if max(e.head_dim_k, e.head_dim_v) > 128 else draw(st.integers(1, 2)),
        lower_bound=draw(st.sampled_from([-5.0, None])),
        g_bias=draw(st.booleans()),
        state=state,
        strided=draw(st.booleans()),
        seed=draw(st.integers(0, 2**16 - 1)),
    )
    if state == "cache":
        slots = n + 2
        case["rows"] = draw(st.permutations(list(range(slots))))[:n]
        case["flags"] = draw(st.lists(st.booleans(), min_size=n, max_size=n))
        case["slots"] = slots
    return case


def _build(case: dict) -> tuple[dict, dict]:
    """(kernel kwargs, reference kwargs) for one drawn case."""
    e = TRITON[case["variant"]]
    H, K, V, lens = case["heads"], e.head_dim_k, e.head_dim_v, case["lens"]
    args = make_inputs(lens, H, K, V, DTYPES[e.dtype], "cpu", seed=case["seed"], lower_bound=case["lower_bound"],
                       g_bias=case["g_bias"], h0=case["state"] in ("dense", "cache"), strided=case["strided"])
    if case["state"] == "final_only":
        args["output_final_state"] = True
    if case["layout"] == "batched":
        B, T = len(lens), lens[0]
        del args["cu_seqlens"]
        for name in ("q", "k", "v", "raw_g", "raw_beta"):
            args[name] = args[name].view(B, T, *args[name].shape[2:])
    ref = dict(args)
    if case["state"] == "cache":
        h0 = args.pop("initial_state")
        args.pop("output_final_state")
        gen = torch.Generator().manual_seed(case["seed"])
        cache = torch.randn(case["slots"], H, V, K, generator=gen) * 0.1
        rows = torch.tensor(case["rows"], dtype=torch.int32)
        flags = torch.tensor(case["flags"])
        for n, r in enumerate(case["rows"]):
            cache[r] = h0[n] if case["flags"][n] else float("nan")  # a false flag's row must not be read
        args.update(state_cache=cache, state_indices=rows, has_initial_state=flags)
        ref = dict(args, state_cache=cache.clone())
        ref.pop("initial_state", None)
    return args, ref


@settings(max_examples=MAX_EXAMPLES, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=cases())
def test_random_ragged_batches_match_reference(case):
    note(f"case: {case}")
    args, ref_args = _build(case)
    ref_o, ref_s = chunk_kda_prefill_reference(**ref_args)
    out = poisoned_out(args["v"])
    o, s = kdagen_kernels.chunk_kda_prefill(**args, out=out)
    assert o is out
    tag = f"{case}"
    dtype = TRITON[case["variant"]].dtype
    check(f"output of {tag}", o, ref_o, ("triton-interp", dtype, "output"))
    if case["state"] == "cache":
        assert s is None
        cache, ref_cache = args["state_cache"], ref_args["state_cache"]
        for r in case["rows"]:
            check(f"cache row {r} of {tag}", cache[r], ref_cache[r], ("triton-interp", dtype, "final_state"))
        untouched = sorted(set(range(case["slots"])) - set(case["rows"]))
        for r in untouched:
            assert torch.equal(cache[r], ref_cache[r]), f"cache row {r} outside state_indices changed: {tag}"
    elif case["state"] in ("dense", "final_only"):
        check(f"final state of {tag}", s, ref_s, ("triton-interp", dtype, "final_state"))
    else:
        assert s is None
