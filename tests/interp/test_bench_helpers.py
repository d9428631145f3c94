# SPDX-License-Identifier: Apache-2.0
"""The benchmark's input builder and autotune's single-kernel launcher, run in the Triton interpreter
(on the GPU they time kernels; here they must build what they say and launch what they say)."""

from __future__ import annotations

import torch

import kdagen_kernels
from kdagen.autotune import kernel_call
from kdagen.bench import equal_lens, make_inputs
from kdagen.reference import chunk_kda_prefill_reference, rel_l2
from kdagen.runtime import triton_path


def test_equal_lens_packs_t_tokens():
    assert equal_lens(10, 3) == [3, 3, 4] and equal_lens(64, 1) == [64]


def test_make_inputs_builds_the_declared_batch():
    args, ci, co = make_inputs(2, [0, 1, 70], K=64, V=32, dtype="fp16", seed=3, device="cpu")
    assert args["cu_seqlens"].tolist() == [0, 0, 1, 71] and args["cu_seqlens"].dtype == torch.int32
    assert args["q"].shape == (1, 71, 2, 64) and args["v"].shape == (1, 71, 2, 32) and args["q"].dtype == torch.float16
    assert args["initial_state"].shape == (3, 2, 32, 64) and args["g_bias"].shape == (2 * 64,)
    assert ci.tolist() == [[1, 0], [2, 0], [2, 1]] and co.tolist() == [0, 0, 1, 3]
    assert all(args[n].float().abs().sum() > 0 for n in ("q", "k", "v", "raw_g", "raw_beta", "initial_state"))


def test_kernel_call_runs_each_kernel_alone_with_the_given_tuning(monkeypatch):
    e = next(e for e in kdagen_kernels.VARIANTS if e.name == "kda_chunk_fwd__triton__bf16__k64_v64_c64")
    mod = e.load()
    args, ci, co = make_inputs(2, [5, 70], K=64, V=64, seed=4, device="cpu")
    tun = dict(triton_path.tuning_for(mod, "interpreter"), prologue_block_k=32, wu_block_k=32)
    ref_o, _ = chunk_kda_prefill_reference(**args)
    launched = []
    for name in ("launch_prologue", "launch_wu", "launch_recurrence"):
        real = getattr(triton_path, name)
        monkeypatch.setattr(triton_path, name,
                            lambda *a, _real=real, _name=name, **kw: (launched.append((_name, a[1])), _real(*a, **kw)))
    for kernel in ("prologue", "wu"):
        call = kernel_call(mod, tun, kernel, args, ci, co)
        launched.clear()
        call()
        # The returned callable launches that kernel alone, with the given tuning.
        assert launched == [(f"launch_{kernel}", tun)]
    out = torch.full_like(args["v"], float("nan"))  # poisoned: an unwritten element fails the check
    kernel_call(mod, tun, "recurrence", args, ci, co, out=out)()
    assert rel_l2(out, ref_o) < 1e-2
