# SPDX-License-Identifier: Apache-2.0
"""The fused HIP path's extern "C" launchers (templates/hip/kda_chunk.hip.j2) and the kernels' argument
structs, declared once. See Note [Kernel ABI]: the template renders the launchers' C parameter lists, the
structs (kda::IntraArgs, kda::WalkArgs) and the packing of one into the other from here; runtime/jit_hip.py
takes their ctypes argtypes, runtime/fused_path.py and the CPU emulation tests bind their arguments by name.

Changing a launcher's parameters (names aside) changes the C ABI: bump kdagen.targets.HIP_ABI.
Strides are in elements. The workspace (qg, w, kg, u, aqk) is bf16 whatever the I/O dtype (kda_common.h).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

from .schema import KernelABI, Param, c_decl, f32, i32, i64, ptr

STREAM = Param("stream", "stream", doc="cudaStream_t / hipStream_t, null for the default stream")

KDA_INTRA_LAUNCH = KernelABI("kda_intra_launch", (
    ptr("q", "io"), ptr("k", "io"), ptr("v", "io"),
    ptr("g", "io", doc="the raw gate, in the I/O dtype like q"), ptr("beta", "io", doc="raw beta, in the I/O dtype"),
    ptr("A_log", "fp32", doc="[H]; clamped to at most 80 before exp (kda_intra.h)"),
    ptr("g_bias", "fp32", doc="[H * K], or null"),
    ptr("cu_seqlens", "i32"), ptr("chunk_indices", "i32"),
    ptr("qg", "bf16", writes=True, doc="[T, H, K]"), ptr("w", "bf16", writes=True, doc="[T, H, K]"),
    ptr("kg", "bf16", writes=True, doc="[T, H, K]"), ptr("u", "bf16", writes=True, doc="[T, H, V]"),
    ptr("aqk", "bf16", writes=True, doc="[T, H, 16]"),
    ptr("decay", "fp32", writes=True, doc="[num_chunks * chunk / 16, H, K]"),
    i64("sq_t"), i64("sq_h"), i64("sk_t"), i64("sk_h"), i64("sv_t"), i64("sv_h"), i64("sg_t"), i64("sg_h"),
    i64("sb_t"), i64("sb_h"),
    i64("num_chunks", doc="metadata chunks (chunk_indices rows)"), i32("H"), f32("scale"),
    f32("lower_bound", "the bounded gate's bound; q and k are L2-normed in the kernel"),
    STREAM,
))

KDA_WALK_LAUNCH = KernelABI("kda_walk_launch", (
    ptr("qg", "bf16"), ptr("w", "bf16"), ptr("kg", "bf16"), ptr("u", "bf16"), ptr("aqk", "bf16", doc="[T, H, 16]"),
    ptr("decay", "fp32", doc="[num_chunks * chunk / 16, H, K]"),
    ptr("out", "io", writes=True), i64("so_t"), i64("so_h"),
    ptr("cu_seqlens", "i32"), ptr("chunk_offsets", "i64", doc="metadata chunks before each sequence"),
    ptr("h0", "fp32", doc="initial state: dense [N, H, V, K] or the paged cache, or null"), i64("sh0_n"), i64("sh0_h"),
    i32("state_in", "0 zeros, 1 dense h0[n], 2 paged h0[state_idx[n]] when has_init[n]"),
    ptr("ht", "fp32", writes=True, doc="final state: dense or the paged cache (may be h0), or null"),
    i64("sht_n"), i64("sht_h"), i32("state_out", "0 none, 1 dense ht[n], 2 paged ht[state_idx[n]]"),
    ptr("state_idx", "i32"), i64("n_slots"), ptr("has_init", "u8"),
    ptr("ckpt", "fp32", writes=True, doc="checkpoint rows [n_ckpt_rows, H, V, K], or null"),
    i64("sck_n"), i64("n_ckpt_rows"), ptr("ckpt_off", "i32"),
    ptr("ckpt_idx", "i32", doc="null: row = sequence index"),
    i64("num_seqs"), i32("H"), f32("scale"),
    STREAM,
))

LAUNCHERS: dict[str, KernelABI] = {k.name: k for k in (KDA_INTRA_LAUNCH, KDA_WALK_LAUNCH)}


@dataclass(frozen=True)
class ArgStruct:
    """A kernel's argument struct: its launcher's parameters but `launch_only` (the launch sequence,
    include/kda_launch.h, takes those itself), in order, then `kernel_only` fields the launch sequence sets."""

    name: str  # in namespace kda
    abi: KernelABI
    launch_only: tuple[str, ...]
    kernel_only: tuple[Param, ...] = ()

    def __post_init__(self) -> None:
        unknown = set(self.launch_only) - {p.name for p in self.abi.params}
        if unknown:
            raise ValueError(f"{self.name}: launch_only names {sorted(unknown)} are not parameters of {self.abi.name}")

    def fields(self) -> list[Param]:
        return [p for p in self.abi.params if p.name not in self.launch_only] + list(self.kernel_only)

    def c_body(self, indent: str = "  ") -> str:
        """One `type name;  // doc` line per field."""
        return "\n".join(indent + c_decl(p) + ";" + (f"  // {p.doc}" if p.doc else "") for p in self.fields())

    def c_packing(self, var: str = "a", indent: str = "  ", width: int = 100) -> str:
        """`a.q = q; a.k = k; ...` for every field the launcher passes, wrapped at `width` columns (the C
        types are the same declarations)."""
        lines, line = [], ""
        for p in self.abi.params:
            if p.name in self.launch_only:
                continue
            stmt = f"{var}.{p.name} = {p.name};"
            if line and len(indent) + len(line) + 1 + len(stmt) > width:
                lines.append(line)
                line = ""
            line = f"{line} {stmt}" if line else stmt
        if line:
            lines.append(line)
        return "\n".join(indent + line for line in lines)


STRUCTS: dict[str, ArgStruct] = {s.abi.name: s for s in (
    ArgStruct("IntraArgs", KDA_INTRA_LAUNCH, ("num_chunks", "stream"), (
        i32("n_items", "walk chunks x H, below 2^31"),
        i32("vec", "bit i: projection i (g, q, k, v) takes whole-run loads (intra_vec)"),
    )),
    ArgStruct("WalkArgs", KDA_WALK_LAUNCH, ("stream",)),
)}

# The parameterless extern "C" queries of every library, with their ctypes return types.
QUERIES: dict[str, type] = {
    "kda_abi_version": ctypes.c_int, "kda_target": ctypes.c_char_p, "kda_variant": ctypes.c_char_p,
    "kda_head_dim_k": ctypes.c_int, "kda_head_dim_v": ctypes.c_int, "kda_chunk_size": ctypes.c_int,
    "kda_v_slice": ctypes.c_int, "kda_intra_smem_bytes": ctypes.c_int, "kda_walk_smem_bytes": ctypes.c_int,
    "kda_walk_threads": ctypes.c_int,
}
