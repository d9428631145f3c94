# SPDX-License-Identifier: Apache-2.0
"""What the generated package imports: device detection, variant selection, argument checks, launches.

Imports flow one way: generated package -> kdagen.runtime. Nothing here imports kdagen_kernels,
kdagen.spec or kdagen.render (so jinja2 and PyYAML are not needed at run time).
"""
