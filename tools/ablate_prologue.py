# SPDX-License-Identifier: Apache-2.0
"""Place time inside the Triton prologue kernels (kda_prologue, kda_wu) without hardware counters (GPU).

Usage (repo root, GPU machine): PYTHONPATH=.:generated python3 tools/ablate_prologue.py [--rows REGEX] [H:T:N ...]
(--rows: only the rows whose name matches; `base` always runs)

Each row is the generated module with one edit applied to its source (a stage left out, or done another
way); kda_prologue and kda_wu are timed alone (`triton.testing.do_bench` median) on the same inputs, and
the difference to the `base` row is what that stage costs (docs/perf-notes.md section 13 has a run).
Edits that leave a stage out give wrong results by design; the error columns (relative L2 of a small
ragged call against the float64 reference, on random and on near-duplicate-key inputs) say which rows
are real candidates.
"""

from __future__ import annotations

import importlib.util
import re
import sys
import tempfile
from pathlib import Path

import torch
import triton

import kdagen_kernels
from kdagen.autotune import kernel_call
from kdagen.bench import shape_inputs, make_inputs
from kdagen.reference import chunk_kda_prefill_reference, rel_l2
from kdagen.runtime.device import target_of

SHAPES = [(12, 4096, 1), (96, 16384, 16)]


def _nth(pattern: str, n: int, repl: str):
    """Replace only the n-th (0-based) match of `pattern`."""
    def edit(src: str) -> str:
        ms = list(re.finditer(pattern, src, flags=re.M))
        m = ms[n]
        return src[:m.start()] + m.expand(repl) + src[m.end():]
    return edit


# kda_wu's gate cumsum (a [64, BLOCK_K] scan over rows), and helpers that edits below put in.
_WU_CUMSUM = r"b_G = tl\.cumsum\((_chunk_gate\(raw_g, tok, L,[^)]*\)), axis=0\)"
_HELPERS = """@triton.jit
def _cumsum_mma(x, DOT_F32: tl.constexpr):
    # Row cumsum as tril(ones) @ x on the matrix units, x split into bf16 hi + lo (about 16 bits kept).
    o = tl.arange(0, x.shape[0])
    tri = (o[:, None] >= o[None, :]).to(tl.float32)
    if DOT_F32:
        return tl.dot(tri, x)
    hi = x.to(tl.bfloat16)
    lo = (x - hi.to(tl.float32)).to(tl.bfloat16)
    return tl.dot(tri.to(tl.bfloat16), lo, tl.dot(tri.to(tl.bfloat16), hi))


@triton.jit
def _no_store(ptr, value, mask):
    pass


@triton.jit
def _gate_loaded(raw_g, tok, n_valid, i_h, sg_t, sg_h, o_r, o_k, m_k, b_bias, a_h, lower_bound,
                 LOWER_BOUND: tl.constexpr):
    # The raw gate as it comes, no activation: what reading a precomputed gate would cost (2 B, not 4).
    mask = (o_r < n_valid)[:, None] & m_k[None, :]
    b_z = tl.load(raw_g + tok[:, None] * sg_t + i_h * sg_h + o_k[None, :], mask=mask, other=0.0)
    return -tl.abs(b_z.to(tl.float32))


"""


def _drop(name: str):
    """Every update of the b_<name>XY accumulators (off-diagonal, diagonal and per-row forms) left out."""
    pattern = re.compile(rf"^(\s+)b_{name}(\d\d) (?:= _mma(?:_wide)?\(|\+= tl\.where\().*$", re.M)
    return lambda s: pattern.sub(rf"\1b_{name}\2 = b_{name}\2", s)


def _halves(keep: str):
    """kda_prologue with only one of its two block families: would two programs per (chunk, head), one per
    family, be faster than one doing both (fewer registers each, so more programs per SM)? `keep` "qk":
    Aqk and the aqk store only; "kk": Akk, the inverse and its stores only."""
    def edit(src: str) -> str:
        if keep == "qk":
            src = _drop("Akk")(src)
            src = re.sub(r"for r in range\(1, (\d+)\):", r"for r in range(1, 1):", src)
            src = src.replace("return tl.dot(a, b, input_precision=FP32_DOT)", "return a")
            return src.replace("tl.store(tinv_ws + ", "_no_store(tinv_ws + ")
        src = _drop("Aqk")(src)
        return src.replace("tl.store(aqk_ws + ", "_no_store(aqk_ws + ")
    return _with_helpers(edit)


def _with_helpers(edit):
    """An edit of the kernels' bodies, with the helpers above defined ahead of both."""
    head = "@triton.jit\ndef kda_prologue("
    return lambda s: edit(s).replace(head, _HELPERS + head, 1)


EDITS = {
    "base": lambda s: s,
    "diagonal blocks in fp32 (ieee)": lambda s: s.replace(
        "return tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16), acc)",
        'return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")'),
    "no diagonal blocks": lambda s: s.replace("return tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16), acc)",
                                              "return acc"),
    "no off-diagonal blocks": lambda s: s.replace("return tl.dot(_io(a, DOT_F32), _io(b, DOT_F32), acc)",
                                                  "return acc"),
    "no gate activation": lambda s: s.replace("(lower_bound * RCP_LN2) / (1.0 + b_e)", "b_z.to(tl.float32) * c"),
    "no forward substitution": lambda s: re.sub(r"for r in range\(1, (\d+)\):", r"for r in range(1, 1):", s),
    "kda_prologue: no slice walk": _nth(r"for kk in range\(0, (\d+), BLOCK_K\):", 0,
                                        r"for kk in range(0, 0, BLOCK_K):"),
    "inverse products ieee (FMA units)": lambda s: s.replace("return tl.dot(a, b, input_precision=FP32_DOT)",
                                                             'return tl.dot(a, b, input_precision="ieee")'),
    "prologue: Aqk half alone": _halves("qk"),
    "prologue: Akk + inverse half alone": _halves("kk"),
    "kda_wu: no K walk": _nth(r"for kk in range\(0, (\d+), BLOCK_K\):", 1, r"for kk in range(0, 0, BLOCK_K):"),
    "kda_wu: no u walk": lambda s: s.replace("_u_slices(v, u_ws, b_T, b_beta, tok, ws, m_t, i_h, sv_t, sv_h, BLOCK_K, "
                                             "DOT_F32)", "pass"),
    # kda_wu runs at 54% of the copy bandwidth (docs/perf-notes.md, next steps): which of its stages costs.
    "kda_wu: no gate cumsum": _with_helpers(lambda s: re.sub(_WU_CUMSUM, r"b_G = \1", s)),
    "kda_wu: cumsum on matrix units": _with_helpers(lambda s: re.sub(_WU_CUMSUM, r"b_G = _cumsum_mma(\1, DOT_F32)", s)),
    "kda_wu: no qg / kg stores": _with_helpers(lambda s: s.replace("tl.store(qg_ws + ", "_no_store(qg_ws + ")
                                     .replace("tl.store(kg_ws + ", "_no_store(kg_ws + ")),
    "kda_wu: no qg store": _with_helpers(lambda s: s.replace("tl.store(qg_ws + ", "_no_store(qg_ws + ")),
    "kda_wu: no gate activation": _with_helpers(lambda s: re.sub(r"b_G = tl\.cumsum\(_chunk_gate\(raw_g, tok, L,",
                                                       "b_G = tl.cumsum(_gate_loaded(raw_g, tok, L,", s)),
    "kda_wu: gate loaded as is": _with_helpers(lambda s: re.sub(_WU_CUMSUM, lambda m: "b_G = " + m.group(1).replace(
        "_chunk_gate(", "_gate_loaded("), s)),
}


def load_edited(src: str, name: str, tmp: Path):
    path = tmp / f"ablate_{name}.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def error_of(mod, tun, adversarial: bool, design: str | None = "pair") -> float:
    args, ci, co = make_inputs(4, [0, 1, 63, 64, 200, 130], seed=1)
    if adversarial:
        # Near-duplicate keys, beta ~0.95, K3-like gate biases (almost no decay): the inverse's hard case.
        g = torch.Generator(device="cuda").manual_seed(7)
        k = args["k"].float()
        args["k"] = (k[:, :1] + 0.05 * k).to(args["q"].dtype)
        args["raw_beta"] = torch.full_like(args["raw_beta"], 2.95)
        args["g_bias"] = -7.8 + 6.4 * torch.rand(args["g_bias"].shape, device="cuda", generator=g)
    ref_o, _ = chunk_kda_prefill_reference(**args)
    out = torch.full_like(args["v"], float("nan"))
    kernel_call(mod, tun, "recurrence", args, ci, co, out=out, design=design)()
    return rel_l2(out, ref_o)


def parse_args(argv: list[str], default_shapes) -> tuple[re.Pattern | None, list[tuple[int, int, int]], list[str]]:
    """--rows REGEX, the H:T:N shapes (default_shapes without any) and the other flags."""
    rows = re.compile(argv.pop(argv.index("--rows") + 1)) if "--rows" in argv else None
    flags = [a for a in argv if a.startswith("--") and a != "--rows"]
    shapes = [tuple(int(x) for x in a.split(":")) for a in argv if not a.startswith("--")] or default_shapes
    return rows, shapes, flags


def run_edits(edits: dict, src: str, rows: re.Pattern | None, width: int, measure) -> None:
    """Each edit of the variant's source (only `base` and the rows matching `rows`), loaded as its own module:
    `measure(name, mod)` returns the row's text after the name, or raises (the row then says why)."""
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, edit) in enumerate(edits.items()):
            if rows is not None and name != "base" and not rows.search(name):
                continue
            new = edit(src)
            if name != "base" and new == src:
                print(f"{name:{width}s} edit did not apply")
                continue
            try:
                print(f"{name:{width}s} {measure(name, load_edited(new, f'v{i}', Path(tmp)))}", flush=True)
            except Exception as exc:
                print(f"{name:{width}s} failed: {type(exc).__name__}: {str(exc)[:200]}", flush=True)


def main() -> None:
    rows, shapes, _ = parse_args(sys.argv[1:], SHAPES)
    entry = next(e for e in kdagen_kernels.VARIANTS if e.name == "kda_chunk_fwd__triton__bf16__k128_v128_c64")
    src = Path(entry.load().__file__).read_text()
    tun = dict(entry.load().TUNING[target_of(torch.device("cuda"))])
    inputs = {s: shape_inputs(*s) for s in shapes}
    print(f"kda_prologue + kda_wu ms (do_bench median) per shape, tuning {tun}")
    print(f"{'edit':32s} {'error':>9s} {'adv. err':>9s} " + " ".join(f"{f'{H}/{T}/{N}':>16s}" for H, T, N in shapes))

    def measure(name, mod) -> str:
        err, adv = error_of(mod, tun, False), error_of(mod, tun, True)
        ms = [[triton.testing.do_bench(kernel_call(mod, tun, kernel, *inputs[s]), return_mode="median")
               for kernel in ("prologue", "wu")] for s in shapes]
        return f"{err:9.2e} {adv:9.2e} " + " ".join(f"{p:7.3f} +{w:7.3f}" for p, w in ms)

    run_edits(EDITS, src, rows, 32, measure)


if __name__ == "__main__":
    main()
