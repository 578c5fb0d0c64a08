"""A tpu:i tensor for i > 0, made through DLPack (create_empty_tensor only makes tpu:0 tensors).

DLPack's kDLExtDev device type maps to PyTorch's PrivateUse1 with the index we give. The tensor is
never read: it only serves as a TensorImpl on tpu:i that new tpu:i tensors alias and re-point.
"""

import ctypes

import torch

_K_DL_EXT_DEV = 12


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(_DLManagedTensor))
_DLManagedTensor._fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _DELETER)]
_keep = []  # the structures must outlive the seed tensors, which live for the process
_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


def make(device_index: int) -> torch.Tensor:
    shape = (ctypes.c_int64 * 1)(0)
    m = _DLManagedTensor()
    m.dl_tensor.data = 1 << 39  # never dereferenced: the tensor has no elements
    m.dl_tensor.device = _DLDevice(_K_DL_EXT_DEV, device_index)
    m.dl_tensor.ndim = 1
    m.dl_tensor.dtype = _DLDataType(2, 32, 1)  # float32
    m.dl_tensor.shape = shape
    # No deleter (a NULL function pointer): nothing to free, and no Python callback that could be
    # reached while the interpreter shuts down.
    m.deleter = _DELETER()
    _keep.append((m, shape))
    capsule = _capsule_new(ctypes.addressof(m), b"dltensor", None)
    t = torch.utils.dlpack.from_dlpack(capsule)
    assert t.device == torch.device("tpu", device_index), t.device
    return t
