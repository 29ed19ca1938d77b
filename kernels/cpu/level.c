/*
 * level.c - which instruction level the CPU backend runs at (cpu.h).
 *
 * Detected once per process with __builtin_cpu_supports (GCC and clang;
 * it also checks XCR0, so a kernel that does not save the AVX-512 state
 * does not get AVX-512 code). QL_CPU_LEVEL lowers it so that every level
 * can be tested on one machine.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "cpu.h"

static pthread_once_t level_once = PTHREAD_ONCE_INIT;
static ql__cpu_level level_detected, level_active;

static const char *const level_names[QL_CPU_LEVEL_COUNT] = {
    [QL_CPU_LEVEL_C] = "c",
    [QL_CPU_LEVEL_AVX2] = "avx2",
    [QL_CPU_LEVEL_AVX2_VNNI] = "avx2vnni",
    [QL_CPU_LEVEL_AVX512] = "avx512",
};

static ql__cpu_level detect(void) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("f16c");
  if (avx2 && __builtin_cpu_supports("avx512f") &&
      __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512vnni"))
    return QL_CPU_LEVEL_AVX512;
  if (avx2 && __builtin_cpu_supports("avxvnni"))
    return QL_CPU_LEVEL_AVX2_VNNI;
  if (avx2)
    return QL_CPU_LEVEL_AVX2;
#endif
  return QL_CPU_LEVEL_C;
}

static void level_init(void) {
  const char *e = getenv("QL_CPU_LEVEL");
  level_detected = level_active = detect();
  if (e == NULL)
    return;
  for (int l = 0; l < QL_CPU_LEVEL_COUNT; l++)
    if (strcmp(e, level_names[l]) == 0) {
      if ((ql__cpu_level)l < level_active)
        level_active = (ql__cpu_level)l;
      return;
    }
}

ql__cpu_level ql__cpu_level_get(void) {
  pthread_once(&level_once, level_init);
  return level_active;
}

ql__cpu_level ql__cpu_level_detected(void) {
  pthread_once(&level_once, level_init);
  return level_detected;
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
