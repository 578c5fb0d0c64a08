// The c10 DeviceGuardImpl for "tpu" (PrivateUse1): the current device per thread and the device
// count, which PyTorch's C++ reads (the autograd engine sizes its per-device queues from it;
// torch.accelerator's device index goes through it). PyTorch's Python-level guard hard-codes one
// device and index 0. Built at run time by torchtpu/device/native.py against the installed torch's
// c10 headers and loaded with ctypes: plain C entry points, no pybind11, no libtorch_python.
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <atomic>

namespace {

using c10::Device;
using c10::DeviceIndex;
using c10::DeviceType;
using c10::Stream;

std::atomic<int> g_device_count{1};
thread_local DeviceIndex t_current = 0;

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
  // Events and stream queries are answered by torch.tpu.Event/Stream in Python (which know the
  // queued XLA buffers); these keep C++ callers that only need ordering from failing.
  void record(void**, const Stream&, const DeviceIndex, const c10::EventFlag) const override {}
  void block(void*, const Stream&) const override {}
  bool queryEvent(void*) const override { return true; }
  void destroyEvent(void*, const DeviceIndex) const noexcept override {}
  bool queryStream(const Stream&) const override { return true; }
  void synchronizeStream(const Stream&) const override {}

 private:
  Device norm(Device d) const {
    return d.index() >= 0 ? d : Device(DeviceType::PrivateUse1, t_current);
  }
};

TpuGuardImpl g_impl;

}  // namespace

extern "C" {
int torchtpu_guard_abi() { return 1; }
void torchtpu_register_guard(int device_count) {
  g_device_count.store(device_count > 0 ? device_count : 1);
  c10::impl::registerDeviceGuard(DeviceType::PrivateUse1, &g_impl);
}
void torchtpu_set_device_count(int n) { g_device_count.store(n > 0 ? n : 1); }
int torchtpu_get_device() { return t_current; }
void torchtpu_set_device(int i) { t_current = static_cast<DeviceIndex>(i); }
}
