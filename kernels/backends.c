/*
 * backends.c - the one place that lists the backends built into the
 * kernel library. A backend that is not built contributes nothing here;
 * nothing outside this file and the backend's own folder tests for it.
 *
 * QL_WITH_CUDA: the CUDA backend (kernels/cuda/) is linked in: in
 * libqlkernels when configure found nvcc (the GPU build), and in the test
 * programs that compile this file again with the macro around its emulated
 * build (Makefile.am, "CUDA").
 *
 * QL_WITH_ZE: the ze backend on Level Zero (kernels/ze/backend.c), in
 * libqlkernels when configure found the Level Zero loader (HAVE_ZE); the
 * tests run it on the Level Zero test driver (tests/ze_driver/).
 */
#include <string.h>

#include "registry.h"

extern const ql_backend ql__backend_cpu;
#ifdef QL_WITH_CUDA
extern const ql_backend ql__backend_cuda;
#endif
#ifdef QL_WITH_ZE
extern const ql_backend ql__backend_ze;
#endif

/* Priority order: an accelerator before the CPU. */
static const ql_backend *const builtin[] = {
#ifdef QL_WITH_CUDA
    &ql__backend_cuda,
#endif
#ifdef QL_WITH_ZE
    &ql__backend_ze,
#endif
    &ql__backend_cpu,
};

const ql_backend *const *ql_backends(size_t *count) {
  *count = sizeof builtin / sizeof builtin[0];
  return builtin;
}

const ql_backend *ql_backend_find(const char *name) {
  for (size_t i = 0; i < sizeof builtin / sizeof builtin[0]; i++)
    if (strcmp(builtin[i]->name, name) == 0)
      return builtin[i];
  return NULL;
}
