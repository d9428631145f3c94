# SPDX-License-Identifier: Apache-2.0
"""The HIP stages of a plan (Note [Pipelines], pipeline.py): hip_intra (kda_intra_kernel) and hip_walk
(kda_walk_kernel), their launchers' arguments by name (kdagen/kernels/hip.py), stream; and the library's build.

A plan builds the launches once, on its own workspace and metadata (int32 / int64 copies it owns, so a run
converts only the per-layer tensors the kernels take in another dtype); nothing syncs, so graphs capture them.
A hip_intra + hip_walk plan runs both kernels in one C call (HipPairLaunch, Note [Pair record] in
kdagen/kernels/hip.py); HipIntraLaunch and HipWalkLaunch launch one kernel each (hip_intra + triton_walk,
tools). `run_intra` launches kda_intra_kernel alone (tools, GPU tests) after re-checking what the kernel relies on.
"""

from __future__ import annotations

import operator
from pathlib import Path

import torch

from ..kernels.hip import INTRA_RUN, KDA_INTRA_LAUNCH, KDA_PAIR_LAUNCH, KDA_WALK_LAUNCH, WALK_RUN
from .jit_hip import HipLibrary, load_library
from .pipeline import HIP_INTRA_ROWS
from .run_values import RUN_INDEX, RUN_ORDER, picker
from .stream import current_stream

CHUNK = 64
OP = "kdagen HIP launch"


def variant_name(head_dim_k: int, head_dim_v: int, dtype: str = "bf16", chunk: int = CHUNK) -> str:
    # Mirrors VariantSpec.name for backend "hip" (never parsed back).
    return f"kda_chunk_fwd__hip__{dtype}__k{head_dim_k}_v{head_dim_v}_c{chunk}"


def source_path(package_dir: Path, head_dim_k: int, head_dim_v: int, target: str, dtype: str = "bf16") -> Path:
    """generated/kdagen_kernels/hip/<variant>__<target>.hip (see render/context.py HIP_TEMPLATE)."""
    return Path(package_dir) / "hip" / f"{variant_name(head_dim_k, head_dim_v, dtype)}__{target}.hip"


def load_fused(package_dir: Path, head_dim_k: int, head_dim_v: int, target: str, dtype: str = "bf16") -> HipLibrary:
    """Build (first use; cached afterwards) and load the fused variant for (K, V) on `target`."""
    src = source_path(package_dir, head_dim_k, head_dim_v, target, dtype)
    return load_library(src, target, variant=f"{variant_name(head_dim_k, head_dim_v, dtype)}")


def _req(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(f"{OP}: {msg}")


def _i32(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype == torch.int32 and t.is_contiguous() else t.to(torch.int32).contiguous()


def _i64(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype == torch.int64 and t.is_contiguous() else t.to(torch.int64).contiguous()


def _flags(t: torch.Tensor) -> torch.Tensor:
    # has_initial_state as the kernels read it: one byte per sequence, nonzero = true.
    return t.reshape(-1).to(torch.bool).contiguous().view(torch.uint8)


def _ptr(t: torch.Tensor | None) -> int | None:
    return t.data_ptr() if t is not None else None


INTRA_ROWS = HIP_INTRA_ROWS  # kda_intra_kernel's walk chunk: the walk after it steps over it


def intra_workspace(T: int, H: int, K: int, V: int, n_chunks: int, device) -> dict[str, torch.Tensor]:
    """kda_intra_kernel's outputs: qg, w, kg [T, H, K], u [T, H, V], aqk [T, H, 16] (bf16) and decay
    [n_chunks * chunk / 16, H, K] (fp32), the Triton kda_intra's layout at intra_rows 16."""
    ws = {n: torch.empty(T, H, d, dtype=torch.bfloat16, device=device)
          for n, d in (("qg", K), ("w", K), ("kg", K), ("u", V), ("aqk", INTRA_ROWS))}
    ws["decay"] = torch.empty(max(n_chunks * (CHUNK // INTRA_ROWS), 1), H, K, dtype=torch.float32, device=device)
    return ws


def run_intra(lib: HipLibrary, ws: dict[str, torch.Tensor], *, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              raw_g: torch.Tensor, raw_beta: torch.Tensor, A_log: torch.Tensor, g_bias: torch.Tensor | None,
              scale: float, lower_bound: float, cu_seqlens: torch.Tensor, chunk_indices: torch.Tensor) -> None:
    """kda_intra_kernel on torch's current stream: the workspace of 16-row walk chunks into `ws` (views shaped
    as intra_workspace's, rows dense), for the bounded gate with q and k L2-normed in the kernel.

    Packed [1, T, H, *] bf16 inputs, dense in the last dim (any token / head strides), raw_g bf16; A_log and
    g_bias fp32 contiguous; cu_seqlens and chunk_indices int32 (chunk-64 metadata)."""
    _, T, H, K = q.shape
    V = v.shape[-1]
    _req((K, V, CHUNK) == (lib.head_dim_k, lib.head_dim_v, lib.chunk_size),
         f"{lib.name} is built for K={lib.head_dim_k}, V={lib.head_dim_v}; got K={K}, V={V}")
    for name, t in (("q", q), ("k", k), ("v", v), ("raw_g", raw_g)):
        _req(t.dtype == torch.bfloat16 and t.stride(-1) == 1, f"{name} must be bf16, dense in its last dim")
    _req(raw_beta.dtype == torch.bfloat16, "raw_beta must be bf16")
    _req(A_log.dtype == torch.float32 and A_log.is_contiguous() and A_log.numel() == H, f"A_log: fp32 [{H}]")
    _req(g_bias is None or (g_bias.dtype == torch.float32 and g_bias.is_contiguous() and g_bias.numel() == H * K),
         f"g_bias: fp32 [{H * K}] or None")
    _req(cu_seqlens.dtype == torch.int32 and chunk_indices.dtype == torch.int32, "metadata must be int32")
    n_chunks = chunk_indices.shape[0] if chunk_indices.numel() else 0
    for name, d in (("qg", K), ("w", K), ("kg", K), ("u", V), ("aqk", INTRA_ROWS)):
        t = ws[name]
        _req(t.dtype == torch.bfloat16 and tuple(t.shape) == (T, H, d) and t.is_contiguous(),
             f"workspace {name} must be contiguous bf16 [{T}, {H}, {d}]")
    _req(ws["decay"].dtype == torch.float32 and ws["decay"].is_contiguous()
         and ws["decay"].shape[0] >= n_chunks * (CHUNK // INTRA_ROWS) and tuple(ws["decay"].shape[1:]) == (H, K),
         "workspace decay must be contiguous fp32 [n_chunks * 4, H, K]")
    if n_chunks == 0 or H == 0:
        return
    launch = HipIntraLaunch(lib, ws, cu_seqlens=cu_seqlens, chunk_indices=chunk_indices, lower_bound=lower_bound,
                            has_bias=g_bias is not None, H=H)
    values: list = [None] * len(RUN_ORDER)
    for name, x in (("q", q), ("k", k), ("v", v), ("raw_g", raw_g), ("raw_beta", raw_beta), ("A_log", A_log),
                    ("g_bias", g_bias if g_bias is not None else A_log), ("scale", float(scale)),
                    ("stream", current_stream(q.get_device()))):
        values[RUN_INDEX[name]] = x
    for name, t in (("q", q), ("k", k), ("v", v), ("g", raw_g), ("b", raw_beta)):
        values[RUN_INDEX[f"s{name}_t"]], values[RUN_INDEX[f"s{name}_h"]] = t.stride(1), t.stride(2)
    with torch.cuda.device(q.device):
        launch(values)


class HipIntraLaunch:
    """kda_intra_kernel as a plan's chunk stage: called with the run's values (run_values.RUN_ORDER), it writes
    the plan's workspace views `ws`, which the walk then reads. cu_seqlens and chunk_indices are the plan's
    int32 copies, bound with the workspace into the launcher once; a call converts only what the kernel takes in
    another dtype (raw_g and raw_beta to the I/O dtype, A_log and g_bias to fp32) and launches."""

    __slots__ = ("lib", "ws", "cu", "ci", "lower_bound", "has_bias", "H", "plan_values", "_launch")
    _VALUES = picker(("q", "k", "v", "raw_g", "raw_beta", "A_log", "g_bias", "sq_t", "sq_h", "sk_t", "sk_h", "sv_t",
                      "sv_h", "sg_t", "sg_h", "sb_t", "sb_h", "scale", "stream"))

    def __init__(self, lib: HipLibrary, ws: dict[str, torch.Tensor], *, cu_seqlens: torch.Tensor,
                 chunk_indices: torch.Tensor, lower_bound: float, has_bias: bool, H: int):
        self.lib, self.ws, self.lower_bound, self.has_bias, self.H = lib, ws, float(lower_bound), has_bias, H
        self.cu = _i32(cu_seqlens)
        self.ci = _i32(chunk_indices)
        n_chunks = self.ci.shape[0] if self.ci.numel() else 0
        # The launcher's plan-time values by name (HipPairLaunch packs them into its plan record).
        self.plan_values = dict(
            cu_seqlens=self.cu.data_ptr(), chunk_indices=self.ci.data_ptr(),
            **{n: ws[n].data_ptr() for n in ("qg", "w", "kg", "u", "aqk", "decay")},
            num_chunks=n_chunks, H=H, lower_bound=self.lower_bound)
        self._launch = lib.launcher(KDA_INTRA_LAUNCH, self.plan_values, INTRA_RUN)

    def __call__(self, values: list, key: tuple | None = None, ptrs: tuple | None = None) -> None:
        args, keep = self.c_args(values)
        self._launch(args)
        del keep  # the converted tensors outlive the launch that reads them

    def c_args(self, values: list) -> tuple[list, tuple]:
        """INTRA_RUN's C values from the run's (pointers, 0 for none), and the tensors converted to the kernel's
        dtypes, which the caller holds until the launch: freed earlier, the allocator could hand their memory to a
        later conversion enqueued before the kernel reads them."""
        q, k, v, g, beta, A_log, g_bias, sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, sg_t, sg_h, sb_t, sb_h, scale, stream = \
            self._VALUES(values)
        io = q.dtype
        # The kernel reads the gate and beta projections in its I/O dtype (q's: the variant's dtype).
        if g.dtype is not io:
            g = g.to(io)
            sg_t, sg_h = g.stride(1), g.stride(2)
        if beta.dtype is not io:
            beta = beta.to(io)
            sb_t, sb_h = beta.stride(1), beta.stride(2)
        if A_log.dtype is not torch.float32:  # dense: the plan's checks and bind make it so
            A_log = A_log.float()
        bias = None
        if self.has_bias:
            bias = g_bias if g_bias.dtype is torch.float32 else g_bias.float()
        return [q.data_ptr(), k.data_ptr(), v.data_ptr(), g.data_ptr(), beta.data_ptr(), A_log.data_ptr(),
                bias.data_ptr() if bias is not None else 0, sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, sg_t, sg_h, sb_t, sb_h,
                scale, stream], (g, beta, A_log, bias)


class HipWalkLaunch:
    """kda_walk_kernel as a plan's walk stage (one group): called with the run's values (run_values.RUN_ORDER),
    it walks the workspace views `ws` that kda_intra_kernel wrote and writes the output, the final state or the
    cache rows, and the checkpoints, as the Triton walk at PASS 0 would. The metadata, the state routing and
    the checkpoint request are the plan's copies in the kernel's dtypes, bound into the launcher once; a call
    only reads the per-layer tensors' pointers and strides."""

    __slots__ = ("lib", "_keep", "_launch", "state_in", "state_out", "plan_values")
    _VALUES = picker(("o", "so_t", "so_h", "h0", "ht", "sh0_n", "sh0_h", "sht_n", "sht_h", "n_slots", "ckpt", "sck_n",
                      "n_ckpt_rows", "scale", "stream"))

    def __init__(self, lib: HipLibrary, ws: dict[str, torch.Tensor], *, state_in: int, state_out: int,
                 cu_seqlens: torch.Tensor, chunk_offsets: torch.Tensor, H: int, N: int,
                 state_indices: torch.Tensor | None, has_initial_state: torch.Tensor | None,
                 checkpoint_offsets: torch.Tensor | None, checkpoint_state_indices: torch.Tensor | None):
        cu = _i32(cu_seqlens)
        co = _i64(chunk_offsets)
        idx = _i32(state_indices.reshape(-1)) if state_indices is not None else None
        flags = _flags(has_initial_state) if has_initial_state is not None else None
        ck_off = _i32(checkpoint_offsets.reshape(-1)) if checkpoint_offsets is not None else None
        ck_idx = _i32(checkpoint_state_indices.reshape(-1)) if checkpoint_state_indices is not None else None
        _req((state_in != 2 and state_out != 2) or (idx is not None and flags is not None),
             "a paged state needs state_indices and has_initial_state")
        self.lib, self.state_in, self.state_out = lib, state_in, state_out
        self._keep = (cu, co, idx, flags, ck_off, ck_idx, ws)  # the launcher holds their pointers
        self.plan_values = dict(
            **{n: ws[n].data_ptr() for n in ("qg", "w", "kg", "u", "aqk", "decay")},
            cu_seqlens=cu.data_ptr(), chunk_offsets=co.data_ptr(), state_in=state_in, state_out=state_out,
            state_idx=_ptr(idx), has_init=_ptr(flags), ckpt_off=_ptr(ck_off), ckpt_idx=_ptr(ck_idx), num_seqs=N,
            H=H)
        self._launch = lib.launcher(KDA_WALK_LAUNCH, self.plan_values, WALK_RUN)

    def __call__(self, values: list, key: tuple | None = None, ptrs: tuple | None = None) -> None:
        self._launch(self.c_args(values))

    def c_args(self, values: list) -> list:
        """WALK_RUN's C values from the run's (pointers, 0 for none)."""
        o, so_t, so_h, h0, ht, sh0_n, sh0_h, sht_n, sht_h, n_slots, ckpt, sck_n, n_ckpt_rows, scale, stream = \
            self._VALUES(values)
        return [o.data_ptr(), so_t, so_h, h0.data_ptr() if self.state_in else 0,
                ht.data_ptr() if self.state_out else 0, sh0_n, sh0_h, sht_n, sht_h, n_slots,
                ckpt.data_ptr() if ckpt is not None else 0, sck_n or 0, n_ckpt_rows or 0, scale, stream]


# Where each field of the pair's run record is in INTRA_RUN's C values followed by WALK_RUN's (scale and stream:
# the intra's, the same values).
_PAIR_PICK = operator.itemgetter(*((INTRA_RUN + WALK_RUN).index(n) for n in KDA_PAIR_LAUNCH.run.names))


class HipPairLaunch:
    """A hip_intra + hip_walk plan's run for one state_in: kda_intra_kernel then kda_walk_kernel in one C call
    (kda_pair_launch, Note [Pair record]). The plan record holds both launches' plan-time values (bound once
    from `intra` and `walk`, which keep the tensors they point at); a call converts what `intra` converts,
    packs the run record into a new bytes object and makes the call. `intra` and `walk` stay callable alone."""

    __slots__ = ("intra", "walk", "_pack", "_launch")

    def __init__(self, intra: HipIntraLaunch, walk: HipWalkLaunch):
        if intra.lib is not walk.lib:
            raise ValueError(f"{OP}: the pair's launches come from two libraries ({intra.lib.name}, {walk.lib.name})")
        self.intra, self.walk = intra, walk
        self._pack = KDA_PAIR_LAUNCH.run.packer.pack
        self._launch = intra.lib.pair_launcher({**{f"intra_{n}": x for n, x in intra.plan_values.items()},
                                                **{f"walk_{n}": x for n, x in walk.plan_values.items()}})

    def __call__(self, values: list, key: tuple | None = None, ptrs: tuple | None = None) -> None:
        args, keep = self.intra.c_args(values)
        self._launch(self._pack(*_PAIR_PICK(args + self.walk.c_args(values))))
        del keep  # the converted tensors outlive the launch that reads them


def pair_launches(chunk: dict, walks: dict) -> tuple[dict, dict]:
    """A hip_intra + hip_walk plan's stages with each walk and the intra made one HipPairLaunch (the chunk stage
    then empty); unchanged where either stage is empty (no chunks, or no sequences)."""
    intra = chunk.get("intra")
    if not isinstance(intra, HipIntraLaunch) or not walks:
        return chunk, walks
    return {}, {s: (HipPairLaunch(intra, w),) for s, (w,) in walks.items()}
