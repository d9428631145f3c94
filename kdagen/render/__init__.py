# SPDX-License-Identifier: Apache-2.0
"""Rendering: loaded specs -> one Jinja environment -> generated/kdagen_kernels/ (see emit.py)."""

from kdagen.render.context import PACKAGE_TEMPLATES, VARIANT_TEMPLATES, RenderJob, plan
from kdagen.render.emit import PACKAGE_DIR, EmitReport, FileManager, check, emit, generate, render_all
from kdagen.render.env import RenderError, make_env

__all__ = [
    "PACKAGE_DIR", "PACKAGE_TEMPLATES", "VARIANT_TEMPLATES", "EmitReport", "FileManager", "RenderError",
    "RenderJob", "check", "emit", "generate", "make_env", "plan", "render_all",
]
