"""Parameters on the CPU and on tpu stepped side by side (the optimizer tests' common harness)."""

from __future__ import annotations

import torch


def paired_params(shapes, dtype, seed=0):
    """The same random leaf parameters twice: CPU copies and their tpu twins."""
    g = torch.Generator().manual_seed(seed)
    cpu = [torch.randn(s, generator=g).to(dtype).requires_grad_() for s in shapes]
    tpu = [p.detach().to("tpu").requires_grad_() for p in cpu]
    return cpu, tpu


def step_both(cpu_opt, tpu_opt, cpu, tpu, steps, seed=1, lrs=None):
    """`steps` steps of both optimizers on equal random gradients (and `lrs[step]` if given)."""
    g = torch.Generator().manual_seed(seed)
    for step in range(steps):
        if lrs is not None:
            for o in (cpu_opt, tpu_opt):
                for group in o.param_groups:
                    group["lr"] = lrs[step]
        for pc, pt in zip(cpu, tpu):
            grad = torch.randn(pc.shape, generator=g).to(pc.dtype)
            pc.grad = grad.clone()
            pt.grad = grad.to("tpu")
        cpu_opt.step()
        tpu_opt.step()
