# SPDX-License-Identifier: Apache-2.0
"""Spec loading and validation: specs/*.yaml -> frozen OpSpec/VariantSpec models."""

from kdagen.spec.errors import SpecError
from kdagen.spec.load import load_spec_file, load_specs
from kdagen.spec.model import OpSpec, TritonTuning, VariantSpec

__all__ = ["OpSpec", "SpecError", "TritonTuning", "VariantSpec", "load_spec_file", "load_specs"]
