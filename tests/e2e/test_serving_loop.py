# SPDX-License-Identifier: Apache-2.0
"""The package as vLLM's KDA layers use it (tests/serving_loop.py), in the interpreter at small sizes: a serving
loop of three steps over two layers under torch.inference_mode() (chunked prefill, a prefix-cache hit from a
checkpoint, single-token sequences), two threads calling the op at once on shared metadata, and the op inside a
torch.compile(fullgraph=True) module (the eager backend: the graph must not break, and the CPU has no GPU code
to generate). Tolerances: tests/tolerances.py (triton-interp)."""

from __future__ import annotations

import os

import pytest
import torch

from tests.serving_loop import Model, Scenario, compiled_layer, concurrent_calls, serve_and_check

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="interpreter numerics: run with TRITON_INTERPRET=1")

SMALL = Scenario(heads=2, head_dim=64, layers=2, dtype=torch.bfloat16, device="cpu", long_splits=(70, 50, 30),
                 prefix=64, shared_suffix=19, resumed_suffix=21, path="triton-interp")


@pytest.fixture(scope="module")
def model() -> Model:
    return Model.make(SMALL)


def test_serving_loop_equals_the_one_shot_prefill(model):
    serve_and_check(model)


def test_two_threads_call_the_op_at_once(model, one_launch_at_a_time):
    concurrent_calls(model, calls=2)


def test_the_op_inside_a_compiled_module(model):
    compiled_layer(model, backend="eager")
