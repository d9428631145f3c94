# SPDX-License-Identifier: Apache-2.0
"""The fused HIP path's extern "C" launchers (templates/hip/kda_chunk.hip.j2), declared once. See Note
[Kernel ABI]: the template renders their C parameter lists and the packing into the kernels' argument
structs from here, runtime/jit_hip.py takes their ctypes argtypes, runtime/fused_path.py and the CPU
emulation tests bind their arguments by name.

Changing a launcher's parameters (names aside) changes the C ABI: bump kdagen.targets.HIP_ABI.
Workspace layouts: kdagen/runtime/fused_path.py. Strides are in elements.
"""

from __future__ import annotations

import ctypes

from .schema import KernelABI, Param, f32, i32, i64, ptr

STREAM = Param("stream", "stream", doc="cudaStream_t / hipStream_t, null for the default stream")

KDA_PROLOGUE_LAUNCH = KernelABI("kda_prologue_launch", (
    ptr("q", "io"), ptr("k", "io"), ptr("v", "io"), ptr("g", "io"), ptr("beta", "io"),
    ptr("A_log", "fp32"), ptr("g_bias", "fp32", doc="[H * K], or null"),
    ptr("cu_seqlens", "i32"), ptr("chunk_indices", "i32"),
    ptr("qg", "io", writes=True), ptr("w", "io", writes=True), ptr("kg", "io", writes=True),
    ptr("u", "io", writes=True), ptr("aqk", "io", writes=True), ptr("decay", "fp32", writes=True),
    i64("sq_t"), i64("sq_h"), i64("sk_t"), i64("sk_h"), i64("sv_t"), i64("sv_h"), i64("sg_t"), i64("sg_h"),
    i64("sb_t"), i64("sb_h"),
    i64("num_chunks"), i32("H"), f32("scale"), f32("lower_bound"),
    i32("lower_bound_gate", "1: lower_bound * sigmoid(a z); 0: -a softplus(z)"), i32("use_l2norm"),
    STREAM,
))

KDA_INTRA_LAUNCH = KernelABI("kda_intra_launch", (
    ptr("q", "io"), ptr("k", "io"), ptr("v", "io"), ptr("g", "io"), ptr("beta", "io"),
    ptr("A_log", "fp32"), ptr("g_bias", "fp32", doc="[H * K], or null"),
    ptr("cu_seqlens", "i32"), ptr("chunk_indices", "i32"),
    ptr("qg", "io", writes=True), ptr("w", "io", writes=True), ptr("kg", "io", writes=True),
    ptr("u", "io", writes=True), ptr("aqk", "io", writes=True, doc="[T, H, 16]"),
    ptr("decay", "fp32", writes=True, doc="[num_chunks * chunk / 16, H, K]"),
    i64("sq_t"), i64("sq_h"), i64("sk_t"), i64("sk_h"), i64("sv_t"), i64("sv_h"), i64("sg_t"), i64("sg_h"),
    i64("sb_t"), i64("sb_h"),
    i64("num_chunks", doc="metadata chunks (chunk_indices rows)"), i32("H"), f32("scale"),
    f32("lower_bound", "the bounded gate's bound; q and k are L2-normed in the kernel"),
    STREAM,
))

KDA_RECURRENCE_LAUNCH = KernelABI("kda_recurrence_launch", (
    ptr("qg", "io"), ptr("w", "io"), ptr("kg", "io"), ptr("u", "io"), ptr("aqk", "io"), ptr("decay", "fp32"),
    ptr("out", "io", writes=True), i64("so_t"), i64("so_h"),
    ptr("cu_seqlens", "i32"), ptr("chunk_offsets", "i64"),
    ptr("h0", "fp32", doc="dense initial state [N, H, V, K], or null"), i64("sh0_n"),
    ptr("ht", "fp32", writes=True, doc="dense final state, or null"), i64("sht_n"),
    ptr("cache", "fp32", writes=True, doc="paged state [n_slots, H, V, K], read and written, or null"),
    i64("sc_n"), i64("n_slots"), ptr("cache_idx", "i32"), ptr("has_init", "u8"),
    ptr("ckpt", "fp32", writes=True, doc="checkpoint rows [n_ckpt_rows, H, V, K], or null"),
    i64("sck_n"), i64("n_ckpt_rows"), ptr("ckpt_off", "i32"),
    ptr("ckpt_idx", "i32", doc="null: row = sequence index"),
    i64("num_seqs"), i32("H"), f32("scale"), i32("groups"),
    ptr("group_ws", "fp32", writes=True, doc="groups > 1: fp32 operator rows then start states"),
    STREAM,
))

KDA_WALK_LAUNCH = KernelABI("kda_walk_launch", (
    ptr("qg", "io"), ptr("w", "io"), ptr("kg", "io"), ptr("u", "io"), ptr("aqk", "io", doc="[T, H, 16]"),
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

LAUNCHERS: dict[str, KernelABI] = {k.name: k for k in (KDA_PROLOGUE_LAUNCH, KDA_INTRA_LAUNCH,
                                                         KDA_RECURRENCE_LAUNCH, KDA_WALK_LAUNCH)}

# Launcher parameters that are not fields of the kernel's argument struct (kda::PrologueArgs,
# kda::RecurrenceArgs, include/kda_*.h): the launch sequence (include/kda_launch.h) takes them itself.
LAUNCH_ONLY: dict[str, tuple[str, ...]] = {
    "kda_prologue_launch": ("num_chunks", "stream"),
    "kda_intra_launch": ("num_chunks", "stream"),
    "kda_recurrence_launch": ("group_ws", "stream"),
    "kda_walk_launch": ("stream",),
}

# The parameterless extern "C" queries of every library, with their ctypes return types.
QUERIES: dict[str, type] = {
    "kda_abi_version": ctypes.c_int, "kda_target": ctypes.c_char_p, "kda_head_dim_k": ctypes.c_int,
    "kda_head_dim_v": ctypes.c_int, "kda_chunk_size": ctypes.c_int, "kda_v_slice": ctypes.c_int,
    "kda_prologue_smem_bytes": ctypes.c_int, "kda_recurrence_smem_bytes": ctypes.c_int,
    "kda_intra_smem_bytes": ctypes.c_int, "kda_walk_smem_bytes": ctypes.c_int,
    "kda_walk_threads": ctypes.c_int,
    "kda_recurrence_blocks_per_sm": ctypes.c_int,
}


def struct_fields(abi: KernelABI) -> list[str]:
    """The launcher's parameters that it copies into the kernel's argument struct, in order."""
    skip = LAUNCH_ONLY[abi.name]
    return [p.name for p in abi.params if p.name not in skip]


def c_packing(abi: KernelABI, struct: str = "a", indent: str = "  ", width: int = 100) -> str:
    """`a.q = q; a.k = k; ...` for every struct field, wrapped at `width` columns (the C types match:
    the struct's pointers have the launcher's element types)."""
    lines, line = [], ""
    for name in struct_fields(abi):
        stmt = f"{struct}.{name} = {name};"
        if line and len(indent) + len(line) + 1 + len(stmt) > width:
            lines.append(line)
            line = ""
        line = f"{line} {stmt}" if line else stmt
    if line:
        lines.append(line)
    return "\n".join(indent + line for line in lines)
