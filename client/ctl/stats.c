/*
 * stats.c - qlinearctl: the stats command: a table, or the Prometheus text
 * format.
 */
#include "ctl.h"

/* ------------------------------------------------------------ stats */

/* A Prometheus label value: backslash, double quote and newline escaped. */
static void prom_label(const char *s) {
  for (; *s != '\0'; s++) {
    if (*s == '\\')
      fputs("\\\\", stdout);
    else if (*s == '"')
      fputs("\\\"", stdout);
    else if (*s == '\n')
      fputs("\\n", stdout);
    else
      putchar(*s);
  }
}

static void prom_head(const char *name, const char *type, const char *help) {
  printf("# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* One per-weight series: its name, type and help, and how to read the
 * value (seconds for *_ns counters, as Prometheus wants base units). */
typedef struct prom_metric {
  const char *name, *type, *help;
  size_t offset; /* of the uint64_t field in ql_weight_stats */
  double scale;
} prom_metric;

#define PM(n, t, h, f, s)                                                      \
  { n, t, h, offsetof(ql_weight_stats, f), s }
static const prom_metric per_weight_metrics[] = {
    PM("qlinear_weight_requests_total", "counter",
       "Linear requests served per weight and device.", requests, 1),
    PM("qlinear_weight_rows_total", "counter",
       "Rows of x computed per weight and device.", rows, 1),
    PM("qlinear_weight_batches_total", "counter",
       "Kernel launches per weight and device.", batches, 1),
    PM("qlinear_weight_queue_seconds_total", "counter",
       "Time requests waited in queues.", queue_ns, 1e-9),
    PM("qlinear_weight_kernel_seconds_total", "counter",
       "Time spent in kernels.", kernel_ns, 1e-9),
    PM("qlinear_weight_resident_bytes", "gauge",
       "Bytes of the weight resident on the device.", bytes_resident, 1),
    PM("qlinear_weight_expired_total", "counter",
       "Requests answered DEADLINE_EXCEEDED without running.", expired, 1),
};

static void prom_labels(const ql_weight_stats *w) {
  fputs("{weight=\"", stdout);
  prom_label(w->weight);
  fputs("\",device=\"", stdout);
  prom_label(w->device);
  fputs("\"", stdout);
}

/* A log2 histogram of ql_weight_stats as a Prometheus histogram in
 * seconds: cumulative buckets up to each bucket's upper bound, +Inf, then
 * the sum and the count. */
static void prom_hist(const char *name, const char *help,
                      const ql_stats_info *s, size_t hist_off, size_t sum_off) {
  prom_head(name, "histogram", help);
  for (size_t i = 0; i < s->n_per_weight; i++) {
    const ql_weight_stats *w = &s->per_weight[i];
    const uint64_t *h = (const uint64_t *)((const char *)w + hist_off);
    uint64_t cum = 0, sum;
    memcpy(&sum, (const char *)w + sum_off, sizeof sum);
    for (int b = 0; b < QL_HIST_BUCKETS - 1; b++) {
      cum += h[b];
      printf("%s_bucket", name);
      prom_labels(w);
      printf(",le=\"%.9g\"} %" PRIu64 "\n", (double)(1024ull << b) * 1e-9, cum);
    }
    cum += h[QL_HIST_BUCKETS - 1];
    printf("%s_bucket", name);
    prom_labels(w);
    printf(",le=\"+Inf\"} %" PRIu64 "\n", cum);
    printf("%s_sum", name);
    prom_labels(w);
    printf("} %.9g\n", (double)sum * 1e-9);
    printf("%s_count", name);
    prom_labels(w);
    printf("} %" PRIu64 "\n", cum);
  }
}

static void print_prometheus(const ql_stats_info *s) {
  prom_head("qlinear_uptime_seconds", "gauge", "Time since qlineard started.");
  printf("qlinear_uptime_seconds %.3f\n", (double)s->uptime_ns / 1e9);
  prom_head("qlinear_requests_total", "counter", "Requests received.");
  printf("qlinear_requests_total %" PRIu64 "\n", s->requests);
  prom_head("qlinear_errors_total", "counter",
            "Requests answered with an error.");
  printf("qlinear_errors_total %" PRIu64 "\n", s->errors);
  prom_head("qlinear_received_bytes_total", "counter",
            "Request bytes received.");
  printf("qlinear_received_bytes_total %" PRIu64 "\n", s->bytes_in);
  prom_head("qlinear_sent_bytes_total", "counter", "Reply bytes sent.");
  printf("qlinear_sent_bytes_total %" PRIu64 "\n", s->bytes_out);
  prom_head("qlinear_weights", "gauge", "Weights resident.");
  printf("qlinear_weights %" PRIu64 "\n", s->weights);
  prom_head("qlinear_uploads_in_progress", "gauge",
            "Uploads begun and neither committed nor aborted.");
  printf("qlinear_uploads_in_progress %" PRIu64 "\n", s->uploads_in_progress);
  prom_head("qlinear_persistent_weights", "gauge",
            "Weights stored in the state directory.");
  printf("qlinear_persistent_weights %" PRIu64 "\n", s->persistent_weights);
  prom_head("qlinear_rings", "gauge",
            "Sessions with a ring (the shared-memory fast path).");
  printf("qlinear_rings %" PRIu64 "\n", s->rings);
  prom_head("qlinear_ring_requests_total", "counter",
            "Requests received through rings.");
  printf("qlinear_ring_requests_total %" PRIu64 "\n", s->ring_requests);
  prom_head("qlinear_device_weight_bytes", "gauge",
            "Bytes of weights resident on a device.");
  for (size_t i = 0; i < s->n_devices; i++) {
    fputs("qlinear_device_weight_bytes{device=\"", stdout);
    prom_label(s->devices[i].device);
    printf("\"} %" PRIu64 "\n", s->devices[i].bytes_resident);
  }
  prom_head("qlinear_device_budget_bytes", "gauge",
            "Weight bytes a device may hold; 0: no budget.");
  for (size_t i = 0; i < s->n_devices; i++) {
    fputs("qlinear_device_budget_bytes{device=\"", stdout);
    prom_label(s->devices[i].device);
    printf("\"} %" PRIu64 "\n", s->devices[i].budget_bytes);
  }

  for (size_t m = 0;
       m < sizeof per_weight_metrics / sizeof per_weight_metrics[0]; m++) {
    const prom_metric *pm = &per_weight_metrics[m];
    prom_head(pm->name, pm->type, pm->help);
    for (size_t i = 0; i < s->n_per_weight; i++) {
      const ql_weight_stats *w = &s->per_weight[i];
      uint64_t v;
      memcpy(&v, (const char *)w + pm->offset, sizeof v);
      fputs(pm->name, stdout);
      prom_labels(w);
      if (pm->scale == 1)
        printf("} %" PRIu64 "\n", v);
      else
        printf("} %.9g\n", (double)v * pm->scale);
    }
  }
  prom_head("qlinear_weight_path_batches_total", "counter",
            "Kernel launches per path: weight-only (wo) or "
            "activation-quantized (aq).");
  for (size_t i = 0; i < s->n_per_weight; i++) {
    const ql_weight_stats *w = &s->per_weight[i];
    fputs("qlinear_weight_path_batches_total", stdout);
    prom_labels(w);
    printf(",path=\"wo\"} %" PRIu64 "\n", w->wo_batches);
    fputs("qlinear_weight_path_batches_total", stdout);
    prom_labels(w);
    printf(",path=\"aq\"} %" PRIu64 "\n", w->aq_batches);
  }
  prom_hist("qlinear_weight_queue_wait_seconds",
            "Time from a request's arrival to its first launch.", s,
            offsetof(ql_weight_stats, queue_hist),
            offsetof(ql_weight_stats, queue_ns));
  prom_hist("qlinear_weight_launch_seconds", "Time of one kernel launch.", s,
            offsetof(ql_weight_stats, kernel_hist),
            offsetof(ql_weight_stats, kernel_ns));
  prom_head("qlinear_weight_info", "gauge",
            "The kernel implementation last used, as a label.");
  for (size_t i = 0; i < s->n_per_weight; i++) {
    const ql_weight_stats *w = &s->per_weight[i];
    fputs("qlinear_weight_info", stdout);
    prom_labels(w);
    fputs(",impl=\"", stdout);
    prom_label(w->impl);
    fputs("\"} 1\n", stdout);
  }
}

static void print_stats_table(const ql_stats_info *s) {
  char b1[32], b2[32];
  uint64_t secs = s->uptime_ns / 1000000000u;
  int namew = 6, devw = 6;

  printf("uptime        %" PRIu64 "d %02" PRIu64 ":%02" PRIu64 ":%02" PRIu64
         "\n",
         secs / 86400, secs / 3600 % 24, secs / 60 % 60, secs % 60);
  printf("requests      %" PRIu64 " (%" PRIu64 " errors; %" PRIu64
         " through the rings of %" PRIu64 " sessions)\n",
         s->requests, s->errors, s->ring_requests, s->rings);
  printf("traffic       %s in, %s out\n",
         ql__ctl_human_bytes(s->bytes_in, b1, sizeof b1),
         ql__ctl_human_bytes(s->bytes_out, b2, sizeof b2));
  printf("weights       %" PRIu64 " (%" PRIu64 " stored, %" PRIu64
         " uploads in progress)\n",
         s->weights, s->persistent_weights, s->uploads_in_progress);
  for (size_t i = 0; i < s->n_devices; i++) {
    const ql_device_memory *d = &s->devices[i];
    printf("memory        %s: %s", d->device,
           ql__ctl_human_bytes(d->bytes_resident, b1, sizeof b1));
    if (d->budget_bytes != 0)
      printf(" of %s budget",
             ql__ctl_human_bytes(d->budget_bytes, b2, sizeof b2));
    putchar('\n');
  }
  /* One line a user: its share of the budgets (uid_share). */
  for (size_t i = 0; i < s->n_users; i++) {
    const ql_user_stats *u = &s->users[i];
    printf("user          uid %" PRIu32 ": %" PRIu32 " sessions, %" PRIu64
           " requests queued (%s), %" PRIu64 " uploads (%s), %" PRIu64
           " refused for its share\n",
           u->uid, u->sessions, u->queued_requests,
           ql__ctl_human_bytes(u->queued_bytes, b1, sizeof b1), u->uploads,
           ql__ctl_human_bytes(u->upload_bytes, b2, sizeof b2), u->refused);
  }
  if (s->n_per_weight == 0)
    return;

  for (size_t i = 0; i < s->n_per_weight; i++) {
    int l = (int)strlen(s->per_weight[i].weight);
    int d = (int)strlen(s->per_weight[i].device);
    namew = l > namew ? l : namew;
    devw = d > devw ? d : devw;
  }
  printf("\n%-*s  %-*s  %9s %10s %9s %7s %9s %9s %8s %10s %10s  %10s  "
         "%-20s %s\n",
         namew, "WEIGHT", devw, "DEVICE", "REQUESTS", "ROWS", "BATCHES",
         "ROWS/B", "WO", "AQ", "EXPIRED", "QUEUE/REQ", "KERNEL/B", "RESIDENT",
         "IMPL", "AQ FROM");
  for (size_t i = 0; i < s->n_per_weight; i++) {
    const ql_weight_stats *w = &s->per_weight[i];
    char q[32], k[32], r[32];
    ql__ctl_human_ns(w->requests ? (double)w->queue_ns / (double)w->requests
                                 : 0,
                     q, sizeof q);
    ql__ctl_human_ns(w->batches ? (double)w->kernel_ns / (double)w->batches : 0,
                     k, sizeof k);
    /* This device's crossover; '*': measured here. */
    char xo[24];
    if (w->crossover_rows == UINT32_MAX)
      snprintf(xo, sizeof xo, "never%s", w->crossover_measured ? "*" : "");
    else
      snprintf(xo, sizeof xo, "%u%s", w->crossover_rows,
               w->crossover_measured ? "*" : "");
    printf("%-*s  %-*s  %9" PRIu64 " %10" PRIu64 " %9" PRIu64 " %7.1f %9" PRIu64
           " %9" PRIu64 " %8" PRIu64 " %10s %10s  %10s  %-20s %s\n",
           namew, w->weight, devw, w->device, w->requests, w->rows, w->batches,
           w->batches ? (double)w->rows / (double)w->batches : 0.0,
           w->wo_batches, w->aq_batches, w->expired, q, k,
           ql__ctl_human_bytes(w->bytes_resident, r, sizeof r), w->impl, xo);
  }
}

int ql__cmd_stats(ctx *cx, int argc, char **argv) {
  static const struct option opts[] = {{"prometheus", no_argument, NULL, 'p'},
                                       {"help", no_argument, NULL, 'h'},
                                       {NULL, 0, NULL, 0}};
  ql_stats_info *s = NULL;
  bool prom = false;
  int ch, rv;

  ql__ctl_getopt_reset();
  while ((ch = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    switch (ch) {
    case 'p':
      prom = true;
      break;
    case 'h':
      puts("usage: qlinearctl stats [--prometheus]");
      return 0;
    default:
      return ql__ctl_bad_option("stats", argv);
    }
  }
  if (optind != argc)
    return ql__ctl_usage_error("stats takes no arguments");
  if ((rv = ql__ctl_connect_ctx(cx)) != 0)
    return rv;
  if ((rv = ql_stats(cx->client, &s)) != 0)
    return ql__ctl_fail_ql("stats", rv);
  if (prom)
    print_prometheus(s);
  else
    print_stats_table(s);
  ql_stats_free(s);
  return 0;
}
