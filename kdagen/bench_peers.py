# SPDX-License-Identifier: Apache-2.0
"""The peers `python -m kdagen bench` times beside kdagen: FLA's `chunk_kda` and FlashKDA's `fwd` (upstream
MoonshotAI 1ce47ea as "flashkda", vLLM's fork as "flashkda-vllm").

All are optional imports; a missing one is reported once and the benchmark goes on without it. Each
peer is a maker like ours: `make(args, chunk_indices, chunk_offsets, out)` converts the benchmark's
chunk_kda_prefill arguments to what the peer takes (outside the timed region) and returns the callable
that is timed, which returns (output, final state).
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from typing import Any

Maker = Callable[..., Callable[[], tuple[Any, Any]]]
FLA, FLASHKDA, FORK = "fla-safe-gate", "flashkda", "flashkda-vllm"
PEERS = (FLA, FLASHKDA, FORK)


def is_peer(name: str) -> bool:
    return name in PEERS


def _say(msg: str) -> None:
    print(msg, file=sys.stderr)


def _import(name: str) -> tuple[Any, str | None]:
    """(module, None), or (None, why) with the first line of the error: a broken build must not stop
    the benchmark of everything else."""
    try:
        return importlib.import_module(name), None
    except Exception as exc:
        first = (str(exc).splitlines() or [""])[0][:200]
        return None, f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def peer_impls(say: Callable[[str], None] = _say, flashkda: bool = True) -> dict[str, Maker]:
    """The peers importable here, by name: FLA, and FlashKDA as "flashkda" when `flashkda` (the benchmark
    passes False when worker processes time the FlashKDA builds). FLA_FLASH_KDA=0 is set before fla is
    imported: fla-core 0.6.0 hands `chunk_kda` to FlashKDA by itself whenever `flash_kda` is importable and
    the call qualifies, which would time FlashKDA under FLA's name."""
    impls: dict[str, Maker] = {}
    fk = None
    if flashkda:
        fk, why = _import("flash_kda")
        if fk is None:
            say(f"FlashKDA: not importable ({why})")
    os.environ["FLA_FLASH_KDA"] = "0"
    fla_kda, why = _import("fla.ops.kda")
    if fla_kda is None:
        say(f"FLA: not importable ({why})")
    else:
        impls[FLA] = fla_maker(fla_kda.chunk_kda)
    if fk is not None:
        impls[FLASHKDA] = flashkda_maker(fk.fwd)
    return impls


def fla_maker(chunk_kda: Callable) -> Maker:
    """fla-core's chunk_kda with every activation in kernel and the safe gate: our workload exactly."""
    def make(args: dict, ci, co, out):
        cu = args["cu_seqlens"].long()
        cu_cpu = cu.cpu()
        return lambda: chunk_kda(
            q=args["q"], k=args["k"], v=args["v"], g=args["raw_g"], beta=args["raw_beta"],
            initial_state=args["initial_state"], output_final_state=True, use_qk_l2norm_in_kernel=True,
            use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True, safe_gate=True,
            lower_bound=args["lower_bound"], state_v_first=True, cu_seqlens=cu, cu_seqlens_cpu=cu_cpu,
            A_log=args["A_log"], dt_bias=args["g_bias"])

    return make


def flashkda_inputs(args: dict) -> dict:
    """FlashKDA's `fwd` arguments for the benchmark's chunk_kda_prefill arguments.

    How its options map onto our safe-gate workload (flash_kda.fwd at 1ce47ea and vLLM's fork 6121c37, which
    takes the same arguments plus an optional workspace and segment_ids; chunk 16, sm_90a):
    - g is the raw gate; it computes lower_bound * sigmoid(exp(A_log) * (g + dt_bias)) in kernel, our
      safe gate (lower_bound given), with dt_bias shaped [H, K] where we take g_bias flat [H * K];
    - beta is the raw logit, sigmoid in kernel; q and k are L2-normalised in kernel (eps 1e-6 under the
      square root, as ours): our use_qk_l2norm_in_kernel=True;
    - scale is explicit (ours defaults to K ** -0.5); the state is V-first [N, H, V, K] like ours, fp32
      in and out (it also takes bf16; fp32 is our workload's);
    - cu_seqlens must be int64 (ours is int32); every tensor contiguous; K = V = 128, bf16 q/k/v/g/beta.
    The softplus gate (lower_bound None) and qk without L2 norm have no FlashKDA form: rejected here.
    """
    import torch

    q, v = args["q"], args["v"]
    B, T, H, K = q.shape
    V = v.shape[-1]
    wrong = [what for what, bad in (
        ("lower_bound None (softplus gate; FlashKDA has the safe gate only)", args.get("lower_bound") is None),
        ("use_qk_l2norm_in_kernel=False (FlashKDA always normalises q and k)",
         not args.get("use_qk_l2norm_in_kernel")),
        (f"K={K}, V={V} (FlashKDA takes 128 only)", K != 128 or V != 128),
        (f"dtype {q.dtype} (FlashKDA takes bfloat16 only)", q.dtype != torch.bfloat16),
        ("no cu_seqlens or B != 1 (the benchmark packs sequences)", args.get("cu_seqlens") is None or B != 1),
        ("no initial_state (the benchmark's workload has one)", args.get("initial_state") is None),
    ) if bad]
    if wrong:
        raise ValueError(f"flashkda_inputs: these arguments have no FlashKDA form: {'; '.join(wrong)}")
    scale = args.get("scale")
    return dict(q=q.contiguous(), k=args["k"].contiguous(), v=v.contiguous(), g=args["raw_g"].contiguous(),
                beta=args["raw_beta"].contiguous(), scale=float(K**-0.5 if scale is None else scale),
                A_log=args["A_log"].float().contiguous(), dt_bias=args["g_bias"].float().reshape(H, K).contiguous(),
                lower_bound=float(args["lower_bound"]), initial_state=args["initial_state"].float().contiguous(),
                cu_seqlens=args["cu_seqlens"].to(torch.int64).contiguous())


def flashkda_call(fwd: Callable, fk: dict) -> Callable[[], tuple[Any, Any]]:
    """One FlashKDA call on converted inputs. Output and final state are allocated inside the call, as
    its own package allocates its workspace per call: the timed region holds what a caller pays."""
    import torch

    def call():
        out = torch.empty_like(fk["v"])
        fs = torch.empty_like(fk["initial_state"])
        fwd(fk["q"], fk["k"], fk["v"], fk["g"], fk["beta"], fk["scale"], out, fk["A_log"], fk["dt_bias"],
            fk["lower_bound"], initial_state=fk["initial_state"], final_state=fs, cu_seqlens=fk["cu_seqlens"])
        return out, fs

    return call


def flashkda_maker(fwd: Callable) -> Maker:
    def make(args: dict, ci, co, out):
        return flashkda_call(fwd, flashkda_inputs(args))

    return make
