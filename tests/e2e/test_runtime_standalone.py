# SPDX-License-Identifier: Apache-2.0
"""The runtime needs no generator: importing kdagen_kernels and running a call loads no spec, render,
YAML or Jinja module (a fresh interpreter, so nothing the test session imported counts)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from conftest import ROOT

CHILD = textwrap.dedent("""
    import sys, torch
    import kdagen_kernels as kk
    T, H, K, V = 70, 2, 64, 64
    cu = torch.tensor([0, 5, 5, 70], dtype=torch.int32)
    q, k = (torch.randn(1, T, H, K, dtype=torch.bfloat16) for _ in range(2))
    v = torch.randn(1, T, H, V, dtype=torch.bfloat16)
    o, _ = kk.chunk_kda_prefill(q, k, v, torch.randn(1, T, H, K, dtype=torch.bfloat16),
                                torch.randn(1, T, H, dtype=torch.bfloat16), torch.rand(H), g_bias=torch.rand(H * K),
                                lower_bound=-5.0, use_qk_l2norm_in_kernel=True, cu_seqlens=cu)
    plan = kk.plan_kda_prefill(cu, cu, num_heads=H, head_dim_k=K, head_dim_v=V, lower_bound=-5.0)
    assert torch.isfinite(o).all()
    print(sorted(m for m in sys.modules if m.startswith(("kdagen.spec", "kdagen.render", "yaml", "jinja2"))))
""")


def test_importing_and_calling_loads_no_generator_module():
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'generated'}")
    res = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, cwd=ROOT,
                         timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip().splitlines()[-1] == "[]", res.stdout
