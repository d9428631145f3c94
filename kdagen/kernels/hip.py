# SPDX-License-Identifier: Apache-2.0
"""The fused HIP path's extern "C" launchers (templates/hip/kda_chunk.hip.j2), the kernels' argument
structs and the pair launch's records, declared once. See Note [Kernel ABI]: the template renders the
launchers' C parameter lists, the structs (kda::IntraArgs, kda::WalkArgs), the records and the packing of one
into the other from here; runtime/jit_hip.py takes their ctypes argtypes, runtime/fused_path.py and the CPU
emulation tests bind their arguments by name.

Changing a launcher's parameters or a record's fields (names aside) changes the C ABI: bump
kdagen.targets.HIP_ABI. Strides are in elements. The workspace (qg, w, kg, u, aqk) is bf16 whatever the I/O
dtype (kda_common.h).

Note [Pair record]
    The fused plan's hip_intra + hip_walk run is one C call, kda_pair_launch(run, plan): `run` points at a
    PairRun record that fused_path.HipPairLaunch packs per call (struct.Struct, a fresh bytes object: thread
    safe) from the two launchers' per-run values (INTRA_RUN, WALK_RUN; scale and stream are one value for
    both); `plan` at a PairPlan record of their plan-time values (prefixed intra_ / walk_), packed once when
    the plan is made and kept alive by it. Both records' C structs and the unpacking into IntraArgs /
    WalkArgs are rendered from here, with a static_assert per field offset, so the compiler checks every
    build against the layout Python packs. Fields go 8-byte ones first, then 4-byte ones, then padding to
    8: the natural C layout, with no padding inside.
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from .schema import KernelABI, Param, c_decl, f32, i32, i64, ptr

STREAM = Param("stream", "stream", doc="cudaStream_t / hipStream_t, null for the default stream")

KDA_INTRA_LAUNCH = KernelABI("kda_intra_launch", (
    ptr("q", "io"), ptr("k", "io"), ptr("v", "io"),
    ptr("g", "io", doc="the raw gate, in the I/O dtype like q"), ptr("beta", "io", doc="raw beta, in the I/O dtype"),
    ptr("A_log", "fp32", doc="[H]; clamped to at most 80 before exp (kda_intra.h)"),
    ptr("g_bias", "fp32", doc="[H * K], or null"),
    ptr("cu_seqlens", "i32"), ptr("chunk_indices", "i32"),
    ptr("qg", "bf16", writes=True, doc="[T, H, K]"), ptr("w", "bf16", writes=True, doc="[T, H, K]"),
    ptr("kg", "bf16", writes=True, doc="[T, H, K]"), ptr("u", "bf16", writes=True, doc="[T, H, V]"),
    ptr("aqk", "bf16", writes=True, doc="[T, H, 16]"),
    ptr("decay", "fp32", writes=True, doc="[num_chunks * chunk / 16, H, K]"),
    i64("sq_t"), i64("sq_h"), i64("sk_t"), i64("sk_h"), i64("sv_t"), i64("sv_h"), i64("sg_t"), i64("sg_h"),
    i64("sb_t"), i64("sb_h"),
    i64("num_chunks", doc="metadata chunks (chunk_indices rows)"), i32("H"), f32("scale"),
    f32("lower_bound", "the bounded gate's bound; q and k are L2-normed in the kernel"),
    STREAM,
))

KDA_WALK_LAUNCH = KernelABI("kda_walk_launch", (
    ptr("qg", "bf16"), ptr("w", "bf16"), ptr("kg", "bf16"), ptr("u", "bf16"), ptr("aqk", "bf16", doc="[T, H, 16]"),
    ptr("decay", "fp32", doc="[num_chunks * chunk / 16, H, K]"),
    ptr("out", "io", writes=True), i64("so_t"), i64("so_h"),
    ptr("cu_seqlens", "i32"), ptr("chunk_offsets", "i64", doc="metadata chunks before each sequence"),
    ptr("h0", "fp32", doc="initial state: dense [N, H, V, K] or the paged cache, or null"), i64("sh0_n"), i64("sh0_h"),
    i32("state_in", "0 zeros, 1 dense h0[n], 2 paged h0[state_idx[n]] when has_init[n]"),
    ptr("ht", "fp32", writes=True, doc="final state: dense or the paged cache (may be h0), or null"),
    i64("sht_n"), i64("sht_h"), i32("state_out", "0 none, 1 dense ht[n], 2 paged ht[state_idx[n]]"),
    ptr("state_idx", "i32"), i64("n_slots"), ptr("has_init", "u8"),
    ptr("ckpt", "fp32", writes=True, doc="checkpoint rows [n_ckpt_rows, H, V, K], or null"),
    i64("sck_n"), i64("n_ckpt_rows"), ptr("ckpt_off", "i32"),
    ptr("ckpt_idx", "i32", doc="null: row = sequence index"),
    i64("num_seqs"), i32("H"), f32("scale"),
    STREAM,
))

LAUNCHERS: dict[str, KernelABI] = {k.name: k for k in (KDA_INTRA_LAUNCH, KDA_WALK_LAUNCH)}


@dataclass(frozen=True)
class ArgStruct:
    """A kernel's argument struct: its launcher's parameters but `launch_only` (the launch sequence,
    include/kda_launch.h, takes those itself), in order, then `kernel_only` fields the launch sequence sets."""

    name: str  # in namespace kda
    abi: KernelABI
    launch_only: tuple[str, ...]
    kernel_only: tuple[Param, ...] = ()

    def __post_init__(self) -> None:
        unknown = set(self.launch_only) - {p.name for p in self.abi.params}
        if unknown:
            raise ValueError(f"{self.name}: launch_only names {sorted(unknown)} are not parameters of {self.abi.name}")

    def fields(self) -> list[Param]:
        return [p for p in self.abi.params if p.name not in self.launch_only] + list(self.kernel_only)

    def c_body(self, indent: str = "  ") -> str:
        """One `type name;  // doc` line per field."""
        return "\n".join(indent + c_decl(p) + ";" + (f"  // {p.doc}" if p.doc else "") for p in self.fields())

    def c_packing(self, var: str = "a", indent: str = "  ", width: int = 100) -> str:
        """`a.q = q; a.k = k; ...` for every field the launcher passes, wrapped at `width` columns (the C
        types are the same declarations)."""
        lines, line = [], ""
        for p in self.abi.params:
            if p.name in self.launch_only:
                continue
            stmt = f"{var}.{p.name} = {p.name};"
            if line and len(indent) + len(line) + 1 + len(stmt) > width:
                lines.append(line)
                line = ""
            line = f"{line} {stmt}" if line else stmt
        if line:
            lines.append(line)
        return "\n".join(indent + line for line in lines)


STRUCTS: dict[str, ArgStruct] = {s.abi.name: s for s in (
    ArgStruct("IntraArgs", KDA_INTRA_LAUNCH, ("num_chunks", "stream"), (
        i32("n_items", "walk chunks x H, below 2^31"),
        i32("vec", "bit i: projection i (g, q, k, v) takes whole-run loads (intra_vec)"),
    )),
    ArgStruct("WalkArgs", KDA_WALK_LAUNCH, ("stream",)),
)}

# The per-run values of each launcher (the plan binds the others once): the order in which
# fused_path.HipIntraLaunch / HipWalkLaunch pass them to jit_hip.HipLibrary.launcher.
INTRA_RUN = ("q", "k", "v", "g", "beta", "A_log", "g_bias", "sq_t", "sq_h", "sk_t", "sk_h", "sv_t", "sv_h", "sg_t",
             "sg_h", "sb_t", "sb_h", "scale", "stream")
WALK_RUN = ("out", "so_t", "so_h", "h0", "ht", "sh0_n", "sh0_h", "sht_n", "sht_h", "n_slots", "ckpt", "sck_n",
            "n_ckpt_rows", "scale", "stream")

# struct codes (little-endian, no implicit padding) and sizes of a record field by kind / dtype.
_CODES = {"ptr": ("Q", 8), "stream": ("Q", 8), "i64": ("q", 8), "i32": ("i", 4), "float": ("f", 4)}


def _code(p: Param) -> tuple[str, int]:
    return _CODES[p.dtype if p.kind == "int" else p.kind]


@dataclass(frozen=True)
class Record:
    """A packed argument record: a C struct (namespace kda) and the struct.Struct that packs it, from one list
    of fields, 8-byte ones first (stable), then 4-byte ones, then padding to 8 (Note [Pair record])."""

    name: str
    fields: tuple[Param, ...]
    packer: struct.Struct = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        ordered = tuple(sorted(self.fields, key=lambda p: -_code(p)[1]))
        names = [p.name for p in ordered]
        if len(set(names)) != len(names):
            raise ValueError(f"{self.name}: duplicate fields in {names}")
        codes = "".join(_code(p)[0] for p in ordered)
        size = struct.calcsize("<" + codes)
        object.__setattr__(self, "fields", ordered)
        object.__setattr__(self, "packer", struct.Struct("<" + codes + "x" * (-size % 8)))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.fields)

    def offsets(self) -> dict[str, int]:
        out, at = {}, 0
        for p in self.fields:
            out[p.name] = at
            at += _code(p)[1]
        return out

    def pack(self, values: Mapping[str, object]) -> bytes:
        """The record from its fields' values by name (None: a null pointer); for plan-time records, a run's
        record is packed positionally (fused_path.HipPairLaunch)."""
        missing, extra = set(self.names) - set(values), set(values) - set(self.names)
        if missing or extra:
            raise ValueError(f"{self.name}: no value for {sorted(missing)}; {sorted(extra)} are not fields")
        return self.packer.pack(*(0 if values[n] is None else values[n] for n in self.names))

    def c_body(self, indent: str = "  ") -> str:
        return "\n".join(f"{indent}{c_decl(p)};" for p in self.fields)

    def c_asserts(self, width: int = 100) -> str:
        """One static_assert that the C struct has the size and field offsets that `packer` writes."""
        terms = [f"sizeof(kda::{self.name}) == {self.packer.size}"]
        terms += [f"offsetof(kda::{self.name}, {n}) == {o}" for n, o in self.offsets().items()]
        return f"static_assert({_wrap(terms, ' &&', '              ', width)},\n              \"{self.name}: " \
               "the layout kdagen/kernels/hip.py packs\");"


def _wrap(items: list[str], sep: str, indent: str, width: int) -> str:
    """`items` joined by `sep` + space, wrapped at `width` columns onto lines starting with `indent`."""
    lines, line = [], ""
    for i, item in enumerate(items):
        item += sep if i < len(items) - 1 else ""
        if line and len(indent) + len(line) + 1 + len(item) > width:
            lines.append(line)
            line = ""
        line = f"{line} {item}" if line else item
    return ("\n" + indent).join(lines + [line])


@dataclass(frozen=True)
class PairLaunch:
    """kda_pair_launch(run, plan): kda_intra_kernel then kda_walk_kernel on the run's stream, in one C call,
    from the two records (Note [Pair record])."""

    name: str
    intra: ArgStruct
    walk: ArgStruct
    intra_run: tuple[str, ...]
    walk_run: tuple[str, ...]
    run: Record = field(init=False, repr=False, compare=False)
    plan: Record = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        stages = ((self.intra, self.intra_run), (self.walk, self.walk_run))
        run: dict[str, Param] = {}
        for st, names in stages:
            params = {p.name: p for p in st.abi.params}
            for n in names:
                if run.setdefault(n, params[n]) != params[n]:
                    raise ValueError(f"{self.name}: per-run {n} differs between the launchers")
        plan = [replace(p, name=f"{self._prefix(st)}{p.name}") for st, names in stages
                for p in st.abi.params if p.name not in names]
        object.__setattr__(self, "run", Record("PairRun", tuple(run.values())))
        object.__setattr__(self, "plan", Record("PairPlan", tuple(plan)))

    @staticmethod
    def _prefix(st: ArgStruct) -> str:
        return st.abi.name.removeprefix("kda_").removesuffix("_launch") + "_"

    def ctypes_types(self) -> list[type]:
        return [ctypes.c_char_p, ctypes.c_void_p]  # the run record (a bytes object), the plan record's address

    def c_params(self) -> str:
        return "const void* run, const void* plan"

    def c_unpacking(self, st: ArgStruct, var: str, indent: str = "  ", width: int = 100) -> str:
        """`a.q = r.q; a.cu_seqlens = p.intra_cu_seqlens; ...`: `st`'s launcher fields from the run record `r`
        and the plan record `p`, wrapped at `width` columns."""
        run = self.intra_run if st is self.intra else self.walk_run
        stmts = [f"{var}.{p.name} = {'r.' if p.name in run else 'p.' + self._prefix(st)}{p.name};"
                 for p in st.abi.params if p.name not in st.launch_only]
        return indent + _wrap(stmts, "", indent, width)


KDA_PAIR_LAUNCH = PairLaunch("kda_pair_launch", STRUCTS["kda_intra_launch"], STRUCTS["kda_walk_launch"], INTRA_RUN,
                             WALK_RUN)

# Every extern "C" entry with a launch's signature: name and ctypes_types() (the CPU emulation and the no-op
# library of tools/host_path_cost.py bind them all).
ENTRIES = (KDA_INTRA_LAUNCH, KDA_WALK_LAUNCH, KDA_PAIR_LAUNCH)

# The parameterless extern "C" queries of every library, with their ctypes return types.
QUERIES: dict[str, type] = {
    "kda_abi_version": ctypes.c_int, "kda_target": ctypes.c_char_p, "kda_variant": ctypes.c_char_p,
    "kda_head_dim_k": ctypes.c_int, "kda_head_dim_v": ctypes.c_int, "kda_chunk_size": ctypes.c_int,
    "kda_v_slice": ctypes.c_int, "kda_intra_smem_bytes": ctypes.c_int, "kda_walk_smem_bytes": ctypes.c_int,
    "kda_walk_threads": ctypes.c_int,
}
