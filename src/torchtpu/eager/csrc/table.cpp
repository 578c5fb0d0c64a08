// FastPathTable (eager/fastpath.py), read by name at load: everything the fast path reads of the
// Python side, each checked for its type with its name in the error.
#include "fast_path.h"

namespace torchtpu_fast {

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

// FastPlan's fields, by name: each of kPlanFields has a place, and FastPlan has no other field
bool read_plan_type(TableReader& t) {
  PyObject* type = t.type("plan_type");
  PyObject* fields = type ? PyObject_GetAttrString(type, "_fields") : nullptr;
  if (!fields) return false;
  bool ok = PyTuple_Check(fields) && PyTuple_GET_SIZE(fields) == P_COUNT;
  if (!ok) PyErr_SetString(PyExc_TypeError, "torchtpu fast path: FastPlan's fields are not kPlanFields");
  for (int k = 0; ok && k < P_COUNT; k++) {
    C.plan_index[k] = -1;
    for (Py_ssize_t i = 0; i < P_COUNT; i++) {
      PyObject* name = PyTuple_GET_ITEM(fields, i);
      if (PyUnicode_Check(name) && PyUnicode_CompareWithASCIIString(name, kPlanFields[k]) == 0) C.plan_index[k] = i;
    }
    if (C.plan_index[k] < 0) {
      PyErr_Format(PyExc_TypeError, "torchtpu fast path: FastPlan has no field '%s'", kPlanFields[k]);
      ok = false;
    }
  }
  Py_DECREF(fields);
  if (ok) C.plan_type = reinterpret_cast<PyTypeObject*>(TableReader::keep(type));
  return ok;
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
  C.host_values = TableReader::keep(t.dict("host_values"));
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

}  // namespace torchtpu_fast

using namespace torchtpu_fast;

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
  if (!read_core(t, record_type, entry_type) || !read_plan_type(t)) return 0;
  if (!read_native_outputs(t, record_type)) return 0;
  return read_fused(t, entry_type) ? 1 : 0;
}

}  // extern "C"
