# SPDX-License-Identifier: Apache-2.0
"""Device helpers shared by the Triton kernels: gate, products in the I/O dtype, chunk rows, state rows.

IO is the variant's I/O dtype (tl.bfloat16 or tl.float16). DOT_F32 marks interpreter runs: the Triton
interpreter multiplies raw bf16 bit patterns in tl.dot (triton#11584), so there the matrix operands are
widened to fp32 instead of narrowed.
"""

import triton
import triton.language as tl
from triton.language.extra import libdevice

# Natural log -> log2: the kernels keep the cumulative gate in base 2 so decays are exp2.
RCP_LN2 = tl.constexpr(1.4426950408889634)
# The gate's saturation bounds (docs/reference.md, "Gate saturation"). Bounded gate: a = exp(A_log) is
# taken at most exp(40) = 2.4e17, where sigmoid(a z) is already exactly 0 or 1 in fp32 for every |z| >= 1e-16
# and the folded products z a / ln 2, bias a / ln 2 stay finite for |z|, |bias| < 1e21.
A_LOG_MAX = tl.constexpr(40.0)
# Softplus gate: a is two finite factors, exp(min(A_log, 88)) and exp(clamp(A_log - 88, 0, 88)), and -g is
# taken at most G_MAX = 128 per token: exp(-128) = 2.6e-56 is below fp32's smallest number, so the
# reference's decay (smaller still) is 0 as well, and a chunk's cumulative gate, at most 64 * 128 / ln 2,
# keeps fp32 steps below 0.001.
A_LOG_SPLIT = tl.constexpr(88.0)
G_MAX = tl.constexpr(128.0)

@triton.jit
def to_io(x, IO: tl.constexpr, DOT_F32: tl.constexpr):
    # A matrix operand: the I/O dtype, or fp32 under the interpreter.
    if DOT_F32:
        return x.to(tl.float32)
    else:
        return x.to(IO)


@triton.jit
def mm(a, b, IO: tl.constexpr, DOT_F32: tl.constexpr):
    # Tensor-core product in the I/O dtype with fp32 accumulation.
    return tl.dot(to_io(a, IO, DOT_F32), to_io(b, IO, DOT_F32))


@triton.jit
def mma(a, b, acc, IO: tl.constexpr, DOT_F32: tl.constexpr):
    # acc + a @ b, operands in the I/O dtype.
    return tl.dot(to_io(a, IO, DOT_F32), to_io(b, IO, DOT_F32), acc)


@triton.jit
def mma_wide(a, b, acc, DOT_F32: tl.constexpr):
    # acc + a @ b with bf16 operands whatever the I/O dtype: the diagonal blocks' operands reach
    # 2^(+-8 rows of decay), far past fp16's range; bf16 has fp32's exponent range.
    if DOT_F32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc)
    else:
        return tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16), acc)


@triton.jit
def mm32(a, b, FP32_DOT: tl.constexpr):
    # fp32-accurate product (FP32_DOT per target: tf32x3 on the tensor cores, ieee elsewhere): the
    # triangular inverse must not round to bf16/tf32 (with near-duplicate keys and beta near 1 its entries
    # cancel; tests/interp/test_robustness.py). ieee on sm_90 runs on the FMA units: 0.34 ms more of the
    # prologue's 3.7 at H=96 T=16384 N=16 (H200 ablation, 2026-11-30).
    return tl.dot(a, b, input_precision=FP32_DOT)


@triton.jit
def bias_row(g_bias, i_h, o_k, m_k, K: tl.constexpr, HAS_BIAS: tl.constexpr):
    # Head i_h's gate bias on columns o_k (g_bias is [H * K]), or zeros without one.
    if HAS_BIAS:
        return tl.load(g_bias + i_h * K + o_k, mask=m_k, other=0.0).to(tl.float32)
    else:
        return tl.zeros(o_k.shape, dtype=tl.float32)


@triton.jit
def fast_sigmoid(x, DOT_F32: tl.constexpr):
    # 1 / (1 + exp(-x)) with the fast (approximate reciprocal) division: the IEEE one is a dozen instructions,
    # repeated wherever the compiler replicates a row vector (kda_intra: -0.12 ms at H=96 T=16384 N=16). The
    # interpreter (DOT_F32 marks its runs) has no libdevice.
    if DOT_F32:
        return tl.sigmoid(x)
    else:
        return libdevice.fast_dividef(1.0, 1.0 + tl.exp(-x))


@triton.jit
def gate_a(A_log, i_h, LOWER_BOUND: tl.constexpr):
    # a = exp(A_log[h]) as the gates take it, a pair (a, a_x) with a * a_x = exp(A_log) below the bounds: the
    # bounded gate reads a = exp(min(A_log, A_LOG_MAX)) only; the softplus one multiplies by both factors.
    # exp(A_log) itself is inf in fp32 from 88.7 on, and inf times a masked row's 0 is NaN.
    log_a = tl.load(A_log + i_h).to(tl.float32)
    if LOWER_BOUND:
        a = tl.exp(tl.minimum(log_a, A_LOG_MAX))
        return a, a
    else:
        return (tl.exp(tl.minimum(log_a, A_LOG_SPLIT)),
                tl.exp(tl.minimum(tl.maximum(log_a - A_LOG_SPLIT, 0.0), A_LOG_SPLIT)))


@triton.jit
def softplus_gate(z, a, a_x):
    # Log-space decay g = -a a_x softplus(z) <= 0 of the unbounded gate (the bounded one is folded into
    # chunk_gate), z the biased raw gate, taken at most G_MAX: a product that overflows is inf, then G_MAX.
    # softplus(z) = max(z, 0) + log1p(exp(-|z|)); below z = -5, log1p(e) = e (1 - e/2 + e^2/3) to 1e-7 relative,
    # where log(1 + e) would round e away (it matters once a is large).
    b_e = tl.exp(-tl.abs(z))
    b_sp = tl.where(z < -5.0, b_e * (1.0 - b_e * (0.5 - b_e * 0.3333333333333333)),
                    tl.maximum(z, 0.0) + tl.log(1.0 + b_e))
    return -tl.minimum(b_sp * a_x * a, G_MAX)


@triton.jit
def chunk_gate(raw_g, tok, n_valid, i_h, sg_t, sg_h, o_r, o_k, m_k, b_bias, a_h, a_x, lower_bound,
               LOWER_BOUND: tl.constexpr):
    # log2 decay of one block of rows; rows past the sequence end get 0, so the cumulative G stays
    # at the last valid row's value there. a_h, a_x: gate_a's pair.
    mask = (o_r < n_valid)[:, None] & m_k[None, :]
    b_z = tl.load(raw_g + tok[:, None] * sg_t + i_h * sg_h + o_k[None, :], mask=mask, other=0.0)
    if LOWER_BOUND:
        # lower_bound * sigmoid(a (z + bias)) / ln 2 with the constants folded per column, c = -a / ln 2:
        # one FMA, one exp2 and one division per element (-0.11 ms of the two prologue kernels at H=96
        # T=16384 N=16, -0.26 at H=32 T=65536 N=1 on an H200; docs/perf-archive.md, "The bounded gate folded").
        c = -a_h * RCP_LN2
        b_e = tl.exp2(b_z.to(tl.float32) * c + (b_bias * c)[None, :])
        return tl.where(mask, (lower_bound * RCP_LN2) / (1.0 + b_e), 0.0)
    b_z = b_z.to(tl.float32) + b_bias[None, :]
    return tl.where(mask, softplus_gate(b_z, a_h, a_x), 0.0) * RCP_LN2


@triton.jit
def chunk_rows(chunk_indices, cu_seqlens, i_c, BT: tl.constexpr):
    # First token of chunk i_c (a chunk_indices row: sequence, chunk within it) and its valid row count.
    i_n = tl.load(chunk_indices + i_c * 2).to(tl.int64)
    i_t = tl.load(chunk_indices + i_c * 2 + 1).to(tl.int64)
    bos = tl.load(cu_seqlens + i_n).to(tl.int64)
    eos = tl.load(cu_seqlens + i_n + 1).to(tl.int64)
    t0 = bos + i_t * BT
    return t0, tl.minimum(eos - t0, BT)


@triton.jit
def u_slices(v, u_ws, b_T, b_beta, tok, ws, m_t, i_h, sv_t, sv_h, BLOCK: tl.constexpr, V: tl.constexpr,
             BV: tl.constexpr, IO: tl.constexpr, DOT_F32: tl.constexpr):
    # u = T diag(beta) v of one chunk, BLOCK columns of V at a time.
    o_s = tl.arange(0, BLOCK)
    for vv in range(0, BV, BLOCK):
        o_v = vv + o_s
        m_v = o_v < V
        b_v = tl.load(v + tok[:, None] * sv_t + i_h * sv_h + o_v[None, :], mask=m_t[:, None] & m_v[None, :],
                      other=0.0).to(tl.float32)
        b_u = mm(b_T, b_v * b_beta[:, None], IO, DOT_F32)
        tl.store(u_ws + ws[:, None] * BV + o_v[None, :], b_u.to(u_ws.dtype.element_ty), mask=m_t[:, None])


@triton.jit
def state_row(state_indices, i_n, n_slots, PAGED: tl.constexpr):
    # The state-cache row of sequence i_n and whether it may be touched: a negative (pad) or out-of-range
    # row is neither read nor written. Dense states use row i_n.
    if PAGED:
        row = tl.load(state_indices + i_n).to(tl.int64)
        return row, (row >= 0) & (row < n_slots)
    else:
        return i_n, i_n >= 0


@triton.jit
def initial_state(h0, has_initial_state, i_n, row, row_ok, i_h, sh0_n, sh0_h, p_state, m_s,
                  STATE_IN: tl.constexpr):
    # STATE_IN: 0 zeros, 1 dense h0[n], 2 paged h0[state_indices[n]] when has_initial_state[n].
    if STATE_IN == 1:
        return tl.load(h0 + i_n * sh0_n + i_h * sh0_h + p_state, mask=m_s, other=0.0).to(tl.float32)
    elif STATE_IN == 2:
        # A row whose flag is false is never read: the masked load touches no memory.
        use = (tl.load(has_initial_state + i_n) != 0) & row_ok
        return tl.load(h0 + row * sh0_n + i_h * sh0_h + p_state, mask=m_s & use, other=0.0).to(tl.float32)
    else:
        return tl.zeros(p_state.shape, dtype=tl.float32)
