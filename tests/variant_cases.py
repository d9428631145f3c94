# SPDX-License-Identifier: Apache-2.0
"""Every Triton variant in the registry through one plan against the float64 reference, with a spy proving the
variant's own kernels ran: tests/interp/test_variants.py (the interpreter) and tests/gpu/test_variants_gpu.py
(the H200) parametrize over `triton_cases()`, so a variant is tested the moment the spec declares it.

A case is a ragged packed batch with an empty and a one-token sequence and lengths that are not multiples of
the chunk, the variant's own K and V (K != V where it declares them), vLLM's paged state cache (rows permuted,
one false flag whose row is NaN and must not be read, two rows outside state_indices that must not change) and
a NaN-poisoned `out` (an unwritten element fails).
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from collections.abc import Sequence
from types import ModuleType

import pytest
import torch

import kdagen_kernels
from kdagen.kernels import kda
from kdagen.kernels.schema import KernelABI
from kdagen.runtime import planning
from kdagen.runtime.registry import TORCH_DTYPES, VariantEntry
from tests.kda_cases import make_inputs, poisoned_out
from tests.tolerances import check, check_output, output_terms

ROOT = Path(__file__).resolve().parents[1]

# The Triton pipelines of the agreed `pipeline=` plan argument, each with the gate it is run on: the intra
# kernel needs the bounded gate (and the L2 norm in kernel); the pair takes any gate, so it runs the softplus one.
PIPELINES = {"triton_intra+triton_walk": -5.0, "triton_intra_tb+triton_walk_tb": -5.0, "triton_pair+triton_walk": None}
# The kernels each pipeline's chunk stage launches, then its walk's.
CHUNK_KERNELS = {"triton_intra+triton_walk": {"kda_intra"}, "triton_intra_tb+triton_walk_tb": {"kda_intra_tb"},
                 "triton_pair+triton_walk": {"kda_prologue", "kda_wu"}}
WALK_KERNELS = {"triton_walk": "kda_recurrence", "triton_walk_tb": "kda_recurrence_tb"}
# The Triton kernels a variant module holds, by the names the launches look them up under (Note [Kernel ABI]).
KERNEL_NAMES = sorted(v.name for v in vars(kda).values() if isinstance(v, KernelABI))


def triton_variants() -> list[VariantEntry]:
    return [e for e in kdagen_kernels.VARIANTS if e.backend == "triton"]


def triton_cases() -> list:
    """pytest params (variant, pipeline), one per Triton variant of the registry and Triton pipeline."""
    return [pytest.param(e, p, id=f"{e.name}-{p}") for e in triton_variants() for p in PIPELINES]


def lengths(chunk: int, scale: int = 1) -> list[int]:
    """Ragged lengths: an empty and a one-token sequence, and `scale`-times longer ones off the chunk grid."""
    return [scale * chunk + 5, 0, 1, scale * (2 * chunk) - 1]


class KernelSpy:
    """Stands in for one kernel of one variant module: records (module, kernel) when a plan launches it."""

    def __init__(self, fn: object, module: str, name: str, log: list[tuple[str, str]]):
        self._fn, self._tag, self._log = fn, (module, name), log

    def __getitem__(self, grid):
        launch = self._fn[grid]

        def call(*args, **kwargs):
            self._log.append(self._tag)
            return launch(*args, **kwargs)

        return call

    def __getattr__(self, attr: str):
        return getattr(self._fn, attr)


def spy_on_kernels(monkeypatch: pytest.MonkeyPatch,
                   entries: Sequence[VariantEntry] | None = None) -> list[tuple[str, str]]:
    """Replace the kernels of every Triton variant module (the registry's, or `entries`') by spies (before a plan
    binds them); return their log."""
    log: list[tuple[str, str]] = []
    for e in triton_variants() if entries is None else entries:
        mod: ModuleType = importlib.import_module(e.module)
        for name in KERNEL_NAMES:
            if hasattr(mod, name):
                monkeypatch.setattr(mod, name, KernelSpy(getattr(mod, name), e.module, name, log))
    return log


def inputs(e: VariantEntry, lower_bound: float | None, device, *, heads: int, scale: int = 1,
           seed: int = 0, lens: list[int] | None = None) -> tuple[dict, dict]:
    """(plan.run kwargs, reference kwargs) of one case on `device` (sequence lengths `lens`, by default
    lengths(chunk, scale)); the reference's on the CPU."""
    lens = lengths(e.chunk_size, scale) if lens is None else lens
    n, slots = len(lens), len(lens) + 2
    args = make_inputs(lens, heads, e.head_dim_k, e.head_dim_v, TORCH_DTYPES[e.dtype], "cpu", seed=seed,
                       lower_bound=lower_bound, g_bias=True, h0=True)
    h0 = args.pop("initial_state")
    del args["output_final_state"]
    gen = torch.Generator().manual_seed(seed + 1)
    rows = torch.randperm(slots, generator=gen)[:n].to(torch.int32)
    flags = torch.tensor([True, True, False, True][:n] + [True] * (n - 4))
    cache = torch.randn(slots, heads, e.head_dim_v, e.head_dim_k, generator=gen) * 0.1
    for i, r in enumerate(rows.tolist()):
        cache[r] = h0[i] if flags[i] else float("nan")  # a false flag's row must not be read
    ref = dict(args, state_cache=cache.clone(), state_indices=rows, has_initial_state=flags)
    run = {k: (v.to(device) if isinstance(v, torch.Tensor) else v)
           for k, v in dict(args, state_cache=cache, state_indices=rows, has_initial_state=flags).items()}
    return run, ref


def plan_for(e: VariantEntry, pipeline: str, run: dict, lower_bound: float | None,
             variants: tuple[VariantEntry, ...] | None = None) -> kdagen_kernels.KdaPrefillPlan:
    """The plan of one case on the named variant (its chunk size) and pipeline, chosen from `variants` (by
    default the registry)."""
    cu = run["cu_seqlens"]
    return planning.plan_kda_prefill(
        kdagen_kernels.VARIANTS if variants is None else variants, cu, cu.cpu(), num_heads=run["q"].shape[2], head_dim_k=e.head_dim_k, head_dim_v=e.head_dim_v,
        dtype=run["q"].dtype, device=run["q"].device, lower_bound=lower_bound, has_g_bias=True,
        use_qk_l2norm_in_kernel=True, state_indices=run["state_indices"], has_initial_state=run["has_initial_state"],
        chunk_size=e.chunk_size, pipeline=pipeline)


def run_and_check(e: VariantEntry, pipeline: str, run: dict, ref: dict, log: list[tuple[str, str]],
                  path: str, variants: tuple[VariantEntry, ...] | None = None) -> str:
    """Plan, run once, and check: the named variant ran (plan.entry, and only its module's kernels, the chunk
    stage's and the walk's), the output, the cache rows it routes, and the rows it must not touch. Returns
    the plan's description."""
    lower_bound = PIPELINES[pipeline]
    plan = plan_for(e, pipeline, run, lower_bound, variants)
    described = plan.describe()
    assert plan.entry.name == e.name and plan.pipeline.name == pipeline, \
        f"asked for {e.name} ({pipeline}), the plan runs {plan.entry.name}: {described}"
    out = poisoned_out(run["v"])
    o, none = plan.run(run["q"], run["k"], run["v"], run["raw_g"], run["raw_beta"], run["A_log"], run["g_bias"],
                       out=out, state_cache=run["state_cache"])
    if o.is_cuda:
        torch.cuda.synchronize()
    launched = {name for module, name in log if module == e.module}
    others = sorted({module for module, _ in log} - {e.module})
    assert not others, f"{e.name} ({pipeline}) launched kernels of {others}"
    want = CHUNK_KERNELS[pipeline] | {WALK_KERNELS[pipeline.split("+")[1]]}
    assert want <= launched, f"{e.name} ({pipeline}) launched {sorted(launched)}, not all of {sorted(want)}"
    assert o is out and none is None
    ref_o, _, terms = output_terms(**ref)
    tag = f"{e.name} {pipeline}"
    check_output(f"output of {tag}", o.cpu(), ref_o, terms, e.head_dim_k, (path, e.dtype, "output"))
    cache, ref_cache = run["state_cache"].cpu(), ref["state_cache"]
    rows = ref["state_indices"].tolist()
    for r in rows:
        check(f"cache row {r} of {tag}", cache[r], ref_cache[r], (path, e.dtype, "final_state"))
    for r in sorted(set(range(cache.shape[0])) - set(rows)):
        assert torch.equal(cache[r], ref_cache[r]), f"cache row {r} outside state_indices changed: {tag}"
    return described



def render_triton_variants(tmp: Path, spec_text: str) -> list[VariantEntry]:
    """The Triton variants a spec text declares, rendered from templates/ into an importable package under `tmp`
    (on sys.path until the process ends) as `kdagen generate` would render them: for variants the shipped spec
    does not declare (a chunk-32 variant, head dims the registry does not carry)."""
    from kdagen.render.context import variant_context
    from kdagen.render.env import make_env, render_template
    from kdagen.spec.load import load_spec_file

    (tmp / "specs").mkdir(parents=True, exist_ok=True)
    spec_path = tmp / "specs" / "rendered.yaml"
    spec_path.write_text(spec_text)
    package = f"kdagen_rendered_{abs(hash(str(tmp))):x}"
    (tmp / package).mkdir(exist_ok=True)
    (tmp / package / "__init__.py").write_text("")
    env = make_env(ROOT)
    out = []
    for v in load_spec_file(spec_path, tmp).variants:
        if v.backend != "triton":
            continue
        (tmp / package / f"{v.name}.py").write_text(
            render_template(env, "triton/kda_chunk.py.j2", variant_context(v, "# (rendered by a test)"), v.name))
        out.append(VariantEntry(name=v.name, op=v.op, backend="triton", dtype=v.dtype, head_dim_k=v.head_dim_k,
                                head_dim_v=v.head_dim_v, chunk_size=v.chunk_size, targets=v.targets,
                                module=f"{package}.{v.name}", spec=f"{v.spec_path}:{v.line}"))
    if str(tmp) not in sys.path:
        sys.path.insert(0, str(tmp))
    importlib.invalidate_caches()
    return out


# The spec a new user writes to add the head dims served today (64, 96, 128, 256; K != V; fp16), each on both
# backends and every target. The tuning each needs beyond the shipped file-level one: K = V = 256 takes 16-row
# walk slices and 4-warp kda_intra programs on gfx942 and gfx950 (no scratch, 2 waves per SIMD in their AOT
# builds: tests/aot/test_triton_smem.py) and one
# walk stage on sm_90 (the pair's walk on whole chunks asks 240 KiB at two, over the 227 KiB per block).
ALL_TARGETS_VARIANTS = """\
variants:
  - {label: d64, head_dim_k: 64, head_dim_v: 64, chunk_size: 64, dtype: bf16, backends: [triton, hip], targets: [gfx942, gfx950, sm_90]}
  - {label: d96, head_dim_k: 96, head_dim_v: 96, chunk_size: 64, dtype: bf16, backends: [triton, hip], targets: [gfx942, gfx950, sm_90]}
  - {label: k64_v128, head_dim_k: 64, head_dim_v: 128, chunk_size: 64, dtype: bf16, backends: [triton, hip], targets: [gfx942, gfx950, sm_90]}
  - label: d256
    head_dim_k: 256
    head_dim_v: 256
    chunk_size: 64
    dtype: bf16
    backends: [triton, hip]
    targets: [gfx942, gfx950, sm_90]
    tuning:
      triton:
        gfx942: {block_v: 16, dense_block_v: 16, intra_block_v: 32, intra_warps: 4, dense_intra_warps: 2}
        gfx950: {block_v: 16, dense_block_v: 16, intra_block_v: 32, intra_warps: 4, dense_intra_warps: 2}
        sm_90: {recurrence_stages_sparse: 1}
  - {label: kimi_fp16, head_dim_k: 128, head_dim_v: 128, chunk_size: 64, dtype: fp16, backends: [triton, hip], targets: [gfx942, gfx950, sm_90]}
"""


def all_targets_spec() -> str:
    """ALL_TARGETS_VARIANTS under the shipped spec's file-level tuning (its own variants dropped)."""
    shipped = (ROOT / "specs" / "kda_chunk_fwd.yaml").read_text()
    return shipped[:shipped.index("\nvariants:") + 1] + ALL_TARGETS_VARIANTS
