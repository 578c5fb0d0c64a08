// bfloat16 matrix-vector products for XLA:CPU (an XLA FFI custom call; ops/host_gemv.py).
//
// y (M, N) float32 = x (M, K) bf16 @ W (N, K) bf16 ^T, for M <= 4 (batch-1 decoding's nn.Linear): the
// weight is streamed once, with AVX512-BF16 dot products accumulated in float32.
// XLA:CPU's own bf16 dot (YNNPACK) prepares the whole weight at every call and costs ~1.5x the CPU time
// of this loop on a 1x1024 by 151936x1024 product (benchmarks/RESULTS.md). Rows are handed out in
// chunks through an atomic counter to the caller and to tasks on XLA's intra-op pool: the caller waits
// only for chunks another thread has claimed (and is running), so a busy pool cannot deadlock it.
// (GCC 12 flags its own _mm512_reduce_add_ps, whose upper half starts as _mm256_undefined_pd)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

// the kernels are compiled for AVX512-BF16 whatever the build's flags; the handler calls them only
// where the CPU has it (torchtpu_host_gemv_supported: ops/host_gemv.py asks first)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512bf16")

// rows n0..n1 of W against the M rows of x, one weight row at a time with four accumulators along K
// (a single forward stream: at the machine's read bandwidth, where four rows interleaved ran at half of it)
template <int M>
void rows(const uint16_t* x, const uint16_t* w, float* y, int64_t n0, int64_t n1, int64_t N, int64_t K) {
  for (int64_t n = n0; n < n1; ++n) {
    const uint16_t* r = w + n * K;
    __m512 acc[M][4];
    for (int m = 0; m < M; ++m)
      for (int u = 0; u < 4; ++u) acc[m][u] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 128 <= K; k += 128)
      for (int u = 0; u < 4; ++u) {
        __m512bh wv = (__m512bh)_mm512_loadu_si512(r + k + 32 * u);
        for (int m = 0; m < M; ++m)
          acc[m][u] = _mm512_dpbf16_ps(acc[m][u], wv, (__m512bh)_mm512_loadu_si512(x + m * K + k + 32 * u));
      }
    for (; k < K; k += 32) {  // the last K % 128 elements (masked past K)
      __mmask32 mask = K - k >= 32 ? (__mmask32)~0u : (__mmask32)((1u << (K - k)) - 1);
      __m512bh wv = (__m512bh)_mm512_maskz_loadu_epi16(mask, r + k);
      for (int m = 0; m < M; ++m)
        acc[m][0] = _mm512_dpbf16_ps(acc[m][0], wv, (__m512bh)_mm512_maskz_loadu_epi16(mask, x + m * K + k));
    }
    for (int m = 0; m < M; ++m)
      y[m * N + n] = _mm512_reduce_add_ps(
          _mm512_add_ps(_mm512_add_ps(acc[m][0], acc[m][1]), _mm512_add_ps(acc[m][2], acc[m][3])));
  }
}

#pragma GCC pop_options

using RowsFn = void (*)(const uint16_t*, const uint16_t*, float*, int64_t, int64_t, int64_t, int64_t);
constexpr RowsFn kRows[4] = {rows<1>, rows<2>, rows<3>, rows<4>};

struct Work {
  RowsFn fn;
  const uint16_t* x;
  const uint16_t* w;
  float* y;
  int64_t N, K, chunk, chunks;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};

  void run() {  // claim chunks until none is left
    for (int64_t c; (c = next.fetch_add(1, std::memory_order_relaxed)) < chunks;) {
      int64_t n0 = c * chunk, n1 = n0 + chunk < N ? n0 + chunk : N;
      fn(x, w, y, n0, n1, N, K);
      done.fetch_add(1, std::memory_order_release);
    }
  }
};

// below this many weight bytes the caller runs alone (a task's scheduling costs microseconds)
constexpr int64_t kParallelBytes = 1 << 20;
// about this many weight bytes per chunk
constexpr int64_t kChunkBytes = 64 << 10;

ffi::Error Gemv(ffi::ThreadPool pool, ffi::Buffer<ffi::BF16> x, ffi::Buffer<ffi::BF16> w,
                ffi::ResultBuffer<ffi::F32> y) {
  auto xd = x.dimensions(), wd = w.dimensions();
  if (xd.size() != 2 || wd.size() != 2 || xd[1] != wd[1] || xd[0] < 1 || xd[0] > 4)
    return ffi::Error::InvalidArgument("torchtpu_bf16_gemv: x (M<=4, K), w (N, K)");
  const int64_t M = xd[0], N = wd[0], K = wd[1];
  auto work = std::make_shared<Work>();
  work->fn = kRows[M - 1];
  work->x = reinterpret_cast<const uint16_t*>(x.untyped_data());
  work->w = reinterpret_cast<const uint16_t*>(w.untyped_data());
  work->y = y->typed_data();
  work->N = N;
  work->K = K;
  int64_t chunk = (kChunkBytes / (2 * (K > 0 ? K : 1))) / 4 * 4;
  work->chunk = chunk < 4 ? 4 : chunk;
  work->chunks = (N + work->chunk - 1) / work->chunk;
  int64_t helpers = N * K * 2 >= kParallelBytes ? pool.num_threads() : 0;
  if (helpers > work->chunks - 1) helpers = work->chunks - 1;
  for (int64_t i = 0; i < helpers; ++i) pool.Schedule([work] { work->run(); });
  work->run();
  // every chunk is claimed: wait for the ones other threads are running
  while (work->done.load(std::memory_order_acquire) < work->chunks) std::this_thread::yield();
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(TorchtpuBf16Gemv, Gemv,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::BF16>>()
                                  .Arg<ffi::Buffer<ffi::BF16>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

extern "C" int torchtpu_host_gemv_abi() { return 1; }

extern "C" int torchtpu_host_gemv_supported() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw");
}
