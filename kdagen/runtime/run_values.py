# SPDX-License-Identifier: Apache-2.0
"""The per-run values of a plan: one declaration, read by name by every stage.

`KdaPrefillPlan.bind` builds one list per run in RUN_ORDER; each launch (a Triton KernelLaunch, a HIP
launcher) picks the values it reads by name through `picker`, so a stage that reads a new value, or a
reordering here, cannot make two places disagree by position. "stream" is the current stream's handle for the
HIP launchers and the compiled Triton launches (0 in plans with neither: Triton's JIT launch reads it itself).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence

RUN_ORDER = ("q", "k", "v", "raw_g", "raw_beta", "A_log", "g_bias", "scale", "sq_t", "sq_h", "sk_t", "sk_h", "sv_t",
             "sv_h", "sg_t", "sg_h", "sb_t", "sb_h", "o", "so_t", "so_h", "h0", "ht", "sh0_n", "sh0_h", "sht_n",
             "sht_h", "n_slots", "ckpt", "sck_n", "n_ckpt_rows", "stream")
RUN_INDEX = {name: i for i, name in enumerate(RUN_ORDER)}


def picker(names: Sequence[str]) -> Callable[[list], tuple]:
    """values -> the named values, in `names`' order (one C call per run)."""
    unknown = [n for n in names if n not in RUN_INDEX]
    if unknown:
        raise KeyError(f"not per-run values: {unknown}; RUN_ORDER names {', '.join(RUN_ORDER)}")
    get = operator.itemgetter(*(RUN_INDEX[n] for n in names))
    return get if len(names) > 1 else lambda values: (get(values),)
