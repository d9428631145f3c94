# SPDX-License-Identifier: Apache-2.0
"""Numerical robustness of the Triton path (interpreter) against the float64 reference on extreme inputs.

Gates at their limits (a saturated lower-bound sigmoid, a full decay of |lower_bound| per token on both
sides of each diagonal-block threshold of kdagen.runtime.triton_path.diag_ref, softplus gates of ~0 and
of ~-200 per token), near-duplicate keys with beta near 1, and q/k/v scaled by 100 and by 1e-3, for a
bf16 and an fp16 variant. Whenever the reference is finite the kernel must be too, within
tests/tolerances.py.
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

TRITON = [e for e in kdagen_kernels.VARIANTS if e.backend == "triton"]
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def _smallest(dtype: str):
    fits = [e for e in TRITON if e.dtype == dtype]
    return min(fits, key=lambda e: e.head_dim_k * e.head_dim_v) if fits else None


VARIANTS = [e for e in (_smallest("bf16"), _smallest("fp16")) if e is not None]
H = 2
LENS = [150, 1, 64]  # a ragged tail, a single token, one exact chunk


def _shift(name, delta):
    def f(a):
        a[name] = (a[name].float() + delta).to(a[name].dtype)
    return f


def _scale(factor):
    def f(a):
        for name in ("q", "k", "v"):
            a[name] = (a[name].float() * factor).to(a[name].dtype)
    return f


def _signs(magnitude):
    def f(a):
        s = torch.sign(a["raw_g"].float())
        a["raw_g"] = (s * magnitude).to(a["raw_g"].dtype)
    return f


# name: (lower_bound, A_log, mutate)
SCENARIOS = {
    # exp(3) = 20: sigmoid(20 z) is 0 or 1 for most channels, so g is ~0 or ~-5 per token.
    "lower_bound_saturated": (-5.0, 3.0, None),
    # g ~ lower_bound on every channel and token: exp(-320) over a chunk, far below fp32's range.
    "lower_bound_-5_full_decay": (-5.0, 3.0, _shift("raw_g", 10.0)),
    # Both sides of the factored diagonal blocks' bound (125 ln 2 / 16 = 5.415): the last factored, the
    # first mid-point one.
    "lower_bound_-5.41_full_decay": (-5.41, 3.0, _shift("raw_g", 10.0)),
    "lower_bound_-5.42_full_decay": (-5.42, 3.0, _shift("raw_g", 10.0)),
    # The edge of the mid-point reference (>= -10).
    "lower_bound_-10_full_decay": (-10.0, 3.0, _shift("raw_g", 10.0)),
    # Past it: the exact per-row diagonal products.
    "lower_bound_-20_full_decay": (-20.0, 3.0, _shift("raw_g", 10.0)),
    # softplus(-30) ~ 1e-13: no decay at all.
    "softplus_near_zero": (None, 0.0, _shift("raw_g", -30.0)),
    # -exp(3) * softplus(~10) ~ -200 per token: the state forgets everything each token.
    "softplus_very_negative": (None, 3.0, _shift("raw_g", 10.0)),
    # Channels either never decay or forget everything, side by side.
    "softplus_mixed_extremes": (None, 3.0, _signs(30.0)),
    "qkv_x100": (-5.0, None, _scale(100.0)),
    "qkv_x1e-3": (-5.0, None, _scale(1e-3)),
}


def _run(args):
    ref_o, ref_s = chunk_kda_prefill_reference(**args)
    assert torch.isfinite(ref_o).all() and torch.isfinite(ref_s).all(), "the reference itself is not finite"
    out = poisoned_out(args["v"])
    o, s = kdagen_kernels.chunk_kda_prefill(**args, out=out)
    return (o, ref_o), (s, ref_s)


# exp2 of the masked (upper-triangle) products may overflow to inf/nan before tl.where drops them; the
# interpreter's numpy matmul warns about it. Only the kept entries matter and they are checked here.
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning",
                            "ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("scenario", list(SCENARIOS))
@pytest.mark.parametrize("e", VARIANTS, ids=lambda e: e.name)
def test_extreme_inputs_stay_finite_and_accurate(e, scenario):
    lower_bound, a_log, mutate = SCENARIOS[scenario]
    args = make_inputs(LENS, H, e.head_dim_k, e.head_dim_v, DTYPES[e.dtype], "cpu", seed=31,
                       lower_bound=lower_bound)
    if a_log is not None:
        args["A_log"] = torch.full((H,), a_log)
    if mutate is not None:
        mutate(args)
    (o, ref_o), (s, ref_s) = _run(args)
    check(f"{e.name} {scenario} output", o, ref_o, ("triton-interp", e.dtype, "output"))
    check(f"{e.name} {scenario} final state", s, ref_s, ("triton-interp", e.dtype, "final_state"))


# ---- near-duplicate keys -------------------------------------------------------------------------

def _near_duplicate(e, seed: int, noise: float, beta_logit: float) -> dict:
    """Keys within `noise` of one direction, beta = sigmoid(beta_logit), real K3 gate biases (almost no
    decay): (I + Akk) is as far from I as it gets, the regime of docs/semantics.md, "The chunked form" (the
    triangular inverse)."""
    args = make_inputs([64, 64], 1, e.head_dim_k, e.head_dim_v, DTYPES[e.dtype], "cpu", seed=seed,
                       adversarial=True)
    gen = torch.Generator().manual_seed(1000 + seed)
    dtype = args["k"].dtype
    base = args["k"][:, :1].float()
    args["k"] = (base + noise * torch.randn(args["k"].shape, generator=gen)).to(dtype)
    args["raw_beta"] = (beta_logit + 0.01 * torch.randn(args["raw_beta"].shape, generator=gen)).to(dtype)
    return args


NEAR_DUP_MODERATE = [(0.0, 1.0), (1e-3, 1.0), (1e-2, 1.0)]  # (key noise, beta logit): beta 0.73
NEAR_DUP_BETA_NEAR_ONE = [(0.0, 2.95), (1e-3, 6.0), (0.0, 6.0), (1e-2, 6.0)]  # beta 0.95 .. 0.998


def _near_dup_errors(e, cases):
    for seed, (noise, beta_logit) in enumerate(cases):
        args = _near_duplicate(e, seed, noise, beta_logit)
        (o, ref_o), (s, ref_s) = _run(args)
        tag = f"{e.name} keys+-{noise} beta_logit {beta_logit} seed {seed}"
        check(f"{tag} output", o, ref_o, ("triton-interp", e.dtype, "output"))
        check(f"{tag} final state", s, ref_s, ("triton-interp", e.dtype, "final_state"))


@pytest.mark.parametrize("e", VARIANTS, ids=lambda e: e.name)
def test_near_duplicate_keys_with_moderate_beta(e):
    _near_dup_errors(e, NEAR_DUP_MODERATE)


@pytest.mark.parametrize("e", VARIANTS, ids=lambda e: e.name)
def test_near_duplicate_keys_with_beta_near_one(e):
    """The interpreter bound, which a less precise block inverse misses.

    Regression guard: a Neumann-doubling inverse of the 16x16 diagonal blocks,
    (I + D)^-1 = (I - D)(I + D^2)(I + D^4)(I + D^8) in fp32 (tried in the prologue during the hardening
    work), fails here. With near-duplicate unit keys and beta ~0.95-0.998, D ~ beta * (strictly lower
    ones), D^8 has entries ~3.4e3 that cancel, and the block inverse comes out with a relative error of
    ~5e-5 (forward substitution in fp32: ~2e-8). The final state's relative L2 error then reaches
    1e-4 to 4e-4 against ~1e-6 with forward substitution, over the interpreter's final-state bound.
    """
    _near_dup_errors(e, NEAR_DUP_BETA_NEAR_ONE)
