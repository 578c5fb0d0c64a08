"""Blockwise (flash-style) scaled dot-product attention for long sequences, forward and backward.

The dense lowering (ops/attention.py) materialises the (B, H, L, S) score matrix in
float32; at SD3's joint attention (2 x 4 x 4189 x 4189, 560 MB) XLA:CPU then spends its time moving
scores through memory, not computing them. Here one loop step handles one (batch*head, query block)
tile against the keys, so a tile of scores stays in cache. When S is long too, the keys are walked in
blocks with an online softmax (running max and sum), so memory is O(block) whatever L and S are.

Semantics are the dense lowering's: additive float or bool masks broadcast to (B, H, L, S), top-left
causal masking, a row whose every key is masked gives 0 and logsumexp 0 (as PyTorch's CPU kernel),
half inputs accumulate in float32 (float64 stays float64), key/value heads may divide the query
heads (GQA). The logsumexp feeds the backward, which recomputes each tile's probabilities from it
(FlashAttention-2 style) instead of storing them.

Blocks need not divide the lengths: the last block is shifted back to end at the sequence end (no
padding copies), and its rows/keys already covered by the previous block are masked out where they
would be counted twice.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
from jax import lax

# Elements of one (query block x key block) score tile (4 MiB float32). Measured on XLA:CPU: 2**20 and
# 2**21 were fastest at SD3's (2, 4, 4189, 8) (2**19 ~15% slower), 2**22 ~1.7x slower at the VAE's
# (1, 1, 4096, 4). Smaller tiles mean more loop steps, each with a fixed cost of about ten thunks.
TILE = 1 << 20
# Keys walked in one piece up to this length (one exact softmax per query block: 25% faster than the
# online softmax at SD3's shape); longer key sequences go in blocks of KV_BLOCK with the online
# softmax. Causal attention always walks blocks of CAUSAL_KV_BLOCK, skipping those above the
# diagonal (1.6x faster than one piece at (1, 4, 4096, 64)).
KV_ONE_PIECE = 8192
KV_BLOCK = 2048
CAUSAL_KV_BLOCK = 1024
# Used when B * H * L * S (the dense score matrix) is at least this. Measured on XLA:CPU: below, the
# dense lowering wins or ties (one fused executable, no loop); above, blockwise made SD3's compiled
# denoiser 3.4x and the VAE's attention ~4x faster (the dense path's 560 MB score temporaries at SD3
# cost more than their arithmetic, and degrade badly when other processes share the cores).
MIN_SCORES = 1 << 21
# (batch, head) rows per tile, at most. Batched tiles may suit wider hardware (not measured); on
# XLA:CPU 1 was fastest at SD3's shape (8: ~1.4x slower).
GROUP = 1


def eligible(q, k, v):
    """Whether the blockwise path applies: 4-D inputs, key heads dividing query heads, long sequences."""
    return (
        q.ndim == 4
        and k.ndim == 4
        and v.ndim == 4
        and q.shape[0] == k.shape[0] == v.shape[0]
        and k.shape[1] == v.shape[1]
        and q.shape[1] % k.shape[1] == 0
        and k.shape[2] == v.shape[2]
        and q.shape[0] * q.shape[1] * q.shape[2] * k.shape[2] >= MIN_SCORES
    )


def acc_dtype(dtype):
    return jnp.float64 if dtype == jnp.float64 else jnp.float32


def _blocks(n, size):
    """(block length, block count) covering n with blocks of about `size` (the last one shifted back)."""
    size = max(1, min(n, size))
    count = -(-n // size)
    return -(-n // count), count


def _group(B, H, sb):
    """Heads per tile: a divisor of H, or H times a divisor of B (so a tile's mask is one slice), at most
    GROUP and leaving at least 16 query rows."""
    cands = [d for d in range(1, H + 1) if H % d == 0] + [H * d for d in range(2, B + 1) if B % d == 0]
    fits = [g for g in cands if g <= GROUP and g * sb * 16 <= TILE]
    return max(fits) if fits else 1


def _plan(B, H, L, S, causal):
    if causal and S > CAUSAL_KV_BLOCK:
        sb, nk = _blocks(S, CAUSAL_KV_BLOCK)
    else:
        sb, nk = (S, 1) if S <= KV_ONE_PIECE else _blocks(S, KV_BLOCK)
    g = _group(B, H, sb)
    lb, nq = _blocks(L, max(16, TILE // (g * sb)))
    return g, lb, nq, sb, nk


def _bdot(a, b, contract, acc, precision):
    """Batched (over axis 0) a . b, contracting a's axis contract[0] with b's contract[1]."""
    return lax.dot_general(
        a, b, (((contract[0],), (contract[1],)), ((0,), (0,))), precision=precision, preferred_element_type=acc
    )


class _Problem:
    """Shapes, the grouped operands and the tile readers shared by forward and backward.

    Loop step i handles `g` consecutive (batch, head) rows and one query block against one key block
    (all keys when nk == 1): operands are viewed as (B*H/g, g, length, features)."""

    def __init__(self, q, k, v, mask, is_causal, scale, acc):
        self.B, self.H, self.L, self.E = q.shape
        self.S, self.Ev = k.shape[2], v.shape[3]
        self.rep = self.H // k.shape[1]
        if self.rep > 1:  # grouped-query attention: query head h reads key/value head h // rep
            k, v = jnp.repeat(k, self.rep, axis=1), jnp.repeat(v, self.rep, axis=1)
        self.g, self.lb, self.nq, self.sb, self.nk = _plan(self.B, self.H, self.L, self.S, is_causal)
        self.groups = self.B * self.H // self.g
        self.scale = (1.0 / math.sqrt(self.E)) if scale is None else scale
        self.causal, self.acc = is_causal, acc
        # the scale is folded into q (an (L, E) multiply instead of a pass over every score tile) and
        # q, k are read in the accumulation dtype: a bf16 x bf16 product is exact in float32 anyway
        self.q = self.grouped(q.astype(acc) * self.scale)
        self.k = self.grouped(k.astype(acc))
        self.v = self.grouped(v)
        self.mask = None if mask is None else mask.reshape((1,) * (4 - mask.ndim) + mask.shape)
        # lowest finite value: the running max starts there instead of -inf, so a fully masked row gives
        # exp(-inf - lowest) = 0 with no isfinite select over the tile
        self.lowest = float(jnp.finfo(acc).min)

    def grouped(self, a):
        return a.reshape((self.groups, self.g) + a.shape[2:])

    def ungrouped(self, a, heads):
        return a.reshape((self.B, heads) + a.shape[2:])

    def index(self, i):
        """Loop step i -> (group, query block start, its nominal start)."""
        gi, j = i // self.nq, i % self.nq
        return gi, jnp.minimum(j * self.lb, self.L - self.lb), j * self.lb

    def rows(self, a, gi, start, size):
        """(g, size, ...) rows [start, start + size) of group gi of a grouped array."""
        return lax.dynamic_slice(a, (gi, 0, start) + (0,) * (a.ndim - 3), (1, self.g, size) + a.shape[3:])[0]

    def put(self, a, gi, start, tile):
        return lax.dynamic_update_slice(a, tile[None], (gi, 0, start) + (0,) * (a.ndim - 3))

    def kv_start(self, c):
        return jnp.minimum(c * self.sb, self.S - self.sb)

    def kv_blocks(self, q0):
        """Key blocks a query block starting at q0 needs: causal rows never see keys past their own row."""
        if not self.causal:
            return self.nk
        return jnp.minimum(self.nk, (q0 + self.lb - 1) // self.sb + 1)

    def scores(self, qb, kb, gi, q0, k0, c, precision):
        """Scaled (qb is), masked (g, lb, sb) score tile in the accumulation dtype; masked entries -inf."""
        s = _bdot(qb, kb, (2, 2), self.acc, precision)
        if self.mask is not None:
            m = self.mask
            mb, mh, ml, ms = m.shape
            gb, gh = (1, self.g) if self.g <= self.H else (self.g // self.H, self.H)
            bh0 = gi * self.g
            lm, sm = (self.lb if ml > 1 else 1), (self.sb if ms > 1 else 1)
            tile = lax.dynamic_slice(
                m,
                (
                    bh0 // self.H if mb > 1 else 0,
                    bh0 % self.H if mh > 1 else 0,
                    q0 if ml > 1 else 0,
                    k0 if ms > 1 else 0,
                ),
                (gb if mb > 1 else 1, gh if mh > 1 else 1, lm, sm),
            )
            tile = jnp.broadcast_to(tile, (gb, gh, lm, sm)).reshape(self.g, lm, sm)
            s = jnp.where(tile, s, -jnp.inf) if m.dtype == jnp.bool_ else s + tile.astype(self.acc)
        keep = None
        cols = k0 + lax.broadcasted_iota(jnp.int32, (1, 1, self.sb), 2)
        if self.causal:
            keep = cols <= q0 + lax.broadcasted_iota(jnp.int32, (1, self.lb, 1), 1)
        if self.nk > 1:  # the shifted last key block: keys the previous block had are not counted twice
            fresh = cols >= c * self.sb
            keep = fresh if keep is None else keep & fresh
        return s if keep is None else jnp.where(keep, s, -jnp.inf)


def forward(q, k, v, mask=None, is_causal=False, scale=None, precision=None):
    """(out (B, H, L, Ev) in q's dtype, logsumexp (B, H, L) in the accumulation dtype)."""
    acc = acc_dtype(q.dtype)
    P = _Problem(q, k, v, mask, is_causal, scale, acc)
    low = v.dtype in (jnp.float16, jnp.bfloat16)

    def tile(qb, gi, q0, c, carry):
        m_old, tot, o = carry
        k0 = P.kv_start(c)
        s = P.scores(qb, P.rows(P.k, gi, k0, P.sb), gi, q0, k0, c, precision)
        m_new = jnp.max(s, axis=-1, keepdims=True, initial=P.lowest)
        if P.nk > 1:
            m_new = jnp.maximum(m_old, m_new)
        p = jnp.exp(s - m_new)
        # as PyTorch's CPU kernel: half probabilities rounded to v's dtype for the product, sums in float32
        pv = _bdot(p.astype(v.dtype) if low else p, P.rows(P.v, gi, k0, P.sb), (2, 1), acc, precision)
        ps = jnp.sum(p, axis=-1, keepdims=True)
        if P.nk == 1:
            return m_new, ps, pv
        alpha = jnp.exp(m_old - m_new)
        return m_new, tot * alpha + ps, o * alpha + pv

    def step(i, carry):
        out, lse = carry
        gi, q0, _ = P.index(i)
        qb = P.rows(P.q, gi, q0, P.lb)
        init = (
            jnp.full((P.g, P.lb, 1), P.lowest, acc),
            jnp.zeros((P.g, P.lb, 1), acc),
            jnp.zeros((P.g, P.lb, P.Ev), acc),
        )
        if P.nk == 1:
            m, tot, o = tile(qb, gi, q0, 0, init)
        else:
            m, tot, o = lax.fori_loop(0, P.kv_blocks(q0), lambda c, cr: tile(qb, gi, q0, c, cr), init)
        ok = tot > 0  # a fully masked row: output 0, logsumexp 0 as the CPU
        o = jnp.where(ok, o / jnp.where(ok, tot, 1), 0)
        l = jnp.where(ok, jnp.log(jnp.where(ok, tot, 1)) + m, 0)[..., 0]
        return P.put(out, gi, q0, o.astype(q.dtype)), P.put(lse, gi, q0, l)

    out = jnp.zeros((P.groups, P.g, P.L, P.Ev), q.dtype)
    lse = jnp.zeros((P.groups, P.g, P.L), acc)
    out, lse = lax.fori_loop(0, P.groups * P.nq, step, (out, lse))
    return P.ungrouped(out, P.H), P.ungrouped(lse, P.H)


def backward(grad, q, k, v, out, lse, mask=None, is_causal=False, scale=None, precision=None):
    """(dq, dk, dv) of forward, recomputing each probability tile from the logsumexp."""
    acc = acc_dtype(q.dtype)
    P = _Problem(q, k, v.astype(acc), mask, is_causal, scale, acc)
    g_all, o_all = P.grouped(grad.astype(acc)), P.grouped(out.astype(acc))
    lse_all = P.grouped(lse.astype(acc))  # fully masked rows have 0 there: exp(-inf - 0) = 0

    def tile(qb, g, d, lse_b, gi, q0, c, carry):
        dq, dk, dv = carry
        k0 = P.kv_start(c)
        kb, vb = P.rows(P.k, gi, k0, P.sb), P.rows(P.v, gi, k0, P.sb)
        p = jnp.exp(P.scores(qb, kb, gi, q0, k0, c, precision) - lse_b)
        ds = p * (_bdot(g, vb, (2, 2), acc, precision) - d)
        dq = dq + _bdot(ds, kb, (2, 1), acc, precision) * P.scale
        dk = P.put(dk, gi, k0, P.rows(dk, gi, k0, P.sb) + _bdot(ds, qb, (1, 1), acc, precision))  # qb is scaled
        dv = P.put(dv, gi, k0, P.rows(dv, gi, k0, P.sb) + _bdot(p, g, (1, 1), acc, precision))
        return dq, dk, dv

    def step(i, carry):
        dq_all, dk, dv = carry
        gi, q0, nominal = P.index(i)
        qb = P.rows(P.q, gi, q0, P.lb)
        # rows of the shifted last block that the previous block already had: a zero cotangent makes
        # their dk/dv/dq contributions vanish, so they are not counted twice
        fresh = q0 + lax.broadcasted_iota(jnp.int32, (1, P.lb, 1), 1) >= nominal
        g = jnp.where(fresh, P.rows(g_all, gi, q0, P.lb), 0)
        d = jnp.sum(g * P.rows(o_all, gi, q0, P.lb), axis=-1, keepdims=True)
        lse_b = P.rows(lse_all, gi, q0, P.lb)[..., None]
        dq = jnp.zeros((P.g, P.lb, P.E), acc)
        run = lambda c, cr: tile(qb, g, d, lse_b, gi, q0, c, cr)
        if P.nk == 1:
            dq, dk, dv = run(0, (dq, dk, dv))
        else:
            dq, dk, dv = lax.fori_loop(0, P.kv_blocks(q0), run, (dq, dk, dv))
        return P.put(dq_all, gi, q0, P.rows(dq_all, gi, q0, P.lb) + dq), dk, dv

    init = (
        jnp.zeros((P.groups, P.g, P.L, P.E), acc),
        jnp.zeros((P.groups, P.g, P.S, P.E), acc),
        jnp.zeros((P.groups, P.g, P.S, P.Ev), acc),
    )
    dq, dk, dv = lax.fori_loop(0, P.groups * P.nq, step, init)
    dk, dv = P.ungrouped(dk, P.H), P.ungrouped(dv, P.H)
    if P.rep > 1:  # each key/value head collects the gradients of the query heads that read it
        dk = dk.reshape(P.B, P.H // P.rep, P.rep, P.S, P.E).sum(2)
        dv = dv.reshape(P.B, P.H // P.rep, P.rep, P.S, P.Ev).sum(2)
    return (P.ungrouped(dq, P.H).astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype))
