# SPDX-License-Identifier: Apache-2.0
"""kdagen: a code generator for KDA (Kimi Delta Attention) chunked-prefill kernels."""

__version__ = "0.1.0"
