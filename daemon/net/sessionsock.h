/*
 * sessionsock.h - session.sock (DESIGN §7): the AF_UNIX SOCK_SEQPACKET
 * listener beside the request socket, and its connections, on the libuv
 * loop.
 *
 * A connection carries SessionRequest packets of at most
 * QL_SESSION_MSG_MAX bytes, each with at most one descriptor (SCM_RIGHTS),
 * and SessionResponse packets with up to two. The listener records each
 * peer's uid, gid and pid (SO_PEERCRED) at accept and bounds connections
 * in all and per peer uid: one past a bound gets one error packet
 * (QL_EEXHAUSTED) and is closed. A packet too large to be one is answered
 * QL_ETOOBIG here; every other packet is handed up. Running out of
 * descriptors pauses accepting and retries on a timer. Nothing here blocks:
 * a reply the peer's socket buffer cannot take fails, and the caller ends
 * the connection.
 *
 * The listener knows nothing of sessions: it calls up only through the ops
 * it was opened with (as transport.h does through its callback), so that
 * what a packet means lives above it (session_ops.c) and can be driven
 * without a socket. Loop thread only.
 */
#ifndef QL_SESSIONSOCK_H
#define QL_SESSIONSOCK_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include <uv.h>

#include "wire/protocol.h"

typedef struct ql__sessionsock ql__sessionsock;
typedef struct ql__sconn ql__sconn;

/* What the listener allows. */
typedef struct ql__sessionsock_limits {
  unsigned max_conns;         /* connections open at once */
  unsigned max_conns_per_uid; /* of one peer uid */
} ql__sessionsock_limits;

/* What the listener calls up, on the loop thread, with the arg it was
 * opened with. */
typedef struct ql__sessionsock_ops {
  /* A new connection from peer, within the limits: 0 keeps it (the callee
   * may attach its data, ql__sconn_set_data); a QL_E* code refuses it:
   * the peer gets one error packet with that code and is closed, and no
   * other op is called for c. */
  int (*accepted)(void *arg, ql__sconn *c, const struct ucred *peer);
  /* One packet, buf[0..len) (1 <= len <= QL_SESSION_MSG_MAX, valid for
   * the call only), and the descriptor it carried or -1, which the callee
   * takes over. Returns 0 to go on reading c; non-zero when the callee
   * closed c (ql__sconn_close). */
  int (*packet)(void *arg, ql__sconn *c, const void *buf, size_t len,
                int fd);
  /* c ended by itself (why says how: its peer closed it, an error, a
   * reply of the listener's own could not be sent); not called after
   * ql__sconn_close. c reads nothing more; it and its data stay valid
   * until the loop's next turn, and ql__sconn_close(c) is a no-op. */
  void (*closed)(void *arg, ql__sconn *c, const char *why);
} ql__sessionsock_ops;

/*
 * Binds path (replacing a file left there: the caller has made sure no
 * other daemon owns its directory), born 0660 as the request socket, and
 * starts accepting on loop. ops (kept, not copied) and arg are what
 * connections call up with. On success *out is the caller's, released by
 * ql__sessionsock_close(); on failure the reason is logged and nothing is
 * left open. Returns 0 or a QL_E* code.
 */
int ql__sessionsock_open(uv_loop_t *loop, const char *path,
                         const ql__sessionsock_limits *lim,
                         const ql__sessionsock_ops *ops, void *arg,
                         ql__sessionsock **out);

/*
 * Stops listening, removes the socket file and closes every connection
 * still open (each gets closed(), "the daemon is stopping"). Memory is
 * freed once libuv has closed the handles. Safe on NULL.
 */
void ql__sessionsock_close(ql__sessionsock *ls);

/*
 * Packs resp and sends it on c as one packet, with fd and then fd2 as
 * SCM_RIGHTS where >= 0 (fd2 only with fd; the caller keeps and closes
 * both). Never blocks. Returns 0, or QL_EIO when the packet could not be
 * sent whole (a peer that does not read its replies, a closed c): the
 * caller ends c.
 */
int ql__sessionsock_send(ql__sconn *c, const ql__msg_session_response *resp,
                         int fd, int fd2);

/* A SessionResponse with a status and no body: code, and msg or, where
 * msg is NULL or empty, ql_strerror(code). As ql__sessionsock_send. */
int ql__sessionsock_send_status(ql__sconn *c, uint64_t request_id, int code,
                                const char *msg);

/* Closes c now: it reads nothing more and closed() is not called. Its
 * memory stays valid until the loop's next turn. Safe on a c that is
 * closing already. */
void ql__sconn_close(ql__sconn *c);

/* The caller's data of c (NULL until set). */
void ql__sconn_set_data(ql__sconn *c, void *data);
void *ql__sconn_get_data(const ql__sconn *c);

#endif /* QL_SESSIONSOCK_H */
