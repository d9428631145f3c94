# SPDX-License-Identifier: Apache-2.0
"""Two bugs of Triton's CPU interpreter that our kernels meet, mended for the releases that have them.

- Triton 3.6 under NumPy >= 2.4: a loop bound that comes from a program id fails. The 3.6 interpreter
  holds a program id (and everything computed from it) as a one-element 1-D array, and its
  `tensor.__index__` is `int(array)`, which NumPy 2.4 no longer allows for arrays with a dimension ("only
  0-dimensional arrays can be converted to Python scalars"). Our kernels take such loop bounds (the chunk
  metadata fill, the recurrence's chunk range). Triton 3.7 squeezes the array first; 3.6 gets the same.
- Triton 3.9: a comparison's result keeps its left operand's dtype in the interpreter (`g == G - 1` on
  int64 is an "int64" handle holding booleans), and splatting it to a block builds an int64 array, so a
  mask like `m_s & last` (the recurrence's final-state store) reaches the store as integers ("mask has
  unsupported dtype"). A splat takes its result type's dtype here, as the compiled kernels do (their IR
  is i1 on every release).

Nothing changes outside the interpreter (compiled kernels never run this code) or on other releases.
"""

from __future__ import annotations

import numpy as np
import triton

from .device import interpreting

_MARK = "_kdagen_patched"


def _version(version: str) -> tuple[int, int] | None:
    try:
        major, minor = (int(x) for x in version.split(".")[:2])
    except ValueError:
        return None  # a development build: assume it is current
    return major, minor


def needs_index_patch(version: str) -> bool:
    """Releases whose interpreter converts one-element arrays with int(array): before 3.7."""
    v = _version(version)
    return v is not None and v < (3, 7)


def needs_splat_patch(version: str) -> bool:
    """Releases whose interpreter splats a comparison with its operand's dtype: 3.9."""
    v = _version(version)
    return v is not None and (3, 9) <= v < (3, 10)


def _index(self) -> int:
    return int(self.handle.data.squeeze())


def _patch_index(interpreter) -> None:
    original = interpreter._patch_lang_tensor
    if getattr(original, _MARK, False):
        return

    def patch_lang_tensor(tensor, scope) -> None:
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", _index)  # the scope restores it after the launch, as 3.6's own

    setattr(patch_lang_tensor, _MARK, True)
    interpreter._patch_lang_tensor = patch_lang_tensor


def _patch_splat(interpreter) -> None:
    builder = interpreter.InterpreterBuilder
    original = builder.create_splat
    if getattr(original, _MARK, False):
        return

    def create_splat(self, ret_ty, arg):
        out = original(self, ret_ty, arg)
        want = interpreter._get_np_dtype(ret_ty.scalar)
        if want == np.bool_ and out.data.dtype != np.bool_:
            out = interpreter.TensorHandle(out.data.astype(np.bool_), ret_ty.scalar)
        return out

    setattr(create_splat, _MARK, True)
    builder.create_splat = create_splat


def apply() -> list[str]:
    """Mend the interpreter of the installed Triton if it is in use; the names of the patches in place."""
    if not interpreting():
        return []
    from triton.runtime import interpreter

    done = []
    if needs_index_patch(triton.__version__):
        _patch_index(interpreter)
        done.append("index")
    if needs_splat_patch(triton.__version__):
        _patch_splat(interpreter)
        done.append("splat")
    return done
