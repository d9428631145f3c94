# SPDX-License-Identifier: Apache-2.0
"""Chunk metadata (kdagen/runtime/metadata.py + templates/triton/chunk_metadata.py.j2) in the Triton
interpreter: exact equality with a plain-Python construction, and every validation error.

The runner sets TRITON_INTERPRET=1 before Python starts. The kernels come from the generated
package (generated/kdagen_kernels/triton/chunk_metadata.py).
"""

from __future__ import annotations

import importlib
import os

import pytest
import torch

from kdagen.runtime import metadata as md
from tests.metadata_cases import DECLARED, cu_from_lens, plain_metadata
from kdagen.runtime.metadata import (
    build_conv1d_chunk_schedule,
    prepare_chunk_indices,
    prepare_chunk_metadata_device,
    prepare_chunk_offsets,
)



@pytest.fixture(scope="module")
def kernels():
    return importlib.import_module("kdagen_kernels.triton.chunk_metadata")




def check_device(kernels, cu: torch.Tensor, bt: int):
    ci, co = prepare_chunk_metadata_device(cu, cu.cpu(), bt, kernels=kernels, chunk_sizes=DECLARED)
    indices, offsets = plain_metadata(cu.tolist(), bt)
    assert ci.dtype == cu.dtype and ci.device == cu.device
    assert co.dtype == torch.int64 and co.device == cu.device
    assert ci.shape == (len(indices), 2) and co.shape == (cu.numel(),)
    assert ci.tolist() == indices
    assert co.tolist() == offsets
    return ci, co


def check_host(cu: torch.Tensor, bt: int):
    indices, offsets = plain_metadata(cu.tolist(), bt)
    ci, co = prepare_chunk_indices(cu, bt), prepare_chunk_offsets(cu, bt)
    assert ci.dtype == cu.dtype and co.dtype == torch.int64
    assert ci.reshape(-1, 2).tolist() == indices and co.tolist() == offsets


def test_interpreter_is_on():
    assert os.environ.get("TRITON_INTERPRET") == "1", "run this file with TRITON_INTERPRET=1"


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_example(kernels, dtype):
    cu = torch.tensor([0, 100, 164, 165, 165], dtype=dtype)
    ci, co = check_device(kernels, cu, 64)
    assert ci.tolist() == [[0, 0], [0, 1], [1, 0], [2, 0]]
    assert co.tolist() == [0, 2, 3, 4, 4]
    check_host(cu, 64)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("bt", DECLARED)
@pytest.mark.parametrize("seed", range(4))
def test_random_ragged_with_empty_sequences(kernels, dtype, bt, seed):
    g = torch.Generator().manual_seed(seed)
    n = int(torch.randint(1, 400, (1,), generator=g))
    lens = torch.randint(0, 5 * bt, (n,), generator=g)
    lens[torch.rand(n, generator=g) < 0.3] = 0  # many zero-length sequences
    lens[torch.rand(n, generator=g) < 0.1] = bt  # exact multiples
    cu = cu_from_lens(lens, dtype)
    check_device(kernels, cu, bt)
    check_host(cu, bt)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_empty_batch_no_launch(dtype):
    class NoKernels:  # any launch would fail
        pass

    cu = torch.zeros(1, dtype=dtype)
    ci, co = prepare_chunk_metadata_device(cu, cu, 64, kernels=NoKernels, chunk_sizes=DECLARED)
    assert ci.shape == (0, 2) and ci.dtype == dtype
    assert co.tolist() == [0] and co.dtype == torch.int64
    check_host(cu, 64)


@pytest.mark.parametrize("lens", [[0], [0, 0, 0], [1], [64], [65], [5000]])
def test_one_or_all_empty(kernels, lens):
    cu = cu_from_lens(lens, torch.int32)
    check_device(kernels, cu, 64)
    check_host(cu, 64)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_sequences_far_longer_than_a_chunk(kernels, dtype):
    # Past CAP chunks (CAP * 64 tokens) rows are written sequence by sequence: exercise that
    # path with several long sequences in one block, between short and empty ones.
    cap_tokens = md._CAP * 64
    lens = [3, cap_tokens * 2 + 17, 0, 64, cap_tokens + 1, cap_tokens, 1, 5 * cap_tokens + 63, 0]
    check_device(kernels, cu_from_lens(lens, dtype), 64)
    check_device(kernels, cu_from_lens([1_000_000], dtype), 64)


def test_small_tiles_exercise_every_loop(kernels, monkeypatch):
    """Shrink the launch constants so the base loop, the 2-D tile loop and the per-sequence loop
    all run several iterations on a small batch."""
    monkeypatch.setattr(md, "_MAX_BLOCK_N", 16)
    monkeypatch.setattr(md, "_MAX_BLOCK_B", 16)
    monkeypatch.setattr(md, "_BLOCK_J", 2)
    monkeypatch.setattr(md, "_CAP", 4)
    monkeypatch.setattr(md, "_BLOCK_C", 16)
    g = torch.Generator().manual_seed(7)
    lens = torch.randint(0, 16 * 8, (16 * 40 + 3,), generator=g)  # 41 blocks > BLOCK_B
    lens[torch.rand(lens.numel(), generator=g) < 0.3] = 0
    lens[5], lens[6], lens[200] = 16 * 100 + 3, 16 * 33, 16 * 50
    for dtype in (torch.int32, torch.int64):
        check_device(kernels, cu_from_lens(lens, dtype), 16)


def test_non_contiguous_cu_seqlens(kernels):
    cu = cu_from_lens([5, 0, 130, 64, 1], torch.int64)
    wide = torch.zeros(cu.numel(), 3, dtype=torch.int64)
    wide[:, 1] = cu
    view = wide[:, 1]
    assert view.stride(0) == 3
    ci, co = prepare_chunk_metadata_device(view, cu, 64, kernels=kernels, chunk_sizes=DECLARED)
    indices, offsets = plain_metadata(cu.tolist(), 64)
    assert ci.tolist() == indices and co.tolist() == offsets


def test_n_100000(kernels):
    g = torch.Generator().manual_seed(100)
    lens = torch.randint(0, 300, (100_000,), generator=g)
    lens[torch.rand(100_000, generator=g) < 0.2] = 0
    cu = cu_from_lens(lens, torch.int32)
    check_host(cu, 64)
    check_host(cu.long(), 64)
    check_device(kernels, cu, 64)  # about 5 s in the interpreter


# --------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------
def call(cu, cu_cpu, bt=64, chunk_sizes=DECLARED, kernels=None):
    return prepare_chunk_metadata_device(cu, cu_cpu, bt, kernels=kernels, chunk_sizes=chunk_sizes)


GOOD = torch.tensor([0, 3, 70], dtype=torch.int32)


@pytest.mark.parametrize(
    "args, exc, pattern",
    [
        ((GOOD, GOOD.to("meta")), ValueError,
         r"cu_seqlens_cpu must be on the CPU .* got a tensor on meta\. Pass the host copy"),
        ((GOOD, GOOD.float()), TypeError,
         r"cu_seqlens_cpu must have dtype torch.int32 or torch.int64; got torch.float32"),
        ((GOOD.to(torch.int16), GOOD), TypeError,
         r"cu_seqlens must have dtype torch.int32 or torch.int64; got torch.int16"),
        ((GOOD.view(1, 3), GOOD), ValueError, r"cu_seqlens must be 1-D .* got shape \(1, 3\)"),
        ((GOOD, GOOD.view(3, 1)), ValueError, r"cu_seqlens_cpu must be 1-D .* got shape \(3, 1\)"),
        ((GOOD, torch.zeros(0, dtype=torch.int32)), ValueError, r"cu_seqlens_cpu must be 1-D with N\+1 >= 1 entries"),
        ((GOOD, [0, 3, 70]), TypeError, r"cu_seqlens_cpu must be a torch.Tensor .* got list"),
        ((GOOD, GOOD[:2]), ValueError,
         r"cu_seqlens and cu_seqlens_cpu must hold the same N\+1 values; got 3 and 2 entries"),
        ((GOOD, torch.tensor([0, 70, 3], dtype=torch.int32)), ValueError,
         r"cu_seqlens_cpu must be non-decreasing; got cu_seqlens_cpu\[1\] = 70 > cu_seqlens_cpu\[2\] = 3"),
        ((GOOD, torch.tensor([2, 3, 70], dtype=torch.int32)), ValueError,
         r"cu_seqlens_cpu\[0\] must be 0 .* got 2"),
        ((GOOD, GOOD, 128), ValueError,
         r"chunk_size=128 is not declared by any spec \(declared: \[16, 32, 64\]\)\. Add a variant with "
         r"chunk_size: 128 to a spec under specs/, then run `nox -s generate`"),
        ((GOOD, GOOD, 64.0), TypeError, r"chunk_size must be a positive int; got float 64.0"),
        ((GOOD, GOOD, 0), ValueError, r"chunk_size must be a positive int; got 0"),
    ],
)
def test_device_errors(args, exc, pattern):
    with pytest.raises(exc, match=pattern) as info:
        call(*args)
    assert str(info.value).startswith("prepare_chunk_metadata_device: ")


def test_host_helper_errors():
    with pytest.raises(ValueError, match=r"prepare_chunk_indices: cu_seqlens must be non-decreasing"):
        prepare_chunk_indices(torch.tensor([0, 5, 4]), 64)
    with pytest.raises(TypeError, match=r"prepare_chunk_offsets: cu_seqlens must have dtype"):
        prepare_chunk_offsets(torch.tensor([0.0, 5.0]), 64)
    with pytest.raises(ValueError, match=r"prepare_chunk_offsets: chunk_size must be a positive int; got -1"):
        prepare_chunk_offsets(torch.tensor([0, 5]), -1)
    with pytest.raises(ValueError, match=r"prepare_chunk_indices: cu_seqlens\[0\] must be 0"):
        prepare_chunk_indices(torch.tensor([1, 5]), 64)


# --------------------------------------------------------------------------------------------
# Conv1d schedule (host-built)
# --------------------------------------------------------------------------------------------
def plain_conv1d(cu: list[int], block_m: int):
    batch, offset = [], []
    for n in range(len(cu) - 1):
        for i in range(-(-(cu[n + 1] - cu[n]) // block_m)):
            batch.append(n)
            offset.append(i)
    return batch, offset


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("lens", [[], [0], [1, 0, 8, 9, 17, 0, 100], [3] * 50])
def test_conv1d_schedule(lens, dtype):
    cu = cu_from_lens(lens, dtype)
    sched = build_conv1d_chunk_schedule(cu, 8, "cpu")
    batch, offset = plain_conv1d(cu.tolist(), 8)
    assert sched["tot"] == len(batch)
    assert sched["batch_ptr"].dtype == torch.int32 and sched["token_chunk_offset_ptr"].dtype == torch.int32
    assert sched["batch_ptr"].tolist() == batch and sched["token_chunk_offset_ptr"].tolist() == offset


def test_conv1d_schedule_errors():
    cu = torch.tensor([0, 5, 9])
    f = "build_conv1d_chunk_schedule: "
    with pytest.raises(ValueError, match=f + r"query_start_loc_cpu must be on the CPU .* got a tensor on meta"):
        build_conv1d_chunk_schedule(cu.to("meta"), 8, "cpu")
    with pytest.raises(TypeError, match=f + r"query_start_loc_cpu must have dtype torch.int32 or torch.int64"):
        build_conv1d_chunk_schedule(cu.float(), 8, "cpu")
    with pytest.raises(ValueError, match=f + r"query_start_loc_cpu must be 1-D"):
        build_conv1d_chunk_schedule(cu.view(1, 3), 8, "cpu")
    with pytest.raises(ValueError, match=f + r"query_start_loc_cpu must be non-decreasing"):
        build_conv1d_chunk_schedule(torch.tensor([0, 9, 5]), 8, "cpu")
    with pytest.raises(TypeError, match=f + r"block_m must be a positive int; got float 8.0"):
        build_conv1d_chunk_schedule(cu, 8.0, "cpu")
    with pytest.raises(ValueError, match=f + r"block_m must be a positive int; got 0"):
        build_conv1d_chunk_schedule(cu, 0, "cpu")
