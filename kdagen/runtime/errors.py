# SPDX-License-Identifier: Apache-2.0
"""Exceptions raised by the runtime."""


class NoVariantError(ValueError):
    """No generated variant fits the call. The message lists what was asked, what exists, and the fix."""
