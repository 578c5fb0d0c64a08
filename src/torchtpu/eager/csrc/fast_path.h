// Shared declarations of the eager engine's C++ fast path (eager/fastpath.py). Its files, one step
// each (see fast_kernel.cpp for the whole):
//   fast_kernel.cpp  the boxed kernel: lookup, run (strict), hand-off to Python, learning entries
//   call_key.cpp     a call's key from the IValue stack
//   fused_queue.cpp  the fused mode's queue of a warm op (eager/fusion.py defer's common case)
//   outputs.cpp      new output tensors and their records; storages freed; compiled graphs' helpers
//   table.cpp        FastPathTable, read by name at load
// They are compiled as one translation unit (device/native.py: torch's headers are parsed once).
#pragma once

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

#include <optional>

namespace torchtpu_fast {

// What the fast path reads of the Python side: eager/fastpath.py FastPathTable, one attribute per
// name of kTableNames (fastpath.load checks that the two name the same fields), read once by
// torchtpu_fast_init; each is checked for its type there, with its name in the error.
inline constexpr const char* kTableNames[] = {
    "records", "mode", "strict_mode", "fused_mode", "failed_asserts", "pending_interrupts", "xla_active",
    "unchecked_verdicts", "counters", "record_type", "array_type", "entry_type", "new_tensor", "describe",
    "device_scalar", "note_verdict", "run_method", "native_outputs", "address_counter", "memory_stats",
    "storage_ref_type", "memory_stats_type", "page_bytes", "open_segments", "sync_count", "fusion_lock",
    "pending_type", "segment_type", "min_ops", "limit", "cold_calls", "hot_syncs", "plan_type", "host_values",
};

// The fields of eager/fastpath.py FastPlan (what `describe` says of a plain entry), found by name
// in its _fields at init
enum PlanField {
  P_FN, P_OUTS, P_WRITTEN, P_CHECKS, P_WHERE, P_GATE, P_ENTRY, P_UNMEMOIZED, P_FUSED_ONLY, P_HOST_VALUES, P_COUNT
};
inline constexpr const char* kPlanFields[P_COUNT] = {
    "fn", "outs", "written_slots", "checks", "where", "gate", "entry", "unmemoized_fn", "fused_only", "host_values",
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
  PyTypeObject* plan_type = nullptr;   // FastPlan, what describe returns for a plain entry
  Py_ssize_t plan_index[P_COUNT] = {};   // each PlanField's place in a FastPlan
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
  // storage/host_values.py KNOWN: storage address -> the values the host knows of it
  PyObject* host_values = nullptr;
};

inline Config C;

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

inline Fused F;

// Set an object slot to `value`: set_slot_owned takes the reference it is given, set_slot takes one
// of its own. (Their one name once made the class's copy shadow this one: fused-mode steps leaked.)
inline void set_slot_owned(PyObject* obj, Py_ssize_t offset, PyObject* value) {
  PyObject** p = reinterpret_cast<PyObject**>(reinterpret_cast<char*>(obj) + offset);
  PyObject* old = *p;
  *p = value;
  Py_XDECREF(old);
}

inline void set_slot(PyObject* obj, Py_ssize_t offset, PyObject* value) {
  Py_INCREF(value);
  set_slot_owned(obj, offset, value);
}

inline bool g_enabled = false;
inline long long g_fast_calls = 0, g_fallbacks = 0, g_queued_here = 0;

enum : int64_t {
  K_ABSENT = 1, K_NONE, K_TENSOR, K_CPU_SCALAR, K_SCALAR_INT, K_SCALAR_DOUBLE, K_SCALAR_BOOL,
  K_SCALAR_COMPLEX, K_INT, K_DOUBLE, K_BOOL, K_STR, K_INT_LIST, K_DOUBLE_LIST, K_BOOL_LIST, K_LIST, K_DEVICE,
};

enum State { NEVER = 0, FAST = 1, LATER = 2 };
constexpr int kLaterCalls = 48;      // a "later" entry (its last call was not described) is asked again after this many calls
constexpr size_t kMaxEntries = 4096; // per op; past it the table starts over

// A new output of a fast entry: its (shape, dtype) as Python objects, and for making it here
// (native outputs) its sizes, number of elements, bytes and dtype.
struct Out {
  PyObject* shape = nullptr;  // owned (in a Plan)
  PyObject* dtype = nullptr;  // owned (in a Plan)
  // owned (in a Plan), or null: the strides of an output not laid out contiguously (a permutation
  // of a dense layout) and its storage's array shape (storage/records.py storage_shape)
  PyObject* stride = nullptr;
  PyObject* form = nullptr;
  std::vector<int64_t> strides;   // `stride`'s values
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

  // strides from `stride` (a tuple of ints, one per dimension) and `form` a tuple; false where not
  bool measure_strides() {
    if (!PyTuple_Check(stride) || !PyTuple_Check(form) || PyTuple_GET_SIZE(stride) != static_cast<Py_ssize_t>(sizes.size())) {
      return false;
    }
    for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(stride); j++) strides.push_back(PyLong_AsLongLong(PyTuple_GET_ITEM(stride, j)));
    if (PyErr_Occurred()) {
      PyErr_Clear();
      strides.clear();
      return false;
    }
    return true;
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
  // the op's host check raises only for values the host knows (storage/host_values.py): a call
  // with such an input runs the Python kernel, which checks them; any other call skips the check
  bool host_values = false;
  ~Plan() {
    if (!Py_IsInitialized()) return;   // (the process is exiting: Python is gone)
    Py_XDECREF(fn);
    for (Out& o : outs) {
      Py_XDECREF(o.shape);
      Py_XDECREF(o.dtype);
      Py_XDECREF(o.stride);
      Py_XDECREF(o.form);
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

// ---------------------------------------------------------------- the steps, one file each

// call_key.cpp: how a call's arguments key it, as finely as the Python kernel's key (each argument
// present or at its default, each tensor's dtype, sizes, strides, partial view, storage slot, the
// record's dtype and shape; the non-tensor values; only the types of Scalar arguments, which travel
// as traced values; the float32 matmul precision and the default dtype)
class CallKey {
 public:
  CallKey(std::vector<char> scalar, const c10::FunctionSchema& schema);
  Verdict build(c10::ArrayRef<c10::IValue> args, Work& w) const;
  size_t n_args() const { return n_args_; }

 private:
  bool present(c10::ArrayRef<c10::IValue> args, int64_t i, int64_t positional_end) const;
  bool is_default(c10::ArrayRef<c10::IValue> args, int64_t i) const;
  Verdict tensor(const at::Tensor& t, Work& w) const;
  Verdict tensor_list(const c10::IValue& v, Work& w) const;
  Verdict value(const c10::IValue& v, bool scalar, Work& w) const;

  // 1 for each argument whose numbers are traced, 2 where it is also passed at its default (the
  // Python kernel fills it in: engine.py OpKernel.set_filled_defaults)
  std::vector<char> scalar_;
  size_t n_args_ = 0;
  int64_t kwarg_only_start_ = 0;
  int64_t fill_end_ = 0;  // the positional arguments always present (the last filled one's, + 1)
  std::vector<std::optional<c10::IValue>> defaults_;
};

// fused_queue.cpp: the step eager/fusion.py defer would append, for a warm op; null where Python decides
PyObject* queue(const Plan& p, const Work& w);

// fast_kernel.cpp: shared by the strict run and the queue
Verdict write_gate(const Plan& p, const Work& w, bool queue, PyObject*& fn, PyObject*& gate, PyObject*& held);
void commit_writes(const Plan& p, const Work& w, PyObject* const* buffers);
void note(const Plan& p, PyObject* verdict);
PyObject* device_scalar(PyObject* v);
void add_counter(Py_ssize_t offset);
inline void count_hit() { add_counter(C.off_hits); }

// outputs.cpp
at::Tensor new_output(const Out& e, PyObject* device_obj, PyObject* buffer);
bool add_slot(PyObject* obj, Py_ssize_t offset, int64_t delta, int64_t* now);
extern PyMethodDef kGraphMethods[5];   // graph_fingerprint, graph_match, graph_outputs, graph_records, storage_freed

// table.cpp
Py_ssize_t member_offset(PyObject* type, const char* name);

}  // namespace torchtpu_fast
