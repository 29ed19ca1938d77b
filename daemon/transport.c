/* transport.c - see transport.h. */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include <nanomsg/nn.h>
#include <nanomsg/reqrep.h>

#include "log.h"
#include "transport.h"

struct ql__transport {
  int sock;
  int polling;
  uv_poll_t poll;
  ql__on_message cb;
  void *arg;
};

static int map_nn_errno(int e) {
  switch (e) {
  case ENOMEM:
    return QL_ENOMEM;
  case EAGAIN:
  case ENOSPC: /* a full file system under an ipc:// address */
  case EDQUOT:
    return QL_EEXHAUSTED;
  case ETIMEDOUT:
    return QL_ETIMEDOUT;
  case EADDRINUSE:
  case EACCES:
    return QL_EPERM;
  case ETERM:
  case EBADF:
    return QL_ESHUTDOWN;
  case EINVAL:
  case ENAMETOOLONG:
  case EPROTONOSUPPORT:
  case ENODEV:
    return QL_EINVAL;
  default:
    return QL_EIO;
  }
}

/*
 * A route is our own copy of the control data nanomsg returned with a
 * message (its SP header: the backtrace to the requesting peer) and the
 * transport it came in on, so a reply finds its socket however long the
 * work took. Owning a copy keeps the ownership rules simple: nanomsg
 * copies control data given by length on send, so a route is freed by us
 * whether the send succeeds or not.
 */
typedef struct route {
  ql__transport *t;
  size_t len;
  unsigned char ctl[];
} route;

static route *copy_route(ql__transport *t, const void *ctl) {
  if (ctl == NULL)
    return NULL;
  const struct nn_cmsghdr *c = ctl;
  size_t len = c->cmsg_len;
  if (len < sizeof *c || len > 4096)
    return NULL;
  route *r = malloc(sizeof *r + len);
  if (r == NULL)
    return NULL;
  r->t = t;
  r->len = len;
  memcpy(r->ctl, ctl, len);
  return r;
}

static void on_poll_closed(uv_handle_t *h) { free(h->data); }

/* Receives until EAGAIN: the poll is level-triggered, but draining here
 * keeps one wake-up per burst of messages. */
static void on_readable(uv_poll_t *p, int status, int events) {
  ql__transport *t = p->data;
  (void)events;
  if (status < 0) {
    ql__err("request socket poll failed: %s", uv_strerror(status));
    return;
  }
  for (;;) {
    void *body = NULL;
    void *ctl = NULL;
    struct nn_iovec iov = {.iov_base = &body, .iov_len = NN_MSG};
    struct nn_msghdr hdr;
    memset(&hdr, 0, sizeof hdr);
    hdr.msg_iov = &iov;
    hdr.msg_iovlen = 1;
    hdr.msg_control = &ctl;
    hdr.msg_controllen = NN_MSG;
    int n = nn_recvmsg(t->sock, &hdr, NN_DONTWAIT);
    if (n < 0) {
      int e = nn_errno();
      if (e != EAGAIN && e != EINTR)
        ql__warn("receive failed: %s", nn_strerror(e));
      return;
    }
    route *rt = copy_route(t, ctl);
    if (ctl != NULL)
      nn_freemsg(ctl);
    if (rt == NULL) {
      /* Without a header no reply can be routed: drop the message. */
      nn_freemsg(body);
      continue;
    }
    t->cb(t->arg, body, (size_t)n, rt);
    nn_freemsg(body);
    if (!t->polling)
      return;
  }
}

int ql__transport_open(uv_loop_t *loop, const char *address, size_t max_msg,
                       ql__on_message cb, void *arg, ql__transport **out) {
  int rc;
  *out = NULL;
  ql__transport *t = calloc(1, sizeof *t);
  if (t == NULL)
    return QL_ENOMEM;
  t->cb = cb;
  t->arg = arg;
  t->sock = nn_socket(AF_SP_RAW, NN_REP);
  if (t->sock < 0) {
    int e = nn_errno();
    rc = map_nn_errno(e);
    ql__err("cannot listen at %s: %s", address, nn_strerror(e));
    free(t);
    return rc;
  }
  /* nanomsg counts the REQ header (4 bytes per hop) against the limit;
   * the cap announced to clients is the body size. */
  size_t lim = max_msg + 64;
  int maxsz = lim > INT_MAX ? INT_MAX : (int)lim;
  int fd = -1;
  size_t fdsz = sizeof fd;
  if (nn_setsockopt(t->sock, NN_SOL_SOCKET, NN_RCVMAXSIZE, &maxsz,
                    sizeof maxsz) < 0 ||
      nn_bind(t->sock, address) < 0 ||
      nn_getsockopt(t->sock, NN_SOL_SOCKET, NN_RCVFD, &fd, &fdsz) < 0) {
    int e = nn_errno();
    rc = map_nn_errno(e);
    ql__err("cannot listen at %s: %s", address, nn_strerror(e));
    goto fail;
  }
  if (uv_poll_init(loop, &t->poll, fd) != 0) {
    ql__err("cannot listen at %s: cannot poll its descriptor", address);
    rc = QL_EINTERNAL;
    goto fail;
  }
  t->poll.data = t;
  if (uv_poll_start(&t->poll, UV_READABLE, on_readable) != 0) {
    ql__err("cannot listen at %s: cannot poll its descriptor", address);
    /* The handle is known to the loop now: it is freed by its close
     * callback, never here. */
    nn_close(t->sock);
    uv_close((uv_handle_t *)&t->poll, on_poll_closed);
    return QL_EINTERNAL;
  }
  t->polling = 1;
  *out = t;
  return 0;
fail:
  nn_close(t->sock);
  free(t);
  return rc;
}

int ql__transport_reply(void *route_, const ql__msg_response *resp,
                        size_t *bytes_out) {
  route *rt = route_;
  ql__transport *t = rt->t;
  int rc = 0;
  size_t len = qlinear__v1__response__get_packed_size(resp);
  /* Every response carries a Status, so len > 0. */
  void *msg = nn_allocmsg(len, 0);
  if (msg == NULL) {
    rc = QL_ENOMEM;
    goto done;
  }
  qlinear__v1__response__pack(resp, msg);
  struct nn_iovec iov = {.iov_base = &msg, .iov_len = NN_MSG};
  struct nn_msghdr hdr;
  memset(&hdr, 0, sizeof hdr);
  hdr.msg_iov = &iov;
  hdr.msg_iovlen = 1;
  hdr.msg_control = rt->ctl;
  hdr.msg_controllen = rt->len;
  if (nn_sendmsg(t->sock, &hdr, NN_DONTWAIT) < 0) {
    int e = nn_errno();
    nn_freemsg(msg); /* a failed send leaves the body chunk with us */
    ql__debug("reply dropped: %s", nn_strerror(e));
    rc = map_nn_errno(e);
    goto done;
  }
  if (bytes_out)
    *bytes_out += len;
done:
  free(rt);
  return rc;
}

void ql__transport_drop(void *route) { free(route); }
void ql__transport_stop(ql__transport *t) {
  if (t && t->polling) {
    uv_poll_stop(&t->poll);
    t->polling = 0;
  }
}

void ql__transport_close(ql__transport *t) {
  if (t == NULL)
    return;
  ql__transport_stop(t);
  /* The poll watches nanomsg's descriptor: close the handle before the
   * socket that owns it. */
  uv_close((uv_handle_t *)&t->poll, on_poll_closed);
  nn_close(t->sock);
}
