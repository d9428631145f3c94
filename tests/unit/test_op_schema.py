# SPDX-License-Identifier: Apache-2.0
"""Every signature of the op is the op schema's (kernels/op_schema.py, Note [Op schema])."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import torch

import kdagen_kernels as kk
from kdagen.kernels import op_schema
from kdagen.reference import chunk_kda_prefill_reference
from kdagen.runtime import custom_op, planning
from kdagen.runtime.plan import KdaPrefillPlan

ROOT = Path(__file__).resolve().parents[2]
EMPTY = inspect.Parameter.empty


def _default(a: op_schema.Arg) -> object:
    return EMPTY if a.required else eval(a.default, {"torch": torch})  # noqa: S307 (our own literals)


def _params(fn, skip: int = 0) -> list[tuple[str, object, str]]:
    return [(p.name, p.default, p.kind.name) for p in list(inspect.signature(fn).parameters.values())[skip:]]


def test_the_wrapper_is_the_schema():
    want = [(a.name, _default(a), "POSITIONAL_OR_KEYWORD") for a in op_schema.OP_ARGS]
    assert _params(kk.chunk_kda_prefill) == want
    sig = inspect.signature(kk.chunk_kda_prefill)
    assert [str(p.annotation) for p in sig.parameters.values()] == [a.type for a in op_schema.OP_ARGS]
    assert sig.return_annotation == op_schema.OP_RETURNS
    doc = " ".join(kk.chunk_kda_prefill.__doc__.split())
    for a in op_schema.OP_ARGS:
        assert f"{a.name}: {' '.join(a.doc.split())}" in doc, a.name


def test_plan_kda_prefill_is_one_definition_the_schemas():
    n_pos = len(op_schema.PLAN_POSITIONAL)
    want = [(a.name, _default(a), "POSITIONAL_OR_KEYWORD" if i < n_pos else "KEYWORD_ONLY")
            for i, a in enumerate(op_schema.PLAN_ARGS)]
    assert _params(kk.plan_kda_prefill) == want
    assert _params(planning.plan_kda_prefill, skip=1) == want  # after `variants`
    doc = " ".join(kk.plan_kda_prefill.__doc__.split())
    for a in op_schema.PLAN_ARGS:
        if a.role == "plan":
            assert f"{a.name}: {' '.join(a.doc.split())}" in doc, a.name


def test_run_takes_the_layer_arguments():
    got = _params(KdaPrefillPlan.run, skip=1)
    pos = [(n, d) for n, d, kind in got if kind == "POSITIONAL_OR_KEYWORD"]
    kw = {(n, d) for n, d, kind in got if kind == "KEYWORD_ONLY"}
    layer = {a.name: _default(a) for a in op_schema.RUN_ARGS}
    assert pos == [(n, layer[n]) for n in op_schema.RUN_POSITIONAL]
    assert kw == {(n, d) for n, d in layer.items() if n not in op_schema.RUN_POSITIONAL}


def test_the_reference_takes_the_arguments_but_the_kernel_only_ones():
    want = [(a.name, _default(a), "POSITIONAL_OR_KEYWORD") for a in op_schema.REFERENCE_ARGS]
    assert _params(chunk_kda_prefill_reference) == want


def test_the_custom_ops_schema_is_the_schemas():
    schema = torch.ops.kdagen.chunk_kda_prefill.default._schema
    args = schema.arguments
    assert [a.name for a in args] == ["registry", *(a.name for a in op_schema.OP_ARGS), "final_state"]
    written = {a.name for a in args if a.alias_info is not None and a.alias_info.is_write}
    assert written == {"out", "checkpoint_state", "state_cache", "final_state"} == set(op_schema.mutated_names())
    assert not schema.returns
    assert str(schema) == f"{custom_op.QUALNAME}{op_schema.custom_op_schema()}"


def test_the_docs_table_is_the_schemas():
    doc = (ROOT / "docs" / "reference.md").read_text("utf-8")
    m = re.search(r"<!-- op-schema table[^\n]*\n(.*?)<!-- end op-schema table -->", doc, re.S)
    assert m is not None and m.group(1) == op_schema.markdown_table()


def test_the_constant_mark_is_torchs():
    def a():
        return 0

    def b():
        return 0

    torch.compiler.assume_constant_result(a)
    custom_op.assume_constant_result(b)
    assert {k: v for k, v in vars(a).items()} == {k: v for k, v in vars(b).items()} != {}
