# SPDX-License-Identifier: Apache-2.0
"""The package used the way vLLM's KDA layers use it, for tests/e2e/test_serving_loop.py (interpreter, small) and
tests/gpu/test_serving_loop.py (the H200, serving sizes).

A `Scenario` is a few requests over three engine steps, each layer with its own weights (A_log, g_bias) and its
own paged state cache. Per step the metadata is built once on the device from cu_seqlens and its CPU copy
(prepare_chunk_metadata_device), one plan is made (plan_kda_prefill), and every layer runs it. The requests:

- "long": a prompt split over the three steps at lengths off the chunk grid (chunked prefill, each later part
  continuing from the cache row through has_initial_state);
- "shared": a prompt that writes a checkpoint at `prefix` tokens (a multiple of 64) into a per-layer checkpoint
  buffer; "resumed": a later request with the same first `prefix` tokens, whose cache row is loaded from that
  checkpoint (a prefix-cache hit) and which prefills only its own suffix;
- "single" (one token, then one more in the next step) and "one" (one token): single-token sequences mixed in.

Every output and final cache row is checked against the float64 reference of the request's whole prompt in one
shot, and "long" also against the kernels' own one-shot prefill. Everything runs under torch.inference_mode().
"""

from __future__ import annotations

import sys
import threading
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch

import kdagen_kernels
from tests.kda_cases import cu_of
from tests.tolerances import check, check_output, output_terms

CHUNK = 64
LOWER_BOUND = -5.0  # vLLM's Kimi gate: bounded, with g_bias and the L2 norm in kernel
# Cache rows, permuted; rows 2 and 6 belong to no request and must never be written.
SLOTS = {"single": 0, "resumed": 1, "long": 3, "one": 4, "shared": 5}
N_SLOTS = 7


@dataclass(frozen=True)
class Scenario:
    heads: int
    head_dim: int
    layers: int
    dtype: torch.dtype
    device: str
    long_splits: tuple[int, int, int]  # the long prompt's three parts
    prefix: int  # the checkpoint offset, a multiple of CHUNK
    shared_suffix: int
    resumed_suffix: int
    path: str  # the tolerance table's path for this device

    def __post_init__(self) -> None:
        assert self.prefix % CHUNK == 0 and self.prefix > 0

    @property
    def key(self) -> tuple[str, str]:
        return self.path, "bf16" if self.dtype is torch.bfloat16 else "fp16"

    @property
    def lengths(self) -> dict[str, int]:
        return {"long": sum(self.long_splits), "single": 2, "shared": self.prefix + self.shared_suffix,
                "resumed": self.prefix + self.resumed_suffix, "one": 1}

    def steps(self) -> list[list[tuple[str, int, int]]]:
        """Per step, (request, first token, end token): a part starting past 0 continues from the cache."""
        a, b, _ = self.long_splits
        n = self.lengths
        return [[("long", 0, a), ("single", 0, 1), ("shared", 0, n["shared"])],
                [("long", a, a + b), ("resumed", self.prefix, n["resumed"]), ("one", 0, 1), ("single", 1, 2)],
                [("long", a + b, n["long"])]]


@dataclass
class Model:
    """Per layer: the gate weights and every request's per-token inputs [n, H, *] (on the CPU); "resumed"
    shares its first `prefix` tokens, hence their inputs at every layer, with "shared"."""

    s: Scenario
    weights: list[dict[str, torch.Tensor]] = field(default_factory=list)
    tokens: list[dict[str, dict[str, torch.Tensor]]] = field(default_factory=list)

    @classmethod
    def make(cls, s: Scenario, seed: int = 0) -> Model:
        gen = torch.Generator().manual_seed(seed)
        H, D = s.heads, s.head_dim
        m = cls(s)
        for _ in range(s.layers):
            m.weights.append({"A_log": torch.rand(H, generator=gen), "g_bias": torch.rand(H * D, generator=gen)})
            per: dict[str, dict[str, torch.Tensor]] = {}
            for name, n in s.lengths.items():
                per[name] = {"q": torch.randn(n, H, D, generator=gen), "k": torch.randn(n, H, D, generator=gen),
                             "v": torch.randn(n, H, D, generator=gen), "raw_g": torch.randn(n, H, D, generator=gen),
                             "raw_beta": torch.randn(n, H, generator=gen)}
                per[name] = {k: x.to(s.dtype) for k, x in per[name].items()}
            for x, y in zip(per["resumed"].values(), per["shared"].values()):
                x[:s.prefix] = y[:s.prefix]
            m.tokens.append(per)
        return m

    def packed(self, layer: int, parts: list[tuple[str, int, int]]) -> dict[str, torch.Tensor]:
        """One layer's inputs for a step's parts, packed [1, T, H, *] on the device."""
        dev = self.s.device
        per = self.tokens[layer]
        out = {k: torch.cat([per[r][k][a:b] for r, a, b in parts])[None].to(dev) for k in per["long"]}
        out.update({k: w.to(dev) for k, w in self.weights[layer].items()})
        return out

    def reference(self, layer: int, name: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(outputs [n, H, V], their terms, final state [H, V, K], state after `prefix` tokens), float64, of the
        request's whole prompt in one shot from a zero state; computed on the scenario's device, returned on the CPU."""
        s, n = self.s, self.s.lengths[name]
        args = {k: x[None].to(s.device) for k, x in self.tokens[layer][name].items()}
        args.update({k: w.to(s.device) for k, w in self.weights[layer].items()})
        ckpt = torch.full((1, s.heads, s.head_dim, s.head_dim), float("nan"), dtype=torch.float64, device=s.device)
        o, final, terms = output_terms(
            **args, lower_bound=LOWER_BOUND, use_qk_l2norm_in_kernel=True, cu_seqlens=cu_of([n], s.device),
            output_final_state=True, checkpoint_state=ckpt,
            checkpoint_offsets=torch.tensor([s.prefix], device=s.device))  # written where n > prefix
        return o[0].cpu(), terms[0].cpu(), final[0].cpu(), ckpt[0].cpu()


def step_plan(s: Scenario, parts: list[tuple[str, int, int]], cu: torch.Tensor, cu_cpu: torch.Tensor,
              checkpoint_rows: dict[str, int]) -> tuple[kdagen_kernels.KdaPrefillPlan, dict]:
    """The step's metadata on the device and its one plan; returns (plan, the metadata it was made from)."""
    dev = s.device
    chunk_indices, chunk_offsets = kdagen_kernels.prepare_chunk_metadata_device(cu, cu_cpu, CHUNK)
    meta = dict(cu_seqlens=cu, chunk_indices=chunk_indices, chunk_offsets=chunk_offsets,
                state_indices=torch.tensor([SLOTS[r] for r, _, _ in parts], dtype=torch.int32, device=dev),
                has_initial_state=torch.tensor([a > 0 for _, a, _ in parts], device=dev))
    ckpt = {}
    if checkpoint_rows:
        ckpt = dict(checkpoint_offsets=torch.tensor([s.prefix if r in checkpoint_rows else 0 for r, _, _ in parts],
                                                    dtype=torch.int32, device=dev),
                    checkpoint_state_indices=torch.tensor([checkpoint_rows.get(r, -1) for r, _, _ in parts],
                                                          dtype=torch.int32, device=dev))
    plan = kdagen_kernels.plan_kda_prefill(
        cu_seqlens_cpu=cu_cpu, num_heads=s.heads, head_dim_k=s.head_dim, head_dim_v=s.head_dim, dtype=s.dtype,
        device=dev, lower_bound=LOWER_BOUND, has_g_bias=True, use_qk_l2norm_in_kernel=True, **meta, **ckpt)
    return plan, {**meta, **ckpt}


def new_caches(s: Scenario, fill: float = float("nan")) -> list[torch.Tensor]:
    """Per layer its own paged state cache; NaN rows until a request writes them (a read before is a bug)."""
    shape = (N_SLOTS, s.heads, s.head_dim, s.head_dim)
    return [torch.full(shape, fill, dtype=torch.float32, device=s.device) for _ in range(s.layers)]


def serve(m: Model) -> tuple[dict[tuple[str, int], list[torch.Tensor]], list[torch.Tensor], list[torch.Tensor]]:
    """The three steps. Returns ({(request, layer): its outputs per step}, the caches, the checkpoints)."""
    s = m.s
    caches = new_caches(s)
    checkpoints = [torch.full((1, s.heads, s.head_dim, s.head_dim), float("nan"), device=s.device)
                   for _ in range(s.layers)]
    outs: dict[tuple[str, int], list[torch.Tensor]] = {}
    for step, parts in enumerate(s.steps()):
        if step == 1:  # the prefix-cache hit: the new request's row starts from the shared prompt's checkpoint
            for layer in range(s.layers):
                caches[layer][SLOTS["resumed"]] = checkpoints[layer][0]
        lens = [b - a for _, a, b in parts]
        cu_cpu = cu_of(lens, "cpu")
        plan, _ = step_plan(s, parts, cu_cpu.to(s.device), cu_cpu, {"shared": 0} if step == 0 else {})
        for layer in range(s.layers):
            x = m.packed(layer, parts)
            out = torch.empty_like(x["v"])
            o, final = plan.run(x["q"], x["k"], x["v"], x["raw_g"], x["raw_beta"], x["A_log"], x["g_bias"], out=out,
                                state_cache=caches[layer], checkpoint_state=checkpoints[layer] if step == 0 else None)
            assert o is out and final is None
            for (r, _, _), piece in zip(parts, o[0].split(lens)):
                outs.setdefault((r, layer), []).append(piece)
    if s.device != "cpu":
        torch.cuda.synchronize()
    return outs, caches, checkpoints


def check_served(m: Model, outs, caches, checkpoints) -> None:
    """Every request's outputs, final row and the checkpoint against the one-shot float64 reference."""
    s = m.s
    key = s.key
    for layer in range(s.layers):
        for name, n in s.lengths.items():
            ref_o, terms, final, at_prefix = m.reference(layer, name)
            first = s.prefix if name == "resumed" else 0
            got = torch.cat(outs[(name, layer)]).cpu()
            assert got.shape[0] == n - first, (name, got.shape)
            check_output(f"layer {layer} {name} outputs", got, ref_o[first:], terms[first:], s.head_dim,
                         (*key, "output"))
            check(f"layer {layer} {name} final row", caches[layer][SLOTS[name]].cpu(), final, (*key, "final_state"))
            if name == "shared":
                check(f"layer {layer} checkpoint at {s.prefix}", checkpoints[layer][0].cpu(), at_prefix,
                      (*key, "final_state"))
        cache = caches[layer].cpu()
        for row in sorted(set(range(N_SLOTS)) - set(SLOTS.values())):
            assert cache[row].isnan().all(), f"layer {layer}: cache row {row} of no request was written"


def one_shot(m: Model, name: str, layer: int) -> torch.Tensor:
    """The kernels' own prefill of a request's whole prompt in one call (its outputs [n, H, V])."""
    s = m.s
    n = s.lengths[name]
    cu_cpu = cu_of([n], "cpu")
    plan, _ = step_plan(s, [(name, 0, n)], cu_cpu.to(s.device), cu_cpu, {})
    x = m.packed(layer, [(name, 0, n)])
    cache = new_caches(s)[0]
    o, _ = plan.run(x["q"], x["k"], x["v"], x["raw_g"], x["raw_beta"], x["A_log"], x["g_bias"], state_cache=cache)
    return o[0].cpu()


def serve_and_check(m: Model) -> None:
    """The three steps under torch.inference_mode(), checked (check_served), and the long prompt over three
    steps against the kernels' own prefill of it in one call (at the last layer)."""
    layer = m.s.layers - 1
    with torch.inference_mode():
        outs, caches, checkpoints = serve(m)
        whole = one_shot(m, "long", layer)
    check_served(m, outs, caches, checkpoints)
    _, terms, _, _ = m.reference(layer, "long")
    check_output("long prompt, split vs one call", torch.cat(outs[("long", layer)]).cpu(), whole.double(), terms,
                 m.s.head_dim, (*m.s.key, "output"))


def step_reference(m: Model, layer: int, parts, cache_before: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor,
                                                                                      torch.Tensor, list[int]]:
    """(outputs, terms, cache after, the rows it routes) of one step at one layer in float64, computed on the
    scenario's device and returned on the CPU."""
    dev = m.s.device
    lens = [b - a for _, a, b in parts]
    cache = cache_before.clone()
    rows = [SLOTS[r] for r, _, _ in parts]
    o, _, terms = output_terms(**m.packed(layer, parts), lower_bound=LOWER_BOUND, use_qk_l2norm_in_kernel=True,
                               cu_seqlens=cu_of(lens, dev), state_cache=cache,
                               state_indices=torch.tensor(rows, dtype=torch.int32, device=dev),
                               has_initial_state=torch.tensor([a > 0 for _, a, _ in parts], device=dev))
    return o.cpu(), terms.cpu(), cache.cpu(), rows


def concurrent_calls(m: Model, calls: int = 2, streams: bool = False) -> None:
    """Two threads at once, each serving the first step through the public chunk_kda_prefill with its own layer
    (inputs, weights, cache) but the very same metadata objects, as dual-batch overlap does; on the GPU each on
    its own stream. Every result is checked against the float64 reference."""
    s = m.s
    parts = s.steps()[0]
    lens = [b - a for _, a, b in parts]
    cu_cpu = cu_of(lens, "cpu")
    with torch.inference_mode():
        _, meta = step_plan(s, parts, cu_cpu.to(s.device), cu_cpu, {})
    layers = (0, 1)
    start = [new_caches(s, 0.0)[0] for _ in layers]
    refs = {layer: step_reference(m, layer, parts, start[i]) for i, layer in enumerate(layers)}
    barrier = threading.Barrier(len(layers), timeout=600)
    results: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
    errors: list[BaseException] = []

    def worker(i: int, layer: int) -> None:
        try:
            with torch.inference_mode():
                stream = torch.cuda.Stream() if streams else None
                x = m.packed(layer, parts)
                for call in range(calls):
                    cache = start[i].clone()
                    if stream is not None:  # the copies above ran on the default stream
                        stream.wait_stream(torch.cuda.current_stream())
                    barrier.wait()
                    with torch.cuda.stream(stream) if stream is not None else nullcontext():
                        o, _ = kdagen_kernels.chunk_kda_prefill(
                            x["q"], x["k"], x["v"], x["raw_g"], x["raw_beta"], x["A_log"], x["g_bias"],
                            lower_bound=LOWER_BOUND, use_qk_l2norm_in_kernel=True, state_cache=cache, **meta)
                    if stream is not None:
                        stream.synchronize()
                    results[(layer, call)] = (o, cache)
        except BaseException as exc:  # re-raised in the main thread; the other thread must not wait for this one
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=worker, args=(i, layer)) for i, layer in enumerate(layers)]
    # Switch threads every 10 us, not 5 ms, so the two calls' launches interleave: with the default a whole
    # interpreted call can finish before the other thread runs (measured: a workspace shared between the
    # threads' calls went unseen at the default and failed 3 runs in 3 at this interval).
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    if errors:
        raise next((e for e in errors if not isinstance(e, threading.BrokenBarrierError)), errors[0])
    key = s.key
    for (layer, call), (o, cache) in sorted(results.items()):
        ref_o, terms, ref_cache, rows = refs[layer]
        check_output(f"thread of layer {layer}, call {call}", o.cpu(), ref_o, terms, s.head_dim, (*key, "output"))
        for r in rows:
            check(f"thread of layer {layer}, call {call}, row {r}", cache[r].cpu(), ref_cache[r], (*key, "final_state"))


class KdaLayer(torch.nn.Module):
    """One KDA layer's attention call as vLLM's model code makes it: the public op on the layer's own weights."""

    def __init__(self, A_log: torch.Tensor, g_bias: torch.Tensor):
        super().__init__()
        self.register_buffer("A_log", A_log)
        self.register_buffer("g_bias", g_bias)

    def forward(self, q, k, v, raw_g, raw_beta, cu_seqlens, chunk_indices, chunk_offsets, state_cache, state_indices,
                has_initial_state):
        o, _ = kdagen_kernels.chunk_kda_prefill(
            q, k, v, raw_g, raw_beta, self.A_log, self.g_bias, lower_bound=LOWER_BOUND, use_qk_l2norm_in_kernel=True,
            cu_seqlens=cu_seqlens, chunk_indices=chunk_indices, chunk_offsets=chunk_offsets, state_cache=state_cache,
            state_indices=state_indices, has_initial_state=has_initial_state)
        return o


def compiled_layer(m: Model, backend: str) -> None:
    """The first step through a torch.compile(fullgraph=True) module calling the public op (no graph break)."""
    s = m.s
    parts = s.steps()[0]
    lens = [b - a for _, a, b in parts]
    cu_cpu = cu_of(lens, "cpu")
    start = new_caches(s, 0.0)[0]
    ref_o, terms, ref_cache, rows = step_reference(m, 0, parts, start)
    torch._dynamo.reset()
    with torch.inference_mode():
        _, meta = step_plan(s, parts, cu_cpu.to(s.device), cu_cpu, {})
        x = m.packed(0, parts)
        layer = torch.compile(KdaLayer(x["A_log"], x["g_bias"]), fullgraph=True, backend=backend)
        cache = start.clone()
        o = layer(x["q"], x["k"], x["v"], x["raw_g"], x["raw_beta"], meta["cu_seqlens"], meta["chunk_indices"],
                  meta["chunk_offsets"], cache, meta["state_indices"], meta["has_initial_state"])
    key = s.key
    check_output("compiled layer output", o.cpu(), ref_o, terms, s.head_dim, (*key, "output"))
    for r in rows:
        check(f"compiled layer row {r}", cache[r].cpu(), ref_cache[r], (*key, "final_state"))
