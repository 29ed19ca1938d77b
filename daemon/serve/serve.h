/*
 * serve.h - what the request handlers share: handlers.c (the body switch
 * and the gates of the three entry points) calls load.c (LoadBegin,
 * Chunk, Commit, Abort and the persistent writes) and query.c (Hello,
 * List, Stats, Hold, Unload, and the WeightInfo both answer with) and
 * export.c (ExportWeight). Loop
 * thread only. Each ql__serve_* that answers a request takes the server,
 * the request's session (NULL: the admin socket) and its body, and fills
 * the reply r, whose pointers refer to the caller's buffer; a status in r
 * is the error. The session plane (session_ops.c: session.sock's packets
 * and the sessions' rings) is opened and closed by the server through
 * ql__serve_sessions_*.
 */
#ifndef QL_SERVE_H
#define QL_SERVE_H

#include <stddef.h>
#include <stdint.h>

#include "net/ring.h"
#include "wire/protocol.h"
#include "qlineard.h"
#include "wire/reply.h"
#include "state/session.h"

/* A WeightInfo and the storage its pointers refer to. */
typedef struct ql__info_buf {
  Qlinear__V1__WeightInfo info;
  Qlinear__V1__WeightSpec spec;
  char *devices[QL__MAX_DEVICES];
  Qlinear__V1__DeviceCrossover xo[QL__MAX_DEVICES];
  Qlinear__V1__DeviceCrossover *xos[QL__MAX_DEVICES];
} ql__info_buf;

/* Describes w for a reply (List, Hold, a commit) into b. */
void ql__fill_info(const ql__server *s, ql__info_buf *b, ql__weight *w);

/* Hello's reply and its storage. */
typedef struct ql__hello_buf {
  Qlinear__V1__HelloResponse hr;
  Qlinear__V1__Device dev[QL__MAX_DEVICES];
  Qlinear__V1__Device *devs[QL__MAX_DEVICES];
} ql__hello_buf;

void ql__serve_hello(ql__server *s, const Qlinear__V1__HelloRequest *h,
                     ql__reply *r, ql__hello_buf *b);

/* load.c: chunked uploads. ql__serve_load_commit returns 1 when it
 * answers later (the commit runs off the loop; it owns route then), 0
 * when r holds the answer now. */
void ql__serve_load_begin(ql__server *s, ql__session *ss,
                          const Qlinear__V1__LoadBeginRequest *b,
                          ql__reply *r, Qlinear__V1__LoadBeginResponse *out);
void ql__serve_load_chunk(ql__server *s, ql__session *ss,
                          const Qlinear__V1__LoadChunkRequest *c,
                          ql__reply *r, Qlinear__V1__LoadChunkResponse *out);
int ql__serve_load_commit(ql__server *s, ql__session *ss, uint64_t id,
                          const Qlinear__V1__LoadCommitRequest *m,
                          void *route, ql__reply *r);
void ql__serve_load_abort(ql__server *s, ql__session *ss,
                          const Qlinear__V1__LoadAbortRequest *m,
                          ql__reply *r, Qlinear__V1__LoadAbortResponse *out);

/* Drops uploads idle for longer than the configured timeout (the
 * server's sweep). */
void ql__serve_expire_uploads(ql__server *s);

/* query.c */
void ql__serve_unload(ql__server *s, ql__session *ss,
                      const Qlinear__V1__UnloadWeightRequest *m, ql__reply *r,
                      Qlinear__V1__UnloadWeightResponse *out);
void ql__serve_hold(ql__server *s, ql__session *ss,
                    const Qlinear__V1__HoldWeightRequest *m, ql__reply *r,
                    ql__info_buf *b, Qlinear__V1__HoldWeightResponse *out);
/* List's reply and the storage its pointers refer to (ql__serve_list;
 * freed by ql__list_buf_free after the reply is sent). */
typedef struct ql__list_buf {
  const ql__server *s;
  Qlinear__V1__ListWeightsResponse list;
  ql__info_buf *bufs;
  Qlinear__V1__WeightInfo **ptrs;
  size_t n;
} ql__list_buf;
void ql__serve_list(ql__server *s, ql__reply *r, ql__list_buf *lb);
void ql__list_buf_free(ql__list_buf *lb); /* safe on a zeroed one */
/* Answers a Stats request (ql__linear_when_settled's callback: every
 * launch answered so far is accounted). Consumes req and route. */
void ql__serve_stats(ql__server *s, ql__request *req, void *route,
                     uint64_t arg);

/* export.c: ExportWeight's reply and the storage its pointers refer to.
 * data is the chunk's copy, freed by ql__export_buf_free after the reply
 * is sent (safe on a zeroed buffer). */
typedef struct ql__export_buf {
  Qlinear__V1__ExportWeightResponse resp;
  ql__info_buf info;
  Qlinear__V1__PackedSpec packed;
  Qlinear__V1__ArraySpec arr[4]; /* qdata, scale, zero, bias */
  uint64_t shape[4][2];
  uint8_t *data;
} ql__export_buf;
void ql__serve_export(ql__server *s, ql__session *ss,
                      const Qlinear__V1__ExportWeightRequest *m, ql__reply *r,
                      ql__export_buf *b);
void ql__export_buf_free(ql__export_buf *b);

/* session_ops.c: the session plane. Opens the session registry
 * (s->sessions), the sessions' rings, whose requests call up through
 * ring_ops (kept, not copied) with ring_arg, each with its session as the
 * owner, and <socket_dir>/session.sock (replacing a file left there: the
 * caller has made sure no other daemon owns the directory), whose packets
 * it answers; s->session_plane is set on success. Its end hook is the
 * registry's first: a session's ring stops before anything else hears of
 * its end. Returns 0 or a QL_E* code (logged); on failure nothing is left
 * open. */
int ql__serve_sessions_open(ql__server *s, const ql__dring_ops *ring_ops,
                            void *ring_arg);
/* Ends every session, closes the rings and stops listening (removing
 * session.sock). Safe on a server without sessions and when called
 * twice. */
void ql__serve_sessions_close(ql__server *s);
/* What the sessions' rings counted themselves, added to *out, and the
 * number of sessions with a ring (Stats). */
void ql__serve_ring_counts(const ql__server *s, ql__dring_counts *out,
                           uint64_t *rings);

#endif /* QL_SERVE_H */
