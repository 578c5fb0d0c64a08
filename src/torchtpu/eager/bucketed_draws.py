"""Random fills of a new shape without an XLA compile of their own draw.

`torch.randn(shape)`, `rand`, `randint`, `make_tensor` (uniform_ / random_ on the device) and
`nn.init` reach the engine as an in-place random fill of one storage. Its executable is mostly the
counter-based generator (threefry, inlined): 0.2-0.4 s of XLA:CPU compile per new shape, against
~20 ms for a program that only copies. JAX's draws are partitionable (`jax_threefry_partitionable`,
on by default), so element i of a draw depends on the key and i alone, not on the shape: the first n
elements of a draw of any larger size are the draw of those n elements, bit for bit. So a fill whose
lowering declares `draws_by_index` (ops/random.py: normal, uniform, random_, exponential, ...) runs as
two executables: the draw of a whole size bucket (bucket_of), shared by every shape in the
bucket and compiled once per (op, dtype, bucket, static arguments), then a per-shape program that
writes its first n elements through the view (as cheap to compile as a copy). An entry that keeps
being called (a loop drawing noise of one shape) builds its own one-program executable after
TIER_UP calls, so warm code pays neither the second dispatch nor the padding (at 1000x1000 the
pair costs 1.14x the one program; at 64x64 it costs less); a small fill placed on the host, after
HOST_TIER_UP calls.

A storage of DONATE_BYTES or more gets a donating twin (the engine's `fn_donating`), whose copy
program updates the old buffer in place. Anything but a plain fill of one storage keeps the
exact-shape path.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import torch

from ..device import platform
from ..ops import checks
from ..ops import dtypes as dt
from ..storage.records import contiguous_strides
from . import limits, stand_ins, tpu_check
from .entry import DONATE_BYTES
from .executable import TensorArg, ValueArg, _fill, rng_key, traced_function
from .stand_ins import TieringStandIn, _frozen, _is_args_kwargs, _tensor_args

# calls of a fill placed on the host (a small storage on XLA:CPU) before its entry builds its own
# program (others: stand_ins.TIER_UP): that program inlines the generator (~0.5 s of XLA:CPU compile
# for every new shape), the host placement costs a copy of at most DONATE_BYTES per call; PyTorch's
# sweeps call make_tensor tens of times per shape (test_linalg's matmul_small_brute_force_2d_Nd:
# 105 such programs, ~60 s of compile)
HOST_TIER_UP = 1024

SMALLEST_BUCKET = 256  # elements: smaller draws cost nothing to pad
FINE_ABOVE = 1 << 16  # elements: bigger draws take finer buckets
_MAX_DRAWS = 512  # shared draw executables kept (then forgotten, like the engine's caches)
_draws: dict = {}
limits.FORGETTERS.append(_draws.clear)


def bucket_of(n: int, smallest: int = SMALLEST_BUCKET) -> int:
    """The number of elements drawn for a fill of `n` (or an index of `n` entries padded to:
    eager/bucketed_index.py): the next power of two (at least `smallest`), in quarter-octave steps
    above FINE_ABOVE (at most 25% drawn for nothing)."""
    if n <= FINE_ABOVE:
        return max(smallest, 1 << (n - 1).bit_length())
    step = 1 << ((n - 1).bit_length() - 3)
    return -(-n // step) * step


class _Draw:
    """A shared draw executable: `fn` (values..., rng) -> the flat draw of one bucket. `xla`: the
    compiler options it is built with (build.op_jit reads them)."""

    __slots__ = ("fn", "xla")


class BucketedFill(TieringStandIn):
    """The `entry.fn` (or `entry.fn_donating`: `attr`) of a bucketed fill: called as the one-program
    executable is, (buffer, values..., rng, offsets...) -> (the written buffer,). `__wrapped__`: the
    one-program function, which a fused segment traces instead (eager/fusion.py _nestable)."""

    __slots__ = ("donate", "draw", "host", "n_values", "place")

    def __call__(self, *dyn):
        own = self._own_for(dyn)
        if own is not None:
            return own(*dyn)
        nv = self.n_values
        flat = self.draw.fn(*dyn[1 : 2 + nv])
        target = dyn[0]
        host = self.host
        if host and flat.dtype == target.dtype and target.size == host and target.ndim <= 64:  # (numpy's limit)
            # the first elements of the draw are the storage's whole new array, in its memory order
            # (a copy of its own: the draw's bucket is not kept alive by the new array)
            return (jax.device_put(np.asarray(flat)[:host].reshape(target.shape).copy(), target.sharding),)
        if host and 2 * target.size == host and target.ndim <= 64 and not any(np.asarray(dyn[2 + nv :])):
            # a complex storage drawn through its real view (view_as_real, offset 0): (re, im) pairs
            v = np.asarray(flat)[:host].view(target.dtype)
            return (jax.device_put(v.reshape(target.shape).copy(), target.sharding),)
        if flat.sharding != target.sharding:  # an entry drawn for another device (keys do not hold it)
            flat = jax.device_put(flat, target.sharding)
        return self.place(target, flat, *dyn[2 + nv :])

    def _tier_up(self):
        # a fill placed on the host runs one program, as its own would: tiering up saves little per
        # call and costs a threefry compile (0.3-1.3 s on XLA:CPU); PyTorch's test_atleast drew each of
        # its shapes 9-20 times and spent half its time compiling the fills' own programs
        return HOST_TIER_UP if self.host else stand_ins.TIER_UP


class EmptyFill(TieringStandIn):
    """The `entry.fn` of a fill of no elements: the written storage's buffer as it is, no program
    (a fused segment traces the one-program function, `__wrapped__`)."""

    __slots__ = ()

    def __call__(self, *dyn):
        return (dyn[0],)


def fill(kernel, entry, program, fn, records, name, op_jit):
    """`entry.fn` as a BucketedFill when the op is a plain random fill of one storage (`fn`: the
    one-program function, `program` what it runs; `op_jit`: build.op_jit, which jits each part), else
    None. A storage of DONATE_BYTES or more also gets `entry.fn_donating`, which donates its buffer."""
    if not (kernel.draws_by_index and len(records) == 1 and not entry.outs and len(program.writes) == 1):
        return None
    read = _tensor_args(program.template)
    if len(read) != 1:
        return None
    shape = program.writes[0][1][0]
    n = math.prod(shape)
    if n == 0:  # nothing to draw: the storage keeps its buffer (make_tensor of each empty shape compiled)
        c = EmptyFill()
        c._stand_in(entry, "fn", name, op_jit, fn)
        return c
    bucket = bucket_of(n)
    flat_arg = TensorArg(0, ((bucket,), (1,), 0, read[0].layout[3], bucket))
    template = _swap(program.template, flat_arg)
    device = records[0].device_index
    try:
        key = (kernel.name, bucket, device, entry.xla and tuple(sorted(entry.xla.items())), _frozen(template))
        hash(key)
    except TypeError:  # an unhashable static argument: keep the exact-shape path
        return None
    draw = _draws.get(key)
    if draw is None:
        if len(_draws) >= _MAX_DRAWS:
            _draws.clear()
        draw = _draws[key] = _Draw()
        draw.xla = entry.xla
        sharding = jax.sharding.SingleDeviceSharding(platform.jax_device(device))
        draw_fn = _draw_function(program, template, bucket)
        draw.fn = op_jit(draw, "fn", draw_fn, f"{name} (a draw of {bucket})", out_shardings=sharding)
    place = traced_function(
        program._replace(n_values=1, random=False, template=[ValueArg()], run=_first_elements(shape, n))
    )
    parts = (draw, entry, name, op_jit, program.n_values, fn)
    if records[0].nbytes >= DONATE_BYTES:
        entry.fn_donating = _composite(*parts, place, "fn_donating", tuple(program.mutated_slots))
    c = _composite(*parts, place, "fn", ())
    c.host = n if _placed_on_host(program.writes[0], n, records[0]) else 0
    return c


def _placed_on_host(write, n, record) -> bool:
    """Whether the bucket's first `n` elements can become the written storage's new array on the host:
    where device buffers are host memory (XLA:CPU: the draw is read where it lies, and the copy is
    the same bits the per-shape program writes, without compiling that program for each new shape),
    for a plain write of the whole of a small storage in its memory order. On a TPU that would be a
    round trip through the host: the per-shape program stays, and the TPU compile check sees it."""
    if not tpu_check.host_work_allowed() or record.nbytes >= DONATE_BYTES:
        return False
    _, (shape, stride, offset, dtype, numel), bits = write
    if any(bits) or tuple(stride) != tuple(contiguous_strides(shape)) or dtype is dt.COMPLEX32:
        return False
    if record.dtype.is_complex and record.dtype != torch.complex32:
        # the real view of the whole storage (make_tensor's complex draws: its offset, traced, is read
        # at each call): its first 2 * numel elements are the (re, im) pairs in memory order
        return dtype == dt.element(record.dtype.to_real()) and n == 2 * numel == 2 * record.numel
    return type(offset) is int and offset == 0 and numel == n == record.numel and dtype == dt.element(record.dtype)


def _composite(draw, entry, name, op_jit, n_values, fn, place, attr, donate):
    c = BucketedFill()
    c._stand_in(entry, attr, name, op_jit, fn)
    c.draw, c.n_values, c.host, c.donate = draw, n_values, 0, donate
    if donate:  # (a function of its own for the donating jit, as engine._donating)
        c.place = op_jit(c, "place", lambda *dyn: place(*dyn), name, donate_argnums=donate)
    else:
        c.place = op_jit(c, "place", place, name)
    return c


def _draw_function(program, template, bucket):
    """(values..., rng) -> the op's result over a flat stand-in of `bucket` elements (its values are
    never read: draws_by_index)."""
    nv = program.n_values
    dtype = _tensor_args(template)[0].layout[3]

    def draw(*dyn):
        platform.require_x64()
        arguments = _fill(template, [jnp.zeros((bucket,), dt.stored(dtype))], iter(dyn[:nv]), ())
        with checks.collecting() as found:
            _, written, _ = program.run(arguments, rng_key(dyn[nv]))
        if found:
            raise AssertionError("torchtpu: a draws_by_index lowering stated a device-side check")
        (v,) = written
        if v.shape != (bucket,):
            raise AssertionError(f"torchtpu: a draws_by_index lowering drew {v.shape}, expected ({bucket},)")
        return v

    return draw


def _first_elements(shape, n):
    def run(arguments, key):
        (flat,) = arguments
        return [], [flat[:n].reshape(shape)], ()

    return run


def _swap(spec, new):
    """The template with its (one) tensor argument replaced by `new`."""
    t = type(spec)
    if t is TensorArg:
        return new
    if t is list:
        return [_swap(x, new) for x in spec]
    if _is_args_kwargs(spec):
        return (_swap(spec[0], new), {k: _swap(v, new) for k, v in spec[1].items()})
    return spec
