# SPDX-License-Identifier: Apache-2.0
"""tests/e2e/test_serving_loop.py at serving sizes on the H200 (tests/serving_loop.py): 32 heads of K = V = 128,
four layers, a 3,300-token prompt over three steps, a 1,024-token shared prefix; two threads on two streams at
once; the op inside a torch.compile(fullgraph=True) module with the inductor backend. Tolerances:
tests/tolerances.py (triton-gpu)."""

from __future__ import annotations

import os

import pytest
import torch

from tests.serving_loop import Model, Scenario, compiled_layer, concurrent_calls, serve_and_check

pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
                                reason="needs a GPU (and not the interpreter)")

SERVING = Scenario(heads=32, head_dim=128, layers=4, dtype=torch.bfloat16, device="cuda",
                   long_splits=(1500, 1100, 700), prefix=1024, shared_suffix=77, resumed_suffix=300,
                   path="triton-gpu")


@pytest.fixture(scope="module")
def model() -> Model:
    return Model.make(SERVING)


def test_serving_loop_equals_the_one_shot_prefill(model):
    serve_and_check(model)


def test_two_threads_on_two_streams_at_once(model):
    concurrent_calls(model, calls=3, streams=True)


def test_the_op_inside_a_compiled_module(model):
    compiled_layer(model, backend="inductor")
