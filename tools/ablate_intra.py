# SPDX-License-Identifier: Apache-2.0
"""Place time inside kda_intra without hardware counters (GPU).

Usage (repo root, GPU machine): PYTHONPATH=.:generated python3 tools/ablate_intra.py [--rows REGEX] [--dense]
    [H:T:N ...]
(--dense: with the target's dense_* knobs, the 16-row programs a batch whose walks fill the GPU takes on sm_90;
by default its base knobs, whatever the shape)

As tools/ablate_prologue.py does for the kernel pair: each row is the generated module with one edit to
kda_intra's body (a stage left out, or done another way), and kda_intra is timed alone on the same inputs
(`triton.testing.do_bench` median); the difference to `base` is what the stage costs. Rows that leave a stage
out are wrong by design; the error columns (a small ragged call and the near-duplicate-key case against the
float64 reference, kda_intra and the walk) say which rows are real candidates.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import torch
import triton

import kdagen_kernels
from kdagen.autotune import kernel_call
from kdagen.bench import shape_inputs
from kdagen.launch_knobs import dense_tuning
from kdagen.runtime.device import target_of

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ablate_prologue import error_of, parse_args, run_edits  # noqa: E402

SHAPES = [(96, 16384, 16)]
_NO_STORE = "@triton.jit\ndef _no_store(ptr, value, mask):\n    pass\n\n\n"


def _intra(edit):
    """An edit of kda_intra's body alone (the pair's kernels share helpers and names)."""
    def apply(src: str) -> str:
        i = src.index("def kda_intra(")
        j = src.index("@triton.jit", i)
        return src[:i] + edit(src[i:j]) + src[j:]
    return apply


def _helpers(edit):
    return lambda s: edit(s).replace("@triton.jit\ndef kda_prologue(", _NO_STORE + "@triton.jit\ndef kda_prologue(", 1)


EDITS = {
    "base": lambda s: s,
    "no substitution": _intra(lambda s: re.sub(r"for r in range\(1, (\d+)\):", "for r in range(1, 1):", s)),
    "no off-diagonal correction": _intra(lambda s: re.sub(r"b_T = b_T - _mm32\(.*\n", "b_T = b_T\n", s)),
    "no Akk / Aqk products": _intra(lambda s: re.sub(r"_mma_wide\([^)]*\)", "zeros", s)),
    "no inverse at all": _intra(lambda s: re.sub(r"for r in range\(1, (\d+)\):", "for r in range(1, 1):",
                                                 re.sub(r"b_T = b_T - _mm32\(.*\n", "b_T = b_T\n", s))),
    "gate: fast division": lambda s: s.replace(
        "(lower_bound * RCP_LN2) / (1.0 + b_e)", "libdevice.fast_dividef(lower_bound * RCP_LN2, 1.0 + b_e)"),
    "no gate activation": lambda s: s.replace("(lower_bound * RCP_LN2) / (1.0 + b_e)", "b_z.to(tl.float32) * c"),
    "no gate cumsum": _intra(lambda s: re.sub(r"b_G = tl\.cumsum\((_chunk_gate\([^;]*?True\)),\s*axis=0\)",
                                              r"b_G = \1", s, flags=re.S)),
    "no qg / kg stores": _helpers(_intra(lambda s: s.replace("tl.store(qg_ws + ", "_no_store(qg_ws + ")
                                         .replace("tl.store(kg_ws + ", "_no_store(kg_ws + "))),
    "no w (product and store)": _helpers(_intra(lambda s: s.replace("tl.store(w_ws + ", "_no_store(w_ws + "))),
    "no u (v load, product, store)": _intra(lambda s: re.sub(r"\n(\s+)_u_slices\(.*?\)\n", "\n", s, flags=re.S)),
    "no aqk store": _helpers(_intra(lambda s: s.replace("tl.store(aqk_ws + ", "_no_store(aqk_ws + "))),
}
# Tunings timed on the base module besides the spec's own.
TUNINGS = [dict(intra_warps=4, intra_block_v=128), dict(intra_warps=4, intra_block_v=64),
           dict(intra_warps=2, intra_block_v=64)]


def main() -> None:
    rows, shapes, flags = parse_args(sys.argv[1:], SHAPES)
    entry = next(e for e in kdagen_kernels.VARIANTS if e.name == "kda_chunk_fwd__triton__bf16__k128_v128_c64")
    src = Path(entry.load().__file__).read_text()
    tun = dict(entry.load().TUNING[target_of(torch.device("cuda"))])
    if "--dense" in flags:
        tun = dense_tuning(tun)
    inputs = {s: shape_inputs(*s) for s in shapes}
    print(f"kda_intra ms (do_bench median) per shape, tuning {tun}")
    print(f"{'edit':34s} {'error':>9s} {'adv. err':>9s} " + " ".join(f"{f'{H}/{T}/{N}':>10s}" for H, T, N in shapes))

    def times(mod, knobs) -> str:
        ms = [triton.testing.do_bench(kernel_call(mod, knobs, "intra", *inputs[s], design="intra"),
                                      return_mode="median") for s in shapes]
        return " ".join(f"{t:10.3f}" for t in ms)

    def measure(name, mod) -> str:
        err, adv = error_of(mod, tun, False, design="intra"), error_of(mod, tun, True, design="intra")
        row = f"{err:9.2e} {adv:9.2e} {times(mod, tun)}"
        if name == "base":
            for extra in TUNINGS:
                label = f"base, {extra['intra_warps']} warps, u slices {extra['intra_block_v']}"
                row += f"\n{label:34s} {'':9s} {'':9s} {times(mod, {**tun, **extra})}"
        return row

    run_edits(EDITS, src, rows, 34, measure)


if __name__ == "__main__":
    main()
