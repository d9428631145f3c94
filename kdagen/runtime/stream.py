# SPDX-License-Identifier: Apache-2.0
"""The current GPU stream's handle, read on every call (the HIP launches, the plan cache's key) at the cost
of one C call: `torch.cuda.current_stream(device)` builds a Stream object each time (several us per call on
the H200 machine's host). Triton's own launcher reads the stream the same way."""

from __future__ import annotations

import torch

try:
    from torch._C import _cuda_getCurrentRawStream as _raw_stream
except ImportError:  # a torch built without CUDA / ROCm
    _raw_stream = None


def current_stream(device_index: int) -> int:
    """The current stream's handle (cudaStream_t / hipStream_t as an int) on GPU `device_index`; 0, the null
    stream, for a CPU tensor's index (-1, `Tensor.get_device()` on the CPU)."""
    if device_index < 0:
        return 0
    if _raw_stream is not None:
        return _raw_stream(device_index)
    return torch.cuda.current_stream(device_index).cuda_stream
