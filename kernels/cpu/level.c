/*
 * level.c - which instruction level the CPU backend runs at (cpu.h).
 *
 * Detected once per process from CPUID and XCR0 (detect() below).
 * QL_CPU_LEVEL lowers it so that every level can be tested on one
 * machine.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

#include "cpu.h"

static pthread_once_t level_once = PTHREAD_ONCE_INIT;
static ql__cpu_level level_detected, level_active;
static int has_avx_vnni; /* AVX-VNNI (VEX), which AVX-512 VNNI does not imply */

static const char *const level_names[QL_CPU_LEVEL_COUNT] = {
    [QL_CPU_LEVEL_C] = "c",
    [QL_CPU_LEVEL_AVX2] = "avx2",
    [QL_CPU_LEVEL_AVX2_VNNI] = "avx2vnni",
    [QL_CPU_LEVEL_AVX512] = "avx512",
};

#if defined(__x86_64__)
/* Bit b of a CPUID register, by leaf and subleaf (0 when the leaf is out
 * of range). */
static int cpuid_bit(unsigned leaf, unsigned sub, int reg, int b) {
  unsigned r[4];
  if (__get_cpuid_max(leaf & 0x80000000u, NULL) < leaf)
    return 0;
  __cpuid_count(leaf, sub, r[0], r[1], r[2], r[3]);
  return (int)((r[reg] >> b) & 1u);
}

/* XCR0: the register state the kernel saves on a context switch. */
static uint64_t xcr0(void) {
  unsigned lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return ((uint64_t)hi << 32) | lo;
}
#endif

/*
 * CPUID directly (the features by their documented bits, Intel SDM vol. 2,
 * CPUID), not __builtin_cpu_supports: clang 14 knows neither "f16c" nor
 * "avxvnni" there. XCR0 must show the YMM state (bits 1-2) for AVX2 and
 * the opmask and ZMM state (bits 5-7) too for AVX-512, so a kernel that
 * does not save that state does not get that code.
 */
static ql__cpu_level detect(void) {
#if defined(__x86_64__)
  enum { EAX, EBX, ECX, EDX };
  if (!cpuid_bit(1, 0, ECX, 27)) /* OSXSAVE: xgetbv is there */
    return QL_CPU_LEVEL_C;
  uint64_t x = xcr0();
  int ymm = (x & 0x6) == 0x6, zmm = (x & 0xe6) == 0xe6;
  int avx2 = ymm && cpuid_bit(1, 0, ECX, 28) /* AVX */ &&
             cpuid_bit(1, 0, ECX, 12) /* FMA */ &&
             cpuid_bit(1, 0, ECX, 29) /* F16C */ &&
             cpuid_bit(7, 0, EBX, 5) /* AVX2 */;
  has_avx_vnni = avx2 && cpuid_bit(7, 1, EAX, 4) /* AVX-VNNI */;
  if (avx2 && zmm && cpuid_bit(7, 0, EBX, 16) /* AVX512F */ &&
      cpuid_bit(7, 0, EBX, 30) /* AVX512BW */ &&
      cpuid_bit(7, 0, EBX, 31) /* AVX512VL */ &&
      cpuid_bit(7, 0, ECX, 11) /* AVX512_VNNI */)
    return QL_CPU_LEVEL_AVX512;
  if (has_avx_vnni)
    return QL_CPU_LEVEL_AVX2_VNNI;
  if (avx2)
    return QL_CPU_LEVEL_AVX2;
#endif
  return QL_CPU_LEVEL_C;
}

/*
 * The level a cap of want gives on this machine: want, or the detected one
 * when lower. Levels are ordered, but AVX-512 VNNI does not imply AVX-VNNI
 * (AMD Zen 4 has the first and not the second), so a cap at avx2vnni on
 * such a machine runs avx2.
 */
static ql__cpu_level capped(ql__cpu_level want) {
  if (want >= level_detected)
    return level_detected;
  if (want == QL_CPU_LEVEL_AVX2_VNNI && !has_avx_vnni)
    return QL_CPU_LEVEL_AVX2;
  return want;
}

static void level_init(void) {
  const char *e = getenv("QL_CPU_LEVEL");
  level_detected = level_active = detect();
  if (e == NULL)
    return;
  for (int l = 0; l < QL_CPU_LEVEL_COUNT; l++)
    if (strcmp(e, level_names[l]) == 0) {
      if (capped((ql__cpu_level)l) < level_active)
        level_active = capped((ql__cpu_level)l);
      return;
    }
}

int ql__cpu_level_set(const char *name) {
  pthread_once(&level_once, level_init);
  if (name == NULL || strcmp(name, "auto") == 0)
    return 0;
  for (int l = 0; l < QL_CPU_LEVEL_COUNT; l++)
    if (strcmp(name, level_names[l]) == 0) {
      if ((ql__cpu_level)l > level_detected)
        return QL_ENOTSUP;
      if (capped((ql__cpu_level)l) < level_active)
        level_active = capped((ql__cpu_level)l);
      return 0;
    }
  return QL_EINVAL;
}

ql__cpu_level ql__cpu_level_get(void) {
  pthread_once(&level_once, level_init);
  return level_active;
}

ql__cpu_level ql__cpu_level_detected(void) {
  pthread_once(&level_once, level_init);
  return level_detected;
}

ql__cpu_level ql__cpu_level_capped(ql__cpu_level want) {
  pthread_once(&level_once, level_init);
  return capped(want);
}

int ql__cpu_daz(void) {
#if defined(__x86_64__)
  return (_mm_getcsr() & 0x0040u) != 0; /* MXCSR bit 6: DAZ */
#else
  return 0;
#endif
}

const char *ql__cpu_level_name(ql__cpu_level l) {
  return (unsigned)l < QL_CPU_LEVEL_COUNT ? level_names[l] : "?";
}

const ql__cpu_kernels *ql__cpu_kernels_for(ql__cpu_level l) {
  switch (l) {
#if defined(__x86_64__)
  case QL_CPU_LEVEL_AVX512:
    return &ql__cpu_kernels_avx512;
  case QL_CPU_LEVEL_AVX2_VNNI:
    return &ql__cpu_kernels_avx2vnni;
  case QL_CPU_LEVEL_AVX2:
    return &ql__cpu_kernels_avx2;
#endif
  default:
    return &ql__cpu_kernels_c;
  }
}
