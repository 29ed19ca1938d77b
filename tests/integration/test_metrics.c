/*
 * test_metrics.c - the metrics listener of a real qlineard (daemon/
 * metrics.c): /metrics over HTTP on metrics_listen, scraped with plain
 * sockets, and on a listening socket handed over the way systemd hands
 * one over (LISTEN_FDS, LISTEN_PID, LISTEN_FDNAMES).
 *
 * What it holds the daemon to: 200 and the exposition format's content
 * type for GET and HEAD of /metrics, 404 for another path, 405 for another
 * method; garbage, a half-sent request, an oversized header and more
 * connections than the listener takes leave the daemon serving (a Linear
 * request and another scrape are answered meanwhile and after); no weight
 * name in the text by default, and at most metrics_weights of them, the
 * ones with the most requests, when it is set; a non-loopback
 * metrics_listen, and a handed-over socket that is not a listening one,
 * are refused at start with a message that says why. The Python suite
 * (client/python/tests/test_metrics.py) parses the whole text with
 * prometheus_client's parser.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <check.h>

#include "harness.h"
#include "qlinear/qlinear.h"

#define N 16
#define K 64
#define IO_MS 20000 /* a guard against a hang, not a timing threshold */

/* ------------------------------------------------------------- helpers */

/* A listening TCP socket on 127.0.0.1 at a port the kernel picks; its
 * port into *port. */
static int listener(unsigned *port) {
  struct sockaddr_in a;
  socklen_t l = sizeof a;
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  ck_assert_int_ge(fd, 0);
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
  ck_assert_int_eq(listen(fd, 16), 0);
  ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&a, &l), 0);
  *port = ntohs(a.sin_port);
  return fd;
}

/* A port free a moment ago (the kernel's pick, closed again). */
static unsigned free_port(void) {
  unsigned port;
  close(listener(&port));
  return port;
}

/*
 * Starts a daemon with metrics_listen = 127.0.0.1:<a free port> and the
 * extra arguments (up to 8), and returns the port. Another process may
 * take the port between the pick and the daemon's bind: then the daemon
 * exits at start, saying so, and another port is tried.
 */
static unsigned start_listening(td *d, const char *const *extra) {
  for (int attempt = 0; attempt < 5; attempt++) {
    char addr[64], log[8192];
    unsigned port = free_port();
    const char *args[12];
    int n = 0;
    snprintf(addr, sizeof addr, "127.0.0.1:%u", port);
    args[n++] = "--metrics-listen";
    args[n++] = addr;
    for (int i = 0; extra != NULL && extra[i] != NULL && n < 11; i++)
      args[n++] = extra[i];
    args[n] = NULL;
    int rc = td_start_or_exit(d, NULL, args, log, sizeof log);
    if (rc == 0)
      return port;
    ck_assert_msg(strstr(log, "in use") != NULL,
                  "qlineard did not start (%d): %s", rc, log);
  }
  ck_abort_msg("no free port for the metrics listener");
  return 0;
}

static int connect_port(unsigned port) {
  struct sockaddr_in a;
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  ck_assert_int_ge(fd, 0);
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons((uint16_t)port);
  ck_assert_msg(connect(fd, (struct sockaddr *)&a, sizeof a) == 0,
                "connect 127.0.0.1:%u: %s", port, strerror(errno));
  return fd;
}

static void send_all(int fd, const void *buf, size_t len) {
  const char *p = buf;
  while (len > 0) {
    ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0)
      return; /* the peer closed: what it answered is read next */
    p += n;
    len -= (size_t)n;
  }
}

/* Reads until the peer closes (the listener closes every connection after
 * its reply) into a new NUL-terminated buffer; *len its length. */
static char *read_all(int fd, size_t *len) {
  size_t cap = 1 << 16, n = 0;
  char *buf = malloc(cap);
  ck_assert_ptr_nonnull(buf);
  for (;;) {
    struct pollfd p = {fd, POLLIN, 0};
    int r = poll(&p, 1, IO_MS);
    ck_assert_msg(r == 1, "no reply from the metrics listener");
    if (n + 1 >= cap) {
      cap *= 2;
      buf = realloc(buf, cap);
      ck_assert_ptr_nonnull(buf);
    }
    ssize_t got = recv(fd, buf + n, cap - n - 1, 0);
    if (got < 0 && errno == EINTR)
      continue;
    if (got <= 0)
      break; /* EOF (or a reset after a refused request) */
    n += (size_t)got;
  }
  buf[n] = '\0';
  *len = n;
  return buf;
}

/* One HTTP exchange: the request's bytes, the whole reply back. */
typedef struct reply {
  char *raw;
  size_t len;
  int status;
  const char *body; /* into raw */
} reply;

static reply http(unsigned port, const char *req) {
  reply r = {NULL, 0, 0, NULL};
  int fd = connect_port(port);
  send_all(fd, req, strlen(req));
  r.raw = read_all(fd, &r.len);
  close(fd);
  if (sscanf(r.raw, "HTTP/1.%*d %d", &r.status) != 1)
    r.status = 0;
  const char *e = strstr(r.raw, "\r\n\r\n");
  r.body = e != NULL ? e + 4 : "";
  return r;
}

/* The value of header name (case as the listener writes it) in r, into
 * buf; "" when absent. */
static const char *header(const reply *r, const char *name, char *buf,
                          size_t len) {
  char want[64];
  snprintf(want, sizeof want, "\r\n%s: ", name);
  const char *h = strstr(r->raw, want), *end = strstr(r->raw, "\r\n\r\n");
  buf[0] = '\0';
  if (h == NULL || (end != NULL && h > end))
    return buf;
  h += strlen(want);
  size_t n = strcspn(h, "\r\n");
  snprintf(buf, len, "%.*s", (int)(n < len ? n : len - 1), h);
  return buf;
}

static reply scrape(unsigned port) {
  reply r = http(port, "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                       "Accept: text/plain\r\n\r\n");
  char ct[128];
  ck_assert_msg(r.status == 200, "scrape: status %d: %.200s", r.status,
                r.raw);
  ck_assert_str_eq(header(&r, "Content-Type", ct, sizeof ct),
                   "text/plain; version=0.0.4; charset=utf-8");
  return r;
}

/* The value of the sample line that begins with series (its name and
 * labels, exactly) in text, or -1 when there is none. */
static double sample(const char *text, const char *series) {
  size_t n = strlen(series);
  for (const char *p = text; p != NULL && *p != '\0';) {
    if (strncmp(p, series, n) == 0 && p[n] == ' ')
      return strtod(p + n + 1, NULL);
    p = strchr(p, '\n');
    if (p != NULL)
      p++;
  }
  return -1;
}

/* The distinct values of weight="..." in text, counted; names (may be
 * NULL) gets up to max of them. */
static int weight_labels(const char *text, char names[][64], int max) {
  int n = 0;
  char seen[64][64];
  for (const char *p = strstr(text, "weight=\""); p != NULL;
       p = strstr(p + 1, "weight=\"")) {
    const char *v = p + 8;
    size_t l = strcspn(v, "\"");
    char name[64];
    snprintf(name, sizeof name, "%.*s", (int)(l < 63 ? l : 63), v);
    int known = 0;
    for (int i = 0; i < n; i++)
      known |= strcmp(seen[i], name) == 0;
    if (known || n >= 64)
      continue;
    snprintf(seen[n], sizeof seen[n], "%s", name);
    if (names != NULL && n < max)
      snprintf(names[n], 64, "%s", name);
    n++;
  }
  return n;
}

/* Loads weights mt/w0 .. mt/w<n-1> through c (q8c, N x K). */
static void load_weights(ql_client *c, int n) {
  for (int i = 0; i < n; i++) {
    char name[32];
    td_layer l;
    snprintf(name, sizeof name, "mt/w%d", i);
    td_layer_make(&l, N, K, 1000 + (uint64_t)i, 0);
    ck_assert_int_eq(td_load(c, name, &l, QL_FORMAT_Q8C, 0, 0, NULL, NULL),
                     0);
    td_layer_free(&l);
  }
}

/* times Linear requests of m rows on weight name through c. */
static void run_linear(ql_client *c, const char *name, int times,
                       uint64_t m) {
  float x[64 * K], y[64 * N];
  ck_assert_uint_le(m, 64);
  for (size_t i = 0; i < m * K; i++)
    x[i] = (float)((int)(i % 13) - 6) / 8;
  for (int t = 0; t < times; t++)
    ck_assert_int_eq(ql_linear(c, name, QL_PATH_AUTO, QL_DTYPE_F32, m, K, x,
                               N, y, NULL),
                     0);
}

/* ---------------------------------------------------------------- tests */

/* GET and HEAD of /metrics, another path, another method; no weight names
 * by default; the totals count what was run. */
START_TEST(test_scrape) {
  td d;
  unsigned port = start_listening(&d, NULL);
  ql_client *c = td_connect(&d);
  load_weights(c, 3);
  run_linear(c, "mt/w0", 3, 1); /* weight-only (crossover 16) */
  run_linear(c, "mt/w1", 2, 32); /* activation-quantized */
  float x[K], y[N];
  memset(x, 0, sizeof x);
  ck_assert_int_eq(ql_linear(c, "mt/none", QL_PATH_AUTO, QL_DTYPE_F32, 1, K,
                             x, N, y, NULL),
                   QL_ENOTFOUND);

  reply r = scrape(port);
  /* No weight's name, in a label or anywhere else. */
  ck_assert_msg(strstr(r.body, "mt/w") == NULL, "a weight name is served");
  ck_assert_int_eq(weight_labels(r.body, NULL, 0), 0);
  ck_assert(strstr(r.body, "# TYPE qlinear_request_duration_seconds "
                           "histogram\n") != NULL);
  ck_assert_double_eq(sample(r.body, "qlinear_weights"), 3);
  ck_assert_double_eq(
      sample(r.body, "qlinear_device_requests_total{device=\"cpu\"}"), 5);
  ck_assert_double_eq(
      sample(r.body, "qlinear_format_requests_total{format=\"q8c\"}"), 5);
  ck_assert_double_eq(
      sample(r.body, "qlinear_request_duration_seconds_count{path=\"wo\"}"),
      3);
  ck_assert_double_eq(
      sample(r.body, "qlinear_request_duration_seconds_count{path=\"aq\"}"),
      2);
  ck_assert_double_eq(
      sample(r.body,
             "qlinear_request_duration_seconds_bucket{path=\"wo\",le=\"+Inf\"}"),
      3);
  ck_assert_double_eq(
      sample(r.body, "qlinear_errors_total{code=\"QL_ENOTFOUND\"}"), 1);
  ck_assert_double_eq(
      sample(r.body, "qlinear_device_batches_total{device=\"cpu\",path=\"aq\"}"),
      2);
  ck_assert(sample(r.body, "qlinear_requests_total") >= 6);
  free(r.raw);

  /* HEAD: the same head, no body. */
  r = http(port, "HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  char h[128];
  ck_assert_int_eq(r.status, 200);
  ck_assert_str_eq(header(&r, "Content-Type", h, sizeof h),
                   "text/plain; version=0.0.4; charset=utf-8");
  ck_assert_str_eq(r.body, "");
  free(r.raw);

  /* A query string is no other path. */
  r = http(port, "GET /metrics?name[]=x HTTP/1.0\r\n\r\n");
  ck_assert_int_eq(r.status, 200);
  free(r.raw);

  r = http(port, "GET /other HTTP/1.1\r\nHost: x\r\n\r\n");
  ck_assert_int_eq(r.status, 404);
  ck_assert_ptr_nonnull(strstr(r.body, "/metrics"));
  free(r.raw);
  r = http(port, "GET / HTTP/1.0\r\n\r\n");
  ck_assert_int_eq(r.status, 404);
  free(r.raw);

  r = http(port, "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
                 "\r\nhello");
  ck_assert_int_eq(r.status, 405);
  ck_assert_str_eq(header(&r, "Allow", h, sizeof h), "GET, HEAD");
  free(r.raw);
  r = http(port, "DELETE /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  ck_assert_int_eq(r.status, 405);
  free(r.raw);

  ql_close(c);
  ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

/* Stats on the request socket: the loop answers. */
static void stats_answered(const td *d) {
  Qlinear__V1__Request req = QLINEAR__V1__REQUEST__INIT;
  Qlinear__V1__StatsRequest sr = QLINEAR__V1__STATS_REQUEST__INIT;
  req.body_case = QLINEAR__V1__REQUEST__BODY_STATS;
  req.stats = &sr;
  Qlinear__V1__Response *resp = td_call(d, &req, IO_MS);
  ck_assert_ptr_nonnull(resp);
  ck_assert_int_eq(resp->status ? resp->status->code : 0, 0);
  qlinear__v1__response__free_unpacked(resp, NULL);
}

/* A scrape once the listener has a connection free again (it closes a
 * connection whose request never completes after its 10 s timeout). */
static reply scrape_when_free(unsigned port) {
  reply r = {NULL, 0, 0, NULL};
  for (int i = 0; i < 1000; i++) {
    r = http(port, "GET /metrics HTTP/1.0\r\n\r\n");
    if (r.status == 200)
      return r;
    free(r.raw);
    r.raw = NULL;
    usleep(20000);
  }
  ck_abort_msg("no scrape answered");
  return r;
}

/* More connections than the listener takes, each with a request left half
 * sent; bytes that are no HTTP, with and without a line end, binary noise
 * with NULs; an oversized header. The daemon answers a Linear request and
 * Stats meanwhile, and a scrape once they are gone. */
START_TEST(test_hostile_http) {
  td d;
  unsigned port = start_listening(&d, NULL);
  ql_client *c = td_connect(&d);
  load_weights(c, 1);

  /* Every connection the listener takes (16) and more, half sent: the
   * loop goes on serving the request socket. */
  int held[20];
  for (int i = 0; i < 20; i++) {
    held[i] = connect_port(port);
    send_all(held[i], "GET /metr", 9);
  }
  run_linear(c, "mt/w0", 2, 1);
  stats_answered(&d);
  for (int i = 0; i < 20; i++)
    close(held[i]);
  /* Gone: a scrape is served (the listener takes connections again). */
  reply r = scrape_when_free(port);
  ck_assert_double_eq(
      sample(r.body, "qlinear_device_requests_total{device=\"cpu\"}"), 2);
  free(r.raw);

  /* Garbage, each on its connection, not waiting for what comes back (an
   * error reply, a close, or, for an unfinished line, the timeout). */
  static const struct {
    const char *b;
    size_t n;
  } junk[] = {
#define J(s) {s, sizeof s - 1}
      J("\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"), /* a TLS hello */
      J("\x16\x03\x01"),
      J("GARBAGE\r\n\r\n"),
      J("GET /metrics HTTP/9.9\r\n\r\n"),
      J("GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n"),
      J("GET /metrics HTTP/1.1\r\nTransfer-Encoding: chunked\r\nHost: x"
        "\r\n\r\nzz\r\n"),
      J("\r\n\r\n\r\n"),
      J("GET \x01\x02\x7f /metrics HTTP/1.1\r\n\r\n"),
      J("GET /metrics HTTP/1.1\r\nHost: x\r\n\x00\r\n\r\n"),
#undef J
  };
  for (size_t i = 0; i < sizeof junk / sizeof junk[0]; i++) {
    int fd = connect_port(port);
    send_all(fd, junk[i].b, junk[i].n);
    close(fd);
  }
  {
    char noise[4096];
    uint64_t st = 7;
    for (size_t i = 0; i < sizeof noise; i++) {
      st = st * 6364136223846793005ull + 1442695040888963407ull;
      noise[i] = (char)(st >> 56);
    }
    int fd = connect_port(port);
    send_all(fd, noise, sizeof noise);
    close(fd);
  }
  /* A header past the listener's memory bound (16 KiB): refused. */
  {
    size_t big = 64 << 10;
    char *req = malloc(big + 64);
    ck_assert_ptr_nonnull(req);
    int n = snprintf(req, 64, "GET /metrics HTTP/1.1\r\nX-Big: ");
    memset(req + n, 'a', big);
    memcpy(req + n + big, "\r\n\r\n", 5);
    r = http(port, req);
    ck_assert_int_ne(r.status, 200);
    free(r.raw);
    free(req);
  }
  ck_assert(td_alive(&d));
  run_linear(c, "mt/w0", 1, 1);
  stats_answered(&d);
  r = scrape_when_free(port);
  ck_assert_double_eq(
      sample(r.body, "qlinear_device_requests_total{device=\"cpu\"}"), 3);
  free(r.raw);
  ck_assert(td_alive(&d));
  ql_close(c);
  ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

/* metrics_weights = 2 of 5 weights: the two with the most requests are
 * named, six series each, and no other. */
START_TEST(test_weights_bounded) {
  td d;
  const char *const extra[] = {"--metrics-weights", "2", NULL};
  unsigned port = start_listening(&d, extra);
  ql_client *c = td_connect(&d);
  load_weights(c, 5);
  run_linear(c, "mt/w3", 4, 1);
  run_linear(c, "mt/w1", 3, 1);
  run_linear(c, "mt/w4", 1, 1);
  reply r = scrape(port);
  char names[4][64];
  int n = weight_labels(r.body, names, 4);
  ck_assert_int_eq(n, 2);
  ck_assert_str_eq(names[0], "mt/w3");
  ck_assert_str_eq(names[1], "mt/w1");
  ck_assert_ptr_null(strstr(r.body, "mt/w4"));
  ck_assert_ptr_null(strstr(r.body, "mt/w0"));
  ck_assert_double_eq(
      sample(r.body, "qlinear_weight_requests_total{weight=\"mt/w3\"}"), 4);
  ck_assert_double_eq(
      sample(r.body, "qlinear_weight_requests_total{weight=\"mt/w1\"}"), 3);
  /* Six series per named weight. */
  int lines = 0;
  for (const char *p = strstr(r.body, "{weight=\""); p != NULL;
       p = strstr(p + 1, "{weight=\""))
    lines++;
  ck_assert_int_eq(lines, 12);
  free(r.raw);
  ql_close(c);
  ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

/* A listening socket handed over as systemd does (named "metrics"), with
 * no metrics_listen: served. */
START_TEST(test_handover) {
  td d;
  unsigned port;
  int fd = listener(&port);
  td_hand_over(fd, "metrics");
  td_start(&d, NULL);
  close(fd); /* the daemon's copy listens on */
  reply r = scrape(port);
  ck_assert(sample(r.body, "qlinear_uptime_seconds") >= 0);
  ck_assert_ptr_null(strstr(r.body, "weight=\""));
  free(r.raw);
  char *log = td_read_log(&d);
  char want[64];
  snprintf(want, sizeof want, "metrics at http://127.0.0.1:%u/metrics", port);
  ck_assert_msg(strstr(log, want) != NULL, "the log does not say '%s'",
                want);
  free(log);
  ck_assert_int_eq(td_stop(&d), 0);

  /* With metrics_listen set too: the handed-over socket is served, and
   * the address is not bound (the log says so). */
  fd = listener(&port);
  td_hand_over(fd, "metrics");
  char addr[64];
  unsigned other = free_port();
  snprintf(addr, sizeof addr, "127.0.0.1:%u", other);
  const char *const args[] = {"--metrics-listen", addr, NULL};
  td_start(&d, args);
  close(fd);
  r = scrape(port);
  free(r.raw);
  log = td_read_log(&d);
  ck_assert_msg(strstr(log, "is not bound") != NULL, "%s", log);
  free(log);
  ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

/* Refused at start, with a message that says why: a non-loopback
 * metrics_listen, a handed-over socket that does not listen, names that
 * do not match LISTEN_FDS. */
START_TEST(test_refused) {
  static const char *const bad[] = {"0.0.0.0:9464", "[::]:9464",
                                    "192.0.2.1:9464", "example.com:9464",
                                    "127.0.0.1", "127.0.0.1:0"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    td d;
    char log[4096];
    const char *const args[] = {"--metrics-listen", bad[i], NULL};
    int rc = td_start_or_exit(&d, NULL, args, log, sizeof log);
    ck_assert_msg(rc == 2, "metrics_listen = %s: exit %d: %s", bad[i], rc,
                  log);
    ck_assert_msg(strstr(log, "--metrics-listen") != NULL,
                  "the message does not name the option: %s", log);
  }
  {
    td d;
    char log[4096];
    const char *const args[] = {"--metrics-listen", "0.0.0.0:9464", NULL};
    ck_assert_int_eq(td_start_or_exit(&d, NULL, args, log, sizeof log), 2);
    ck_assert_ptr_nonnull(strstr(log, "not a loopback address"));
  }
  /* A stream socket that is not listening. */
  {
    td d;
    char log[4096];
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(fd, 0);
    td_hand_over(fd, "metrics");
    int rc = td_start_or_exit(&d, NULL, NULL, log, sizeof log);
    close(fd);
    ck_assert_msg(rc == 1, "exit %d: %s", rc, log);
    ck_assert_msg(strstr(log, "not a listening TCP socket") != NULL, "%s",
                  log);
  }
  /* Two names for one descriptor. */
  {
    td d;
    char log[4096];
    unsigned port;
    int fd = listener(&port);
    td_hand_over(fd, "other:metrics");
    int rc = td_start_or_exit(&d, NULL, NULL, log, sizeof log);
    close(fd);
    ck_assert_msg(rc == 1, "exit %d: %s", rc, log);
    ck_assert_msg(strstr(log, "LISTEN_FDNAMES") != NULL, "%s", log);
  }
  /* A socket named otherwise is not served (nor refused). */
  {
    td d;
    unsigned port;
    int fd = listener(&port);
    td_hand_over(fd, "unknown");
    td_start(&d, NULL);
    close(fd);
    char *log = td_read_log(&d);
    ck_assert_ptr_null(strstr(log, "metrics at"));
    free(log);
    ck_assert_int_eq(td_stop(&d), 0);
  }
}
END_TEST

int main(void) {
  Suite *s = suite_create("metrics");
  TCase *tc = tcase_create("metrics");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_scrape);
  tcase_add_test(tc, test_hostile_http);
  tcase_add_test(tc, test_weights_bounded);
  tcase_add_test(tc, test_handover);
  tcase_add_test(tc, test_refused);
  suite_add_tcase(s, tc);
  return td_run_suite(s);
}
