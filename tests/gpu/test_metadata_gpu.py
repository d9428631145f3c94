# SPDX-License-Identifier: Apache-2.0
"""Chunk metadata and the conv1d schedule on a real GPU: exact equality with a plain-Python
construction up to N = 100,000, no host<->device sync, CUDA-graph capture."""

from __future__ import annotations

import importlib
import os

import pytest
import torch

if not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1":
    pytest.skip("needs a GPU and compiled Triton (TRITON_INTERPRET unset)", allow_module_level=True)

from kdagen.runtime import metadata as md  # noqa: E402
from tests.metadata_cases import DECLARED, cu_from_lens, plain_metadata  # noqa: E402
from kdagen.runtime.metadata import (  # noqa: E402
    build_conv1d_chunk_schedule,
    prepare_chunk_indices,
    prepare_chunk_metadata_device,
    prepare_chunk_offsets,
)

DEV = torch.device("cuda")


@pytest.fixture(scope="module")
def kernels():
    return importlib.import_module("kdagen_kernels.triton.chunk_metadata")




def check(kernels, cu_cpu: torch.Tensor, bt: int):
    cu = cu_cpu.to(DEV)
    # Poison the caching allocator's next blocks so stale zeros cannot pass for results.
    torch.full((cu_cpu.numel() * 4 + 4096,), -7, dtype=torch.int64, device=DEV)
    ci, co = prepare_chunk_metadata_device(cu, cu_cpu, bt, kernels=kernels, chunk_sizes=DECLARED)
    indices, offsets = plain_metadata(cu_cpu.tolist(), bt)
    assert ci.device == cu.device and co.device == cu.device
    assert ci.dtype == cu.dtype and co.dtype == torch.int64
    assert ci.shape == (len(indices), 2) and co.shape == (cu.numel(),)
    assert ci.cpu().tolist() == indices
    assert co.cpu().tolist() == offsets
    assert torch.equal(ci, prepare_chunk_indices(cu, bt)) and torch.equal(co, prepare_chunk_offsets(cu, bt))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_example(kernels, dtype):
    check(kernels, torch.tensor([0, 100, 164, 165, 165], dtype=dtype), 64)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("n", [1, 2, 17, 128, 129, 1000, 4096, 65536, 100_000])
@pytest.mark.parametrize("bt", DECLARED)
def test_random_ragged(kernels, dtype, n, bt):
    g = torch.Generator().manual_seed(n * 7 + bt)
    lens = torch.randint(0, 5 * bt, (n,), generator=g)
    lens[torch.rand(n, generator=g) < 0.25] = 0
    check(kernels, cu_from_lens(lens, dtype), bt)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_long_and_empty(kernels, dtype):
    cap = md._CAP * 64
    for lens in ([0], [0] * 300, [1], [4_000_000], [3, 2 * cap + 17, 0, 64, cap + 1, cap, 1, 5 * cap + 63, 0]):
        check(kernels, cu_from_lens(lens, dtype), 64)
    g = torch.Generator().manual_seed(3)
    lens = torch.randint(0, 200, (50_000,), generator=g)
    lens[torch.randint(0, 50_000, (40,), generator=g)] = 100_000  # long sequences spread over blocks
    check(kernels, cu_from_lens(lens, dtype), 64)


def test_empty_batch(kernels):
    cu = torch.zeros(1, dtype=torch.int32)
    ci, co = prepare_chunk_metadata_device(cu.to(DEV), cu, 64, kernels=kernels, chunk_sizes=DECLARED)
    assert ci.shape == (0, 2) and ci.is_cuda and co.cpu().tolist() == [0]


def test_no_host_device_sync(kernels):
    cu_cpu = cu_from_lens(torch.randint(0, 300, (4096,)), torch.int32)
    cu = cu_cpu.to(DEV)
    prepare_chunk_metadata_device(cu, cu_cpu, 64, kernels=kernels, chunk_sizes=DECLARED)  # compile first
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        ci, co = prepare_chunk_metadata_device(cu, cu_cpu, 64, kernels=kernels, chunk_sizes=DECLARED)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    indices, offsets = plain_metadata(cu_cpu.tolist(), 64)
    assert ci.cpu().tolist() == indices and co.cpu().tolist() == offsets


def test_cuda_graph_capture(kernels):
    cu_cpu = cu_from_lens(torch.randint(0, 300, (777,)), torch.int64)
    cu = cu_cpu.to(DEV)
    prepare_chunk_metadata_device(cu, cu_cpu, 64, kernels=kernels, chunk_sizes=DECLARED)  # compile first
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ci, co = prepare_chunk_metadata_device(cu, cu_cpu, 64, kernels=kernels, chunk_sizes=DECLARED)
    ci.fill_(-1)
    co.fill_(-1)
    graph.replay()
    torch.cuda.synchronize()
    indices, offsets = plain_metadata(cu_cpu.tolist(), 64)
    assert ci.cpu().tolist() == indices and co.cpu().tolist() == offsets


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("block_m", [1, 8, 64])
def test_conv1d_schedule(dtype, block_m):
    g = torch.Generator().manual_seed(block_m)
    lens = torch.randint(0, 100, (3000,), generator=g)
    lens[torch.rand(3000, generator=g) < 0.2] = 0
    cu_cpu = cu_from_lens(lens, dtype)
    sched = build_conv1d_chunk_schedule(cu_cpu, block_m, DEV)
    batch, offset = [], []
    cu = cu_cpu.tolist()
    for n in range(len(cu) - 1):
        for i in range(-(-(cu[n + 1] - cu[n]) // block_m)):
            batch.append(n)
            offset.append(i)
    assert sched["tot"] == len(batch)
    for key in ("batch_ptr", "token_chunk_offset_ptr"):
        assert sched[key].is_cuda and sched[key].dtype == torch.int32
    assert sched["batch_ptr"].cpu().tolist() == batch
    assert sched["token_chunk_offset_ptr"].cpu().tolist() == offset
