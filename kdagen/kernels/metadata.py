# SPDX-License-Identifier: Apache-2.0
"""The device-side chunk metadata kernels (templates/triton/chunk_metadata.py.j2). See Note [Kernel ABI]."""

from __future__ import annotations

from .schema import KernelABI, constexpr, i32, i64, ptr

CHUNK_BLOCK_SUMS = KernelABI("chunk_block_sums_kernel", (
    ptr("cu_ptr", "i32"), i32("cu_stride"), ptr("block_sums_ptr", "i64", writes=True), i32("num_seqs"),
    constexpr("BT"), constexpr("BLOCK_N"),
))

CHUNK_METADATA_FILL = KernelABI("chunk_metadata_fill_kernel", (
    ptr("cu_ptr", "i32"), i32("cu_stride"), ptr("block_sums_ptr", "i64"),
    ptr("chunk_indices_ptr", "i32", writes=True), ptr("chunk_offsets_ptr", "i64", writes=True),
    i32("num_seqs"), i64("num_chunks"),
    constexpr("BT"), constexpr("BLOCK_N"), constexpr("BLOCK_B"), constexpr("BLOCK_J"), constexpr("CAP"),
    constexpr("BLOCK_C"),
))

KERNELS: dict[str, KernelABI] = {k.name: k for k in (CHUNK_BLOCK_SUMS, CHUNK_METADATA_FILL)}
