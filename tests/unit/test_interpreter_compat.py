# SPDX-License-Identifier: Apache-2.0
"""The interpreter patches for Triton 3.6 and 3.9 (kdagen/runtime/interpreter_compat.py), with fakes.

CI runs the real thing too: `nox -s tests` repeats the interpreter numerics under triton 3.6.0 and 3.9.0.
"""

from __future__ import annotations

import types

import numpy as np
import pytest
import triton
import triton.language as tl

from kdagen.runtime import interpreter_compat


@pytest.mark.parametrize(("version", "index", "splat"), [
    ("3.5.1", True, False), ("3.6.0", True, False), ("3.6.1", True, False), ("3.7.0", False, False),
    ("3.7.1", False, False), ("3.8.0", False, False), ("3.9.0", False, True), ("3.9.2+git1234", False, True),
    ("3.10.0", False, False), ("4.0.0", False, False), ("main", False, False),
])
def test_each_patch_is_for_the_releases_with_the_bug(version, index, splat):
    assert interpreter_compat.needs_index_patch(version) is index
    assert interpreter_compat.needs_splat_patch(version) is splat


class _Scope:
    def __init__(self):
        self.attrs = []

    def set_attr(self, obj, name, value):
        self.attrs.append((obj, name, value))


def _handle(data):
    return types.SimpleNamespace(handle=types.SimpleNamespace(data=data))


@pytest.fixture
def fake_interpreter(monkeypatch, set_interpreting):
    from triton.runtime import interpreter

    calls = []

    def patch_lang_tensor(tensor, scope):
        calls.append(tensor)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data))

    def create_splat(self, ret_ty, arg):  # 3.9's: the argument's dtype, int64 for a comparison of int64s
        return interpreter.TensorHandle(np.full(ret_ty.shape, arg.data[0], dtype=np.int64), tl.int64)

    monkeypatch.setattr(interpreter, "_patch_lang_tensor", patch_lang_tensor)
    monkeypatch.setattr(interpreter.InterpreterBuilder, "create_splat", create_splat)
    set_interpreting(True)
    return interpreter, patch_lang_tensor, create_splat, calls


def test_triton_36_gets_an_index_that_squeezes_one_element_arrays(monkeypatch, fake_interpreter):
    interpreter, original, splat, calls = fake_interpreter
    monkeypatch.setattr(triton, "__version__", "3.6.0")
    assert interpreter_compat.apply() == ["index"]
    patched = interpreter._patch_lang_tensor
    assert patched is not original and interpreter.InterpreterBuilder.create_splat is splat
    assert interpreter_compat.apply() == ["index"] and interpreter._patch_lang_tensor is patched  # once only
    scope, tensor = _Scope(), object()
    patched(tensor, scope)
    # 3.6's own patches still run; __index__ is set after them, so it is the one in force.
    assert calls == [tensor] and scope.attrs[-1][:2] == (tensor, "__index__")
    index = scope.attrs[-1][2]
    assert index(_handle(np.array([7], dtype=np.int32))) == 7
    assert index(_handle(np.array(3, dtype=np.int64))) == 3


def test_triton_39_splats_a_boolean_as_booleans(monkeypatch, fake_interpreter):
    interpreter, original, splat, _ = fake_interpreter
    monkeypatch.setattr(triton, "__version__", "3.9.0")
    assert interpreter_compat.apply() == ["splat"]
    patched = interpreter.InterpreterBuilder.create_splat
    assert patched is not splat and interpreter._patch_lang_tensor is original
    assert interpreter_compat.apply() == ["splat"] and interpreter.InterpreterBuilder.create_splat is patched
    arg = interpreter.TensorHandle(np.array([True]), tl.int64)
    mask = patched(None, tl.block_type(tl.int1, [4]), arg)
    assert mask.data.dtype == np.bool_ and mask.data.tolist() == [True] * 4 and mask.dtype == tl.int1
    # Other element types keep what the release builds.
    ints = patched(None, tl.block_type(tl.int64, [2]), interpreter.TensorHandle(np.array([5]), tl.int64))
    assert ints.data.dtype == np.int64 and ints.data.tolist() == [5, 5]


@pytest.mark.parametrize(("version", "interpret"), [("3.7.1", "1"), ("3.8.0", "1"), ("3.6.0", "0"), ("3.9.0", "0")])
def test_nothing_changes_on_other_releases_or_compiled_kernels(monkeypatch, fake_interpreter, set_interpreting,
                                                             version, interpret):
    interpreter, original, splat, _ = fake_interpreter
    monkeypatch.setattr(triton, "__version__", version)
    set_interpreting(interpret == "1")
    assert interpreter_compat.apply() == []
    assert interpreter._patch_lang_tensor is original and interpreter.InterpreterBuilder.create_splat is splat
