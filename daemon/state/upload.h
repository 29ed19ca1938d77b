/*
 * upload.h - chunked weight uploads in progress (begin / chunk / commit).
 *
 * An upload holds the float bytes received so far for one weight. Chunks
 * must arrive in order; the total of all uploads is bounded, and an upload
 * left idle past its timeout is dropped, so a client that dies mid-upload
 * leaks nothing for long. Loop thread only.
 */
#ifndef QL_UPLOAD_H
#define QL_UPLOAD_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "ql_defs.h"

/* One packed array of an import, as declared at LoadBegin. */
typedef struct ql__upload_array {
  int present;
  int dtype;        /* ql_array_dtype */
  int ndim;
  int64_t shape[2];
  size_t bytes;     /* its share of the stream */
} ql__upload_array;

/* Stream order of packed arrays. */
enum { QL__ARR_QDATA, QL__ARR_SCALE, QL__ARR_ZERO, QL__ARR_BIAS, QL__ARR_N };

typedef struct ql__upload {
  uint64_t id;
  char name[256];
  ql_format format;
  uint32_t group_size;
  uint64_t n, k;
  ql_dtype dtype;       /* of the float data */
  ql_dtype scale_dtype;
  ql_path policy;
  int has_bias;
  int asymmetric;       /* q8b */
  int persistent;       /* store it in the state directory */
  uint64_t owner;       /* the id of the session that began it, which
                           alone may continue it; 0: the admin socket */
  uid_t uid;            /* its session's uid (owner 0: not counted) */
  uint64_t devices;     /* bit d: the load named device d; 0: it named
                           none (the default placement) */
  int packed;           /* arrays below, not float data */
  ql_zero_kind zero_kind;
  ql__upload_array arrays[QL__ARR_N];
  uint8_t *data;        /* float: weight [N,K] then bias [N], in dtype;
                           packed: the present arrays in stream order */
  size_t total;         /* bytes expected */
  size_t received;      /* bytes received, all in order */
  uint64_t last_ns;     /* last activity, for the idle timeout */
  int committing;       /* quantization running: no more chunks */
  struct ql__upload *next;
} ql__upload;

typedef struct ql__uploads ql__uploads;

/* max_bytes bounds the sum of all uploads' totals. */
int ql__uploads_create(size_t max_bytes, ql__uploads **out);
void ql__uploads_free(ql__uploads *u); /* safe on NULL */

/* Changes the byte budget (SIGHUP); uploads in progress stay. */
void ql__uploads_set_max(ql__uploads *u, size_t max_bytes);

/* The percent of the byte budget, and of the uploads in progress, that
 * the uploads of one uid may take (uid_share; 100 at creation). Uploads of
 * the admin socket (owner 0) are not counted against a uid. */
void ql__uploads_set_share(ql__uploads *u, unsigned pct);

/* What the uploads of uid (of sessions: owner != 0) hold: bytes counted
 * against the budget and their number. */
void ql__uploads_of_uid(const ql__uploads *u, uid_t uid, size_t *bytes,
                        size_t *count);

/*
 * Starts an upload described by tmpl (all fields but id, data, received,
 * last_ns, next are taken from it; total must be set). On success *out is
 * owned by the table. QL_EEXHAUSTED when the byte budget is used up, and
 * QL_EPERM when it would take tmpl->uid past its share (a session's
 * upload).
 */
int ql__uploads_begin(ql__uploads *u, const ql__upload *tmpl,
                      ql__upload **out);

/* The upload of that id, or NULL. */
ql__upload *ql__uploads_get(ql__uploads *u, uint64_t id);

/* The upload of that id if owner began it, else NULL: another's upload is
 * not found, exactly like one that does not exist. */
ql__upload *ql__uploads_get_owned(ql__uploads *u, uint64_t id,
                                  uint64_t owner);

/* How many uploads owner has in progress, committing ones included. */
size_t ql__uploads_count_owned(const ql__uploads *u, uint64_t owner);

/* Removes owner's uploads but those committing (whose commit finds the
 * owner gone); returns how many were removed. */
size_t ql__uploads_drop_owner(ql__uploads *u, uint64_t owner);

/*
 * Appends len bytes at offset. QL_ESEQUENCE unless offset equals the bytes
 * received so far; QL_ESHAPE past the total; QL_EINVAL while committing.
 * Nothing changes on failure.
 */
int ql__upload_append(ql__upload *up, uint64_t offset, const void *data,
                      size_t len, uint64_t now_ns);

/* Removes and frees the upload. */
void ql__uploads_remove(ql__uploads *u, ql__upload *up);

/* Removes uploads idle for longer than idle_ns (except those committing);
 * returns how many were dropped. */
size_t ql__uploads_expire(ql__uploads *u, uint64_t now_ns, uint64_t idle_ns);

size_t ql__uploads_count(const ql__uploads *u);

#endif /* QL_UPLOAD_H */
