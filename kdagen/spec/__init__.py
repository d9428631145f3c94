# SPDX-License-Identifier: Apache-2.0
"""Spec loading and validation: specs/*.yaml -> frozen OpSpec/VariantSpec models."""

from kdagen.spec.errors import SpecError
from kdagen.spec.model import OpSpec, TritonTuning, VariantSpec

__all__ = ["OpSpec", "SpecError", "TritonTuning", "VariantSpec", "load_spec_file", "load_specs"]


def __getattr__(name: str):
    # The loaders need PyYAML (the `generate` extra); the models do not, and the runtime-only install's
    # commands (bench, autotune's timing) import them.
    if name in ("load_spec_file", "load_specs"):
        from kdagen.spec import load
        return getattr(load, name)
    raise AttributeError(f"module 'kdagen.spec' has no attribute {name!r}")
