/*
 * fuzz_transport.c - libFuzzer target for the request socket's listener
 * (daemon/net/transport.c on daemon/wire/spframe.c), in process: a real transport
 * on a libuv loop and a private socket, and each input played as the byte
 * stream of one connecting peer.
 *
 * Input: byte 0 seeds the sizes of the pieces the stream is written in
 * (the loop runs between pieces, so frames arrive split anywhere) and
 * whether the peer reads its replies; the rest is the stream. Every
 * message the transport delivers is answered (a small Response), except
 * every third, whose route is dropped, so the reply path, its queue and
 * the route's hold on a closed connection all run. Then the peer closes,
 * and the loop runs until the transport has let the connection go. A
 * crash, a sanitizer report or a broken reply contract fails.
 *
 * Built under libFuzzer by 'make fuzz' and, with replay_main.c, run over
 * the seed corpus in tests/fuzz/corpus/transport/ (streams like those of
 * fuzz_spframe) by 'make check'.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <uv.h>

#include "net/transport.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static uv_loop_t loop;
static ql__transport *tr;
static char path[108];
static unsigned delivered;

static void on_message(void *arg, const void *body, size_t len, void *route) {
  (void)arg;
  (void)body;
  if (++delivered % 3 == 0) {
    ql__transport_drop(route);
    return;
  }
  ql__msg_response resp;
  Qlinear__V1__Status st;
  qlinear__v1__response__init(&resp);
  qlinear__v1__status__init(&st);
  resp.request_id = len;
  resp.status = &st;
  size_t out = 0;
  int rc = ql__transport_reply(route, &resp, &out);
  if (rc > 0 || (rc == 0 && out == 0))
    __builtin_trap();
}

static void cleanup(void) {
  ql__transport_close(tr);
  uv_run(&loop, UV_RUN_NOWAIT);
  uv_loop_close(&loop);
  unlink(path);
  char dir[sizeof path];
  snprintf(dir, sizeof dir, "%s", path);
  char *slash = strrchr(dir, '/');
  if (slash != NULL) {
    *slash = '\0';
    rmdir(dir);
  }
}

static void setup(void) {
  char dir[] = "/tmp/ql-fuzz-transport-XXXXXX";
  if (mkdtemp(dir) == NULL || uv_loop_init(&loop) != 0)
    abort();
  snprintf(path, sizeof path, "%s/q.sock", dir);
  /* Small bounds, so that inputs reach them. */
  ql__transport_limits lim = {.max_msg = 4096,
                              .max_conns = 4,
                              .max_conns_per_uid = 4,
                              .frame_timeout_ms = 60000,
                              .max_buffered = 16384};
  if (ql__transport_open(&loop, path, &lim, on_message, NULL, &tr) != 0)
    abort();
  atexit(cleanup);
}

/* Runs the loop's ready work a few times. */
static void spin(int n) {
  for (int i = 0; i < n; i++)
    uv_run(&loop, UV_RUN_NOWAIT);
}

/* Reads and drops what the transport sent, if the peer reads at all. */
static int drain(int fd) {
  uint8_t buf[4096];
  for (;;) {
    ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n > 0)
      continue;
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (tr == NULL)
    setup();
  if (size < 1)
    return 0;
  unsigned seed = data[0];
  int reads = seed & 1;
  data++;
  size--;
  struct sockaddr_un sa;
  memset(&sa, 0, sizeof sa);
  sa.sun_family = AF_UNIX;
  memcpy(sa.sun_path, path, strlen(path));
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0)
    abort();
  spin(2);
  uint32_t x = seed * 2654435761u + 7;
  size_t at = 0;
  int gone = 0;
  for (int turns = 0; at < size && !gone && turns < 100000; turns++) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    size_t piece = 1 + x % 257;
    if (piece > size - at)
      piece = size - at;
    ssize_t n = send(fd, data + at, piece, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0)
      at += (size_t)n;
    else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
      gone = 1; /* closed by the transport */
    spin(1);
    if (reads)
      gone |= drain(fd);
  }
  close(fd);
  /* The transport sees the end, closes the connection, and its handle's
   * close callback runs a turn later. */
  spin(4);
  return 0;
}
