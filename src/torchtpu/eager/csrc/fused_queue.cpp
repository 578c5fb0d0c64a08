// The fused mode's queue for a warm op (eager/fusion.py defer's common case), in named steps.
#include "fast_path.h"

namespace torchtpu_fast {

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

// An open segment (fusion.py _Segment) and its lists
struct Segment {
  PyObject *obj = nullptr, *steps = nullptr, *external = nullptr, *ids = nullptr, *undo = nullptr,
           *undo_ids = nullptr;
};

// The open segment of the call's device and its lists, held; false where Python decides: no
// segment yet, a loop's next iteration (a segment that starts with `fn`), a step that ends it
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
// else (unwritten, queued in a segment not run yet, a grown tensor's room: eager/growing.py Room,
// whose exact values Python slices out): Python.
static bool step_inputs(const Work& w, PyObject* gate, PyObject* segment, HeldRefs& held,
                        c10::SmallVector<PyObject*, 8>& inputs) {
  for (size_t i = 0; i <= w.records.size(); i++) {
    if (i == w.records.size() && !gate) break;
    PyObject* b = i < w.records.size() ? slot_of(w.records[i], C.off_buffer) : gate;
    if (!b || b == Py_None) return false;
    if (Py_TYPE(b) == F.pending) {
      if (slot_of(b, F.p_segment) != segment) {
        b = slot_of(b, F.p_value);
        if (!b || b == Py_None) return false;
      }
    } else if (i < w.records.size() && Py_TYPE(b) != C.array_type) {
      return false;
    }
    inputs.push_back(held.hold(b));
  }
  return true;
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

// eager/fusion.py defer, for the call the fast path keyed: the queued results (a new reference),
// or null (no error set) where the Python kernel must queue it, which it does as before: a
// decision to make (the op's first call in a sync window that finds it cold, a cold op, a gated
// write, a segment to open or to end, an input not written yet or queued elsewhere), the fusion
// lock held by another thread. The step it appends is the one defer appends, so segments queued
// here and there are the same segments. Runs no Python code but the lock's methods, the weak
// references' and asserts.note: no interrupt can land between its writes.
PyObject* queue(const Plan& p, const Work& w) {
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

}  // namespace torchtpu_fast
