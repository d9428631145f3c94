# SPDX-License-Identifier: Apache-2.0
"""The generated fused HIP kernels' own code, run on the CPU: g++ builds a generated source against a
test-only port header (tests/build/hip_emulation/: one std::thread per GPU thread, std::barrier for
__syncthreads and per wave), and the results are compared with the float64 reference. This checks
indexing, masking, state modes and checkpoint semantics of the kernel code, not GPU-specific behaviour
(the H200 does that: tests/gpu).

Every hip variant of the registry (kdagen_kernels.VARIANTS, generated/kdagen_kernels/_registry.py) runs on every matrix layer of
templates/hip/include/kda_mma.h (-DKDA_MMA_LAYER) whose target it declares: `fma` (the fallback, sm_90
source), `sm90_mma` (sm_90 source, mma.sync m16n8k16 fragments, warp 32), `gfx942_mfma` (gfx942 source,
16x16x16 MFMA fragments, wave 64) and `gfx950_mfma` (gfx950 source, 16x16x32, wave 64); each library says
which variant and target it was rendered for (kda_variant, kda_target), so a test cannot run another
variant's source. The layer's own fragment index math runs; the instructions are the emulation header's
wave models, written from the PTX / CDNA ISA element -> lane maps. test_mma_layer_tile checks one tile
product of each layer exactly against an fp32 product of the same bf16 operands. test_head_dims renders
head dims and dtypes the spec does not ship (kdagen.targets.hip_limits' whole range) the same way.

The tests call the generated extern "C" launchers themselves (the emulation header runs each kernel launch
on the CPU): argtypes from kdagen/kernels/hip.py, arguments bound by name."""

from __future__ import annotations

import ctypes
import importlib.util
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from kdagen.kernels.hip import ENTRIES, KDA_INTRA_LAUNCH, KDA_WALK_LAUNCH, QUERIES
from kdagen.reference import chunk_kda_prefill_reference, intra_workspace_reference, rel_l2
from kdagen.render.context import hip_context
from kdagen.render.env import make_env, render_template
from kdagen.runtime.metadata import prepare_chunk_indices, prepare_chunk_offsets
from kdagen.spec.model import VariantSpec
from kdagen.targets import TARGETS, hip_intra_lds, hip_walk_lds
from tests.tolerances import within

ROOT = Path(__file__).resolve().parents[2]
EMU = Path(__file__).resolve().parent / "hip_emulation"
HIP = ROOT / "generated" / "kdagen_kernels" / "hip"
CXX = shutil.which("g++")

pytestmark = pytest.mark.skipif(CXX is None, reason="g++ (C++20) not found")

# layer id -> (KDA_MMA_LAYER, target whose generated source is built): the FMA fallback, then each target's own.
LAYERS = {"fma": (0, "sm_90"), **{name: (TARGETS[t].hip_mma_layer, t) for name, t in
                                  (("sm90_mma", "sm_90"), ("gfx942_mfma", "gfx942"), ("gfx950_mfma", "gfx950"))}}


def _registry_variants():
    """kdagen_kernels.VARIANTS, read from the checked-in registry module alone (data only: the package's
    __init__ and its runtime imports are not needed to build and run a source)."""
    spec = importlib.util.spec_from_file_location("_kdagen_registry", ROOT / "generated" / "kdagen_kernels" / "_registry.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.VARIANTS


HIP_VARIANTS = [e for e in _registry_variants() if e.backend == "hip"]
TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def _key(dtype: str, what: str) -> tuple[str, str, str]:
    return ("hip-emulated", dtype, what)


class EmuLib:
    """A built emulation library: its queries, and the launchers with their arguments by name."""

    def __init__(self, so: Path):
        self._lib = ctypes.CDLL(str(so))
        for fn, restype in QUERIES.items():
            getattr(self._lib, fn).restype = restype
        for abi in ENTRIES:
            getattr(self._lib, abi.name).argtypes = abi.ctypes_types()
            getattr(self._lib, abi.name).restype = ctypes.c_int

    def query(self, name: str):
        value = getattr(self._lib, name)()
        return value.decode() if isinstance(value, bytes) else value

    def intra(self, args) -> None:
        assert self._lib.kda_intra_launch(*KDA_INTRA_LAUNCH.bind(args)) == 0

    def walk(self, args) -> None:
        assert self._lib.kda_walk_launch(*KDA_WALK_LAUNCH.bind(args)) == 0

    def tile(self):
        return self._lib.emu_mma_tile


@dataclass
class Emu:
    lib: EmuLib
    K: int
    V: int
    dtype: str
    layer: str

    @property
    def tdtype(self) -> torch.dtype:
        return TORCH_DTYPES[self.dtype]


def _compile(src: Path, layer: str, out_dir: Path, wave: bool | None = None) -> Path:
    """The emulation library of `src` on `layer`; `wave` forces kda_intra_kernel's design (None: the target's)."""
    num, _ = LAYERS[layer]
    design = [] if wave is None else [f"-DKDA_INTRA_WAVE={int(wave)}"]
    so = out_dir / f"{src.stem}__{layer}{'' if wave is None else f'__wave{int(wave)}'}.so"
    r = subprocess.run([CXX, "-std=c++20", "-O2", "-pthread", "-shared", "-fPIC", f"-I{EMU}", f"-I{HIP / 'include'}",
                        f"-DKDA_MMA_LAYER={num}", *design, f'-DKDA_SOURCE="{src}"', "-o", str(so),
                        str(EMU / "driver.cpp")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return so


def _load(src: Path, name: str, K: int, V: int, dtype: str, layer: str, out_dir: Path,
          wave: bool | None = None) -> Emu:
    """Build `src` for `layer` (kda_intra_kernel in the target's design, or the one `wave` names) and check that it
    is variant `name` for the layer's target."""
    target = LAYERS[layer][1]
    lib = EmuLib(_compile(src, layer, out_dir, wave))
    got = tuple(lib.query(q) for q in ("kda_variant", "kda_target", "kda_head_dim_k", "kda_head_dim_v",
                                       "kda_chunk_size"))
    assert got == (name, target, K, V, 64), f"{src.name} built as {got}"
    # The LDS model the spec's limits read (kdagen.targets) is the compiled struct's size.
    assert lib.query("kda_intra_smem_bytes") == hip_intra_lds(K, V, target if layer != "fma" else "sm_90",
                                                              False if layer == "fma" else wave)
    if layer != "fma":
        assert lib.query("kda_walk_smem_bytes") == hip_walk_lds(K, V)
    return Emu(lib, K, V, dtype, layer)


def _cases():
    for e in HIP_VARIANTS:
        for layer, (_, target) in LAYERS.items():
            if target in e.targets:
                yield pytest.param((e, layer), id=f"{e.name.split('__', 2)[2]}-{layer}")


@pytest.fixture(scope="module", params=list(_cases()))
def emu(request, tmp_path_factory) -> Emu:
    e, layer = request.param
    src = HIP / f"{e.name}__{LAYERS[layer][1]}.hip"
    return _load(src, e.name, e.head_dim_k, e.head_dim_v, e.dtype, layer, tmp_path_factory.mktemp("emu"))


def _intra_cases():
    """Every variant and layer with kda_intra_kernel in each design a matrix layer can take (the FMA fallback has
    the block design only): a target ships one, the other stays an A/B build (tools/hip_intra_ab.py)."""
    for e in HIP_VARIANTS:
        for layer, (_, target) in LAYERS.items():
            if target in e.targets:
                for wave in (False,) if layer == "fma" else (False, True):
                    yield pytest.param((e, layer, wave),
                                       id=f"{e.name.split('__', 2)[2]}-{layer}-{'wave' if wave else 'block'}")


@pytest.fixture(scope="module", params=list(_intra_cases()))
def emu_intra(request, tmp_path_factory) -> Emu:
    e, layer, wave = request.param
    src = HIP / f"{e.name}__{LAYERS[layer][1]}.hip"
    return _load(src, e.name, e.head_dim_k, e.head_dim_v, e.dtype, layer, tmp_path_factory.mktemp("emu"), wave)


def _ptr(t: torch.Tensor | None) -> int | None:
    return t.data_ptr() if t is not None else None


def _stride0(t: torch.Tensor | None) -> int:
    return t.stride(0) if t is not None else 0


def make(seqlens, H, K, V, seed=0, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    T = sum(seqlens)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    return dict(q=(r(1, T, H, K) * 0.5).to(dtype), k=(r(1, T, H, K) * 0.5).to(dtype), v=(r(1, T, H, V) * 0.5).to(dtype),
                raw_g=r(1, T, H, K).to(dtype), raw_beta=r(1, T, H).to(dtype), A_log=r(H) * 0.5, g_bias=r(H * K) * 0.5,
                cu_seqlens=torch.tensor([0] + torch.tensor(seqlens).cumsum(0).tolist(), dtype=torch.int32))


@pytest.mark.parametrize("layer", [layer for layer in LAYERS if layer != "fma"])
def test_mma_layer_tile(layer, tmp_path_factory):
    """One 16 x 16 x 64 tile through the layer (loads, mma16, accumulator indices) must equal the fp32
    product of the same bf16 operands (products exact, fp32 sum in k order: the models' arithmetic)."""
    e = HIP_VARIANTS[0]
    lib = ctypes.CDLL(str(_compile(HIP / f"{e.name}__{LAYERS[layer][1]}.hip", layer, tmp_path_factory.mktemp("tile"))))
    g = torch.Generator().manual_seed(7)
    A = torch.randn(16, 64, generator=g).bfloat16()
    B = torch.randn(64, 16, generator=g).bfloat16()
    C0 = torch.randn(16, 16, generator=g)
    bits = lambda t: t.contiguous().view(torch.int16)  # noqa: E731
    a, b, at, bt = bits(A), bits(B), bits(A.t()), bits(B.t())
    C1, C2 = C0.clone(), torch.zeros(16, 16)
    lib.emu_mma_tile.argtypes = [ctypes.c_void_p] * 6
    kstep = lib.emu_mma_tile(a.data_ptr(), b.data_ptr(), at.data_ptr(), bt.data_ptr(), C1.data_ptr(), C2.data_ptr())
    assert kstep == {"sm90_mma": 16, "gfx942_mfma": 16, "gfx950_mfma": 32}[layer]
    want = C0.double() + A.double() @ B.double()
    within("tile max abs error", (C1.double() - want).abs().max().item(), ("hip-emulated", "bf16", "mma_tile_abs"))
    assert torch.equal(C1, C2)
    # Exact: sequential fp32 accumulation from C in k order, as the models define the instruction.
    ref = C0.clone()
    for k in range(64):
        ref = ref + A[:, k].float()[:, None] * B[k, :].float()[None, :]
    assert torch.equal(C1, ref)


def _intra(emu: Emu, x, lower_bound, *, strided=False):
    """kda_intra_launch into NaN-poisoned workspaces (16-row walk chunks, bf16 whatever the I/O dtype)."""
    K, V = emu.K, emu.V
    q, k, v, g, b = x["q"], x["k"], x["v"], x["raw_g"], x["raw_beta"]
    if strided:  # views of wider projections: the kernel's element-wise loads instead of whole-run ones
        q, k, v, g = (torch.cat([t, t[..., :4]], -1)[..., :t.shape[-1]] for t in (q, k, v, g))
    T, H = q.shape[1], q.shape[2]
    ci = prepare_chunk_indices(x["cu_seqlens"], 64).to(torch.int32).contiguous()
    ws = {n: torch.full((T, H, d), float("nan"), dtype=torch.bfloat16)
          for n, d in (("qg", K), ("w", K), ("kg", K), ("u", V), ("aqk", 16))}
    ws["decay"] = torch.full((ci.shape[0] * 4, H, K), float("nan"))
    emu.lib.intra(dict(
        q=q.data_ptr(), k=k.data_ptr(), v=v.data_ptr(), g=g.data_ptr(), beta=b.data_ptr(), A_log=x["A_log"].data_ptr(),
        g_bias=x["g_bias"].data_ptr(), cu_seqlens=x["cu_seqlens"].data_ptr(), chunk_indices=ci.data_ptr(),
        **{n: t.data_ptr() for n, t in ws.items()},
        sq_t=q.stride(1), sq_h=q.stride(2), sk_t=k.stride(1), sk_h=k.stride(2), sv_t=v.stride(1), sv_h=v.stride(2),
        sg_t=g.stride(1), sg_h=g.stride(2), sb_t=b.stride(1), sb_h=b.stride(2),
        num_chunks=ci.shape[0], H=H, scale=K ** -0.5, lower_bound=lower_bound, stream=None))
    return ws


def _intra_ref(emu: Emu, x, lower_bound):
    return intra_workspace_reference(x["q"], x["k"], x["v"], x["raw_g"], x["raw_beta"], x["A_log"], x["g_bias"],
                                     emu.K ** -0.5, lower_bound, x["cu_seqlens"])


def _intra_errors(emu: Emu, x, lower_bound) -> dict[str, float]:
    ws = _intra(emu, x, lower_bound)
    ref = _intra_ref(emu, x, lower_bound)
    assert torch.equal(torch.isnan(ws["decay"]), torch.isnan(ref["decay"]))
    errs = {n: rel_l2(ws[n].double().nan_to_num(1e30), ref[n]) for n in ("qg", "kg", "w", "u", "aqk")}
    live = ~torch.isnan(ref["decay"])
    errs["decay"] = rel_l2(ws["decay"][live], ref["decay"][live])
    return errs


def test_intra_workspace_matches_reference(emu_intra):
    """kda_intra_kernel (16-row walk chunks, shared-memory tiles) against the float64 workspace: a T = 1
    sequence, a T = 0 one, and lengths off the 16- and 64-row grids; every row of qg, kg, w, u and aqk is
    written (the NaN poison is gone), decay rows exactly where a walk chunk has rows."""
    emu = emu_intra
    x = make([1, 0, 45, 83], 2, emu.K, emu.V, seed=7, dtype=emu.tdtype)
    errs = _intra_errors(emu, x, -5.0)
    print(f"[intra {emu.layer}] " + " ".join(f"{n}={e:.3e}" for n, e in errs.items()))
    for n, e in errs.items():
        within(f"kda_intra {n}", e, _key(emu.dtype, "intra_workspace"))
    # Strided projections take the element-wise loads: the same workspace, bit for bit.
    ws, st = _intra(emu, x, -5.0), _intra(emu, x, -5.0, strided=True)
    for n in ws:
        assert torch.equal(st[n].nan_to_num(7.0), ws[n].nan_to_num(7.0)), n


def test_gate_does_not_overflow(emu_intra):
    """A_log 88, 100 and 1e4 beside ordinary heads: exp(A_log) is past fp32's range from 88.7 on, so an
    unclamped gate is NaN where a (z + bias) is inf * 0 (float64 finite: sigmoid(0)). Clamped at 80, every head
    matches the float64 workspace as ordinary ones do (the gate saturates either way)."""
    emu = emu_intra
    x = make([45, 83], 5, emu.K, emu.V, seed=31, dtype=emu.tdtype)
    x["A_log"] = torch.tensor([0.3, 88.0, 100.0, 1e4, -0.5])
    # z + bias exactly 0 in 8 columns of heads 1 and 2 (float64's exp(A_log) is finite there): inf * 0 without
    # the clamp, lower_bound / 2 with it. (Head 3's float64 exp(1e4) is inf itself, so it keeps z + bias != 0.)
    for h in (1, 2):
        x["raw_g"][:, :, h, :8] = 0.75
        x["g_bias"][h * emu.K:h * emu.K + 8] = -0.75
    ws = _intra(emu, x, -5.0)
    for n in ("qg", "kg", "w", "u", "aqk", "decay"):
        assert not bool(torch.isnan(ws[n]).any()) or n == "decay", n
    errs = _intra_errors(emu, x, -5.0)
    print(f"[intra, large A_log {emu.layer}] " + " ".join(f"{n}={e:.3e}" for n, e in errs.items()))
    for n, e in errs.items():
        within(f"kda_intra {n}, A_log up to 1e4", e, _key(emu.dtype, "intra_workspace"))


def test_intra_inverse_on_correlated_keys(emu_intra):
    """Near-duplicate keys, beta near 0.95 and slow gates: Akk's entries near beta, so T = (I + A)^-1 has large
    entries in every block (its off-diagonal 8 x 8 block included) and w, u depend on all of them. On random keys
    they are small enough that a wrong block hides in bf16 rounding; here it cannot."""
    emu = emu_intra
    K = emu.K
    x = make([45, 83], 2, K, emu.V, seed=9, dtype=emu.tdtype)
    g = torch.Generator().manual_seed(10)
    base = torch.randn(1, 1, 2, K, generator=g)
    x["k"] = (base + 0.05 * torch.randn(x["k"].shape, generator=g)).to(emu.tdtype)
    x["raw_beta"] = (3.0 + 0.1 * torch.randn(x["raw_beta"].shape, generator=g)).to(emu.tdtype)
    ws = _intra(emu, x, -0.5)
    ref = _intra_ref(emu, x, -0.5)
    errs = {n: rel_l2(ws[n].double().nan_to_num(1e30), ref[n]) for n in ("w", "u")}
    print(f"[intra, correlated keys {emu.layer}] " + " ".join(f"{n}={e:.3e}" for n, e in errs.items()))
    for n, e in errs.items():
        within(f"kda_intra {n}, correlated keys", e, _key(emu.dtype, "intra_correlated"))


def _walk(emu: Emu, x, ws, *, h0=None, cache=None, cache_idx=None, has_init=None, ckpt=None,
          ck_off=None, ck_idx=None, final=True, odd_out=False):
    """kda_walk_launch on kda_intra's workspace `ws`: a NaN-poisoned output and (dense, `final`) final state.
    odd_out: the output as a view of a wider buffer with an odd token stride (a strided `out`)."""
    K, V = emu.K, emu.V
    T, H = x["q"].shape[1], x["q"].shape[2]
    cu = x["cu_seqlens"]
    N = cu.numel() - 1
    co = prepare_chunk_offsets(cu, 64).to(torch.int64).contiguous()
    out = torch.full((1, T, H, V), float("nan"), dtype=emu.tdtype)
    if odd_out:
        out = torch.full((1, T, H * V + 1), float("nan"), dtype=emu.tdtype)[..., :H * V].unflatten(-1, (H, V))
    paged = cache is not None
    ht = cache if paged else torch.full((N, H, V, K), float("nan")) if final else None
    src = cache if paged else h0
    idx = cache_idx.to(torch.int32).contiguous() if paged else None
    flags = has_init.to(torch.uint8).contiguous() if paged else None
    emu.lib.walk(dict(
        **{n: ws[n].data_ptr() for n in ("qg", "w", "kg", "u", "aqk", "decay")},
        out=out.data_ptr(), so_t=out.stride(1), so_h=out.stride(2), cu_seqlens=cu.data_ptr(), chunk_offsets=co.data_ptr(),
        h0=_ptr(src), sh0_n=_stride0(src), sh0_h=src.stride(1) if src is not None else 0,
        state_in=2 if paged else int(h0 is not None), ht=_ptr(ht), sht_n=_stride0(ht),
        sht_h=ht.stride(1) if ht is not None else 0, state_out=2 if paged else int(ht is not None),
        state_idx=_ptr(idx), n_slots=cache.shape[0] if paged else 0, has_init=_ptr(flags),
        ckpt=_ptr(ckpt), sck_n=_stride0(ckpt), n_ckpt_rows=ckpt.shape[0] if ckpt is not None else 0,
        ckpt_off=_ptr(ck_off), ckpt_idx=_ptr(ck_idx), num_seqs=N, H=H, scale=K ** -0.5, stream=None))
    return out, ht


def _needs_walk(emu: Emu) -> None:
    if emu.lib.query("kda_walk_threads") == 0:
        pytest.skip("the FMA fallback has no walk (fused plans then take the Triton walk)")


def _reference(x, h0, lower_bound=-5.0):
    return chunk_kda_prefill_reference(x["q"], x["k"], x["v"], x["raw_g"], x["raw_beta"], x["A_log"], x["g_bias"],
                                       initial_state=h0, output_final_state=True, lower_bound=lower_bound,
                                       use_qk_l2norm_in_kernel=True, cu_seqlens=x["cu_seqlens"])


def _check_walk(emu: Emu, seqlens, H, seed):
    """Output and final state of intra + walk against the float64 prefill, a dense h0 with a padded head
    stride; every output element written, a T = 0 sequence's state passed through bit for bit."""
    K, V = emu.K, emu.V
    x = make(seqlens, H, K, V, seed=seed, dtype=emu.tdtype)
    N = len(seqlens)
    h0 = (torch.randn(N, H, V * K + 64, generator=torch.Generator().manual_seed(seed + 1)) * 0.1)[..., :V * K]
    h0 = h0.unflatten(-1, (V, K))  # rows dense, heads V K + 64 apart
    ws = _intra(emu, x, -5.0)
    o, ht = _walk(emu, x, ws, h0=h0)
    ro, rf = _reference(x, h0)
    assert not bool(torch.isnan(o).any()) and not bool(torch.isnan(ht).any())
    eo, es = rel_l2(o, ro), rel_l2(ht, rf)
    print(f"[walk {emu.layer} k{K} v{V} {emu.dtype}] o rel_l2={eo:.3e} state rel_l2={es:.3e}")
    within("walk output", eo, _key(emu.dtype, "output"))
    within("walk final state", es, _key(emu.dtype, "final_state"))
    for n, t in enumerate(seqlens):
        if t == 0:
            assert torch.equal(ht[n], h0[n])
    return x, ws, h0, o


def test_walk_matches_reference(emu):
    """kda_walk_kernel on kda_intra's workspace: T = 1, T = 0 and lengths off the 16- and 64-row grids, K != V
    (several V slices where V is wide), and `out` as a strided view."""
    _needs_walk(emu)
    x, ws, h0, o = _check_walk(emu, [1, 0, 45, 83, 130], 2, 21)
    # `out` as a strided view (odd token stride, 2-byte aligned rows only): the same bits.
    o_odd, _ = _walk(emu, x, ws, h0=h0, odd_out=True)
    assert o_odd.stride(1) % 2 == 1 and torch.equal(o_odd, o)


def test_walk_cache_and_checkpoints(emu):
    """The paged cache in place (has_init False rows never read, a negative index neither read nor written, other
    rows untouched), and checkpoints: bit-identical to the final state of a prefill cut at the offset, nothing
    written for an offset off the 64-row grid or past the end, rows by ckpt_idx."""
    _needs_walk(emu)
    K, V = emu.K, emu.V
    x = make([130, 70, 64], 1, K, V, seed=23, dtype=emu.tdtype)
    gen = torch.Generator().manual_seed(24)
    cache = torch.randn(5, 1, V, K, generator=gen) * 0.1
    cache[3] = float("nan")  # the row of a sequence with has_init False
    before = cache.clone()
    ck = torch.full((4, 1, V, K), float("nan"))
    ws = _intra(emu, x, -5.0)
    o, _ = _walk(emu, x, ws, cache=cache, cache_idx=torch.tensor([1, 3, -1]),
                 has_init=torch.tensor([True, False, True]), ckpt=ck, ck_off=torch.tensor([128, 100, 64], dtype=torch.int32),
                 ck_idx=torch.tensor([2, 0, -1], dtype=torch.int32))
    h0 = torch.stack([before[1], torch.zeros_like(before[1]), torch.zeros_like(before[1])])
    ro, rf = _reference(x, h0)
    within("walk output (cache)", rel_l2(o, ro), _key(emu.dtype, "output"))
    within("cache row 1", rel_l2(cache[1], rf[0]), _key(emu.dtype, "final_state"))
    within("cache row 3", rel_l2(cache[3], rf[1]), _key(emu.dtype, "final_state"))
    for row in (0, 2, 4):
        assert torch.equal(cache[row], before[row])
    # Checkpoint of sequence 0 after 128 tokens: the state a prefill of its first 128 tokens ends with.
    xt = {n: (t[:, :128] if n in ("q", "k", "v", "raw_g", "raw_beta") else t) for n, t in x.items()}
    xt["cu_seqlens"] = torch.tensor([0, 128], dtype=torch.int32)
    _, ht = _walk(emu, xt, _intra(emu, xt, -5.0), h0=before[1:2])
    assert torch.equal(ck[2], ht[0])
    for row in (0, 1, 3):  # offset 100 off the grid; sequence 2's row -1; row 1 and 3 named by nobody
        assert bool(torch.isnan(ck[row]).all())


# Head dims and dtypes the spec does not ship, rendered into a temporary folder like a shipped variant: the
# extremes of kdagen.targets.hip_limits' range (K 32 and 256, V 16 and 256), K = 96 (its cumulative sum leaves
# lanes idle), V = 48 (a walk of 3 waves, 3 u columns per thread), K != V both ways, fp16 beside the shipped
# fp16 K = V = 128.
# K = V = 96 and K = 64 / V = 128: the head dims of tests/variant_cases.py ALL_TARGETS_VARIANTS the registry does not
# ship (K = V = 256 runs on gfx942 in its 8-wave kda_intra workgroup).
OFF_SPEC = [(32, 16, "bf16"), (96, 48, "fp16"), (160, 80, "bf16"), (256, 256, "bf16"), (256, 32, "fp16"),
            (96, 96, "bf16"), (64, 128, "bf16")]


def _render(K: int, V: int, dtype: str, target: str, out_dir: Path) -> tuple[Path, str]:
    v = VariantSpec(op="kda_chunk_fwd", label="off_spec", backend="hip", dtype=dtype, head_dim_k=K, head_dim_v=V,
                    chunk_size=64, targets=(target,), tuning=(), spec_path="tests/build/test_hip_emulated.py", line=0)
    text = render_template(make_env(ROOT), "hip/kda_chunk.hip.j2", hip_context(v, target, "// (test render)"), "test")
    src = out_dir / f"{v.name}__{target}.hip"
    src.write_text(text)
    return src, v.name


@pytest.mark.parametrize("layer", [layer for layer in LAYERS if layer != "fma"])
@pytest.mark.parametrize(("K", "V", "dtype"), OFF_SPEC, ids=lambda p: str(p))
def test_head_dims(K, V, dtype, layer, tmp_path):
    """intra (its workspace) and intra + walk (output and state) for head dims the spec does not declare,
    against float64."""
    src, name = _render(K, V, dtype, LAYERS[layer][1], tmp_path)
    emu = _load(src, name, K, V, dtype, layer, tmp_path)
    errs = _intra_errors(emu, make([1, 45, 83], 2, K, V, seed=43, dtype=emu.tdtype), -5.0)
    print(f"[intra {layer} k{K} v{V} {dtype}] " + " ".join(f"{n}={e:.3e}" for n, e in errs.items()))
    for n, e in errs.items():
        within(f"kda_intra {n}", e, _key(dtype, "intra_workspace"))
    _check_walk(emu, [0, 45, 83], 1, 41)
    # kda_intra_kernel's other design at these head dims too.
    wave = not TARGETS[LAYERS[layer][1]].hip_intra_wave
    other = _load(src, name, K, V, dtype, layer, tmp_path, wave)
    errs = _intra_errors(other, make([1, 45, 83], 2, K, V, seed=43, dtype=other.tdtype), -5.0)
    for n, e in errs.items():
        within(f"kda_intra {n} ({'wave' if wave else 'block'} design)", e, _key(dtype, "intra_workspace"))


def test_a_plan_runs_the_emulated_library_layer_after_layer(tmp_path, monkeypatch, set_interpreting):
    """plan.run through HipLibrary's bound launchers (jit_hip.HipLibrary.launcher) on the generated kernels (the
    sm90_mma layer): two layers with their own state caches and `out` (the second a strided view), each against the
    float64 prefill. What the plan binds once (workspace, metadata, routing) and what each layer passes (its
    tensors, strides, cache) reach the kernels by name."""
    import kdagen_kernels
    from kdagen.runtime import fused_choice, fused_path
    from kdagen.runtime.jit_hip import HipLibrary

    K = V = 64
    H = 2
    e = next(v for v in HIP_VARIANTS if (v.head_dim_k, v.head_dim_v, v.dtype) == (K, V, "bf16"))
    lib = HipLibrary(_compile(HIP / f"{e.name}__sm_90.hip", "sm90_mma", tmp_path), e.name, "sm_90")
    set_interpreting(True)  # CPU tensors past the plan's device check; no Triton kernel runs
    monkeypatch.setattr(fused_choice, "fused_target", lambda device: "sm_90")
    monkeypatch.setattr(fused_choice, "_fused_libs", {})
    monkeypatch.setattr(fused_path, "load_fused", lambda *a, **kw: lib)
    x = make([45, 83], H, K, V, seed=31)
    T = x["q"].shape[1]
    plan = kdagen_kernels.plan_kda_prefill(
        x["cu_seqlens"], num_heads=H, head_dim_k=K, head_dim_v=V, lower_bound=-5.0, has_g_bias=True,
        use_qk_l2norm_in_kernel=True, state_indices=torch.tensor([2, 0], dtype=torch.int32),
        has_initial_state=torch.tensor([True, False]), pipeline="hip_intra+hip_walk")
    (pair,) = plan.program.walks[2]  # both kernels in one C call: kda_pair_launch
    assert plan.pipeline.name == "hip_intra+hip_walk" and isinstance(pair, fused_path.HipPairLaunch)
    assert plan.program.intra is None and pair.intra.lib is lib
    for layer in range(2):
        cache = torch.randn(3 + layer, H, V, K, generator=torch.Generator().manual_seed(40 + layer)) * 0.1
        before = cache.clone()
        out = torch.full((1, T, H, V + 8 * layer), float("nan"), dtype=torch.bfloat16)[..., :V]
        o, final = plan.run(x["q"], x["k"], x["v"], x["raw_g"], x["raw_beta"], x["A_log"], x["g_bias"], out=out,
                            state_cache=cache)
        assert o is out and final is None
        ro, rf = _reference(x, torch.stack([before[2], torch.zeros(H, V, K)]))
        within(f"layer {layer} output", rel_l2(o, ro), _key("bf16", "output"))
        within(f"layer {layer} cache row 2", rel_l2(cache[2], rf[0]), _key("bf16", "final_state"))
        within(f"layer {layer} cache row 0", rel_l2(cache[0], rf[1]), _key("bf16", "final_state"))
        for row in range(1, 3 + layer, 2):  # rows no sequence routes to: untouched
            assert torch.equal(cache[row], before[row])


def test_the_pair_launch_is_the_two_launches(tmp_path, monkeypatch, set_interpreting):
    """kda_pair_launch (one C call, Note [Pair record]) writes the bits the two launchers write, on the generated
    kernels (sm90_mma layer): a dense initial and final state, checkpoints, fp32 gate and beta projections (the
    pair converts them to the I/O dtype like HipIntraLaunch) and no g_bias; then with g_bias and no initial state.
    A field the pair unpacked from the wrong place would differ."""
    import kdagen_kernels
    from kdagen.runtime import fused_choice, fused_path
    from kdagen.runtime.jit_hip import HipLibrary

    K = V = 64
    H = 2
    e = next(v for v in HIP_VARIANTS if (v.head_dim_k, v.head_dim_v, v.dtype) == (K, V, "bf16"))
    lib = HipLibrary(_compile(HIP / f"{e.name}__sm_90.hip", "sm90_mma", tmp_path), e.name, "sm_90")
    set_interpreting(True)
    monkeypatch.setattr(fused_choice, "fused_target", lambda device: "sm_90")
    monkeypatch.setattr(fused_choice, "_fused_libs", {})
    monkeypatch.setattr(fused_path, "load_fused", lambda *a, **kw: lib)
    x = make([45, 140], H, K, V, seed=37)
    T = x["q"].shape[1]
    for bias, h0 in ((False, True), (True, False)):
        plan = kdagen_kernels.plan_kda_prefill(
            x["cu_seqlens"], num_heads=H, head_dim_k=K, head_dim_v=V, lower_bound=-5.0, has_g_bias=bias,
            use_qk_l2norm_in_kernel=True, output_final_state=True, pipeline="hip_intra+hip_walk",
            checkpoint_offsets=torch.tensor([0, 64], dtype=torch.int32))  # sequence 1's row
        (pair,) = plan.program.walks[int(h0)]
        assert isinstance(pair, fused_path.HipPairLaunch)
        initial = torch.randn(2, H, V, K, generator=torch.Generator().manual_seed(38)) * 0.1 if h0 else None
        results = []
        for two_launches in (False, True):
            with monkeypatch.context() as m:
                if two_launches:
                    m.setattr(fused_path.HipPairLaunch, "__call__",
                              lambda self, values, key=None, ptrs=None: (self.intra(values), self.walk(values)))
                out = torch.full((1, T, H, V), float("nan"), dtype=torch.bfloat16)
                ck = torch.full((2, H, V, K), float("nan"))
                o, final = plan.run(x["q"], x["k"], x["v"], x["raw_g"].float(), x["raw_beta"].float(), x["A_log"],
                                    x["g_bias"] if bias else None, initial_state=initial, out=out,
                                    checkpoint_state=ck)
                results.append((o, final, ck))
        (o1, f1, c1), (o2, f2, c2) = results
        assert not bool(torch.isnan(o1).any()) and not bool(torch.isnan(c1[1]).any())
        assert torch.equal(o1, o2) and torch.equal(f1, f2)
        assert torch.allclose(c1, c2, rtol=0, atol=0, equal_nan=True)  # row 0 (no checkpoint) NaN in both
        ro, rf = _reference({**x, "g_bias": x["g_bias"] if bias else None}, initial)
        within("pair output", rel_l2(o1, ro), _key("bf16", "output"))
        within("pair final state", rel_l2(f1, rf), _key("bf16", "final_state"))
