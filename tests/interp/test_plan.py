# SPDX-License-Identifier: Apache-2.0
"""The plan API in the interpreter: one plan, several layers; the wrapper's plan cache; caller workspaces;
per-layer misuse refused before anything is written. Against the float64 reference, outputs poisoned."""

from __future__ import annotations

import pytest
import torch

import kdagen_kernels as kk
from kdagen.reference import chunk_kda_prefill_reference
from tests.kda_cases import cu_of, make_inputs, poisoned_out
from tests.tolerances import check

O_TOL, S_TOL = ("triton-interp", "bf16", "output"), ("triton-interp", "bf16", "final_state")

H, K, V = 2, 64, 64
LENS = [70, 0, 1, 33]  # ragged: T = 0 and T = 1 sequences, T not a multiple of the chunk


def _layer(seed: int, lens=LENS) -> dict:
    a = make_inputs(lens, H, K, V, torch.bfloat16, "cpu", seed=seed, h0=False)
    return {n: a[n] for n in ("q", "k", "v", "raw_g", "raw_beta", "A_log", "g_bias")}


def _plan(lens=LENS, **kw):
    cu = cu_of(lens, "cpu")
    ci, co = kk.prepare_chunk_indices(cu, 64), kk.prepare_chunk_offsets(cu, 64)
    return kk.plan_kda_prefill(cu, cu, num_heads=H, head_dim_k=K, head_dim_v=V, lower_bound=-5.0, has_g_bias=True,
                               use_qk_l2norm_in_kernel=True, chunk_indices=ci, chunk_offsets=co, **kw), cu


def _reference(layer: dict, cu, **kw):
    return chunk_kda_prefill_reference(**layer, lower_bound=-5.0, use_qk_l2norm_in_kernel=True, cu_seqlens=cu, **kw)


def test_one_plan_runs_several_layers_with_their_own_state_caches():
    # vLLM's pattern: the metadata builder plans once per step, each layer runs with its own weights and cache.
    N = len(LENS)
    slots = torch.tensor([3, -1, 0, 5], dtype=torch.int32)  # -1: a padded sequence, skipped
    has_init = torch.tensor([True, False, True, False])
    plan, cu = _plan(state_indices=slots, has_initial_state=has_init)
    assert plan.path == "triton" and plan.workspace_bytes > 0
    for seed in (1, 2):
        layer = _layer(seed)
        cache = torch.randn(6, H, V, K) * 0.1
        before = cache.clone()
        out = poisoned_out(layer["v"])
        o, final = plan.run(**layer, out=out, state_cache=cache)
        assert o is out and final is None
        h0 = torch.stack([before[max(int(s), 0)] if f else torch.zeros(H, V, K) for s, f in zip(slots, has_init)])
        ref_o, ref_s = _reference(layer, cu, initial_state=h0, output_final_state=True)
        check("o", o, ref_o, O_TOL)
        for n in range(N):
            if slots[n] >= 0:
                check(f"cache row {int(slots[n])}", cache[slots[n]], ref_s[n], S_TOL)
        untouched = [r for r in range(6) if r not in slots.tolist()]
        assert torch.equal(cache[untouched], before[untouched])


def test_plan_run_matches_the_wrapper_bit_for_bit():
    layer = _layer(3)
    h0 = torch.randn(len(LENS), H, V, K) * 0.1
    plan, cu = _plan(output_final_state=True)
    o1, s1 = plan.run(**layer, initial_state=h0, out=poisoned_out(layer["v"]))
    o2, s2 = kk.chunk_kda_prefill(**layer, lower_bound=-5.0, use_qk_l2norm_in_kernel=True, cu_seqlens=cu,
                                  initial_state=h0, output_final_state=True)
    assert torch.equal(o1, o2) and torch.equal(s1, s2)


def test_a_caller_workspace_is_used_and_a_small_one_is_refused():
    plan, cu = _plan(output_final_state=True)
    buf = torch.full((plan.workspace_bytes,), 255, dtype=torch.uint8)
    plan2, _ = _plan(output_final_state=True, workspace=buf)
    assert plan2.workspace.data_ptr() == buf.data_ptr()
    layer = _layer(4)
    o, s = plan2.run(**layer)
    ref_o, ref_s = _reference(layer, cu, output_final_state=True)
    check("o", o, ref_o, O_TOL)
    with pytest.raises(ValueError, match=f"this plan needs {plan.workspace_bytes}"):
        _plan(workspace=buf[:-512])
    with pytest.raises(ValueError, match="dtype torch.float32"):
        _plan(workspace=torch.empty(plan.workspace_bytes, dtype=torch.float32))


def test_the_wrapper_sees_an_in_place_edit_of_cached_metadata():
    # The cached plan is keyed on the metadata tensors' identity and version counters: rewriting cu_seqlens in
    # place (another split of the same tokens) must take a new plan, not the old chunk layout.
    a = make_inputs(LENS, H, K, V, torch.bfloat16, "cpu", seed=5)
    o1, _ = kk.chunk_kda_prefill(**a)
    cu = a["cu_seqlens"]
    cu.copy_(cu_of([30, 40, 1, 33], "cpu"))
    o2, s2 = kk.chunk_kda_prefill(**a)
    ref_o, ref_s = chunk_kda_prefill_reference(**a)
    check("o", o2, ref_o, O_TOL)
    check("state", s2, ref_s, S_TOL)
    assert not torch.equal(o1, o2)


def test_run_refuses_a_layer_that_does_not_fit_the_plan_and_writes_nothing():
    slots = torch.tensor([0, 1, 2, 3], dtype=torch.int32)
    plan, cu = _plan(state_indices=slots, has_initial_state=torch.ones(4, dtype=torch.bool))
    layer = _layer(6)
    cache = torch.randn(4, H, V, K)
    before = cache.clone()
    out = poisoned_out(layer["v"])
    bad = [
        ({**{n: t[:, :-1] if n in ("q", "k", "v", "raw_g", "raw_beta") else t for n, t in layer.items()},
          "out": out[:, :-1]}, {}, ValueError,
         r"q/v shape \[B, T, H, K\] \(1, 103, 2, 64\) differs from the plan's \(1, 104, 2, 64\)"),
        (dict(layer, k=layer["k"][:, :-1]), {}, ValueError, "k must be of shape"),
        (dict(layer, k=layer["k"].half()), {}, TypeError, "k must be torch.bfloat16 like q"),
        (layer, {"state_cache": None}, ValueError, "pass state_cache"),
        (layer, {"state_cache": cache, "initial_state": torch.zeros(4, H, V, K)}, ValueError, "replaces initial_state"),
        (dict(layer, g_bias=None), {}, ValueError, "has_g_bias=True"),
        (layer, {"state_cache": cache[:, :, :32]}, ValueError, "state_cache must be"),
        (layer, {"state_cache": cache[:2]}, ValueError, "state_indices must lie in"),
        (layer, {"scale": float("nan")}, ValueError, "scale must be"),
    ]
    for args, kw, exc, needle in bad:
        kw = {"state_cache": cache, **kw}
        with pytest.raises(exc, match=needle):
            plan.run(**{"out": out, **args}, **kw)
        assert torch.equal(cache, before) and torch.isnan(out).all(), needle


def test_plan_arguments_are_checked():
    cu = cu_of(LENS, "cpu")
    with pytest.raises(ValueError, match="has_initial_state must be given with the other paged-state argument"):
        kk.plan_kda_prefill(cu, num_heads=H, head_dim_k=K, head_dim_v=V, state_indices=torch.zeros(4, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"cu_seqlens\[-1\] must be T = 50"):
        kk.plan_kda_prefill(cu, num_heads=H, head_dim_k=K, head_dim_v=V, num_tokens=50)
    with pytest.raises(ValueError, match="checkpoint_offsets"):
        kk.plan_kda_prefill(cu, num_heads=H, head_dim_k=K, head_dim_v=V, checkpoint_offsets=torch.zeros(3, dtype=torch.int32))
    with pytest.raises(TypeError, match="dtype must be torch.bfloat16 or torch.float16"):
        kk.plan_kda_prefill(cu, num_heads=H, head_dim_k=K, head_dim_v=V, dtype=torch.float32)
    with pytest.raises(ValueError, match="groups must be an int"):
        kk.plan_kda_prefill(cu, num_heads=H, head_dim_k=K, head_dim_v=V, groups=0)


def test_groups_is_a_plan_argument():
    layer = _layer(7, lens=[300])
    cu = cu_of([300], "cpu")
    outs = {}
    for g in (1, 3):
        plan = kk.plan_kda_prefill(cu, cu, num_heads=H, head_dim_k=K, head_dim_v=V, lower_bound=-5.0,
                                   has_g_bias=True, use_qk_l2norm_in_kernel=True, output_final_state=True, groups=g)
        assert plan.groups == g
        outs[g] = plan.run(**layer)
    ref_o, ref_s = _reference(layer, cu, output_final_state=True)
    for g, (o, s) in outs.items():
        check(f"o G={g}", o, ref_o, O_TOL)
        check(f"state G={g}", s, ref_s, S_TOL)
