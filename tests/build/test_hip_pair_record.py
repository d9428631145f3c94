# SPDX-License-Identifier: Apache-2.0
"""The pair launch's records (Note [Pair record], kdagen/kernels/hip.py): the C structs as rendered into a shipped
source, compiled with cc, agree with the Python packing: every field's offset and the size, and every value of a
record Python packs read back by name on the C side."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from kdagen.kernels.hip import KDA_PAIR_LAUNCH, Record

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "generated" / "kdagen_kernels" / "hip" / "kda_chunk_fwd__hip__bf16__k128_v128_c64__sm_90.hip"
CC = shutil.which("cc")

pytestmark = pytest.mark.skipif(CC is None, reason="cc not found")


def _rendered(name: str) -> str:
    """`struct name { ... };` as the generated source has it."""
    m = re.search(rf"^struct {name} {{\n.*?^}};\n", SOURCE.read_text(), re.S | re.M)
    assert m, f"{SOURCE.name} has no struct {name}"
    return m[0]


def _value(r: Record, i: int, kind: str):
    # Distinct per field, and wider than 32 bits where the field is, so a swapped or truncated field shows.
    return {"int64_t": (i + 1) * 0x100000001, "int32_t": -(i + 1), "float": i + 0.25}.get(kind, (i + 1) << 36)


def _c_kind(decl: str) -> str:
    return "ptr" if "*" in decl else decl.split()[0]


@pytest.mark.parametrize("record", [KDA_PAIR_LAUNCH.run, KDA_PAIR_LAUNCH.plan], ids=lambda r: r.name)
def test_rendered_struct_is_the_packed_layout(record: Record, tmp_path):
    body = _rendered(record.name)
    decls = {m[2]: m[1] for m in re.finditer(r"^  (.+?)(\w+);$", body, re.M)}
    assert list(decls) == list(record.names), "the rendered fields are the record's, in its order"
    kinds = {n: _c_kind(d) for n, d in decls.items()}
    values = [_value(record, i, kinds[n]) for i, n in enumerate(record.names)]
    prints = []
    for n in record.names:
        fmt, arg = {"ptr": ("%llu", f"(unsigned long long)(uintptr_t)r.{n}"), "int64_t": ("%lld", f"(long long)r.{n}"),
                    "int32_t": ("%d", f"r.{n}"), "float": ("%.9g", f"(double)r.{n}")}[kinds[n]]
        prints.append(f'  printf("{n} %zu {fmt}\\n", offsetof(struct {record.name}, {n}), {arg});')
    (tmp_path / "layout.c").write_text("\n".join([
        "#include <stddef.h>", "#include <stdint.h>", "#include <stdio.h>", "#include <string.h>",
        "typedef uint16_t kda_io_t;", "typedef uint16_t kda_bf16;", body,
        "int main(void) {",
        f"  struct {record.name} r;",
        "  unsigned char buf[sizeof r];",
        "  if (fread(buf, 1, sizeof buf, stdin) != sizeof buf) return 2;",
        "  memcpy(&r, buf, sizeof r);",
        '  printf("sizeof %zu\\n", sizeof r);',
        *prints, "  return 0;", "}"]) + "\n")
    exe = tmp_path / "layout"
    subprocess.run([CC, "-std=c11", "-Wall", "-Werror", "-o", str(exe), str(tmp_path / "layout.c")], check=True)
    packed = record.packer.pack(*values)
    out = subprocess.run([str(exe)], input=packed, capture_output=True, check=True).stdout.decode().split("\n")
    got = dict(line.split(" ", 1) for line in out if line)
    assert got.pop("sizeof") == str(record.packer.size) == str(len(packed))
    offsets = record.offsets()
    for n, x in zip(record.names, values):
        at, read = got[n].split()
        assert int(at) == offsets[n], f"{record.name}.{n}: C offset {at}, Python packs it at {offsets[n]}"
        assert (float(read) if kinds[n] == "float" else int(read)) == x, f"{record.name}.{n} read back as {read}"


def test_records_take_every_launcher_value_once():
    """The run record has each launcher's per-run values (scale and stream once, shared); the plan record every
    other parameter of each launcher, prefixed by its stage."""
    pair = KDA_PAIR_LAUNCH
    assert set(pair.run.names) == set(pair.intra_run) | set(pair.walk_run)
    for st, run in ((pair.intra, pair.intra_run), (pair.walk, pair.walk_run)):
        prefix = st.abi.name.removeprefix("kda_").removesuffix("_launch") + "_"
        assert {prefix + p.name for p in st.abi.params if p.name not in run} <= set(pair.plan.names)
    assert len(pair.plan.names) == sum(len(st.abi.params) - len(run) for st, run in
                                       ((pair.intra, pair.intra_run), (pair.walk, pair.walk_run)))
