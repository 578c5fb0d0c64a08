"""A compiled graph's fast key: the previous call's key, checked in a few C-level passes over the
next call's tensors (eager/csrc/outputs.cpp graph_match) instead of keyed input by input."""

from __future__ import annotations

import operator
from itertools import compress
from operator import ne

import numpy as np
import torch
from torch._C._dynamo.guards import TensorGuards

from ..eager.fastpath import graph_functions
from ..eager.xla_options import ACTIVE as _xla_active
from ..ops.linalg import matmul_precision
from ..storage.records import RECORDS

_Tensor = torch.Tensor
_data_ptr = _Tensor.data_ptr
FAST_GIVE_UP = 64  # slow keyings in a row after which a graph stops building fast keys


class FastKey:
    """The previous call's key and what it was built from, to key the next call in a few C-level
    passes instead of one Python step per input (a decode step passes the same weights and cache
    tensors each time: keying them was most of the call's host work).

    A call matches when its tensors are what the remembered ones were (dtype, device, conjugate and
    negative bits, sizes and strides; eager/fastpath.py graph_functions, one C++ pass; without
    the C++ library PyTorch's TensorGuards, which check that and more) and lie where they lay: each
    its storage address and offset (the data pointer, without the library). An address names one
    storage forever and storages' address ranges never overlap (storage/records.py), and a tensor
    with elements lies inside its storage, so an unchanged place is the same storage at the same
    offset: the same record, slot and traced offset. A tensor that moved (the next token's ids,
    `timesteps[i]`) is keyed again alone: its storage's record must have the remembered dtype, size
    and device, its partial-view status must be the same, and no two arguments may share a storage;
    otherwise the call is keyed the slow way. Matmul precision and XLA options, which the key holds,
    are compared too. Nothing here keeps a tensor, a record or a buffer alive: storages are
    remembered by address and looked up in RECORDS.

    `state` (where the tensors lie: the C++ fingerprint or the data pointers; storage addresses,
    traced offsets and their int64 scalars) is replaced whole, never changed in place, so a thread
    reads one consistent snapshot."""

    __slots__ = (
        "device",
        "entry",
        "graph_match",
        "graph_records",
        "guards",
        "ints",
        "key",
        "meta",
        "n",
        "partial",
        "pick",
        "precision",
        "reshapes",
        "state",
        "xla",
    )

    @classmethod
    def of(cls, args, key, entry, records, offsets, device, value_ints):
        tensor_at, int_at = [], []
        for i, a in enumerate(args):
            if isinstance(a, _Tensor):
                tensor_at.append(i)
            elif i in value_ints and type(a) is int:
                int_at.append(i)
            else:
                return None
        tensors = [args[i] for i in tensor_at]
        if len(records) != len(tensors) or not tensors:  # storages shared between arguments; CPU tensors
            return None
        f = cls()
        f.n = len(args)
        f.pick = None if not int_at else picker(tensor_at)
        f.ints = picker(int_at) if int_at else None
        addresses = []
        f.meta = []
        f.partial = []
        k = 0
        for t, r in zip(tensors, records):
            if t.numel() == 0:
                return None  # its data pointer may lie past its storage
            addresses.append(t.untyped_storage().data_ptr())
            f.meta.append((r.dtype, r.numel, r.device_index, r.shape))
            if t.storage_offset() or t.numel() != r.numel:  # as key_tensor: a traced offset
                f.partial.append(k)
                k += 1
            else:
                f.partial.append(-1)
        if k != len(offsets) or any(RECORDS.get(a) is not r for a, r in zip(addresses, records)):
            return None
        functions = graph_functions()
        if functions is not None:
            where = functions[0](tensors)
            if where is None:
                return None
            f.guards, f.graph_match, f.graph_records = None, functions[1], functions[3]
        else:
            f.guards = TensorGuards(
                *tensors,
                dynamic_dims_sizes=[list(t.shape) for t in tensors],
                dynamic_dims_strides=[list(t.stride()) for t in tensors],
            )
            where = list(map(_data_ptr, tensors))
        f.state = (where, addresses, list(offsets), [np.int64(o) for o in offsets])
        f.key = key
        f.entry = entry
        f.device = device
        f.precision = key[-1][1] if key[-1][0] == "P" else key[-2][1]  # ("P", ...), then ("X", ...) if set
        f.xla = _xla_active[0]
        return f

    def match(self, graph, args):
        """(entry, records, their buffers or None (then input_buffers reads them), CPU values,
        traced offsets) for `args` if they key as the remembered call did, else None."""
        tensors = args if self.pick is None else self.pick(args)
        state = self.state
        if self.guards is None:
            moved = self.graph_match(state[0], tensors)  # None, () or (fingerprint, moves)
            if moved is None:
                return None
        else:
            if not self.guards.check(*tensors):
                return None
            ptrs = list(map(_data_ptr, tensors))
            moved = (
                ()
                if ptrs == state[0]
                else (
                    ptrs,
                    [
                        (j, tensors[j].untyped_storage().data_ptr(), tensors[j].storage_offset())
                        for j in compress(range(len(ptrs)), map(ne, ptrs, state[0]))
                    ],
                )
            )
        if matmul_precision() != self.precision or _xla_active[0] != self.xla:
            return None
        if moved:
            state = self._moved(tensors, moved, state)
            if state is None:
                return None
            self.state = state
        if self.ints is None:
            cpu_vals = []
        else:
            cpu_vals = list(self.ints(args))
            if not all(type(v) is int for v in cpu_vals):
                return None
        graph._fast_misses = 0
        if self.guards is None:
            records, buffers = self.graph_records(state[1])
            return self.entry, records, buffers, cpu_vals, state[3]
        return self.entry, list(map(RECORDS.__getitem__, state[1])), None, cpu_vals, state[3]

    def _moved(self, tensors, moved, state):
        """The state for `tensors`, some of which moved to other storages or offsets (`moved`: where
        they all lie now, and (index, storage address, offset) of each that moved), or None if that
        changes the key."""
        where, moves = moved
        _, addresses, offsets, offset_vals = state
        addresses = addresses.copy()
        new_offsets = None
        stored = False
        for j, address, off in moves:
            meta = self.meta[j]
            if address != addresses[j]:
                r = RECORDS.get(address)
                if r is None or r.dtype != meta[0] or r.shape != meta[3] or r.device_index != meta[2]:
                    return None
                addresses[j] = address
                stored = True
            k = self.partial[j]
            if (k >= 0) != bool(off or tensors[j].numel() != meta[1]):
                return None
            if k >= 0:
                if new_offsets is None:
                    new_offsets = offsets.copy()
                new_offsets[k] = off
        if stored and any(addresses.count(a) > 1 for _, a, _ in moves):  # two arguments on one storage
            return None
        if new_offsets is None or new_offsets == offsets:
            return where, addresses, offsets, offset_vals
        return where, addresses, new_offsets, [np.int64(o) for o in new_offsets]


def picker(positions):
    """`args -> tuple of args[i] for i in positions` in C (itemgetter returns a lone item bare)."""
    if len(positions) == 1:
        i = positions[0]
        return lambda args: (args[i],)
    return operator.itemgetter(*positions)
