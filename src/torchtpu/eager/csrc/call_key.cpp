// A call's key from the IValue stack (fast_path.h CallKey): at least as fine as the Python kernel's
// (eager/executable.py key_tensor, engine.py OpKernel._flatten), so the entry it finds is the one
// the Python kernel would use.
#include "fast_path.h"

namespace torchtpu_fast {

// ops/views.py nd_plan's question: does the view (sizes, strides, offset) lie along the dimensions of
// its storage's array, of shape `shape` (a tuple of ints), at this offset?
static bool lies_along(c10::IntArrayRef sizes, c10::IntArrayRef strides, int64_t offset, PyObject* shape) {
  Py_ssize_t rank = PyTuple_GET_SIZE(shape);
  if (rank < 2 || rank > 64) return false;
  int64_t dims[64], spans[64], starts[64];
  int64_t total = 1;
  for (Py_ssize_t j = 0; j < rank; j++) {
    dims[j] = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, j));
    total *= dims[j];
  }
  if (PyErr_Occurred()) {
    PyErr_Clear();
    return false;
  }
  int64_t view_numel = 1;
  for (auto n : sizes) view_numel *= n;
  if (view_numel == 0 || offset < 0 || offset >= total) return false;
  int64_t acc = 1;
  for (Py_ssize_t j = rank - 1; j >= 0; j--) {
    spans[j] = acc;
    acc *= dims[j];
  }
  int64_t rest = offset;
  for (Py_ssize_t j = 0; j < rank; j++) {
    starts[j] = rest / spans[j];
    rest %= spans[j];
  }
  uint64_t used = 0;
  for (size_t i = 0; i < sizes.size(); i++) {
    if (sizes[i] == 1 || strides[i] == 0) continue;
    Py_ssize_t j = 0;
    while (j < rank && !(spans[j] == strides[i] && dims[j] > 1)) j++;
    if (j == rank || (used >> j) & 1 || starts[j] + sizes[i] > dims[j]) return false;
    used |= uint64_t{1} << j;
  }
  return true;
}

CallKey::CallKey(std::vector<char> scalar, const c10::FunctionSchema& schema) : scalar_(std::move(scalar)) {
  const auto& arguments = schema.arguments();
  n_args_ = arguments.size();
  kwarg_only_start_ = static_cast<int64_t>(n_args_);
  while (kwarg_only_start_ > 0 && arguments[kwarg_only_start_ - 1].kwarg_only()) {
    kwarg_only_start_--;
  }
  for (const auto& a : arguments) {
    defaults_.push_back(a.default_value());
  }
  for (int64_t i = 0; i < kwarg_only_start_; i++) {
    if (scalar_[i] == 2) fill_end_ = i + 1;
  }
}

bool CallKey::present(c10::ArrayRef<c10::IValue> args, int64_t i, int64_t positional_end) const {
  if (i < kwarg_only_start_) return i < positional_end;
  return scalar_[i] == 2 || !is_default(args, i);
}

bool CallKey::is_default(c10::ArrayRef<c10::IValue> args, int64_t i) const {
  const auto& d = defaults_[i];
  return d.has_value() && !(*d != args[i]);
}

// A CPU scalar tensor mixed with tpu tensors: a traced value, keyed by its dtype and by whether it is
// a wrapped Python number (`x / 1.0`), which promotes as a Python scalar where a 0-dim tensor of the same
// dtype (`int_x / torch.tensor(1., dtype=float64)`: float64) promotes by its dtype
static Verdict cpu_scalar(const at::Tensor& t, Work& w) {
  if (t.dim() != 0 || t.is_conj() || t.is_neg()) return BAIL;
  auto st = t.scalar_type();
  if (st == c10::ScalarType::UInt64 || c10::isQIntType(st)) return BAIL;
  c10::Scalar s = t.item();
  PyObject* v;
  if (s.isFloatingPoint()) {
    v = PyFloat_FromDouble(s.toDouble());
  } else if (s.isBoolean()) {
    v = PyBool_FromLong(s.toBool());
  } else if (s.isIntegral(false)) {
    v = PyLong_FromLongLong(s.toLong());
  } else if (s.isComplex()) {
    auto c = s.toComplexDouble();
    v = PyComplex_FromDoubles(c.real(), c.imag());
  } else {
    return BAIL;
  }
  if (!v) return ERROR;
  w.values.push_back(v);
  w.key.push_back(K_CPU_SCALAR);
  w.key.push_back(static_cast<int64_t>(st));
  w.key.push_back(t.unsafeGetTensorImpl()->is_wrapped_number() ? 1 : 0);
  return OK;
}

// The call's slot of the storage at `address` and its record (a storage seen before in the call
// reuses its slot, so aliasing is part of the key); the first storage sets the call's device
static Verdict storage_slot(const void* address, Work& w, size_t& slot, PyObject*& record) {
  slot = 0;
  while (slot < w.addresses.size() && w.addresses[slot] != address) slot++;
  if (slot < w.addresses.size()) {
    record = w.records[slot];
    return OK;
  }
  PyObject* a = PyLong_FromVoidPtr(const_cast<void*>(address));
  if (!a) return ERROR;
  record = PyDict_GetItemWithError(C.records, a);
  Py_DECREF(a);
  if (!record) return PyErr_Occurred() ? ERROR : BAIL;
  PyObject* dev = slot_of(record, C.off_device);
  if (!dev || !PyLong_CheckExact(dev)) return BAIL;
  long d = PyLong_AsLong(dev);
  if (w.device >= 0 && d != w.device) return BAIL;  // the Python kernel raises PyTorch's error
  w.device = d;
  w.device_obj = dev;
  w.addresses.push_back(address);
  w.records.push_back(record);
  return OK;
}

// A Scalar argument's number: a traced value, keyed by its type only
static Verdict traced_scalar(const c10::IValue& v, Work& w) {
  PyObject* o;
  if (v.isDouble()) {
    o = PyFloat_FromDouble(v.toDouble());
    w.key.push_back(K_SCALAR_DOUBLE);
  } else if (v.isBool()) {
    o = PyBool_FromLong(v.toBool());
    w.key.push_back(K_SCALAR_BOOL);
  } else if (v.isInt()) {
    o = PyLong_FromLongLong(v.toInt());
    w.key.push_back(K_SCALAR_INT);
  } else {
    auto c = v.toComplexDouble();
    o = PyComplex_FromDoubles(c.real(), c.imag());
    w.key.push_back(K_SCALAR_COMPLEX);
  }
  if (!o) return ERROR;
  w.values.push_back(o);
  return OK;
}

Verdict CallKey::tensor(const at::Tensor& t, Work& w) const {
  if (!t.defined()) {
    w.key.push_back(K_NONE);
    return OK;
  }
  c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  if (impl->key_set().has(c10::DispatchKey::Python)) return BAIL;
  c10::DeviceType dt = impl->device_type();
  if (dt == c10::DeviceType::CPU) return cpu_scalar(t, w);
  if (dt != c10::DeviceType::PrivateUse1 || impl->layout() != c10::kStrided) return BAIL;
  size_t slot = 0;
  PyObject* record = nullptr;
  Verdict found = storage_slot(impl->storage().data_ptr().get(), w, slot, record);
  if (found != OK) return found;
  PyObject* rdtype = slot_of(record, C.off_dtype);
  PyObject* rnumel = slot_of(record, C.off_numel);
  PyObject* rshape = slot_of(record, C.off_shape);   // the shape of the storage's array
  if (!rdtype || !rnumel || !PyLong_CheckExact(rnumel) || !rshape || !PyTuple_CheckExact(rshape) ||
      !THPDtype_Check(rdtype)) return BAIL;
  int64_t numel = PyLong_AsLongLong(rnumel);
  int64_t offset = impl->storage_offset();
  bool partial = offset != 0 || impl->numel() != numel;
  if (partial) w.offsets.push_back(offset);
  auto sizes = impl->sizes();
  auto strides = impl->strides();
  // a partial view keys whether it lies along the storage array's dimensions (executable.py key_tensor)
  int64_t partial_kind = !partial ? 0 : (t.scalar_type() == reinterpret_cast<THPDtype*>(rdtype)->scalar_type &&
                                         lies_along(sizes, strides, offset, rshape)) ? 2 : 1;
  w.key.push_back(K_TENSOR);
  w.key.push_back(static_cast<int64_t>(t.scalar_type()));
  w.key.push_back(static_cast<int64_t>(sizes.size()));
  w.key.insert(w.key.end(), sizes.begin(), sizes.end());
  w.key.insert(w.key.end(), strides.begin(), strides.end());
  w.key.push_back(partial_kind);
  w.key.push_back(static_cast<int64_t>(slot));
  w.key.push_back(reinterpret_cast<intptr_t>(rdtype));
  Py_ssize_t rank = PyTuple_GET_SIZE(rshape);
  w.key.push_back(rank);
  for (Py_ssize_t j = 0; j < rank; j++) {
    PyObject* n = PyTuple_GET_ITEM(rshape, j);
    if (!PyLong_CheckExact(n)) return BAIL;
    w.key.push_back(PyLong_AsLongLong(n));
  }
  w.key.push_back(t.is_conj() * 2 + t.is_neg());
  return OK;
}

// A Tensor[] or Tensor?[] argument: its length, then each tensor's key (or None)
Verdict CallKey::tensor_list(const c10::IValue& v, Work& w) const {
  auto l = v.toListRef();
  w.key.push_back(K_LIST);
  w.key.push_back(static_cast<int64_t>(l.size()));
  for (const auto& x : l) {
    if (x.isNone()) {
      w.key.push_back(K_NONE);
    } else if (x.isTensor()) {
      Verdict r = tensor(x.toTensor(), w);
      if (r != OK) return r;
    } else {
      return BAIL;
    }
  }
  return OK;
}

Verdict CallKey::value(const c10::IValue& v, bool scalar, Work& w) const {
  if (v.isTensor()) return tensor(v.toTensor(), w);
  if (v.isNone()) {
    w.key.push_back(K_NONE);
    return OK;
  }
  if (scalar && (v.isDouble() || v.isInt() || v.isBool() || v.isComplexDouble())) return traced_scalar(v, w);
  if (v.isBool()) {
    w.key.push_back(K_BOOL);
    w.key.push_back(v.toBool());
  } else if (v.isInt()) {
    w.key.push_back(K_INT);
    w.key.push_back(v.toInt());
  } else if (v.isDouble()) {
    double d = v.toDouble();
    int64_t bits;
    std::memcpy(&bits, &d, sizeof bits);
    w.key.push_back(K_DOUBLE);
    w.key.push_back(bits);
  } else if (v.isString()) {
    const std::string& s = v.toStringRef();
    w.key.push_back(K_STR);
    w.key.push_back(static_cast<int64_t>(s.size()));
    for (size_t i = 0; i < s.size(); i += 8) {
      int64_t chunk = 0;
      std::memcpy(&chunk, s.data() + i, std::min<size_t>(8, s.size() - i));
      w.key.push_back(chunk);
    }
  } else if (v.isIntList()) {
    auto l = v.toIntList();
    w.key.push_back(K_INT_LIST);
    w.key.push_back(static_cast<int64_t>(l.size()));
    for (int64_t x : l) w.key.push_back(x);
  } else if (v.isDoubleList()) {
    auto l = v.toDoubleList();
    w.key.push_back(K_DOUBLE_LIST);
    w.key.push_back(static_cast<int64_t>(l.size()));
    for (double x : l) {
      int64_t bits;
      std::memcpy(&bits, &x, sizeof bits);
      w.key.push_back(bits);
    }
  } else if (v.isBoolList()) {
    auto l = v.toBoolList();
    w.key.push_back(K_BOOL_LIST);
    w.key.push_back(static_cast<int64_t>(l.size()));
    for (bool x : l) w.key.push_back(x);
  } else if (v.isList()) {   // Tensor[] and Tensor?[]
    return tensor_list(v, w);
  } else if (v.isDevice()) {
    // only the device of the tensors before it (`x.to(dtype)` passes x's own): a factory's device,
    // another device or an index to resolve are the Python kernel's
    auto d = v.toDevice();
    if (w.device < 0 || d.type() != c10::DeviceType::PrivateUse1 || d.index() != w.device) return BAIL;
    w.key.push_back(K_DEVICE);
    w.key.push_back(d.index());
  } else {
    return BAIL;   // a generator, a SymInt, ...: the Python kernel
  }
  return OK;
}

Verdict CallKey::build(c10::ArrayRef<c10::IValue> args, Work& w) const {
  w.key.reserve(64);
  // torch.get_float32_matmul_precision(): it keys the executables of ops whose lowering reads it
  // (OpKernel.precision_sensitive); every key holds it, so no entry outlives a change of it. It
  // raises while PyTorch's per-backend settings disagree: then the Python kernel runs every call
  // (ops/linalg.py matmul_precision reads the generic setting instead)
  try {
    w.key.push_back(static_cast<int64_t>(at::globalContext().float32MatmulPrecision()));
  } catch (const std::exception&) {
    return BAIL;
  }
  // torch.get_default_dtype(): the result dtype of `int / int`, `scalar_tensor(1)`, a factory without
  // dtype=, ... (the Python kernel keys it only for the entries that follow it: engine.py
  // _other_default_dtype; this key maps to whichever entry the Python kernel ran)
  w.key.push_back(static_cast<int64_t>(c10::typeMetaToScalarType(c10::get_default_dtype())));
  int64_t positional_end = kwarg_only_start_;
  while (positional_end > fill_end_ && is_default(args, positional_end - 1)) positional_end--;
  for (int64_t i = 0; i < static_cast<int64_t>(n_args_); i++) {
    if (!present(args, i, positional_end)) {
      w.key.push_back(K_ABSENT);
      continue;
    }
    Verdict r = value(args[i], scalar_[i], w);
    if (r != OK) return r;
  }
  return w.device >= 0 ? OK : BAIL;   // tensor-free ops (factories) stay in Python
}

}  // namespace torchtpu_fast
