/*
 * backend.c - the CPU backend's registration. The CPU is always built and
 * is the default device. It has no implementations of its own yet, so
 * every op dispatches to the generic ones; SIMD kernels register here.
 */
#include "registry.h"

const ql_backend ql__backend_cpu = {
    .name = "cpu",
    .impls = NULL,
    .n_impls = 0,
};
