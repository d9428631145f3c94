# SPDX-License-Identifier: Apache-2.0
"""tools/asm_fingerprint.py keeps a kernel's instructions and drops what follows source lines."""

from __future__ import annotations

import importlib.util
from pathlib import Path

TOOL = Path(__file__).resolve().parents[2] / "tools" / "asm_fingerprint.py"


def _tool():
    spec = importlib.util.spec_from_file_location("asm_fingerprint", TOOL)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_kernel_body_drops_debug_markers_and_what_surrounds_the_kernel():
    tool = _tool()
    ptx = (".version 8.7\n.visible .entry kda_wu(\n\t.loc 1 42 7\n$L__tmp3:\n\tld.global.b16 %rs1, [%rd1];\n"
           "\t// begin inline asm\n\tret;\n}\n\t.section .debug_abbrev\n")
    inlined = ptx.replace("\t.loc 1 42 7\n$L__tmp3:\n", "\t.loc 1 9 3\n$L__tmp1:\n$L__tmp2:\n")
    assert tool.kernel_body(ptx, "nvidia") == ".visible .entry kda_wu(\n\tld.global.b16 %rs1, [%rd1];\n\tret;\n}\n"
    assert tool.kernel_body(inlined, "nvidia") == tool.kernel_body(ptx, "nvidia")
    gcn = "\t.text\nkda_wu:\n.Ltmp0:\n\t.loc 1 3 0\n\tv_mov_b32 v0, 0 ; comment\n\ts_endpgm\n\t.section .AMDGPU.csdata\n"
    assert tool.kernel_body(gcn, "amd") == "kda_wu:\n\tv_mov_b32 v0, 0 ; comment\n\ts_endpgm\n"
