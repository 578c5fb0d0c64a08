"""What the eager engine caches per call form, and the classification both its key (engine.py) and
its builder (build.py) go by: an Entry (the executable and what to do with its results), how each
argument travels (arg_kind), the size limits of kept results and donated writes, and the two ways
a build asks to be called again."""

from __future__ import annotations

import torch

from ..storage.records import RECORDS

_Tensor = torch.Tensor
_SCALAR_TYPES = (bool, int, float, complex)


class SpecializeScalars(Exception):
    """The op's JAX function bakes its Scalar arguments in: key the cache on their values."""


class NeedsResize(Exception):
    """An out= tensor has the wrong shape: PyTorch resizes it before writing, and so do we."""

    def __init__(self, resizes):
        self.resizes = resizes


# How an argument travels (the one classification: the engine keys by it, build.py traces by it)
TENSOR = "tensor"  # a tpu tensor: a buffer slot and a view layout
FOREIGN = "foreign"  # another device's tensor: a CPU scalar travels as a traced value, others raise
SCALAR = "scalar"  # a Python number in a Scalar/Tensor position: a traced value
LIST = "list"  # a list of tensors (and Nones)
OTHER = "other"  # anything else: part of the key, baked into the executable


def arg_kind(a, is_scalar_arg):
    if isinstance(a, _Tensor):
        return TENSOR if RECORDS.get(a.untyped_storage().data_ptr()) is not None else FOREIGN
    if type(a) in _SCALAR_TYPES and is_scalar_arg:
        return SCALAR
    if (
        (type(a) is list or type(a) is tuple)
        and a
        and (isinstance(a[0], _Tensor) or (a[0] is None and any(isinstance(x, _Tensor) for x in a)))
    ):
        return LIST
    return OTHER


# Tensor-free ops whose results total at most CONSTANT_BYTES keep the results of up to
# CONSTANT_VALUES distinct scalar values (Entry.consts).
CONSTANT_BYTES = 1 << 14
CONSTANT_VALUES = 8
# Small deterministic ops (input storages and results together at most MEMO_BYTES) keep the results
# of their last MEMO_VALUES calls, keyed by the identity of the input buffers and the scalar values
# (Entry.memo). A buffer is immutable and a write gives its storage a new one, so the same buffers
# mean the same values: generate() asks for `isin(arange(vocab), eos)` twice per token with the same
# inputs. The memo holds the input buffers, so their identities cannot be reused while it keeps them.
MEMO_BYTES = 1 << 14
MEMO_VALUES = 2
MEMO_GIVE_UP = 32  # an op whose first 32 calls never repeat an earlier one stops keeping results
# In-place ops on storages of at least DONATE_BYTES donate the old buffer when nothing but its
# storage record refers to it (a refcount check, as compiled graphs do): XLA then updates it in place
# instead of writing a whole new copy (`cache[:, :, p] = k`, `index_copy_`, optimizer steps), and
# the old and new buffers never coexist. A buffer shared by a clone, a kept constant or a queued op
# has more references and is not donated.
DONATE_BYTES = 1 << 18


def scalar_key(values):
    """A cache key for Python scalar values that keeps apart what == does not (-0.0 and 0.0, True and 1),
    so a key always returns the array computed for exactly those values."""
    return tuple((type(v), v.hex() if type(v) is float else repr(v) if type(v) is complex else v) for v in values)


class Entry:
    """A cached executable and what to do with its results."""

    __slots__ = (
        "anchor",
        "checks",
        "cold",
        "consts",
        "default_dtype",
        "donating_ran",
        "fn",
        "fn_donating",
        "fn_gated",
        "fn_gated_donating",
        "follows_default_dtype",
        "fresh",
        "gated_ran",
        "host_checked",
        "last_sync",
        "memo",
        "memo_misses",
        "mutated_slots",
        "n_results",
        "nones",
        "outs",
        "overlap",
        "source",
        "spec",
        "store",
        "strides",
        "traced",
        "window_calls",
        "xla",
    )

    def __init__(self):
        self.fn = None  # jitted (buffers..., scalars...) -> (outputs..., mutated buffers...)
        self.outs = []  # (shape, dtype) of each new output (contiguous unless `strides` says)
        self.spec = None  # how returns nest; None: exactly one new tensor
        self.mutated_slots = []  # input slots whose storages get new buffers
        self.nones = None  # per return, which leaves are undefined (None)
        self.checks = ()  # messages of the device-side asserts (ops/checks.py): one more output
        self.n_results = None  # how many arrays fn returns, known once it has run ("fused" mode)
        self.anchor = False  # "fused" mode: a segment may end after this op (eager/fusion.py)
        self.last_sync = -1 << 40  # "fused" mode: when it was last queued, in syncs (eager/fusion.py)
        self.cold = True  # "fused" mode: whether its first call in that sync window was cold
        self.window_calls = 0  # "fused" mode: its calls in that sync window
        # "fused" mode: built in a sync window just after its kernel built one in an earlier window (a
        # new shape per decoding position): a window whose first call finds it cold, it stays cold
        self.fresh = False
        self.consts = None  # small tensor-free ops (torch.full, scalar_tensor): scalars -> results
        self.memo = None  # other small deterministic ops: (input buffer ids, scalars) -> results
        self.memo_misses = 0  # calls that found nothing in `memo` before its first hit
        self.traced = None  # in-place ops on large storages: the function fn jits, for fn_donating
        self.fn_donating = None  # fn with the mutated storages' buffers donated (built on first use)
        self.donating_ran = False  # whether fn_donating completed a call (then it is traced)
        self.overlap = None  # a written tensor shares its storage with an input: eager/overlap.py
        self.xla = None  # the XLA compiler options it was built with (eager/xla_options.py)
        self.source = None  # in-place ops: their Program, for fn_gated
        self.fn_gated = None  # fn gated on unchecked device-side asserts (built on first use: _gated)
        self.fn_gated_donating = None  # the same, donating the written buffers
        self.gated_ran = 0  # which gated forms completed a call (1 plain, 2 donating: then traced)
        self.host_checked = False  # its kernel's host check may raise for some traced number: run per call
        self.strides = None  # per new output, its strides where PyTorch keeps a channels_last layout
        # torch.get_default_dtype() when it was built, None once shown not to matter (the same
        # entry serves every default dtype: engine.py OpKernel._other_default_dtype)
        self.default_dtype = None
        # (kernel, (op name, engine key)) when the op-key cache may keep its executables (eager/op_store.py)
        self.store = None
        self.follows_default_dtype = False  # its result dtypes or its trace depend on that setting
