# SPDX-License-Identifier: Apache-2.0
"""Spec loading: the real spec loads; every bad spec gives its exact error line and text."""

from __future__ import annotations

import hashlib
import re
import textwrap
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kdagen.spec import SpecError, TritonTuning, load_spec_file, load_specs
from kdagen.spec.load import CHUNK_SIZE_REASON
from kdagen.targets import TARGETS, estimate_triton_smem

ROOT = Path(__file__).resolve().parents[2]

# Line 1 is `op:`, the variant item starts on line 3; tests append keys from line 10 on.
GOOD = """\
op: kda_chunk_fwd
variants:
  - label: a
    head_dim_k: 64
    head_dim_v: 64
    chunk_size: 64
    dtype: bf16
    backends: [triton]
    targets: [sm_90]
"""


def errors_of(tmp_path: Path, **files: str) -> list[str]:
    """Write specs/<name>.yaml files under tmp_path and return the SpecError lines of loading them."""
    spec_dir = tmp_path / "specs"
    spec_dir.mkdir(exist_ok=True)
    for name, text in files.items():
        (spec_dir / f"{name}.yaml").write_text(textwrap.dedent(text))
    with pytest.raises(SpecError) as info:
        load_specs(spec_dir, tmp_path)
    assert str(info.value) == "\n".join(info.value.errors)
    return info.value.errors


def load_text(tmp_path: Path, text: str):
    spec_dir = tmp_path / "specs"
    spec_dir.mkdir(exist_ok=True)
    (spec_dir / "k.yaml").write_text(textwrap.dedent(text))
    return load_specs(spec_dir, tmp_path)


# ------------------------------------------------------------------------------------------ good specs

def test_real_spec_loads():
    (spec,) = load_specs(ROOT / "specs", ROOT)
    assert spec.op == "kda_chunk_fwd"
    assert spec.path == "specs/kda_chunk_fwd.yaml"
    assert spec.sha256 == hashlib.sha256((ROOT / spec.path).read_bytes()).hexdigest()
    assert len({v.name for v in spec.variants}) == len(spec.variants) >= 1
    for v in spec.variants:
        assert v.spec_path == spec.path
        assert v.op == spec.op
        assert [t for t, _ in v.tuning] == list(v.targets)
        text_line = (ROOT / spec.path).read_text().splitlines()[v.line - 1]
        assert text_line.strip() == f"- label: {v.label}"


def test_load_spec_file_matches_load_specs():
    spec = load_spec_file(ROOT / "specs" / "kda_chunk_fwd.yaml", ROOT)
    assert spec == load_specs(ROOT / "specs", ROOT)[0]


def test_fields_and_line(tmp_path):
    (spec,) = load_text(tmp_path, GOOD)
    (v,) = spec.variants
    assert (v.label, v.backend, v.dtype, v.head_dim_k, v.head_dim_v, v.chunk_size, v.targets) == \
        ("a", "triton", "bf16", 64, 64, 64, ("sm_90",))
    assert (v.spec_path, v.line) == ("specs/k.yaml", 3)
    assert v.name == "kda_chunk_fwd__triton__bf16__k64_v64_c64"
    assert v.tuning == (("sm_90", TritonTuning()),)


def test_tuning_layers_defaults_file_variant(tmp_path):
    (spec,) = load_text(tmp_path, """\
        op: kda_chunk_fwd
        tuning:
          triton:
            gfx950: {recurrence_warps: 8, block_v: 32}
            sm_90: {prologue_stages: 2}
        variants:
          - label: a
            head_dim_k: 64
            head_dim_v: 128
            chunk_size: 32
            dtype: fp16
            backends: [triton]
            targets: [sm_90, gfx950]
            tuning: {triton: {gfx950: {block_v: 16, recurrence_stages: 3}}}
        """)
    (v,) = spec.variants
    assert v.tuning == (
        ("sm_90", TritonTuning(prologue_stages=2)),
        ("gfx950", TritonTuning(recurrence_warps=8, block_v=16, recurrence_stages=3)),
    )
    assert v.tuning_for("gfx950").block_v == 16


def test_inherited_block_v_is_clamped_to_head_dim_v(tmp_path):
    # The built-in block_v (64) is a default; a V=32 variant takes its whole V instead of failing. (On
    # gfx950: sm_90 refuses block_v 32 at the default 4 recurrence warps, test below.)
    (spec,) = load_text(tmp_path, GOOD.replace("head_dim_v: 64", "head_dim_v: 32").replace("[sm_90]", "[gfx950]"))
    assert spec.variants[0].tuning_for("gfx950").block_v == 32


def test_several_backends_expand(tmp_path, monkeypatch):
    monkeypatch.setattr("kdagen.spec.load.BACKENDS", ("triton", "hip"))
    (spec,) = load_text(tmp_path, GOOD.replace("[triton]", "[triton, hip]"))
    assert [v.backend for v in spec.variants] == ["triton", "hip"]
    assert {v.line for v in spec.variants} == {3}


# ------------------------------------------------------------------------------------------- bad specs

def test_unknown_key_did_you_mean(tmp_path):
    errs = errors_of(tmp_path, k=GOOD.replace("chunk_size:", "chunck_size:"))
    assert errs == [
        "specs/k.yaml:3: variants[0].chunk_size: missing required key",
        "specs/k.yaml:6: variants[0].chunck_size: unknown key; did you mean 'chunk_size'?",
    ]


def test_unknown_key_without_close_match_lists_allowed(tmp_path):
    errs = errors_of(tmp_path, k=GOOD + "    zzz: 1\n")
    assert errs == ["specs/k.yaml:10: variants[0].zzz: unknown key; expected one of: label, head_dim_k, "
                    "head_dim_v, chunk_size, dtype, backends, targets, tuning"]


def test_bad_chunk_size_with_reason(tmp_path):
    errs = errors_of(tmp_path, k=GOOD.replace("chunk_size: 64", "chunk_size: 48"))
    assert errs == [f"specs/k.yaml:6: variants[0].chunk_size: 48 is not a supported chunk_size "
                    f"(supported: 16, 32, 64): {CHUNK_SIZE_REASON}"]
    assert "tl.dot" in CHUNK_SIZE_REASON


def test_bad_dtype(tmp_path):
    errs = errors_of(tmp_path, k=GOOD.replace("dtype: bf16", "dtype: bfloat16"))
    assert errs == ["specs/k.yaml:7: variants[0].dtype: 'bfloat16' is not a supported dtype; did you mean "
                    "'bf16'? (supported: bf16, fp16)"]
    errs = errors_of(tmp_path, k=GOOD.replace("dtype: bf16", "dtype: 32"))
    assert errs == ["specs/k.yaml:7: variants[0].dtype: 32 is not a supported dtype (supported: bf16, fp16)"]


def test_unknown_target(tmp_path):
    errs = errors_of(tmp_path, k=GOOD.replace("[sm_90]", "[sm_90, gfx90a, sm90]"))
    assert errs == [
        "specs/k.yaml:9: variants[0].targets[1]: 'gfx90a' is not a supported target; did you mean "
        "'gfx950'? (supported: gfx942, gfx950, sm_90)",
        "specs/k.yaml:9: variants[0].targets[2]: 'sm90' is not a supported target; did you mean "
        "'sm_90'? (supported: gfx942, gfx950, sm_90)",
    ]


def test_non_int_head_dim(tmp_path):
    errs = errors_of(tmp_path, k=GOOD.replace("head_dim_k: 64", "head_dim_k: 64.0")
                     .replace("head_dim_v: 64", "head_dim_v: true"))
    assert errs == [
        "specs/k.yaml:4: variants[0].head_dim_k: expected an integer, got 64.0 (float)",
        "specs/k.yaml:5: variants[0].head_dim_v: expected an integer, got True (bool)",
    ]


def test_head_dim_out_of_range(tmp_path):
    errs = errors_of(tmp_path, k=GOOD.replace("head_dim_k: 64", "head_dim_k: 512"))
    assert errs == ["specs/k.yaml:4: variants[0].head_dim_k: 512 is out of range: must be 16..256"]


def test_malformed_yaml(tmp_path):
    errs = errors_of(tmp_path, k=GOOD.replace("targets: [sm_90]", "targets: [sm_90"))
    assert len(errs) == 1
    assert errs[0].startswith("specs/k.yaml:10: invalid YAML: ")


def test_duplicate_key(tmp_path):
    errs = errors_of(tmp_path, k=GOOD + "    dtype: fp16\n")
    assert errs == ["specs/k.yaml:10: variants[0].dtype: duplicate key (first at line 7)"]


def test_duplicate_label(tmp_path):
    second = GOOD.split("variants:\n")[1].replace("head_dim_k: 64", "head_dim_k: 128")
    errs = errors_of(tmp_path, k=GOOD + second)
    assert errs == ["specs/k.yaml:10: variants[1].label: duplicate label 'a' (first at line 3)"]


def test_conflicting_variants_across_two_files(tmp_path):
    other = GOOD.replace("label: a", "label: b").replace("[sm_90]", "[gfx950]")
    errs = errors_of(tmp_path, a=GOOD, b=other)
    assert errs == [
        "specs/b.yaml:3: variants[0]: variant kda_chunk_fwd__triton__bf16__k64_v64_c64 (label 'b') "
        "conflicts with the one declared at specs/a.yaml:3 (label 'a'); declare each (backend, dtype, "
        "head_dim_k, head_dim_v, chunk_size) once and list all its targets there"
    ]


def test_identical_variant_twice_in_one_file(tmp_path):
    second = GOOD.split("variants:\n")[1].replace("label: a", "label: b")
    errs = errors_of(tmp_path, k=GOOD + second)
    assert errs == [
        "specs/k.yaml:10: variants[1]: variant kda_chunk_fwd__triton__bf16__k64_v64_c64 (label 'b') "
        "duplicates the one declared at specs/k.yaml:3 (label 'a'); declare each (backend, dtype, "
        "head_dim_k, head_dim_v, chunk_size) once and list all its targets there"
    ]


def test_smem_over_budget_on_gfx942(tmp_path):
    # K=V=256, chunk 64, bf16 with the built-in tuning (block_v 64, 2 stages) does not fit 64 KiB: the pair's walk
    # on whole chunks stages 128 KiB (K=V=128 fits it exactly: 64 KiB, as its AOT build asks).
    estimate = estimate_triton_smem(256, 256, 64, "bf16", block_v=64, stages=2, target="gfx942")
    assert estimate == 128 * 1024 > TARGETS["gfx942"].smem_per_block == 64 * 1024
    assert estimate_triton_smem(128, 128, 64, "bf16", block_v=64, stages=2, target="gfx942") == 64 * 1024
    text = GOOD.replace("64\n    head_dim_v: 64", "256\n    head_dim_v: 256").replace("[sm_90]", "[gfx942]")
    errs = errors_of(tmp_path, k=text)
    assert errs == [
        "specs/k.yaml:3: variants[0]: shared memory estimate 128 KiB on gfx942 exceeds its 64 KiB per "
        "block (head_dim_k=256, head_dim_v=256, chunk_size=64, bf16, block_v=64, recurrence_stages=2, "
        "recurrence_stages_sparse=2); lower block_v or recurrence_stages and recurrence_stages_sparse in "
        "tuning.triton.gfx942, or chunk_size"
    ]
    # Both stage counts are launched, so one that still does not fit is named alone.
    half = text + "    tuning: {triton: {gfx942: {recurrence_stages: 1, block_v: 32}}}\n"
    assert errors_of(tmp_path, k=half) == [
        "specs/k.yaml:3: variants[0]: shared memory estimate 112 KiB on gfx942 exceeds its 64 KiB per block "
        "(head_dim_k=256, head_dim_v=256, chunk_size=64, bf16, block_v=32, recurrence_stages_sparse=2); lower "
        "block_v or recurrence_stages_sparse in tuning.triton.gfx942, or chunk_size"
    ]
    # The fix the message names works: one stage at 32-row slices (48 KiB).
    fixed = text + "    tuning: {triton: {gfx942: {recurrence_stages: 1, recurrence_stages_sparse: 1, block_v: 32}}}\n"
    (tmp_path / "specs" / "k.yaml").write_text(fixed)
    assert load_specs(tmp_path / "specs", tmp_path)[0].variants[0].tuning_for("gfx942").block_v == 32


def test_tuning_errors(tmp_path):
    text = GOOD + "    tuning: {triton: {sm_90: {recurrence_warps: 3, block_v: 128, prologue_stages: 0}, gfx942: {}}}\n"
    errs = errors_of(tmp_path, k=text)
    assert errs == [
        "specs/k.yaml:10: variants[0].tuning.triton.sm_90.recurrence_warps: 3 is out of range: "
        "must be one of 1, 2, 4, 8, 16",
        "specs/k.yaml:10: variants[0].tuning.triton.sm_90.prologue_stages: 0 is out of range: must be 1..4",
        "specs/k.yaml:10: variants[0].tuning.triton.gfx942: the variant does not list target 'gfx942' in targets",
        "specs/k.yaml:10: variants[0].tuning.triton.sm_90.block_v: 128 exceeds next_pow2(head_dim_v) = 64; "
        "use block_v <= 64",
    ]


def test_empty_lists_and_missing_keys(tmp_path):
    errs = errors_of(tmp_path, k=GOOD.replace("[triton]", "[]").replace("[sm_90]", "[]")
                     .replace("    dtype: bf16\n", ""))
    assert errs == [
        "specs/k.yaml:3: variants[0].dtype: missing required key",
        "specs/k.yaml:7: variants[0].backends: must list at least one backend (supported: triton, hip)",
        "specs/k.yaml:8: variants[0].targets: must list at least one target (supported: gfx942, gfx950, sm_90)",
    ]


def test_top_level_errors(tmp_path):
    errs = errors_of(tmp_path, k="opp: kda_chunk_fwd\nvariants: []\n", e="", l="- 1\n",
                     n="op: Kda-Chunk\nvariants:\n")
    assert errs == [
        "specs/e.yaml:1: empty spec file; see the schema comment in specs/kda_chunk_fwd.yaml",
        "specs/k.yaml:1: opp: unknown key; did you mean 'op'?",
        "specs/k.yaml:1: op: missing required key",
        "specs/k.yaml:2: variants: expected a non-empty list of variant mappings, got []",
        "specs/l.yaml:1: the top level must be a mapping with keys op, tuning, variants",
        "specs/n.yaml:1: op: expected a snake_case op name like kda_chunk_fwd, got 'Kda-Chunk'",
        "specs/n.yaml:2: variants: expected a non-empty list of variant mappings, got None",
    ]


def test_yaml_is_data_only(tmp_path):
    text = (GOOD.replace("label: a", "label: !!python/object/apply:os.getcwd []")
            .replace("head_dim_k: 64", "head_dim_k: !!python/name:os.system"))
    errs = errors_of(tmp_path, k=text)
    assert errs == [
        "specs/k.yaml:3: variants[0].label: unsupported YAML value: tag "
        "'tag:yaml.org,2002:python/object/apply:os.getcwd' is not allowed (specs are plain data)",
        "specs/k.yaml:4: variants[0].head_dim_k: unsupported YAML value: could not determine a "
        "constructor for the tag 'tag:yaml.org,2002:python/name:os.system'",
    ]


def test_all_errors_reported_at_once(tmp_path):
    bad = (GOOD.replace("chunk_size: 64", "chunk_size: 128").replace("dtype: bf16", "dtype: int8")
           .replace("[sm_90]", "[sm_100]"))
    errs = errors_of(tmp_path, a=bad, b="op: [\n", c=GOOD.replace("head_dim_v: 64", "head_dim_v: x"))
    assert [e.split(": ")[0] for e in errs] == [
        "specs/a.yaml:6", "specs/a.yaml:7", "specs/a.yaml:9", "specs/b.yaml:2", "specs/c.yaml:5",
    ]


def test_no_spec_files(tmp_path):
    (tmp_path / "specs").mkdir()
    with pytest.raises(SpecError, match=r"^specs: no \*\.yaml spec files found$"):
        load_specs(tmp_path / "specs", tmp_path)


# ------------------------------------------------------------------------------------------- property

LINE_RE = r"specs/k\.yaml:\d+: \S.*"
scalars = st.one_of(st.integers(-4, 600), st.sampled_from(["bf16", "fp16", "sm_90", "x", "", "1e3", "[", "{a: 1}"]),
                    st.booleans(), st.none(), st.floats(allow_nan=False, allow_infinity=False))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(k=scalars, v=scalars, chunk=scalars, dtype=scalars, target=scalars)
def test_any_values_load_or_give_formatted_errors(tmp_path, k, v, chunk, dtype, target):
    text = (f"op: kda_chunk_fwd\nvariants:\n  - label: a\n    head_dim_k: {k}\n    head_dim_v: {v}\n"
            f"    chunk_size: {chunk}\n    dtype: {dtype}\n    backends: [triton]\n    targets: [{target}]\n")
    spec_dir = tmp_path / "specs"
    spec_dir.mkdir(exist_ok=True)
    (spec_dir / "k.yaml").write_text(text)
    try:
        (spec,) = load_specs(spec_dir, tmp_path)
    except SpecError as exc:
        assert exc.errors and all(re.fullmatch(LINE_RE, e) for e in exc.errors), exc.errors
        return
    (variant,) = spec.variants
    assert (variant.head_dim_k, variant.head_dim_v, variant.chunk_size) == (k, v, chunk)
    tun = variant.tuning[0][1]
    for stages in (tun.recurrence_stages, tun.recurrence_stages_sparse):
        assert estimate_triton_smem(k, v, chunk, dtype, tun.block_v, stages, target,
                                    tun.intra_rows) <= TARGETS[target].smem_per_block


def test_prologue_block_k_must_be_a_power_of_two(tmp_path):
    text = GOOD + "    tuning: {triton: {sm_90: {prologue_block_k: 24}}}\n"
    assert errors_of(tmp_path, k=text) == [
        "specs/k.yaml:10: variants[0].tuning.triton.sm_90.prologue_block_k: 24 is out of range: "
        "must be a power of two >= 16 (and <= the padded head dims it slices)",
    ]
    (tmp_path / "specs" / "k.yaml").write_text(GOOD + "    tuning: {triton: {sm_90: {prologue_block_k: 64}}}\n")
    assert load_specs(tmp_path / "specs", tmp_path)[0].variants[0].tuning_for("sm_90").prologue_block_k == 64


def test_block_k_knobs_are_bounded_by_the_head_dims_they_slice(tmp_path):
    # Inherited (built-in): clamped for a narrow variant. Given for the variant: an error naming the bound.
    # prologue_block_k slices K only; wu_block_k slices K and V.
    (spec,) = load_text(tmp_path, GOOD.replace("head_dim_v: 64", "head_dim_v: 16"))
    tun = spec.variants[0].tuning_for("sm_90")
    assert (tun.prologue_block_k, tun.wu_block_k) == (32, 16)
    (spec,) = load_text(tmp_path, GOOD.replace("head_dim_k: 64", "head_dim_k: 16"))
    tun = spec.variants[0].tuning_for("sm_90")
    assert (tun.prologue_block_k, tun.wu_block_k) == (16, 16)
    text = GOOD + "    tuning: {triton: {sm_90: {prologue_block_k: 128}}}\n"
    assert errors_of(tmp_path, k=text) == [
        "specs/k.yaml:10: variants[0].tuning.triton.sm_90.prologue_block_k: 128 exceeds "
        "next_pow2(head_dim_k) = 64; use prologue_block_k <= 64",
    ]
    text = GOOD.replace("head_dim_v: 64", "head_dim_v: 32") + "    tuning: {triton: {sm_90: {wu_block_k: 64}}}\n"
    assert errors_of(tmp_path, k=text) == [
        "specs/k.yaml:10: variants[0].tuning.triton.sm_90.wu_block_k: 64 exceeds "
        "min(next_pow2(head_dim_k), next_pow2(head_dim_v)) = 32; use wu_block_k <= 32",
    ]


WGMMA_WHY = TARGETS["sm_90"].triton_refused[0].why


def test_a_config_triton_miscompiles_on_sm_90_is_refused(tmp_path):
    # 4 recurrence warps with block_v 32 on sm_90 (kdagen/targets.py _SM90_WGMMA_BV32); the same knobs on
    # gfx942 (no wgmma) load.
    assert WGMMA_WHY.startswith("Triton (3.6.0 measured") and WGMMA_WHY.endswith("Use block_v 64, or 2 or 8 recurrence_warps")
    text = GOOD + "    tuning: {triton: {sm_90: {recurrence_warps: 4, block_v: 32}}}\n"
    assert errors_of(tmp_path, k=text) == [f"specs/k.yaml:10: variants[0].tuning.triton.sm_90: {WGMMA_WHY}"]
    ok = GOOD.replace("targets: [sm_90]", "targets: [gfx942]") + \
        "    tuning: {triton: {gfx942: {recurrence_warps: 4, block_v: 32}}}\n"
    (tmp_path / "amd").mkdir()
    (spec,) = load_text(tmp_path / "amd", ok)
    assert spec.variants[0].tuning_for("gfx942").block_v == 32
    # The dense_* knobs are what a batch whose walks fill the GPU launches with: refused the same way, naming them.
    dense = GOOD + "    tuning: {triton: {sm_90: {recurrence_warps: 4, block_v: 64, dense_block_v: 32}}}\n"
    (tmp_path / "dense").mkdir()
    assert errors_of(tmp_path / "dense", k=dense) == [
        "specs/k.yaml:10: variants[0].tuning.triton.sm_90: a batch whose walks fill the GPU launches "
        f"recurrence_warps 4, dense_block_v 32: {WGMMA_WHY}"]
    # Built-in defaults (4 warps) with block_v clamped to head_dim_v = 32: at the variant, nothing else set it.
    (tmp_path / "clamped").mkdir()
    assert errors_of(tmp_path / "clamped", k=GOOD.replace("head_dim_v: 64", "head_dim_v: 32")) == [
        f"specs/k.yaml:3: variants[0]: {WGMMA_WHY}"]


def test_a_refused_file_level_tuning_is_reported_once_at_its_line(tmp_path):
    text = """\
        op: kda_chunk_fwd
        tuning:
          triton:
            sm_90:
              recurrence_warps: 4
              block_v: 32
        variants:
          - {label: a, head_dim_k: 64, head_dim_v: 64, chunk_size: 64, dtype: bf16, backends: [triton], targets: [sm_90]}
          - {label: b, head_dim_k: 64, head_dim_v: 128, chunk_size: 64, dtype: bf16, backends: [triton], targets: [sm_90]}
          - {label: c, head_dim_k: 128, head_dim_v: 64, chunk_size: 64, dtype: bf16, backends: [triton], targets: [sm_90],
             tuning: {triton: {sm_90: {block_v: 64}}}}
        """
    # Line 5: the first knob of the refused pair, in the tuning every variant but c inherits.
    assert errors_of(tmp_path, k=text) == [f"specs/k.yaml:5: tuning.triton.sm_90: {WGMMA_WHY}"]


def test_an_op_the_templates_do_not_implement_is_refused_at_its_line(tmp_path):
    text = "# the backward pass\n" + GOOD.replace("op: kda_chunk_fwd", "op: kda_chunk_bwd")
    assert errors_of(tmp_path, k=text) == [
        "specs/k.yaml:2: op: 'kda_chunk_bwd' is not a supported op; did you mean 'kda_chunk_fwd'? (supported: "
        "kda_chunk_fwd): templates/ implements only the chunked forward (templates/triton/kda_chunk.py.j2)"]


def test_smem_over_budget_is_reported_once_naming_the_knob_that_overflows(tmp_path):
    # dense_intra_rows makes the dense launch differ from the plain one while both overflow at block_v 64: each
    # knob is named once.
    big = GOOD.replace("64\n    head_dim_v: 64", "256\n    head_dim_v: 256").replace("[sm_90]", "[gfx942]")
    text = big + "    tuning: {triton: {gfx942: {dense_intra_rows: 16}}}\n"
    assert errors_of(tmp_path, k=text) == [
        "specs/k.yaml:3: variants[0]: shared memory estimate 128 KiB on gfx942 exceeds its 64 KiB per block "
        "(head_dim_k=256, head_dim_v=256, chunk_size=64, bf16, block_v=64, recurrence_stages=2, "
        "recurrence_stages_sparse=2); lower block_v or recurrence_stages and recurrence_stages_sparse in "
        "tuning.triton.gfx942, or chunk_size"]
    # Only the dense launch overflows (its plain walk on more programs than SMs: recurrence_stages): its slice
    # width is dense_block_v, and the message names that knob alone.
    wide = GOOD.replace("head_dim_v: 64", "head_dim_v: 256").replace("[sm_90]", "[gfx942]") + \
        "    tuning: {triton: {gfx942: {dense_block_v: 256}}}\n"
    (tmp_path / "wide").mkdir()
    assert errors_of(tmp_path / "wide", k=wide) == [
        "specs/k.yaml:3: variants[0]: shared memory estimate 68 KiB on gfx942 exceeds its 64 KiB per block "
        "(head_dim_k=64, head_dim_v=256, chunk_size=64, bf16, dense_block_v=256, recurrence_stages=2); lower "
        "dense_block_v or recurrence_stages in tuning.triton.gfx942, or chunk_size"]


HIP_ONLY = GOOD.replace("64\n    head_dim_v: 64", "128\n    head_dim_v: 128").replace("[triton]", "[hip]")


def test_a_hip_variant_without_its_triton_twin_is_refused(tmp_path):
    assert errors_of(tmp_path, k=HIP_ONLY) == [
        "specs/k.yaml:8: variants[0].backends: hip needs triton in the same variant's backends (or a triton "
        "variant of dtype bf16, head_dim_k=128, head_dim_v=128, chunk_size=64): the fused plans run the Triton "
        "walk after the HIP kda_intra_kernel, and the whole Triton path for calls the HIP kernels cannot take; "
        "use backends: [triton, hip]"]


def test_a_hip_variant_may_take_its_triton_twin_from_another_item_on_all_its_targets(tmp_path):
    twin = HIP_ONLY.replace("[hip]", "[triton]").replace("label: a", "label: t").replace("[sm_90]", "[gfx950]")
    errs = errors_of(tmp_path, k=HIP_ONLY.replace("[sm_90]", "[sm_90, gfx950]"), t=twin)
    assert errs == [
        "specs/k.yaml:8: variants[0].backends: hip lists target(s) sm_90 that the triton variant "
        "kda_chunk_fwd__triton__bf16__k128_v128_c64 (specs/t.yaml:3) does not; the fused plans need it on "
        "every target of the hip variant: list the same targets in both"]
    (tmp_path / "specs" / "t.yaml").write_text(twin.replace("[gfx950]", "[gfx950, sm_90]"))
    assert [v.backend for s in load_specs(tmp_path / "specs", tmp_path) for v in s.variants] == ["hip", "triton"]


def test_a_failed_triton_twin_in_the_same_item_is_not_reported_twice(tmp_path):
    both = HIP_ONLY.replace("[hip]", "[triton, hip]") + "    tuning: {triton: {sm_90: {recurrence_warps: 4, block_v: 32}}}\n"
    assert errors_of(tmp_path, k=both) == [f"specs/k.yaml:10: variants[0].tuning.triton.sm_90: {WGMMA_WHY}"]


def test_dense_knobs_take_zero_or_the_rule_of_the_knob_they_replace():
    from kdagen.spec.tuning import _check_tuning_value

    assert [_check_tuning_value(n, 0) for n in ("dense_intra_rows", "dense_intra_warps", "dense_block_v")] == [None] * 3
    assert _check_tuning_value("dense_intra_rows", 16) is None and _check_tuning_value("dense_block_v", 128) is None
    assert _check_tuning_value("dense_intra_rows", 8) == "must be 0 (the same as intra_rows) or 16 or 32 (rows per " \
        "kda_intra program and walk step)"
    assert _check_tuning_value("dense_block_v", 48).startswith("must be 0 (the same as block_v) or a power of two")
