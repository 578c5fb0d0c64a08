// The c10 DeviceGuardImpl for "tpu" (PrivateUse1): the current device per thread and the device
// count, which PyTorch's C++ reads (the autograd engine sizes its per-device queues from it;
// torch.accelerator's device index goes through it), and the device-generic events and streams
// (`torch.Event(device="tpu")`, `torch.Stream(device="tpu").synchronize()`), answered by Python
// callbacks that know the queued XLA work (eager/device_module.py). PyTorch's Python-level guard hard-codes one
// device and index 0. Built at run time by torchtpu/device/native.py against the installed torch's
// c10 headers and loaded with ctypes: plain C entry points, no pybind11, no libtorch_python.
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <cmath>
#include <string>

namespace {

using c10::Device;
using c10::DeviceIndex;
using c10::DeviceType;
using c10::Stream;

std::atomic<int> g_device_count{1};
thread_local DeviceIndex t_current = 0;

// Set by Python at load (and cleared at exit, so nothing calls into a finalized interpreter). Each
// returns a negative value on error, after handing its message to torchtpu_guard_set_error.
struct Callbacks {
  int64_t (*record)(int64_t handle, int device, int timing) = nullptr;  // the event's handle
  int (*query)(int64_t handle) = nullptr;                              // 1 done, 0 not yet
  int (*synchronize)(int64_t handle) = nullptr;
  void (*destroy)(int64_t handle) = nullptr;
  double (*elapsed)(int64_t start, int64_t end) = nullptr;             // ms; NaN on error
  int (*synchronize_device)(int device) = nullptr;
  int (*query_device)(int device) = nullptr;                           // 1 idle, 0 busy
};
Callbacks g_cb;
thread_local std::string t_error;

[[noreturn]] void fail(const char* what) {
  std::string message = t_error.empty() ? std::string("torchtpu: ") + what + " failed" : t_error;
  t_error.clear();
  TORCH_CHECK(false, message);
}

void need(const void* fn, const char* what) {
  TORCH_CHECK(fn != nullptr, "torchtpu: ", what, " needs torchtpu's runtime, which is not initialized");
}

int64_t handle_of(void* event) { return static_cast<int64_t>(reinterpret_cast<intptr_t>(event)); }

struct TpuGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  DeviceType type() const override { return DeviceType::PrivateUse1; }
  Device exchangeDevice(Device d) const override {
    Device old(DeviceType::PrivateUse1, t_current);
    if (d.index() >= 0) t_current = d.index();
    return old;
  }
  Device getDevice() const override { return Device(DeviceType::PrivateUse1, t_current); }
  void setDevice(Device d) const override {
    if (d.index() >= 0) t_current = d.index();
  }
  void uncheckedSetDevice(Device d) const noexcept override {
    if (d.index() >= 0) t_current = d.index();
  }
  // XLA orders work by data dependencies: every stream is the device's default stream.
  Stream getStream(Device d) const override { return Stream(Stream::DEFAULT, norm(d)); }
  Stream getNewStream(Device d, int) const override { return Stream(Stream::DEFAULT, norm(d)); }
  Stream exchangeStream(Stream s) const override { return Stream(Stream::DEFAULT, s.device()); }
  DeviceIndex deviceCount() const noexcept override {
    return static_cast<DeviceIndex>(g_device_count.load());
  }
  // An event marks the work queued so far on its device (one in-order queue per device: XLA
  // orders the rest by data dependencies); its handle is the Python-side record's number.
  void record(void** event, const Stream& stream, const DeviceIndex device_index,
              const c10::EventFlag flag) const override {
    need(reinterpret_cast<const void*>(g_cb.record), "recording an event");
    DeviceIndex device = device_index >= 0 ? device_index : stream.device_index();
    int64_t handle = g_cb.record(handle_of(*event), device >= 0 ? device : t_current,
                                 flag == c10::EventFlag::BACKEND_DEFAULT ? 1 : 0);
    if (handle <= 0) fail("recording an event");
    *event = reinterpret_cast<void*>(static_cast<intptr_t>(handle));
  }
  // One queue per device: work queued after `block` already runs after the event's work.
  void block(void*, const Stream&) const override {}
  bool queryEvent(void* event) const override {
    if (event == nullptr) return true;  // never recorded
    need(reinterpret_cast<const void*>(g_cb.query), "querying an event");
    int done = g_cb.query(handle_of(event));
    if (done < 0) fail("querying an event");
    return done != 0;
  }
  void synchronizeEvent(void* event) const override {
    if (event == nullptr) return;
    need(reinterpret_cast<const void*>(g_cb.synchronize), "synchronizing an event");
    if (g_cb.synchronize(handle_of(event)) < 0) fail("synchronizing an event");
  }
  double elapsedTime(void* start, void* end, const DeviceIndex) const override {
    need(reinterpret_cast<const void*>(g_cb.elapsed), "elapsed_time");
    double ms = g_cb.elapsed(handle_of(start), handle_of(end));
    if (std::isnan(ms)) fail("elapsed_time");
    return ms;
  }
  void destroyEvent(void* event, const DeviceIndex) const noexcept override {
    if (event != nullptr && g_cb.destroy != nullptr) g_cb.destroy(handle_of(event));
  }
  bool queryStream(const Stream& stream) const override {
    need(reinterpret_cast<const void*>(g_cb.query_device), "querying a stream");
    int idle = g_cb.query_device(norm(stream.device()).index());
    if (idle < 0) fail("querying a stream");
    return idle != 0;
  }
  void synchronizeStream(const Stream& stream) const override { synchronizeDevice(norm(stream.device()).index()); }
  void synchronizeDevice(const DeviceIndex device_index) const override {
    need(reinterpret_cast<const void*>(g_cb.synchronize_device), "synchronizing a device");
    if (g_cb.synchronize_device(device_index >= 0 ? device_index : t_current) < 0) fail("synchronizing");
  }

 private:
  Device norm(Device d) const {
    return d.index() >= 0 ? d : Device(DeviceType::PrivateUse1, t_current);
  }
};

TpuGuardImpl g_impl;

}  // namespace

extern "C" {
int torchtpu_guard_abi() { return 2; }
void torchtpu_guard_set_callbacks(int64_t (*record)(int64_t, int, int), int (*query)(int64_t),
                                  int (*synchronize)(int64_t), void (*destroy)(int64_t),
                                  double (*elapsed)(int64_t, int64_t), int (*synchronize_device)(int),
                                  int (*query_device)(int)) {
  g_cb.record = record;
  g_cb.query = query;
  g_cb.synchronize = synchronize;
  g_cb.destroy = destroy;
  g_cb.elapsed = elapsed;
  g_cb.synchronize_device = synchronize_device;
  g_cb.query_device = query_device;
}
void torchtpu_guard_set_error(const char* message) { t_error = message ? message : ""; }
void torchtpu_register_guard(int device_count) {
  g_device_count.store(device_count > 0 ? device_count : 1);
  c10::impl::registerDeviceGuard(DeviceType::PrivateUse1, &g_impl);
}
void torchtpu_set_device_count(int n) { g_device_count.store(n > 0 ? n : 1); }
int torchtpu_get_device() { return t_current; }
void torchtpu_set_device(int i) { t_current = static_cast<DeviceIndex>(i); }
}
