/*
 * digest.h - a weight's content digest: what names its content on the
 * wire (Hold, LoadCommit), in the state directory and in the layout
 * cache. Apart from weights.c so that the store, which checks the digests
 * of the files it reads, needs neither the resident weights nor the
 * kernel registry.
 */
#ifndef QL_DIGEST_H
#define QL_DIGEST_H

#include <stdint.h>

#include "ql_defs.h"
#include "ql_kernels.h"
#include "ql_source.h"

/* SHA-256 of the canonical form q: a header (format, group size, shape,
 * scale dtype, bias flag) followed by every array, into out. 0, or
 * QL_ENOMEM / QL_EINTERNAL when libcrypto fails. */
int ql__qweight_digest(const ql_qweight *q, uint8_t out[QL_DIGEST_BYTES]);

/* The source digest (ql_source.h) of a load: SHA-256 of spec's header and
 * the len bytes of its upload stream at data, into out. 0, or QL_ENOMEM /
 * QL_EINTERNAL when libcrypto fails. */
int ql__source_digest(const ql_source_spec *spec, const void *data,
                      size_t len, uint8_t out[QL_DIGEST_BYTES]);

#endif /* QL_DIGEST_H */
