# SPDX-License-Identifier: Apache-2.0
"""The op's arguments as data: one declaration renders every signature of chunk_kda_prefill.

Note [Op schema]
    `OP_ARGS` lists vLLM's Kimi-K3 prefill op's arguments in its order, each with its Python type, default,
    role and whether the op writes through it; `PLAN_ARGS` lists `plan_kda_prefill`'s. From them come: the
    generated package's `chunk_kda_prefill` and `plan_kda_prefill` (signatures, docstrings and forwarding
    calls, templates/package/__init__.py.j2), the torch custom op's schema (`custom_op_schema`,
    runtime/custom_op.py), `KdaPrefillPlan.run`'s arguments (the "layer" role, `RUN_ARGS`) and the table in
    docs/reference.md (`markdown_table`). tests/unit/test_op_schema.py checks that each of these, and the
    float64 reference's signature (`REFERENCE_ARGS`), is what this module declares.

    Roles: "layer" arguments change with every layer (the projections and the layer's buffers); "batch"
    arguments are fixed by the batch (metadata, state and checkpoint routing, gate form, flags) and become
    plan arguments; "plan" arguments exist only on `plan_kda_prefill`.

Dependency-free (no torch, Jinja): the generator and the runtime both import it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Role = Literal["layer", "batch", "plan"]
REQUIRED = "<required>"  # the default of an argument without one

# Python annotation -> the torch schema type of a custom op argument.
_TORCH_TYPES = {"torch.Tensor": "Tensor", "torch.Tensor | None": "Tensor?", "float | None": "float?",
                "bool": "bool", "int": "int", "int | None": "int?"}


@dataclass(frozen=True)
class Arg:
    """One argument. `default` is its Python source (REQUIRED: none); `mutated`: the op writes through it;
    `kernel_only`: the float64 reference does not take it (it only shapes the kernels' launches)."""

    name: str
    type: str
    default: str
    role: Role
    doc: str
    mutated: bool = False
    kernel_only: bool = False

    def __post_init__(self) -> None:
        if not self.name.isidentifier() or self.role not in ("layer", "batch", "plan") or not self.doc:
            raise ValueError(f"bad op argument {self!r}")

    @property
    def required(self) -> bool:
        return self.default == REQUIRED

    def param(self) -> str:
        """`name: type` or `name: type = default`, as a Python parameter."""
        return f"{self.name}: {self.type}" + ("" if self.required else f" = {self.default}")


def _a(name: str, type_: str, default: str, role: Role, doc: str, **kw: bool) -> Arg:
    return Arg(name, type_, default, role, doc, **kw)


T, TN = "torch.Tensor", "torch.Tensor | None"

OP_ARGS: tuple[Arg, ...] = (
    _a("q", T, REQUIRED, "layer", "query tensor, ``[1, T, H, K]`` (``[B, T, H, K]`` without ``cu_seqlens``)."),
    _a("k", T, REQUIRED, "layer", "key tensor, ``[1, T, H, K]``."),
    _a("v", T, REQUIRED, "layer", "value tensor, ``[1, T, H, V]``."),
    _a("raw_g", T, REQUIRED, "layer",
       "raw gate projection ``[1, T, H, K]``, before the activation; may be a strided view."),
    _a("raw_beta", T, REQUIRED, "layer",
       "raw beta projection ``[1, T, H]``, before the sigmoid; may be a strided view."),
    _a("A_log", T, REQUIRED, "layer", "log of the per-head gate decay, ``[H]`` (a 1-D view must have stride 1)."),
    _a("g_bias", TN, "None", "layer",
       "optional per-head gate bias, ``[H * K]`` (a 1-D view must have stride 1)."),
    _a("scale", "float | None", "None", "layer",
       "scale applied to the query-key products. Defaults to ``k.shape[-1] ** -0.5``."),
    _a("initial_state", TN, "None", "layer",
       "fp32 per-sequence initial recurrent state ``[N, H, V, K]`` (V-first, each row's ``[V, K]`` dense), "
       "or ``None``."),
    _a("output_final_state", "bool", "False", "batch", "whether to return the final recurrent state."),
    _a("lower_bound", "float | None", "None", "batch",
       "if set, the gate is ``lower_bound * sigmoid(exp(A_log) * (raw_g + g_bias))``; otherwise "
       "``-exp(A_log) * softplus(raw_g + g_bias)``."),
    _a("use_qk_l2norm_in_kernel", "bool", "False", "batch", "fold the q/k L2 norm into the kernel."),
    _a("cu_seqlens", TN, "None", "batch", "int32/int64 cumulative sequence lengths ``[N + 1]`` (batch size 1)."),
    _a("chunk_indices", TN, "None", "batch", "precomputed chunk indices for ``cu_seqlens``.", kernel_only=True),
    _a("chunk_offsets", TN, "None", "batch", "per-sequence first chunk index ``[N + 1]``.", kernel_only=True),
    _a("use_fused_chunk", "bool", "False", "batch",
       "request the fused path. It is used only when every one of its preconditions holds "
       "(``use_qk_l2norm_in_kernel``, ``cu_seqlens``, ``lower_bound`` and ``g_bias`` given, a fused variant "
       "for this K, V, dtype and device); otherwise the Triton path runs unchanged. Without the compiler the "
       "fused variant needs, the Triton path runs and one warning says how to get it.", kernel_only=True),
    _a("out", TN, "None", "layer",
       "buffer the result must land in (may be a strided view, not one whose elements overlap); the result is "
       "``out`` itself. Without it the fused path writes the result into ``v`` when ``v`` is contiguous (as "
       "vLLM's op does), else into a new tensor.", mutated=True, kernel_only=True),
    _a("checkpoint_state", TN, "None", "layer",
       "destination for mid-prefill recurrent state snapshots ``[rows, H, V, K]`` fp32 (both paths; vLLM's op "
       "writes them on its fused path only). It may share memory with ``state_cache`` but no snapshot row may "
       "be a sequence's ``state_indices`` row, nor overlap ``initial_state``.", mutated=True),
    _a("checkpoint_offsets", TN, "None", "batch", "per-sequence token offset to snapshot at, ``0`` for none."),
    _a("checkpoint_state_indices", TN, "None", "batch", "optional per-sequence destination row."),
    _a("state_cache", TN, "None", "layer",
       "the paged recurrent state ``[slots, H, V, K]`` fp32, read and written in place; the returned final "
       "state is then ``None``.", mutated=True),
    _a("state_indices", TN, "None", "batch", "per-sequence cache row."),
    _a("has_initial_state", TN, "None", "batch",
       "per-sequence flag; false starts from a zero state and the row is not read."),
)
OP_RETURNS = "tuple[torch.Tensor, torch.Tensor | None]"
OP_RETURNS_DOC = "The output and, when requested, the final recurrent state."

# The custom op writes the final state into a buffer the wrapper allocates (an op may not return a new
# tensor and also write `out`, nor return None): it follows the op's arguments.
FINAL_STATE = Arg("final_state", TN, "None", "layer", "the final state's destination, ``[N, H, V, K]`` fp32.",
                  mutated=True, kernel_only=True)

# plan_kda_prefill: the first two positional, the rest keyword-only. A "batch" entry names an op argument
# (its type, default and doc are the op's); the others are plan-only.
_PLAN_ONLY: tuple[Arg, ...] = (
    _a("cu_seqlens_cpu", TN, "None", "plan",
       "a CPU copy of ``cu_seqlens``; its values are checked (free) and give ``num_tokens``. With a CPU "
       "``cu_seqlens`` the two must be equal."),
    _a("num_heads", "int", REQUIRED, "plan", "H, the heads of q, k and v."),
    _a("head_dim_k", "int", REQUIRED, "plan", "K, the key (and query) head dim."),
    _a("head_dim_v", "int", REQUIRED, "plan", "V, the value head dim."),
    _a("num_tokens", "int | None", "None", "plan",
       "the packed token count (with ``cu_seqlens``) or the tokens per sequence (without it)."),
    _a("batch_size", "int", "1", "plan", "sequences of ``num_tokens`` tokens each, without ``cu_seqlens``."),
    _a("dtype", "torch.dtype", "torch.bfloat16", "plan", "the I/O dtype of q, k and v (bfloat16 or float16)."),
    _a("device", "torch.device | str | None", "None", "plan",
       "where the batch runs; None: ``cu_seqlens``'s device, else the current GPU, else the CPU."),
    _a("has_g_bias", "bool", "False", "plan", "whether ``run`` gets a ``g_bias`` (the gate form is fixed per plan)."),
    _a("groups", "int | None", "None", "plan",
       "the recurrence's group count (None: the cost model's; 1: the plain walk, batch-invariant and "
       "bit-identical to a prefill cut at a checkpoint)."),
    _a("workspace", TN, "None", "plan",
       "a contiguous uint8 buffer of at least ``plan.workspace_bytes`` on the device, reused by every run "
       "(runs of one plan must not overlap in time); None: the plan allocates it."),
    _a("tuning", "Mapping[str, int] | None", "None", "plan",
       "the Triton launches' knobs (warps, stages, ...), replacing the spec's for this target; None: the "
       "spec's."),
    _a("design", "str | None", "None", "plan",
       "the Triton path's chunk-parallel kernels: \"intra\" (one kernel on 16- or 32-row programs; bounded "
       "gate with lower_bound >= -5.41 and the L2 norm in kernel) or \"pair\" (two kernels on whole chunks, "
       "any gate); None: the plan's choice (\"intra\" wherever it fits)."),
    _a("chunk_size", "int | None", "None", "plan",
       "run the variant of this chunk size; None: the registry's choice."),
    _a("pipeline", "str | None", "None", "plan",
       "the kernels to run, \"<chunk>+<walk>\" with chunk one of triton_intra, triton_pair, hip_intra and "
       "walk one of triton_walk, hip_walk; None or \"auto\": the plan's choice."),
)
_OP = {a.name: a for a in OP_ARGS}
_PLAN = {a.name: a for a in _PLAN_ONLY}
PLAN_POSITIONAL = ("cu_seqlens", "cu_seqlens_cpu")
_PLAN_ORDER = (
    *PLAN_POSITIONAL, "num_heads", "head_dim_k", "head_dim_v", "num_tokens", "batch_size", "dtype", "device",
    "lower_bound", "has_g_bias", "use_qk_l2norm_in_kernel", "chunk_indices", "chunk_offsets", "state_indices",
    "has_initial_state", "output_final_state", "checkpoint_offsets", "checkpoint_state_indices",
    "use_fused_chunk", "groups", "workspace", "tuning", "design", "chunk_size", "pipeline",
)
PLAN_ARGS: tuple[Arg, ...] = tuple(_PLAN.get(n) or _OP[n] for n in _PLAN_ORDER)

# KdaPrefillPlan.run: the op's "layer" arguments, the first seven positional, the rest keyword-only; the
# output and the state buffers are the caller's per layer.
RUN_POSITIONAL = ("q", "k", "v", "raw_g", "raw_beta", "A_log", "g_bias")
RUN_ARGS: tuple[Arg, ...] = tuple(a for a in OP_ARGS if a.role == "layer")
# The float64 reference (kdagen.reference.chunk_kda_prefill_reference) takes the op's arguments but the
# kernel-only ones.
REFERENCE_ARGS: tuple[Arg, ...] = tuple(a for a in OP_ARGS if not a.kernel_only)


def _check() -> None:
    names = [a.name for a in OP_ARGS]
    assert len(set(names)) == len(names), names
    assert all(a.role != "plan" for a in OP_ARGS)
    assert {a.name for a in RUN_ARGS} >= set(RUN_POSITIONAL)
    # Every batch argument is a plan argument: nothing the plan fixes is left to each call.
    assert {a.name for a in OP_ARGS if a.role == "batch"} <= set(_PLAN_ORDER), "a batch argument is no plan argument"


_check()


def custom_op_schema() -> str:
    """The custom op's torch schema: the op's arguments plus an int `registry` (which generated package)
    first and `final_state` last, mutated ones aliased (a!), `out` required, no defaults (the wrapper
    passes every argument)."""
    parts = ["int registry"]
    aliases = iter("abcdefgh")
    for a in (*OP_ARGS, FINAL_STATE):
        t = _TORCH_TYPES[a.type]
        if a.name == "out":
            t = "Tensor"  # the wrapper always picks the destination
        if a.mutated:
            t = t.replace("Tensor", f"Tensor({next(aliases)}!)")
        parts.append(f"{t} {a.name}")
    return f"({', '.join(parts)}) -> ()"


def call_kwargs(args: tuple[Arg, ...]) -> str:
    """`a=a, b=b, ...`: a forwarding call's keyword arguments."""
    return ", ".join(f"{a.name}={a.name}" for a in args)


def mutated_names() -> tuple[str, ...]:
    """The custom op's mutated arguments."""
    return tuple(a.name for a in (*OP_ARGS, FINAL_STATE) if a.mutated)


def markdown_table() -> str:
    """docs/reference.md's argument table (tests/unit/test_op_schema.py keeps the doc equal to it)."""
    def typ(a: Arg) -> str:
        return a.type.replace("|", "\\|")  # a bare | would end the cell

    rows = ["| argument | type | default | role | written |", "|---|---|---|---|---|"]
    for a in OP_ARGS:
        rows.append(f"| `{a.name}` | `{typ(a)}` | {'required' if a.required else f'`{a.default}`'} | {a.role} | "
                    f"{'yes' if a.mutated else ''} |")
    rows.append("")
    rows.append("| `plan_kda_prefill` only | type | default |")
    rows.append("|---|---|---|")
    for a in PLAN_ARGS:
        if a.role == "plan":
            rows.append(f"| `{a.name}` | `{typ(a)}` | {'required' if a.required else f'`{a.default}`'} |")
    return "\n".join(rows) + "\n"
