# SPDX-License-Identifier: Apache-2.0
"""How many groups the Triton walk is cut into: the cost model (Note [Group count]); its parameters per target
are pipeline.RULES."""

from __future__ import annotations

import functools
import math

import torch

MAX_GROUPS = 32  # the cost model's largest choice
MAX_FORCED_GROUPS = 1024  # an explicit count (groups= or KDAGEN_TRITON_GROUPS): bounds the grid's group dimension
# One group-scan step (a [16, K] x [K, K] fp32 product per block) in units of one chunk step of the walk
# (a default; plans pass their target's measured costs).
_SCAN_STEP = 0.5

# Note [Group count]
# A block walks its sequence's chunks one after another, so with few (sequence, head, V slice) blocks
# most SMs idle (one 64K-token sequence with 12 heads: 24 blocks on 132 SMs). G > 1 groups split each
# walk: pass 1 runs G - 1 groups on V + K rows (B_g and the transfer operator M_g), the scan composes
# the start states, pass 2 runs G groups on V rows; each walks ceil(chunks / G) chunks of the longest
# sequence. group_costs models the time as waves of resident blocks x chunk steps per wave, plus the scan's
# steps and a split's fixed cost (its two extra launches); a ragged batch's blocks count as busy in
# proportion to their sequence's share of the longest walk. choose_groups takes the cheapest G; G = 1 is
# the plain walk. Rounding differs between group counts (M_g is applied in fp32, the walk rounds its
# bf16 operands per chunk), so bit-reproducible checkpoints across differently cut prefills need a
# fixed G: groups=1 (or KDAGEN_TRITON_GROUPS=1 for an experiment) pins it; checkpointing plans keep G = 1
# unless asked otherwise (pipeline.choose_pipeline).


def busy_share(num_seqs: int, total_chunks: int, longest: int = 0) -> float:
    """The share of a batch's walk programs busy on average over its longest walk (1 for equal sequences): a
    ragged batch's short sequences finish early and free their SMs. `longest` as in group_costs."""
    if num_seqs <= 0 or total_chunks <= 0:
        return 1.0
    return min(total_chunks / (num_seqs * max(-(-total_chunks // num_seqs), longest)), 1.0)


def group_costs(num_seqs: int, H: int, total_chunks: int, K: int, V: int, v_slice: int, sms: int,
                blocks_per_sm: int, *, pass1_step: float = 1.0, scan_step: float = _SCAN_STEP,
                split_step: float = 0.0, longest: int = 0) -> dict[int, float]:
    """The modelled time of the walk at each candidate group count, in pass-2 chunk steps (Note [Group
    count]). `pass1_step` and `scan_step`: a pass-1 chunk step and a scan step in units of a pass-2 chunk step;
    `split_step`: what a split costs once (its two extra launches); `longest`: the longest sequence's chunks
    where known (a ragged batch's walk ends with its longest sequence), else the mean stands in."""
    if num_seqs <= 0 or total_chunks <= 0:
        return {1: 0.0}
    cap = max(sms * blocks_per_sm, 1)
    per_seq = max(-(-total_chunks // num_seqs), longest)
    base = num_seqs * H * -(-V // v_slice) * busy_share(num_seqs, total_chunks, longest)  # busy pass-2 blocks a group

    def cost(g: int) -> float:
        steps = -(-per_seq // g)
        c = math.ceil(base * g / cap) * steps
        if g > 1:
            c += math.ceil(base * (V + K) / V * (g - 1) / cap) * steps * pass1_step + g * scan_step + split_step
        return c

    return {g: cost(g) for g in [1] + [g for g in (2, 3, 4, 6, 8, 12, 16, 24, MAX_GROUPS) if 2 * g <= per_seq]}


def choose_groups(num_seqs: int, H: int, total_chunks: int, K: int, V: int, v_slice: int, sms: int,
                  blocks_per_sm: int, *, pass1_step: float = 1.0, scan_step: float = _SCAN_STEP,
                  split_step: float = 0.0, longest: int = 0) -> int:
    """The group count of the recurrence walk: the cheapest of group_costs (Note [Group count])."""
    costs = group_costs(num_seqs, H, total_chunks, K, V, v_slice, sms, blocks_per_sm, pass1_step=pass1_step,
                        scan_step=scan_step, split_step=split_step, longest=longest)
    return min(costs, key=lambda g: (costs[g], g))


@functools.lru_cache(maxsize=None)
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def device_sms(device: torch.device) -> int | None:
    """SMs (CUs on ROCm) of a GPU device; None on the CPU, where the interpreter has none to fill."""
    if device.type != "cuda":
        return None
    return _sm_count(device.index if device.index is not None else torch.cuda.current_device())
