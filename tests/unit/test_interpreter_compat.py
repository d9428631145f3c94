# SPDX-License-Identifier: Apache-2.0
"""The Triton 3.6 interpreter patch (kdagen/runtime/interpreter_compat.py), with a fake interpreter.

CI runs the real thing too: `nox -s tests` repeats the interpreter numerics under triton 3.6.0.
"""

from __future__ import annotations

import types

import numpy as np
import pytest
import triton

from kdagen.runtime import interpreter_compat


@pytest.mark.parametrize(("version", "want"), [
    ("3.6.0", True), ("3.6.1", True), ("3.5.1", True), ("3.7.0", False), ("3.7.1", False), ("3.9.0", False),
    ("4.0.0", False), ("3.8.0+git1234", False), ("main", False),
])
def test_only_releases_before_3_7_are_patched(version, want):
    assert interpreter_compat.needs_patch(version) is want


class _Scope:
    def __init__(self):
        self.attrs = []

    def set_attr(self, obj, name, value):
        self.attrs.append((obj, name, value))


@pytest.fixture
def fake_interpreter(monkeypatch):
    from triton.runtime import interpreter

    calls = []

    def original(tensor, scope):
        calls.append(tensor)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data))

    monkeypatch.setattr(interpreter, "_patch_lang_tensor", original)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    return interpreter, original, calls


def test_triton_36_gets_an_index_that_squeezes_one_element_arrays(monkeypatch, fake_interpreter):
    interpreter, original, calls = fake_interpreter
    monkeypatch.setattr(triton, "__version__", "3.6.0")
    assert interpreter_compat.apply() is True
    patched = interpreter._patch_lang_tensor
    assert patched is not original
    assert interpreter_compat.apply() is True and interpreter._patch_lang_tensor is patched  # idempotent
    scope, tensor = _Scope(), object()
    patched(tensor, scope)
    # 3.6's own patches still run; __index__ is set after them, so it is the one in force.
    assert calls == [tensor] and scope.attrs[-1][:2] == (tensor, "__index__")
    index = scope.attrs[-1][2]
    pid = types.SimpleNamespace(handle=types.SimpleNamespace(data=np.array([7], dtype=np.int32)))
    assert index(pid) == 7
    scalar = types.SimpleNamespace(handle=types.SimpleNamespace(data=np.array(3, dtype=np.int64)))
    assert index(scalar) == 3


@pytest.mark.parametrize(("version", "interpret"), [("3.7.1", "1"), ("3.6.0", "0")])
def test_nothing_changes_on_current_triton_or_compiled_kernels(monkeypatch, fake_interpreter, version, interpret):
    interpreter, original, _ = fake_interpreter
    monkeypatch.setattr(triton, "__version__", version)
    monkeypatch.setenv("TRITON_INTERPRET", interpret)
    assert interpreter_compat.apply() is False
    assert interpreter._patch_lang_tensor is original
