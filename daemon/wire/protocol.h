/*
 * protocol.h - decoding and stateless validation of wire requests.
 *
 * Everything here is pure (no sockets, no loop) so the request fuzz target
 * runs the same code the daemon runs. Checks that need daemon state (does
 * the weight exist, does K match, does a slice fit its memory) belong to
 * the handlers (serve/) and to a Linear request's admission
 * (dispatch/admit.c).
 */
#ifndef QL_PROTOCOL_H
#define QL_PROTOCOL_H

#include <stddef.h>
#include <stdint.h>

#include "qlinear.pb-c.h"
#include "ql_defs.h"

typedef Qlinear__V1__Request ql__msg_request;
typedef Qlinear__V1__Response ql__msg_response;

typedef Qlinear__V1__SessionRequest ql__msg_session_request;
typedef Qlinear__V1__SessionResponse ql__msg_session_response;

/* A decoded request and the allocator budget its memory came from. */
typedef struct ql__request {
  ql__msg_request *msg;       /* owned; freed by ql__request_free() */
  ProtobufCAllocator alloc;   /* allocator_data points back at this struct */
  size_t used;                /* bytes currently allocated for msg */
  size_t limit;               /* unpack fails once used would exceed it */
} ql__request;

/*
 * Unpacks buf[0..len) as a Request with at most budget bytes of heap for the
 * decoded message. It does not validate: the caller runs
 * ql__request_validate() so that an invalid request can still be answered
 * under its request_id. On success *out is a new request the caller owns.
 * On failure returns QL_EPROTO (not a Request, or over budget) or
 * QL_ENOMEM, writes the reason to err, and *out is NULL.
 */
int ql__request_decode(const void *buf, size_t len, size_t budget,
                       ql__request **out, char *err, size_t errlen);

/* Frees r and its message. Safe on NULL. */
void ql__request_free(ql__request *r);

/*
 * Checks everything about a request that needs no daemon state: a body is
 * set, enum values are known, names are well formed, shapes are positive
 * and match the inline data or region slice length without overflow,
 * region slice offsets are aligned to the element size. The session token
 * (serve/handlers.c) and whether a slice lies inside its region
 * (dispatch/admit.c) are checked where the state is. Returns 0
 * or a QL_E* code with the reason in err.
 */
int ql__request_validate(const ql__msg_request *req, char *err,
                         size_t errlen);

/*
 * Checks the string fields of the Request in buf[0..len) (one that
 * ql__request_decode() accepted) on the wire: protobuf-c hands strings
 * over NUL-terminated, so a NUL byte inside one would silently cut it.
 * Returns 0, QL_ENAME when the string is a weight name, else QL_EPROTO,
 * with the field named in err.
 */
int ql__request_check_strings(const void *buf, size_t len, char *err,
                              size_t errlen);

/*
 * A decoded session-socket message (SessionRequest) and its budget, as for
 * ql__request. The whole packet is at most QL_SESSION_MSG_MAX bytes.
 */
typedef struct ql__session_request {
  ql__msg_session_request *msg; /* owned; ql__session_request_free() */
  ProtobufCAllocator alloc;
  size_t used;
  size_t limit;
} ql__session_request;

/*
 * Unpacks buf[0..len) as a SessionRequest with at most budget bytes of
 * heap, without validating it (see ql__request_decode(): same contract).
 */
int ql__session_request_decode(const void *buf, size_t len, size_t budget,
                               ql__session_request **out, char *err,
                               size_t errlen);

/* Frees r and its message. Safe on NULL. */
void ql__session_request_free(ql__session_request *r);

/*
 * Checks a session message without daemon state: a known body, a region
 * size that is not 0, a region id that is not 0. Returns 0 or a QL_E* code
 * with the reason in err.
 */
int ql__session_request_validate(const ql__msg_session_request *req,
                                 char *err, size_t errlen);

/*
 * True when bytes [off, off + len) lie inside an object of size bytes,
 * checked as off <= size && len <= size - off so that no sum can wrap.
 * An empty slice at the very end (off == size, len == 0) is inside.
 */
static inline int ql__slice_valid(uint64_t off, uint64_t len, uint64_t size) {
  return off <= size && len <= size - off;
}

/* True for a weight name matching [A-Za-z0-9._/-]{1,255} with no ".."
 * component and no leading "/". */
int ql__name_valid(const char *name);

/* Multiplies a*b*c into *out: 0, or QL_ESHAPE when it overflows size_t
 * (*out is then not meaningful). */
int ql__mul_size(size_t a, size_t b, size_t c, size_t *out);

/* Largest N or K accepted (the kernels index rows with 32-bit ints). */
#define QL_MAX_DIM ((uint64_t)1 << 30)
/* "q4g", "q8c", "q8b", "f8r" for a ql_format, "?" for anything else: for
 * messages. */
const char *ql__format_name(int f);

/* Weights of one LinearMulti request: QL_MULTI_MAX, in ql_defs.h. */

#endif /* QL_PROTOCOL_H */
