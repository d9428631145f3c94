# SPDX-License-Identifier: Apache-2.0
"""Kernel ABIs as data: one declaration per kernel renders every binding of it.

Note [Kernel ABI]
    A kernel's parameters are declared once, in order, as `Param`s of a `KernelABI` (kernels/kda.py for the
    Triton kernels, kernels/hip.py for the fused path's extern "C" launchers). From that one declaration come:
    the Triton kernel's signature (the templates call `triton_params`), the positional launch arguments
    (`bind`, used by runtime/launch.py), the AOT signature dicts (`aot_signature`, kdagen/aot.py), the HIP
    launchers' C parameter lists (`c_params`) and ctypes argtypes (`ctypes_types`), and the HIP kernels' argument
    structs (kernels/hip.py ArgStruct, through `c_decl`). Adding an argument touches the declaration and the
    kernel body only; tests/unit/test_kernel_abi.py checks that every
    generated kernel's signature is its declaration's.

Dependency-free (no torch, triton, Jinja): the generator and the runtime both import it.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

ParamKind = Literal["ptr", "int", "float", "constexpr", "stream"]

# Element types a pointer can have, in Triton's AOT spelling; "io" is the variant's I/O dtype (bf16 / fp16).
PTR_DTYPES = ("io", "bf16", "fp32", "i32", "i64", "i1", "u8")
INT_TYPES = {"i32": ("int32_t", ctypes.c_int32), "i64": ("int64_t", ctypes.c_int64)}
C_PTR_TYPES = {"io": "kda_io_t", "bf16": "kda_bf16", "fp32": "float", "i32": "int32_t", "i64": "int64_t", "i1": "uint8_t",
               "u8": "uint8_t"}


@dataclass(frozen=True)
class Param:
    """One kernel parameter.

    kind: "ptr" (a tensor, `dtype` its element type, `writes` whether the kernel stores through it),
    "int" (`dtype` i32 or i64), "float" (fp32), "constexpr" (a Triton compile-time constant) or "stream"
    (a C launcher's cudaStream_t / hipStream_t, passed as `void*`).
    """

    name: str
    kind: ParamKind
    dtype: str = ""
    writes: bool = False
    doc: str = ""
    specialize: bool = True  # False: int values Triton must not specialise on (do_not_specialize)
    # An int's value in a call on contiguous tensors, as Triton's JIT specialises it: "one" (== 1, a constant),
    # "aligned" (a multiple of 16) or "any". The offline builds (kdagen.aot) model that call.
    typical: str = "any"

    def __post_init__(self) -> None:
        ok = {"ptr": self.dtype in PTR_DTYPES, "int": self.dtype in INT_TYPES, "float": self.dtype == "fp32",
              "constexpr": self.dtype == "", "stream": self.dtype == ""}.get(self.kind, False)
        ok = ok and self.typical in ("any", "aligned", "one") and (self.kind == "int" or self.typical == "any")
        if not ok or not self.name.isidentifier():
            raise ValueError(f"bad kernel parameter {self!r}")


def ptr(name: str, dtype: str, *, writes: bool = False, doc: str = "") -> Param:
    return Param(name, "ptr", dtype, writes, doc)


def i32(name: str, doc: str = "", *, specialize: bool = True, typical: str = "any") -> Param:
    return Param(name, "int", "i32", doc=doc, specialize=specialize, typical=typical)


def i64(name: str, doc: str = "") -> Param:
    return Param(name, "int", "i64", doc=doc)


def f32(name: str, doc: str = "") -> Param:
    return Param(name, "float", "fp32", doc=doc)


def constexpr(name: str, doc: str = "") -> Param:
    return Param(name, "constexpr", doc=doc)


class ABIError(TypeError):
    """A launch's arguments do not match the kernel's declaration (a bug in kdagen, never a user error)."""


@dataclass(frozen=True)
class KernelABI:
    name: str
    params: tuple[Param, ...]

    def __post_init__(self) -> None:
        names = [p.name for p in self.params]
        if len(set(names)) != len(names):
            raise ValueError(f"{self.name}: duplicate parameter names in {names}")
        seen_const = False
        for p in self.params:
            seen_const |= p.kind == "constexpr"
            if seen_const and p.kind != "constexpr":
                # Launches pass runtime arguments positionally and constexprs by keyword.
                raise ValueError(f"{self.name}: runtime parameter {p.name} after a constexpr")
        # Cached on the instance (frozen): bind() runs on every launch.
        object.__setattr__(self, "_runtime", tuple(p.name for p in self.params if p.kind != "constexpr"))
        object.__setattr__(self, "_constexprs", frozenset(p.name for p in self.params if p.kind == "constexpr"))

    @property
    def runtime_names(self) -> tuple[str, ...]:
        return self._runtime  # type: ignore[attr-defined]

    @property
    def constexpr_names(self) -> frozenset[str]:
        return self._constexprs  # type: ignore[attr-defined]

    # ---- Triton
    def triton_params(self, indent: str = "    ", width: int = 100) -> str:
        """The body of the `@triton.jit def name(...)` parameter list: runtime parameters wrapped at
        `width` columns, then one `NAME: tl.constexpr,` per line."""
        lines: list[str] = []
        line = ""
        for p in self.params:
            if p.kind == "constexpr":
                continue
            if line and len(indent) + len(line) + len(p.name) + 2 > width:
                lines.append(line.rstrip())
                line = ""
            line += p.name + ", "
        if line:
            lines.append(line.rstrip())
        lines += [f"{p.name}: tl.constexpr," for p in self.params if p.kind == "constexpr"]
        return "\n".join(indent + line for line in lines)

    def do_not_specialize(self) -> list[str]:
        """Integer parameters Triton must not specialise on (== 1, % 16): a value that changes with the
        batch would otherwise mean another compile."""
        return [p.name for p in self.params if not p.specialize]

    def bind(self, args: Mapping[str, object]) -> list[object]:
        """The runtime arguments in declaration order (constexprs are passed by keyword)."""
        try:
            out = [args[n] for n in self._runtime]  # type: ignore[attr-defined]
        except KeyError as exc:
            raise ABIError(f"{self.name}: no value for parameter {exc.args[0]}") from None
        if len(args) != len(out):
            extra = sorted(set(args) - set(self._runtime))  # type: ignore[attr-defined]
            raise ABIError(f"{self.name}: arguments {extra} are not runtime parameters of this kernel")
        return out

    def check_constexprs(self, values: Mapping[str, object]) -> None:
        if set(values) != self.constexpr_names:
            raise ABIError(f"{self.name}: constexprs {sorted(values)} given, declared {sorted(self.constexpr_names)}")

    def aot_signature(self, io_dtype: str) -> dict[str, str]:
        """Triton's AOT signature: {name: "*bf16" | "i32" | "fp32" | "constexpr"}."""
        sig = {}
        for p in self.params:
            if p.kind == "ptr":
                sig[p.name] = "*" + (io_dtype if p.dtype == "io" else p.dtype)
            elif p.kind == "constexpr":
                sig[p.name] = "constexpr"
            else:
                sig[p.name] = p.dtype
        return sig

    def aot_specialization(self, *, buffer_ops: bool = False) -> tuple[dict[str, int], dict[tuple[int], list]]:
        """What Triton's JIT specialises on in a call on contiguous, 16-byte aligned tensors, for an offline
        build of that call: the ints that are 1 there (constexprs {name: 1}) and the attributes (by parameter
        index) of the 16-divisible pointers and ints; with buffer_ops (AMD's default for tensors within
        2 GiB) pointers also get the 32-bit range that lets the backend use buffer loads and stores."""
        ones: dict[str, int] = {}
        attrs: dict[tuple[int], list] = {}
        for i, p in enumerate(self.params):
            if p.kind == "ptr":
                attrs[(i,)] = [["tt.divisibility", 16]] + ([["tt.pointer_range", 32]] if buffer_ops else [])
            elif p.kind == "int" and p.specialize and p.typical == "one":
                ones[p.name] = 1
            elif p.kind == "int" and p.specialize and p.typical == "aligned":
                attrs[(i,)] = [["tt.divisibility", 16]]
        return ones, attrs

    # ---- C (the HIP launchers)
    def c_params(self, indent: str = "    ") -> str:
        """The extern "C" parameter list; pointers are typed by dtype, const unless written."""
        return (",\n" + indent).join(c_decl(p, self.name) for p in self.params)

    def ctypes_types(self) -> list[type]:
        types: list[type] = []
        for p in self.params:
            if p.kind in ("ptr", "stream"):
                types.append(ctypes.c_void_p)
            elif p.kind == "int":
                types.append(INT_TYPES[p.dtype][1])
            elif p.kind == "float":
                types.append(ctypes.c_float)
            else:
                raise ValueError(f"{self.name}: a C launcher has no constexpr parameters ({p.name})")
        return types


def c_decl(p: Param, owner: str = "") -> str:
    """`p` as a C declaration (a launcher parameter or an argument struct's field): pointers typed by dtype,
    const unless written, the stream as void*."""
    if p.kind == "ptr":
        return f"{'' if p.writes else 'const '}{C_PTR_TYPES[p.dtype]}* {p.name}"
    if p.kind == "int":
        return f"{INT_TYPES[p.dtype][0]} {p.name}"
    if p.kind == "stream":
        return f"void* {p.name}"
    if p.kind == "float":
        return f"float {p.name}"
    raise ValueError(f"{owner or 'C'}: a C declaration has no constexpr parameters ({p.name})")
