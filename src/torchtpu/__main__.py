"""`python -m torchtpu`: show the device, train a tiny character-level Transformer on "tpu", sample.
`python -m torchtpu info`: versions, devices, settings and a short self-check, for bug reports.

Plain PyTorch code; the only torchtpu-specific thing is the device string. No downloads: the
training text ships below. About a minute on two CPU cores (XLA:CPU).
"""

from __future__ import annotations

import argparse
import math
import os
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

TEXT = """\
the device is a string, and the string is tpu.
the model moves with one call, the tensors follow, the loss goes down.
a view is a window on a storage; write through the window and the storage changes.
xla compiles each shape once, and then the same shape runs again and again.
small steps, many steps: the loss goes down, the text comes back.
"""


class Block(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x, mask):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        att = att.masked_fill(mask[:t, :t], float("-inf")).softmax(-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.norm2(x))


class TinyLM(nn.Module):
    def __init__(self, vocab, dim=64, heads=4, layers=2, context=32):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.randn(context, dim) * 0.02)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)
        self.register_buffer("mask", torch.ones(context, context, dtype=torch.bool).triu(1), persistent=False)

    def forward(self, idx):
        x = self.tok(idx) + self.pos[: idx.shape[1]]
        for block in self.blocks:
            x = block(x, self.mask)
        return self.head(self.norm(x))


def info() -> int:
    """`python -m torchtpu info`: what a bug report needs, and a 10-second self-check."""
    import importlib.metadata as md
    import platform as host
    import sys

    import torchtpu
    from torchtpu import config
    from torchtpu.compile import options
    from torchtpu.device import native
    from torchtpu.integrations import patches

    def version(name):
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            return "not installed"

    print(f"torchtpu {torchtpu.__version__} ({torchtpu.__file__})")
    print(f"python {sys.version.split()[0]} on {host.platform()}")
    for name in ("torch", "jax", "jaxlib", "numpy", "transformers", "accelerate", "diffusers", "kernels"):
        print(f"  {name:13s}{version(name)}")
    set_vars = {k: v for k, v in os.environ.items() if k.startswith(("TORCHTPU_", "TORCH_TPU_", "XLA_FLAGS"))}
    print("environment:", ", ".join(f"{k}={v}" for k, v in sorted(set_vars.items())) or "(no TORCHTPU_* set)")
    try:
        config.check()
        print(f"platform: XLA:{torch.tpu.platform().upper()}, {torch.tpu.device_count()} device(s)")
        for i in range(torch.tpu.device_count()):
            print(f"  tpu:{i}  {torch.tpu.get_device_properties(i)}")
    except Exception as e:  # noqa: BLE001 - report, do not crash: this is the bug-report tool
        print(f"platform: unavailable: {e}")
        return 1
    print(f"eager mode: {torch.tpu.get_eager_mode()}")
    cache = options.cache_dir() or ("on first compile" if config.get("TORCHTPU_COMPILE_CACHE") else "off")
    print(f"compile cache: {cache}")
    print(
        f"C++ device guard: {'loaded' if native.loaded() else (native.problem() or 'TORCHTPU_NATIVE=off')}; "
        f"torch.Generator('tpu'): {'yes' if native.generators_available() else 'no'}"
    )
    from .eager import fastpath

    print(f"C++ eager fast path: {'loaded' if fastpath.loaded() else fastpath.problem()}")
    print(
        f"patches: {len(patches.applied())} applied"
        + (f", PROBLEMS: {patches.problems()}" if patches.problems() else "")
    )

    start = time.perf_counter()
    checks = []
    try:
        torch.manual_seed(0)
        a, b = torch.randn(64, 64), torch.randn(64, 64)
        torch.testing.assert_close((a.to("tpu") @ b.to("tpu")).cpu(), a @ b, rtol=1e-4, atol=1e-4)
        checks.append("matmul")
        x = torch.randn(8, 16, device="tpu", requires_grad=True)
        loss = F.gelu(x).square().mean()
        loss.backward()
        xc = x.detach().cpu().requires_grad_()
        F.gelu(xc).square().mean().backward()
        torch.testing.assert_close(x.grad.cpu(), xc.grad, rtol=1e-4, atol=1e-5)
        checks.append("autograd")
        compiled = torch.compile(nn.Linear(16, 4).to("tpu"), backend="tpu")
        compiled(x.detach()).sum().item()
        checks.append("torch.compile")
        torch.accelerator.synchronize()
        checks.append("synchronize")
    except Exception as e:  # noqa: BLE001 - any failure is the self-check's finding, printed
        print(f"self-check FAILED after {checks}: {type(e).__name__}: {e}")
        return 1
    print(f"self-check: ok ({', '.join(checks)}) in {time.perf_counter() - start:.1f}s")
    return 0


def main(argv=None):
    import sys

    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["info"]:
        raise SystemExit(info())
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--device", default="tpu")
    args = parser.parse_args(argv)

    device = torch.device(args.device)
    if device.type == "tpu":
        device = torch.device("tpu", torch.tpu.current_device() if device.index is None else device.index)
        print(
            f"device: {device}  backed by XLA:{torch.tpu.platform().upper()}  "
            f"({torch.tpu.device_count()} device(s), {torch.tpu.get_device_name()})"
        )
    torch.manual_seed(0)
    chars = sorted(set(TEXT))
    stoi = {c: i for i, c in enumerate(chars)}
    data = torch.tensor([stoi[c] for c in TEXT], dtype=torch.long)
    context, batch = 32, 16
    model = TinyLM(len(chars), context=context).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    print(f"model: {sum(p.numel() for p in model.parameters()):,} parameters on {next(model.parameters()).device}")

    start = time.perf_counter()
    for step in range(args.steps + 1):
        ix = torch.randint(0, len(data) - context - 1, (batch,))
        x = torch.stack([data[i : i + context] for i in ix]).to(device)
        y = torch.stack([data[i + 1 : i + context + 1] for i in ix]).to(device)
        loss = F.cross_entropy(model(x).reshape(-1, len(chars)), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 50 == 0:
            print(f"step {step:4d}  loss {loss.item():.3f}  ({time.perf_counter() - start:.1f}s)")

    model.eval()
    prompt = "the "
    # A fixed-length window (left-padded with spaces) keeps every step the same shape: XLA
    # compiles the sampling step once instead of once per generated length.
    window = torch.tensor([[stoi[" "]] * (context - len(prompt)) + [stoi[c] for c in prompt]], device=device)
    out = []
    with torch.no_grad():
        for _ in range(160):
            logits = model(window)[:, -1] / 0.5
            gumbel = -torch.log(-torch.log(torch.rand_like(logits).clamp_min(1e-9)))
            nxt = (logits + gumbel).argmax(-1, keepdim=True)  # a sample at temperature 0.5
            window = torch.cat([window[:, 1:], nxt], dim=1)
            out.append(nxt)
    print("sample:", prompt + "".join(chars[i] for i in torch.cat(out, 1)[0].tolist()))
    print(f"done in {time.perf_counter() - start:.1f}s")


if __name__ == "__main__":
    main()
