# SPDX-License-Identifier: Apache-2.0
"""Offline machine code of the Triton kernels, normalized, to prove a source refactor changes nothing.

Usage (no GPU needed; unset TRITON_INTERPRET):
    PYTHONPATH=.:generated python tools/asm_fingerprint.py OUT_DIR [NAME_SUBSTRING]
before and after the change (into two directories), then `diff -r` them. Each file is one kernel's body
(PTX for sm_90, AMDGCN for gfx950) without debug-line markers, so inlining a helper or moving code
between functions shows no difference when the instructions are the same. Prints a hash per kernel.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys

import kdagen_kernels
from kdagen import aot
from kdagen.targets import TARGETS

_DEBUG = re.compile(r"^(\$L__tmp\d+:|\.Ltmp\d+:|\s*\.loc|\s*\.file|\s*;|\s*//)")


def kernel_body(asm: str, vendor: str) -> str:
    """The kernel's instructions: PTX from `.entry` to its closing brace, AMDGCN from the kernel label to
    s_endpgm, debug markers dropped (their numbering follows source lines and inlining)."""
    start, end = (r"\.entry", r"^}") if vendor == "nvidia" else (r"^kda_\w+:", r"s_endpgm")
    out, on = [], False
    for line in asm.splitlines():
        on = on or re.search(start, line) is not None
        if on and not _DEBUG.match(line):
            out.append(line)
        if on and re.search(end, line):
            break
    return "\n".join(out) + "\n"


def main() -> None:
    out_dir = sys.argv[1]
    only = sys.argv[2] if len(sys.argv) > 2 else ""
    os.makedirs(out_dir, exist_ok=True)
    for e in kdagen_kernels.VARIANTS:
        if e.backend != "triton" or only not in e.name:
            continue
        mod = e.load()
        for target in ("sm_90", "gfx950"):
            # Bounded gate (the mid-point diagonal blocks) and softplus (exact per-row blocks), paged state.
            for lower_bound, diag_ref in ((True, 2), (False, 0)):
                kernels = None if diag_ref == 2 else ("kda_prologue", "kda_wu")
                for rep, asm in aot.compile_variant(mod, target, lower_bound=lower_bound, diag_ref=diag_ref,
                                                    state_mode=2, kernels=kernels, keep_asm=True):
                    body = kernel_body(asm, TARGETS[target].vendor)
                    path = os.path.join(out_dir, f"{e.name}__{target}__{rep.kernel}__dr{diag_ref}.s")
                    with open(path, "w") as f:
                        f.write(body)
                    print(f"{hashlib.sha1(body.encode()).hexdigest()[:12]}  {os.path.basename(path)}", flush=True)


if __name__ == "__main__":
    main()
