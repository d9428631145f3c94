# SPDX-License-Identifier: Apache-2.0
"""Triton 3.6's CPU interpreter under NumPy >= 2.4: a loop bound that comes from a program id fails.

The 3.6 interpreter holds a program id (and everything computed from it) as a one-element 1-D array, and
its `tensor.__index__` is `int(array)`, which NumPy 2.4 no longer allows for arrays with a dimension
("only 0-dimensional arrays can be converted to Python scalars"). Our kernels take such loop bounds (the
chunk metadata fill, the recurrence's chunk range), so under TRITON_INTERPRET=1 every call failed.
Triton 3.7 squeezes the array first; `apply` gives 3.6 that same `__index__`. It changes nothing on
Triton >= 3.7, and nothing outside the interpreter (compiled kernels never call `__index__`).
"""

from __future__ import annotations

import triton

from .device import interpreting

_MARK = "_kdagen_index_squeezed"


def needs_patch(version: str) -> bool:
    """Triton releases whose interpreter converts one-element arrays with int(array): before 3.7."""
    try:
        major, minor = (int(x) for x in version.split(".")[:2])
    except ValueError:
        return False  # a development build: assume it is current
    return (major, minor) < (3, 7)


def _index(self) -> int:
    return int(self.handle.data.squeeze())


def apply() -> bool:
    """Patch Triton 3.6's interpreter if it is in use; True when the patch is in place."""
    if not interpreting() or not needs_patch(triton.__version__):
        return False
    from triton.runtime import interpreter

    original = interpreter._patch_lang_tensor
    if getattr(original, _MARK, False):
        return True

    def patch_lang_tensor(tensor, scope) -> None:
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", _index)  # the scope restores it after the launch, as 3.6's own

    setattr(patch_lang_tensor, _MARK, True)
    interpreter._patch_lang_tensor = patch_lang_tensor
    return True
