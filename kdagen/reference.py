# SPDX-License-Identifier: Apache-2.0
"""Float64 reference of `chunk_kda_prefill`: the token-by-token KDA recurrence from raw inputs.

This is the ground truth every kernel is tested against (docs/semantics.md). It
takes exactly the op's arguments, computes in float64 on the inputs' device, and walks the tokens
one at a time in Python. Sequences are sorted by length so that at token step t the sequences still
running form a prefix of the batch; each step is a handful of batched torch ops over
`[active sequences * H, V, K]`, so a few thousand tokens take seconds on a GPU.

State is V-first: one `P in R^{V x K}` per (sequence, head). Per token:

    P <- P * diag(exp g_t);  e = beta_t * (v_t - P k_t);  P <- P + e k_t^T;  o_t = P (scale * q_t)
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

__all__ = [
    "chunk_kda_prefill_reference",
    "intra_workspace_reference",
    "kda_gate_reference",
    "l2norm_reference",
    "naive_recurrent_kda",
    "rel_l2",
]

_F64 = torch.float64
L2NORM_EPS = 1e-6


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| in float64. Non-finite values in `a` give inf or nan, never a small number.

    If `b` is all zeros, returns 0.0 when `a` is too and inf otherwise.
    """
    a64 = a.detach().to(_F64)
    b64 = b.detach().to(_F64)
    if a64.shape != b64.shape:
        raise ValueError(f"rel_l2: shapes differ: {tuple(a64.shape)} vs {tuple(b64.shape)}")
    if not bool(torch.isfinite(a64).all()):
        # NaN anywhere -> nan; otherwise an infinite entry -> inf.
        return float("nan") if bool(torch.isnan(a64).any()) else float("inf")
    num = torch.linalg.vector_norm(a64 - b64).item()
    den = torch.linalg.vector_norm(b64).item()
    if den == 0.0:
        return 0.0 if num == 0.0 else float("inf")
    return num / den


def kda_gate_reference(
    raw_g: torch.Tensor,
    A_log: torch.Tensor,
    g_bias: torch.Tensor | None = None,
    lower_bound: float | None = None,
) -> torch.Tensor:
    """Log-space decay g (float64, same shape as raw_g `[..., H, K]`).

    z = raw_g + g_bias (viewed [H, K]);
    lower_bound None: g = -exp(A_log[h]) * softplus(z)  (beta 1, threshold 20: linear above 20);
    else:             g = lower_bound * sigmoid(exp(A_log[h]) * z).
    """
    if raw_g.dim() < 2:
        raise ValueError(f"raw_g must be [..., H, K]; got shape {tuple(raw_g.shape)}")
    H, K = raw_g.shape[-2], raw_g.shape[-1]
    if A_log.numel() != H:
        raise ValueError(f"A_log must have H={H} entries; got shape {tuple(A_log.shape)}")
    z = raw_g.to(_F64)
    if g_bias is not None:
        if g_bias.numel() != H * K:
            raise ValueError(
                f"g_bias must have H*K={H * K} entries (viewed [H, K]); got shape {tuple(g_bias.shape)}"
            )
        z = z + g_bias.to(device=z.device, dtype=_F64).reshape(H, K)
    a = torch.exp(A_log.to(device=z.device, dtype=_F64).reshape(H, 1))
    if lower_bound is None:
        return -a * F.softplus(z, beta=1.0, threshold=20.0)
    return float(lower_bound) * torch.sigmoid(a * z)


def l2norm_reference(x: torch.Tensor) -> torch.Tensor:
    """x / sqrt(sum(x^2) + 1e-6) over the last dim, in float64."""
    x64 = x.to(_F64)
    return x64 / torch.sqrt((x64 * x64).sum(-1, keepdim=True) + L2NORM_EPS)


def _walk(
    X: torch.Tensor,
    K: int,
    V: int,
    bos: list[int],
    lens: list[int],
    h0: torch.Tensor,
    checkpoints: dict[int, list[tuple[int, int]]] | None = None,
    on_checkpoint=None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token walk over packed, preprocessed float64 rows.

    X: [T_total, H, 3K + V + 1] = [scale*q | k | exp(g) | v | beta] per token and head.
    bos/lens: host lists, one entry per sequence. h0: [N, H, V, K] float64 (not modified).
    checkpoints: {tokens done: [(sequence, row), ...]}; on_checkpoint(row, state [H, V, K]) is called
    with the state after exactly that many tokens of that sequence.
    Returns (o [T_total, H, V], final [N, H, V, K]).
    """
    T_total, H = X.shape[0], X.shape[1]
    N = len(lens)
    device = X.device
    o = torch.zeros(T_total, H, V, dtype=_F64, device=device)
    final = h0.clone()
    if N == 0:
        return o, final
    # Longest first, so the sequences still running at step t are a prefix of the sorted order.
    order = sorted(range(N), key=lambda n: -lens[n])
    pos_of = {n: j for j, n in enumerate(order)}
    P = h0[order].clone().contiguous()  # [N, H, V, K]
    bos_sorted = torch.tensor([bos[n] for n in order], dtype=torch.long, device=device)
    lens_sorted = [lens[n] for n in order]
    t_max = lens_sorted[0]
    active = N
    for t in range(t_max):
        while active > 0 and lens_sorted[active - 1] <= t:
            active -= 1
        idx = bos_sorted[:active] + t
        x = X.index_select(0, idx).reshape(active * H, -1)  # [c*H, 3K+V+1]
        qs, kt, dec = x[:, :K], x[:, K : 2 * K], x[:, 2 * K : 3 * K]
        vt, bt = x[:, 3 * K : 3 * K + V], x[:, 3 * K + V :]
        Pa = P[:active].view(active * H, V, K)
        Pa.mul_(dec.unsqueeze(1))  # decay the K axis
        e = bt * (vt - torch.bmm(Pa, kt.unsqueeze(2)).squeeze(2))  # [c*H, V]
        Pa.baddbmm_(e.unsqueeze(2), kt.unsqueeze(1))  # P += e k^T
        ot = torch.bmm(Pa, qs.unsqueeze(2)).squeeze(2)  # [c*H, V]
        o.index_copy_(0, idx, ot.view(active, H, V))
        if checkpoints and (t + 1) in checkpoints:
            for n, row in checkpoints[t + 1]:
                on_checkpoint(row, P[pos_of[n]])
    final[order] = P
    return o, final


def naive_recurrent_kda(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence of preprocessed inputs: q, k, g [T, H, K]; v [T, H, V]; beta [T, H]; state [H, V, K].

    q and k are used as given (normalise them first if needed), g is the log decay, beta the
    post-sigmoid scalar. Returns (o [T, H, V], final state [H, V, K]), both float64.
    """
    T, H, K = k.shape
    V = v.shape[-1]
    dev = k.device
    h0 = torch.zeros(1, H, V, K, dtype=_F64, device=dev)
    if initial_state is not None:
        h0[0] = initial_state.to(device=dev, dtype=_F64).reshape(H, V, K)
    X = torch.cat(
        [
            q.to(_F64) * scale,
            k.to(_F64),
            torch.exp(g.to(_F64)),
            v.to(_F64),
            beta.to(_F64).reshape(T, H, 1),
        ],
        dim=-1,
    )
    o, final = _walk(X, K, V, [0], [T], h0)
    return o, final[0]


def _host_ints(x: torch.Tensor, name: str) -> list[int]:
    if x.dim() != 1 or x.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{name} must be a 1-D int32/int64 tensor; got {x.dtype} of shape {tuple(x.shape)}")
    return [int(i) for i in x.detach().cpu().tolist()]


def chunk_kda_prefill_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    raw_g: torch.Tensor,
    raw_beta: torch.Tensor,
    A_log: torch.Tensor,
    g_bias: torch.Tensor | None = None,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    lower_bound: float | None = None,
    use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    checkpoint_state: torch.Tensor | None = None,
    checkpoint_offsets: torch.Tensor | None = None,
    checkpoint_state_indices: torch.Tensor | None = None,
    state_cache: torch.Tensor | None = None,
    state_indices: torch.Tensor | None = None,
    has_initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Float64 reference of `chunk_kda_prefill` (same arguments, minus the kernel-only ones).

    Returns (o float64 shaped like v, final state float64 [N, H, V, K] or None). With `state_cache`
    the final states are written into `state_cache[state_indices[n]]` in place (cast to its dtype)
    and None is returned. Checkpoints: for each sequence n with 0 < checkpoint_offsets[n] < T_n, the
    state after exactly that many tokens is written in place into `checkpoint_state[row]`, row =
    checkpoint_state_indices[n] (negative: skip) or n. Any offset is accepted here (the kernels only
    honour multiples of their chunk size); other offsets write nothing.
    """
    # --- argument checks (vLLM's op's ValueErrors first) -------------------------------------
    if state_cache is not None:
        if initial_state is not None or output_final_state:
            raise ValueError("state_cache replaces initial_state/output_final_state")
        if state_indices is None or has_initial_state is None:
            raise ValueError("state_cache needs state_indices and has_initial_state")
    if (checkpoint_state is None) != (checkpoint_offsets is None):
        raise ValueError("checkpoint_state and checkpoint_offsets must be given together")
    if checkpoint_state_indices is not None and checkpoint_offsets is None:
        raise ValueError("checkpoint_state_indices needs checkpoint_state and checkpoint_offsets")
    if q.dim() != 4 or k.shape != q.shape or v.dim() != 4 or v.shape[:3] != q.shape[:3]:
        raise ValueError(
            f"expected q, k [B, T, H, K] and v [B, T, H, V]; got q {tuple(q.shape)}, "
            f"k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    B, T, H, K = q.shape
    V = v.shape[-1]
    if raw_g.shape != q.shape:
        raise ValueError(f"raw_g must be [B, T, H, K] = {tuple(q.shape)}; got {tuple(raw_g.shape)}")
    if raw_beta.shape != q.shape[:3]:
        raise ValueError(f"raw_beta must be [B, T, H] = {tuple(q.shape[:3])}; got {tuple(raw_beta.shape)}")
    if scale is None:
        scale = K**-0.5
    device = q.device

    # --- sequences ----------------------------------------------------------------------------
    if cu_seqlens is not None:
        if B != 1:
            raise ValueError(f"cu_seqlens needs batch size 1 (packed varlen); got B={B}")
        cu = _host_ints(cu_seqlens, "cu_seqlens")
        if len(cu) < 1 or cu[0] != 0 or cu[-1] != T or any(b > e for b, e in zip(cu[:-1], cu[1:])):
            raise ValueError(f"cu_seqlens must rise monotonically from 0 to T={T}; got {cu[:8]}...")
        bos, lens = cu[:-1], [e - b for b, e in zip(cu[:-1], cu[1:])]
    else:
        bos, lens = [n * T for n in range(B)], [T] * B
    N = len(lens)

    # --- initial states -------------------------------------------------------------------------
    h0 = torch.zeros(N, H, V, K, dtype=_F64, device=device)
    slots: list[int] = []
    if initial_state is not None:
        if tuple(initial_state.shape) != (N, H, V, K):
            raise ValueError(
                f"initial_state must be [N, H, V, K] = {(N, H, V, K)} (V-first); got {tuple(initial_state.shape)}"
            )
        h0.copy_(initial_state.to(device=device, dtype=_F64))
    if state_cache is not None:
        if state_cache.dim() != 4 or tuple(state_cache.shape[1:]) != (H, V, K):
            raise ValueError(f"state_cache must be [slots, H, V, K] with (H, V, K) = {(H, V, K)}; "
                             f"got {tuple(state_cache.shape)}")
        slots = _host_ints(state_indices, "state_indices")
        flags = [bool(f) for f in has_initial_state.detach().cpu().reshape(-1).tolist()]
        if len(slots) != N or len(flags) != N:
            raise ValueError(f"state_indices and has_initial_state need N={N} entries; "
                             f"got {len(slots)} and {len(flags)}")
        bad = [s for s in slots if not 0 <= s < state_cache.shape[0]]
        if bad:
            raise ValueError(f"state_indices must lie in [0, {state_cache.shape[0]}); got {bad[:8]}")
        for n in range(N):
            if flags[n]:  # rows with a false flag are never read
                h0[n] = state_cache[slots[n]].to(device=device, dtype=_F64)

    # --- checkpoints ------------------------------------------------------------------------------
    checkpoints: dict[int, list[tuple[int, int]]] = {}
    if checkpoint_offsets is not None:
        offs = _host_ints(checkpoint_offsets.reshape(-1), "checkpoint_offsets")
        if len(offs) != N:
            raise ValueError(f"checkpoint_offsets needs N={N} entries; got {len(offs)}")
        rows = (
            _host_ints(checkpoint_state_indices.reshape(-1), "checkpoint_state_indices")
            if checkpoint_state_indices is not None
            else list(range(N))
        )
        if len(rows) != N:
            raise ValueError(f"checkpoint_state_indices needs N={N} entries; got {len(rows)}")
        for n in range(N):
            if rows[n] < 0 or not 0 < offs[n] < lens[n]:
                continue
            if rows[n] >= checkpoint_state.shape[0]:
                raise ValueError(f"checkpoint row {rows[n]} of sequence {n} is outside checkpoint_state "
                                 f"({checkpoint_state.shape[0]} rows)")
            checkpoints.setdefault(offs[n], []).append((n, rows[n]))

    def write_checkpoint(row: int, state: torch.Tensor) -> None:
        checkpoint_state[row] = state.to(device=checkpoint_state.device, dtype=checkpoint_state.dtype)

    # --- preprocessing (float64) ------------------------------------------------------------------
    q64 = q.to(_F64).reshape(B * T, H, K)
    k64 = k.to(_F64).reshape(B * T, H, K)
    if use_qk_l2norm_in_kernel:
        q64, k64 = l2norm_reference(q64), l2norm_reference(k64)
    g = kda_gate_reference(raw_g.reshape(B * T, H, K), A_log, g_bias, lower_bound)
    beta = torch.sigmoid(raw_beta.to(_F64)).reshape(B * T, H, 1)
    X = torch.cat([q64 * scale, k64, torch.exp(g), v.to(_F64).reshape(B * T, H, V), beta], dim=-1)

    o, final = _walk(X, K, V, bos, lens, h0, checkpoints, write_checkpoint)
    o = o.reshape(B, T, H, V)

    if state_cache is not None:
        for n in range(N):
            state_cache[slots[n]] = final[n].to(device=state_cache.device, dtype=state_cache.dtype)
        return o, None
    return o, (final if output_final_state else None)



def intra_workspace_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    raw_g: torch.Tensor,
    raw_beta: torch.Tensor,
    A_log: torch.Tensor,
    g_bias: torch.Tensor | None,
    scale: float,
    lower_bound: float,
    cu_seqlens: torch.Tensor,
    chunk_size: int = 64,
    rows: int = 16,
) -> dict[str, torch.Tensor]:
    """Float64 workspace of the chunk-parallel kernels on `rows`-row walk chunks (kda_intra's contract,
    docs/design.md, "The chunk stages"), for the bounded gate with q and k L2-normed.

    Inputs packed [1, T, H, *]. Per walk chunk, with G the in-chunk cumulative log2 gate and G_L its last
    valid row: qg = q 2^G, kg = k 2^(G_L - G), aqk = tril(q k^T 2^(G_i - G_j)) scale, A = strictly lower
    beta_i k_i k_j^T 2^(G_i - G_j), T = (I + A)^-1, w = T diag(beta) k 2^G, u = T diag(beta) v; decay = 2^G_L,
    one row per walk chunk in chunk_indices order (the metadata chunk's `chunk_size // rows` parts in turn;
    parts past the sequence's end are NaN). Returns qg, kg, w [T, H, K], u [T, H, V], aqk [T, H, rows] and
    decay [walk chunks, H, K], float64 on the inputs' device.
    """
    _, T, H, K = q.shape
    V = v.shape[-1]
    dev = q.device
    qn = l2norm_reference(q[0])
    kn = l2norm_reference(k[0])
    vv = v[0].to(_F64)
    gate = kda_gate_reference(raw_g[0], A_log, g_bias, lower_bound) / math.log(2.0)
    beta = torch.sigmoid(raw_beta[0].to(_F64))
    out = {"qg": torch.zeros(T, H, K, dtype=_F64, device=dev), "kg": torch.zeros(T, H, K, dtype=_F64, device=dev),
           "w": torch.zeros(T, H, K, dtype=_F64, device=dev), "u": torch.zeros(T, H, V, dtype=_F64, device=dev),
           "aqk": torch.zeros(T, H, rows, dtype=_F64, device=dev)}
    bounds = _host_ints(cu_seqlens, "cu_seqlens")
    parts = chunk_size // rows
    decay = []
    for bos, eos in zip(bounds[:-1], bounds[1:]):
        for c0 in range(bos, eos, chunk_size):
            for part in range(parts):
                t0 = c0 + part * rows
                n = min(eos - t0, rows)
                if n <= 0:
                    decay.append(torch.full((H, K), float("nan"), dtype=_F64, device=dev))
                    continue
                sl = slice(t0, t0 + n)
                G = gate[sl].cumsum(0).transpose(0, 1)  # [H, n, K]
                q_, k_ = qn[sl].transpose(0, 1), kn[sl].transpose(0, 1)
                b_ = beta[sl].transpose(0, 1)  # [H, n]
                diff = G[:, :, None, :] - G[:, None, :, :]  # [H, i, j, K]
                low = torch.ones(n, n, dtype=torch.bool, device=dev).tril()
                e = torch.where(low[None, :, :, None], torch.exp2(torch.where(low[None, :, :, None], diff, 0.0)), 0.0)
                aqk = torch.einsum("hik,hjk,hijk->hij", q_, k_, e) * scale
                A = torch.einsum("hik,hjk,hijk->hij", k_, k_, e) * b_[:, :, None]
                A = A * (~torch.eye(n, dtype=torch.bool, device=dev))
                Tm = torch.linalg.inv(torch.eye(n, dtype=_F64, device=dev) + A)
                out["qg"][sl] = (q_ * torch.exp2(G)).transpose(0, 1)
                out["kg"][sl] = (k_ * torch.exp2(G[:, -1:, :] - G)).transpose(0, 1)
                out["w"][sl] = (Tm @ (b_[:, :, None] * k_ * torch.exp2(G))).transpose(0, 1)
                out["u"][sl] = (Tm @ (b_[:, :, None] * vv[sl].transpose(0, 1))).transpose(0, 1)
                out["aqk"][sl, :, :n] = aqk.transpose(0, 1)
                decay.append(torch.exp2(G[:, -1, :]))
    out["decay"] = torch.stack(decay) if decay else torch.zeros(0, H, K, dtype=_F64, device=dev)
    return out
