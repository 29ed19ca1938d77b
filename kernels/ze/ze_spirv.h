/*
 * ze_spirv.h - the ze kernels as SPIR-V modules, compiled from the .cl
 * files of kernels/ze/ at build time and embedded in the library by
 * build_spirv.sh (the generated spirv_modules.c is never committed). The
 * Level Zero host code creates its modules from these (zeModuleCreate
 * with ZE_MODULE_FORMAT_IL_SPIRV) and must pass the build flag
 * -cl-fp32-correctly-rounded-divide-sqrt there too, as the SPIR-V build
 * and the OpenCL test host do.
 */
#ifndef QL_ZE_SPIRV_H
#define QL_ZE_SPIRV_H

#include <stddef.h>

typedef struct ql__ze_module {
  const char *name;    /* the .cl file it comes from, without ".cl" */
  const char *variant; /* "sg": Intel sub-groups (SubgroupSize 16);
                          "lm": local memory only (OpenCL 1.2 devices) */
  const unsigned char *spirv; /* SPIR-V 1.2 words, 4-byte aligned */
  size_t size;                /* bytes */
} ql__ze_module;

/* Every module, each .cl in both variants. */
extern const ql__ze_module ql__ze_modules[];
extern const size_t ql__ze_n_modules;

#endif /* QL_ZE_SPIRV_H */
