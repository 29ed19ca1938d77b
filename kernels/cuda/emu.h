// emu.h - runs the subset of CUDA C++ that kernels/cuda/*.cu use on the CPU,
// so that `make check` executes every kernel where there is no GPU
// (DESIGN §9, §11). Under nvcc it only defines the portable macros below.
//
// Model. A launch runs its blocks one after another on the calling thread.
// The threads of a block are cooperative fibers, each on its own stack,
// that switch only at the points where a GPU thread may wait for others:
// __syncthreads, __syncwarp and the warp shuffles. A __shared__ variable is
// a static thread_local, one copy for the block that is running. With
// QL_EMU_REVERSE=1 in the environment the fibers run in reverse order, which
// exposes code that depends on an order a GPU does not promise (a missing
// barrier); with QL_EMU_SHUFFLE=<seed> (not 0) the blocks of a launch run in
// a random permutation, a block's first thread is random and each switch
// goes to a random ready thread, the same for the same seed. A block whose live threads all wait on different barriers is a
// deadlock and aborts with a message, as is a 128-bit load through
// ql_ld128() from an address that is not 16-byte aligned (a GPU raises a
// misaligned-address error there).
//
// What it does not model: warp-synchronous code without __syncwarp (it is
// undefined since Volta anyway), partial-warp masks (they abort), blocks
// that wait for each other (they run one at a time), memory that is not
// host memory. Shared memory keeps what the previous block left in it, and
// the dynamic part starts as 0xCD bytes, as uninitialised as on a GPU.
//
// A launch is first shown to the emulated runtime (emu_runtime.h) when the
// program links it: a launch on a device in an error state does not run,
// as on a GPU, which is how the backend's fault handling is tested.
//
// This header needs no CUDA toolkit: it defines the few CUDA types and
// intrinsics the kernels use itself, and takes cudaStream_t from
// emu_runtime.h (CI machines have no toolkit).
#ifndef QL_CUDA_EMU_H
#define QL_CUDA_EMU_H

#if defined(__CUDACC__)  // ------------------------------ real CUDA ------
#include <cuda_runtime.h>
#include <stdint.h>
#define QL_EMU 0
#define QL_LAUNCH(k, grid, block, smem, stream, ...) \
  k<<<(grid), (block), (smem), (stream)>>>(__VA_ARGS__)
#define QL_EXTERN_SHARED(T, name)                             \
  extern __shared__ __align__(16) unsigned char name##_raw[]; \
  T* name = reinterpret_cast<T*>(name##_raw)

// A 128-bit load of global memory through the read-only path. p must be
// 16-byte aligned: the emulation checks it, the GPU faults.
__device__ __forceinline__ uint4 ql_ld128(const void* p) {
  return __ldg(reinterpret_cast<const uint4*>(p));
}

#else  // --------------------------------------------- CPU emulation ------
#define QL_EMU 1
#include <stdint.h>
#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#define QL_EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define QL_EMU_ASAN 1
#endif
#endif
#ifdef QL_EMU_ASAN  // fiber stacks must be announced, else ASan sees overflows
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif
#if !defined(__x86_64__) || defined(QL_EMU_UCONTEXT)
#include <ucontext.h>
#define QL_EMU_USE_UCONTEXT 1
#endif

// ---- the CUDA types the kernels use (cuda_runtime.h's vector_types.h) ----
struct uint3 {
  unsigned x, y, z;
};
struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1)
      : x(x_), y(y_), z(z_) {}
};
struct alignas(8) uint2 {
  unsigned x, y;
};
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};
struct alignas(16) float4 {
  float x, y, z, w;
};

// cudaStream_t and the rest of the emulated runtime API (emu_runtime.cpp).
#include "emu_runtime.h"
// Weak: a program that links the kernels but not the runtime (the
// emulator's own test) runs every launch.
extern "C" int ql__emu_cuda_launch(cudaStream_t) __attribute__((weak));
extern "C" int ql__emu_cuda_access(cudaStream_t, const void*, size_t)
    __attribute__((weak));

#define __global__
#define __device__
#define __host__
#define __constant__
#define __forceinline__ inline
#define __shared__ static thread_local
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define QL_LAUNCH(k, grid, block, smem, stream, ...) \
  ::ql_emu::launch(k, grid, block, smem, stream, __VA_ARGS__)
#define QL_EXTERN_SHARED(T, name) \
  T* name = reinterpret_cast<T*>(::ql_emu::tw->dyn_smem)

namespace ql_emu {
// ------------------------------------------------------ context switching
#ifndef QL_EMU_USE_UCONTEXT
// x86-64 SysV: a switch saves the callee-saved registers and the SSE/x87
// control words on the current stack, stores the stack pointer, loads the
// other fiber's and restores its registers. Ten times cheaper than
// swapcontext, which also makes a system call for the signal mask.
struct Ctx {
  void* sp;
  const void* stk = nullptr;
  size_t stk_size = 0;
};
__attribute__((naked, noinline)) static void ctx_switch(void** /*save*/,
                                                        void* /*to*/) {
  asm volatile(
      "pushq %rbp\n pushq %rbx\n pushq %r12\n pushq %r13\n pushq %r14\n"
      "pushq %r15\n subq $8, %rsp\n stmxcsr (%rsp)\n fnstcw 4(%rsp)\n"
      "movq %rsp, (%rdi)\n movq %rsi, %rsp\n"
      "ldmxcsr (%rsp)\n fldcw 4(%rsp)\n addq $8, %rsp\n"
      "popq %r15\n popq %r14\n popq %r13\n popq %r12\n popq %rbx\n"
      "popq %rbp\n ret\n");
}
// The first switch to a new fiber returns here: rbx holds the function,
// r12 its argument (set up by ctx_make).
__attribute__((naked, noinline)) static void ctx_tramp() {
  asm volatile("movq %r12, %rdi\n callq *%rbx\n ud2\n");
}
inline void ctx_make(Ctx& c, char* stack, size_t size, void (*fn)(void*),
                     void* arg) {
  uintptr_t top = (reinterpret_cast<uintptr_t>(stack) + size) & ~uintptr_t(15);
  void** sp = reinterpret_cast<void**>(top - 80);
  uint32_t* csr = reinterpret_cast<uint32_t*>(sp);
  csr[0] = 0x1F80;  // default mxcsr: round to nearest, no FTZ/DAZ
  csr[1] = 0x037F;  // default x87 control word
  sp[1] = sp[2] = sp[3] = nullptr;  // r15 r14 r13
  sp[4] = arg;                      // r12
  sp[5] = reinterpret_cast<void*>(fn);  // rbx
  sp[6] = nullptr;                      // rbp
  sp[7] = reinterpret_cast<void*>(&ctx_tramp);  // return address
  c.sp = sp;
  c.stk = stack;
  c.stk_size = size;
}
__attribute__((noinline)) inline void ctx_jump(Ctx& from, Ctx& to,
                                               bool from_dies = false) {
  asm volatile("" ::: "memory");
#ifdef QL_EMU_ASAN
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(from_dies ? nullptr : &fake, to.stk,
                                 to.stk_size);
  ctx_switch(&from.sp, to.sp);
  __sanitizer_finish_switch_fiber(fake, &from.stk, &from.stk_size);
#else
  (void)from_dies;
  ctx_switch(&from.sp, to.sp);
#endif
  asm volatile("" ::: "memory");
}
#else
struct Ctx {
  ucontext_t uc;
};
inline void ctx_entry_uc(unsigned hi, unsigned lo, unsigned fhi, unsigned flo) {
  auto fn = reinterpret_cast<void (*)(void*)>((uintptr_t(fhi) << 32) | flo);
  fn(reinterpret_cast<void*>((uintptr_t(hi) << 32) | lo));
}
inline void ctx_make(Ctx& c, char* stack, size_t size, void (*fn)(void*),
                     void* arg) {
  getcontext(&c.uc);
  c.uc.uc_stack.ss_sp = stack;
  c.uc.uc_stack.ss_size = size;
  c.uc.uc_link = nullptr;
  uintptr_t a = uintptr_t(arg), f = uintptr_t(fn);
  makecontext(&c.uc, (void (*)())ctx_entry_uc, 4, unsigned(a >> 32),
              unsigned(a), unsigned(f >> 32), unsigned(f));
}
__attribute__((noinline)) inline void ctx_jump(Ctx& from, Ctx& to,
                                               bool = false) {
  swapcontext(&from.uc, &to.uc);
}
#endif

// -------------------------------------------------------- block scheduler
enum : uint8_t { READY, WAIT_BAR, WAIT_WARP, DONE };
struct Fiber {
  Ctx ctx;
  uint3 tid;
  int lin;  // linear thread index in the block
  uint8_t state;
};
struct Warp {
  int arrived, live;
  unsigned gen;
  // Lane exchange for shuffles, double-buffered: a lane can be at most one
  // warp operation ahead of a lane still reading the previous one.
  alignas(16) unsigned char slot[2][32][16];
};
struct Worker {
  Ctx main;
  std::vector<Fiber> f;
  std::vector<Warp> w;
  int n = 0, live = 0, bar_arrived = 0, cur = 0, step = 1;
  uint64_t rng = 0;  // QL_EMU_SHUFFLE: the random order's state; 0: off
  char* stacks = nullptr;
  size_t stack_sz = 0, stacks_len = 0;
  std::vector<unsigned char> dyn_smem_buf;
  unsigned char* dyn_smem = nullptr;
  void (*body)(void*) = nullptr;
  void* body_arg = nullptr;
  ~Worker() {
    if (stacks) munmap(stacks, stacks_len);
  }
};
inline thread_local Worker* tw = nullptr;
inline thread_local Fiber* tcur = nullptr;
inline thread_local uint3 tBlockIdx;
inline thread_local dim3 tBlockDim, tGridDim;

[[noreturn]] inline void fail(const char* msg) {
  std::fprintf(stderr, "ql_emu: %s (block %u,%u,%u thread %d)\n", msg,
               tBlockIdx.x, tBlockIdx.y, tBlockIdx.z, tcur ? tcur->lin : -1);
  std::abort();
}

// The current fiber stopped being READY: run the next READY fiber of the
// block in the scheduling order, or go back to the launch when none is left.
// The next number of the random order (xorshift64*).
inline uint64_t next_random(Worker& W) {
  W.rng ^= W.rng >> 12;
  W.rng ^= W.rng << 25;
  W.rng ^= W.rng >> 27;
  return W.rng * 0x2545F4914F6CDD1Dull;
}
inline void switch_next() {
  Worker& W = *tw;
  Fiber* me = tcur;
  const bool dies = me->state == DONE;
  // In the random order the search for a ready thread starts anywhere.
  const int from = W.rng ? int(next_random(W) % unsigned(W.n)) : W.cur;
  for (int k = 1; k <= W.n; ++k) {
    int j = (from + W.step * k + W.n) % W.n;
    if (W.f[j].state == READY) {
      W.cur = j;
      tcur = &W.f[j];
      ctx_jump(me->ctx, W.f[j].ctx, dies);
      return;
    }
  }
  if (W.live != 0)
    fail("deadlock: every live thread waits (a divergent __syncthreads or "
         "shuffle?)");
  ctx_jump(me->ctx, W.main, dies);
}
inline void release_block(Worker& W) {
  W.bar_arrived = 0;
  for (auto& x : W.f)
    if (x.state == WAIT_BAR) x.state = READY;
}
inline void release_warp(Worker& W, int wi) {
  Warp& w = W.w[wi];
  w.arrived = 0;
  ++w.gen;
  int e = std::min(W.n, wi * 32 + 32);
  for (int i = wi * 32; i < e; ++i)
    if (W.f[i].state == WAIT_WARP) W.f[i].state = READY;
}
inline void sync_block() {
  Worker& W = *tw;
  if (++W.bar_arrived == W.live) {
    release_block(W);
    return;
  }
  tcur->state = WAIT_BAR;
  switch_next();
}
inline void sync_warp(unsigned mask) {
  Worker& W = *tw;
  int wi = tcur->lin >> 5;
  Warp& w = W.w[wi];
  if (mask != 0xffffffffu) {
    unsigned need =
        (W.n - wi * 32 >= 32) ? 0xffffffffu : ((1u << (W.n - wi * 32)) - 1);
    if ((mask & need) != need) fail("partial-warp masks are not emulated");
  }
  if (++w.arrived == w.live) {
    release_warp(W, wi);
    return;
  }
  tcur->state = WAIT_WARP;
  switch_next();
}
inline void fiber_main(void* p) {
#ifdef QL_EMU_ASAN
  __sanitizer_finish_switch_fiber(nullptr, nullptr, nullptr);
#endif
  Worker& W = *tw;
  (void)p;
  W.body(W.body_arg);
  Fiber* me = tcur;
  me->state = DONE;
  --W.live;
  int wi = me->lin >> 5;
  Warp& w = W.w[wi];
  --w.live;
  // An exited thread no longer holds back a barrier the others wait on.
  if (W.bar_arrived > 0 && W.bar_arrived == W.live) release_block(W);
  if (w.arrived > 0 && w.arrived == w.live) release_warp(W, wi);
  switch_next();
  fail("a finished thread was resumed");
}
inline size_t env_size(const char* name, size_t dflt) {
  const char* s = std::getenv(name);
  return s ? std::strtoull(s, nullptr, 0) : dflt;
}
inline void run_block(Worker& W) {
#ifdef QL_EMU_ASAN
  ASAN_UNPOISON_MEMORY_REGION(W.stacks, W.stacks_len);
#endif
  for (int i = 0; i < W.n; ++i) {
    Fiber& F = W.f[i];
    F.lin = i;
    F.state = READY;
    F.tid = uint3{i % tBlockDim.x, (i / tBlockDim.x) % tBlockDim.y,
                  i / (tBlockDim.x * tBlockDim.y)};
    ctx_make(F.ctx, W.stacks + size_t(i) * W.stack_sz + 4096,
             W.stack_sz - 4096, &fiber_main, &F);
  }
  for (size_t i = 0; i < W.w.size(); ++i) {
    W.w[i].arrived = 0;
    W.w[i].gen = 0;
    W.w[i].live = std::min(32, W.n - int(i) * 32);
  }
  W.live = W.n;
  W.bar_arrived = 0;
  W.cur = W.rng ? int(next_random(W) % unsigned(W.n))
          : W.step > 0 ? 0 : W.n - 1;
  tcur = &W.f[W.cur];
  ctx_jump(W.main, W.f[W.cur].ctx);
  tcur = nullptr;
}
// Stacks are mapped once per block size (QL_EMU_STACK bytes each, 64 KiB by
// default) with a guard page below each, so an overflow faults.
inline void prepare(Worker& W, int nthr, size_t smem) {
  size_t ss = (env_size("QL_EMU_STACK", 64 << 10) + 4095) & ~size_t(4095);
  ss += 4096;
  if (W.n != nthr || W.stack_sz != ss) {
    if (W.stacks) munmap(W.stacks, W.stacks_len);
    W.stacks_len = ss * nthr;
    void* m = mmap(nullptr, W.stacks_len, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) fail("cannot map the thread stacks");
    W.stacks = static_cast<char*>(m);
    W.stack_sz = ss;
    for (int i = 0; i < nthr; ++i)
      mprotect(W.stacks + size_t(i) * ss, 4096, PROT_NONE);
    W.n = nthr;
    W.f.assign(nthr, Fiber{});
    W.w.assign((nthr + 31) / 32, Warp{});
  }
  W.step = env_size("QL_EMU_REVERSE", 0) ? -1 : 1;
  // A fixed seed, so that a failure replays; the state never becomes 0.
  const size_t seed = env_size("QL_EMU_SHUFFLE", 0);
  if (seed == 0)
    W.rng = 0;
  else if (W.rng == 0)
    W.rng = uint64_t(seed) * 0x9E3779B97F4A7C15ull | 1;
  W.dyn_smem_buf.assign(smem + 16, 0xCD);
  W.dyn_smem = reinterpret_cast<unsigned char*>(
      (uintptr_t(W.dyn_smem_buf.data()) + 15) & ~uintptr_t(15));
}
inline void run_grid(dim3 g, dim3 b, size_t smem, void (*body)(void*),
                     void* arg) {
  long nb = long(g.x) * g.y * g.z;
  int nt = int(b.x * b.y * b.z);
  if (nt <= 0 || nt > 1024 || nb <= 0 || g.y > 65535 || g.z > 65535)
    fail("bad launch configuration");
  static thread_local Worker W;
  Worker* outer = tw;
  if (outer != nullptr) fail("a launch from inside a kernel");
  tw = &W;
  tGridDim = g;
  tBlockDim = b;
  prepare(W, nt, smem);
  W.body = body;
  W.body_arg = arg;
  // Blocks in order, or in a random permutation (Fisher-Yates).
  std::vector<long> order;
  if (W.rng) {
    order.resize(size_t(nb));
    for (long i = 0; i < nb; ++i) order[size_t(i)] = i;
    for (long i = nb - 1; i > 0; --i)
      std::swap(order[size_t(i)],
                order[size_t(next_random(W) % uint64_t(i + 1))]);
  }
  for (long k = 0; k < nb; ++k) {
    const long i = W.rng ? order[size_t(k)] : k;
    tBlockIdx = uint3{unsigned(i % g.x), unsigned((i / g.x) % g.y),
                      unsigned(i / (long(g.x) * g.y))};
    run_block(W);
  }
  tw = nullptr;
}
template <class F>
void call_body(void* p) {
  (*static_cast<F*>(p))();
}
// A launch the runtime refuses (a device in an error state) does nothing,
// as on a GPU; the runtime records why for cudaGetLastError.
template <class... P, class... A>
void launch(void (*k)(P...), dim3 grid, dim3 block, size_t smem,
            cudaStream_t stream, A&&... a) {
  static_assert(sizeof...(P) == sizeof...(A), "kernel argument count");
  if (ql__emu_cuda_launch != nullptr && !ql__emu_cuda_launch(stream)) return;
  std::tuple<std::decay_t<P>...> args(
      static_cast<std::decay_t<P>>(std::forward<A>(a))...);
  auto body = [&] { std::apply(k, args); };  // each thread copies the args
  run_grid(grid, block, smem, &call_body<decltype(body)>, &body);
}
// Every live lane of the warp deposits `bytes` of v and waits for the
// others; returns the 32 slots (valid until this lane's next warp op).
inline unsigned char (*warp_exchange(const void* v, size_t bytes))[16] {
  Warp& w = tw->w[tcur->lin >> 5];
  unsigned b = w.gen & 1;
  std::memcpy(w.slot[b][tcur->lin & 31], v, bytes);
  sync_warp(0xffffffffu);
  return w.slot[b];
}
template <class T>
inline T shfl_from(T v, int src) {
  static_assert(sizeof(T) <= 16 && std::is_trivially_copyable<T>::value,
                "shuffle type");
  T r;
  std::memcpy(&r, warp_exchange(&v, sizeof(T))[src], sizeof(T));
  return r;
}
inline int lane_id() { return tcur->lin & 31; }
}  // namespace ql_emu

#define threadIdx (::ql_emu::tcur->tid)
#define blockIdx (::ql_emu::tBlockIdx)
#define blockDim (::ql_emu::tBlockDim)
#define gridDim (::ql_emu::tGridDim)
static constexpr int warpSize = 32;

inline void __syncthreads() { ::ql_emu::sync_block(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  ::ql_emu::sync_warp(mask);
}
// Shuffles with the semantics of the CUDA C++ Programming Guide, "Warp
// Shuffle Functions": a source lane outside the caller's segment of `width`
// lanes gives the caller its own value.
template <class T>
inline T __shfl_sync(unsigned m, T v, int src, int width = 32) {
  (void)m;
  int l = ql_emu::lane_id();
  return ql_emu::shfl_from(v, (l & ~(width - 1)) + (src & (width - 1)));
}
template <class T>
inline T __shfl_xor_sync(unsigned m, T v, int mask, int width = 32) {
  (void)m;
  int l = ql_emu::lane_id(), s = l ^ mask;
  return ql_emu::shfl_from(v, (s & ~(width - 1)) > (l & ~(width - 1)) ? l : s);
}
template <class T>
inline T __shfl_down_sync(unsigned m, T v, unsigned d, int width = 32) {
  (void)m;
  int l = ql_emu::lane_id();
  return ql_emu::shfl_from(v, (l & (width - 1)) + int(d) < width ? l + int(d)
                                                                  : l);
}

// Single-operation float intrinsics: each rounds once to nearest even, as
// the GPU's do; the emulation build uses -ffp-contract=off so that the
// compiler does not fuse them either.
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline int __float2int_rn(float f) { return int(std::nearbyint(f)); }
// Leading zero bits of x, 32 for 0 (CUDA Math API, __clz).
inline int __clz(int x) {
  return x == 0 ? 32 : __builtin_clz(unsigned(x));
}
// Byte permute (CUDA Math API, __byte_perm): byte i of the result is the
// byte of the 8-byte value {y, x} (x in bytes 0-3) that the low three bits
// of nibble i of s select.
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
  const uint64_t v = (uint64_t(y) << 32) | x;
  unsigned r = 0;
  for (int i = 0; i < 4; ++i)
    r |= unsigned((v >> (8 * ((s >> (4 * i)) & 7u))) & 0xFFu) << (8 * i);
  return r;
}
inline unsigned __float_as_uint(float f) {
  unsigned u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float __uint_as_float(unsigned u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// A 128-bit load (see the nvcc branch). The alignment check is the point of
// this helper in emulation: every vector load of the kernels goes through
// it, so a ragged row that would fault on the GPU aborts here.
inline uint4 ql_ld128(const void* p) {
  if (reinterpret_cast<uintptr_t>(p) % 16 != 0)
    ::ql_emu::fail("misaligned 128-bit load");
  uint4 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
#endif  // __CUDACC__
#endif  // QL_CUDA_EMU_H
