/*
 * fuzz_session_ops.c - libFuzzer target for what session.sock's packets do
 * (DESIGN §7): the daemon's own session_packet (daemon/serve/session_ops.c), the
 * session registry (session.c), the rings (net/ring.c) and the IPC table
 * (ipc.c), linked as they are, on a libuv loop of the target's own.
 *
 * What stands in: the listener (sessionsock.h), so that a connection is a
 * slot of this file and a reply is checked where it would be sent; the
 * devices (ql__device_find, host registration), three of them with fake
 * backends (a host, a device with Level Zero imports and layout export,
 * one with export only); the resident weights (reference counts, the
 * store's hold); and the request handlers above the rings. The daemon's
 * session plane is opened with ql__serve_sessions_open() as the server
 * opens it, and its listener ops are driven as sessionsock.c drives them.
 *
 * Each input is a configuration byte pair (mapped_mode, max_pinned_bytes,
 * devices out of service, backends that fail, where the weights are
 * resident, a listener that cannot open) and then a script: connections
 * made (as the daemon's user, another user, root) and closed by the peer;
 * raw packets; well-formed SessionOpen, CreateRegion, DestroyRegion,
 * ImportZeIpc, ReleaseImport, CreateRing and MapWeight requests with
 * values near their bounds, each with no descriptor or a memfd, a pipe or
 * /dev/null; a reply that cannot be sent; holds and releases as the
 * request socket makes them, weights unloaded and replaced; sessions
 * ended as a ring violation ends them, and by the lease; requests on a
 * session's ring and turns of the loop.
 *
 * Invariants (abort() on a violation, so that libFuzzer reports it):
 * every packet gets exactly one reply, which packs within
 * QL_SESSION_MSG_MAX, echoes the request id, carries a QL_E* status with
 * a message and no body and no descriptor on failure, and the body of its
 * request on success; a region's descriptor is a memfd sealed at its size,
 * a ring's is its size and comes with a doorbell; a session that is not
 * open answers nothing but open; regions, imports and rings are found
 * only by their own session, once; a session's end closes its connection
 * before the next end hook runs, and its token stops working; the
 * registry's counts (sessions, regions, bytes, rings) match what the
 * clients were given; and at the end every weight reference, host
 * registration and IPC open is balanced, every handle is closed
 * (uv_loop_close succeeds), no descriptor is left open and, under the
 * sanitizers, nothing leaks.
 *
 * Built under libFuzzer by 'make fuzz' and, with replay_main.c, run over
 * the seed corpus in tests/fuzz/corpus/session_ops/ by 'make check'.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <uv.h>

#include "state/devices.h"
#include "net/ring.h"
#include "state/ipc.h"
#include "log.h"
#include "wire/protocol.h"
#include "ql_ring.h"
#include "qlineard.h"
#include "wire/route.h"
#include "serve/serve.h"
#include "state/session.h"
#include "net/sessionsock.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(c)                                                               \
  do {                                                                         \
    if (!(c)) {                                                                \
      fprintf(stderr, "fuzz_session_ops: %s:%d: %s\n", __FILE__, __LINE__,   \
              #c);                                                             \
      abort();                                                                 \
    }                                                                          \
  } while (0)

#define NCONN 4      /* connections at once */
#define MAX_OPS 384  /* operations per input at most */
#define NW 3         /* weight names */
#define MAX_W 12     /* weight objects per input (names replaced) */
#define MAX_REG 80   /* regions a client keeps track of */
#define MAX_IMP 80   /* imports likewise */
#define MAX_PINS 512 /* host registrations at once */
#define LAYOUT_BYTES 4096

/* ------------------------------------------------------------- input */

typedef struct script {
  const uint8_t *p, *end;
} script;

static size_t left(const script *s) { return (size_t)(s->end - s->p); }

static uint8_t u8(script *s) { return s->p < s->end ? *s->p++ : 0; }

static uint16_t u16(script *s) {
  uint16_t v = u8(s);
  return (uint16_t)(v | (uint16_t)u8(s) << 8);
}

static uint32_t u32(script *s) {
  uint32_t v = u16(s);
  return v | (uint32_t)u16(s) << 16;
}

static uint64_t u64(script *s) {
  uint64_t v = u32(s);
  return v | (uint64_t)u32(s) << 32;
}

/* ------------------------------------------------------------- state */

typedef struct creg {
  uint64_t id, size;
} creg;

/* A connection to session.sock, as the listener and the client see it. */
struct ql__sconn {
  int live;      /* accepted, and not seen closed yet */
  int closed;    /* the daemon closed it (ql__sconn_close) or the peer */
  int fail_send; /* the next reply cannot be sent */
  void *data;    /* the daemon's (ql__sconn_set_data) */
  uint64_t id;   /* its session's number */
  int open;
  uint8_t token[QL_SESSION_TOKEN_BYTES];
  creg reg[MAX_REG];
  size_t n_reg;
  uint64_t imp[MAX_IMP];
  size_t n_imp;
  /* Its ring, as the client maps it. */
  int has_ring;
  uint8_t *ring_base;
  size_t ring_size;
  uint64_t ring_bytes; /* what CreateRing said, counted as region bytes */
  int bell;
  ql_ring view;
  /* Weight objects (W[]) it holds and mapped, by index. */
  uint8_t held[MAX_W], mapped[MAX_W];
};

/* A resident weight as the daemon's code sees it, with what its layouts
 * point at. */
typedef struct fweight {
  ql__weight w;
  ql_qweight q;
  uint8_t packed[QL__MAX_DEVICES][8]; /* stand-in layouts (by address) */
  int index;                          /* in W[] */
} fweight;

/* What the last reply carried. */
typedef struct reply {
  int valid;
  uint64_t request_id;
  int code;
  int body;
  uint64_t id, size; /* a region's, an import's, a ring's size */
  int ring_fd, bell_fd; /* dups of a ring's descriptors, or -1 */
  uint8_t token[QL_SESSION_TOKEN_BYTES];
  size_t token_len;
} reply;

typedef struct fuzz {
  uv_loop_t loop;
  const ql__sessionsock_ops *ops; /* what ql__sessionsock_open was given */
  void *arg;
  int sock_open;   /* the stand-in listener is open */
  int sock_fail;   /* ql__sessionsock_open fails */
  ql__sconn conn[NCONN];
  uint64_t next_id; /* the number the next session gets */
  fweight *W[MAX_W];
  int n_w;
  fweight *cur[NW]; /* the weight stored under each name, or NULL */
  reply last;
  int send_failed; /* a reply of the last packet could not be sent */
  /* Backends' behaviour and what they hold. */
  int export_fail, ipc_fail;
  int export_fd;    /* the descriptor of the last export, until sent */
  const void *export_packed; /* the layout it exported */
  int releasing; /* the weight object a release may free, or -1 */
  void *pins[MAX_PINS];
  int n_pins;
  void *ipc_bases[QL_SESSION_MAX_IPC * NCONN + 8];
  int n_ipc;
  int pin_refuse;
  uint64_t ring_messages;
} fuzz;

static fuzz F;
static ql__server S;

/* ----------------------------------------------------- the log (quiet) */

/* Formats every line, so that its arguments are read as the daemon reads
 * them, and prints none (FUZZ_SESSION_OPS_LOG=1: to stderr). */
void ql__log(int level, const char *fmt, ...) {
  char line[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  static int print = -1;
  if (print < 0)
    print = getenv("FUZZ_SESSION_OPS_LOG") != NULL;
  if (print)
    fprintf(stderr, "<%d>%s\n", level, line);
}

void ql__log_set_level(int level) { (void)level; }

/* ------------------------------------------------- the listener, stood in */

int ql__sessionsock_open(uv_loop_t *loop, const char *path,
                         const ql__sessionsock_limits *lim,
                         const ql__sessionsock_ops *ops, void *arg,
                         ql__sessionsock **out) {
  CHECK(loop == &F.loop && path != NULL && strstr(path, "/session.sock"));
  CHECK(lim->max_conns == QL_SESSIONS_MAX &&
        lim->max_conns_per_uid == S.cfg.max_sessions_per_uid);
  CHECK(ops->accepted && ops->packet && ops->closed && !F.sock_open);
  if (F.sock_fail)
    return QL_EIO;
  F.ops = ops;
  F.arg = arg;
  F.sock_open = 1;
  *out = (ql__sessionsock *)&F;
  return 0;
}

void ql__sessionsock_close(ql__sessionsock *ls) {
  CHECK(ls == (ql__sessionsock *)&F && F.sock_open);
  /* The plane ended every session first: no connection is left. */
  for (int i = 0; i < NCONN; i++)
    CHECK(!F.conn[i].live || F.conn[i].closed);
  F.sock_open = 0;
}

void ql__sconn_close(ql__sconn *c) { c->closed = 1; }

void ql__sconn_set_data(ql__sconn *c, void *data) { c->data = data; }

void *ql__sconn_get_data(const ql__sconn *c) { return c->data; }

static int fd_open(int fd) { return fcntl(fd, F_GETFD) != -1; }

/* A region's descriptor: a memfd sealed at the size the reply says. */
static void check_region_fd(int fd, uint64_t size) {
  struct stat st;
  CHECK(fstat(fd, &st) == 0 && (uint64_t)st.st_size == size);
  int seals = fcntl(fd, F_GET_SEALS);
  CHECK(seals >= 0);
  CHECK((seals & (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)) ==
        (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL));
}

int ql__sessionsock_send(ql__sconn *c, const ql__msg_session_response *resp,
                         int fd, int fd2) {
  uint8_t buf[QL_SESSION_MSG_MAX];
  /* Never on a connection the daemon closed, and one reply a packet. */
  CHECK(c->live && !c->closed && !F.last.valid && !F.send_failed);
  CHECK(fd2 < 0 || fd >= 0);
  CHECK(fd < 0 || fd_open(fd));
  CHECK(fd2 < 0 || fd_open(fd2));
  size_t len = qlinear__v1__session_response__get_packed_size(resp);
  CHECK(len <= sizeof buf);
  qlinear__v1__session_response__pack(resp, buf);
  Qlinear__V1__SessionResponse *r =
      qlinear__v1__session_response__unpack(NULL, len, buf);
  CHECK(r != NULL && r->status != NULL);
  int code = r->status->code;
  CHECK(code <= 0 && code > QL_ERRNO_MIN_);
  if (code != 0) {
    CHECK(r->body_case == QLINEAR__V1__SESSION_RESPONSE__BODY__NOT_SET);
    CHECK(fd < 0);
    CHECK(r->status->message != NULL && r->status->message[0] != '\0');
  } else {
    CHECK(r->body_case != QLINEAR__V1__SESSION_RESPONSE__BODY__NOT_SET);
    /* Descriptors go with regions, rings and layouts only. */
    int with_fd =
        r->body_case == QLINEAR__V1__SESSION_RESPONSE__BODY_CREATE_REGION ||
        r->body_case == QLINEAR__V1__SESSION_RESPONSE__BODY_CREATE_RING ||
        r->body_case == QLINEAR__V1__SESSION_RESPONSE__BODY_MAP_WEIGHT;
    CHECK(with_fd == (fd >= 0));
    CHECK((r->body_case == QLINEAR__V1__SESSION_RESPONSE__BODY_CREATE_RING) ==
          (fd2 >= 0));
  }
  reply *l = &F.last;
  memset(l, 0, sizeof *l);
  l->ring_fd = l->bell_fd = -1;
  l->request_id = r->request_id;
  l->code = code;
  l->body = r->body_case;
  switch (code == 0 ? r->body_case : 0) {
  case QLINEAR__V1__SESSION_RESPONSE__BODY_OPEN:
    CHECK(r->open->token.len == QL_SESSION_TOKEN_BYTES);
    CHECK(r->open->max_regions == QL_SESSION_MAX_REGIONS);
    memcpy(l->token, r->open->token.data, QL_SESSION_TOKEN_BYTES);
    l->token_len = r->open->token.len;
    break;
  case QLINEAR__V1__SESSION_RESPONSE__BODY_CREATE_REGION:
    CHECK(r->create_region->region_id != 0 && r->create_region->size != 0);
    check_region_fd(fd, r->create_region->size);
    l->id = r->create_region->region_id;
    l->size = r->create_region->size;
    break;
  case QLINEAR__V1__SESSION_RESPONSE__BODY_IMPORT_ZE_IPC:
    CHECK(r->import_ze_ipc->import_id != 0);
    l->id = r->import_ze_ipc->import_id;
    l->size = r->import_ze_ipc->size;
    break;
  case QLINEAR__V1__SESSION_RESPONSE__BODY_CREATE_RING: {
    struct stat st;
    CHECK(fstat(fd, &st) == 0 && (uint64_t)st.st_size == r->create_ring->size);
    l->size = r->create_ring->size;
    if (!c->fail_send) {
      l->ring_fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
      l->bell_fd = fcntl(fd2, F_DUPFD_CLOEXEC, 0);
      CHECK(l->ring_fd >= 0 && l->bell_fd >= 0);
    }
    break;
  }
  case QLINEAR__V1__SESSION_RESPONSE__BODY_MAP_WEIGHT:
    /* The descriptor the backend exported for this weight. */
    CHECK(fd == F.export_fd);
    CHECK(r->map_weight->size == LAYOUT_BYTES);
    CHECK(r->map_weight->digest.len == QL_DIGEST_BYTES);
    break;
  default:
    break;
  }
  qlinear__v1__session_response__free_unpacked(r, NULL);
  F.export_fd = -1;
  if (c->fail_send) {
    c->fail_send = 0;
    F.send_failed = 1;
    return QL_EIO;
  }
  l->valid = 1;
  return 0;
}

int ql__sessionsock_send_status(ql__sconn *c, uint64_t request_id, int code,
                                const char *msg) {
  ql__msg_session_response resp;
  Qlinear__V1__Status st;
  qlinear__v1__session_response__init(&resp);
  qlinear__v1__status__init(&st);
  st.code = code;
  st.message = (char *)(msg && *msg ? msg : ql_strerror(code));
  resp.request_id = request_id;
  resp.status = &st;
  return ql__sessionsock_send(c, &resp, -1, -1);
}

/* ------------------------------------------------- devices, stood in */

static fweight *weight_of_packed(const void *packed, unsigned *dev) {
  for (int i = 0; i < F.n_w; i++) {
    fweight *fw = F.W[i];
    if (fw == NULL)
      continue;
    for (unsigned d = 0; d < QL__MAX_DEVICES; d++)
      if (packed == fw->packed[d]) {
        *dev = d;
        return fw;
      }
  }
  return NULL;
}

static int fake_export(const void *packed, ql_layout_export *out) {
  unsigned d = 0;
  fweight *fw = weight_of_packed(packed, &d);
  /* Only a live weight's layout, on a device in service it is on. */
  CHECK(fw != NULL && fw->w.refs > 0 && (fw->w.devices >> d & 1u));
  CHECK(d < S.n_dev && !S.dev[d].failed && S.dev[d].b->export_layout);
  CHECK(F.export_fd < 0);
  if (F.export_fail)
    return F.export_fail;
  int fd = memfd_create("fuzz-layout", MFD_CLOEXEC);
  CHECK(fd >= 0 && ftruncate(fd, LAYOUT_BYTES) == 0);
  memset(out, 0, sizeof *out);
  out->fd = fd;
  out->size = LAYOUT_BYTES;
  out->layout = "fuzz-1";
  out->ldq = 64;
  out->scale_offset = 1024;
  out->zero_offset = d & 1 ? 2048 : UINT64_MAX;
  out->bias_offset = UINT64_MAX;
  out->sms = 1;
  out->readonly = (int)(d & 1);
  F.export_fd = fd;
  F.export_packed = packed;
  return 0;
}

static int fake_ipc_open_fd(int ordinal, int fd, const void *handle,
                            size_t len, void **base, uint64_t *size) {
  const uint8_t *h = handle;
  (void)ordinal;
  CHECK(fd_open(fd) && len == QL_ZE_IPC_HANDLE_BYTES);
  if (F.ipc_fail || (h[0] & 7) == 7)
    return h[0] & 8 ? QL_ENOTSUP : QL_EINVAL;
  CHECK(F.n_ipc < (int)(sizeof F.ipc_bases / sizeof F.ipc_bases[0]));
  void *b = malloc(1); /* a device address nobody else has */
  CHECK(b != NULL);
  F.ipc_bases[F.n_ipc++] = b;
  *base = b;
  uint64_t sz;
  memcpy(&sz, h + 1, sizeof sz);
  *size = sz ? sz : 1;
  return 0;
}

static int fake_ipc_close(int ordinal, void *base) {
  (void)ordinal;
  for (int i = 0; i < F.n_ipc; i++)
    if (F.ipc_bases[i] == base) {
      F.ipc_bases[i] = F.ipc_bases[--F.n_ipc];
      free(base);
      return 0;
    }
  CHECK(!"ipc_close of an allocation not open");
  return 0;
}

static const ql_backend cpu_backend = {.name = "cpu"};
static const ql_backend ze_backend = {
    .name = "ze",
    .ipc_handle_bytes = QL_ZE_IPC_HANDLE_BYTES,
    .ipc_open_fd = fake_ipc_open_fd,
    .ipc_close = fake_ipc_close,
    .export_layout = fake_export,
};
static const ql_backend cuda_backend = {.name = "cuda",
                                        .export_layout = fake_export};

ql__device *ql__device_find(struct ql__server *s, const char *name) {
  CHECK(s == &S);
  for (unsigned i = 0; name != NULL && i < s->n_dev; i++)
    if (strcmp(s->dev[i].name, name) == 0 ||
        strcmp(s->dev[i].alias, name) == 0)
      return &s->dev[i];
  return NULL;
}

unsigned ql__devices_host_register(struct ql__server *s, void *p, size_t len,
                                   const ql_backend **out, unsigned max) {
  CHECK(s == &S && p != NULL && len > 0 && max > 0);
  if (F.pin_refuse)
    return 0;
  for (int i = 0; i < F.n_pins; i++)
    CHECK(F.pins[i] != p);
  CHECK(F.n_pins < MAX_PINS);
  F.pins[F.n_pins++] = p;
  out[0] = &ze_backend;
  return 1;
}

int ql__devices_host_register_wanted(const struct ql__server *s) {
  CHECK(s == &S);
  return 1;
}

void ql__devices_host_unregister(void *p, const ql_backend *const *bs,
                                 unsigned n) {
  if (n == 0)
    return;
  CHECK(n == 1 && bs[0] == &ze_backend);
  for (int i = 0; i < F.n_pins; i++)
    if (F.pins[i] == p) {
      F.pins[i] = F.pins[--F.n_pins];
      return;
    }
  CHECK(!"host_unregister of memory not registered");
}

/* ------------------------------------------------- weights, stood in */

void ql__weight_ref(ql__weight *w) {
  CHECK(w->refs > 0);
  w->refs++;
}

void ql__weight_unref(ql__weight *w) {
  if (w == NULL)
    return;
  CHECK(w->refs > 0);
  if (--w->refs > 0)
    return;
  fweight *fw = (fweight *)w;
  /* Its last reference: nothing holds it, maps it or finds it by name. */
  CHECK(!w->in_store && w->holders == 0);
  for (int i = 0; i < NCONN; i++)
    CHECK(!F.conn[i].live || F.conn[i].closed ||
          (!F.conn[i].held[fw->index] && !F.conn[i].mapped[fw->index]) ||
          fw->index == F.releasing);
  F.W[fw->index] = NULL;
  free(fw);
}

int ql__weight_store_drop_unheld(ql__weight_store *st, ql__weight *w) {
  (void)st;
  /* The hold's reference, and the store's while it is there. */
  CHECK(w->holders == 0 && w->refs >= 1 + w->in_store);
  if (!w->in_store || w->pinned)
    return 0;
  w->in_store = 0;
  for (int n = 0; n < NW; n++)
    if (F.cur[n] == (fweight *)w)
      F.cur[n] = NULL;
  ql__weight_unref(w); /* the store's */
  return 1;
}

/* A weight stored under name n (resident where mask says), replacing the
 * one stored there: an admin load over it. */
static void store_weight(int n, uint8_t mask, int pinned) {
  if (F.n_w >= MAX_W)
    return;
  fweight *old = F.cur[n];
  if (old != NULL) {
    old->w.in_store = 0;
    F.cur[n] = NULL;
    ql__weight_unref(&old->w);
  }
  fweight *fw = calloc(1, sizeof *fw);
  CHECK(fw != NULL);
  snprintf(fw->w.name, sizeof fw->w.name, "w%d", n);
  fw->q.format = QL_FORMAT_Q4G;
  fw->q.group_size = 32;
  fw->q.n = 64;
  fw->q.k = 128;
  fw->q.groups = 4;
  fw->w.q = &fw->q;
  fw->w.refs = 1; /* the store's */
  fw->w.in_store = 1;
  fw->w.pinned = pinned;
  for (unsigned d = 0; d < S.n_dev; d++) {
    if (!(mask >> d & 1u))
      continue;
    fw->w.devices |= 1u << d;
    fw->w.lay[d].host = S.dev[d].host;
    /* A generic layout (NULL) now and then: nothing to map. */
    fw->w.lay[d].packed = (mask & 0x80) && d == 2 ? NULL : fw->packed[d];
  }
  fw->index = F.n_w;
  F.W[F.n_w++] = fw;
  F.cur[n] = fw;
}

/* ------------------------------------------------- above the rings */

static void ring_message(void *arg, void *owner, const void *buf, size_t len,
                         void *route) {
  ql__session *ss = owner;
  (void)arg;
  (void)buf;
  /* Only from the ring of a session still open. */
  CHECK(ql__session_by_id(&S, ql__session_id(ss)) == ss);
  CHECK(len <= QL_RING_MSG_MAX);
  F.ring_messages++;
  ql__msg_response resp;
  Qlinear__V1__Status st;
  qlinear__v1__response__init(&resp);
  qlinear__v1__status__init(&st);
  st.code = QL_EPROTO;
  st.message = "fuzz: not handled";
  resp.status = &st;
  CHECK(ql__route_reply(route, &resp, NULL) == 0);
}

static void ring_violation(void *arg, void *owner, const char *why) {
  (void)arg;
  ql__session_end(owner, why);
}

static const ql__dring_ops ring_ops = {ring_message, ring_violation};

/* The dispatcher's end hook, added after the plane's: by then the session
 * has left the registry and its connection is closed. */
static void dispatcher_ended(void *arg, uint64_t session_id) {
  (void)arg;
  CHECK(ql__session_by_id(&S, session_id) == NULL);
  for (int i = 0; i < NCONN; i++)
    if (F.conn[i].live && F.conn[i].id == session_id)
      CHECK(F.conn[i].closed);
}

/* ------------------------------------------------- the client's side */

static ql__session *session_of(const ql__sconn *c) {
  return c->live && !c->closed ? ql__session_by_id(&S, c->id) : NULL;
}

/* What a client forgets when its connection is gone. */
static void forget(ql__sconn *c) {
  if (c->has_ring) {
    munmap(c->ring_base, c->ring_size);
    close(c->bell);
  }
  CHECK(ql__session_by_id(&S, c->id) == NULL);
  if (c->open)
    CHECK(ql__session_find(&S, c->token, sizeof c->token) == NULL);
  memset(c, 0, sizeof *c);
}

/* Connections the daemon closed (a session ended) are forgotten; the
 * registry's counts match what the clients were given. */
static void settle(void) {
  uint64_t sessions = 0, regions = 0, bytes = 0, rings = 0;
  for (int i = 0; i < NCONN; i++) {
    ql__sconn *c = &F.conn[i];
    if (c->live && c->closed)
      forget(c);
    if (!c->live)
      continue;
    sessions++;
    regions += c->n_reg;
    for (size_t k = 0; k < c->n_reg; k++)
      bytes += c->reg[k].size;
    bytes += c->ring_bytes;
    rings += c->has_ring;
  }
  if (S.sessions == NULL)
    return;
  uint64_t ns, nr, nb, nrings = 0;
  ql__dring_counts fc = {0};
  ql__sessions_counts(&S, &ns, &nr, &nb);
  ql__serve_ring_counts(&S, &fc, &nrings);
  CHECK(ns == sessions && nr == regions && nb == bytes && nrings == rings);
}

static int make_fd(uint8_t kind) {
  int fds[2], fd = -1;
  switch (kind % 4) {
  case 1:
    fd = memfd_create("fuzz-fd", MFD_CLOEXEC);
    CHECK(fd >= 0 && ftruncate(fd, 4096) == 0);
    break;
  case 2:
    CHECK(pipe2(fds, O_CLOEXEC) == 0);
    close(fds[1]);
    fd = fds[0];
    break;
  case 3:
    fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    CHECK(fd >= 0);
    break;
  }
  return fd;
}

static int has_id(const uint64_t *a, size_t n, uint64_t id) {
  for (size_t i = 0; i < n; i++)
    if (a[i] == id)
      return 1;
  return 0;
}

static int has_region(const ql__sconn *c, uint64_t id) {
  for (size_t i = 0; i < c->n_reg; i++)
    if (c->reg[i].id == id)
      return 1;
  return 0;
}

/* What the reply to request q (NULL: not one) must have been, and what the
 * client keeps of it. */
static void take_reply(ql__sconn *c, const Qlinear__V1__SessionRequest *q) {
  reply *l = &F.last;
  CHECK(l->valid);
  if (q == NULL) {
    CHECK(l->request_id == 0 && l->code == QL_EPROTO);
    return;
  }
  if (l->request_id == 0 && q->request_id != 0) {
    /* The daemon's bounded decode refused what ours took. */
    CHECK(l->code == QL_EPROTO || l->code == QL_ENOMEM);
    return;
  }
  CHECK(l->request_id == q->request_id);
  if (l->code == 0)
    CHECK(l->body == (int)q->body_case);
  if (!c->open && q->body_case != QLINEAR__V1__SESSION_REQUEST__BODY_OPEN)
    CHECK(l->code != 0);
  switch (q->body_case) {
  case QLINEAR__V1__SESSION_REQUEST__BODY_OPEN:
    if (c->open)
      CHECK(l->code == QL_EPROTO);
    else if (q->open->protocol_version != QL_PROTOCOL_VERSION)
      CHECK(l->code == QL_EVERSION);
    else
      CHECK(l->code == 0);
    if (l->code == 0) {
      c->open = 1;
      memcpy(c->token, l->token, sizeof c->token);
      ql__session *ss = session_of(c);
      CHECK(ss != NULL);
      CHECK(ql__session_find(&S, c->token, sizeof c->token) == ss);
      CHECK(ql__session_find(&S, c->token, sizeof c->token - 1) == NULL);
    }
    break;
  case QLINEAR__V1__SESSION_REQUEST__BODY_CREATE_REGION:
    if (l->code == 0) {
      CHECK(l->size == q->create_region->size);
      for (int i = 0; i < NCONN; i++)
        CHECK(!has_region(&F.conn[i], l->id));
      CHECK(c->n_reg < MAX_REG);
      c->reg[c->n_reg++] = (creg){l->id, l->size};
      ql__session *ss = session_of(c);
      ql__region *r = ql__session_region(ss, l->id);
      CHECK(r != NULL && r->size == l->size && r->refs == 1);
    }
    break;
  case QLINEAR__V1__SESSION_REQUEST__BODY_DESTROY_REGION:
    if (c->open && q->destroy_region->region_id != 0)
      CHECK((l->code == 0) == has_region(c, q->destroy_region->region_id));
    for (size_t i = 0; l->code == 0 && i < c->n_reg; i++)
      if (c->reg[i].id == q->destroy_region->region_id) {
        c->reg[i] = c->reg[--c->n_reg];
        break;
      }
    break;
  case QLINEAR__V1__SESSION_REQUEST__BODY_IMPORT_ZE_IPC:
    if (l->code == 0) {
      for (int i = 0; i < NCONN; i++)
        CHECK(!has_id(F.conn[i].imp, F.conn[i].n_imp, l->id));
      CHECK(c->n_imp < MAX_IMP);
      c->imp[c->n_imp++] = l->id;
    }
    break;
  case QLINEAR__V1__SESSION_REQUEST__BODY_RELEASE_IMPORT:
    if (c->open && q->release_import->import_id != 0)
      CHECK((l->code == 0) ==
            has_id(c->imp, c->n_imp, q->release_import->import_id));
    for (size_t i = 0; l->code == 0 && i < c->n_imp; i++)
      if (c->imp[i] == q->release_import->import_id) {
        c->imp[i] = c->imp[--c->n_imp];
        break;
      }
    break;
  case QLINEAR__V1__SESSION_REQUEST__BODY_CREATE_RING:
    if (c->open && c->has_ring)
      CHECK(l->code == QL_EEXIST);
    if (l->code == 0) {
      CHECK(!c->has_ring && l->ring_fd >= 0);
      c->ring_size = (size_t)l->size;
      c->ring_bytes = l->size;
      c->ring_base = mmap(NULL, c->ring_size, PROT_READ | PROT_WRITE,
                          MAP_SHARED, l->ring_fd, 0);
      CHECK(c->ring_base != MAP_FAILED);
      CHECK(ql__ring_attach(c->ring_base, c->ring_size, &c->view) == 0);
      close(l->ring_fd);
      c->bell = l->bell_fd;
      c->has_ring = 1;
      l->ring_fd = l->bell_fd = -1;
    }
    break;
  case QLINEAR__V1__SESSION_REQUEST__BODY_MAP_WEIGHT:
    if (l->code == 0) {
      unsigned d = 0;
      fweight *fw = weight_of_packed(F.export_packed, &d);
      CHECK(fw != NULL && c->held[fw->index]);
      c->mapped[fw->index] = 1;
    }
    break;
  default:
    break;
  }
}

/* Hands a packet of c's to the daemon, as the listener does, and checks
 * its one reply. fd is taken over. */
static void packet(int i, const uint8_t *buf, size_t len, int fd) {
  ql__sconn *c = &F.conn[i];
  if (!c->live || c->closed || len == 0 || len > QL_SESSION_MSG_MAX) {
    if (fd >= 0)
      close(fd);
    return;
  }
  Qlinear__V1__SessionRequest *q =
      qlinear__v1__session_request__unpack(NULL, len, buf);
  memset(&F.last, 0, sizeof F.last);
  F.last.ring_fd = F.last.bell_fd = -1;
  F.send_failed = 0;
  F.export_packed = NULL;
  int ret = F.ops->packet(F.arg, c, buf, len, fd);
  /* Non-zero exactly when the daemon closed the connection, which only a
   * reply that could not be sent does here. */
  CHECK((ret != 0) == (c->closed != 0));
  CHECK((ret != 0) == F.send_failed);
  if (ret == 0)
    take_reply(c, q);
  if (F.last.ring_fd >= 0)
    close(F.last.ring_fd);
  if (F.last.bell_fd >= 0)
    close(F.last.bell_fd);
  memset(&F.last, 0, sizeof F.last);
  if (q != NULL)
    qlinear__v1__session_request__free_unpacked(q, NULL);
}

/* Packs m and hands it to the daemon on connection i. */
static void request(int i, Qlinear__V1__SessionRequest *m, uint64_t id,
                    int fd) {
  uint8_t buf[QL_SESSION_MSG_MAX];
  m->request_id = id;
  size_t len = qlinear__v1__session_request__get_packed_size(m);
  if (len == 0 || len > sizeof buf) {
    if (fd >= 0)
      close(fd);
    return;
  }
  qlinear__v1__session_request__pack(m, buf);
  packet(i, buf, len, fd);
}

/* A connection from a peer: the daemon's user, another, or root. */
static void connect_one(uint8_t who) {
  int i = 0;
  while (i < NCONN && F.conn[i].live)
    i++;
  if (i == NCONN)
    return;
  ql__sconn *c = &F.conn[i];
  memset(c, 0, sizeof *c);
  struct ucred cred = {(pid_t)(1000 + who), geteuid(), getegid()};
  if (who % 3 == 1)
    cred.uid = geteuid() + 1;
  else if (who % 3 == 2)
    cred.uid = 0;
  c->live = 1;
  int rc = F.ops->accepted(F.arg, c, &cred);
  CHECK(rc <= 0 && rc > QL_ERRNO_MIN_);
  if (rc != 0) {
    CHECK(c->data == NULL && !c->closed);
    memset(c, 0, sizeof *c);
    return;
  }
  CHECK(c->data != NULL && !c->closed);
  c->id = ++F.next_id;
  ql__session *ss = ql__session_by_id(&S, c->id);
  CHECK(ss != NULL && ql__session_uid(ss) == cred.uid &&
        ql__session_pid(ss) == cred.pid && !ql__session_is_open(ss));
}

/* The peer closed its socket. */
static void peer_close(ql__sconn *c) {
  if (!c->live || c->closed)
    return;
  c->closed = 1; /* as the listener marks it before it tells */
  F.ops->closed(F.arg, c, "the client closed its socket");
}

/* A message into c's ring, the doorbell, and a turn of the loop; the
 * client then takes its completions. */
static void ring_submit(ql__sconn *c, script *s) {
  uint8_t tag = u8(s);
  size_t n = u16(s) % (QL_RING_MSG_MAX + 1);
  if (n > left(s))
    n = left(s);
  if (!c->live || c->closed || !c->has_ring) {
    s->p += n;
    return;
  }
  ql_ring_hdr *h = c->view.hdr;
  uint32_t tail = atomic_load(&h->sq_tail);
  ql_ring_entry *e = &c->view.sq[tail & (c->view.entries - 1)];
  e->tag = tag;
  e->len = (uint32_t)n;
  e->flags = 0;
  memcpy(e->msg, s->p, n);
  s->p += n;
  ql__ring_sq_publish(&c->view, tail);
  uint64_t one = 1;
  while (write(c->bell, &one, sizeof one) < 0 && errno == EINTR)
    ;
  uv_run(&F.loop, UV_RUN_NOWAIT);
  if (!c->closed) {
    uint32_t head = atomic_load(&h->cq_head), avail = 0;
    if (ql__ring_cq_avail(&c->view, head, &avail) == 0)
      ql__ring_cq_release(&c->view, head + avail);
  }
}

/* The client writes a word of its ring's header (an index out of range
 * breaks the ring's rules: its session ends from inside the ring's own
 * reading), rings and the loop turns. */
static void ring_poke(ql__sconn *c, script *s) {
  size_t off = (u16(s) % QL_RING_HDR_BYTES) & ~(size_t)3;
  uint32_t v = u32(s);
  if (!c->live || c->closed || !c->has_ring)
    return;
  __atomic_store_n((uint32_t *)(c->ring_base + off), v, __ATOMIC_RELAXED);
  uint64_t one = 1;
  while (write(c->bell, &one, sizeof one) < 0 && errno == EINTR)
    ;
  uv_run(&F.loop, UV_RUN_NOWAIT);
}

/* ------------------------------------------------- well-formed requests */

static const char *const device_names[] = {"cpu",  "ze:0", "ze:fake-0",
                                           "cuda:0", "gpu9", ""};

static void op_open(int i, script *s) {
  Qlinear__V1__SessionRequest m = QLINEAR__V1__SESSION_REQUEST__INIT;
  Qlinear__V1__SessionOpenRequest o = QLINEAR__V1__SESSION_OPEN_REQUEST__INIT;
  uint8_t v = u8(s);
  char name[80];
  size_t n = u8(s) % sizeof name;
  for (size_t k = 0; k < n; k++) {
    uint8_t ch = u8(s);
    name[k] = (char)(ch ? ch : 0x80); /* any byte but NUL */
  }
  name[n] = '\0';
  o.protocol_version = v & 1 ? QL_PROTOCOL_VERSION : v;
  o.client_name = name;
  m.body_case = QLINEAR__V1__SESSION_REQUEST__BODY_OPEN;
  m.open = &o;
  request(i, &m, 1 + u8(s), -1);
}

static void op_region(int i, script *s) {
  Qlinear__V1__SessionRequest m = QLINEAR__V1__SESSION_REQUEST__INIT;
  Qlinear__V1__CreateRegionRequest r =
      QLINEAR__V1__CREATE_REGION_REQUEST__INIT;
  uint8_t kind = u8(s), fdk = u8(s);
  static const uint64_t sizes[] = {0, 1, 4095, 4096, 65536, (uint64_t)4 << 30,
                                   ((uint64_t)4 << 30) + 1, UINT64_MAX};
  r.size = kind & 8 ? (uint64_t)1 + u16(s) : sizes[kind & 7];
  m.body_case = QLINEAR__V1__SESSION_REQUEST__BODY_CREATE_REGION;
  m.create_region = &r;
  request(i, &m, 2, make_fd(fdk));
}

static void op_destroy(int i, script *s) {
  Qlinear__V1__SessionRequest m = QLINEAR__V1__SESSION_REQUEST__INIT;
  Qlinear__V1__DestroyRegionRequest r =
      QLINEAR__V1__DESTROY_REGION_REQUEST__INIT;
  uint8_t which = u8(s);
  const ql__sconn *other = &F.conn[(which >> 4) % NCONN];
  if (other->n_reg > 0 && which & 1) /* its own or another's region */
    r.region_id = other->reg[(which >> 1) % other->n_reg].id;
  else
    r.region_id = which & 2 ? u64(s) : which >> 2;
  m.body_case = QLINEAR__V1__SESSION_REQUEST__BODY_DESTROY_REGION;
  m.destroy_region = &r;
  request(i, &m, 3, -1);
}

static void op_import(int i, script *s) {
  Qlinear__V1__SessionRequest m = QLINEAR__V1__SESSION_REQUEST__INIT;
  Qlinear__V1__ImportZeIpcRequest r = QLINEAR__V1__IMPORT_ZE_IPC_REQUEST__INIT;
  uint8_t dev = u8(s), fdk = u8(s), hk = u8(s);
  uint8_t handle[QL_ZE_IPC_HANDLE_BYTES + 1];
  memset(handle, 0, sizeof handle);
  handle[0] = hk;
  uint64_t size = u64(s);
  memcpy(handle + 1, &size, sizeof size);
  r.ipc_handle.data = handle;
  r.ipc_handle.len = hk & 0x10 ? (size_t)(hk >> 5) * 9 : QL_ZE_IPC_HANDLE_BYTES;
  r.device = (char *)device_names[dev % 6];
  m.body_case = QLINEAR__V1__SESSION_REQUEST__BODY_IMPORT_ZE_IPC;
  m.import_ze_ipc = &r;
  request(i, &m, 4, make_fd(fdk % 4 == 0 && !(fdk & 4) ? 1 : fdk));
}

static void op_release(int i, script *s) {
  Qlinear__V1__SessionRequest m = QLINEAR__V1__SESSION_REQUEST__INIT;
  Qlinear__V1__ReleaseImportRequest r =
      QLINEAR__V1__RELEASE_IMPORT_REQUEST__INIT;
  uint8_t which = u8(s);
  const ql__sconn *other = &F.conn[(which >> 4) % NCONN];
  if (other->n_imp > 0 && which & 1)
    r.import_id = other->imp[(which >> 1) % other->n_imp];
  else
    r.import_id = which & 2 ? u64(s) : which >> 2;
  m.body_case = QLINEAR__V1__SESSION_REQUEST__BODY_RELEASE_IMPORT;
  m.release_import = &r;
  request(i, &m, 5, -1);
}

static void op_ring(int i, script *s) {
  Qlinear__V1__SessionRequest m = QLINEAR__V1__SESSION_REQUEST__INIT;
  Qlinear__V1__CreateRingRequest r = QLINEAR__V1__CREATE_RING_REQUEST__INIT;
  static const uint32_t entries[] = {0, 1, 2, 4, 3, 256, 512, UINT32_MAX};
  uint8_t kind = u8(s);
  r.entries = kind & 8 ? u32(s) : entries[kind & 7];
  m.body_case = QLINEAR__V1__SESSION_REQUEST__BODY_CREATE_RING;
  m.create_ring = &r;
  request(i, &m, 6, make_fd(kind >> 4));
}

static void op_map(int i, script *s) {
  Qlinear__V1__SessionRequest m = QLINEAR__V1__SESSION_REQUEST__INIT;
  Qlinear__V1__MapWeightRequest r = QLINEAR__V1__MAP_WEIGHT_REQUEST__INIT;
  uint8_t w = u8(s), dev = u8(s);
  char name[8];
  snprintf(name, sizeof name, "w%u", (unsigned)(w % (NW + 1)));
  r.name = w & 0x80 ? "no/such name" : name;
  r.device = (char *)device_names[dev % 6];
  m.body_case = QLINEAR__V1__SESSION_REQUEST__BODY_MAP_WEIGHT;
  m.map_weight = &r;
  request(i, &m, 7, -1);
}

/* ------------------------------------------------- the script */

enum {
  OP_CONNECT,   /* u8 who */
  OP_RAW,       /* u8 conn, u8 fd kind, u16 len, len bytes */
  OP_OPEN,      /* u8 conn, u8 version, u8 n, n bytes of name, u8 id */
  OP_REGION,    /* u8 conn, u8 size kind, u8 fd kind [, u16 size] */
  OP_DESTROY,   /* u8 conn, u8 which [, u64 id] */
  OP_IMPORT,    /* u8 conn, u8 device, u8 fd kind, u8 handle, u64 size */
  OP_RELEASE,   /* u8 conn, u8 which [, u64 id] */
  OP_RING,      /* u8 conn, u8 entries kind [, u32 entries] */
  OP_MAP,       /* u8 conn, u8 weight, u8 device */
  OP_HOLD,      /* u8 conn, u8 weight name */
  OP_UNHOLD,    /* u8 conn, u8 weight name */
  OP_UNLOAD,    /* u8 weight name, u8 residency: stored anew */
  OP_FAIL_SEND, /* u8 conn: its next reply cannot be sent */
  OP_CLOSE,     /* u8 conn: the peer closes it */
  OP_END,       /* u8 conn: its session ends (a ring violation) */
  OP_EXPIRE,    /* u8 lease kind */
  OP_SUBMIT,    /* u8 conn, u8 tag, u16 len, bytes: into its ring */
  OP_RUN,       /* a turn of the loop */
  OP_POKE,      /* u8 conn, u16 offset, u32 value: into its ring's header,
                   then the doorbell and a turn of the loop */
  OP_COUNT_
};

static void op_hold(ql__sconn *c, uint8_t n, int hold) {
  ql__session *ss = session_of(c);
  char name[8];
  n %= NW;
  snprintf(name, sizeof name, "w%u", (unsigned)n);
  if (ss == NULL)
    return;
  if (hold) {
    fweight *fw = F.cur[n];
    if (fw == NULL)
      return;
    int was = c->held[fw->index], before = fw->w.holders;
    int rc = ql__session_hold(&S, ss, &fw->w);
    CHECK(rc == 0 || rc == QL_EEXHAUSTED || rc == QL_ENOMEM);
    if (rc == 0) {
      /* Holding twice is holding once. */
      CHECK(fw->w.holders == before + !was);
      c->held[fw->index] = 1;
    }
    return;
  }
  int any_held = 0, any_mapped = 0;
  for (int k = 0; k < F.n_w; k++) {
    any_mapped |= c->mapped[k];
    any_held |= c->held[k] && F.W[k] != NULL &&
                strcmp(F.W[k]->w.name, name) == 0;
  }
  ql__weight *picked = ql__session_held(ss, name);
  CHECK((picked != NULL) == any_held);
  int idx = picked != NULL ? ((fweight *)picked)->index : -1;
  F.releasing = idx; /* its last reference may go now */
  int rc = ql__session_release(&S, ss, name);
  F.releasing = -1;
  if (!any_held)
    CHECK(rc == QL_ENOTFOUND);
  else if (!any_mapped)
    CHECK(rc == 0);
  else
    CHECK(rc == 0 || rc == QL_EPERM);
  if (rc == 0) {
    /* (The weight may be gone now.) */
    CHECK(c->held[idx] && !c->mapped[idx]);
    c->held[idx] = 0;
  }
}

static void setup(uint8_t c0, uint8_t c1) {
  static const size_t pinned[] = {0, 65536, (size_t)1 << 30, SIZE_MAX};
  static const int mapped[] = {QL_MAPPED_OFF, QL_MAPPED_OWNER, QL_MAPPED_ANY,
                               QL_MAPPED_ANY};
  memset(&F, 0, sizeof F);
  memset(&S, 0, sizeof S);
  F.export_fd = -1;
  F.releasing = -1;
  CHECK(uv_loop_init(&F.loop) == 0);
  S.loop = &F.loop;
  snprintf(S.cfg.socket_dir, sizeof S.cfg.socket_dir, "/run/fuzz");
  S.cfg.max_sessions_per_uid = 64;
  S.cfg.ring_spin_us = 0;
  S.cfg.mapped_mode = mapped[c0 & 3];
  S.cfg.max_pinned_bytes = pinned[c0 >> 2 & 3];
  S.cfg.uid_share = 50; /* the default: a uid pins half of it at most */
  F.pin_refuse = (c1 & 0x40) != 0;
  F.export_fail = c0 & 0x40 ? (c0 & 0x80 ? QL_ENOTSUP : QL_EDEVICE) : 0;
  F.ipc_fail = (c0 & 0xc0) == 0x80;
  F.sock_fail = (c1 & 0xc0) == 0xc0;
  CHECK(ql__uploads_create(1u << 20, &S.uploads) == 0);
  static const struct {
    const char *name, *alias;
    const ql_backend *b;
    int host;
  } devs[] = {{"cpu", "cpu", &cpu_backend, 1},
              {"ze:fake-0", "ze:0", &ze_backend, 0},
              {"cuda:fake-0", "cuda:0", &cuda_backend, 0}};
  S.n_dev = 3;
  for (unsigned d = 0; d < S.n_dev; d++) {
    ql__device *dv = &S.dev[d];
    dv->index = d;
    dv->b = devs[d].b;
    dv->host = devs[d].host;
    snprintf(dv->name, sizeof dv->name, "%s", devs[d].name);
    snprintf(dv->alias, sizeof dv->alias, "%s", devs[d].alias);
  }
  S.dev[1].failed = (c0 & 0x10) != 0;
  S.dev[2].failed = (c0 & 0x20) != 0;
  S.cpu = &S.dev[0];
  /* Residency of each name: the host, plus ze, cuda or both. */
  for (int n = 0; n < NW; n++)
    store_weight(n, (uint8_t)(1u | ((c1 >> (2 * n)) & 3u) << 1), n == 0);
}

static int count_fds(void) {
  DIR *d = opendir("/proc/self/fd");
  int n = 0;
  if (d == NULL)
    return -1;
  while (readdir(d) != NULL)
    n++;
  closedir(d);
  return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  script s = {data, data + size};
  static int warm;
  if (!warm) {
    /* libuv's first loop opens descriptors it keeps for the process (its
     * signal pipe): not this input's. */
    uv_loop_t l;
    CHECK(uv_loop_init(&l) == 0 && uv_loop_close(&l) == 0);
    warm = 1;
  }
  int fds0 = count_fds();
  uint8_t c0 = u8(&s), c1 = u8(&s);
  setup(c0, c1);
  int rc = ql__serve_sessions_open(&S, &ring_ops, NULL);
  if (rc != 0) {
    /* Nothing is left open by a failed start. */
    CHECK(F.sock_fail && rc == QL_EIO);
    CHECK(S.sessions == NULL && S.session_plane == NULL && !F.sock_open);
  } else {
    CHECK(ql__sessions_add_end_hook(&S, dispatcher_ended, NULL) == 0);
  }
  for (int ops = 0; rc == 0 && ops < MAX_OPS && left(&s) > 0; ops++) {
    uint8_t op = u8(&s) % OP_COUNT_;
    int i = op == OP_CONNECT || op == OP_UNLOAD || op == OP_EXPIRE ||
                    op == OP_RUN
                ? 0
                : u8(&s) % NCONN;
    ql__sconn *c = &F.conn[i];
    switch (op) {
    case OP_CONNECT:
      connect_one(u8(&s));
      break;
    case OP_RAW: {
      uint8_t fdk = u8(&s);
      size_t n = 1 + u16(&s) % QL_SESSION_MSG_MAX;
      if (n > left(&s))
        n = left(&s);
      const uint8_t *p = s.p;
      s.p += n;
      packet(i, p, n, n > 0 ? make_fd(fdk) : -1);
      break;
    }
    case OP_OPEN:
      op_open(i, &s);
      break;
    case OP_REGION:
      op_region(i, &s);
      break;
    case OP_DESTROY:
      op_destroy(i, &s);
      break;
    case OP_IMPORT:
      op_import(i, &s);
      break;
    case OP_RELEASE:
      op_release(i, &s);
      break;
    case OP_RING:
      op_ring(i, &s);
      break;
    case OP_MAP:
      op_map(i, &s);
      break;
    case OP_HOLD:
      op_hold(c, u8(&s), 1);
      break;
    case OP_UNHOLD:
      op_hold(c, u8(&s), 0);
      break;
    case OP_UNLOAD: {
      uint8_t n = u8(&s), mask = u8(&s);
      store_weight(n % NW, (uint8_t)(mask | 1u), 0);
      break;
    }
    case OP_FAIL_SEND:
      if (c->live && !c->closed)
        c->fail_send = 1;
      break;
    case OP_CLOSE:
      peer_close(c);
      break;
    case OP_END: {
      ql__session *ss = session_of(c);
      if (ss != NULL) {
        ql__session_end(ss, "fuzz: its ring's rules were broken");
        CHECK(c->closed); /* the plane's hook closed it */
        ql__session_end(ss, "again"); /* a no-op */
      }
      break;
    }
    case OP_EXPIRE: {
      uint8_t k = u8(&s);
      uint64_t lease = k % 3 == 0 ? 0u : k % 3 == 1 ? 1u : 3600000000000u;
      ql__sessions_expire(&S, lease);
      break;
    }
    case OP_SUBMIT:
      ring_submit(c, &s);
      break;
    case OP_RUN:
      uv_run(&F.loop, UV_RUN_NOWAIT);
      break;
    case OP_POKE:
      ring_poke(c, &s);
      break;
    }
    settle();
  }

  /* The daemon stops: every session ends, its connection closed. */
  ql__serve_sessions_close(&S);
  ql__serve_sessions_close(&S); /* twice is safe */
  CHECK(S.sessions == NULL && S.session_plane == NULL && !F.sock_open);
  for (int i = 0; i < NCONN; i++) {
    CHECK(!F.conn[i].live || F.conn[i].closed);
    if (F.conn[i].live) {
      if (F.conn[i].has_ring) {
        munmap(F.conn[i].ring_base, F.conn[i].ring_size);
        close(F.conn[i].bell);
      }
      memset(&F.conn[i], 0, sizeof F.conn[i]);
    }
  }
  uv_run(&F.loop, UV_RUN_DEFAULT);
  CHECK(uv_loop_close(&F.loop) == 0);
  /* Every hold and mapping let go: only the store keeps its weights. */
  for (int k = 0; k < F.n_w; k++) {
    fweight *fw = F.W[k];
    if (fw == NULL)
      continue;
    CHECK(fw->w.holders == 0 && fw->w.in_store && fw->w.refs == 1);
    fw->w.in_store = 0;
    ql__weight_unref(&fw->w);
    CHECK(F.W[k] == NULL);
  }
  CHECK(F.n_pins == 0 && F.n_ipc == 0 && F.export_fd < 0);
  ql__uploads_free(S.uploads);
  CHECK(count_fds() == fds0);
  ql__log(QL_LOG_DEBUG, "fuzz: %llu ring messages handed up",
          (unsigned long long)F.ring_messages);
  return 0;
}
