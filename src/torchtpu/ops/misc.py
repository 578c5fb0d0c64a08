"""Lowerings: ops no other family owns — `torch._assert_async`, and the fused optimizer steps
(`torch.optim.Adam/AdamW(fused=True)`, the Transformers Trainer's default `adamw_torch_fused`).

`_fused_adam(w)_` update lists of parameters and states in place; the engine derives them (and the
`out=` forms) from the functional ops below, which return the new values of every mutated list in
schema order: (params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs). `state_steps` were already
incremented by the optimizer. Math in float32 (PyTorch's opmath), results in each tensor's dtype.
"""

from __future__ import annotations

import jax.numpy as jnp

from .checks import require
from .table import lowering


@lowering("_assert_async", "_assert_async.msg")
def assert_async(a, assert_msg=None):
    """A device-side assert (checks.py): the one-element `a` must be nonzero."""
    require(a != 0, assert_msg or "Expected Tensor with single nonzero value, but got zero")
    return ()


def _adam_step(
    decoupled,
    params,
    grads,
    exp_avgs,
    exp_avg_sqs,
    max_exp_avg_sqs,
    state_steps,
    lr,
    beta1,
    beta2,
    weight_decay,
    eps,
    amsgrad,
    maximize,
    grad_scale,
    found_inf,
):
    new_p, new_g, new_m, new_v, new_vmax = [], [], [], [], []
    skip = None if found_inf is None else (found_inf.reshape(()) != 0)
    lr = jnp.asarray(lr, jnp.float32).reshape(())
    for i, (p, g, m, v, step) in enumerate(zip(params, grads, exp_avgs, exp_avg_sqs, state_steps)):
        p32, g32, m32, v32 = (x.astype(jnp.float32) for x in (p, g, m, v))
        if grad_scale is not None:
            g32 = g32 / grad_scale.reshape(()).astype(jnp.float32)
        g_out = g32
        if maximize:
            g32 = -g32
        if weight_decay != 0:
            if decoupled:
                p32 = p32 * (1 - lr * weight_decay)
            else:
                g32 = g32 + weight_decay * p32
        m32 = m32 + (g32 - m32) * (1 - beta1)
        v32 = v32 * beta2 + (1 - beta2) * g32 * g32
        t = step.reshape(()).astype(jnp.float32)
        bias1 = 1 - jnp.power(jnp.float32(beta1), t)
        bias2_sqrt = jnp.sqrt(1 - jnp.power(jnp.float32(beta2), t))
        if amsgrad:
            vmax = jnp.maximum(max_exp_avg_sqs[i].astype(jnp.float32), v32)
            denom = jnp.sqrt(vmax) / bias2_sqrt + eps
        else:
            denom = jnp.sqrt(v32) / bias2_sqrt + eps
        p32 = p32 - (lr / bias1) * m32 / denom
        outs = [(p32, p), (g_out, g), (m32, m), (v32, v)]
        if amsgrad:
            outs.append((vmax, max_exp_avg_sqs[i]))
        vals = []
        for new, old in outs:
            new = new.astype(old.dtype)
            vals.append(new if skip is None else jnp.where(skip, old, new))
        new_p.append(vals[0])
        new_g.append(vals[1] if grad_scale is not None else g)
        new_m.append(vals[2])
        new_v.append(vals[3])
        if amsgrad:
            new_vmax.append(vals[4])
    if not amsgrad:
        new_vmax = list(max_exp_avg_sqs)
    return new_p, new_g, new_m, new_v, new_vmax


def _fused(decoupled):
    def fn(
        params,
        grads,
        exp_avgs,
        exp_avg_sqs,
        max_exp_avg_sqs,
        state_steps,
        *,
        lr,
        beta1,
        beta2,
        weight_decay,
        eps,
        amsgrad,
        maximize,
        grad_scale=None,
        found_inf=None,
    ):
        return _adam_step(
            decoupled,
            params,
            grads,
            exp_avgs,
            exp_avg_sqs,
            max_exp_avg_sqs,
            state_steps,
            lr,
            beta1,
            beta2,
            weight_decay,
            eps,
            amsgrad,
            maximize,
            grad_scale,
            found_inf,
        )

    return fn


# hyper-parameters are traced: a learning-rate schedule must not recompile the step
_HYPER = ("lr",)  # weight_decay etc. steer Python branches: they stay static
lowering("_fused_adamw.default", "_fused_adamw.tensor_lr", traced=_HYPER)(_fused(decoupled=True))
lowering("_fused_adam.default", "_fused_adam.tensor_lr", traced=_HYPER)(_fused(decoupled=False))
