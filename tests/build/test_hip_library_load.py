# SPDX-License-Identifier: Apache-2.0
"""Loading a built library refuses a binary that does not match: another target (a copied or stale cache
entry) or another launcher ABI. A fake library (g++, no GPU) stands in for the compiled kernels."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from kdagen.runtime.group_scan import choose_groups
from kdagen.runtime.jit_hip import HipLibrary, TargetMismatchError
from kdagen.targets import HIP_ABI

CXX = shutil.which("g++")
pytestmark = pytest.mark.skipif(CXX is None, reason="g++ not found")

FAKE = r"""
extern "C" {
int kda_abi_version(void) { return ABI; }
const char* kda_target(void) { return TARGET; }
const char* kda_variant(void) { return "fake"; }
int kda_v_slice(void) { return 64; }
int kda_head_dim_k(void) { return 128; }
int kda_head_dim_v(void) { return 128; }
int kda_chunk_size(void) { return 64; }
const char* kda_error_string(int) { return "fake"; }
int kda_intra_smem_bytes(void) { return 1; }
int kda_walk_smem_bytes(void) { return 1; }
int kda_walk_threads(void) { return 256; }
int kda_intra_launch(void) { return 0; }
int kda_walk_launch(void) { return 0; }
int kda_pair_launch(void) { return 0; }
}
"""


def _fake(tmp_path, target: str, abi: int = HIP_ABI):
    src = tmp_path / "fake.cpp"
    src.write_text(FAKE)
    so = tmp_path / f"fake_{target}_{abi}.so"
    r = subprocess.run([CXX, "-shared", "-fPIC", f"-DABI={abi}", f'-DTARGET="{target}"', "-o", str(so), str(src)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return so


def test_matching_library_loads(tmp_path):
    lib = HipLibrary(_fake(tmp_path, "sm_90"), "fake", "sm_90")
    assert (lib.head_dim_k, lib.head_dim_v, lib.chunk_size, lib.v_slice) == (128, 128, 64, 64)


def test_library_built_for_another_target_is_refused(tmp_path):
    with pytest.raises(TargetMismatchError, match=r"built for gfx942, not gfx950; refusing to launch it"):
        HipLibrary(_fake(tmp_path, "gfx942"), "fake", "gfx950")


def test_library_with_another_abi_is_refused(tmp_path):
    with pytest.raises(RuntimeError, match=rf"launcher ABI {HIP_ABI + 1}, this kdagen expects {HIP_ABI}"):
        HipLibrary(_fake(tmp_path, "sm_90", HIP_ABI + 1), "fake", "sm_90")


@pytest.mark.parametrize(("N", "H", "chunks", "bps", "want"), [
    (1, 12, 64, 1, 8),      # one long sequence, 12 heads: split the walk
    (1, 12, 1024, 1, 16),
    (16, 96, 4096, 1, 1),   # the GPU is already full: one pass
    (1, 12, 1, 1, 1),       # one chunk: nothing to split
    (0, 12, 0, 1, 1),
])
def test_group_count_choice(N, H, chunks, bps, want):
    assert choose_groups(N, H, chunks, 128, 128, 64, 132, bps) == want
