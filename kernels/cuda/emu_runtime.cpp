// emu_runtime.cpp - the emulated CUDA runtime of emu_runtime.h: devices,
// memory, streams, events and IPC on host memory, with injected faults, so
// that the CUDA backend's host code and its failure paths run in
// `make check` (DESIGN §9).
//
// One mutex guards every table; bulk copies run outside it. Work runs at
// enqueue, on the calling thread. Each work item gets the next number of
// its device's sequence; a stream remembers, per device, the last number
// it depends on (its own items, the events it waited for), and an event the
// numbers of its stream at record time. A hang stops the device at a
// number: later items do not run, and whatever depends on one of them is
// not ready, for ever. The legacy default stream (a null cudaStream_t)
// depends on its own items and those of the blocking streams of its device
// (CUDA C++ Programming Guide, "Default Stream" and "Implicit
// Synchronization"); non-blocking streams only on their own.
//
// Late copies (QL_EMU_CUDA_LATE_COPY=1, or ql_emu_cuda_late_copies()): a
// cudaMemcpy from pageable host memory to the device returns before its
// bytes land, as CUDA allows ("the DMA to final destination may not have
// completed", CUDA Runtime API, API synchronization behavior); they land
// when the legacy default stream next does anything or is synchronized,
// or the device is. Work on a non-blocking stream does not wait for them,
// so a kernel there that reads the destination first sees what was there
// before (a fresh allocation: zeros).
//
// Release calls (cudaFree, cudaFreeHost, cudaStreamDestroy,
// cudaEventDestroy, cudaIpcCloseMemHandle, cuMemUnmap, cuMemRelease) on a
// device with a sticky error release and then report the error: a GPU's
// context and all its memory are gone then, and a process that exits after
// a fault must not look leaky to the sanitizers. cudaFree does not wait for
// a hung device.
//
// Virtual memory management: a handle (cuMemCreate, or an import of an
// exported descriptor) is a Phys, its memfd; a reservation is anonymous
// PROT_NONE address space; a mapping is the memfd mapped over part of a
// reservation (MAP_FIXED), entered in the allocation table like any device
// memory, so that copies, cudaPointerGetAttributes and cuMemGetAddressRange
// see it, with the protection cuMemSetAccess gave it. Unmapping puts
// reservation space back. A handle's memory goes when it is released and
// its last mapping unmapped.
#include "emu_runtime.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

namespace {

constexpr int kMaxDevices = 8;
// cudaDeviceGetStreamPriorityRange's answer on sm_90 (an H100 and an H200
// both report 0 and -5): lower numbers are greater priorities.
constexpr int kLeastPriority = 0, kGreatestPriority = -5;
constexpr size_t kAlign = 256;  // what cudaMalloc guarantees at least
constexpr uint32_t kIpcMagic = 0x51454d49;  // "IMEQ" in memory
constexpr uint32_t kIpcEventMagic = 0x51454556;  // "VEEQ" in memory
// The high half of every VMM handle, so that a small number or a pointer
// is never taken for one.
constexpr uint64_t kVmmTag = uint64_t(0x51564d4d) << 32;
constexpr int kRW = PROT_READ | PROT_WRITE;

}  // namespace

// The opaque handles of emu_runtime.h. last[d] / seq[d]: the highest work
// number of device d this stream or event depends on.
struct ql_emu_stream {
  int dev;
  unsigned flags;
  int priority;       // cudaStreamCreateWithPriority's, clamped; 0 default
  long last[kMaxDevices];
  bool busy;          // work enqueued that no query has seen complete
  uint64_t ready_ns;  // QL_EMU_CUDA_KERNEL_MS: not complete before this
};
struct ql_emu_event {
  int dev;
  unsigned flags;
  long seq[kMaxDevices];
  bool recorded;
  uint64_t ns;      // host monotonic time of the last record
  uint64_t serial;  // interprocess events: named in their handles
};

namespace {

struct Fault {
  long at;  // strikes once the device's sequence reaches it
  int kind;
};

struct Device {
  size_t total = 0, used = 0;
  int cc_major = 9, cc_minor = 0;  // compute capability (QL_EMU_CUDA_CC)
  long seq = 0;       // work items ever enqueued; never reset (streams and
                      // events hold these numbers)
  long seq_base = 0;  // seq at the last reset, for ql_emu_cuda_work
  long launches = 0;  // since the last reset
  long hi_launches = 0;  // of them, on streams of a priority above 0
  long legacy = 0;    // the legacy default stream's dependency
  bool sticky = false, hung = false, oom = false;
  long hang_seq = 0;  // items after this one do not run when hung
  int busy_streams = 0;  // streams with work in flight (since the reset)
  int max_busy = 0;      // the most at once, for QL_EMU_CUDA_STATS
  std::vector<Fault> pending;
  // Late copies not landed yet, in order: destination and bytes.
  std::vector<std::pair<void*, std::vector<unsigned char>>> late;
};

// A device allocation (memfd) or an imported one (a mapping of another
// process's memfd, refcounted as CUDA does for a handle opened twice), or
// a cuMemMap mapping (vmm: its handle; the Phys has the memfd).
struct Alloc {
  size_t size;     // what the caller asked for; the mapping is this long
  size_t charged;  // accounted against the device (own allocations)
  int dev;
  int fd;  // own: the memfd; imported, mapping: -1
  uint64_t serial;
  bool imported;
  int refs;  // imported: opens not yet closed
  int pid;   // imported: the exporter
  CUmemGenericAllocationHandle vmm;  // a mapping: its handle; else 0
  int prot;  // what the memory may take: kRW but for a mapping
};

// A physical allocation of virtual memory management, by its handle: made
// by cuMemCreate (charged to its device) or imported from a descriptor
// (charged to the exporter's). It lives until the handle is released and no
// mapping of it remains.
struct Phys {
  size_t size;
  size_t charged;
  int dev;
  int fd;         // the memfd, or a dup of the imported descriptor
  bool posix;     // may be exported as a descriptor
  bool released;  // cuMemRelease'd: no longer a handle to the caller
  int maps;       // mappings not yet unmapped
};

// What a cudaIpcMemHandle_t holds: enough for another process to find and
// check the memfd through /proc/<pid>/fd/<fd>.
struct IpcWire {
  uint32_t magic;
  int32_t pid;
  int32_t fd;
  int32_t dev;
  uint64_t serial;
  uint64_t size;    // of the allocation
  uint64_t offset;  // of the exported pointer from the allocation's base
};
static_assert(sizeof(IpcWire) <= CUDA_IPC_HANDLE_SIZE, "IPC handle layout");

// A host function waiting for its time (cudaLaunchHostFunc).
struct HostCall {
  cudaHostFn_t fn;
  void* data;
};

struct State {
  std::mutex mu;
  std::condition_variable host_cv;  // the host-function thread's
  bool host_thread = false;         // started (in this process)
  std::multimap<std::pair<uint64_t, long>, HostCall> host_q;  // (due, n)
  long host_n = 0;                  // orders calls due at once
  bool configured = false;
  cudaError_t init_err = cudaSuccess;  // for every call, when set
  int ndev = 0;
  size_t mem = 0;
  long hang_ms = 0;
  long kernel_ms = 0;                 // QL_EMU_CUDA_KERNEL_MS
  bool late = false;                  // QL_EMU_CUDA_LATE_COPY
  const char* stats_path = nullptr;   // QL_EMU_CUDA_STATS
  Device dev[kMaxDevices];
  std::map<uintptr_t, Alloc> allocs;  // by base, own and imported
  std::map<uintptr_t, size_t> pinned;
  std::map<uintptr_t, size_t> registered;  // cudaHostRegister'd ranges
  std::set<uintptr_t> mapped;  // bases of those registered Mapped
  long host_ever = 0;    // registrations ever made
  long host_copies = 0;  // async copies to or from a registered range
  long dma_copies = 0;   // async copies with a side in host memory
  const char* host_stats_path = nullptr;  // QL_EMU_CUDA_HOST_STATS
  std::set<ql_emu_stream*> streams;
  std::set<ql_emu_event*> events;
  uint64_t serial = 0;
  uint64_t event_serial = 0;  // interprocess events made here
  long ipc_maps = 0;          // cudaIpcOpenMemHandle calls that mapped
  size_t gran = 65536;        // QL_EMU_CUDA_VMM_GRANULARITY
  size_t page = 4096;         // the host's page size
  bool novmm = false;         // QL_EMU_CUDA_NOVMM
  std::map<CUmemGenericAllocationHandle, Phys> phys;
  uint64_t vmm_n = 0;         // handles ever made
  std::map<uintptr_t, size_t> reserved;  // cuMemAddressReserve'd ranges
  std::atomic<unsigned> epoch{1};  // bumped by reset: thread states go stale
};

State* make_state();

// Never destroyed: a thread may still call in while the process exits.
State& S() {
  static State* s = make_state();
  return *s;
}

// The lock is held across fork() so that a child never inherits it taken
// by a thread that does not exist there.
State* make_state() {
  State* s = new State;
  // The child has no host-function thread, and its parent's pending calls
  // are the parent's.
  pthread_atfork([] { S().mu.lock(); }, [] { S().mu.unlock(); },
                 [] {
                   S().host_thread = false;
                   S().host_q.clear();
                   S().mu.unlock();
                 });
  return s;
}

struct Thread {
  unsigned epoch = 0;
  int dev = 0;
  cudaError_t last = cudaSuccess;
};
thread_local Thread t_state;

Thread& me() {
  unsigned e = S().epoch.load(std::memory_order_acquire);
  if (t_state.epoch != e) t_state = Thread{e, 0, cudaSuccess};
  return t_state;
}

// Records e as the calling thread's last error; returns it.
cudaError_t fail(cudaError_t e) {
  if (e != cudaSuccess) me().last = e;
  return e;
}

// ---- configuration (the environment)

bool parse_long(const char* s, long lo, long hi, long* out) {
  char* end;
  if (s == nullptr || *s == '\0') return false;
  errno = 0;
  long long v = strtoll(s, &end, 0);
  if (errno != 0 || *end != '\0' || v < lo || v > hi) return false;
  *out = long(v);
  return true;
}

void activate(Device& d, int kind) {
  switch (kind) {
    case QL_EMU_FAULT_STICKY:
      d.sticky = true;
      break;
    case QL_EMU_FAULT_HANG:
      if (!d.hung) d.hang_seq = d.seq;
      d.hung = true;
      break;
    case QL_EMU_FAULT_OOM:
      d.oom = true;
      break;
  }
}

// Strikes the faults of d whose time has come.
void trigger(Device& d) {
  for (size_t i = 0; i < d.pending.size();) {
    if (d.seq >= d.pending[i].at) {
      activate(d, d.pending[i].kind);
      d.pending.erase(d.pending.begin() + long(i));
    } else {
      ++i;
    }
  }
}

void arm(Device& d, long after, int kind) {
  if (kind == QL_EMU_FAULT_NONE) {
    d.pending.clear();
    d.sticky = d.hung = d.oom = false;
    return;
  }
  d.pending.push_back(Fault{d.seq + after, kind});
  trigger(d);
}

// "<dev>:<after>:<kind>[,...]" into the devices' faults; false when
// malformed.
bool parse_faults(State& s, const char* spec) {
  std::string all(spec);
  size_t pos = 0;
  while (pos <= all.size()) {
    size_t comma = all.find(',', pos);
    std::string item = all.substr(
        pos, comma == std::string::npos ? std::string::npos : comma - pos);
    pos = comma == std::string::npos ? all.size() + 1 : comma + 1;
    if (item.empty()) continue;
    size_t c1 = item.find(':'), c2 = c1 == std::string::npos
                                         ? std::string::npos
                                         : item.find(':', c1 + 1);
    if (c2 == std::string::npos) return false;
    std::string sd = item.substr(0, c1), sa = item.substr(c1 + 1, c2 - c1 - 1),
                sk = item.substr(c2 + 1);
    long dev, after, kind;
    if (!parse_long(sd.c_str(), 0, kMaxDevices - 1, &dev) ||
        !parse_long(sa.c_str(), 0, 1L << 62, &after))
      return false;
    if (sk == "none")
      kind = QL_EMU_FAULT_NONE;
    else if (sk == "sticky")
      kind = QL_EMU_FAULT_STICKY;
    else if (sk == "hang")
      kind = QL_EMU_FAULT_HANG;
    else if (sk == "oom")
      kind = QL_EMU_FAULT_OOM;
    else
      return false;
    arm(s.dev[dev], after, int(kind));
  }
  return true;
}

// "M.m[,M.m...]" into the devices' compute capabilities, one per ordinal,
// the last for the rest; false when malformed.
bool parse_cc(State& s, const char* spec) {
  std::string all(spec);
  size_t pos = 0;
  int d = 0;
  long major = 9, minor = 0;
  while (pos <= all.size() && d < kMaxDevices) {
    size_t comma = all.find(',', pos);
    std::string item = all.substr(
        pos, comma == std::string::npos ? std::string::npos : comma - pos);
    pos = comma == std::string::npos ? all.size() + 1 : comma + 1;
    size_t dot = item.find('.');
    if (dot == std::string::npos ||
        !parse_long(item.substr(0, dot).c_str(), 1, 99, &major) ||
        !parse_long(item.substr(dot + 1).c_str(), 0, 9, &minor))
      return false;
    s.dev[d].cc_major = int(major);
    s.dev[d].cc_minor = int(minor);
    d++;
  }
  if (pos <= all.size()) return false;  // more items than devices
  for (; d < kMaxDevices; d++) {
    s.dev[d].cc_major = int(major);
    s.dev[d].cc_minor = int(minor);
  }
  return true;
}

// Reads the environment into s and clears faults and counters; allocations
// stay charged. A malformed variable is the tester's mistake: say which,
// and fail every call so that it cannot go unnoticed.
void configure(State& s) {
  const char* bad = nullptr;
  long ndev = 1, hang = 2000, mem = 1L << 30, kernel = 0, gran = 65536;
  const long page = sysconf(_SC_PAGESIZE);
  const char* v;

  s.configured = true;
  s.init_err = cudaSuccess;
  s.ipc_maps = 0;
  for (Device& d : s.dev) {
    d.seq_base = d.seq;
    d.launches = 0;
    d.hi_launches = 0;
    d.sticky = d.hung = d.oom = false;
    d.busy_streams = d.max_busy = 0;
    d.pending.clear();
    d.late.clear();
  }
  for (ql_emu_stream* st : s.streams) st->busy = false;
  if ((v = getenv("QL_EMU_CUDA_DEVICES")) != nullptr &&
      !parse_long(v, 0, kMaxDevices, &ndev))
    bad = "QL_EMU_CUDA_DEVICES";
  else if ((v = getenv("QL_EMU_CUDA_MEM")) != nullptr &&
           !parse_long(v, 1, 1L << 50, &mem))
    bad = "QL_EMU_CUDA_MEM";
  else if ((v = getenv("QL_EMU_CUDA_HANG_MS")) != nullptr &&
           !parse_long(v, 0, 3600000, &hang))
    bad = "QL_EMU_CUDA_HANG_MS";
  else if ((v = getenv("QL_EMU_CUDA_KERNEL_MS")) != nullptr &&
           !parse_long(v, 0, 60000, &kernel))
    bad = "QL_EMU_CUDA_KERNEL_MS";
  // A power of two of whole pages: mappings land on page boundaries.
  else if ((v = getenv("QL_EMU_CUDA_VMM_GRANULARITY")) != nullptr &&
           (!parse_long(v, page, 1L << 30, &gran) || (gran & (gran - 1)) != 0))
    bad = "QL_EMU_CUDA_VMM_GRANULARITY";
  s.ndev = int(ndev);
  s.gran = size_t(gran);
  s.page = size_t(page);
  s.mem = size_t(mem);
  s.hang_ms = hang;
  s.kernel_ms = kernel;
  v = getenv("QL_EMU_CUDA_LATE_COPY");
  s.late = v != nullptr && *v != '\0' && strcmp(v, "0") != 0;
  s.stats_path = getenv("QL_EMU_CUDA_STATS");
  s.host_stats_path = getenv("QL_EMU_CUDA_HOST_STATS");
  s.host_copies = 0;
  s.dma_copies = 0;
  for (Device& d : s.dev) d.total = s.mem;
  for (Device& d : s.dev) {
    d.cc_major = 9;
    d.cc_minor = 0;
  }
  if (bad == nullptr && (v = getenv("QL_EMU_CUDA_CC")) != nullptr &&
      !parse_cc(s, v))
    bad = "QL_EMU_CUDA_CC";
  if (bad == nullptr && (v = getenv("QL_EMU_CUDA_FAULT")) != nullptr &&
      !parse_faults(s, v))
    bad = "QL_EMU_CUDA_FAULT";
  if (bad != nullptr) {
    // The variable's value again: v has been reused since.
    fprintf(stderr, "ql_emu_cuda: %s: cannot parse \"%s\"\n", bad,
            getenv(bad));
    s.init_err = cudaErrorInitializationError;
  }
  v = getenv("QL_EMU_CUDA_NOVMM");
  s.novmm = v != nullptr && *v != '\0' && strcmp(v, "0") != 0;
  v = getenv("QL_EMU_CUDA_NODRIVER");
  if (v != nullptr && *v != '\0' && strcmp(v, "0") != 0)
    s.init_err = cudaErrorInsufficientDriver;
}

// The lock every entry point takes; configures on first use.
struct Lock {
  std::unique_lock<std::mutex> lk;
  Lock() : lk(S().mu) {
    if (!S().configured) configure(S());
  }
};

// ---- checks shared by the entry points (all with the lock held)

// cudaSuccess when device d can take calls.
cudaError_t dev_ok(const State& s, int d) {
  if (s.ndev == 0) return cudaErrorNoDevice;
  if (d < 0 || d >= s.ndev) return cudaErrorInvalidDevice;
  if (s.dev[d].sticky) return cudaErrorIllegalAddress;
  return cudaSuccess;
}

// The device a stream belongs to, or -1 for a handle that is not a live
// stream. A null stream is the current device's legacy default stream.
int stream_dev(const State& s, cudaStream_t st) {
  if (st == nullptr) return me().dev;
  return s.streams.count(st) ? st->dev : -1;
}

// True when something that depends on last[] waits on work a hang stopped.
bool blocked(const State& s, const long* last) {
  for (int d = 0; d < kMaxDevices; ++d)
    if (s.dev[d].hung && last[d] > s.dev[d].hang_seq) return true;
  return false;
}

// What the stream (null: the legacy default stream of device d) depends on.
void deps_of(const State& s, cudaStream_t st, int d, long* out) {
  if (st != nullptr) {
    memcpy(out, st->last, sizeof st->last);
    return;
  }
  memset(out, 0, sizeof(long) * kMaxDevices);
  out[d] = s.dev[d].legacy;
}

// The late copies of device dv land, in order.
void land(Device& dv) {
  for (auto& c : dv.late) memmove(c.first, c.second.data(), c.second.size());
  dv.late.clear();
}

uint64_t mono_ns() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000u + uint64_t(ts.tv_nsec);
}

// Writes every device's most streams in flight at once to
// QL_EMU_CUDA_STATS ("<dev> <max>" lines), for a test in another process.
void write_stats(const State& s) {
  if (s.stats_path == nullptr) return;
  FILE* f = fopen(s.stats_path, "w");
  if (f == nullptr) return;
  for (int d = 0; d < s.ndev; d++) fprintf(f, "%d %d\n", d, s.dev[d].max_busy);
  fclose(f);
}

// A stream whose work a query saw complete is no longer in flight.
void stream_idle(State& s, cudaStream_t st) {
  if (st == nullptr || !st->busy) return;
  st->busy = false;
  s.dev[st->dev].busy_streams--;
}

// Enqueues one work item on stream st of device d: numbers it, strikes the
// faults it completes, and says whether it runs (not after a hang). A
// non-null stream is in flight from then until a query sees it complete.
bool enqueue(State& s, cudaStream_t st, int d) {
  Device& dv = s.dev[d];
  long n = ++dv.seq;
  if (st != nullptr && !st->busy && st->dev == d) {
    st->busy = true;
    if (++dv.busy_streams > dv.max_busy) {
      dv.max_busy = dv.busy_streams;
      write_stats(s);
    }
  }
  if (st == nullptr || (st->flags & cudaStreamNonBlocking) == 0) {
    dv.legacy = n;
    land(dv);  // work of the legacy stream, or ordered after it
  }
  if (st != nullptr) st->last[d] = n;
  bool run = !(dv.hung && n > dv.hang_seq);
  trigger(dv);
  return run;
}

// The allocation (own or imported) holding address p, or null.
const Alloc* find(const State& s, uintptr_t p, uintptr_t* base) {
  auto it = s.allocs.upper_bound(p);
  if (it == s.allocs.begin()) return nullptr;
  --it;
  if (p - it->first >= it->second.size) return nullptr;
  *base = it->first;
  return &it->second;
}

// What [p, p + n) may take (PROT_* bits: the least of its parts) when it
// lies in one device allocation, or in cuMemMap mappings back to back (one
// range to a GPU, which maps pages, not allocations); -1 when it does not.
// *dev gets the device of the first part.
int dev_prot(const State& s, const void* p, size_t n, int* dev) {
  uintptr_t base;
  const Alloc* a = find(s, uintptr_t(p), &base);
  if (a == nullptr) return -1;
  const int first = a->dev;
  int prot = a->prot;
  uintptr_t at = uintptr_t(p);
  for (;;) {
    const size_t room = a->size - (at - base);
    if (n <= room) break;
    auto it = s.allocs.find(base + a->size);
    if (a->vmm == 0 || it == s.allocs.end() || it->second.vmm == 0) return -1;
    n -= room;
    at = base = it->first;
    a = &it->second;
    prot &= a->prot;
  }
  *dev = first;
  return prot;
}

// True when [p, p + n) is device memory (see dev_prot); *dev gets its
// device.
bool dev_range(const State& s, const void* p, size_t n, int* dev) {
  return dev_prot(s, p, n, dev) >= 0;
}

// Waits as long as a GPU watchdog would for work that never completes, then
// gives up; called without the lock.
cudaError_t time_out(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
  return fail(cudaErrorLaunchTimeout);
}

// The base of the range of m (base -> bytes: registered or pinned) that
// holds all of [a, a + n), or 0 when none does.
uintptr_t range_base(const std::map<uintptr_t, size_t>& m, uintptr_t a,
                     size_t n) {
  auto it = m.upper_bound(a);
  if (it == m.begin()) return 0;
  --it;
  const uintptr_t off = a - it->first;
  return off < it->second && n <= it->second - off ? it->first : 0;
}

// True when [p, p + n) lies in one range of cudaHostRegister.
bool host_registered(const State& s, const void* p, size_t n) {
  return range_base(s.registered, uintptr_t(p), n) != 0;
}

// True when a kernel may touch [p, p + n) of host memory: it lies in one
// allocation of cudaHostAlloc (under unified addressing, which every
// 64-bit platform of CUDA 13 has, pinned memory is mapped at its host
// address) or in one range registered with cudaHostRegisterMapped.
bool host_mapped(const State& s, const void* p, size_t n) {
  if (range_base(s.pinned, uintptr_t(p), n) != 0) return true;
  const uintptr_t b = range_base(s.registered, uintptr_t(p), n);
  return b != 0 && s.mapped.count(b) != 0;
}

// True when [p, p + n) meets a range of the map (registered or pinned).
bool overlaps(const std::map<uintptr_t, size_t>& m, uintptr_t p, size_t n) {
  auto it = m.lower_bound(p);
  if (it != m.end() && it->first - p < n) return true;
  if (it == m.begin()) return false;
  --it;
  return p - it->first < it->second;
}

// QL_EMU_CUDA_HOST_STATS: "<live> <ever>" registrations.
void write_host_stats(const State& s) {
  if (s.host_stats_path == nullptr) return;
  FILE* f = fopen(s.host_stats_path, "w");
  if (f == nullptr) return;
  fprintf(f, "%zu %ld\n", s.registered.size(), s.host_ever);
  fclose(f);
}

size_t charge_of(size_t n) { return (n + kAlign - 1) & ~(kAlign - 1); }

// True when charge more bytes (for size asked) fit device dv: what
// cudaMalloc and cuMemCreate check, the injected OOM fault included.
bool fits(const Device& dv, size_t size, size_t charge) {
  return !dv.oom && charge >= size && charge <= dv.total &&
         dv.used <= dv.total - charge;
}

}  // namespace

// ------------------------------------------------------------- devices

extern "C" cudaError_t cudaGetDeviceCount(int* count) {
  Lock l;
  State& s = S();
  // Without a driver, libcudart leaves *count as it was.
  if (s.init_err != cudaSuccess) return fail(s.init_err);
  if (count == nullptr) return fail(cudaErrorInvalidValue);
  *count = 0;
  if (s.ndev == 0) return fail(cudaErrorNoDevice);
  *count = s.ndev;
  return cudaSuccess;
}

extern "C" cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp* prop,
                                               int device) {
  Lock l;
  State& s = S();
  if (s.init_err != cudaSuccess) return fail(s.init_err);
  if (prop == nullptr) return fail(cudaErrorInvalidValue);
  if (s.ndev == 0) return fail(cudaErrorNoDevice);
  if (device < 0 || device >= s.ndev) return fail(cudaErrorInvalidDevice);
  memset(prop, 0, sizeof *prop);
  snprintf(prop->name, sizeof prop->name, "Emulated GPU");
  // 15 fixed bytes and the ordinal: distinct, and the same in every run.
  memcpy(prop->uuid.bytes, "qlinear-emu-gpu", 15);
  prop->uuid.bytes[15] = char(device);
  prop->totalGlobalMem = s.dev[device].total;
  prop->major = s.dev[device].cc_major;
  prop->minor = s.dev[device].cc_minor;
  prop->multiProcessorCount = 132;
  prop->pciBusID = device + 1;
  return cudaSuccess;
}

namespace {

// An attribute of a valid device by its number, the same in enum
// cudaDeviceAttr and CUdevice_attribute; false for one not emulated.
bool attribute(const State& s, int attr, int device, int* value) {
  switch (attr) {
    case cudaDevAttrMultiProcessorCount:
      *value = 132;
      return true;
    case cudaDevAttrMemoryClockRate:
      *value = 2619000;  // kHz
      return true;
    case cudaDevAttrGlobalMemoryBusWidth:
      *value = 5120;  // bits
      return true;
    case cudaDevAttrL2CacheSize:
      *value = 1 << 20;
      return true;
    case cudaDevAttrComputeCapabilityMajor:
      *value = s.dev[device].cc_major;
      return true;
    case cudaDevAttrComputeCapabilityMinor:
      *value = s.dev[device].cc_minor;
      return true;
  }
  return false;
}

}  // namespace

extern "C" cudaError_t cudaDeviceGetAttribute(int* value,
                                              enum cudaDeviceAttr attr,
                                              int device) {
  Lock l;
  State& s = S();
  if (s.init_err != cudaSuccess) return fail(s.init_err);
  if (value == nullptr) return fail(cudaErrorInvalidValue);
  if (s.ndev == 0) return fail(cudaErrorNoDevice);
  if (device < 0 || device >= s.ndev) return fail(cudaErrorInvalidDevice);
  if (!attribute(s, int(attr), device, value))
    return fail(cudaErrorInvalidValue);
  return cudaSuccess;
}

// Sets the device even when it has a sticky error, and reports that error
// (the runtime API may return errors of earlier asynchronous work from any
// call).
extern "C" cudaError_t cudaSetDevice(int device) {
  Lock l;
  State& s = S();
  if (s.init_err != cudaSuccess) return fail(s.init_err);
  if (s.ndev == 0) return fail(cudaErrorNoDevice);
  if (device < 0 || device >= s.ndev) return fail(cudaErrorInvalidDevice);
  me().dev = device;
  return fail(dev_ok(s, device));
}

extern "C" cudaError_t cudaGetDevice(int* device) {
  Lock l;
  State& s = S();
  if (s.init_err != cudaSuccess) return fail(s.init_err);
  if (device == nullptr) return fail(cudaErrorInvalidValue);
  if (s.ndev == 0) return fail(cudaErrorNoDevice);
  *device = me().dev;
  return cudaSuccess;
}

extern "C" cudaError_t cudaDeviceSynchronize(void) {
  long ms;
  {
    Lock l;
    State& s = S();
    if (s.init_err != cudaSuccess) return fail(s.init_err);
    int d = me().dev;
    cudaError_t e = dev_ok(s, d);
    if (e != cudaSuccess) return fail(e);
    Device& dv = s.dev[d];
    land(dv);
    if (!(dv.hung && dv.seq > dv.hang_seq)) return cudaSuccess;
    ms = s.hang_ms;
  }
  return time_out(ms);
}

// -------------------------------------------------------------- memory

extern "C" cudaError_t cudaMalloc(void** devPtr, size_t size) {
  Lock l;
  State& s = S();
  if (s.init_err != cudaSuccess) return fail(s.init_err);
  if (devPtr == nullptr) return fail(cudaErrorInvalidValue);
  *devPtr = nullptr;
  int d = me().dev;
  cudaError_t e = dev_ok(s, d);
  if (e != cudaSuccess) return fail(e);
  if (size == 0) return cudaSuccess;  // as CUDA: success, a null pointer
  Device& dv = s.dev[d];
  size_t charge = charge_of(size);
  if (!fits(dv, size, charge)) return fail(cudaErrorMemoryAllocation);

  uint64_t serial = ++s.serial;
  char name[64];
  snprintf(name, sizeof name, "ql-emu-cuda:%d:%d:%llu", int(getpid()), d,
           (unsigned long long)serial);
  int fd = memfd_create(name, MFD_CLOEXEC);
  if (fd < 0) return fail(cudaErrorMemoryAllocation);
  void* p = MAP_FAILED;
  if (ftruncate(fd, off_t(size)) == 0)
    p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    close(fd);
    return fail(cudaErrorMemoryAllocation);
  }
  s.allocs[uintptr_t(p)] =
      Alloc{size, charge, d, fd, serial, false, 0, 0, 0, kRW};
  dv.used += charge;
  *devPtr = p;
  return cudaSuccess;
}

extern "C" cudaError_t cudaFree(void* devPtr) {
  Lock l;
  State& s = S();
  if (s.init_err != cudaSuccess) return fail(s.init_err);
  if (devPtr == nullptr) return cudaSuccess;
  auto it = s.allocs.find(uintptr_t(devPtr));
  // Imported memory and cuMemMap mappings are not cudaMalloc's to free.
  if (it == s.allocs.end() || it->second.imported || it->second.vmm != 0)
    return fail(cudaErrorInvalidDevicePointer);
  Alloc a = it->second;
  land(s.dev[a.dev]);  // cudaFree synchronizes the device
  s.allocs.erase(it);
  munmap(devPtr, a.size);
  close(a.fd);
  s.dev[a.dev].used -= a.charged;
  return fail(s.dev[a.dev].sticky ? cudaErrorIllegalAddress : cudaSuccess);
}

// Pinned host memory: page-aligned anonymous memory, tracked so that
// cudaFreeHost can refuse what it did not allocate.
extern "C" cudaError_t cudaHostAlloc(void** pHost, size_t size,
                                     unsigned int flags) {
  Lock l;
  State& s = S();
  if (s.init_err != cudaSuccess) return fail(s.init_err);
  if (pHost == nullptr ||
      (flags & ~unsigned(cudaHostAllocPortable | cudaHostAllocMapped |
                         cudaHostAllocWriteCombined)) != 0)
    return fail(cudaErrorInvalidValue);
  *pHost = nullptr;
  cudaError_t e = dev_ok(s, me().dev);
  if (e != cudaSuccess) return fail(e);
  if (size == 0) return cudaSuccess;
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return fail(cudaErrorMemoryAllocation);
  s.pinned[uintptr_t(p)] = size;
  *pHost = p;
  return cudaSuccess;
}

extern "C" cudaError_t cudaMallocHost(void** ptr, size_t size) {
  return cudaHostAlloc(ptr, size, cudaHostAllocDefault);
}

extern "C" cudaError_t cudaFreeHost(void* ptr) {
  Lock l;
  State& s = S();
  if (s.init_err != cudaSuccess) return fail(s.init_err);
  if (ptr == nullptr) return cudaSuccess;
  auto it = s.pinned.find(uintptr_t(ptr));
  if (it == s.pinned.end()) return fail(cudaErrorInvalidValue);
  munmap(ptr, it->second);
  s.pinned.erase(it);
  int d = me().dev;
  return fail(d < s.ndev && s.dev[d].sticky ? cudaErrorIllegalAddress
                                            : cudaSuccess);
}

extern "C" cudaError_t cudaHostRegister(void* ptr, size_t size,
                                        unsigned int flags) {
  Lock l;
  State& s = S();
  if (s.init_err != cudaSuccess) return fail(s.init_err);
  const unsigned known = cudaHostRegisterPortable | cudaHostRegisterMapped |
                         cudaHostRegisterIoMemory | cudaHostRegisterReadOnly;
  if (ptr == nullptr || size == 0 || (flags & ~known) != 0)
    return fail(cudaErrorInvalidValue);
  cudaError_t e = dev_ok(s, me().dev);
  if (e != cudaSuccess) return fail(e);
  if (overlaps(s.registered, uintptr_t(ptr), size) ||
      overlaps(s.pinned, uintptr_t(ptr), size))
    return fail(cudaErrorHostMemoryAlreadyRegistered);
  s.registered[uintptr_t(ptr)] = size;
  if (flags & cudaHostRegisterMapped) s.mapped.insert(uintptr_t(ptr));
  ++s.host_ever;
  write_host_stats(s);
  return cudaSuccess;
}

extern "C" cudaError_t cudaHostUnregister(void* ptr) {
  Lock l;
  State& s = S();
  if (s.init_err != cudaSuccess) return fail(s.init_err);
  if (s.registered.erase(uintptr_t(ptr)) == 0)
    return fail(cudaErrorHostMemoryNotRegistered);
  s.mapped.erase(uintptr_t(ptr));
  write_host_stats(s);
  int d = me().dev;
  return fail(d < s.ndev && s.dev[d].sticky ? cudaErrorIllegalAddress
                                            : cudaSuccess);
}

extern "C" cudaError_t cudaMemGetInfo(size_t* free, size_t* total) {
  Lock l;
  State& s = S();
  if (s.init_err != cudaSuccess) return fail(s.init_err);
  if (free == nullptr || total == nullptr) return fail(cudaErrorInvalidValue);
  int d = me().dev;
  cudaError_t e = dev_ok(s, d);
  if (e != cudaSuccess) return fail(e);
  const Device& dv = s.dev[d];
  *total = dv.total;
  *free = dv.used < dv.total ? dv.total - dv.used : 0;
  return cudaSuccess;
}

namespace {

// The checks of a copy on device d: the device sides named by kind must
// lie within device allocations (a GPU refuses a range it does not map),
// and none of the devices involved may have a sticky error. A device side
// the copy may not read, or write (a cuMemMap mapping without that
// access), is a fault of the copy engine: d takes a sticky error.
cudaError_t copy_args(State& s, int d, void* dst, const void* src,
                      size_t count, cudaMemcpyKind kind) {
  if (unsigned(kind) > unsigned(cudaMemcpyDefault))
    return cudaErrorInvalidMemcpyDirection;
  if (count == 0) return cudaSuccess;
  if (dst == nullptr || src == nullptr) return cudaErrorInvalidValue;
  int dd = -1, sd = -1;
  const int dp = dev_prot(s, dst, count, &dd), sp = dev_prot(s, src, count, &sd);
  if ((kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice) &&
      dp < 0)
    return cudaErrorInvalidValue;
  if ((kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice) &&
      sp < 0)
    return cudaErrorInvalidValue;
  if ((dd >= 0 && s.dev[dd].sticky) || (sd >= 0 && s.dev[sd].sticky))
    return cudaErrorIllegalAddress;
  if ((dp >= 0 && !(dp & PROT_WRITE)) || (sp >= 0 && !(sp & PROT_READ))) {
    s.dev[d].sticky = true;
    return cudaErrorIllegalAddress;
  }
  return cudaSuccess;
}

}  // namespace

// Synchronous: on the legacy default stream of the current device, so it
// waits for what that stream waits for (a hang: the watchdog's timeout).
extern "C" cudaError_t cudaMemcpy(void* dst, const void* src, size_t count,
                                  enum cudaMemcpyKind kind) {
  long ms;
  {
    Lock l;
    State& s = S();
    if (s.init_err != cudaSuccess) return fail(s.init_err);
    int d = me().dev;
    cudaError_t e = dev_ok(s, d);
    if (e == cudaSuccess) e = copy_args(s, d, dst, src, count, kind);
    if (e != cudaSuccess) return fail(e);
    Device& dv = s.dev[d];
    if (dv.hung && dv.legacy > dv.hang_seq) {
      ms = s.hang_ms;
    } else {
      ms = -1;
      land(dv);  // the stream is synchronized before the copy starts
      int dd = -1, sd = -1;
      if (s.late && count != 0 && dev_range(s, dst, count, &dd) &&
          !dev_range(s, src, count, &sd) &&
          !overlaps(s.pinned, uintptr_t(src), count) &&
          !overlaps(s.registered, uintptr_t(src), count)) {
        const unsigned char* b = static_cast<const unsigned char*>(src);
        s.dev[dd].late.emplace_back(dst,
                                    std::vector<unsigned char>(b, b + count));
        return cudaSuccess;
      }
    }
  }
  if (ms >= 0) return time_out(ms);
  if (count != 0) memmove(dst, src, count);
  return cudaSuccess;
}

extern "C" cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count,
                                       enum cudaMemcpyKind kind,
                                       cudaStream_t stream) {
  bool run;
  {
    Lock l;
    State& s = S();
    if (s.init_err != cudaSuccess) return fail(s.init_err);
    int d = stream_dev(s, stream);
    if (d < 0) return fail(cudaErrorInvalidResourceHandle);
    cudaError_t e = dev_ok(s, d);
    if (e == cudaSuccess) e = copy_args(s, d, dst, src, count, kind);
    if (e != cudaSuccess) return fail(e);
    if (count != 0 && (host_registered(s, src, count) ||
                       host_registered(s, dst, count)))
      ++s.host_copies;
    int dd = -1;
    if (count != 0 &&
        (!dev_range(s, src, count, &dd) || !dev_range(s, dst, count, &dd)))
      ++s.dma_copies;
    run = enqueue(s, stream, d);
  }
  if (run && count != 0) memmove(dst, src, count);
  return cudaSuccess;
}

extern "C" cudaError_t cudaMemsetAsync(void* devPtr, int value, size_t count,
                                       cudaStream_t stream) {
  bool run;
  {
    Lock l;
    State& s = S();
    if (s.init_err != cudaSuccess) return fail(s.init_err);
    int d = stream_dev(s, stream), pd = -1, prot = kRW;
    if (d < 0) return fail(cudaErrorInvalidResourceHandle);
    cudaError_t e = dev_ok(s, d);
    if (e == cudaSuccess && count != 0 &&
        (prot = dev_prot(s, devPtr, count, &pd)) < 0)
      e = cudaErrorInvalidValue;
    if (e == cudaSuccess && pd >= 0 && s.dev[pd].sticky)
      e = cudaErrorIllegalAddress;
    if (e == cudaSuccess && !(prot & PROT_WRITE)) {
      s.dev[d].sticky = true;  // a write the mapping does not allow
      e = cudaErrorIllegalAddress;
    }
    if (e != cudaSuccess) return fail(e);
    run = enqueue(s, stream, d);
  }
  if (run && count != 0) memset(devPtr, value, count);
  return cudaSuccess;
}

// ---------------------------------------------------- streams and events

namespace {

// The host-function thread: runs each queued call once it is due, in the
// order of (due time, enqueue), without the lock.
void* host_main(void*) {
  State& s = S();
  std::unique_lock<std::mutex> lk(s.mu);
  for (;;) {
    if (s.host_q.empty()) {
      s.host_cv.wait(lk);
      continue;
    }
    auto it = s.host_q.begin();
    uint64_t now = mono_ns();
    if (it->first.first > now) {
      s.host_cv.wait_for(lk, std::chrono::nanoseconds(it->first.first - now));
      continue;
    }
    HostCall c = it->second;
    s.host_q.erase(it);
    lk.unlock();
    c.fn(c.data);
    lk.lock();
  }
  return nullptr;
}

}  // namespace

extern "C" cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn,
                                          void* userData) {
  Lock l;
  State& s = S();
  if (s.init_err != cudaSuccess) return fail(s.init_err);
  if (fn == nullptr) return fail(cudaErrorInvalidValue);
  int d = stream_dev(s, stream);
  if (d < 0) return fail(cudaErrorInvalidResourceHandle);
  cudaError_t e = dev_ok(s, d);
  if (e != cudaSuccess) return fail(e);
  if (!s.host_thread) {
    pthread_t t;
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(&t, &at, host_main, nullptr);
    pthread_attr_destroy(&at);
    if (rc != 0) return fail(cudaErrorMemoryAllocation);
    s.host_thread = true;
  }
  // Behind a hang it never runs: the work before it never completes.
  if (!enqueue(s, stream, d)) return cudaSuccess;
  uint64_t due = stream != nullptr ? stream->ready_ns : 0;
  s.host_q.emplace(std::make_pair(due, ++s.host_n), HostCall{fn, userData});
  s.host_cv.notify_one();
  return cudaSuccess;
}

extern "C" cudaError_t cudaStreamCreateWithPriority(cudaStream_t* pStream,
                                                    unsigned int flags,
                                                    int priority) {
  Lock l;
  State& s = S();
  if (s.init_err != cudaSuccess) return fail(s.init_err);
  if (pStream == nullptr || (flags & ~unsigned(cudaStreamNonBlocking)) != 0)
    return fail(cudaErrorInvalidValue);
  int d = me().dev;
  cudaError_t e = dev_ok(s, d);
  if (e != cudaSuccess) return fail(e);
  // Clamped into the range, as the runtime does.
  if (priority > kLeastPriority) priority = kLeastPriority;
  if (priority < kGreatestPriority) priority = kGreatestPriority;
  ql_emu_stream* st = new ql_emu_stream{d, flags, priority, {}, false, 0};
  s.streams.insert(st);
  *pStream = st;
  return cudaSuccess;
}

extern "C" cudaError_t cudaStreamCreateWithFlags(cudaStream_t* pStream,
                                                 unsigned int flags) {
  return cudaStreamCreateWithPriority(pStream, flags, 0);
}

extern "C" cudaError_t cudaDeviceGetStreamPriorityRange(int* leastPriority,
                                                        int* greatestPriority) {
  Lock l;
  State& s = S();
  if (s.init_err != cudaSuccess) return fail(s.init_err);
  if (leastPriority != nullptr) *leastPriority = kLeastPriority;
  if (greatestPriority != nullptr) *greatestPriority = kGreatestPriority;
  return cudaSuccess;
}

extern "C" cudaError_t cudaHostGetDevicePointer(void** pDevice, void* pHost,
                                                unsigned int flags) {
  Lock l;
  State& s = S();
  if (s.init_err != cudaSuccess) return fail(s.init_err);
  if (pDevice == nullptr || flags != 0 || !host_mapped(s, pHost, 1))
    return fail(cudaErrorInvalidValue);
  *pDevice = pHost;
  return cudaSuccess;
}

extern "C" cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  Lock l;
  State& s = S();
  if (s.init_err != cudaSuccess) return fail(s.init_err);
  if (stream == nullptr || s.streams.erase(stream) == 0)
    return fail(cudaErrorInvalidResourceHandle);
  int d = stream->dev;
  stream_idle(s, stream);
  delete stream;
  return fail(s.dev[d].sticky ? cudaErrorIllegalAddress : cudaSuccess);
}

namespace {

// The common part of the stream and event queries and waits: the device's
// error, or whether deps[] waits on stopped work (*stuck).
cudaError_t dep_state(const State& s, int d, const long* deps, bool* stuck) {
  cudaError_t e = dev_ok(s, d);
  *stuck = e == cudaSuccess && blocked(s, deps);
  return e;
}

enum class Wait { kQuery, kSync };

cudaError_t stream_wait(cudaStream_t stream, Wait how) {
  long ms;
  {
    Lock l;
    State& s = S();
    if (s.init_err != cudaSuccess) return fail(s.init_err);
    int d = stream_dev(s, stream);
    if (d < 0) return fail(cudaErrorInvalidResourceHandle);
    long deps[kMaxDevices] = {};
    bool stuck;
    if (d < s.ndev && (stream == nullptr ||
                       (stream->flags & cudaStreamNonBlocking) == 0))
      land(s.dev[d]);
    if (d < s.ndev) deps_of(s, stream, d, deps);
    cudaError_t e = dep_state(s, d, deps, &stuck);
    if (e != cudaSuccess) return fail(e);
    if (!stuck) {
      // QL_EMU_CUDA_KERNEL_MS: a query before the last launch's time is
      // up says not ready (a synchronize returns at once: work ran).
      if (how == Wait::kQuery && stream != nullptr &&
          mono_ns() < stream->ready_ns)
        return cudaErrorNotReady;
      stream_idle(s, stream);
      return cudaSuccess;
    }
    if (how == Wait::kQuery) return cudaErrorNotReady;  // not an error
    ms = s.hang_ms;
  }
  return time_out(ms);
}

cudaError_t event_wait(cudaEvent_t event, Wait how) {
  long ms;
  {
    Lock l;
    State& s = S();
    if (s.init_err != cudaSuccess) return fail(s.init_err);
    if (event == nullptr || s.events.count(event) == 0)
      return fail(cudaErrorInvalidResourceHandle);
    bool stuck;
    cudaError_t e = dep_state(s, event->dev, event->seq, &stuck);
    if (e != cudaSuccess) return fail(e);
    if (!stuck) return cudaSuccess;
    if (how == Wait::kQuery) return cudaErrorNotReady;
    ms = s.hang_ms;
  }
  return time_out(ms);
}

}  // namespace

extern "C" cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  return stream_wait(stream, Wait::kSync);
}

extern "C" cudaError_t cudaStreamQuery(cudaStream_t stream) {
  return stream_wait(stream, Wait::kQuery);
}

extern "C" cudaError_t cudaStreamWaitEvent(cudaStream_t stream,
                                           cudaEvent_t event,
                                           unsigned int flags) {
  Lock l;
  State& s = S();
  if (s.init_err != cudaSuccess) return fail(s.init_err);
  int d = stream_dev(s, stream);
  if (d < 0 || event == nullptr || s.events.count(event) == 0)
    return fail(cudaErrorInvalidResourceHandle);
  if (flags != cudaEventWaitDefault) return fail(cudaErrorInvalidValue);
  cudaError_t e = dev_ok(s, d);
  if (e != cudaSuccess) return fail(e);
  if (stream != nullptr) {
    for (int i = 0; i < kMaxDevices; ++i)
      if (event->seq[i] > stream->last[i]) stream->last[i] = event->seq[i];
  } else if (event->seq[d] > s.dev[d].legacy) {
    s.dev[d].legacy = event->seq[d];
  }
  return cudaSuccess;
}

extern "C" cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event,
                                                unsigned int flags) {
  Lock l;
  State& s = S();
  if (s.init_err != cudaSuccess) return fail(s.init_err);
  const unsigned known =
      cudaEventBlockingSync | cudaEventDisableTiming | cudaEventInterprocess;
  // An interprocess event must disable timing (driver_types.h).
  if (event == nullptr || (flags & ~known) != 0 ||
      ((flags & cudaEventInterprocess) && !(flags & cudaEventDisableTiming)))
    return fail(cudaErrorInvalidValue);
  int d = me().dev;
  cudaError_t e = dev_ok(s, d);
  if (e != cudaSuccess) return fail(e);
  ql_emu_event* ev = new ql_emu_event{
      d, flags, {}, false, 0,
      (flags & cudaEventInterprocess) ? ++s.event_serial : 0};
  s.events.insert(ev);
  *event = ev;
  return cudaSuccess;
}

extern "C" cudaError_t cudaEventDestroy(cudaEvent_t event) {
  Lock l;
  State& s = S();
  if (s.init_err != cudaSuccess) return fail(s.init_err);
  if (event == nullptr || s.events.erase(event) == 0)
    return fail(cudaErrorInvalidResourceHandle);
  int d = event->dev;
  delete event;
  return fail(s.dev[d].sticky ? cudaErrorIllegalAddress : cudaSuccess);
}

// The event and the stream must belong to the same device
// (cuda_runtime_api.h, cudaEventRecord: "same CUDA context").
extern "C" cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  Lock l;
  State& s = S();
  if (s.init_err != cudaSuccess) return fail(s.init_err);
  int d = stream_dev(s, stream);
  if (d < 0 || event == nullptr || s.events.count(event) == 0 ||
      event->dev != d)
    return fail(cudaErrorInvalidResourceHandle);
  cudaError_t e = dev_ok(s, d);
  if (e != cudaSuccess) return fail(e);
  deps_of(s, stream, d, event->seq);
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  event->ns = uint64_t(ts.tv_sec) * 1000000000u + uint64_t(ts.tv_nsec);
  event->recorded = true;
  return cudaSuccess;
}

extern "C" cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start,
                                            cudaEvent_t end) {
  if (ms == nullptr) return fail(cudaErrorInvalidValue);
  {
    Lock l;
    State& s = S();
    if (s.init_err != cudaSuccess) return fail(s.init_err);
    if (start == nullptr || end == nullptr || s.events.count(start) == 0 ||
        s.events.count(end) == 0 || !start->recorded || !end->recorded ||
        start->dev != end->dev ||
        ((start->flags | end->flags) & cudaEventDisableTiming))
      return fail(cudaErrorInvalidResourceHandle);
  }
  cudaError_t e;
  if ((e = event_wait(start, Wait::kQuery)) != cudaSuccess ||
      (e = event_wait(end, Wait::kQuery)) != cudaSuccess)
    return e;
  *ms = float(double(int64_t(end->ns - start->ns)) / 1e6);
  return cudaSuccess;
}

extern "C" cudaError_t cudaEventQuery(cudaEvent_t event) {
  return event_wait(event, Wait::kQuery);
}

extern "C" cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  return event_wait(event, Wait::kSync);
}

// --------------------------------------------------------------- errors

// A sticky error of the current device is reported and never cleared; any
// other last error is cleared by cudaGetLastError.
extern "C" cudaError_t cudaGetLastError(void) {
  Lock l;
  State& s = S();
  if (s.init_err != cudaSuccess) return s.init_err;
  Thread& t = me();
  cudaError_t e = t.last;
  t.last = cudaSuccess;
  if (t.dev < s.ndev && s.dev[t.dev].sticky) return cudaErrorIllegalAddress;
  return e;
}

extern "C" cudaError_t cudaPeekAtLastError(void) {
  Lock l;
  State& s = S();
  if (s.init_err != cudaSuccess) return s.init_err;
  Thread& t = me();
  if (t.dev < s.ndev && s.dev[t.dev].sticky) return cudaErrorIllegalAddress;
  return t.last;
}

extern "C" const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
#define QL_EMU_CUDA_MSG(name, value, msg) \
  case name:                              \
    return msg;
    QL_EMU_CUDA_ERRORS(QL_EMU_CUDA_MSG)
#undef QL_EMU_CUDA_MSG
  }
  return "unrecognized error code";
}

extern "C" const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
#define QL_EMU_CUDA_NAME(name, value, msg) \
  case name:                               \
    return #name;
    QL_EMU_CUDA_ERRORS(QL_EMU_CUDA_NAME)
#undef QL_EMU_CUDA_NAME
  }
  return "unrecognized error code";
}

// ------------------------------------------------------------------ IPC

// The handle names the allocation that holds devPtr; the exported offset is
// kept for the importer's checks (cudaIpcOpenMemHandle returns the base).
extern "C" cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t* handle,
                                           void* devPtr) {
  Lock l;
  State& s = S();
  if (s.init_err != cudaSuccess) return fail(s.init_err);
  uintptr_t base;
  const Alloc* a =
      handle != nullptr ? find(s, uintptr_t(devPtr), &base) : nullptr;
  // cuMemMap memory is shared through cuMemExportToShareableHandle.
  if (a == nullptr || a->imported || a->vmm != 0)
    return fail(cudaErrorInvalidValue);
  if (s.dev[a->dev].sticky) return fail(cudaErrorIllegalAddress);
  IpcWire w;
  memset(&w, 0, sizeof w);
  w.magic = kIpcMagic;
  w.pid = int32_t(getpid());
  w.fd = a->fd;
  w.dev = a->dev;
  w.serial = a->serial;
  w.size = a->size;
  w.offset = uintptr_t(devPtr) - base;
  memset(handle, 0, sizeof *handle);
  memcpy(handle->reserved, &w, sizeof w);
  return cudaSuccess;
}

namespace {

// Maps the memfd that w names from its owner's descriptor table, after
// checking that the descriptor is still that allocation's memfd (its name
// carries the serial: a closed and reused descriptor number is refused).
cudaError_t ipc_map(const IpcWire& w, void** out) {
  char path[64], want[96], got[128];
  snprintf(path, sizeof path, "/proc/%d/fd/%d", int(w.pid), int(w.fd));
  int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) return cudaErrorMapBufferObjectFailed;
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  snprintf(want, sizeof want, "/memfd:ql-emu-cuda:%d:%d:%llu (deleted)",
           int(w.pid), int(w.dev), (unsigned long long)w.serial);
  ssize_t n = readlink(path, got, sizeof got - 1);
  struct stat sb;
  void* p = MAP_FAILED;
  if (n > 0) {
    got[n] = '\0';
    if (strcmp(got, want) == 0 && fstat(fd, &sb) == 0 &&
        uint64_t(sb.st_size) == w.size)
      p = mmap(nullptr, size_t(w.size), PROT_READ | PROT_WRITE, MAP_SHARED, fd,
               0);
  }
  close(fd);
  if (p == MAP_FAILED) return cudaErrorMapBufferObjectFailed;
  *out = p;
  return cudaSuccess;
}

}  // namespace

// Maps the allocation of another process (same uid) and returns its base.
// A handle of this very process is refused as the driver refuses it, with
// "invalid device context".
extern "C" cudaError_t cudaIpcOpenMemHandle(void** devPtr,
                                            cudaIpcMemHandle_t handle,
                                            unsigned int flags) {
  Lock l;
  State& s = S();
  if (s.init_err != cudaSuccess) return fail(s.init_err);
  if (devPtr == nullptr || flags != cudaIpcMemLazyEnablePeerAccess)
    return fail(cudaErrorInvalidValue);
  *devPtr = nullptr;
  int d = me().dev;
  cudaError_t e = dev_ok(s, d);
  if (e != cudaSuccess) return fail(e);
  IpcWire w;
  memcpy(&w, handle.reserved, sizeof w);
  if (w.magic != kIpcMagic || w.size == 0 || w.offset >= w.size || w.pid <= 0 ||
      w.fd < 0 || w.dev < 0 || w.dev >= kMaxDevices)
    return fail(cudaErrorInvalidResourceHandle);
  if (w.pid == int32_t(getpid())) return fail(cudaErrorDeviceUninitialized);
  for (auto& kv : s.allocs) {
    Alloc& a = kv.second;
    if (a.imported && a.pid == w.pid && a.serial == w.serial) {
      ++a.refs;
      *devPtr = reinterpret_cast<void*>(kv.first);
      return cudaSuccess;
    }
  }
  void* p;
  if ((e = ipc_map(w, &p)) != cudaSuccess) return fail(e);
  ++s.ipc_maps;
  s.allocs[uintptr_t(p)] =
      Alloc{size_t(w.size), 0, d, -1, w.serial, true, 1, int(w.pid), 0, kRW};
  *devPtr = p;
  return cudaSuccess;
}

extern "C" cudaError_t cudaIpcCloseMemHandle(void* devPtr) {
  Lock l;
  State& s = S();
  if (s.init_err != cudaSuccess) return fail(s.init_err);
  auto it = s.allocs.find(uintptr_t(devPtr));
  if (it == s.allocs.end() || !it->second.imported)
    return fail(cudaErrorInvalidValue);
  int d = it->second.dev;
  if (--it->second.refs == 0) {
    munmap(devPtr, it->second.size);
    s.allocs.erase(it);
  }
  return fail(s.dev[d].sticky ? cudaErrorIllegalAddress : cudaSuccess);
}

namespace {

// What a cudaIpcEventHandle_t holds.
struct IpcEventWire {
  uint32_t magic;
  int32_t pid;
  int32_t dev;
  uint64_t serial;
};
static_assert(sizeof(IpcEventWire) <= CUDA_IPC_HANDLE_SIZE,
              "IPC event handle layout");

}  // namespace

extern "C" cudaError_t cudaIpcGetEventHandle(cudaIpcEventHandle_t* handle,
                                             cudaEvent_t event) {
  Lock l;
  State& s = S();
  if (s.init_err != cudaSuccess) return fail(s.init_err);
  if (handle == nullptr) return fail(cudaErrorInvalidValue);
  if (event == nullptr || s.events.count(event) == 0 ||
      !(event->flags & cudaEventInterprocess))
    return fail(cudaErrorInvalidResourceHandle);
  if (s.dev[event->dev].sticky) return fail(cudaErrorIllegalAddress);
  IpcEventWire w;
  memset(&w, 0, sizeof w);
  w.magic = kIpcEventMagic;
  w.pid = int32_t(getpid());
  w.dev = event->dev;
  w.serial = event->serial;
  memset(handle, 0, sizeof *handle);
  memcpy(handle->reserved, &w, sizeof w);
  return cudaSuccess;
}

// The exporter's process must be alive (kill(pid, 0) finds it), as the
// driver needs the exporting context.
extern "C" cudaError_t cudaIpcOpenEventHandle(cudaEvent_t* event,
                                              cudaIpcEventHandle_t handle) {
  Lock l;
  State& s = S();
  if (s.init_err != cudaSuccess) return fail(s.init_err);
  if (event == nullptr) return fail(cudaErrorInvalidValue);
  int d = me().dev;
  cudaError_t e = dev_ok(s, d);
  if (e != cudaSuccess) return fail(e);
  IpcEventWire w;
  memcpy(&w, handle.reserved, sizeof w);
  bool zero_tail = true;
  for (size_t i = sizeof w; i < sizeof handle.reserved; ++i)
    zero_tail &= handle.reserved[i] == 0;
  if (w.magic != kIpcEventMagic || w.pid <= 0 || w.dev < 0 ||
      w.dev >= kMaxDevices || w.serial == 0 || !zero_tail)
    return fail(cudaErrorInvalidResourceHandle);
  if (w.pid == int32_t(getpid())) return fail(cudaErrorDeviceUninitialized);
  if (kill(pid_t(w.pid), 0) != 0 && errno != EPERM)
    return fail(cudaErrorInvalidResourceHandle);
  ql_emu_event* ev = new ql_emu_event{
      d, unsigned(cudaEventInterprocess | cudaEventDisableTiming), {}, false,
      0, 0};
  s.events.insert(ev);
  *event = ev;
  return cudaSuccess;
}

extern "C" cudaError_t cudaPointerGetAttributes(
    struct cudaPointerAttributes* attributes, const void* ptr) {
  Lock l;
  State& s = S();
  if (s.init_err != cudaSuccess) return fail(s.init_err);
  if (attributes == nullptr) return fail(cudaErrorInvalidValue);
  memset(attributes, 0, sizeof *attributes);
  attributes->device = -2;
  uintptr_t base;
  const Alloc* a = find(s, uintptr_t(ptr), &base);
  if (a != nullptr) {
    attributes->type = cudaMemoryTypeDevice;
    attributes->device = a->dev;
    attributes->devicePointer = const_cast<void*>(ptr);
    return cudaSuccess;
  }
  if (range_base(s.pinned, uintptr_t(ptr), 1) != 0) {
    attributes->type = cudaMemoryTypeHost;
    attributes->device = me().dev;
    attributes->hostPointer = const_cast<void*>(ptr);
    attributes->devicePointer = const_cast<void*>(ptr);
  }
  return cudaSuccess;
}

extern "C" cudaError_t cudaGetDriverEntryPointByVersion(
    const char* symbol, void** funcPtr, unsigned int cudaVersion,
    unsigned long long flags,
    enum cudaDriverEntryPointQueryResult* driverStatus) {
  if (symbol == nullptr || funcPtr == nullptr || flags != cudaEnableDefault)
    return fail(cudaErrorInvalidValue);
  *funcPtr = nullptr;
  // Each symbol with the CUDA version that introduced it.
  static const struct {
    const char* name;
    unsigned since;
    void* fn;
  } kEntries[] = {
      {"cuMemGetAddressRange", 3020,
       reinterpret_cast<void*>(&cuMemGetAddressRange)},
      {"cuDeviceGetAttribute", 2000,
       reinterpret_cast<void*>(&cuDeviceGetAttribute)},
      {"cuMemGetAllocationGranularity", 10020,
       reinterpret_cast<void*>(&cuMemGetAllocationGranularity)},
      {"cuMemCreate", 10020, reinterpret_cast<void*>(&cuMemCreate)},
      {"cuMemRelease", 10020, reinterpret_cast<void*>(&cuMemRelease)},
      {"cuMemAddressReserve", 10020,
       reinterpret_cast<void*>(&cuMemAddressReserve)},
      {"cuMemAddressFree", 10020, reinterpret_cast<void*>(&cuMemAddressFree)},
      {"cuMemMap", 10020, reinterpret_cast<void*>(&cuMemMap)},
      {"cuMemUnmap", 10020, reinterpret_cast<void*>(&cuMemUnmap)},
      {"cuMemSetAccess", 10020, reinterpret_cast<void*>(&cuMemSetAccess)},
      {"cuMemExportToShareableHandle", 10020,
       reinterpret_cast<void*>(&cuMemExportToShareableHandle)},
      {"cuMemImportFromShareableHandle", 10020,
       reinterpret_cast<void*>(&cuMemImportFromShareableHandle)},
  };
  cudaDriverEntryPointQueryResult r = cudaDriverEntryPointSymbolNotFound;
  for (const auto& e : kEntries) {
    if (strcmp(symbol, e.name) != 0) continue;
    if (cudaVersion >= e.since) {
      *funcPtr = e.fn;
      r = cudaDriverEntryPointSuccess;
    } else {
      r = cudaDriverEntryPointVersionNotSufficent;
    }
  }
  if (driverStatus != nullptr) *driverStatus = r;
  return cudaSuccess;
}

extern "C" CUresult cuMemGetAddressRange(CUdeviceptr* pbase, size_t* psize,
                                         CUdeviceptr dptr) {
  Lock l;
  State& s = S();
  if (s.init_err != cudaSuccess) return CUDA_ERROR_NOT_INITIALIZED;
  if (dptr == 0) return CUDA_ERROR_INVALID_VALUE;
  uintptr_t base;
  const Alloc* a = find(s, uintptr_t(dptr), &base);
  if (a == nullptr) return CUDA_ERROR_NOT_FOUND;
  if (s.dev[a->dev].sticky) return CUDA_ERROR_ILLEGAL_ADDRESS;
  if (pbase != nullptr) *pbase = CUdeviceptr(base);
  if (psize != nullptr) *psize = a->size;
  return CUDA_SUCCESS;
}

// ------------------------------------------ virtual memory management

namespace {

// What the calls that make something refuse first: no driver (or a
// malformed configuration), no device, no VMM (QL_EMU_CUDA_NOVMM).
CUresult vmm_ok(const State& s) {
  if (s.init_err != cudaSuccess) return CUDA_ERROR_NOT_INITIALIZED;
  if (s.ndev == 0) return CUDA_ERROR_NO_DEVICE;
  if (s.novmm) return CUDA_ERROR_NOT_SUPPORTED;
  return CUDA_SUCCESS;
}

// Properties this emulation makes memory for: pinned, on a device of this
// process, exportable as a descriptor or not at all, and no Windows
// metadata (cuda.h: "required to be zero" elsewhere). allocFlags are hints.
CUresult prop_ok(const State& s, const CUmemAllocationProp* prop) {
  if (prop == nullptr || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
      prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
      (prop->requestedHandleTypes != CU_MEM_HANDLE_TYPE_NONE &&
       prop->requestedHandleTypes != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) ||
      prop->win32HandleMetaData != nullptr)
    return CUDA_ERROR_INVALID_VALUE;
  if (prop->location.id < 0 || prop->location.id >= s.ndev)
    return CUDA_ERROR_INVALID_DEVICE;
  return CUDA_SUCCESS;
}

CUmemGenericAllocationHandle new_handle(State& s) {
  return kVmmTag | (++s.vmm_n & 0xffffffffu);
}

// The memory of handle h, when h is a handle the caller may still use.
Phys* live(State& s, CUmemGenericAllocationHandle h) {
  auto it = s.phys.find(h);
  return it == s.phys.end() || it->second.released ? nullptr : &it->second;
}

// Frees the memory of *it once nothing holds it any more.
void drop(State& s, std::map<CUmemGenericAllocationHandle, Phys>::iterator it) {
  const Phys& p = it->second;
  if (!p.released || p.maps > 0) return;
  close(p.fd);
  s.dev[p.dev].used -= p.charged;
  s.phys.erase(it);
}

// True when [p, p + n) meets an allocation or a mapping.
bool mapped_in(const State& s, uintptr_t p, size_t n) {
  auto it = s.allocs.lower_bound(p);
  if (it != s.allocs.end() && it->first - p < n) return true;
  if (it == s.allocs.begin()) return false;
  --it;
  return p - it->first < it->second.size;
}

using AllocIt = std::map<uintptr_t, Alloc>::iterator;

// The mappings that make up [p, p + n) exactly, back to back, into *out;
// false when the range is anything else (part of one, a gap, not VMM).
bool whole_maps(State& s, uintptr_t p, size_t n, std::vector<AllocIt>* out) {
  if (n == 0) return false;
  for (size_t done = 0; done < n;) {
    auto it = s.allocs.find(p + done);
    if (it == s.allocs.end() || it->second.vmm == 0 ||
        it->second.size > n - done)
      return false;
    out->push_back(it);
    done += it->second.size;
  }
  return true;
}

// Puts reservation space back where the mapping *it was, and frees its
// memory when that was the last hold on it. Late copies must have landed.
void unmap(State& s, AllocIt it) {
  void* at = reinterpret_cast<void*>(it->first);
  const size_t size = it->second.size;
  const CUmemGenericAllocationHandle h = it->second.vmm;
  if (mmap(at, size, PROT_NONE,
           MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1,
           0) == MAP_FAILED)
    munmap(at, size);  // a hole in the reservation, but the memfd let go
  s.allocs.erase(it);
  auto pi = s.phys.find(h);
  --pi->second.maps;
  drop(s, pi);
}

// Checks that fd is the memfd of a cuMemCreate allocation of this
// emulation (by its name, "ql-emu-cuda-vmm:<pid>:<dev>:<serial>", and that
// it is a sealable shmem file, which a pipe or a regular file is not), open
// read-write as export hands it out; gives its device and size.
CUresult vmm_fd(const State& s, int fd, int* dev, size_t* size) {
  char path[64], got[160];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  ssize_t n = readlink(path, got, sizeof got - 1);
  if (n <= 0) return CUDA_ERROR_INVALID_VALUE;
  got[n] = '\0';
  int pid, d, end = 0;
  unsigned long long serial;
  struct stat sb;
  if (sscanf(got, "/memfd:ql-emu-cuda-vmm:%d:%d:%llu (deleted)%n", &pid, &d,
             &serial, &end) != 3 ||
      end != int(n) || (fcntl(fd, F_GETFL) & O_ACCMODE) != O_RDWR ||
      fcntl(fd, F_GET_SEALS) < 0 || fstat(fd, &sb) != 0 ||
      !S_ISREG(sb.st_mode) || sb.st_size <= 0)
    return CUDA_ERROR_INVALID_VALUE;
  // Ordinals name the same emulated device in every process.
  if (d < 0 || d >= s.ndev) return CUDA_ERROR_NOT_SUPPORTED;
  if (s.dev[d].sticky) return CUDA_ERROR_ILLEGAL_ADDRESS;
  *dev = d;
  *size = size_t(sb.st_size);
  return CUDA_SUCCESS;
}

bool other_os_handle(CUmemAllocationHandleType t) {
  return t == CU_MEM_HANDLE_TYPE_WIN32 || t == CU_MEM_HANDLE_TYPE_WIN32_KMT ||
         t == CU_MEM_HANDLE_TYPE_FABRIC;
}

}  // namespace

// Attributes need no context: a device with a sticky error answers too.
extern "C" CUresult cuDeviceGetAttribute(int* pi, CUdevice_attribute attrib,
                                         CUdevice dev) {
  Lock l;
  State& s = S();
  if (s.init_err != cudaSuccess) return CUDA_ERROR_NOT_INITIALIZED;
  if (pi == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (s.ndev == 0) return CUDA_ERROR_NO_DEVICE;
  if (dev < 0 || dev >= s.ndev) return CUDA_ERROR_INVALID_DEVICE;
  switch (attrib) {
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED:
      *pi = s.novmm ? 0 : 1;
      return CUDA_SUCCESS;
    default:
      return attribute(s, int(attrib), dev, pi) ? CUDA_SUCCESS
                                                : CUDA_ERROR_INVALID_VALUE;
  }
}

// QL_EMU_CUDA_VMM_GRANULARITY for either option. A real H100 says 2 MiB
// (both minimum and recommended); the default here is smaller so that
// tests map many allocations cheaply.
extern "C" CUresult cuMemGetAllocationGranularity(
    size_t* granularity, const CUmemAllocationProp* prop,
    CUmemAllocationGranularity_flags option) {
  Lock l;
  State& s = S();
  CUresult r = vmm_ok(s);
  if (r != CUDA_SUCCESS) return r;
  if (granularity == nullptr || prop_ok(s, prop) != CUDA_SUCCESS ||
      (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM &&
       option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED))
    return CUDA_ERROR_INVALID_VALUE;
  *granularity = s.gran;
  return CUDA_SUCCESS;
}

// A memfd (as cudaMalloc's, but named "ql-emu-cuda-vmm:...", so that an
// import can tell it from anything else), charged to its device as
// cudaMalloc charges; not mapped anywhere yet.
extern "C" CUresult cuMemCreate(CUmemGenericAllocationHandle* handle,
                                size_t size, const CUmemAllocationProp* prop,
                                unsigned long long flags) {
  Lock l;
  State& s = S();
  CUresult r = vmm_ok(s);
  if (r != CUDA_SUCCESS) return r;
  if (handle == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if ((r = prop_ok(s, prop)) != CUDA_SUCCESS) return r;
  if (size == 0 || size % s.gran != 0) return CUDA_ERROR_INVALID_VALUE;
  const int d = prop->location.id;
  Device& dv = s.dev[d];
  if (dv.sticky) return CUDA_ERROR_ILLEGAL_ADDRESS;
  const size_t charge = charge_of(size);
  if (!fits(dv, size, charge)) return CUDA_ERROR_OUT_OF_MEMORY;
  char name[64];
  snprintf(name, sizeof name, "ql-emu-cuda-vmm:%d:%d:%llu", int(getpid()), d,
           (unsigned long long)++s.serial);
  int fd = memfd_create(name, MFD_CLOEXEC);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  if (ftruncate(fd, off_t(size)) != 0) {
    close(fd);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  const CUmemGenericAllocationHandle h = new_handle(s);
  s.phys[h] = Phys{size,
                   charge,
                   d,
                   fd,
                   prop->requestedHandleTypes ==
                       CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                   false,
                   0};
  dv.used += charge;
  *handle = h;
  return CUDA_SUCCESS;
}

// Allowed while mapped (as in CUDA): the memory then goes with the last
// unmap. The handle is gone at once.
extern "C" CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  Lock l;
  State& s = S();
  if (s.init_err != cudaSuccess) return CUDA_ERROR_NOT_INITIALIZED;
  auto it = s.phys.find(handle);
  if (it == s.phys.end() || it->second.released)
    return CUDA_ERROR_INVALID_VALUE;
  const int d = it->second.dev;
  it->second.released = true;
  drop(s, it);
  return s.dev[d].sticky ? CUDA_ERROR_ILLEGAL_ADDRESS : CUDA_SUCCESS;
}

// Address space and nothing else: anonymous PROT_NONE memory that commits
// nothing, over-reserved by the alignment and trimmed to it. The hint is
// not followed (CUDA may ignore it too).
extern "C" CUresult cuMemAddressReserve(CUdeviceptr* ptr, size_t size,
                                        size_t alignment, CUdeviceptr addr,
                                        unsigned long long flags) {
  Lock l;
  State& s = S();
  CUresult r = vmm_ok(s);
  if (r != CUDA_SUCCESS) return r;
  if (ptr == nullptr || size == 0 || size % s.gran != 0 ||
      (alignment & (alignment - 1)) != 0 || addr % s.page != 0 || flags != 0)
    return CUDA_ERROR_INVALID_VALUE;
  const size_t align = std::max(alignment, s.gran);
  if (size > SIZE_MAX - align) return CUDA_ERROR_OUT_OF_MEMORY;
  const size_t span = size + align;
  void* m = mmap(nullptr, span, PROT_NONE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  const uintptr_t lo = uintptr_t(m), base = (lo + align - 1) & ~(align - 1);
  if (base > lo) munmap(m, base - lo);
  munmap(reinterpret_cast<void*>(base + size), lo + span - (base + size));
  s.reserved[base] = size;
  *ptr = CUdeviceptr(base);
  return CUDA_SUCCESS;
}

// Only a whole reservation with nothing mapped in it: CUDA leaves freeing
// one with mappings undefined, so it is refused here.
extern "C" CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  Lock l;
  State& s = S();
  if (s.init_err != cudaSuccess) return CUDA_ERROR_NOT_INITIALIZED;
  auto it = s.reserved.find(uintptr_t(ptr));
  if (it == s.reserved.end() || it->second != size ||
      mapped_in(s, uintptr_t(ptr), size))
    return CUDA_ERROR_INVALID_VALUE;
  munmap(reinterpret_cast<void*>(uintptr_t(ptr)), size);
  s.reserved.erase(it);
  return CUDA_SUCCESS;
}

// The memfd over [ptr, ptr + size) of a reservation, from its start
// (offset must be 0, as in CUDA 13), with no access until cuMemSetAccess.
extern "C" CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                             CUmemGenericAllocationHandle handle,
                             unsigned long long flags) {
  Lock l;
  State& s = S();
  if (s.init_err != cudaSuccess) return CUDA_ERROR_NOT_INITIALIZED;
  const uintptr_t p = uintptr_t(ptr);
  const Phys* ph = live(s, handle);
  if (offset != 0 || flags != 0 || size == 0 || size % s.gran != 0 ||
      p % s.gran != 0 || ph == nullptr || size > ph->size ||
      range_base(s.reserved, p, size) == 0 || mapped_in(s, p, size))
    return CUDA_ERROR_INVALID_VALUE;
  if (s.dev[ph->dev].sticky) return CUDA_ERROR_ILLEGAL_ADDRESS;
  void* at = reinterpret_cast<void*>(p);
  if (mmap(at, size, PROT_NONE, MAP_SHARED | MAP_FIXED, ph->fd, 0) ==
      MAP_FAILED) {
    // MAP_FIXED may have taken the reservation's pages away: put them back.
    mmap(at, size, PROT_NONE,
         MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  s.allocs[p] = Alloc{size, 0, ph->dev, -1, 0, false, 0, 0, handle, PROT_NONE};
  s.phys[handle].maps++;
  return CUDA_SUCCESS;
}

// Synchronous, as in CUDA: late copies land before the pages go.
extern "C" CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
  Lock l;
  State& s = S();
  if (s.init_err != cudaSuccess) return CUDA_ERROR_NOT_INITIALIZED;
  std::vector<AllocIt> maps;
  if (!whole_maps(s, uintptr_t(ptr), size, &maps))
    return CUDA_ERROR_INVALID_VALUE;
  for (Device& dv : s.dev) land(dv);
  bool sticky = false;
  for (AllocIt it : maps) {
    sticky |= s.dev[it->second.dev].sticky;
    unmap(s, it);
  }
  return sticky ? CUDA_ERROR_ILLEGAL_ADDRESS : CUDA_SUCCESS;
}

// One address space serves every device here, so the mappings get the
// widest access any descriptor asks for. PROT_NONE is refused: access is
// not revoked this way (unmap instead).
extern "C" CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size,
                                   const CUmemAccessDesc* desc, size_t count) {
  Lock l;
  State& s = S();
  if (s.init_err != cudaSuccess) return CUDA_ERROR_NOT_INITIALIZED;
  if (desc == nullptr || count == 0) return CUDA_ERROR_INVALID_VALUE;
  int prot = 0;
  for (size_t i = 0; i < count; ++i) {
    if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE)
      return CUDA_ERROR_INVALID_VALUE;
    if (desc[i].location.id < 0 || desc[i].location.id >= s.ndev)
      return CUDA_ERROR_INVALID_DEVICE;
    if (desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READ)
      prot |= PROT_READ;
    else if (desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
      prot |= kRW;
    else
      return CUDA_ERROR_INVALID_VALUE;
  }
  std::vector<AllocIt> maps;
  if (!whole_maps(s, uintptr_t(ptr), size, &maps))
    return CUDA_ERROR_INVALID_VALUE;
  for (AllocIt it : maps)
    if (s.dev[it->second.dev].sticky) return CUDA_ERROR_ILLEGAL_ADDRESS;
  for (Device& dv : s.dev) land(dv);  // none may land in a read-only page
  for (AllocIt it : maps) {
    if (mprotect(reinterpret_cast<void*>(it->first), it->second.size, prot) !=
        0)
      return CUDA_ERROR_OUT_OF_MEMORY;
    it->second.prot = prot;
  }
  return CUDA_SUCCESS;
}

// A dup of the memfd (close-on-exec), the caller's to close; another
// process that gets it (SCM_RIGHTS, or inherited) imports it.
extern "C" CUresult cuMemExportToShareableHandle(
    void* shareableHandle, CUmemGenericAllocationHandle handle,
    CUmemAllocationHandleType handleType, unsigned long long flags) {
  Lock l;
  State& s = S();
  if (s.init_err != cudaSuccess) return CUDA_ERROR_NOT_INITIALIZED;
  const Phys* ph = live(s, handle);
  if (shareableHandle == nullptr || flags != 0 || ph == nullptr)
    return CUDA_ERROR_INVALID_VALUE;
  if (other_os_handle(handleType)) return CUDA_ERROR_NOT_SUPPORTED;
  if (handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || !ph->posix)
    return CUDA_ERROR_INVALID_VALUE;
  if (s.dev[ph->dev].sticky) return CUDA_ERROR_ILLEGAL_ADDRESS;
  int fd = fcntl(ph->fd, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;  // out of descriptors
  *static_cast<int*>(shareableHandle) = fd;
  return CUDA_SUCCESS;
}

// A new handle to the memory behind the descriptor, holding a dup of it
// (the caller keeps and closes its own). Not charged here: the memory is
// the exporter's, on the device its memfd names.
extern "C" CUresult cuMemImportFromShareableHandle(
    CUmemGenericAllocationHandle* handle, void* osHandle,
    CUmemAllocationHandleType shHandleType) {
  Lock l;
  State& s = S();
  CUresult r = vmm_ok(s);
  if (r != CUDA_SUCCESS) return r;
  if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (other_os_handle(shHandleType)) return CUDA_ERROR_NOT_SUPPORTED;
  const intptr_t raw = intptr_t(osHandle);
  if (shHandleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || raw < 0 ||
      raw > INT_MAX)
    return CUDA_ERROR_INVALID_VALUE;
  int fd = fcntl(int(raw), F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return CUDA_ERROR_INVALID_VALUE;
  int d;
  size_t size;
  // Checked on the dup, which cannot change under us as the number can.
  if ((r = vmm_fd(s, fd, &d, &size)) != CUDA_SUCCESS) {
    close(fd);
    return r;
  }
  const CUmemGenericAllocationHandle h = new_handle(s);
  s.phys[h] = Phys{size, 0, d, fd, true, false, 0};
  *handle = h;
  return CUDA_SUCCESS;
}

// ------------------------------------------------- launches and controls

extern "C" int ql__emu_cuda_launch(cudaStream_t stream) {
  Lock l;
  State& s = S();
  int d = s.init_err != cudaSuccess ? -1 : stream_dev(s, stream);
  cudaError_t e = s.init_err != cudaSuccess ? s.init_err
                  : d < 0                   ? cudaErrorInvalidResourceHandle
                                            : dev_ok(s, d);
  if (e != cudaSuccess) {
    fail(e);
    return 0;
  }
  if (!enqueue(s, stream, d)) return 0;
  if (stream != nullptr && s.kernel_ms > 0)
    stream->ready_ns = mono_ns() + uint64_t(s.kernel_ms) * 1000000u;
  ++s.dev[d].launches;
  if (stream != nullptr && stream->priority < 0) ++s.dev[d].hi_launches;
  return 1;
}

extern "C" int ql__emu_cuda_access(cudaStream_t stream, const void* p,
                                   size_t n) {
  Lock l;
  State& s = S();
  int dd = -1;
  // A read-only mapping passes: a kernel's write through it then faults
  // (SIGSEGV), as the GPU's would. One without access fails here.
  if (n == 0 || dev_prot(s, p, n, &dd) > 0 || host_mapped(s, p, n)) return 1;
  int d = s.init_err != cudaSuccess ? -1 : stream_dev(s, stream);
  if (d >= 0) s.dev[d].sticky = true;  // what the GPU's MMU makes of it
  return 0;
}

extern "C" void ql_emu_cuda_inject(int dev, long after, int kind) {
  if (dev < 0 || dev >= kMaxDevices || after < 0 || kind < QL_EMU_FAULT_NONE ||
      kind > QL_EMU_FAULT_OOM) {
    fprintf(stderr, "ql_emu_cuda_inject(%d, %ld, %d): bad argument\n", dev,
            after, kind);
    abort();
  }
  Lock l;
  arm(S().dev[dev], after, kind);
}

extern "C" void ql_emu_cuda_reset(void) {
  Lock l;
  State& s = S();
  s.epoch.fetch_add(1, std::memory_order_acq_rel);
  configure(s);
}

extern "C" void ql_emu_cuda_late_copies(int on) {
  Lock l;
  S().late = on != 0;
}

extern "C" long ql_emu_cuda_launches(int dev) {
  if (dev < 0 || dev >= kMaxDevices) return -1;
  Lock l;
  return S().dev[dev].launches;
}

extern "C" long ql_emu_cuda_priority_launches(int dev) {
  if (dev < 0 || dev >= kMaxDevices) return -1;
  Lock l;
  return S().dev[dev].hi_launches;
}

extern "C" long ql_emu_cuda_dma_copies(void) {
  Lock l;
  return S().dma_copies;
}

extern "C" long ql_emu_cuda_ipc_maps(void) {
  Lock l;
  return S().ipc_maps;
}

extern "C" long ql_emu_cuda_ipc_mapped_in(int pid, const void* devPtr) {
  char want[160], path[64], line[512];
  {
    Lock l;
    State& s = S();
    uintptr_t base;
    const Alloc* a = find(s, uintptr_t(devPtr), &base);
    if (a == nullptr || a->imported) return -1;
    if (a->vmm != 0) {
      // The memfd's own name, whoever made it (" (deleted)" cut off).
      char got[128];
      snprintf(path, sizeof path, "/proc/self/fd/%d", s.phys.at(a->vmm).fd);
      ssize_t n = readlink(path, got, sizeof got - 1);
      if (n <= 0) return -1;
      got[n] = '\0';
      if (char* sp = strchr(got, ' ')) *sp = '\0';
      snprintf(want, sizeof want, "%s ", got);
    } else {
      snprintf(want, sizeof want, "/memfd:ql-emu-cuda:%d:%d:%llu ",
               int(getpid()), a->dev, (unsigned long long)a->serial);
    }
  }
  snprintf(path, sizeof path, "/proc/%d/maps", pid);
  FILE* f = fopen(path, "re");
  if (f == nullptr) return -1;
  long n = 0;
  while (fgets(line, sizeof line, f) != nullptr)
    if (strstr(line, want) != nullptr) ++n;
  fclose(f);
  return n;
}

extern "C" long ql_emu_cuda_vmm_live(void) {
  Lock l;
  return long(S().phys.size());
}

extern "C" long ql_emu_cuda_host_ranges(void) {
  Lock l;
  return long(S().registered.size());
}

extern "C" long ql_emu_cuda_host_copies(void) {
  Lock l;
  return S().host_copies;
}

extern "C" long ql_emu_cuda_work(int dev) {
  if (dev < 0 || dev >= kMaxDevices) return -1;
  Lock l;
  const Device& d = S().dev[dev];
  return d.seq - d.seq_base;
}
