"""`torch.tpu.optimizers`: AdamW, SGD and Muon whose `step()` is ONE XLA executable for all parameters.

They are `torch.optim.AdamW` / `torch.optim.SGD` / `torch.optim.Muon` subclasses: same constructor, param groups,
hooks, `state_dict` / `load_state_dict` (the state keys and their CPU `step` tensors are torch's),
and the numerics of torch's single-tensor path, op by op (each torch op rounds to the parameter's
dtype; the scalars torch computes in Python doubles are computed here in doubles too). Only `step()`
differs: every parameter, gradient and state buffer goes into one jitted function; the learning
rate, step-dependent bias corrections and SGD's "first step" flag are traced scalars, so a schedule
that changes `lr` or a growing step count never recompiles. The executable is cached per (param
shapes and dtypes, the groups' static hyperparameters, device); the old parameter and state buffers
are donated when nothing else holds them, and the new ones are committed to the storages together
(no state is left half-updated by Ctrl-C or an error).

Parameters must be dense tensors that cover their whole storage (what `nn.Module` parameters are);
any other layout raises a clear error rather than silently copying, since the update must land in
the parameter's own storage. Gradients of any layout are accepted (a non-dense one is copied once).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import torch

from ..eager import tpu_check, xla_options
from ..eager.executable import call_and_commit, input_buffers
from ..storage.records import donatable, record_of

__all__ = ["SGD", "AdamW", "Muon", "Sgd", "SingleTraceTrainer"]


def _f32(x):
    return x.astype(jnp.float32)


class _FusedStep:
    """The shared `step()`: gather the buffers, call the cached executable, commit the results.

    A subclass provides `_prepare(group, params, grads)` -> (state tensors per param in the order
    `_update` expects, host scalars per param, static signature of the group) and
    `_update(static, param, grad, states, scalars)` -> (new param, new states), traced by JAX."""

    _executables: dict  # per instance: cache key -> jitted function
    executables_built = 0  # per instance after the first step (tests count recompiles)

    def _where(self):
        return f"torch.tpu.optimizers.{type(self).__name__}"

    def _check_param(self, i, p):
        if p.device.type != "tpu":
            raise RuntimeError(
                f"{self._where()}: parameter {i} is on {p.device}; these optimizers "
                f"update tpu tensors only (use torch.optim.{type(self).__mro__[2].__name__} "
                f"for {p.device.type})"
            )
        if p.is_complex():
            raise RuntimeError(f"{self._where()}: parameter {i} is complex ({p.dtype}); not supported")
        if not (p.is_contiguous() and p.storage_offset() == 0 and p.numel() == record_of(p).numel):
            raise RuntimeError(
                f"{self._where()}: parameter {i} (shape {tuple(p.shape)}, strides "
                f"{p.stride()}, offset {p.storage_offset()}) is not a dense tensor "
                f"covering its whole storage; the fused step updates storages in place"
            )

    @staticmethod
    def _dense_grad(g):
        if g.is_sparse:
            raise RuntimeError("sparse gradients are not supported by torch.tpu.optimizers")
        if g.is_contiguous() and g.storage_offset() == 0 and g.numel() == record_of(g).numel:
            return g
        return g.clone(memory_format=torch.contiguous_format)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if not hasattr(self, "_executables"):
            self._executables = {}
        params, grads, states, scalars, static = [], [], [], [], []
        self._after, self._undo = [], []  # state changes to keep on success / revert on failure
        try:
            self._step_fused(params, grads, states, scalars, static)
        except BaseException:
            for undo in self._undo:
                undo()
            raise
        finally:
            after, self._after, self._undo = self._after, [], []
        for done in after:
            done()
        return loss

    def _plan(self, select):
        """The update of the parameters `select(index, p)` picks, group by group: (params, their
        state tensors in `_update`'s order, host scalars, static signatures), one entry per parameter.
        Shared by `step()` and `SingleTraceTrainer` (optim/trainer.py), which differ only in where
        the gradients come from."""
        params, states, scalars, static = [], [], [], []
        index = 0
        for group in self.param_groups:
            chosen = []
            for p in group["params"]:
                if select(index, p):
                    self._check_param(index, p)
                    chosen.append(p)
                index += 1
            if not chosen:
                continue
            group_states, group_scalars, group_static = self._prepare(group, chosen)
            params += chosen
            states += group_states
            scalars += group_scalars
            # one static signature for the group, or (a list) one per parameter
            static += group_static if isinstance(group_static, list) else [group_static] * len(chosen)
        return params, states, scalars, static

    def _step_fused(self, params, grads, states, scalars, static):
        def with_grad(index, p):
            if p.grad is None:
                return False
            if p.grad.dtype != p.dtype or p.grad.shape != p.shape or p.grad.device != p.device:
                self._check_param(index, p)
                raise RuntimeError(
                    f"{self._where()}: parameter {index}'s grad ({p.grad.dtype}, "
                    f"{tuple(p.grad.shape)}, {p.grad.device}) does not match it "
                    f"({p.dtype}, {tuple(p.shape)}, {p.device})"
                )
            return True

        planned = self._plan(with_grad)
        for into, got in zip((params, states, scalars, static), planned):
            into += got
        grads += [self._dense_grad(p.grad) for p in params]
        if not params:
            return
        device = params[0].device
        for _i, p in enumerate(params):
            if p.device != device:
                raise RuntimeError(
                    f"{self._where()}: parameters on {device} and {p.device}; one "
                    f"optimizer steps the parameters of one device"
                )
        counts = tuple(len(per) for per in states)
        updated = [record_of(p) for p in params] + [record_of(s) for per in states for s in per]
        read = [record_of(g) for g in grads]
        buffers = input_buffers(updated)
        grad_buffers = input_buffers(read)
        donate = donatable(buffers, range(len(buffers))) and not set(map(id, buffers)) & set(map(id, grad_buffers))
        # A never-written storage's zeros are uncommitted arrays: jit would compile a second time
        # once they are committed (from the second step on); commit them now (no copy).
        place = buffers[0].sharding
        buffers = [b if b.committed else jax.device_put(b, place) for b in buffers]
        grad_buffers = [b if b.committed else jax.device_put(b, place) for b in grad_buffers]
        layout = tuple((tuple(p.shape), p.dtype) for p in params)
        key = (layout, tuple(static), counts, donate, device, xla_options.active())
        fn = self._executables.get(key)
        if fn is None:
            fn = self._executables[key] = self._build(tuple(static), counts, donate)
            self.executables_built = len(self._executables)
        host = np.asarray(scalars, dtype=np.float64).astype(np.float32)
        call_and_commit(fn, (buffers, grad_buffers, host), updated, 0)

    def _build(self, static, counts, donate):
        update = self._update
        n = len(counts)

        def fused(buffers, grads, scalars):
            new_params, new_states = [], []
            at = n  # the state buffers follow the parameters', in parameter order
            for i in range(n):
                states = buffers[at : at + counts[i]]
                at += counts[i]
                # (each storage's array has the shape its storage was made with: one parameter's
                # gradient and states may hold the same elements in another shape)
                shape = buffers[i].shape
                p, s = update(
                    static[i], buffers[i], grads[i].reshape(shape), [x.reshape(shape) for x in states], scalars[i]
                )
                new_params.append(p.reshape(shape))
                new_states += [x.reshape(old.shape) for x, old in zip(s, states)]
            return tuple(new_params) + tuple(new_states)

        return tpu_check.jit(
            fused,
            f"fused {type(self).__name__} step",
            donate_argnums=(0,) if donate else (),
            compiler_options=xla_options.jax_options(),
        )


def _rounded(dtype):
    """`op(...)` of a torch op on `dtype` tensors: computed in float32 (torch's opmath), rounded."""
    return lambda x: x.astype(dtype)


class AdamW(_FusedStep, torch.optim.AdamW):
    """`torch.optim.AdamW` (same arguments, numerics and state_dict), one executable per step."""

    def __init__(
        self,
        params,
        lr=1e-3,
        betas=(0.9, 0.999),
        eps=1e-8,
        weight_decay=1e-2,
        amsgrad=False,
        *,
        maximize=False,
        foreach=None,
        capturable=False,
        differentiable=False,
        fused=None,
    ):
        if capturable or differentiable or fused:
            raise ValueError(
                "torch.tpu.optimizers.AdamW is already a fused, single-executable step; "
                "capturable=, differentiable= and fused= are not supported"
            )
        super().__init__(
            params,
            lr=lr,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            amsgrad=amsgrad,
            maximize=maximize,
            foreach=foreach,
        )

    def _prepare(self, group, params):
        lr = float(group["lr"])
        beta1, beta2 = (float(b) for b in group["betas"])
        wd = float(group["weight_decay"])
        states, scalars = [], []
        for p in params:
            state = self.state[p]
            if len(state) == 0:
                state["step"] = torch.tensor(
                    0.0,
                    dtype=torch.get_default_dtype() if torch.get_default_dtype() == torch.float64 else torch.float32,
                )
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                if group["amsgrad"]:
                    state["max_exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            per = [state["exp_avg"], state["exp_avg_sq"]]
            if group["amsgrad"]:
                per.append(state["max_exp_avg_sq"])
            for s in per:
                if s.device != p.device or s.dtype != p.dtype or s.shape != p.shape:
                    raise RuntimeError(
                        f"{self._where()}: a state tensor ({s.dtype}, {tuple(s.shape)}, "
                        f"{s.device}) does not match its parameter ({p.dtype}, "
                        f"{tuple(p.shape)}, {p.device})"
                    )
                self._check_param(0, s)
            step_t = state["step"]  # a CPU tensor, as in torch's non-capturable path
            step = float(step_t) + 1
            self._after.append(lambda t=step_t: t.add_(1))
            bias_correction1 = 1 - beta1**step
            bias_correction2 = 1 - beta2**step
            scalars.append((1 - lr * wd, lr / bias_correction1, bias_correction2**0.5))
            states.append(per)
        static = (beta1, beta2, float(group["eps"]), wd != 0, bool(group["amsgrad"]), bool(group["maximize"]))
        return states, scalars, static

    @staticmethod
    def _update(static, param, grad, states, scalars):
        beta1, beta2, eps, decay, amsgrad, maximize = static
        out = _rounded(param.dtype)
        decay_factor, step_size, bias_correction2_sqrt = scalars[0], scalars[1], scalars[2]
        if maximize:
            grad = -grad
        if decay:
            param = out(_f32(param) * decay_factor)
        exp_avg, exp_avg_sq = states[0], states[1]
        weight = 1 - beta1  # torch's lerp, by the side of 0.5 its weight is on
        if weight < 0.5:
            exp_avg = out(_f32(exp_avg) + weight * (_f32(grad) - _f32(exp_avg)))
        else:
            exp_avg = out(_f32(grad) - (_f32(grad) - _f32(exp_avg)) * (1 - weight))
        exp_avg_sq = out(_f32(exp_avg_sq) * beta2)
        exp_avg_sq = out(_f32(exp_avg_sq) + (1 - beta2) * _f32(grad) * _f32(grad))
        second = exp_avg_sq
        new_states = [exp_avg, exp_avg_sq]
        if amsgrad:
            second = jnp.maximum(states[2], exp_avg_sq)
            new_states.append(second)
        denom = out(jnp.sqrt(_f32(second)))
        denom = out(_f32(denom) / bias_correction2_sqrt)
        denom = out(_f32(denom) + eps)
        param = out(_f32(param) + (-step_size) * (_f32(exp_avg) / _f32(denom)))
        return param, new_states


class SGD(_FusedStep, torch.optim.SGD):
    """`torch.optim.SGD` (same arguments, numerics and state_dict), one executable per step."""

    def __init__(
        self,
        params,
        lr=1e-3,
        momentum=0,
        dampening=0,
        weight_decay=0,
        nesterov=False,
        *,
        maximize=False,
        foreach=None,
        differentiable=False,
        fused=None,
    ):
        if differentiable or fused:
            raise ValueError(
                "torch.tpu.optimizers.SGD is already a fused, single-executable step; "
                "differentiable= and fused= are not supported"
            )
        super().__init__(
            params,
            lr=lr,
            momentum=momentum,
            dampening=dampening,
            weight_decay=weight_decay,
            nesterov=nesterov,
            maximize=maximize,
            foreach=foreach,
        )

    def _prepare(self, group, params):
        lr = float(group["lr"])
        momentum = float(group["momentum"])
        states, scalars = [], []
        for p in params:
            if momentum != 0:
                state = self.state[p]
                buf = state.get("momentum_buffer")
                first = buf is None
                if first:  # torch clones the grad on the first step; the executable reads a flag
                    buf = state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    self._undo.append(lambda state=state: state.pop("momentum_buffer", None))
                self._check_param(0, buf)
                states.append([buf])
                scalars.append((lr, 1.0 if first else 0.0))
            else:
                states.append([])
                scalars.append((lr, 0.0))
        static = (
            momentum,
            float(group["dampening"]),
            float(group["weight_decay"]),
            bool(group["nesterov"]),
            bool(group["maximize"]),
        )
        return states, scalars, static

    @staticmethod
    def _update(static, param, grad, states, scalars):
        momentum, dampening, weight_decay, nesterov, maximize = static
        out = _rounded(param.dtype)
        lr, first = scalars[0], scalars[1]
        if maximize:
            grad = -grad
        if weight_decay != 0:
            grad = out(_f32(grad) + weight_decay * _f32(param))
        new_states = []
        if momentum != 0:
            buf = out(_f32(out(_f32(states[0]) * momentum)) + (1 - dampening) * _f32(grad))
            buf = jnp.where(first != 0, grad, buf)
            new_states.append(buf)
            grad = out(_f32(grad) + momentum * _f32(buf)) if nesterov else buf
        param = out(_f32(param) + (-lr) * _f32(grad))
        return param, new_states


Sgd = SGD  # TorchTPU's name


def _lerp(start, end, weight, out):
    """torch's lerp (by the side of 0.5 its weight is on), computed in float32, rounded by `out`."""
    if weight < 0.5:
        return out(_f32(start) + weight * (_f32(end) - _f32(start)))
    return out(_f32(end) - (_f32(end) - _f32(start)) * (1 - weight))


def _mm(a, b):
    """A bfloat16 matmul as torch's CPU kernel does it: float32 accumulation."""
    return jnp.matmul(a, b, preferred_element_type=jnp.float32, precision=jax.lax.Precision.HIGHEST)


def _newton_schulz(update, coefficients, steps, eps):
    """torch.optim._muon._zeropower_via_newtonschulz, op by op in bfloat16 (each op rounds): the
    orthogonalised update, and the normalised input (torch divides it in place: see Muon._update)."""
    a, b, c = coefficients
    bf16 = _rounded(jnp.bfloat16)
    x = update.astype(jnp.bfloat16)
    norm = bf16(jnp.sqrt(jnp.sum(jnp.square(_f32(x)))))
    x = normalised = bf16(_f32(x) / _f32(jnp.maximum(norm, bf16(jnp.float32(eps)))))
    wide = x.shape[0] > x.shape[1]
    if wide:
        x = x.T
    for _ in range(steps):
        gram = bf16(_mm(x, x.T))
        gram_update = bf16(b * _f32(gram) + c * _mm(gram, gram))  # addmm(gram, gram, gram, beta=b, alpha=c)
        x = bf16(a * _f32(x) + _mm(gram_update, x))  # addmm(x, gram_update, x, beta=a)
    return (x.T if wide else x), normalised


def _muon_lr_ratio(adjust_lr_fn, shape):
    """torch.optim.Muon's learning-rate adjustment for an (A, B) matrix (its documented formulas)."""
    rows, cols = shape[:2]
    if adjust_lr_fn is None or adjust_lr_fn == "original":
        return math.sqrt(max(1, rows / cols))  # Keller Jordan's
    if adjust_lr_fn == "match_rms_adamw":
        return 0.2 * math.sqrt(max(rows, cols))  # Moonshot's
    return 1.0


class Muon(_FusedStep, torch.optim.Muon):
    """`torch.optim.Muon` (same arguments, state_dict and numerics: momentum, Newton-Schulz
    orthogonalisation of the 2-D update in bfloat16, decoupled weight decay, the shape-adjusted
    learning rate), one executable per step for all parameters. TorchTPU names it
    `torch.tpu.optimizers.Muon` too; its own is a functional (ParamGroup) optimizer."""

    def _prepare(self, group, params):
        lr = float(group["lr"])
        momentum = float(group["momentum"])
        wd = float(group["weight_decay"])
        coefficients = tuple(float(v) for v in group["ns_coefficients"])
        steps = int(group["ns_steps"])
        if steps >= 100:
            raise ValueError("Number of steps must be less than 100 for computational efficiency")
        if len(coefficients) != 3:
            raise ValueError("Coefficients must be a tuple of exactly 3 values")
        states, scalars = [], []
        for p in params:
            # (the parameter's shape and dtype, not its grad's: step() checked they agree, and
            # SingleTraceTrainer has no grad tensor to look at)
            if p.ndim != 2:
                raise ValueError("Param gradient must be a 2D matrix")
            state = self.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                self._undo.append(lambda state=state: state.pop("momentum_buffer", None))
            buf = state["momentum_buffer"]
            self._check_param(0, buf)
            states.append([buf])
            adjusted = lr * _muon_lr_ratio(group["adjust_lr_fn"], p.shape)
            scalars.append((1 - lr * wd, adjusted))
        static = (momentum, bool(group["nesterov"]), coefficients, float(group["eps"]), steps)
        return states, scalars, [(*static, tuple(p.shape)) for p in params]  # (a step may see them flat)

    @staticmethod
    def _update(static, param, grad, states, scalars):
        momentum, nesterov, coefficients, eps, steps, shape = static
        out = _rounded(param.dtype)
        decay_factor, adjusted_lr = scalars[0], scalars[1]
        buf = _lerp(states[0], grad, 1 - momentum, out)
        update = _lerp(grad, buf, momentum, out) if nesterov else buf
        ortho, normalised = _newton_schulz(update.reshape(shape), coefficients, steps, eps)
        if not nesterov and buf.dtype == jnp.bfloat16:
            # torch.optim.Muon (every device): without nesterov the update *is* the momentum buffer,
            # `.bfloat16()` of a bfloat16 tensor is that tensor, and Newton-Schulz divides it by its
            # norm in place, so the buffer torch keeps is the normalised one. Kept for parity.
            buf = normalised.reshape(param.shape)
        update = ortho.reshape(param.shape)  # (flat in SingleTraceTrainer, else the parameter's shape)
        param = out(_f32(param) * decay_factor)
        param = out(_f32(param) + (-adjusted_lr) * _f32(update))
        return param, [buf]


from .trainer import SingleTraceTrainer  # noqa: E402  (it builds on _FusedStep above)
