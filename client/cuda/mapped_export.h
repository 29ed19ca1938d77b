/*
 * mapped_export.h - mapped mode without the daemon, for the programs that
 * check it (the conformance harness, qlinear-bench --mapped): a layout
 * exported in this process (ql_backend.export_layout) mapped as
 * ql_mapped_open() maps the daemon's. Not part of libqlinear-cuda's API.
 */
#ifndef QL_MAPPED_EXPORT_H
#define QL_MAPPED_EXPORT_H

#include <stdint.h>

#include "ql_kernels.h"
#include "qlinear/qlinear_mapped.h"
#include "registry.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Maps the allocation ex describes, the layout of weight q, on this
 * process's device ordinal, for x and y in dt and up to max_rows rows: on
 * success *out is the caller's (ql_mapped_close()). ex->fd stays the
 * caller's. QL_EINVAL: bad arguments, or a layout that does not fit its
 * allocation; QL_ENOTSUP: not a layout this library knows; QL_ENOMEM,
 * QL_EDEVICE and the import's errors (vmm.h). */
int ql__mapped_open_export(const ql_layout_export *ex, const ql_qweight *q,
                           int ordinal, ql_dtype dt, int64_t max_rows,
                           ql_mapped **out);

#ifdef __cplusplus
}
#endif

#endif
