// New output tensors made here as storage/records.py new_tensor makes them, storages freed as its
// _on_free frees them, and compiled graphs' helpers (compile/fast_key.py, compile/backend.py).
#include "fast_path.h"

namespace torchtpu_fast {

bool add_slot(PyObject* obj, Py_ssize_t offset, int64_t delta, int64_t* now) {
  PyObject** p = reinterpret_cast<PyObject**>(reinterpret_cast<char*>(obj) + offset);
  if (!*p || !PyLong_CheckExact(*p)) {
    PyErr_SetString(PyExc_RuntimeError, "torchtpu fast path: bad memory statistics");
    return false;
  }
  int64_t v = PyLong_AsLongLong(*p) + delta;
  if (delta) {
    PyObject* n = PyLong_FromLongLong(v);
    if (!n) return false;
    PyObject* old = *p;
    *p = n;
    Py_DECREF(old);
  }
  if (now) *now = v;
  return true;
}

// new_tensor's statistics: tpu:0's MemoryStats (made by the Python `stats` if missing)
static bool count_new(int64_t nbytes, bool materialized) {
  PyObject* key = PyLong_FromLong(0);
  if (!key) return false;
  PyObject* s = PyDict_GetItemWithError(C.stats, key);
  Py_DECREF(key);
  if (!s) {
    PyErr_SetString(PyExc_RuntimeError, "torchtpu fast path: no memory statistics for tpu:0");
    return false;
  }
  int64_t allocated, failed, peak, mat, peak_mat;
  if (!add_slot(s, C.off_allocated, nbytes, &allocated) || !add_slot(s, C.off_num_alloc, 1, nullptr) ||
      !add_slot(s, C.off_failed, 0, &failed) || !add_slot(s, C.off_peak, 0, &peak)) {
    return false;
  }
  if (allocated - failed > peak && !add_slot(s, C.off_peak, allocated - failed - peak, nullptr)) return false;
  if (materialized) {
    if (!add_slot(s, C.off_materialized, nbytes, &mat) || !add_slot(s, C.off_peak_materialized, 0, &peak_mat)) {
      return false;
    }
    if (mat > peak_mat && !add_slot(s, C.off_peak_materialized, mat - peak_mat, nullptr)) return false;
  }
  return true;
}

// storage/records.py: new_tensor(shape, dtype, 0, buffer), step for step: a storage at a fresh
// address (the bump counter, a guard page), the TensorImpl create_empty_tensor makes with that
// storage swapped in, its StorageRecord, the weak reference that frees the record with the
// storage, the memory statistics. No Python tensor object is made (PyTorch makes one if the
// result goes back to Python).
at::Tensor new_output(const Out& e, PyObject* device_obj, PyObject* buffer) {
  {
    PyObject* key = PyLong_FromLong(0);
    if (!key) throw python_error();
    PyObject* s = PyDict_GetItemWithError(C.stats, key);
    Py_DECREF(key);
    if (!s) {
      if (PyErr_Occurred()) throw python_error();
      return at::Tensor();   // no statistics for tpu:0 yet: new_tensor makes them
    }
  }
  PyObject* next = PyList_GET_SIZE(C.bump) ? PyList_GET_ITEM(C.bump, 0) : nullptr;
  if (!next || !PyLong_CheckExact(next)) {
    PyErr_SetString(PyExc_RuntimeError, "torchtpu fast path: bad address counter");
    throw python_error();
  }
  int64_t address = PyLong_AsLongLong(next);
  PyObject* advanced = PyLong_FromLongLong(address + ((e.nbytes + 2 * C.page - 1) / C.page) * C.page);
  if (!advanced) throw python_error();
  if (PyList_SetItem(C.bump, 0, advanced) < 0) throw python_error();   // steals `advanced`
  c10::Storage storage(c10::Storage::use_byte_size_t(), static_cast<size_t>(e.nbytes),
                       at::DataPtr(reinterpret_cast<void*>(address), c10::Device(c10::DeviceType::PrivateUse1, 0)));
  at::Tensor t = at::detail::make_tensor<c10::TensorImpl>(
      c10::Storage(storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
      caffe2::TypeMeta::fromScalarType(e.scalar_type));
  if (e.strides.empty()) {
    t.unsafeGetTensorImpl()->set_sizes_contiguous(e.sizes);
  } else {   // a permutation of a dense layout (the storage holds numel elements all the same)
    t.unsafeGetTensorImpl()->set_sizes_and_strides(e.sizes, e.strides);
  }

  PyObject* storage_obj = THPStorage_Wrap(storage);
  if (!storage_obj) throw python_error();
  PyObject* ref_args[2] = {storage_obj, C.on_free};
  PyObject* ref = PyObject_Vectorcall(C.ref_type, ref_args, 2, nullptr);
  Py_DECREF(storage_obj);
  if (!ref) throw python_error();
  PyObject* address_obj = PyLong_FromLongLong(address);
  PyObject* numel_obj = PyLong_FromLongLong(e.numel);
  PyObject* nbytes_obj = PyLong_FromLongLong(e.nbytes);
  PyObject* record = nullptr;
  if (address_obj && numel_obj && nbytes_obj) {
    // StorageRecord(dtype, numel, nbytes, device, buffer) with its `ref` set, slot by slot
    // (fastpath.py checks that these are all its slots)
    PyTypeObject* type = reinterpret_cast<PyTypeObject*>(C.record_type);
    record = type->tp_alloc(type, 0);
    if (record) {
      set_slot(record, C.off_buffer, buffer);
      set_slot(record, C.off_dtype, e.dtype);
      set_slot(record, C.off_numel, numel_obj);
      // a contiguous output's array has its shape; a permuted one's its shape in memory order
      set_slot(record, C.off_shape, e.form ? e.form : e.shape);
      set_slot(record, C.off_nbytes, nbytes_obj);
      set_slot(record, C.off_device, device_obj);
      set_slot(record, C.off_oom, Py_False);
      set_slot(record, C.off_ref, ref);
    }
  }
  Py_XDECREF(numel_obj);
  Py_XDECREF(nbytes_obj);
  bool ok = record != nullptr;
  if (ok) {
    set_slot(ref, C.off_address, address_obj);   // ref.address = address
    ok = PyDict_SetItem(C.records, address_obj, record) == 0;
  }
  Py_XDECREF(address_obj);
  Py_DECREF(ref);
  Py_XDECREF(record);
  if (!ok || !count_new(e.nbytes, buffer != Py_None)) throw python_error();
  return t;
}


// A compiled graph's fast key (compile/backend.py _FastKey): each tensor argument as int64s, its
// storage address and offset (where it is), then its dtype, device index, conjugate and negative
// bits, dim, sizes and strides (what it is). False for an argument the fast key does not take: not
// a plain strided tpu tensor with elements.
constexpr size_t kWhere = 2;

bool graph_tensor(PyObject* obj, std::vector<int64_t>& out) noexcept {
  if (!THPVariable_Check(obj)) return false;
  try {
    const at::Tensor& t = THPVariable_Unpack(obj);
    c10::TensorImpl* impl = t.unsafeGetTensorImpl();
    if (impl->device_type() != c10::DeviceType::PrivateUse1 || impl->layout() != c10::kStrided ||
        impl->key_set().has(c10::DispatchKey::Python) || impl->numel() == 0 || !impl->has_storage()) {
      return false;
    }
    auto sizes = impl->sizes();
    auto strides = impl->strides();
    out.push_back(reinterpret_cast<intptr_t>(impl->storage().data_ptr().get()));
    out.push_back(impl->storage_offset());
    out.push_back(static_cast<int64_t>(t.scalar_type()));
    out.push_back(impl->device().index());
    out.push_back(t.is_conj() * 2 + t.is_neg());
    out.push_back(static_cast<int64_t>(sizes.size()));
    out.insert(out.end(), sizes.begin(), sizes.end());
    out.insert(out.end(), strides.begin(), strides.end());
    return true;
  } catch (const std::exception&) {   // sizes of a tensor that has no plain ones: not ours to key
    return false;
  }
}

// Ask for the memory graph_tensor reads of each of `items` before reading it: a compiled call's
// tensors (a decode step's 50-odd weights) are cold after the previous call's executable ran, and
// reading them one after the other waits on three dependent cache misses per tensor (the Python
// object, its TensorImpl, its StorageImpl); level by level, the misses of all tensors overlap.
void prefetch_tensors(PyObject* const* items, Py_ssize_t n) {
  for (Py_ssize_t i = 0; i < n; i++) __builtin_prefetch(items[i]);
  c10::SmallVector<c10::TensorImpl*, 64> impls;
  for (Py_ssize_t i = 0; i < n; i++) {
    if (!THPVariable_Check(items[i])) return;
    c10::TensorImpl* impl = THPVariable_Unpack(items[i]).unsafeGetTensorImpl();
    const char* p = reinterpret_cast<const char*>(impl);
    for (size_t off = 0; off < sizeof(c10::TensorImpl); off += 64) __builtin_prefetch(p + off);
    impls.push_back(impl);
  }
  for (c10::TensorImpl* impl : impls) {
    if (impl->has_storage()) __builtin_prefetch(impl->unsafe_storage().unsafeGetStorageImpl());
  }
}

PyObject* int64_bytes(const std::vector<int64_t>& v) {
  return PyBytes_FromStringAndSize(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(int64_t));
}

// The fast key of a compiled graph's tensor arguments (a sequence): bytes, or None where one of
// them is not a plain strided tpu tensor with elements.
PyObject* graph_fingerprint(PyObject*, PyObject* tensors) {
  PyObject* seq = PySequence_Fast(tensors, "torchtpu: a sequence of tensors");
  if (!seq) return nullptr;
  std::vector<int64_t> out;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  PyObject** items = PySequence_Fast_ITEMS(seq);
  for (Py_ssize_t i = 0; i < n; i++) {
    if (!graph_tensor(items[i], out)) {
      Py_DECREF(seq);
      Py_RETURN_NONE;
    }
  }
  Py_DECREF(seq);
  return int64_bytes(out);
}

// `tensors` against `fingerprint` (graph_fingerprint of an earlier call): None if what a
// tensor is differs; () if every one is where it was; else (the new fingerprint, ((index, storage
// address, offset) of each tensor that moved, ...)).
PyObject* graph_match(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 2) {
    PyErr_SetString(PyExc_TypeError, "graph_match(fingerprint, tensors)");
    return nullptr;
  }
  PyObject* fingerprint = args[0];
  PyObject* tensors = args[1];
  if (!PyBytes_Check(fingerprint)) {
    PyErr_SetString(PyExc_TypeError, "torchtpu: a fingerprint is bytes");
    return nullptr;
  }
  PyObject* seq = PySequence_Fast(tensors, "torchtpu: a sequence of tensors");
  if (!seq) return nullptr;
  const int64_t* expected = reinterpret_cast<const int64_t*>(PyBytes_AS_STRING(fingerprint));
  size_t total = PyBytes_GET_SIZE(fingerprint) / sizeof(int64_t);
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  PyObject** items = PySequence_Fast_ITEMS(seq);
  std::vector<int64_t> got;
  got.reserve(total);
  std::vector<std::pair<Py_ssize_t, size_t>> moved;   // (argument, its place in the fingerprint)
  bool same = true;
  prefetch_tensors(items, n);
  for (Py_ssize_t i = 0; i < n && same; i++) {
    size_t at = got.size();
    if (!graph_tensor(items[i], got) || got.size() > total) {
      same = false;
      break;
    }
    same = std::memcmp(got.data() + at + kWhere, expected + at + kWhere,
                       (got.size() - at - kWhere) * sizeof(int64_t)) == 0;
    if (got[at] != expected[at] || got[at + 1] != expected[at + 1]) moved.emplace_back(i, at);
  }
  Py_DECREF(seq);
  if (!same || got.size() != total) Py_RETURN_NONE;
  if (moved.empty()) return PyTuple_New(0);
  PyObject* where = PyTuple_New(moved.size());
  if (!where) return nullptr;
  for (size_t k = 0; k < moved.size(); k++) {
    size_t at = moved[k].second;
    PyObject* item = Py_BuildValue("(nLL)", moved[k].first, static_cast<long long>(got[at]),
                                   static_cast<long long>(got[at + 1]));
    if (!item) {
      Py_DECREF(where);
      return nullptr;
    }
    PyTuple_SET_ITEM(where, k, item);
  }
  PyObject* fp = int64_bytes(got);
  if (!fp) {
    Py_DECREF(where);
    return nullptr;
  }
  return Py_BuildValue("(NN)", fp, where);   // (N: the tuple takes both references)
}

// Whether sizes `shape` with strides `stride` (None: contiguous) are the contiguous layout, size-1
// dimensions taking any stride (storage/records.py is_dense).
bool dense(PyObject* shape, PyObject* stride) {
  if (stride == Py_None) return true;
  if (!PyTuple_Check(stride) || PyTuple_GET_SIZE(stride) != PyTuple_GET_SIZE(shape)) return false;
  int64_t expected = 1;
  for (Py_ssize_t j = PyTuple_GET_SIZE(shape) - 1; j >= 0; j--) {
    int64_t n = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, j));
    int64_t st = PyLong_AsLongLong(PyTuple_GET_ITEM(stride, j));
    if (PyErr_Occurred()) {
      PyErr_Clear();
      return false;
    }
    if (n != 1 && st != expected) return false;
    expected *= n;
  }
  return true;
}

// compile/backend.py CompiledGraph: graph_outputs(shapes, dtypes, strides, device index, results),
// the new output tensors over an executable's results, each made as storage/records.py new_tensor
// makes it: here when contiguous on tpu:0 (native outputs), else by new_tensor.
PyObject* graph_outputs(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 5 || !PyTuple_Check(args[0]) || !PyTuple_Check(args[1]) || !PyTuple_Check(args[2]) ||
      PyTuple_GET_SIZE(args[1]) != PyTuple_GET_SIZE(args[0]) || PyTuple_GET_SIZE(args[2]) != PyTuple_GET_SIZE(args[0])) {
    PyErr_SetString(PyExc_TypeError, "graph_outputs(shapes, dtypes, strides, device index, results)");
    return nullptr;
  }
  PyObject* device = args[3];
  PyObject* results = PySequence_Fast(args[4], "graph_outputs: results are a sequence");
  if (!results) return nullptr;
  Py_ssize_t n = PyTuple_GET_SIZE(args[0]);
  if (PySequence_Fast_GET_SIZE(results) < n) {
    Py_DECREF(results);
    PyErr_SetString(PyExc_ValueError, "graph_outputs: fewer results than outputs");
    return nullptr;
  }
  bool native = C.native_outputs && PyLong_CheckExact(device) && PyLong_AsLong(device) == 0;
  PyObject* out = PyList_New(n);
  for (Py_ssize_t i = 0; out && i < n; i++) {
    PyObject* shape = PyTuple_GET_ITEM(args[0], i);
    PyObject* dtype = PyTuple_GET_ITEM(args[1], i);
    PyObject* stride = PyTuple_GET_ITEM(args[2], i);
    PyObject* buffer = PySequence_Fast_GET_ITEM(results, i);
    PyObject* made = nullptr;
    Out o;   // borrowed shape and dtype: new_output only reads them
    o.shape = shape;
    o.dtype = dtype;
    if (native) o.measure();
    if (o.scalar_type != c10::ScalarType::Undefined && dense(shape, stride)) {
      try {
        at::Tensor t = new_output(o, device, buffer);
        if (t.defined()) made = THPVariable_Wrap(std::move(t));
      } catch (python_error& e) {
        e.restore();
      } catch (const std::exception& e) {
        PyErr_Format(PyExc_RuntimeError, "torchtpu: %s", e.what());
      }
      if (!made && PyErr_Occurred()) {
        Py_CLEAR(out);
        break;
      }
    }
    if (!made) {
      PyObject* nargs5[5] = {shape, dtype, device, buffer, stride};
      made = PyObject_Vectorcall(C.new_tensor, nargs5, 5, nullptr);
      if (!made) {
        Py_CLEAR(out);
        break;
      }
    }
    PyList_SET_ITEM(out, i, made);
  }
  Py_DECREF(results);
  return out;
}

// compile/backend.py _FastKey: graph_records(addresses), the storage records at `addresses`
// (RECORDS keys) and their buffers, the executable's first arguments; (records, None) when one is
// not a plain array (never written, or a queued result of the fused mode: input_buffers decides).
PyObject* graph_records(PyObject*, PyObject* addresses) {
  PyObject* seq = PySequence_Fast(addresses, "graph_records: a sequence of addresses");
  if (!seq) return nullptr;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  PyObject** items = PySequence_Fast_ITEMS(seq);
  PyObject* records = PyList_New(n);
  for (Py_ssize_t i = 0; records && i < n; i++) {
    PyObject* r = PyDict_GetItemWithError(C.records, items[i]);
    if (!r) {
      if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, items[i]);
      Py_CLEAR(records);
      break;
    }
    __builtin_prefetch(reinterpret_cast<char*>(r) + C.off_buffer);
    Py_INCREF(r);
    PyList_SET_ITEM(records, i, r);
  }
  Py_DECREF(seq);
  if (!records) return nullptr;
  PyObject** recs = PySequence_Fast_ITEMS(records);
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject* b = *reinterpret_cast<PyObject**>(reinterpret_cast<char*>(recs[i]) + C.off_buffer);
    if (b) __builtin_prefetch(b);
  }
  PyObject* buffers = PyList_New(n);
  for (Py_ssize_t i = 0; buffers && i < n; i++) {
    PyObject* b = *reinterpret_cast<PyObject**>(reinterpret_cast<char*>(recs[i]) + C.off_buffer);
    if (!b || Py_TYPE(b) != C.array_type) {
      Py_CLEAR(buffers);
      buffers = Py_None;
      Py_INCREF(buffers);
      break;
    }
    Py_INCREF(b);
    PyList_SET_ITEM(buffers, i, b);
  }
  if (!buffers) {
    Py_DECREF(records);
    return nullptr;
  }
  return Py_BuildValue("(NN)", records, buffers);
}

// storage/records.py _on_free(ref), the weak reference callback of every tpu storage: its record
// leaves RECORDS and the memory statistics, in one C call (a Python callback at every freed tensor,
// ~200 per eager decode token, cost about a third of a microsecond more).
PyObject* storage_freed(PyObject*, PyObject* ref) {
  PyObject* address = *reinterpret_cast<PyObject**>(reinterpret_cast<char*>(ref) + C.off_address);
  if (!address) Py_RETURN_NONE;
  PyObject* record = PyDict_GetItemWithError(C.records, address);
  if (!record) {
    if (PyErr_Occurred()) return nullptr;
    Py_RETURN_NONE;
  }
  Py_INCREF(record);
  bool ok = PyDict_DelItem(C.records, address) == 0;
  PyObject* s = ok ? PyDict_GetItemWithError(C.stats, slot_of(record, C.off_device)) : nullptr;
  PyObject* nbytes_obj = slot_of(record, C.off_nbytes);
  int64_t nbytes = nbytes_obj ? PyLong_AsLongLong(nbytes_obj) : 0;
  if (s && !PyErr_Occurred()) {
    PyObject* buffer = slot_of(record, C.off_buffer);
    ok = add_slot(s, C.off_allocated, -nbytes, nullptr) &&
         add_slot(s, C.off_num_free, 1, nullptr);
    if (ok && buffer && buffer != Py_None) {
      ok = add_slot(s, C.off_materialized, -nbytes, nullptr);
    } else if (ok && slot_of(record, C.off_oom) == Py_True) {
      ok = add_slot(s, C.off_failed, -nbytes, nullptr);
    }
  } else {
    ok = false;
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "torchtpu: no memory statistics for a freed storage");
  }
  Py_DECREF(record);
  if (!ok) return nullptr;
  Py_RETURN_NONE;
}

PyMethodDef kGraphMethods[5] = {
    {"graph_fingerprint", graph_fingerprint, METH_O, nullptr},
    {"graph_match", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(graph_match)), METH_FASTCALL,
     nullptr},
    {"graph_outputs", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(graph_outputs)), METH_FASTCALL,
     nullptr},
    {"graph_records", graph_records, METH_O, nullptr},
    {"storage_freed", storage_freed, METH_O, nullptr},
};

}  // namespace torchtpu_fast
