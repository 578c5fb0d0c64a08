// The eager engine's C++ fast path (eager/fastpath.py): a boxed PrivateUse1 kernel in front of the
// Python OpKernel (eager/engine.py) of one ATen overload.
//
// The Python kernel is registered on the spare PrivateUse3 key; this kernel, on PrivateUse1, holds
// PyTorch's own boxed holder of it (getComputedKernelForDispatchKey) and falls back to it, so a
// fallback behaves exactly as the Python kernel registered on PrivateUse1 did. The hot path builds
// a key from the IValue stack (each argument as the Python kernel would see it: present or left at
// its default, each tensor's dtype, sizes, strides, whether it is part of its storage, which
// storage slot, the storage record's dtype and size; the non-tensor values; only the types of the
// Scalar arguments, which travel as traced values; PyTorch's float32 matmul precision, which the
// lowerings of matmuls read), finds a "fast entry" that the Python side
// described after running the same key (fastpath.describe: a plain executable whose returns are
// all new outputs, or an in-place write), calls its jitted function with the storages' buffers,
// the scalars and the offsets of partial views (a write in its gated form while unchecked
// device-side verdicts exist: eager/asserts.py), keeps its own verdict if it has checks
// (asserts.note), and makes the output tensors (storage/records.py: new_tensor). In the "fused"
// mode it appends the call to the open segment itself, as eager/fusion.py defer does, when the op
// is warm and nothing is to decide (FastKernel::queue); otherwise it hands the keyed call to
// OpKernel._run, which queues it; then it makes the outputs over the queued results. Anything
// else — a key not seen yet, an entry that is not plain, the debug mode, a failed device-side
// assert, a pending interrupt, XLA options in force, in strict mode an unwritten or queued buffer,
// a write strict mode donates, or an error — runs the Python kernel. The key is at least as fine
// as the Python kernel's, so the entry it finds is the one the Python kernel would use.
//
// Everything it reads of the Python side comes from one table, eager/fastpath.py FastPathTable, read
// by name at init (kTableNames); every rule not on this cache-hit path lives in Python only.
// Loaded with ctypes.PyDLL (the GIL is held by every entry point called from Python).
#include <Python.h>
#include <structmember.h>

#include <ATen/Context.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <c10/util/Exception.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/Storage.h>
#include <torch/csrc/autograd/python_variable.h>

#include <cstring>
#include <memory>
#include <unordered_map>
#include <vector>

namespace {

// What the fast path reads of the Python side: eager/fastpath.py FastPathTable, one attribute per
// name of kTableNames (fastpath.load checks that the two name the same fields), read once by
// torchtpu_fast_init; each is checked for its type there, with its name in the error.
constexpr const char* kTableNames[] = {
    "records", "mode", "strict_mode", "fused_mode", "failed_asserts", "pending_interrupts", "xla_active",
    "unchecked_verdicts", "counters", "record_type", "array_type", "entry_type", "new_tensor", "describe",
    "device_scalar", "note_verdict", "run_method", "native_outputs", "address_counter", "memory_stats",
    "storage_ref_type", "memory_stats_type", "page_bytes", "open_segments", "sync_count", "fusion_lock",
    "pending_type", "segment_type", "min_ops", "limit", "cold_calls", "hot_syncs",
};

struct Config {
  PyObject* records = nullptr;     // storage address -> StorageRecord
  PyObject* mode = nullptr;        // eager/modes.py: [the mode's name]
  PyObject* strict = nullptr;      // its name for the strict mode
  PyObject* fused = nullptr;       // its name for the fused mode
  PyObject* failed = nullptr;      // eager/asserts.py: failed device-side asserts (a dict)
  PyObject* pending = nullptr;     // eager/interrupts.py: pending interrupts (a list)
  PyObject* xla_active = nullptr;  // eager/xla_options.py: [the options in force]
  PyObject* unchecked = nullptr;   // eager/asserts.py: [unchecked verdicts] (writes are gated when > 0)
  PyObject* counters = nullptr;    // metrics.counters
  Py_ssize_t off_hits = -1;        // its eager_cache_hits slot
  Py_ssize_t off_buffer = -1, off_dtype = -1, off_numel = -1, off_device = -1, off_shape = -1;  // StorageRecord slots
  Py_ssize_t off_memo = -1;        // engine Entry's memo slot
  PyObject* new_tensor = nullptr;  // storage/records.py: new_tensor
  PyObject* describe = nullptr;    // describe(kernel): what a fast entry runs (eager/fastpath.py)
  PyTypeObject* array_type = nullptr;  // jax.Array's implementation type
  PyObject* run_name = nullptr;    // the OpKernel method that runs a keyed call (OpKernel._run)
  // what new_tensor (storage/records.py) touches, for making outputs here (tpu:0)
  bool native_outputs = false;
  PyObject* bump = nullptr;         // [next address]
  int64_t page = 0;                 // the addresses' spacing unit: each storage ends with a guard page
  PyObject* stats = nullptr;        // device index -> MemoryStats
  PyObject* record_type = nullptr;  // StorageRecord
  PyObject* ref_type = nullptr;     // _StorageRef
  PyObject* on_free = nullptr;      // the storages' weak reference callback
  Py_ssize_t off_ref = -1, off_address = -1, off_nbytes = -1, off_oom = -1;
  Py_ssize_t off_allocated = -1, off_peak = -1, off_num_alloc = -1, off_num_free = -1, off_materialized = -1,
             off_peak_materialized = -1, off_failed = -1;
  // device_scalar(number) -> that number as a device array on tpu:0 (eager/device_scalars.py)
  PyObject* device_scalar = nullptr;
  // eager/asserts.py: note(verdict, messages, where), for ops with device-side checks
  PyObject* note = nullptr;
};

Config C;

// The "fused" mode's queue (eager/fusion.py defer), for the common case
struct Fused {
  bool ready = false;
  PyObject* open = nullptr;      // fusion: device index -> the open _Segment
  PyObject* syncs = nullptr;     // fusion: [synchronizations so far]
  PyObject* acquire = nullptr;   // the fusion lock's acquire
  PyObject* release = nullptr;   // the fusion lock's release
  PyTypeObject* pending = nullptr;   // fusion.Pending
  Py_ssize_t e_fn = -1, e_last_sync = -1, e_cold = -1, e_window_calls = -1, e_anchor = -1;   // Entry slots
  Py_ssize_t s_steps = -1, s_external = -1, s_external_ids = -1, s_undo = -1, s_undo_ids = -1;   // _Segment
  Py_ssize_t p_segment = -1, p_step = -1, p_index = -1, p_value = -1;   // Pending slots
  Py_ssize_t c_fused_ops = -1;   // counters.fused_ops
  long min_ops = 0, limit = 0, cold_calls = 0, hot_syncs = 0;
};

Fused F;

// Releases fusion._lock (taken with acquire(False)) when it goes out of scope, keeping any Python
// error set meanwhile
struct FusionUnlock {
  ~FusionUnlock() {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyObject* r = PyObject_CallNoArgs(F.release);
    if (r) Py_DECREF(r); else PyErr_Clear();
    PyErr_Restore(type, value, tb);
  }
};

// Set an object slot to `value`: set_slot_owned takes the reference it is given, set_slot takes one
// of its own. (Their one name once made the class's copy shadow this one: fused-mode steps leaked.)
void set_slot_owned(PyObject* obj, Py_ssize_t offset, PyObject* value) {
  PyObject** p = reinterpret_cast<PyObject**>(reinterpret_cast<char*>(obj) + offset);
  PyObject* old = *p;
  *p = value;
  Py_XDECREF(old);
}

void set_slot(PyObject* obj, Py_ssize_t offset, PyObject* value) {
  Py_INCREF(value);
  set_slot_owned(obj, offset, value);
}

// JAX converts every Python number argument to a device array on each call (about 2.5 us each):
// the traced scalars and storage offsets of calls on tpu:0 are passed as kept device arrays of the
// same (weakly typed) dtype instead, one per value, up to kMaxScalars values
constexpr size_t kMaxScalars = 4096;
struct ScalarKeyHash {
  size_t operator()(const std::pair<int, int64_t>& k) const noexcept {
    return std::hash<int64_t>()(k.second) * 31 + k.first;
  }
};
std::unordered_map<std::pair<int, int64_t>, PyObject*, ScalarKeyHash> g_scalars;
bool g_cache_scalars = true;

void clear_scalars() {
  for (auto& kv : g_scalars) Py_DECREF(kv.second);
  g_scalars.clear();
}

// the kept device array for Python number `v` (borrowed), or `v` itself; nullptr with the error
// set when Python raised something that is not an Exception (KeyboardInterrupt) meanwhile
PyObject* device_scalar(PyObject* v) {
  if (!g_cache_scalars || !C.device_scalar) return v;
  std::pair<int, int64_t> key;
  if (PyFloat_CheckExact(v)) {
    double d = PyFloat_AS_DOUBLE(v);
    std::memcpy(&key.second, &d, sizeof d);
    key.first = 1;
  } else if (PyLong_CheckExact(v)) {
    int overflow = 0;
    key.second = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow || (key.second == -1 && PyErr_Occurred())) {
      PyErr_Clear();
      return v;
    }
    key.first = 2;
  } else {
    return v;   // bools and complex numbers go as they are
  }
  auto it = g_scalars.find(key);
  if (it != g_scalars.end()) return it->second;
  PyObject* a = PyObject_CallOneArg(C.device_scalar, v);
  if (!a) {
    if (!PyErr_ExceptionMatches(PyExc_Exception)) return nullptr;   // a KeyboardInterrupt: raised
    PyErr_Clear();
    return v;
  }
  if (g_scalars.size() >= kMaxScalars) clear_scalars();
  g_scalars.emplace(key, a);
  return a;
}

bool g_enabled = false;
long long g_fast_calls = 0, g_fallbacks = 0, g_queued_here = 0;

enum : int64_t {
  K_ABSENT = 1, K_NONE, K_TENSOR, K_CPU_SCALAR, K_SCALAR_INT, K_SCALAR_DOUBLE, K_SCALAR_BOOL,
  K_SCALAR_COMPLEX, K_INT, K_DOUBLE, K_BOOL, K_STR, K_INT_LIST, K_DOUBLE_LIST, K_BOOL_LIST, K_LIST, K_DEVICE,
};

enum State { NEVER = 0, FAST = 1, LATER = 2 };
constexpr int kLaterCalls = 48;      // a "later" entry (its last call was not described) is asked again after this many calls
constexpr size_t kMaxEntries = 4096; // per op; past it the table starts over

// ops/views.py nd_plan's question: does the view (sizes, strides, offset) lie along the dimensions of
// its storage's array, of shape `shape` (a tuple of ints), at this offset?
bool lies_along(c10::IntArrayRef sizes, c10::IntArrayRef strides, int64_t offset, PyObject* shape) {
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

// A new output of a fast entry: its (shape, dtype) as Python objects, and for making it here
// (native outputs) its sizes, number of elements, bytes and dtype.
struct Out {
  PyObject* shape = nullptr;  // owned (in a Plan)
  PyObject* dtype = nullptr;  // owned (in a Plan)
  std::vector<int64_t> sizes;
  int64_t numel = 0, nbytes = 0;
  c10::ScalarType scalar_type = c10::ScalarType::Undefined;   // Undefined: made by new_tensor

  // sizes, numel, nbytes and scalar_type from `shape` (a tuple of ints) and `dtype` (a torch.dtype);
  // scalar_type stays Undefined where they are not that
  void measure() {
    if (!PyTuple_Check(shape) || !THPDtype_Check(dtype)) return;
    numel = 1;
    for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(shape); j++) {
      sizes.push_back(PyLong_AsLongLong(PyTuple_GET_ITEM(shape, j)));
      numel *= sizes.back();
    }
    if (PyErr_Occurred()) {
      PyErr_Clear();
      return;
    }
    scalar_type = reinterpret_cast<THPDtype*>(dtype)->scalar_type;
    nbytes = numel * static_cast<int64_t>(c10::elementSize(scalar_type));
  }
};

// What a fast entry runs. Shared: a call holds it while JAX runs (and may release the GIL, when
// another thread may clear the table).
struct Plan {
  PyObject* fn = nullptr;       // owned
  std::vector<Out> outs;        // the new outputs, in order (none for an in-place op)
  std::vector<int> mutated;     // storage slots that get the results after them as their new buffers
  PyObject* checks = nullptr;   // owned: device-side assert messages (fn returns a verdict last), or null
  PyObject* where = nullptr;    // owned: the op's name, for their message
  // owned, or null: a write's gate(device index) while unchecked verdicts exist (eager/asserts.py):
  // None (nothing gates it there) or (fn in its gated form, the gate: an argument after the buffers)
  PyObject* gate = nullptr;
  PyObject* entry = nullptr;    // owned: the engine's Entry (the "fused" mode queues it: OpKernel._run)
  // owned, or null: a memo plan's executable, called directly once the entry's memo has given up
  // (Entry.memo None: its calls never repeated); a memo plan's fn takes the numbers themselves,
  // not kept device arrays (the memo keys them)
  PyObject* plain_fn = nullptr;
  // in strict mode the Python kernel runs it (an in-place write on a large storage, donated when
  // nothing else holds its buffer); the fused mode queues it as any write
  bool queue_only = false;
  ~Plan() {
    if (!Py_IsInitialized()) return;   // (the process is exiting: Python is gone)
    Py_XDECREF(fn);
    for (Out& o : outs) {
      Py_XDECREF(o.shape);
      Py_XDECREF(o.dtype);
    }
    Py_XDECREF(checks);
    Py_XDECREF(where);
    Py_XDECREF(gate);
    Py_XDECREF(entry);
    Py_XDECREF(plain_fn);
  }
};

struct FastEntry {
  State state = NEVER;
  int countdown = 0;
  std::shared_ptr<const Plan> plan;   // FAST entries
};

struct KeyHash {
  size_t operator()(const std::vector<int64_t>& v) const noexcept {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (int64_t x : v) {
      h ^= static_cast<uint64_t>(x) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    }
    return static_cast<size_t>(h);
  }
};

inline PyObject* slot_of(PyObject* obj, Py_ssize_t offset) {
  return *reinterpret_cast<PyObject**>(reinterpret_cast<char*>(obj) + offset);
}

// References held for one call, released when it returns
struct HeldRefs {
  c10::SmallVector<PyObject*, 16> items;
  ~HeldRefs() {
    for (PyObject* x : items) Py_XDECREF(x);
  }
  PyObject* hold(PyObject* x) {   // a borrowed reference, held from now on
    Py_INCREF(x);
    items.push_back(x);
    return x;
  }
  PyObject* own(PyObject* x) {   // a new reference; null: the Python error is thrown
    if (!x) throw python_error();
    items.push_back(x);
    return x;
  }
};

struct Gil {
  PyGILState_STATE s;
  Gil() : s(PyGILState_Ensure()) {}
  ~Gil() { PyGILState_Release(s); }
};

// One call's key and what the executable takes besides the buffers.
struct Work {
  std::vector<int64_t> key;
  c10::SmallVector<const void*, 8> addresses;  // storage slot -> data pointer
  c10::SmallVector<PyObject*, 8> records;      // storage slot -> record (borrowed: RECORDS holds it)
  c10::SmallVector<PyObject*, 8> values;       // traced values (owned)
  c10::SmallVector<int64_t, 8> offsets;        // storage offsets of partial views
  long device = -1;
  PyObject* device_obj = nullptr;              // borrowed from a record
  ~Work() {
    for (PyObject* v : values) Py_DECREF(v);
  }
};

// why a call cannot take the fast path: a Python error is set only for ERROR
enum Verdict { OK = 0, BAIL = 1, ERROR = 2 };

class FastKernel;
PyObject* graph_outputs(PyObject*, PyObject* const*, Py_ssize_t);
PyObject* storage_freed(PyObject*, PyObject*);
std::vector<FastKernel*> g_kernels;
std::vector<std::unique_ptr<c10::RegistrationHandleRAII>> g_registrations;

class FastKernel final : public c10::OperatorKernel {
  friend PyObject* graph_outputs(PyObject*, PyObject* const*, Py_ssize_t);
  friend PyObject* storage_freed(PyObject*, PyObject*);

 public:
  FastKernel(PyObject* kernel, std::vector<char> scalar, c10::SafeKernelFunction fallback,
             const c10::FunctionSchema& schema, int alias_arg)
      : kernel_(kernel), scalar_(std::move(scalar)), fallback_(std::move(fallback)), alias_arg_(alias_arg),
        n_returns_(schema.returns().size()) {
    Py_INCREF(kernel_);
    const auto& arguments = schema.arguments();
    n_args_ = arguments.size();
    kwarg_only_start_ = static_cast<int64_t>(n_args_);
    while (kwarg_only_start_ > 0 && arguments[kwarg_only_start_ - 1].kwarg_only()) {
      kwarg_only_start_--;
    }
    for (const auto& a : arguments) {
      defaults_.push_back(a.default_value());
    }
  }

  void clear() { table_.clear(); }

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
    if (!g_enabled || c10::impl::TorchDispatchModeTLS::stack_len() > 0) {
      fallback_.callBoxed(op, ks, stack);
      return;
    }
    Gil gil;
    Mode mode = plain_mode();
    if (mode == OTHER) {
      g_fallbacks++;
      fallback_.callBoxed(op, ks, stack);
      return;
    }
    auto args = torch::jit::last(*stack, n_args_);
    FastEntry* entry = nullptr;
    std::vector<int64_t> key;
    {
      Work w;
      Verdict v = build(args, w);
      if (v == ERROR) {
        PyErr_Clear();
      }
      if (v == OK) {
        auto it = table_.find(w.key);
        if (it != table_.end()) {
          entry = &it->second;
          if (entry->state == FAST) {
            if (mode == FUSED ? run_queued(*entry, w, stack)
                              : !entry->plan->queue_only && run(*entry, w, stack)) {
              return;
            }
          } else if (entry->state == LATER && --entry->countdown <= 0) {
            key = std::move(w.key);
          }
        } else {
          key = std::move(w.key);
        }
      }
    }
    g_fallbacks++;
    if (key.empty()) {
      fallback_.callBoxed(op, ks, stack);
      return;
    }
    // a key the table does not know yet (or asks again): run the Python kernel, then ask it what
    // it ran, if the arguments still key the same way (the op did not change them)
    std::vector<c10::IValue> saved(args.begin(), args.end());
    fallback_.callBoxed(op, ks, stack);
    Work again;
    Verdict v = build(saved, again);
    if (v == ERROR) {
      PyErr_Clear();
    }
    if (v == OK && again.key == key) {
      learn(std::move(key));
    }
  }

 private:
  enum Mode { OTHER = 0, STRICT = 1, FUSED = 2 };

  // The eager mode, when calls may take the fast path: strict or fused, no failed device-side
  // assert, no pending interrupt, no XLA options in force; OTHER otherwise (debug mode included).
  static Mode plain_mode() {
    if (PyList_GET_SIZE(C.mode) < 1) return OTHER;
    PyObject* m = PyList_GET_ITEM(C.mode, 0);
    Mode mode;
    if (m == C.strict || (PyUnicode_Check(m) && PyUnicode_Compare(m, C.strict) == 0)) {
      mode = STRICT;
    } else if (m == C.fused || (PyUnicode_Check(m) && PyUnicode_Compare(m, C.fused) == 0)) {
      mode = FUSED;
    } else {
      return OTHER;
    }
    if (PyDict_GET_SIZE(C.failed) != 0 || PyList_GET_SIZE(C.pending) != 0) return OTHER;
    if (PyList_GET_SIZE(C.xla_active) < 1) return OTHER;
    PyObject* x = PyList_GET_ITEM(C.xla_active, 0);   // () when no options are in force
    if (PyTuple_CheckExact(x)) return PyTuple_GET_SIZE(x) == 0 ? mode : OTHER;
    return x == Py_None || x == Py_False ? mode : OTHER;
  }

  // The "fused" mode: the engine queues the call (or runs it, a cold op: eager/fusion.py) with
  // OpKernel._run(entry, records, scalars, offsets, device, None, None), as the Python kernel does
  // once it has keyed the call; here the key, the lookup and the outputs cost no Python. Its errors
  // are the Python kernel's (raised as they are: it would raise the same).
  bool run_queued(FastEntry& e, Work& w, torch::jit::Stack* stack) {
    std::shared_ptr<const Plan> held = e.plan;
    const Plan& p = *held;
    struct Refs {
      PyObject* items[4] = {nullptr, nullptr, nullptr, nullptr};
      ~Refs() { for (PyObject* x : items) Py_XDECREF(x); }
    } refs;
    PyObject* res = queue(p, w);
    if (!res) {
      PyObject*& records = refs.items[0];
      PyObject*& scalars = refs.items[1];
      PyObject*& offsets = refs.items[2];
      records = PyList_New(static_cast<Py_ssize_t>(w.records.size()));
      scalars = PyList_New(static_cast<Py_ssize_t>(w.values.size()));
      offsets = PyList_New(static_cast<Py_ssize_t>(w.offsets.size()));
      if (!records || !scalars || !offsets) throw python_error();
      for (size_t i = 0; i < w.records.size(); i++) {
        Py_INCREF(w.records[i]);
        PyList_SET_ITEM(records, i, w.records[i]);
      }
      for (size_t i = 0; i < w.values.size(); i++) {
        Py_INCREF(w.values[i]);
        PyList_SET_ITEM(scalars, i, w.values[i]);
      }
      for (size_t i = 0; i < w.offsets.size(); i++) {
        PyObject* n = PyLong_FromLongLong(w.offsets[i]);
        if (!n) throw python_error();
        PyList_SET_ITEM(offsets, i, n);
      }
      // (argv[0] is the spare slot PY_VECTORCALL_ARGUMENTS_OFFSET lets the callee use)
      PyObject* argv[9] = {nullptr, kernel_, p.entry, records, scalars, offsets, w.device_obj, Py_None, Py_None};
      res = PyObject_VectorcallMethod(C.run_name, argv + 1, 8 | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr);
      if (!res) throw python_error();
    }
    refs.items[3] = res;
    PyObject* const* items = result_items(res, p);
    if (!items) {   // (it ran: the writes are done, the outputs cannot be made)
      PyErr_SetString(PyExc_RuntimeError, "torchtpu fast path: unexpected results from a queued op");
      throw python_error();
    }
    count_hit();
    g_fast_calls++;
    if (p.outs.empty()) {   // (_run gave the written storages their queued or new buffers)
      return_written(stack);
      return true;
    }
    push_outputs(p, w, items, stack);
    return true;
  }

  // eager/fusion.py defer, for the call the fast path keyed: the queued results (a new reference),
  // or null (no error set) where the Python kernel must queue it, which it does as before: a
  // decision to make (the op's first call in a sync window that finds it cold, a cold op, a gated
  // write, a segment to open or to end, an input not written yet or queued elsewhere), the fusion
  // lock held by another thread. The step it appends is the one defer appends, so segments queued
  // here and there are the same segments. Runs no Python code but the lock's methods, the weak
  // references' and asserts.note: no interrupt can land between its writes.
  static PyObject* queue(const Plan& p, const Work& w) {
    if (!F.ready || !p.entry || !w.device_obj) return nullptr;
    PyObject* entry = p.entry;
    PyObject* fn = slot_of(entry, F.e_fn);
    PyObject* gate = nullptr;   // a gated write's gate (eager/asserts.py poison): one more input
    HeldRefs held;
    // (first: poison may queue the gate itself, or run the open segment; OpKernel._call asks it the
    // same question, answered from its cache, if this call ends up there after all)
    if (!p.mutated.empty()) {
      PyObject* g = nullptr;
      Verdict v = write_gate(p, w, true, fn, gate, g);
      if (g) held.items.push_back(g);
      if (v != OK) return nullptr;
    }
    PyObject* now = PyList_GET_SIZE(F.syncs) ? PyList_GET_ITEM(F.syncs, 0) : nullptr;
    if (!fn || fn == Py_None || !now) return nullptr;
    // (what is used below is held: an allocation may run the GC, whose finalizers may let another
    // thread run and replace the sync count, a record's buffer or a gate)
    held.hold(fn);
    held.hold(now);
    bool new_window = false;
    long calls = warm_calls(entry, now, new_window);
    if (calls < 0) return nullptr;
    PyObject* got = PyObject_CallOneArg(F.acquire, Py_False);
    if (!got) throw python_error();
    bool locked = got == Py_True;
    Py_DECREF(got);
    if (!locked) return nullptr;   // (another thread is flushing: Python waits for the lock)
    FusionUnlock unlock;
    Segment segment;
    if (!open_segment(w.device_obj, fn, slot_of(entry, F.e_anchor), held, segment)) return nullptr;
    c10::SmallVector<PyObject*, 8> inputs;
    if (!step_inputs(w, gate, segment.obj, held, inputs)) return nullptr;
    PyObject* results = append_step(p, w, fn, inputs, segment, held);
    // the step is queued: from here on nothing can fail before the written storages get its results
    PyObject* calls_now = PyLong_FromLong(calls);
    if (calls_now) set_slot_owned(entry, F.e_window_calls, calls_now); else PyErr_Clear();
    if (new_window) {   // (as defer records a warm op's first call in a window)
      set_slot(entry, F.e_last_sync, now);
      set_slot(entry, F.e_cold, Py_False);
    }
    commit_writes(p, w, &PyTuple_GET_ITEM(results, p.outs.size()));
    add_counter(F.c_fused_ops);
    g_queued_here++;
    size_t n = static_cast<size_t>(PyTuple_GET_SIZE(results));
    if (p.checks) {   // (queued: raised after, as in Python)
      try {
        note(p, PyTuple_GET_ITEM(results, n - 1));
      } catch (...) {
        Py_DECREF(results);
        throw;
      }
    }
    return results;
  }

  // defer's first decisions, for a warm op: its calls in this sync window counting this one, or -1
  // where Python decides (its first call in a window that finds it cold, a cold op's early calls)
  static long warm_calls(PyObject* entry, PyObject* now, bool& new_window) {
    PyObject* last = slot_of(entry, F.e_last_sync);
    PyObject* calls_obj = slot_of(entry, F.e_window_calls);
    PyObject* cold = slot_of(entry, F.e_cold);
    if (!last || !calls_obj || !cold || !PyLong_CheckExact(last) || !PyLong_CheckExact(now) ||
        !PyLong_CheckExact(calls_obj)) {
      return -1;
    }
    int overflow = 0;
    long long last_sync = PyLong_AsLongLongAndOverflow(last, &overflow);
    long long now_sync = PyLong_AsLongLongAndOverflow(now, &overflow);
    long calls = PyLong_AsLong(calls_obj) + 1;
    if (overflow || PyErr_Occurred()) {
      PyErr_Clear();
      return -1;
    }
    new_window = last_sync != now_sync;
    if (new_window) return now_sync - last_sync > F.hot_syncs ? -1 : 1;   // cold: it runs now (Python)
    return cold != Py_False && calls <= F.cold_calls ? -1 : calls;        // a cold op runs now
  }

  // The open segment of the call's device and its lists, held; false where Python decides: no
  // segment yet, a loop's next iteration (a segment that starts with `fn`), a step that ends it
  struct Segment {
    PyObject *obj = nullptr, *steps = nullptr, *external = nullptr, *ids = nullptr, *undo = nullptr,
             *undo_ids = nullptr;
  };
  static bool open_segment(PyObject* device, PyObject* fn, PyObject* anchor, HeldRefs& held, Segment& s) {
    s.obj = PyDict_GetItemWithError(F.open, device);
    if (!s.obj) {
      if (PyErr_Occurred()) throw python_error();
      return false;   // (Python opens one)
    }
    s.steps = slot_of(s.obj, F.s_steps);
    s.external = slot_of(s.obj, F.s_external);
    s.ids = slot_of(s.obj, F.s_external_ids);
    s.undo = slot_of(s.obj, F.s_undo);
    s.undo_ids = slot_of(s.obj, F.s_undo_ids);
    if (!anchor || !s.steps || !PyList_CheckExact(s.steps) || !s.external || !PyList_CheckExact(s.external) ||
        !s.ids || !PyDict_CheckExact(s.ids) || !s.undo || !PyList_CheckExact(s.undo) || !s.undo_ids ||
        !PySet_CheckExact(s.undo_ids)) {
      return false;
    }
    for (PyObject* x : {s.obj, s.steps, s.external, s.ids, s.undo, s.undo_ids}) held.hold(x);
    Py_ssize_t step = PyList_GET_SIZE(s.steps);
    if (step >= F.min_ops) {   // a loop's next iteration ends the segment: Python
      PyObject* first = PyList_GET_ITEM(s.steps, 0);
      if (!PyTuple_Check(first) || PyTuple_GET_SIZE(first) < 1 || PyTuple_GET_ITEM(first, 0) == fn) return false;
    }
    return !(step + 1 >= F.min_ops && (anchor != Py_False || step + 1 >= F.limit));   // (else it flushes)
  }

  // The step's inputs, held: each record's buffer, then the gate if any; a result queued in this
  // segment, or a concrete array (a result of a segment that ran: its value). False for anything
  // else (unwritten, queued in a segment not run yet): Python.
  static bool step_inputs(const Work& w, PyObject* gate, PyObject* segment, HeldRefs& held,
                          c10::SmallVector<PyObject*, 8>& inputs) {
    for (size_t i = 0; i <= w.records.size(); i++) {
      if (i == w.records.size() && !gate) break;
      PyObject* b = i < w.records.size() ? slot_of(w.records[i], C.off_buffer) : gate;
      if (!b || b == Py_None) return false;
      if (Py_TYPE(b) == F.pending && slot_of(b, F.p_segment) != segment) {
        b = slot_of(b, F.p_value);
        if (!b || b == Py_None) return false;
      }
      inputs.push_back(held.hold(b));
    }
    return true;
  }

  // Append the step (fn, sources, numbers, weak references to its results) to the segment, as
  // defer does; its results: one new Pending each (a new reference). Throws on a Python error.
  static PyObject* append_step(const Plan& p, const Work& w, PyObject* fn, const c10::SmallVector<PyObject*, 8>& inputs,
                               const Segment& s, HeldRefs& held) {
    PyObject* sources = step_sources(inputs, s, held);
    PyObject* numbers = step_numbers(w, held);
    PyObject* step = held.own(PyLong_FromSsize_t(PyList_GET_SIZE(s.steps)));
    size_t n = p.outs.size() + p.mutated.size() + (p.checks ? 1 : 0);
    PyObject* weak = held.own(PyList_New(static_cast<Py_ssize_t>(n)));
    PyObject* results = held.own(PyTuple_New(static_cast<Py_ssize_t>(n)));
    for (size_t k = 0; k < n; k++) {
      PyObject* pending = F.pending->tp_alloc(F.pending, 0);   // (Pending(segment, step, k): no __init__ to run)
      if (!pending) throw python_error();
      PyTuple_SET_ITEM(results, k, pending);
      set_slot(pending, F.p_segment, s.obj);
      set_slot(pending, F.p_step, step);
      PyObject* index = PyLong_FromSsize_t(static_cast<Py_ssize_t>(k));
      if (!index) throw python_error();
      set_slot_owned(pending, F.p_index, index);
      set_slot(pending, F.p_value, Py_None);
      PyObject* ref = PyWeakref_NewRef(pending, nullptr);
      if (!ref) throw python_error();
      PyList_SET_ITEM(weak, k, ref);
    }
    remember_undo(p, w, s, held);
    PyObject* queued = held.own(PyTuple_Pack(4, fn, sources, numbers, weak));
    if (PyList_Append(s.steps, queued) < 0) throw python_error();
    Py_INCREF(results);   // (the caller's; `held` drops its own)
    return results;
  }

  // Where each input comes from (fusion.py _sources): (step, index) of a result queued in this
  // segment, or the index of a concrete array among the segment's external inputs
  static PyObject* step_sources(const c10::SmallVector<PyObject*, 8>& inputs, const Segment& s, HeldRefs& held) {
    PyObject* sources = held.own(PyTuple_New(static_cast<Py_ssize_t>(inputs.size())));
    for (size_t i = 0; i < inputs.size(); i++) {
      PyObject* b = inputs[i];
      PyObject* source;
      if (Py_TYPE(b) == F.pending) {
        source = PyTuple_Pack(2, slot_of(b, F.p_step), slot_of(b, F.p_index));
        if (!source) throw python_error();
      } else {
        PyObject* id = held.own(PyLong_FromVoidPtr(b));
        source = PyDict_GetItemWithError(s.ids, id);
        if (source) {
          Py_INCREF(source);
        } else {
          if (PyErr_Occurred()) throw python_error();
          if (PyList_Append(s.external, b) < 0) throw python_error();
          source = PyLong_FromSsize_t(PyList_GET_SIZE(s.external) - 1);
          if (!source || PyDict_SetItem(s.ids, id, source) < 0) {
            Py_XDECREF(source);
            throw python_error();
          }
        }
      }
      PyTuple_SET_ITEM(sources, i, source);
    }
    return sources;
  }

  // The step's numbers: the traced scalars, then the offsets of partial views
  static PyObject* step_numbers(const Work& w, HeldRefs& held) {
    PyObject* numbers = held.own(PyTuple_New(static_cast<Py_ssize_t>(w.values.size() + w.offsets.size())));
    for (size_t i = 0; i < w.values.size(); i++) {
      Py_INCREF(w.values[i]);
      PyTuple_SET_ITEM(numbers, i, w.values[i]);
    }
    for (size_t i = 0; i < w.offsets.size(); i++) {
      PyObject* o = PyLong_FromLongLong(w.offsets[i]);
      if (!o) throw python_error();
      PyTuple_SET_ITEM(numbers, w.values.size() + i, o);
    }
    return numbers;
  }

  // What to restore if the segment cannot run: each written record's buffer before the segment
  static void remember_undo(const Plan& p, const Work& w, const Segment& s, HeldRefs& held) {
    for (int slot : p.mutated) {
      PyObject* r = w.records[slot];
      PyObject* id = held.own(PyLong_FromVoidPtr(r));
      int seen = PySet_Contains(s.undo_ids, id);
      if (seen < 0) throw python_error();
      if (seen) continue;
      PyObject* pair = held.own(PyTuple_Pack(2, r, slot_of(r, C.off_buffer)));
      if (PyList_Append(s.undo, pair) < 0 || PySet_Add(s.undo_ids, id) < 0) throw python_error();
    }
  }

  // The written storages get `buffers` (one per written slot) with no Python code between the
  // assignments (a Ctrl-C cannot land in between: eager/executable.py call_and_commit); the old
  // buffers are released after
  static void commit_writes(const Plan& p, const Work& w, PyObject* const* buffers) {
    c10::SmallVector<PyObject*, 4> old;
    for (size_t i = 0; i < p.mutated.size(); i++) {
      PyObject** slot = reinterpret_cast<PyObject**>(reinterpret_cast<char*>(w.records[p.mutated[i]]) + C.off_buffer);
      old.push_back(*slot);
      Py_INCREF(buffers[i]);
      *slot = buffers[i];
    }
    for (PyObject* o : old) Py_XDECREF(o);
  }

  bool present(c10::ArrayRef<c10::IValue> args, int64_t i, int64_t positional_end) const {
    if (i < kwarg_only_start_) return i < positional_end;
    return !is_default(args, i);
  }

  bool is_default(c10::ArrayRef<c10::IValue> args, int64_t i) const {
    const auto& d = defaults_[i];
    return d.has_value() && !(*d != args[i]);
  }

  Verdict tensor(const at::Tensor& t, Work& w) {
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

  // A CPU scalar tensor mixed with tpu tensors: a traced value, keyed by its dtype
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

  // A Tensor[] or Tensor?[] argument: its length, then each tensor's key (or None)
  Verdict tensor_list(const c10::IValue& v, Work& w) {
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

  Verdict value(const c10::IValue& v, bool scalar, Work& w) {
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

  Verdict build(c10::ArrayRef<c10::IValue> args, Work& w) {
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
    // dtype=, ... (the Python kernel's key holds it too, when it is not float32)
    w.key.push_back(static_cast<int64_t>(c10::typeMetaToScalarType(c10::get_default_dtype())));
    int64_t positional_end = kwarg_only_start_;
    while (positional_end > 0 && is_default(args, positional_end - 1)) positional_end--;
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

  // A write's gate while unchecked device-side verdicts exist (eager/asserts.py poison, through
  // engine.write_gate; `queue`: as the fused mode asks it): for a gated write, `fn` becomes its
  // gated form and `gate` its extra argument (both held by `held`, a new reference). BAIL when the
  // plan does not fit the call, or the gate raised an Exception (cleared: the Python kernel asks
  // again and raises it); anything else the gate raises (KeyboardInterrupt) is raised.
  static Verdict write_gate(const Plan& p, const Work& w, bool queue, PyObject*& fn, PyObject*& gate,
                            PyObject*& held) {
    for (int s : p.mutated) {
      if (s < 0 || static_cast<size_t>(s) >= w.records.size()) return BAIL;
    }
    PyObject* u = PyList_GET_SIZE(C.unchecked) ? PyList_GET_ITEM(C.unchecked, 0) : nullptr;
    if (!u || !PyLong_CheckExact(u)) return BAIL;
    if (!p.gate || PyLong_AsLong(u) == 0) return OK;
    PyObject* args[2] = {w.device_obj, Py_True};
    PyObject* g = PyObject_Vectorcall(p.gate, args, queue ? 2 : 1, nullptr);
    if (!g) {
      if (!PyErr_ExceptionMatches(PyExc_Exception)) throw python_error();
      PyErr_Clear();
      return BAIL;
    }
    held = g;
    if (g == Py_None) return OK;
    if (!PyTuple_Check(g) || PyTuple_GET_SIZE(g) != 2) return BAIL;
    fn = PyTuple_GET_ITEM(g, 0);
    gate = PyTuple_GET_ITEM(g, 1);
    return OK;
  }

  // Run a fast entry; false (nothing changed, no Python error set) sends the call to the Python kernel.
  bool run(FastEntry& e, Work& w, torch::jit::Stack* stack) {
    std::shared_ptr<const Plan> held_plan = e.plan;   // (the entry may be dropped while the call runs: forget_executables)
    const Plan& p = *held_plan;
    HeldRefs held;
    c10::SmallVector<PyObject*, 16> argv;
    PyObject* fn = nullptr;
    if (!call_arguments(p, w, held, fn, argv)) return false;
    PyObject* res = PyObject_Vectorcall(fn, argv.data(), argv.size(), nullptr);
    if (!res) {
      if (PyErr_ExceptionMatches(PyExc_Exception)) {   // the Python kernel runs it again and raises as it does
        PyErr_Clear();
        return false;
      }
      throw python_error();   // KeyboardInterrupt and the like: nothing was written
    }
    held.items.push_back(res);
    PyObject* const* items = result_items(res, p);
    if (!items) return false;
    if (p.outs.empty()) {   // an in-place op: the written storages get their new buffers here
      commit_writes(p, w, items);
      note(p, items[p.mutated.size()]);   // (written: raised after the commit, as in Python)
      return_written(stack);
    } else {
      note(p, items[p.outs.size()]);
      push_outputs(p, w, items, stack);
    }
    count_hit();
    g_fast_calls++;
    return true;
  }

  // The function a fast entry calls and its arguments, held: the storages' buffers, a write's gate,
  // the traced scalars, the offsets of partial views (kept device arrays for numbers on tpu:0,
  // except for a memo plan's function, which keys the numbers themselves). False where the call
  // goes to the Python kernel: an unwritten or queued buffer, a gate that does not fit.
  static bool call_arguments(const Plan& p, const Work& w, HeldRefs& held, PyObject*& fn,
                             c10::SmallVector<PyObject*, 16>& argv) {
    fn = p.fn;
    bool raw_numbers = p.plain_fn != nullptr;
    if (raw_numbers && slot_of(p.entry, C.off_memo) == Py_None) {   // the memo gave up
      fn = p.plain_fn;
      raw_numbers = false;
    }
    PyObject* gate = nullptr;
    if (!p.mutated.empty()) {
      PyObject* g = nullptr;
      Verdict v = write_gate(p, w, false, fn, gate, g);
      if (g) held.items.push_back(g);
      if (v != OK) return false;
    }
    // (the arguments are held for the call: JAX may release the GIL while it runs, and another
    // thread may give a record a new buffer or clear the kept scalars meanwhile)
    for (PyObject* r : w.records) {
      PyObject* b = slot_of(r, C.off_buffer);
      // (a result of a fused segment that ran, before the mode changed: its value)
      if (b && F.pending && Py_TYPE(b) == F.pending) b = slot_of(b, F.p_value);
      if (!b || Py_TYPE(b) != C.array_type) return false;   // unwritten (zeros) or queued: Python
      argv.push_back(held.hold(b));
    }
    if (gate) argv.push_back(gate);   // (held with the gate's tuple)
    bool cached = w.device == 0 && !raw_numbers;
    for (PyObject* v : w.values) {
      PyObject* a = cached ? device_scalar(v) : v;
      if (!a) throw python_error();   // nothing written yet
      argv.push_back(held.hold(a));
    }
    for (int64_t o : w.offsets) {
      PyObject* n = PyLong_FromLongLong(o);
      if (!n) {
        PyErr_Clear();
        return false;
      }
      held.items.push_back(n);
      PyObject* a = cached ? device_scalar(n) : n;
      if (!a) throw python_error();
      argv.push_back(a == n ? a : held.hold(a));
    }
    return true;
  }

  // The items of an executable's results `res` (a tuple or list of the plan's length), or null
  static PyObject* const* result_items(PyObject* res, const Plan& p) {
    size_t n = p.outs.size() + p.mutated.size() + (p.checks ? 1 : 0);
    if (PyTuple_Check(res) && static_cast<size_t>(PyTuple_GET_SIZE(res)) == n) return &PyTuple_GET_ITEM(res, 0);
    if (PyList_Check(res) && static_cast<size_t>(PyList_GET_SIZE(res)) == n) return &PyList_GET_ITEM(res, 0);
    return nullptr;
  }

  // An in-place or out= op returns the argument it wrote, in place of the arguments on the stack
  void return_written(torch::jit::Stack* stack) const {
    c10::IValue returned = torch::jit::last(*stack, n_args_)[alias_arg_];
    torch::jit::drop(*stack, n_args_);
    torch::jit::push(*stack, std::move(returned));
  }

  // The new output tensors over the results `items`, in place of the arguments on the stack.
  void push_outputs(const Plan& p, const Work& w, PyObject* const* items, torch::jit::Stack* stack) {
    c10::SmallVector<at::Tensor, 2> results;
    for (size_t i = 0; i < p.outs.size(); i++) {
      const Out& o = p.outs[i];
      at::Tensor t;
      if (C.native_outputs && w.device == 0 && o.scalar_type != c10::ScalarType::Undefined) {
        t = new_output(o, w.device_obj, items[i]);   // throws python_error
      }
      if (!t.defined()) {
        PyObject* nargs[4] = {o.shape, o.dtype, w.device_obj, items[i]};
        PyObject* made = PyObject_Vectorcall(C.new_tensor, nargs, 4, nullptr);
        if (!made) throw python_error();
        t = THPVariable_Unpack(made);
        Py_DECREF(made);
      }
      results.push_back(std::move(t));
    }
    torch::jit::drop(*stack, n_args_);
    for (at::Tensor& t : results) torch::jit::push(*stack, std::move(t));
  }

  // Keep the verdict of a plan with device-side checks for the next synchronization
  // (eager/asserts.py: note), as the Python kernel does; it may raise an earlier verdict's error
  // (its list is full): the op's outputs are dropped then, as there.
  static void note(const Plan& p, PyObject* verdict) {
    if (!p.checks) return;
    PyObject* nargs[3] = {verdict, p.checks, p.where};
    PyObject* r = PyObject_Vectorcall(C.note, nargs, 3, nullptr);
    if (!r) throw python_error();
    Py_DECREF(r);
  }

  // storage/records.py: new_tensor(shape, dtype, 0, buffer), step for step: a storage at a fresh
  // address (the bump counter, a guard page), the TensorImpl create_empty_tensor makes with that
  // storage swapped in, its StorageRecord, the weak reference that frees the record with the
  // storage, the memory statistics. No Python tensor object is made (PyTorch makes one if the
  // result goes back to Python).
  static at::Tensor new_output(const Out& e, PyObject* device_obj, PyObject* buffer) {
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
    t.unsafeGetTensorImpl()->set_sizes_contiguous(e.sizes);

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
        set_slot(record, C.off_shape, e.shape);   // a contiguous output: its array has its shape
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

  static bool add_slot(PyObject* obj, Py_ssize_t offset, int64_t delta, int64_t* now) {
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

  static void count_hit() { add_counter(C.off_hits); }

  static void add_counter(Py_ssize_t offset) {
    if (offset < 0) return;
    PyObject** p = reinterpret_cast<PyObject**>(reinterpret_cast<char*>(C.counters) + offset);
    PyObject* old = *p;
    if (!old || !PyLong_CheckExact(old)) return;
    PyObject* n = PyLong_FromLongLong(PyLong_AsLongLong(old) + 1);
    if (!n) {
      PyErr_Clear();
      return;
    }
    *p = n;
    Py_DECREF(old);
  }

  // describe's (fn, ((shape, dtype), ...) of the new outputs, written slots, check messages or None,
  // where, gate or None, Entry, a memo plan's plain executable or None) as a Plan; null (a Python error may be set) when it does not fit this overload
  std::shared_ptr<Plan> describe_plan(PyObject* d) const {
    PyObject* outs = PyTuple_GET_ITEM(d, 1);
    PyObject* slots = PyTuple_GET_ITEM(d, 2);
    PyObject* checks = PyTuple_GET_ITEM(d, 3);
    if (!PyTuple_Check(outs) || !PyTuple_Check(slots)) return nullptr;
    auto plan = std::make_shared<Plan>();
    plan->fn = PyTuple_GET_ITEM(d, 0);
    Py_INCREF(plan->fn);
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(slots); i++) {
      plan->mutated.push_back(static_cast<int>(PyLong_AsLong(PyTuple_GET_ITEM(slots, i))));
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(outs); i++) {
      PyObject* pair = PyTuple_GET_ITEM(outs, i);
      if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) return nullptr;
      Out o;
      o.shape = PyTuple_GET_ITEM(pair, 0);
      o.dtype = PyTuple_GET_ITEM(pair, 1);
      Py_INCREF(o.shape);
      Py_INCREF(o.dtype);
      o.measure();
      plan->outs.push_back(std::move(o));
    }
    if (checks != Py_None) {
      if (!C.note) return nullptr;
      plan->checks = checks;
      plan->where = PyTuple_GET_ITEM(d, 4);
      Py_INCREF(plan->checks);
      Py_INCREF(plan->where);
    }
    if (PyTuple_GET_ITEM(d, 5) != Py_None) {
      plan->gate = PyTuple_GET_ITEM(d, 5);
      Py_INCREF(plan->gate);
    }
    plan->entry = PyTuple_GET_ITEM(d, 6);
    Py_INCREF(plan->entry);
    if (PyTuple_GET_ITEM(d, 7) != Py_None) {
      if (C.off_memo < 0) return nullptr;
      plan->plain_fn = PyTuple_GET_ITEM(d, 7);
      Py_INCREF(plan->plain_fn);
    }
    plan->queue_only = PyTuple_GET_ITEM(d, 8) == Py_True;
    if (PyErr_Occurred()) return nullptr;
    // an in-place or out= op writes and returns its argument; a functional one makes every return
    bool in_place = !plan->mutated.empty();
    if (in_place ? (!plan->outs.empty() || alias_arg_ < 0)
                 : (alias_arg_ >= 0 || plan->outs.size() != n_returns_)) {
      return nullptr;
    }
    return plan;
  }

  void learn(std::vector<int64_t> key) {
    PyObject* d = PyObject_CallOneArg(C.describe, kernel_);
    if (!d) {
      // (the op has run; a KeyboardInterrupt that landed in describe is raised, as it would be
      // had it landed just after the Python kernel returned)
      if (!PyErr_ExceptionMatches(PyExc_Exception)) throw python_error();
      PyErr_Clear();
      return;
    }
    FastEntry e;
    if (PyTuple_Check(d) && PyTuple_GET_SIZE(d) == 9) {
      std::shared_ptr<Plan> plan = describe_plan(d);
      if (!plan) {
        PyErr_Clear();
        Py_DECREF(d);
        return;
      }
      e.state = FAST;
      e.plan = std::move(plan);
    } else if (d == Py_True) {
      e.state = LATER;
      e.countdown = kLaterCalls;
    }
    Py_DECREF(d);
    if (table_.size() >= kMaxEntries) clear();
    auto it = table_.find(key);
    if (it != table_.end()) {
      it->second = std::move(e);
    } else {
      table_.emplace(std::move(key), std::move(e));
    }
  }

  PyObject* kernel_;
  std::vector<char> scalar_;
  c10::SafeKernelFunction fallback_;
  int alias_arg_;   // the argument an in-place or out= op returns; -1: it returns new tensors
  size_t n_returns_;
  size_t n_args_ = 0;
  int64_t kwarg_only_start_ = 0;
  std::vector<std::optional<c10::IValue>> defaults_;
  std::unordered_map<std::vector<int64_t>, FastEntry, KeyHash> table_;
};

Py_ssize_t member_offset(PyObject* type, const char* name) {
  PyObject* d = PyObject_GetAttrString(type, name);
  if (!d) return -1;
  Py_ssize_t off = -1;
  if (Py_TYPE(d) == &PyMemberDescr_Type) {
    PyMemberDef* m = reinterpret_cast<PyMemberDescrObject*>(d)->d_member;
    if (m->type == T_OBJECT_EX || m->type == T_OBJECT) off = m->offset;
  }
  Py_DECREF(d);
  if (off < 0) PyErr_Format(PyExc_TypeError, "torchtpu fast path: %s is not an object slot", name);
  return off;
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
        at::Tensor t = FastKernel::new_output(o, device, buffer);
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
    ok = FastKernel::add_slot(s, C.off_allocated, -nbytes, nullptr) &&
         FastKernel::add_slot(s, C.off_num_free, 1, nullptr);
    if (ok && buffer && buffer != Py_None) {
      ok = FastKernel::add_slot(s, C.off_materialized, -nbytes, nullptr);
    } else if (ok && slot_of(record, C.off_oom) == Py_True) {
      ok = FastKernel::add_slot(s, C.off_failed, -nbytes, nullptr);
    }
  } else {
    ok = false;
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "torchtpu: no memory statistics for a freed storage");
  }
  Py_DECREF(record);
  if (!ok) return nullptr;
  Py_RETURN_NONE;
}

PyMethodDef kGraphMethods[] = {
    {"graph_fingerprint", graph_fingerprint, METH_O, nullptr},
    {"graph_match", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(graph_match)), METH_FASTCALL,
     nullptr},
    {"graph_outputs", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(graph_outputs)), METH_FASTCALL,
     nullptr},
    {"graph_records", graph_records, METH_O, nullptr},
    {"storage_freed", storage_freed, METH_O, nullptr},
};

// Reads eager/fastpath.py FastPathTable: each getter returns the attribute `name` (borrowed: the
// table holds it; every one read is kept with a reference of its own by Keep), or null with a
// TypeError that names it and what it should be.
class TableReader {
 public:
  explicit TableReader(PyObject* table) : table_(table) {}
  ~TableReader() {
    for (PyObject* x : read_) Py_DECREF(x);
  }

  PyObject* any(const char* name) {
    PyObject* v = PyObject_GetAttrString(table_, name);
    if (v) read_.push_back(v);
    return v;
  }
  PyObject* dict(const char* name) { return checked(name, [](PyObject* o) { return PyDict_Check(o) != 0; }, "a dict"); }
  PyObject* list(const char* name) { return checked(name, [](PyObject* o) { return PyList_Check(o) != 0; }, "a list"); }
  PyObject* type(const char* name) { return checked(name, [](PyObject* o) { return PyType_Check(o) != 0; }, "a type"); }
  PyObject* callable(const char* name) { return checked(name, [](PyObject* o) { return PyCallable_Check(o) != 0; }, "callable"); }
  PyObject* str(const char* name) { return checked(name, [](PyObject* o) { return PyUnicode_Check(o) != 0; }, "a str"); }
  long integer(const char* name) {
    PyObject* v = checked(name, [](PyObject* o) { return PyLong_Check(o) != 0; }, "an int");
    return v ? PyLong_AsLong(v) : -1;
  }
  // a new reference the configuration keeps (for the life of the process)
  static PyObject* keep(PyObject* v) {
    Py_XINCREF(v);
    return v;
  }

 private:
  PyObject* checked(const char* name, bool (*is)(PyObject*), const char* what) {
    PyObject* v = any(name);
    if (v && !is(v)) {
      PyErr_Format(PyExc_TypeError, "torchtpu fast path: FastPathTable.%s is not %s", name, what);
      return nullptr;
    }
    return v;
  }
  PyObject* table_;
  std::vector<PyObject*> read_;
};

// The slots new outputs are made with here (records, their weak references, memory statistics)
bool read_native_outputs(TableReader& t, PyObject* record_type) {
  PyObject* want = t.any("native_outputs");
  if (!want) return false;
  if (want != Py_True) return true;   // outputs through new_tensor
  PyObject* stats_type = t.type("memory_stats_type");
  C.bump = TableReader::keep(t.list("address_counter"));
  C.stats = TableReader::keep(t.dict("memory_stats"));
  C.ref_type = TableReader::keep(t.type("storage_ref_type"));
  C.record_type = TableReader::keep(record_type);
  C.page = t.integer("page_bytes");
  if (!stats_type || !C.bump || !C.stats || !C.ref_type || PyErr_Occurred()) return false;
  if (C.page <= 0) {
    PyErr_SetString(PyExc_ValueError, "torchtpu fast path: FastPathTable.page_bytes is not positive");
    return false;
  }
  struct Slot {
    Py_ssize_t* offset;
    PyObject* type;
    const char* name;
  };
  const Slot slots[] = {
      {&C.off_ref, record_type, "ref"},           {&C.off_nbytes, record_type, "nbytes"},
      {&C.off_oom, record_type, "oom"},           {&C.off_address, C.ref_type, "address"},
      {&C.off_allocated, stats_type, "allocated"}, {&C.off_peak, stats_type, "peak"},
      {&C.off_num_alloc, stats_type, "num_alloc"}, {&C.off_num_free, stats_type, "num_free"},
      {&C.off_materialized, stats_type, "materialized"},
      {&C.off_peak_materialized, stats_type, "peak_materialized"}, {&C.off_failed, stats_type, "failed"},
  };
  for (const Slot& s : slots) {
    if ((*s.offset = member_offset(s.type, s.name)) < 0) return false;
  }
  // storages are freed by storage_freed, the weak reference callback in C
  C.on_free = PyCFunction_New(&kGraphMethods[4], nullptr);
  C.native_outputs = C.on_free != nullptr;
  return C.native_outputs;
}

// The fused mode's queue: the open segments, the sync count, the lock, the types it fills in and
// fusion.py's limits (eager/fusion.py defer decides with the same numbers).
bool read_fused(TableReader& t, PyObject* entry_type) {
  PyObject* pending = t.type("pending_type");
  PyObject* segment = t.type("segment_type");
  PyObject* lock = t.any("fusion_lock");
  Fused f;
  f.open = t.dict("open_segments");
  f.syncs = t.list("sync_count");
  f.min_ops = t.integer("min_ops");
  f.limit = t.integer("limit");
  f.cold_calls = t.integer("cold_calls");
  f.hot_syncs = t.integer("hot_syncs");
  if (!pending || !segment || !lock || !f.open || !f.syncs || PyErr_Occurred()) return false;
  f.pending = reinterpret_cast<PyTypeObject*>(pending);
  struct Slot {
    Py_ssize_t* offset;
    PyObject* type;
    const char* name;
  };
  PyObject* counters_type = reinterpret_cast<PyObject*>(Py_TYPE(C.counters));
  const Slot slots[] = {
      {&f.e_fn, entry_type, "fn"},           {&f.e_last_sync, entry_type, "last_sync"},
      {&f.e_cold, entry_type, "cold"},       {&f.e_window_calls, entry_type, "window_calls"},
      {&f.e_anchor, entry_type, "anchor"},   {&f.s_steps, segment, "steps"},
      {&f.s_external, segment, "external"},  {&f.s_external_ids, segment, "external_ids"},
      {&f.s_undo, segment, "undo"},          {&f.s_undo_ids, segment, "undo_ids"},
      {&f.p_segment, pending, "segment"},    {&f.p_step, pending, "step"},
      {&f.p_index, pending, "index"},        {&f.p_value, pending, "value"},
      {&f.c_fused_ops, counters_type, "fused_ops"},
  };
  for (const Slot& s : slots) {
    if ((*s.offset = member_offset(s.type, s.name)) < 0) return false;
  }
  f.acquire = PyObject_GetAttrString(lock, "acquire");
  f.release = PyObject_GetAttrString(lock, "release");
  if (!f.acquire || !f.release) {
    Py_XDECREF(f.acquire);
    Py_XDECREF(f.release);
    return false;
  }
  TableReader::keep(f.open);
  TableReader::keep(f.syncs);
  TableReader::keep(pending);
  f.ready = true;
  F = f;
  return true;
}

// The checks, the eager state and the callables of the hot path, and the slots it reads
bool read_core(TableReader& t, PyObject*& record_type, PyObject*& entry_type) {
  C.records = TableReader::keep(t.dict("records"));
  C.mode = TableReader::keep(t.list("mode"));
  C.strict = TableReader::keep(t.str("strict_mode"));
  C.fused = TableReader::keep(t.str("fused_mode"));
  C.failed = TableReader::keep(t.dict("failed_asserts"));
  C.pending = TableReader::keep(t.list("pending_interrupts"));
  C.xla_active = TableReader::keep(t.list("xla_active"));
  C.unchecked = TableReader::keep(t.list("unchecked_verdicts"));
  C.counters = TableReader::keep(t.any("counters"));
  C.new_tensor = TableReader::keep(t.callable("new_tensor"));
  C.describe = TableReader::keep(t.callable("describe"));
  C.device_scalar = TableReader::keep(t.callable("device_scalar"));
  C.note = TableReader::keep(t.callable("note_verdict"));
  C.run_name = TableReader::keep(t.str("run_method"));
  PyObject* array_type = t.type("array_type");
  record_type = t.type("record_type");
  entry_type = t.type("entry_type");
  if (PyErr_Occurred() || !array_type || !record_type || !entry_type) return false;
  C.array_type = reinterpret_cast<PyTypeObject*>(TableReader::keep(array_type));
  PyUnicode_InternInPlace(&C.strict);
  PyUnicode_InternInPlace(&C.fused);
  PyObject* counters_type = reinterpret_cast<PyObject*>(Py_TYPE(C.counters));
  return (C.off_hits = member_offset(counters_type, "eager_cache_hits")) >= 0 &&
         (C.off_buffer = member_offset(record_type, "_buffer")) >= 0 &&
         (C.off_dtype = member_offset(record_type, "dtype")) >= 0 &&
         (C.off_numel = member_offset(record_type, "numel")) >= 0 &&
         (C.off_shape = member_offset(record_type, "shape")) >= 0 &&
         (C.off_device = member_offset(record_type, "device_index")) >= 0 &&
         (C.off_memo = member_offset(entry_type, "memo")) >= 0;
}

}  // namespace

extern "C" {

// The names of FastPathTable's fields this library reads (kTableNames), for fastpath.load to check
PyObject* torchtpu_fast_table_names() {
  constexpr size_t n = sizeof(kTableNames) / sizeof(kTableNames[0]);
  PyObject* names = PyTuple_New(n);
  for (size_t i = 0; names && i < n; i++) {
    PyObject* name = PyUnicode_FromString(kTableNames[i]);
    if (!name) {
      Py_CLEAR(names);
      break;
    }
    PyTuple_SET_ITEM(names, i, name);
  }
  return names;
}

// Configure the fast path from `table` (eager/fastpath.py FastPathTable); 0 with a Python error
// naming what does not fit.
int torchtpu_fast_init(PyObject* table) {
  TableReader t(table);
  PyObject* record_type = nullptr;
  PyObject* entry_type = nullptr;
  if (!read_core(t, record_type, entry_type)) return 0;
  if (!read_native_outputs(t, record_type)) return 0;
  return read_fused(t, entry_type) ? 1 : 0;
}

// Queue fused-mode calls here (1, once configured) or through OpKernel._run (0); the previous setting.
int torchtpu_fast_fused_queue(int on) {
  bool was = F.ready;
  F.ready = on && F.open != nullptr;
  return was;
}

// Put the fast kernel of aten::name.overload on PrivateUse1 in front of `kernel`, the Python kernel
// already registered on PrivateUse3. `scalar`: bytes, 1 for each argument whose numbers are traced;
// `alias_arg`: the argument an in-place or out= overload returns, or -1.
int torchtpu_fast_attach(const char* name, const char* overload, PyObject* kernel, PyObject* scalar, int alias_arg) {
  try {
    auto handle = c10::Dispatcher::singleton().findSchema({std::string("aten::") + name, overload});
    if (!handle.has_value()) {
      PyErr_Format(PyExc_RuntimeError, "torchtpu fast path: no schema aten::%s.%s", name, overload);
      return 0;
    }
    const auto& schema = handle->schema();
    if (schema.returns().empty() || (alias_arg >= 0 && schema.returns().size() != 1) || !PyBytes_Check(scalar) ||
        static_cast<size_t>(PyBytes_GET_SIZE(scalar)) != schema.arguments().size()) {
      PyErr_SetString(PyExc_ValueError, "torchtpu fast path: unsupported schema");
      return 0;
    }
    std::vector<char> flags(PyBytes_AS_STRING(scalar), PyBytes_AS_STRING(scalar) + PyBytes_GET_SIZE(scalar));
    c10::SafeKernelFunction fallback = handle->getComputedKernelForDispatchKey(c10::DispatchKey::PrivateUse3);
    auto functor = std::make_unique<FastKernel>(kernel, std::move(flags), std::move(fallback), schema, alias_arg);
    g_kernels.push_back(functor.get());
    auto reg = c10::Dispatcher::singleton().registerImpl(
        handle->operator_name(), c10::DispatchKey::PrivateUse1,
        c10::KernelFunction::makeFromBoxedFunctor(std::move(functor)), std::nullopt, nullptr,
        "torchtpu eager fast path (eager/csrc/fast_kernel.cpp)");
    g_registrations.push_back(std::make_unique<c10::RegistrationHandleRAII>(std::move(reg)));
    return 1;
  } catch (const std::exception& e) {
    PyErr_Format(PyExc_RuntimeError, "torchtpu fast path: %s", e.what());
    return 0;
  }
}

// Put a kernel on PrivateUse1 for aten::name.overload, a metadata-only op (view, as_strided, ...),
// that hands the call to the CPU kernel, which only sets sizes, strides and offset and shares the
// storage: the redispatch without a Python frame (views are about a third of a decoder layer's ops).
struct CpuMetadataKernel final : c10::OperatorKernel {
  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
  }
};

int torchtpu_fast_attach_metadata(const char* name, const char* overload) {
  try {
    auto handle = c10::Dispatcher::singleton().findSchema({std::string("aten::") + name, overload});
    if (!handle.has_value()) {
      PyErr_Format(PyExc_RuntimeError, "torchtpu fast path: no schema aten::%s.%s", name, overload);
      return 0;
    }
    auto reg = c10::Dispatcher::singleton().registerImpl(
        handle->operator_name(), c10::DispatchKey::PrivateUse1,
        c10::KernelFunction::makeFromBoxedFunctor(std::make_unique<CpuMetadataKernel>()), std::nullopt, nullptr,
        "torchtpu metadata-only op (eager/csrc/fast_kernel.cpp)");
    g_registrations.push_back(std::make_unique<c10::RegistrationHandleRAII>(std::move(reg)));
    return 1;
  } catch (const std::exception& e) {
    PyErr_Format(PyExc_RuntimeError, "torchtpu fast path: %s", e.what());
    return 0;
  }
}

void torchtpu_fast_set_enabled(int on) { g_enabled = on != 0; }

int torchtpu_fast_enabled() { return g_enabled; }

int torchtpu_fast_native_outputs(int on) {
  int was = C.native_outputs;
  if (on >= 0) C.native_outputs = on && C.off_failed >= 0;
  return was;
}

// Forget every fast entry (the Python caches were cleared, or what keys them changed).
void torchtpu_fast_clear() {
  for (FastKernel* k : g_kernels) k->clear();
  clear_scalars();
}

int torchtpu_fast_cache_scalars(int on) {
  int was = g_cache_scalars;
  if (on >= 0) g_cache_scalars = on != 0;
  if (!g_cache_scalars) clear_scalars();
  return was;
}

long long torchtpu_fast_calls() { return g_fast_calls; }
long long torchtpu_fast_fallbacks() { return g_fallbacks; }
long long torchtpu_fast_queued_here() { return g_queued_here; }

// (graph_fingerprint, graph_match, graph_outputs, graph_records): compile/backend.py's fast key,
// one pass over a call's tensors, its outputs, and its input records and buffers.
PyObject* torchtpu_graph_functions() {
  return Py_BuildValue("(NNNN)", PyCFunction_New(&kGraphMethods[0], nullptr), PyCFunction_New(&kGraphMethods[1], nullptr),
                       PyCFunction_New(&kGraphMethods[2], nullptr), PyCFunction_New(&kGraphMethods[3], nullptr));
}

// storage/records.py _on_free in C (storage_freed); None unless outputs are made here (native
// outputs: the record and statistics slots are known).
PyObject* torchtpu_storage_freed() {
  if (!C.native_outputs) Py_RETURN_NONE;
  Py_INCREF(C.on_free);
  return C.on_free;
}

}  // extern "C"
