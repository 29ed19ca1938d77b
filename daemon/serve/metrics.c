/*
 * metrics.c - see metrics.h. The renderer of the exposition text, then
 * the HTTP listener: libmicrohttpd
 * in its "external epoll" mode, driven by the loop.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <microhttpd.h>

#include "dispatch/linear.h"
#include "net/listen.h"
#include "log.h"
#include "serve/metrics.h"
#include "qlineard.h"
#include "dispatch/scheduler.h"
#include "serve/serve.h"
#include "state/session.h"

/* ------------------------------------------------------------ renderer */

/* The most a scrape's text may grow to: far beyond what the bounded
 * series make (about 2 KiB per named weight), a guard against a bug. */
#define TEXT_MAX ((size_t)16 << 20)

typedef struct text {
  char *p;
  size_t len, cap;
  int failed; /* out of memory (or past TEXT_MAX): the scrape fails */
} text;

static void grow(text *t, size_t need) {
  if (t->failed || t->len + need + 1 <= t->cap)
    return;
  size_t cap = t->cap ? t->cap : 16384;
  while (cap < t->len + need + 1)
    cap *= 2;
  char *p = cap <= TEXT_MAX ? realloc(t->p, cap) : NULL;
  if (p == NULL) {
    t->failed = 1;
    return;
  }
  t->p = p;
  t->cap = cap;
}

__attribute__((format(printf, 2, 3))) static void tprintf(text *t,
                                                          const char *fmt,
                                                          ...) {
  va_list ap;
  char small[256];
  va_start(ap, fmt);
  int n = vsnprintf(small, sizeof small, fmt, ap);
  va_end(ap);
  if (n < 0 || t->failed)
    return;
  grow(t, (size_t)n);
  if (t->failed)
    return;
  if ((size_t)n < sizeof small) {
    memcpy(t->p + t->len, small, (size_t)n + 1);
  } else {
    va_start(ap, fmt);
    vsnprintf(t->p + t->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
  }
  t->len += (size_t)n;
}

/* A label value as the exposition format escapes it: backslash, double
 * quote and line feed. */
static void tlabel(text *t, const char *v) {
  for (; *v != '\0'; v++) {
    if (*v == '\\')
      tprintf(t, "\\\\");
    else if (*v == '"')
      tprintf(t, "\\\"");
    else if (*v == '\n')
      tprintf(t, "\\n");
    else
      tprintf(t, "%c", *v);
  }
}

static void head(text *t, const char *name, const char *type,
                 const char *help) {
  tprintf(t, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* name{key="value"} v, the value escaped. */
static void sample1(text *t, const char *name, const char *key,
                    const char *value, uint64_t v) {
  tprintf(t, "%s{%s=\"", name, key);
  tlabel(t, value);
  tprintf(t, "\"} %" PRIu64 "\n", v);
}

static void sample1s(text *t, const char *name, const char *key,
                     const char *value, uint64_t ns) {
  tprintf(t, "%s{%s=\"", name, key);
  tlabel(t, value);
  tprintf(t, "\"} %.9g\n", (double)ns * 1e-9);
}

static const char *const path_names[2] = {"wo", "aq"};

/*
 * A histogram per path in seconds: cumulative buckets at every second
 * bound of the log2 buckets, 1.024 us * 4^k for k = 0 .. 12 (up to about
 * 17 s), then +Inf, the sum and the count. Coarser than the log2 buckets
 * on purpose: 16 series per path rather than 34.
 */
static void histogram(text *t, const char *name, const char *help,
                      const ql__hist h[2]) {
  head(t, name, "histogram", help);
  for (int p = 0; p < 2; p++) {
    uint64_t cum = 0;
    for (unsigned b = 0; b < QL__HIST_BUCKETS - 1; b++) {
      cum += h[p].bucket[b];
      if (b % 2 != 0 || b > 24)
        continue;
      /* bucket b ends at 2^(b+10) ns */
      tprintf(t, "%s_bucket{path=\"%s\",le=\"%.9g\"} %" PRIu64 "\n", name,
              path_names[p], (double)((uint64_t)1024 << b) * 1e-9, cum);
    }
    tprintf(t, "%s_bucket{path=\"%s\",le=\"+Inf\"} %" PRIu64 "\n", name,
            path_names[p], h[p].count);
    tprintf(t, "%s_sum{path=\"%s\"} %.9g\n", name, path_names[p],
            (double)h[p].sum_ns * 1e-9);
    tprintf(t, "%s_count{path=\"%s\"} %" PRIu64 "\n", name, path_names[p],
            h[p].count);
  }
}

/* What the scrape adds up over the resident weights. */
typedef struct tally {
  const ql__server *s;
  uint64_t dev_weights[QL__MAX_DEVICES];
  uint64_t fmt_weights[QL__FMT_SLOTS], fmt_bytes[QL__FMT_SLOTS];
  /* The weights to name (metrics_weights), most requests first. */
  struct named {
    const ql__weight *w;
    uint64_t requests;
  } *named;
  size_t n_named, cap_named;
} tally;

static uint64_t weight_requests(const ql__weight *w) {
  uint64_t n = 0;
  for (unsigned d = 0; d < QL__MAX_DEVICES; d++)
    n += w->stats[d].requests;
  return n;
}

/* Orders more requests first, then by name: the same weights are named
 * from one scrape to the next while their counts stay apart. */
static int named_cmp(const void *a, const void *b) {
  const struct named *x = a, *y = b;
  if (x->requests != y->requests)
    return x->requests > y->requests ? -1 : 1;
  return strcmp(x->w->name, y->w->name);
}

static void tally_one(ql__weight *w, void *arg) {
  tally *c = arg;
  unsigned f = ql__fmt_slot_of(w);
  c->fmt_weights[f]++;
  c->fmt_bytes[f] += w->bytes + w->dev_bytes;
  for (unsigned d = 0; d < c->s->n_dev; d++)
    c->dev_weights[d] += w->devices >> d & 1;
  if (c->named != NULL && c->n_named < c->cap_named)
    c->named[c->n_named++] = (struct named){w, weight_requests(w)};
}

static void daemon_totals(text *t, const ql__server *s) {
  ql__dring_counts rings = {0};
  uint64_t n_rings = 0;
  ql__serve_ring_counts(s, &rings, &n_rings);
  head(t, "qlinear_build_info", "gauge",
       "The daemon's version, as a label; the value is 1.");
  tprintf(t, "qlinear_build_info{version=\"%s\",protocol=\"%u\"} 1\n",
          PACKAGE_VERSION, QL_PROTOCOL_VERSION);
  head(t, "qlinear_uptime_seconds", "gauge", "Time since qlineard started.");
  tprintf(t, "qlinear_uptime_seconds %.3f\n",
          (double)(ql__now_ns() - s->start_ns) * 1e-9);
  head(t, "qlinear_requests_total", "counter",
       "Requests received on the request and admin sockets and the rings.");
  tprintf(t, "qlinear_requests_total %" PRIu64 "\n",
          s->counters.requests + rings.answered);
  head(t, "qlinear_ring_requests_total", "counter",
       "Requests taken from the sessions' rings (the fast path).");
  tprintf(t, "qlinear_ring_requests_total %" PRIu64 "\n", rings.taken);
  head(t, "qlinear_errors_total", "counter",
       "Requests answered with an error, by its code.");
  for (unsigned i = 0; i <= QL__ERR_SLOTS; i++) {
    uint64_t n = s->counters.errors_by_code[i] + rings.errors[i];
    if (i == QL__ERR_SLOTS && n == 0)
      continue; /* a code outside the list: only when one came */
    sample1(t, "qlinear_errors_total", "code",
            i < QL__ERR_SLOTS ? ql_err_name(ql__err_slot_code(i))
                              : "QL_EUNKNOWN",
            n);
  }
  head(t, "qlinear_received_bytes_total", "counter",
       "Request bytes received on the request and admin sockets.");
  tprintf(t, "qlinear_received_bytes_total %" PRIu64 "\n",
          s->counters.bytes_in);
  head(t, "qlinear_sent_bytes_total", "counter",
       "Reply bytes sent on the sockets and the rings.");
  tprintf(t, "qlinear_sent_bytes_total %" PRIu64 "\n",
          s->counters.bytes_out + rings.bytes_out);

  uint64_t sessions = 0, regions = 0, region_bytes = 0;
  ql__sessions_counts(s, &sessions, &regions, &region_bytes);
  head(t, "qlinear_sessions", "gauge", "Sessions open.");
  tprintf(t, "qlinear_sessions %" PRIu64 "\n", sessions);
  head(t, "qlinear_regions", "gauge", "Shared-memory regions of sessions.");
  tprintf(t, "qlinear_regions %" PRIu64 "\n", regions);
  head(t, "qlinear_region_bytes", "gauge", "Bytes of those regions.");
  tprintf(t, "qlinear_region_bytes %" PRIu64 "\n", region_bytes);
  head(t, "qlinear_rings", "gauge",
       "Sessions with a ring (the shared-memory fast path).");
  tprintf(t, "qlinear_rings %" PRIu64 "\n", n_rings);

  static const char *const sockets[2] = {"request", "admin"};
  ql__transport_counts tc[2];
  ql__transport_counts_get(s->transport, &tc[0]);
  ql__transport_counts_get(s->admin, &tc[1]);
  head(t, "qlinear_connections", "gauge",
       "Connections open to a socket (request: qlineard.sock, admin: "
       "admin.sock).");
  for (int i = 0; i < 2; i++)
    sample1(t, "qlinear_connections", "socket", sockets[i], tc[i].open);
  head(t, "qlinear_connections_accepted_total", "counter",
       "Connections accepted by a socket.");
  for (int i = 0; i < 2; i++)
    sample1(t, "qlinear_connections_accepted_total", "socket", sockets[i],
            tc[i].accepted);
  head(t, "qlinear_connections_closed_total", "counter",
       "Connections the daemon closed for cause: past a connection cap, "
       "a malformed stream, frame_timeout_ms, a buffer bound.");
  for (int i = 0; i < 2; i++) {
    const uint64_t v[4] = {tc[i].refused, tc[i].malformed, tc[i].timed_out,
                           tc[i].overflowed};
    static const char *const why[4] = {"cap", "malformed", "timeout",
                                       "buffer"};
    for (int k = 0; k < 4; k++)
      tprintf(t, "qlinear_connections_closed_total{socket=\"%s\","
              "reason=\"%s\"} %" PRIu64 "\n", sockets[i], why[k], v[k]);
  }

  head(t, "qlinear_uploads_in_progress", "gauge",
       "Uploads begun and neither committed nor aborted.");
  tprintf(t, "qlinear_uploads_in_progress %zu\n",
          ql__uploads_count(s->uploads));
  head(t, "qlinear_weights", "gauge", "Weights resident.");
  tprintf(t, "qlinear_weights %zu\n", ql__weight_store_count(s->weights));
  size_t bytes = ql__weight_store_bytes(s->weights);
  for (unsigned d = 0; d < s->n_dev; d++)
    if (!s->dev[d].host)
      bytes += ql__weight_store_device_bytes(s->weights, d);
  head(t, "qlinear_resident_bytes", "gauge",
       "Bytes of the resident weights: their canonical arrays and every "
       "device's layouts.");
  tprintf(t, "qlinear_resident_bytes %zu\n", bytes);
  head(t, "qlinear_persistent_weights", "gauge",
       "Weights stored in the state directory.");
  tprintf(t, "qlinear_persistent_weights %zu\n", s->persistent_count);
  head(t, "qlinear_linear_in_flight", "gauge",
       "Linear requests (LinearMulti parts each) accepted and not yet "
       "answered: waiting in the queues or running.");
  tprintf(t, "qlinear_linear_in_flight %zu\n", ql__linear_in_flight(s));
  head(t, "qlinear_queued_bytes", "gauge",
       "Tensor bytes held by those requests (max_queued_bytes bounds it).");
  tprintf(t, "qlinear_queued_bytes %zu\n", s->queued_bytes);
}

static void device_totals(text *t, const ql__server *s, const tally *c) {
  head(t, "qlinear_device_info", "gauge",
       "A device: its alias and backend as labels; the value is 1.");
  for (unsigned d = 0; d < s->n_dev; d++) {
    tprintf(t, "qlinear_device_info{device=\"");
    tlabel(t, s->dev[d].name);
    tprintf(t, "\",alias=\"");
    tlabel(t, s->dev[d].alias);
    tprintf(t, "\",backend=\"");
    tlabel(t, s->dev[d].b->name);
    tprintf(t, "\"} 1\n");
  }
  head(t, "qlinear_device_up", "gauge",
       "1 while a device is in service, 0 once it failed.");
  for (unsigned d = 0; d < s->n_dev; d++)
    sample1(t, "qlinear_device_up", "device", s->dev[d].name,
            !s->dev[d].failed);
  head(t, "qlinear_device_requests_total", "counter",
       "Linear requests (LinearMulti parts each) a device answered with "
       "success.");
  for (unsigned d = 0; d < s->n_dev; d++)
    sample1(t, "qlinear_device_requests_total", "device", s->dev[d].name,
            s->mcounts.dev[d].requests);
  head(t, "qlinear_device_rows_total", "counter",
       "Activation rows of those requests.");
  for (unsigned d = 0; d < s->n_dev; d++)
    sample1(t, "qlinear_device_rows_total", "device", s->dev[d].name,
            s->mcounts.dev[d].rows);
  head(t, "qlinear_device_batches_total", "counter",
       "Kernel launches of a device, by path: weight-only (wo) or "
       "activation-quantized (aq).");
  for (unsigned d = 0; d < s->n_dev; d++)
    for (int p = 0; p < 2; p++) {
      tprintf(t, "qlinear_device_batches_total{device=\"");
      tlabel(t, s->dev[d].name);
      tprintf(t, "\",path=\"%s\"} %" PRIu64 "\n", path_names[p],
              s->mcounts.dev[d].batches[p]);
    }
  head(t, "qlinear_device_kernel_seconds_total", "counter",
       "Time a device spent in launches.");
  for (unsigned d = 0; d < s->n_dev; d++)
    sample1s(t, "qlinear_device_kernel_seconds_total", "device",
             s->dev[d].name, s->mcounts.dev[d].kernel_ns);
  head(t, "qlinear_device_queue_seconds_total", "counter",
       "Time requests waited for their first launch on a device.");
  for (unsigned d = 0; d < s->n_dev; d++)
    sample1s(t, "qlinear_device_queue_seconds_total", "device",
             s->dev[d].name, s->mcounts.dev[d].queue_ns);
  head(t, "qlinear_device_batches_pending", "gauge",
       "Launches handed to a device's worker and not yet done.");
  for (unsigned d = 0; d < s->n_dev; d++)
    sample1(t, "qlinear_device_batches_pending", "device", s->dev[d].name,
            ql__worker_pending(s->dev[d].worker));
  head(t, "qlinear_device_weights", "gauge",
       "Weights resident on a device.");
  for (unsigned d = 0; d < s->n_dev; d++)
    sample1(t, "qlinear_device_weights", "device", s->dev[d].name,
            c->dev_weights[d]);
  head(t, "qlinear_device_weight_bytes", "gauge",
       "Bytes of weights resident on a device (the CPU's: every weight's "
       "canonical arrays and host layouts).");
  for (unsigned d = 0; d < s->n_dev; d++)
    sample1(t, "qlinear_device_weight_bytes", "device", s->dev[d].name,
            s->dev[d].host ? ql__weight_store_bytes(s->weights)
                           : ql__weight_store_device_bytes(s->weights, d));
  head(t, "qlinear_device_budget_bytes", "gauge",
       "Weight bytes a device may hold; 0: no budget.");
  for (unsigned d = 0; d < s->n_dev; d++)
    sample1(t, "qlinear_device_budget_bytes", "device", s->dev[d].name,
            s->dev[d].host ? ql__weight_store_budget(s->weights)
                           : s->dev[d].budget);
}

static void format_totals(text *t, const ql__server *s, const tally *c) {
  /* Every named format, whether or not any weight has it: a fixed set of
   * series (the last slot, "other", only when something is in it). */
#define EACH_FORMAT(f)                                                         \
  for (unsigned f = 0; f < QL__FMT_SLOTS; f++)                                 \
    if (f != QL__FMT_OTHER || c->fmt_weights[f] != 0 ||                            \
        s->mcounts.fmt[f].requests != 0)
  head(t, "qlinear_format_weights", "gauge", "Weights resident, by format.");
  EACH_FORMAT(f)
  sample1(t, "qlinear_format_weights", "format", ql__fmt_slot_name(f),
          c->fmt_weights[f]);
  head(t, "qlinear_format_weight_bytes", "gauge",
       "Bytes of those weights (canonical arrays and layouts).");
  EACH_FORMAT(f)
  sample1(t, "qlinear_format_weight_bytes", "format", ql__fmt_slot_name(f),
          c->fmt_bytes[f]);
  head(t, "qlinear_format_requests_total", "counter",
       "Linear requests (LinearMulti parts each) answered with success, by "
       "the weight's format.");
  EACH_FORMAT(f)
  sample1(t, "qlinear_format_requests_total", "format", ql__fmt_slot_name(f),
          s->mcounts.fmt[f].requests);
  head(t, "qlinear_format_rows_total", "counter",
       "Activation rows of those requests.");
  EACH_FORMAT(f)
  sample1(t, "qlinear_format_rows_total", "format", ql__fmt_slot_name(f),
          s->mcounts.fmt[f].rows);
#undef EACH_FORMAT
}

/* The weights metrics_weights names: six series each, over its devices. */
static void weight_series(text *t, const tally *c) {
  static const struct {
    const char *name, *type, *help;
  } fam[6] = {
      {"qlinear_weight_requests_total", "counter",
       "Linear requests a weight answered (its devices together); only "
       "for the metrics_weights weights with the most requests."},
      {"qlinear_weight_rows_total", "counter", "Their activation rows."},
      {"qlinear_weight_batches_total", "counter",
       "Kernel launches on the weight."},
      {"qlinear_weight_kernel_seconds_total", "counter",
       "Time in those launches."},
      {"qlinear_weight_queue_seconds_total", "counter",
       "Time its requests waited for their first launch."},
      {"qlinear_weight_resident_bytes", "gauge",
       "Bytes of the weight resident: canonical arrays and layouts."},
  };
  if (c->n_named == 0)
    return;
  for (int k = 0; k < 6; k++) {
    head(t, fam[k].name, fam[k].type, fam[k].help);
    for (size_t i = 0; i < c->n_named; i++) {
      const ql__weight *w = c->named[i].w;
      uint64_t v = 0;
      for (unsigned d = 0; d < QL__MAX_DEVICES; d++) {
        const ql__weight_stats *st = &w->stats[d];
        v += k == 0   ? st->requests
             : k == 1 ? st->rows
             : k == 2 ? st->batches
             : k == 3 ? st->kernel_ns
             : k == 4 ? st->queue_ns
                      : 0;
      }
      if (k == 5)
        v = w->bytes + w->dev_bytes;
      tprintf(t, "%s{weight=\"", fam[k].name);
      tlabel(t, w->name);
      if (k == 3 || k == 4)
        tprintf(t, "\"} %.9g\n", (double)v * 1e-9);
      else
        tprintf(t, "\"} %" PRIu64 "\n", v);
    }
  }
}

int ql__metrics_render(const ql__server *s, char **out, size_t *len) {
  text t = {NULL, 0, 0, 0};
  tally c;
  size_t want = s->cfg.metrics_weights;
  memset(&c, 0, sizeof c);
  c.s = s;
  if (want > QL_METRICS_WEIGHTS_MAX)
    want = QL_METRICS_WEIGHTS_MAX;
  if (want > 0) {
    c.cap_named = ql__weight_store_count(s->weights);
    c.named = calloc(c.cap_named + 1, sizeof *c.named);
    if (c.named == NULL)
      return QL_ENOMEM;
  }
  /* (foreach takes a non-const store; it only reads here) */
  ql__weight_store_foreach(s->weights, tally_one, &c);
  if (c.n_named > 0)
    qsort(c.named, c.n_named, sizeof *c.named, named_cmp);
  if (c.n_named > want)
    c.n_named = want;

  daemon_totals(&t, s);
  device_totals(&t, s, &c);
  format_totals(&t, s, &c);
  histogram(&t, "qlinear_request_duration_seconds",
            "Linear requests (LinearMulti parts each) answered with "
            "success, from admission to answer, by path: weight-only (wo) "
            "or activation-quantized (aq).",
            s->mcounts.latency);
  histogram(&t, "qlinear_queue_wait_seconds",
            "Linear requests (LinearMulti parts each) from admission to "
            "their first launch, by path.",
            s->mcounts.queue);
  histogram(&t, "qlinear_launch_duration_seconds",
            "Kernel launches that succeeded, by path.", s->mcounts.launch);
  weight_series(&t, &c);
  free(c.named);
  if (t.failed || t.p == NULL) {
    free(t.p);
    return QL_ENOMEM;
  }
  *out = t.p;
  *len = t.len;
  return 0;
}

/* ------------------------------------------------------------ listener */

/* Bounds of the listener: what a slow or hostile scraper can hold. */
#define HTTP_CONNECTIONS 16     /* open at once; more are refused */
#define HTTP_TIMEOUT_S 10       /* a connection idle this long is closed */
#define HTTP_MEMORY (16u << 10) /* a connection's buffers for the request
                                   line and headers: larger is refused */

struct ql__metrics {
  ql__server *s;
  struct MHD_Daemon *mhd;
  uv_poll_t poll;   /* on libmicrohttpd's epoll descriptor */
  uv_timer_t timer; /* its timeouts (MHD_get_timeout) */
  int handles;      /* initialized and not yet closed */
  int starting;     /* its messages are about the start: logged louder */
  int closing;
  char where[96];   /* what it listens on, for the log */
};

static const char content_type[] = "text/plain; version=0.0.4; charset=utf-8";

/* libmicrohttpd's messages: a failed start is worth a warning, a
 * scraper's bad request (anyone's bytes) only a debug line. */
static void on_log(void *cls, const char *fmt, va_list ap) {
  ql__metrics *m = cls;
  char line[256];
  vsnprintf(line, sizeof line, fmt, ap);
  line[strcspn(line, "\r\n")] = '\0';
  ql__log(m->starting ? QL_LOG_WARNING : QL_LOG_DEBUG, "metrics: %s", line);
}

/* A short text/plain reply: errors and their reason. */
static enum MHD_Result reply_text(struct MHD_Connection *c, unsigned code,
                                  const char *body, int allow) {
  struct MHD_Response *r = MHD_create_response_from_buffer(
      strlen(body), (void *)body, MHD_RESPMEM_PERSISTENT);
  if (r == NULL)
    return MHD_NO; /* closes the connection */
  MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE,
                          "text/plain; charset=utf-8");
  if (allow)
    MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
  enum MHD_Result rc = MHD_queue_response(c, code, r);
  MHD_destroy_response(r);
  return rc;
}

/*
 * A request whose header has arrived (libmicrohttpd has parsed and bounded
 * it). Every request is answered at this first call: GET or HEAD of
 * /metrics with the exposition text, any other path 404, any other method
 * 405. A body sent along is not read; libmicrohttpd closes such a
 * connection after the reply.
 */
static enum MHD_Result on_request(void *cls, struct MHD_Connection *c,
                                  const char *url, const char *method,
                                  const char *version, const char *upload,
                                  size_t *upload_size, void **con_cls) {
  ql__metrics *m = cls;
  char *body;
  size_t len;
  (void)version;
  (void)upload;
  (void)con_cls;
  if (*upload_size != 0) { /* not reached: answered at the first call */
    *upload_size = 0;
    return MHD_YES;
  }
  if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 &&
      strcmp(method, MHD_HTTP_METHOD_HEAD) != 0)
    return reply_text(c, MHD_HTTP_METHOD_NOT_ALLOWED,
                      "method not allowed: /metrics takes GET or HEAD\n", 1);
  if (strcmp(url, "/metrics") != 0)
    return reply_text(c, MHD_HTTP_NOT_FOUND,
                      "not found: qlineard serves /metrics\n", 0);
  if (ql__metrics_render(m->s, &body, &len) != 0)
    return reply_text(c, MHD_HTTP_INTERNAL_SERVER_ERROR,
                      "out of memory\n", 0);
  struct MHD_Response *r =
      MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
  if (r == NULL) {
    free(body);
    return MHD_NO;
  }
  MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
  enum MHD_Result rc = MHD_queue_response(c, MHD_HTTP_OK, r);
  MHD_destroy_response(r);
  return rc;
}

static void on_timer(uv_timer_t *t);

/* Connections libmicrohttpd has open now (between two MHD_run()s). */
static unsigned connections(const ql__metrics *m) {
  const union MHD_DaemonInfo *i =
      MHD_get_daemon_info(m->mhd, MHD_DAEMON_INFO_CURRENT_CONNECTIONS);
  return i != NULL ? i->num_connections : 0;
}

/*
 * Runs libmicrohttpd (it never blocks: its sockets are non-blocking and it
 * polls its epoll set with a zero timeout) and arms the timer for its next
 * deadline. That deadline is 0 while it has work left over (its epoll set
 * is edge-triggered: a connection it did not finish stays on its own ready
 * list, not readable on the descriptor the loop watches), so the loop
 * runs it again on its next turn; otherwise it is the closest connection
 * timeout, or none.
 *
 * At the connection limit (or out of descriptors) it takes its listening
 * socket out of its epoll set, and puts it back only at the start of its
 * next run after a connection closed. Nothing would make that next run
 * happen (the listening socket is not in the set the loop watches), so
 * the listener would stop accepting for good: a run that closed
 * connections is followed by another at once.
 */
static void service(ql__metrics *m) {
  MHD_UNSIGNED_LONG_LONG ms;
  unsigned before = connections(m);
  MHD_run(m->mhd);
  if (connections(m) < before)
    MHD_run(m->mhd);
  if (MHD_get_timeout(m->mhd, &ms) == MHD_YES)
    uv_timer_start(&m->timer, on_timer,
                   ms > (MHD_UNSIGNED_LONG_LONG)HTTP_TIMEOUT_S * 1000
                       ? HTTP_TIMEOUT_S * 1000
                       : (uint64_t)ms,
                   0);
  else
    uv_timer_stop(&m->timer);
}

static void on_poll(uv_poll_t *p, int status, int events) {
  (void)status;
  (void)events;
  service(p->data);
}

static void on_timer(uv_timer_t *t) { service(t->data); }

static void on_closed(uv_handle_t *h) {
  ql__metrics *m = h->data;
  if (--m->handles == 0)
    free(m);
}

/* What fd listens on, as "127.0.0.1:9464" or "[::1]:9464", into buf; and
 * whether that is a loopback address. */
static int describe(int fd, char *buf, size_t len) {
  struct sockaddr_storage sa;
  socklen_t sl = sizeof sa;
  char host[INET6_ADDRSTRLEN];
  snprintf(buf, len, "descriptor %d", fd);
  if (getsockname(fd, (struct sockaddr *)&sa, &sl) != 0)
    return 0;
  if (sa.ss_family == AF_INET) {
    const struct sockaddr_in *a = (const struct sockaddr_in *)&sa;
    inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
    snprintf(buf, len, "%s:%u", host, ntohs(a->sin_port));
    return ntohl(a->sin_addr.s_addr) >> 24 == 127;
  }
  if (sa.ss_family == AF_INET6) {
    const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)&sa;
    inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
    snprintf(buf, len, "[%s]:%u", host, ntohs(a->sin6_port));
    return IN6_IS_ADDR_LOOPBACK(&a->sin6_addr);
  }
  return 0;
}

int ql__metrics_open(ql__server *s, ql__metrics **out) {
  char why[300];
  struct sockaddr_storage sa;
  socklen_t salen = 0;
  int fd = -1, v6 = 0;
  ql__metrics *m = NULL;

  *out = NULL;
  int rc = ql__listen_take("metrics", &fd, why, sizeof why);
  if (rc < 0) {
    ql__err("metrics: %s", why);
    return QL_EINVAL;
  }
  if (rc == 0 && s->cfg.metrics_listen[0] == '\0')
    return 0; /* opt-in: nothing asked for */
  if ((m = calloc(1, sizeof *m)) == NULL) {
    ql__err("metrics: out of memory");
    rc = QL_ENOMEM;
    goto fail;
  }
  m->s = s;
  m->starting = 1;
  if (fd >= 0) {
    struct sockaddr_storage local;
    socklen_t ll = sizeof local;
    v6 = getsockname(fd, (struct sockaddr *)&local, &ll) == 0 &&
         local.ss_family == AF_INET6;
    int loopback = describe(fd, m->where, sizeof m->where);
    if (s->cfg.metrics_listen[0] != '\0')
      ql__notice("metrics: serving the socket systemd handed over (%s); "
                 "metrics_listen = %s is not bound",
                 m->where, s->cfg.metrics_listen);
    if (!loopback)
      ql__warn("metrics: the socket systemd handed over (%s) is not on a "
               "loopback address: the metrics are readable from elsewhere",
               m->where);
  } else {
    /* Checked when the configuration was read (conf.c): this parses. */
    if (ql__listen_parse_loopback(s->cfg.metrics_listen, &sa, &salen, why,
                                  sizeof why) != 0) {
      ql__err("metrics_listen: %s", why);
      rc = QL_EINVAL;
      goto fail;
    }
    v6 = sa.ss_family == AF_INET6;
    snprintf(m->where, sizeof m->where, "%s", s->cfg.metrics_listen);
  }
  /* libmicrohttpd gets a duplicate of a handed-over socket: whether a
   * failed MHD_start_daemon() closed what it was given is not said, so
   * the original is closed here in every case, and the duplicate, if a
   * failed start kept it, stays open until the process ends. */
  int mfd = -1;
  if (fd >= 0 && (mfd = fcntl(fd, F_DUPFD_CLOEXEC, QL_LISTEN_FDS_START)) < 0) {
    ql__err("metrics: %s: %s", m->where, strerror(errno));
    rc = QL_EIO;
    goto fail;
  }
  struct MHD_OptionItem opts[] = {
      {MHD_OPTION_CONNECTION_LIMIT, HTTP_CONNECTIONS, NULL},
      {MHD_OPTION_CONNECTION_TIMEOUT, HTTP_TIMEOUT_S, NULL},
      {MHD_OPTION_CONNECTION_MEMORY_LIMIT, HTTP_MEMORY, NULL},
      /* The daemon ignores SIGPIPE (server.c). */
      {MHD_OPTION_SIGPIPE_HANDLED_BY_APP, 1, NULL},
      fd >= 0 ? (struct MHD_OptionItem){MHD_OPTION_LISTEN_SOCKET, mfd, NULL}
              : (struct MHD_OptionItem){MHD_OPTION_SOCK_ADDR, 0, &sa},
      {MHD_OPTION_END, 0, NULL},
  };
  /* No thread of its own (no MHD_USE_INTERNAL_POLLING_THREAD): the loop
   * polls its epoll descriptor and calls MHD_run(). */
  unsigned flags = MHD_USE_EPOLL | MHD_USE_ERROR_LOG |
                   (v6 ? MHD_USE_IPv6 : 0);
  m->mhd = MHD_start_daemon(flags, 0, NULL, NULL, on_request, m,
                            MHD_OPTION_EXTERNAL_LOGGER, on_log, m,
                            MHD_OPTION_ARRAY, opts, MHD_OPTION_END);
  if (fd >= 0)
    close(fd);
  fd = -1;
  if (m->mhd == NULL) {
    ql__err("metrics: cannot listen on %s (the lines above say why)",
            m->where);
    rc = QL_EIO;
    goto fail;
  }
  const union MHD_DaemonInfo *ep =
      MHD_get_daemon_info(m->mhd, MHD_DAEMON_INFO_EPOLL_FD);
  if (ep == NULL || uv_poll_init(s->loop, &m->poll, ep->epoll_fd) != 0) {
    ql__err("metrics: cannot poll the HTTP server's epoll descriptor");
    rc = QL_EINTERNAL;
    goto fail;
  }
  m->poll.data = m;
  m->handles++;
  uv_timer_init(s->loop, &m->timer); /* cannot fail on a valid loop */
  m->timer.data = m;
  m->handles++;
  if (uv_poll_start(&m->poll, UV_READABLE, on_poll) != 0) {
    ql__err("metrics: cannot poll the HTTP server's epoll descriptor");
    rc = QL_EINTERNAL;
    goto fail;
  }
  /* The address a handed-over socket really has, for the log. */
  const union MHD_DaemonInfo *li =
      MHD_get_daemon_info(m->mhd, MHD_DAEMON_INFO_LISTEN_FD);
  if (li != NULL)
    describe(li->listen_fd, m->where, sizeof m->where);
  m->starting = 0;
  service(m);
  ql__notice("metrics at http://%s/metrics (%u weight%s named)", m->where,
             s->cfg.metrics_weights, s->cfg.metrics_weights == 1 ? "" : "s");
  *out = m;
  return 0;
fail:
  /* A handed-over socket is closed too: nothing else will serve it. */
  if (fd >= 0)
    close(fd);
  ql__metrics_close(m);
  return rc;
}

/* Closes the handles first (the poll watches libmicrohttpd's epoll
 * descriptor, which MHD_stop_daemon() closes), then the server, which
 * closes its connections and listening socket at once. */
void ql__metrics_close(ql__metrics *m) {
  if (m == NULL || m->closing)
    return;
  m->closing = 1;
  int handles = m->handles;
  if (handles >= 1)
    uv_close((uv_handle_t *)&m->poll, on_closed);
  if (handles >= 2)
    uv_close((uv_handle_t *)&m->timer, on_closed);
  if (m->mhd != NULL)
    MHD_stop_daemon(m->mhd);
  m->mhd = NULL;
  if (handles == 0)
    free(m);
}
