# SPDX-License-Identifier: Apache-2.0
"""The H200 fuzz case relative L2 failed (Note [Conditioned output error], tests/tolerances.py), through the
Triton kernels in the interpreter: one token, one head, no state, cos(q, k) = -8.9e-4, so the output is a
near-cancellation of its terms. The interpreter keeps q and k in fp32; fed the bf16 operands the H200's q . k
products take (q and k L2-normed, then rounded), the kernels reproduce the H200's 16% relative error, which the
conditioned error judges as the rounding it is."""

from __future__ import annotations

import os

import pytest
import torch

import kdagen_kernels
from kdagen.reference import l2norm_reference, rel_l2
from tests.kda_cases import make_inputs, poisoned_out
from tests.tolerances import bound, check_output, output_terms

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="interpreter numerics: run with TRITON_INTERPRET=1")
GPU = ("triton-gpu", "bf16", "output")


def test_the_h200_cancellation_through_the_kernels():
    args = make_inputs([1], 1, 128, 128, torch.bfloat16, "cpu", seed=38, h0=False, strided=True)
    ref_o, _, terms = output_terms(**args)
    assert terms.norm() / ref_o.norm() > 600  # the cancellation: kappa 685
    o, _ = kdagen_kernels.chunk_kda_prefill(**args, out=poisoned_out(args["v"]))
    check_output("fp32 operands", o, ref_o, terms, 128, ("triton-interp", "bf16", "output"))
    # L2-normed again in the kernel, the rounded unit vectors move by under 2^-9: the products are the GPU's.
    gpu_operands = dict(args, q=l2norm_reference(args["q"]).to(torch.bfloat16),
                        k=l2norm_reference(args["k"]).to(torch.bfloat16))
    o, _ = kdagen_kernels.chunk_kda_prefill(**gpu_operands, out=poisoned_out(args["v"]))
    assert rel_l2(o, ref_o) > 0.1 > bound(GPU), rel_l2(o, ref_o)  # the H200 measured 0.16
    check_output("bf16 operands (the H200's)", o, ref_o, terms, 128, GPU)
