// PyTorch's PrivateUse1 hooks for "tpu" in C++, with a c10 GeneratorImpl, so that
// `torch.Generator("tpu")` and `torch.tpu.default_generators` exist. PyTorch asks these hooks for
// new and default generators (`getNewGenerator`, `getDefaultGenerator`); the hooks object a Python
// backend can register (torch._C._acc.PrivateUse1Hooks) forwards neither, and PyTorch accepts one
// hooks object per process, so this one is registered *instead of* the Python one, before it
// (device/registration.py). `isAvailable` calls back into Python (device/platform.py). The same
// hooks resize tpu storages (`resizePrivateUse1Bytes`, below the storage allocator).
//
// The state is what torchtpu's eager RNG (eager/random.py) needs, as on CUDA: a 64-bit seed and a
// counter (`offset`) that every random op advances by one; the executable derives its PRNG key from
// (seed, offset) on the device. get_state/set_state use CUDA's 16-byte layout: seed (uint64) then
// offset (int64), native byte order. Built at run time by torchtpu/device/native.py and loaded
// with ctypes (plain C entry points, no pybind11).
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/GeneratorImpl.h>
#include <c10/core/TensorImpl.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <cstring>
#include <string>
#include <array>
#include <atomic>
#include <map>
#include <mutex>

// The few CPython functions the storage deleter needs, from the stable ABI (the library is loaded
// into the Python process; Python's headers are not on this build's include path).
extern "C" {
typedef struct _object PyObject;
int Py_IsInitialized(void);
int PyGILState_Ensure(void);  // PyGILState_STATE, an int-sized enum
void PyGILState_Release(int);
void PyErr_Fetch(PyObject**, PyObject**, PyObject**);
void PyErr_Restore(PyObject*, PyObject*, PyObject*);
}

namespace {

using c10::Device;
using c10::DeviceIndex;
using c10::DeviceType;

constexpr uint64_t kDefaultSeed = 67280421310721ULL;  // PyTorch's default_rng_seed_val
constexpr int64_t kStateBytes = 16;

struct TpuGeneratorImpl final : public c10::GeneratorImpl {
  explicit TpuGeneratorImpl(DeviceIndex index)
      : c10::GeneratorImpl(Device(DeviceType::PrivateUse1, index),
                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)) {}

  void set_current_seed(uint64_t seed) override {
    seed_ = seed;
    offset_ = 0;
  }
  uint64_t current_seed() const override { return seed_; }
  uint64_t seed() override {
    uint64_t s = c10::detail::getNonDeterministicRandom();
    set_current_seed(s);
    return s;
  }
  void set_offset(uint64_t offset) override { offset_ = offset; }
  uint64_t get_offset() const override { return offset_; }

  void set_state(const c10::TensorImpl& state) override {
    TORCH_CHECK(state.dtype() == caffe2::TypeMeta::Make<uint8_t>() &&
                    state.device_type() == DeviceType::CPU,
                "RNG state must be a torch.ByteTensor on the CPU");
    TORCH_CHECK(state.numel() == kStateBytes, "RNG state is wrong size: expected ", kStateBytes,
                " bytes (seed, offset) for a tpu generator, got ", state.numel());
    TORCH_CHECK(state.is_contiguous(), "RNG state must be contiguous");
    const char* p = static_cast<const char*>(state.data());
    uint64_t seed;
    int64_t offset;
    std::memcpy(&seed, p, 8);
    std::memcpy(&offset, p + 8, 8);
    TORCH_CHECK(offset >= 0, "RNG state has a negative offset: ", offset);
    seed_ = seed;
    offset_ = static_cast<uint64_t>(offset);
  }

  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    c10::Storage storage(c10::Storage::use_byte_size_t(), kStateBytes, c10::GetCPUAllocator(),
                         /*resizable=*/true);
    auto impl = c10::make_intrusive<c10::TensorImpl>(
        std::move(storage), c10::DispatchKeySet(c10::DispatchKey::CPU),
        caffe2::TypeMeta::Make<uint8_t>());
    impl->set_sizes_contiguous({kStateBytes});
    char* p = static_cast<char*>(impl->mutable_data());
    int64_t offset = static_cast<int64_t>(offset_);
    std::memcpy(p, &seed_, 8);
    std::memcpy(p + 8, &offset, 8);
    return impl;
  }

 private:
  TpuGeneratorImpl* clone_impl() const override {
    auto* g = new TpuGeneratorImpl(device().index());
    g->seed_ = seed_;
    g->offset_ = offset_;
    return g;
  }

  uint64_t seed_ = kDefaultSeed;
  uint64_t offset_ = 0;
};

constexpr int kMaxDevices = 64;
thread_local int t_hand_out_default = 0;  // see torchtpu_next_new_is_default

DeviceIndex resolve(DeviceIndex index) {
  if (index < 0) {  // "tpu" without an index: the current device, as CUDA does
    index = c10::impl::getDeviceGuardImpl(DeviceType::PrivateUse1)->getDevice().index();
    if (index < 0) index = 0;
  }
  TORCH_CHECK(index < kMaxDevices, "tpu device index ", static_cast<int>(index), " is out of range");
  return index;
}

using AvailableFn = int (*)();

// "Pinned" host memory for tpu: host-to-device copies go through PJRT, which gains nothing from
// page-locked memory, so this is the CPU allocator plus a record of which blocks were asked for
// pinned, so that `x.pin_memory().is_pinned()` holds and code that pins (DDP's reducer with
// find_unused_parameters, DataLoader(pin_memory=True)) works as on CUDA.
class PinnedHostAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    c10::DataPtr inner = c10::GetCPUAllocator()->allocate(nbytes);
    void* data = inner.get();
    auto* ctx = new Block{std::move(inner), this};
    if (data != nullptr) {
      std::lock_guard<std::mutex> lock(mutex_);
      blocks_[reinterpret_cast<uintptr_t>(data)] = nbytes;
    }
    return {data, ctx, &PinnedHostAllocator::release, c10::Device(DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
  bool contains(const void* ptr) {
    auto address = reinterpret_cast<uintptr_t>(ptr);
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = blocks_.upper_bound(address);
    if (it == blocks_.begin()) return false;
    --it;
    return address < it->first + std::max<size_t>(it->second, 1);
  }

 private:
  struct Block {
    c10::DataPtr inner;
    PinnedHostAllocator* owner;
  };
  static void release(void* ctx) {
    auto* block = static_cast<Block*>(ctx);
    if (block->inner.get() != nullptr) {
      std::lock_guard<std::mutex> lock(block->owner->mutex_);
      block->owner->blocks_.erase(reinterpret_cast<uintptr_t>(block->inner.get()));
    }
    delete block;
  }
  std::mutex mutex_;
  std::map<uintptr_t, size_t> blocks_;
};

struct TpuHooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return is_available_ != nullptr && is_available_() != 0; }
  bool hasPrimaryContext(DeviceIndex) const override { return true; }
  void init() const override {}

  const at::Generator& getDefaultGenerator(DeviceIndex index) const override {
    index = resolve(index);
    std::call_once(default_once_[index], [&] {
      defaults_[index] = at::make_generator<TpuGeneratorImpl>(index);
    });
    return defaults_[index];
  }

  at::Generator getNewGenerator(DeviceIndex index) const override {
    index = resolve(index);
    if (t_hand_out_default) {  // torchtpu's Python side wraps the default generator itself
      t_hand_out_default = 0;
      return getDefaultGenerator(index);
    }
    return at::make_generator<TpuGeneratorImpl>(index);
  }

  at::Allocator* getPinnedMemoryAllocator() const override { return &pinned_; }
  bool isPinnedPtr(const void* data) const override { return pinned_.contains(data); }

  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override;

  AvailableFn is_available_ = nullptr;

 private:
  mutable PinnedHostAllocator pinned_;
  mutable std::array<at::Generator, kMaxDevices> defaults_;
  mutable std::array<std::once_flag, kMaxDevices> default_once_;
};

TpuHooks* g_hooks = nullptr;

// The PrivateUse1 allocator, for the storages PyTorch makes itself (`torch.UntypedStorage(8,
// device="tpu")`, `TypedStorage(..., device="tpu")`): without one PyTorch dereferences a null
// allocator. The address is one the storage layer invents (storage/records.py allocate_storage,
// which makes the storage's record); the deleter tells it the storage is gone. Both are Python
// callbacks (ctypes takes the GIL); at exit they are cleared and a late deleter does nothing.
using StorageAllocFn = uint64_t (*)(uint64_t nbytes, int64_t* device_index);
using StorageFreeFn = void (*)(uint64_t address);
// resize(address, new nbytes) -> the storage's new address (0: failed, the reason in t_storage_error)
using StorageResizeFn = uint64_t (*)(uint64_t address, uint64_t nbytes);
std::atomic<StorageAllocFn> g_storage_alloc{nullptr};
std::atomic<StorageFreeFn> g_storage_free{nullptr};
std::atomic<StorageResizeFn> g_storage_resize{nullptr};
thread_local std::string t_storage_error;

class TpuStorageAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(std::size_t nbytes) override {
    StorageAllocFn alloc = g_storage_alloc.load();
    TORCH_CHECK(alloc != nullptr, "torchtpu: tpu storages can only be made while torchtpu is loaded");
    int64_t index = 0;
    uint64_t address = alloc(nbytes, &index);
    TORCH_CHECK(address != 0, "torchtpu: could not make a tpu storage of ", nbytes, " bytes");
    void* p = reinterpret_cast<void*>(address);
    return {p, p, &TpuStorageAllocator::release, Device(DeviceType::PrivateUse1, static_cast<DeviceIndex>(index))};
  }
  static void release(void* ctx) {
    StorageFreeFn free_fn = g_storage_free.load();
    if (free_fn == nullptr || !Py_IsInitialized()) return;
    // A storage can die while a Python exception is on its way out (a temporary storage dropped as
    // PyTorch raises): the callback must neither see nor clear it, or Python reports a SystemError.
    int gil = PyGILState_Ensure();
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    free_fn(reinterpret_cast<uint64_t>(ctx));
    PyErr_Restore(type, value, traceback);
    PyGILState_Release(gil);
  }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void* /*dest*/, const void* /*src*/, std::size_t /*count*/) const override {
    TORCH_CHECK(false, "torchtpu: a tpu storage's bytes live on the device; copy it with copy_()");
  }
};

TpuStorageAllocator g_storage_allocator;

// `storage.resize_(n)`, `tensor.resize_` growing its storage, `set_` onto a storage too small: as
// CUDA's resize_bytes_cuda, the storage gets a new allocation of n bytes holding the old bytes in
// front, and every tensor over the storage sees it. The storage layer moves the storage's record
// to a fresh address (addresses are spaced by size, so a grown storage cannot stay where it was);
// the old DataPtr's deleter then finds no record there. The new DataPtr frees the record like an
// allocated one (a storage made from an address is also freed by its weak reference: the second
// free finds nothing).
void TpuHooks::resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const {
  StorageResizeFn resize = g_storage_resize.load();
  TORCH_CHECK(resize != nullptr, "torchtpu: tpu storages can only be resized while torchtpu is loaded");
  c10::StorageImpl* impl = storage.unsafeGetStorageImpl();
  auto old = reinterpret_cast<uint64_t>(impl->data_ptr().get());
  t_storage_error.clear();
  uint64_t address = resize(old, static_cast<uint64_t>(newsize));
  TORCH_CHECK(address != 0, t_storage_error.empty() ? "torchtpu: could not resize a tpu storage" : t_storage_error);
  if (address == old) {   // the same size: the same allocation, as on CUDA
    impl->set_nbytes(newsize);
    return;
  }
  void* p = reinterpret_cast<void*>(address);
  impl->set_data_ptr_noswap(c10::DataPtr(p, p, &TpuStorageAllocator::release, impl->device()));
  impl->set_nbytes(newsize);
}

}  // namespace

extern "C" {
int torchtpu_hooks_abi() { return 2; }
// 1: registered; 0: PyTorch already had PrivateUse1 hooks (registered once per process).
int torchtpu_register_hooks(AvailableFn is_available) {
  if (at::isPrivateUse1HooksRegistered()) return 0;
  g_hooks = new TpuHooks();  // lives as long as the process, as PyTorch expects
  g_hooks->is_available_ = is_available;
  at::RegisterPrivateUse1HooksInterface(g_hooks);
  return 1;
}
// With on = 1, the next getNewGenerator on this thread returns the default generator of its device,
// so that `torch.Generator("tpu:i")` right after this call is a Python object over it; 0 clears it.
void torchtpu_next_new_is_default(int on) { t_hand_out_default = on; }
// The storage layer's callbacks (NULLs at exit); the allocator is registered at the first call.
void torchtpu_set_storage_callbacks(StorageAllocFn alloc, StorageFreeFn free_fn, StorageResizeFn resize) {
  g_storage_resize.store(resize);
  g_storage_free.store(free_fn);
  g_storage_alloc.store(alloc);
  static bool registered = false;
  if (!registered && alloc != nullptr) {
    c10::SetAllocator(DeviceType::PrivateUse1, &g_storage_allocator);
    registered = true;
  }
}
// Why the resize callback failed (its exception's message), raised by resizePrivateUse1Bytes.
void torchtpu_set_storage_error(const char* message) { t_storage_error = message ? message : ""; }
}
