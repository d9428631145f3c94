# SPDX-License-Identifier: Apache-2.0
"""The Triton path's device code, written once: @triton.jit bodies of the KDA chunked prefill's kernels.

Every generated variant module (generated/kdagen_kernels/triton/<variant>.py, from
templates/triton/kda_chunk.py.j2) declares the kernels under their ABI names (kdagen/kernels/kda.py) as
thin @triton.jit wrappers that call these bodies with the variant's head dims, chunk size and I/O dtype
as constexprs; Triton inlines the calls, so each variant compiles to the code the old per-variant copies
did. Loops over sub-blocks and column tiles are tl.static_range loops over tuples of tiles.

- common: the gate (with its saturation bounds), products in the I/O dtype, chunk rows, state rows.
- pair: kda_prologue and kda_wu, the chunk-parallel pair at the variant's chunk.
- intra: kda_intra, both in one program per walk chunk (bounded gate, L2-normed q and k).
- walk: kda_recurrence (the state walk) and kda_group_scan (the group split's start states).

Triton's cache key of a wrapper covers the source of every @triton.jit function it calls, transitively,
so an edit here recompiles every variant; the generated files' stamps cover this package too
(kdagen/render/context.py).
"""
