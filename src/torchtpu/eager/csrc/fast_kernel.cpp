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
// is warm and nothing is to decide (fused_queue.cpp); otherwise it hands the keyed call to
// OpKernel._run, which queues it; then it makes the outputs over the queued results. Anything
// else — a key not seen yet, an entry that is not plain, the debug mode, a failed device-side
// assert, a pending interrupt, XLA options in force, in strict mode an unwritten or queued buffer,
// a write strict mode donates, or an error — runs the Python kernel. The key is at least as fine
// as the Python kernel's, so the entry it finds is the one the Python kernel would use.
//
// Everything it reads of the Python side comes from one table, eager/fastpath.py FastPathTable, read
// by name at init (kTableNames); every rule not on this cache-hit path lives in Python only.
// Loaded with ctypes.PyDLL (the GIL is held by every entry point called from Python).
#include "fast_path.h"

namespace torchtpu_fast {

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

// A write's gate while unchecked device-side verdicts exist (eager/asserts.py poison, through
// engine.write_gate; `queue`: as the fused mode asks it): for a gated write, `fn` becomes its
// gated form and `gate` its extra argument (both held by `held`, a new reference). BAIL when the
// plan does not fit the call, or the gate raised an Exception (cleared: the Python kernel asks
// again and raises it); anything else the gate raises (KeyboardInterrupt) is raised.
Verdict write_gate(const Plan& p, const Work& w, bool queue, PyObject*& fn, PyObject*& gate,
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

// The written storages get `buffers` (one per written slot) with no Python code between the
// assignments (a Ctrl-C cannot land in between: eager/executable.py call_and_commit); the old
// buffers are released after
void commit_writes(const Plan& p, const Work& w, PyObject* const* buffers) {
  c10::SmallVector<PyObject*, 4> old;
  for (size_t i = 0; i < p.mutated.size(); i++) {
    PyObject** slot = reinterpret_cast<PyObject**>(reinterpret_cast<char*>(w.records[p.mutated[i]]) + C.off_buffer);
    old.push_back(*slot);
    Py_INCREF(buffers[i]);
    *slot = buffers[i];
  }
  for (PyObject* o : old) Py_XDECREF(o);
}

// Keep the verdict of a plan with device-side checks for the next synchronization
// (eager/asserts.py: note), as the Python kernel does; it may raise an earlier verdict's error
// (its list is full): the op's outputs are dropped then, as there.
void note(const Plan& p, PyObject* verdict) {
  if (!p.checks) return;
  PyObject* nargs[3] = {verdict, p.checks, p.where};
  PyObject* r = PyObject_Vectorcall(C.note, nargs, 3, nullptr);
  if (!r) throw python_error();
  Py_DECREF(r);
}

void add_counter(Py_ssize_t offset) {
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

class FastKernel;
std::vector<FastKernel*> g_kernels;
std::vector<std::unique_ptr<c10::RegistrationHandleRAII>> g_registrations;

class FastKernel final : public c10::OperatorKernel {
 public:
  FastKernel(PyObject* kernel, std::vector<char> scalar, c10::SafeKernelFunction fallback,
             const c10::FunctionSchema& schema, int alias_arg)
      : kernel_(kernel), key_(std::move(scalar), schema), fallback_(std::move(fallback)), alias_arg_(alias_arg),
        n_args_(key_.n_args()), n_returns_(schema.returns().size()) {
    Py_INCREF(kernel_);
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
      Verdict v = key_.build(args, w);
      if (v == ERROR) {
        PyErr_Clear();
      }
      if (v == OK) {
        auto it = table_.find(w.key);
        if (it != table_.end()) {
          entry = &it->second;
          if (entry->state == FAST && !(entry->plan->host_values && host_values_known(w))) {
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
    Verdict v = key_.build(saved, again);
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

  // Whether the host knows the values of one of the call's storages (storage/host_values.py KNOWN;
  // usually empty or small): a plan with `host_values` then goes to the Python kernel, whose host
  // check reads them (index_select's index out of range raises at the op, as on the CPU). An error
  // counts as known (the Python kernel runs).
  static bool host_values_known(const Work& w) {
    if (PyDict_GET_SIZE(C.host_values) == 0) return false;
    for (const void* address : w.addresses) {
      PyObject* a = PyLong_FromVoidPtr(const_cast<void*>(address));
      int found = a ? PyDict_Contains(C.host_values, a) : -1;
      Py_XDECREF(a);
      if (found != 0) {
        if (found < 0) PyErr_Clear();
        return true;
      }
    }
    return false;
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
      if (!t.defined()) {   // (new_tensor(shape, dtype, device, buffer[, strides]))
        PyObject* nargs[5] = {o.shape, o.dtype, w.device_obj, items[i], o.stride};
        PyObject* made = PyObject_Vectorcall(C.new_tensor, nargs, o.stride ? 5 : 4, nullptr);
        if (!made) throw python_error();
        t = THPVariable_Unpack(made);
        Py_DECREF(made);
      }
      results.push_back(std::move(t));
    }
    torch::jit::drop(*stack, n_args_);
    for (at::Tensor& t : results) torch::jit::push(*stack, std::move(t));
  }







  // describe's FastPlan (eager/fastpath.py) as a Plan; null (a Python error may be set) when it does
  // not fit this overload
  std::shared_ptr<Plan> describe_plan(PyObject* d) const {
    auto field = [d](PlanField k) { return PyTuple_GET_ITEM(d, C.plan_index[k]); };
    PyObject* outs = field(P_OUTS);
    PyObject* slots = field(P_WRITTEN);
    PyObject* checks = field(P_CHECKS);
    if (!PyTuple_Check(outs) || !PyTuple_Check(slots)) return nullptr;
    auto plan = std::make_shared<Plan>();
    plan->fn = field(P_FN);
    Py_INCREF(plan->fn);
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(slots); i++) {
      plan->mutated.push_back(static_cast<int>(PyLong_AsLong(PyTuple_GET_ITEM(slots, i))));
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(outs); i++) {
      // (shape, dtype), or (shape, dtype, strides, storage form) for an output laid out otherwise
      // than contiguously
      PyObject* pair = PyTuple_GET_ITEM(outs, i);
      if (!PyTuple_Check(pair) || (PyTuple_GET_SIZE(pair) != 2 && PyTuple_GET_SIZE(pair) != 4)) return nullptr;
      Out o;
      o.shape = PyTuple_GET_ITEM(pair, 0);
      o.dtype = PyTuple_GET_ITEM(pair, 1);
      Py_INCREF(o.shape);
      Py_INCREF(o.dtype);
      o.measure();
      if (PyTuple_GET_SIZE(pair) == 4) {
        o.stride = PyTuple_GET_ITEM(pair, 2);
        o.form = PyTuple_GET_ITEM(pair, 3);
        Py_INCREF(o.stride);
        Py_INCREF(o.form);
        if (!o.measure_strides()) o.scalar_type = c10::ScalarType::Undefined;   // (new_tensor makes it)
      }
      plan->outs.push_back(std::move(o));
    }
    if (checks != Py_None) {
      if (!C.note) return nullptr;
      plan->checks = checks;
      plan->where = field(P_WHERE);
      Py_INCREF(plan->checks);
      Py_INCREF(plan->where);
    }
    if (field(P_GATE) != Py_None) {
      plan->gate = field(P_GATE);
      Py_INCREF(plan->gate);
    }
    plan->entry = field(P_ENTRY);
    Py_INCREF(plan->entry);
    if (field(P_UNMEMOIZED) != Py_None) {
      if (C.off_memo < 0) return nullptr;
      plan->plain_fn = field(P_UNMEMOIZED);
      Py_INCREF(plan->plain_fn);
    }
    plan->queue_only = field(P_FUSED_ONLY) == Py_True;
    plan->host_values = field(P_HOST_VALUES) == Py_True;
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
    if (Py_TYPE(d) == C.plan_type && PyTuple_GET_SIZE(d) == P_COUNT) {
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
  CallKey key_;
  c10::SafeKernelFunction fallback_;
  int alias_arg_;   // the argument an in-place or out= op returns; -1: it returns new tensors
  size_t n_args_;
  size_t n_returns_;
  std::unordered_map<std::vector<int64_t>, FastEntry, KeyHash> table_;
};

}  // namespace torchtpu_fast

using namespace torchtpu_fast;

extern "C" {

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
