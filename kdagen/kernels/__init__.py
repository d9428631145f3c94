# SPDX-License-Identifier: Apache-2.0
"""Kernel ABIs declared once as data (schema.py; Note [Kernel ABI]): the Triton kernels (kda.py, metadata.py)."""
