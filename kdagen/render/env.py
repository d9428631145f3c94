# SPDX-License-Identifier: Apache-2.0
"""The single Jinja environment every template renders through, and template errors with their line."""

from __future__ import annotations

import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jinja2

from kdagen.targets import DTYPES


class RenderError(Exception):
    """A template failed to load or render; the message names the template, its line and the output."""


class _RecordingLoader(jinja2.FileSystemLoader):
    """Remembers every template it loaded (includes and imports too), for the manifest."""

    def __init__(self, searchpath: Path) -> None:
        super().__init__(str(searchpath))
        self.loaded: set[str] = set()

    def get_source(self, environment: jinja2.Environment, template: str) -> tuple[str, str, Any]:
        source = super().get_source(environment, template)
        self.loaded.add(template)
        return source


def triton_dtype(dtype: str) -> str:
    """"bf16" -> "tl.bfloat16" (also the `triton_dtype` filter)."""
    return f"tl.{DTYPES[dtype][2]}"


def torch_dtype(dtype: str) -> str:
    """"bf16" -> "torch.bfloat16" (also the `torch_dtype` filter)."""
    return f"torch.{DTYPES[dtype][1]}"


def make_env(root: Path) -> jinja2.Environment:
    """The one Environment: StrictUndefined so a typo in a template fails instead of rendering ""."""
    env = jinja2.Environment(
        loader=_RecordingLoader(Path(root) / "templates"),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )
    env.filters["triton_dtype"] = triton_dtype
    env.filters["torch_dtype"] = torch_dtype
    return env


def loaded_templates(env: jinja2.Environment) -> list[str]:
    """Template names (relative to templates/) loaded so far through `env`, sorted."""
    loader = env.loader
    assert isinstance(loader, _RecordingLoader)
    return sorted(loader.loaded)


def render_template(env: jinja2.Environment, template: str, context: Mapping[str, Any], output: str) -> str:
    """Render one template; any Jinja failure becomes a RenderError naming templates/<t>:<line>."""
    try:
        return env.get_template(template).render(**context)
    except jinja2.TemplateSyntaxError as exc:
        where = f"templates/{exc.name or template}:{exc.lineno}"
        raise RenderError(f"{where}: syntax error: {exc.message} (rendering {output})") from exc
    except jinja2.TemplateNotFound as exc:
        raise RenderError(f"templates/{exc.name}: template not found (needed for {output})") from exc
    except Exception as exc:  # UndefinedError, errors raised inside filters, ...
        raise RenderError(f"{_template_line(env, exc, template)}: {type(exc).__name__}: {exc} "
                          f"(rendering {output})") from exc


def _template_line(env: jinja2.Environment, exc: BaseException, template: str) -> str:
    # Jinja rewrites tracebacks so that template frames carry the template's file name and line.
    assert isinstance(env.loader, jinja2.FileSystemLoader)
    base = Path(env.loader.searchpath[0]).resolve()
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        path = Path(frame.filename).resolve()
        if path.is_relative_to(base):
            return f"templates/{path.relative_to(base).as_posix()}:{frame.lineno}"
    return f"templates/{template}"
