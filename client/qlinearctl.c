/*
 * qlinearctl.c - the command-line client of qlineard.
 *
 *   qlinearctl [-a ADDRESS] [-t TIMEOUT_MS] COMMAND [ARGS]
 *
 * Every command is a thin layer over one or two libqlinear calls; arrays
 * come from and go to NumPy .npy files (npy.c). Exit status: 0 on success,
 * 1 when a call or a file fails (the message says which and why), 2 for
 * usage errors.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "npy.h"
#include "qlinear/qlinear.h"

#define EXIT_USAGE 2
/* Values printed by 'linear' without -o. */
#define PRINT_ROWS 16
#define PRINT_COLS 8

static const char usage_text[] =
    "usage: qlinearctl [--admin] [-a ADDRESS] [-t TIMEOUT_MS] COMMAND [ARGS]\n"
    "\n"
    "Talks to qlineard, the daemon that serves quantized linear layers.\n"
    "\n"
    "options:\n"
    "  -a, --address ADDRESS  daemon address (default: $QLINEAR_ADDRESS, else\n"
    "                         ipc://$XDG_RUNTIME_DIR/qlinear/qlineard.sock, else\n"
    "                         ipc:///tmp/qlinear-$UID/qlineard.sock)\n"
    "      --admin            talk to the admin socket (default address:\n"
    "                         $QLINEAR_ADMIN_ADDRESS, else admin/admin.sock\n"
    "                         beside the default socket): persistent loads,\n"
    "                         unloading any weight, reload\n"
    "  -t, --timeout MS       time limit of each request in milliseconds\n"
    "                         (default 30000; 0 waits forever)\n"
    "  -h, --help             show this help\n"
    "\n"
    "commands:\n"
    "  status                 daemon version, instance, limits and devices\n"
    "  list                   resident weights\n"
    "  load NAME FILE.npy --format FMT [--bias FILE.npy] [--policy POLICY]\n"
    "       [--scale-dtype DTYPE] [--bf16] [--persistent]\n"
    "                         upload a float weight [N, K] for the daemon to\n"
    "                         quantize; FMT is q4g32..q4g256, q8c, q8b32..q8b256\n"
    "                         (q8b32a.. asymmetric) or f8r; POLICY auto or\n"
    "                         weight-only; DTYPE of the scales bf16, f16 or\n"
    "                         f32 (default: as TorchAO, the data's own dtype);\n"
    "                         --persistent (with --admin) stores it: it stays\n"
    "                         resident, across restarts, until an admin unload\n"
    "  unload NAME            drop this client's hold on a weight; with\n"
    "                         --admin, remove it (and its stored file)\n"
    "  linear NAME X.npy [-o Y.npy] [--path auto|wo|aq] [--bf16]\n"
    "                         y = x.W^T + b for x [M, K] (or [K]); y has x's\n"
    "                         data type; without -o the values are printed\n"
    "  stats [--prometheus]   request, batch and kernel counters\n"
    "  reload                 (with --admin) re-read the daemon's config\n"
    "\n"
    ".npy files hold '<f4' or '<f2' arrays; with --bf16, '<u2' arrays are\n"
    "taken as bf16 bit patterns (and y is written as '<u2').\n";

/* What every command needs: the connection settings and, once made, the
 * connection. */
typedef struct ctx {
  const char *address; /* NULL: the library's default */
  int timeout_ms;      /* 0: default, -1: forever */
  int admin;           /* --admin: the admin socket, no session */
  ql_client *client;
} ctx;

/* ------------------------------------------------------------ messages */

__attribute__((format(printf, 1, 2))) static int usage_error(const char *fmt,
                                                             ...) {
  va_list ap;
  fputs("qlinearctl: ", stderr);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputs("\nTry 'qlinearctl --help'.\n", stderr);
  return EXIT_USAGE;
}

/* getopt_long failed on a command's arguments (opterr is 0, so it said
 * nothing): name the offending argument. */
static int bad_option(const char *cmd, char **argv) {
  return usage_error("%s: unknown option or missing argument: '%s'", cmd,
                     argv[optind - 1]);
}

/* "qlinearctl: <what>: <ql_strerror(code)>: <ql_errmsg()>" for a failed
 * library call. */
static int fail_ql(const char *what, int code) {
  const char *detail = ql_errmsg();
  fprintf(stderr, "qlinearctl: %s: %s%s%s\n", what, ql_strerror(code),
          detail[0] != '\0' ? ": " : "", detail);
  return EXIT_FAILURE;
}

/* The same shape for a local failure with its own detail. */
__attribute__((format(printf, 3, 4))) static int fail_local(const char *what,
                                                            int code,
                                                            const char *fmt,
                                                            ...) {
  va_list ap;
  fprintf(stderr, "qlinearctl: %s: %s: ", what, ql_strerror(code));
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  return EXIT_FAILURE;
}

static int connect_ctx(ctx *cx) {
  ql_connect_opts opts = {0};
  char what[QL_ADDRESS_MAX + 16];
  opts.timeout_ms = cx->timeout_ms;
  opts.client_name = "qlinearctl";
  opts.admin = cx->admin;
  int rv = ql_connect(cx->address, &opts, &cx->client);
  if (rv != 0) {
    char def[QL_ADDRESS_MAX];
    const char *a = cx->address;
    if (a == NULL)
      a = ql_default_address(def, sizeof def) == 0 ? def : "default address";
    snprintf(what, sizeof what, "connect %s", a);
    return fail_ql(what, rv);
  }
  return 0;
}

/* ------------------------------------------------------------ formatting */

static const char *human_bytes(uint64_t b, char *buf, size_t len) {
  static const char *const units[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  if (b < 1024) {
    snprintf(buf, len, "%" PRIu64 " B", b);
    return buf;
  }
  double v = (double)b / 1024;
  size_t u = 0;
  while (v >= 1024 && u + 1 < sizeof units / sizeof units[0]) {
    v /= 1024;
    u++;
  }
  snprintf(buf, len, "%.1f %s", v, units[u]);
  return buf;
}

static const char *human_ns(double ns, char *buf, size_t len) {
  if (ns < 1e3)
    snprintf(buf, len, "%.0f ns", ns);
  else if (ns < 1e6)
    snprintf(buf, len, "%.1f us", ns / 1e3);
  else if (ns < 1e9)
    snprintf(buf, len, "%.1f ms", ns / 1e6);
  else
    snprintf(buf, len, "%.2f s", ns / 1e9);
  return buf;
}

static const char *format_name(int format, uint32_t group, char *buf,
                               size_t len) {
  switch (format) {
  case QL_FORMAT_Q4G:
    snprintf(buf, len, "q4g%" PRIu32, group);
    break;
  case QL_FORMAT_Q8C:
    snprintf(buf, len, "q8c");
    break;
  case QL_FORMAT_Q8B:
    snprintf(buf, len, "q8b%" PRIu32, group);
    break;
  case QL_FORMAT_F8R:
    snprintf(buf, len, "f8r");
    break;
  default:
    snprintf(buf, len, "format%d", format);
    break;
  }
  return buf;
}

static const char *path_name(int path) {
  switch (path) {
  case QL_PATH_AUTO:
    return "auto";
  case QL_PATH_WEIGHT_ONLY:
    return "weight-only";
  case QL_PATH_ACT_QUANT:
    return "act-quant";
  default:
    return "unknown";
  }
}

static const char *dtype_name(int dt) {
  switch (dt) {
  case QL_DTYPE_F32:
    return "f32";
  case QL_DTYPE_F16:
    return "f16";
  case QL_DTYPE_BF16:
    return "bf16";
  default:
    return "-";
  }
}

static void hex(const uint8_t *b, size_t n, char *out) {
  for (size_t i = 0; i < n; i++)
    snprintf(out + 2 * i, 3, "%02x", b[i]);
}

/* ------------------------------------------------------------ arguments */

/* getopt_long over a command's own arguments (argv[0] is the command).
 * optind = 0 makes glibc start over, and it permutes, so options may
 * follow the positional arguments. */
static void getopt_reset(void) {
  optind = 0;
  opterr = 0;
}

/* q4g<G>, q8b<B> (symmetric), q8b<B>a (asymmetric), q8c, f8r; G and B
 * in 32, 64, 128, 256. */
static int parse_format(const char *s, ql_format *fmt, uint32_t *group,
                        int *asym) {
  *asym = 0;
  *group = 0;
  if (strcmp(s, "q8c") == 0 || strcmp(s, "f8r") == 0) {
    *fmt = s[0] == 'q' ? QL_FORMAT_Q8C : QL_FORMAT_F8R;
    return 0;
  }
  static const uint32_t sizes[] = {32, 64, 128, 256};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    char q4[16], q8[16], q8a[16];
    snprintf(q4, sizeof q4, "q4g%" PRIu32, sizes[i]);
    snprintf(q8, sizeof q8, "q8b%" PRIu32, sizes[i]);
    snprintf(q8a, sizeof q8a, "q8b%" PRIu32 "a", sizes[i]);
    if (strcmp(s, q4) == 0 || strcmp(s, q8) == 0 || strcmp(s, q8a) == 0) {
      *fmt = s[1] == '4' ? QL_FORMAT_Q4G : QL_FORMAT_Q8B;
      *group = sizes[i];
      *asym = strcmp(s, q8a) == 0;
      return 0;
    }
  }
  return -1;
}

static int parse_path(const char *s, ql_path *p) {
  if (strcmp(s, "auto") == 0)
    *p = QL_PATH_AUTO;
  else if (strcmp(s, "wo") == 0 || strcmp(s, "weight-only") == 0)
    *p = QL_PATH_WEIGHT_ONLY;
  else if (strcmp(s, "aq") == 0 || strcmp(s, "act-quant") == 0)
    *p = QL_PATH_ACT_QUANT;
  else
    return -1;
  return 0;
}

static int parse_dtype(const char *s, int *dt) {
  if (strcmp(s, "bf16") == 0)
    *dt = QL_DTYPE_BF16;
  else if (strcmp(s, "f16") == 0)
    *dt = QL_DTYPE_F16;
  else if (strcmp(s, "f32") == 0)
    *dt = QL_DTYPE_F32;
  else
    return -1;
  return 0;
}

/* Loads an .npy file and maps its element type to a ql_dtype; '<u2' is
 * bf16 only when the user said so. */
static int load_array(const char *path, bool bf16, ql__npy *a, ql_dtype *dt) {
  char err[256];
  int rv = ql__npy_load(path, a, err, sizeof err);
  if (rv != 0)
    return fail_local(path, rv, "%s", err);
  switch (a->type) {
  case QL__NPY_F32:
    *dt = QL_DTYPE_F32;
    return 0;
  case QL__NPY_F16:
    *dt = QL_DTYPE_F16;
    return 0;
  case QL__NPY_U16:
    if (bf16) {
      *dt = QL_DTYPE_BF16;
      return 0;
    }
    rv = fail_local(path, QL_EDTYPE, "'<u2' data; pass --bf16 if it holds "
                                     "bf16 values");
    break;
  }
  ql__npy_free(a);
  return rv != 0 ? rv : EXIT_FAILURE;
}

/* ------------------------------------------------------------ status */

static int cmd_status(ctx *cx, int argc, char **argv) {
  static const struct option opts[] = {{"help", no_argument, NULL, 'h'},
                                       {NULL, 0, NULL, 0}};
  ql_hello_info h;
  char addr[QL_ADDRESS_MAX], id[2 * QL_INSTANCE_ID_BYTES + 1], b1[32];
  int ch, rv;

  getopt_reset();
  while ((ch = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    if (ch == 'h') {
      puts("usage: qlinearctl status");
      return 0;
    }
    return bad_option("status", argv);
  }
  if (optind != argc)
    return usage_error("status takes no arguments");
  if ((rv = connect_ctx(cx)) != 0)
    return rv;
  if ((rv = ql_hello(cx->client, &h)) != 0)
    return fail_ql("hello", rv);

  if (cx->address != NULL)
    snprintf(addr, sizeof addr, "%s", cx->address);
  else if (ql_default_address(addr, sizeof addr) != 0)
    snprintf(addr, sizeof addr, "(default)");
  hex(h.instance_id, sizeof h.instance_id, id);
  printf("address       %s\n", addr);
  printf("daemon        %s\n", h.daemon_version);
  printf("protocol      %" PRIu32 "\n", h.protocol_version);
  printf("instance      %s\n", id);
  printf("message cap   %s (%" PRIu64 " bytes)\n",
         human_bytes(h.max_message_bytes, b1, sizeof b1), h.max_message_bytes);
  if (h.max_chunk_bytes != 0)
    printf("chunk limit   %s (%" PRIu64 " bytes)\n",
           human_bytes(h.max_chunk_bytes, b1, sizeof b1), h.max_chunk_bytes);
  printf("devices       %zu\n", h.n_devices_total);
  for (size_t i = 0; i < h.n_devices; i++)
    printf("  %-10s %-6s %s\n", h.devices[i].alias, h.devices[i].kind,
           h.devices[i].name);
  if (h.n_devices < h.n_devices_total)
    printf("  ... and %zu more\n", h.n_devices_total - h.n_devices);
  return 0;
}

/* ------------------------------------------------------------ list */

static int cmd_list(ctx *cx, int argc, char **argv) {
  static const struct option opts[] = {{"help", no_argument, NULL, 'h'},
                                       {NULL, 0, NULL, 0}};
  ql_weight_info *w = NULL;
  size_t n = 0;
  int ch, rv, namew = 4;

  getopt_reset();
  while ((ch = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    if (ch == 'h') {
      puts("usage: qlinearctl list");
      return 0;
    }
    return bad_option("list", argv);
  }
  if (optind != argc)
    return usage_error("list takes no arguments");
  if ((rv = connect_ctx(cx)) != 0)
    return rv;
  if ((rv = ql_list(cx->client, &w, &n)) != 0)
    return fail_ql("list", rv);

  for (size_t i = 0; i < n; i++) {
    int len = (int)strlen(w[i].name);
    if (len > namew)
      namew = len;
  }
  printf("%-*s  %-7s %-13s %-4s  %-6s  %-7s  %-12s  %10s  %s\n", namew,
         "NAME", "FORMAT", "N x K", "BIAS", "STORED", "AQ FROM", "DIGEST",
         "RESIDENT", "DEVICES");
  for (size_t i = 0; i < n; i++) {
    char fmt[32], shape[48], dg[2 * QL_DIGEST_BYTES + 1], bytes[32], xo[24];
    format_name(w[i].format, w[i].group_size, fmt, sizeof fmt);
    if (w[i].asymmetric)
      strncat(fmt, "a", sizeof fmt - strlen(fmt) - 1);
    snprintf(shape, sizeof shape, "%" PRIu64 "x%" PRIu64, w[i].n, w[i].k);
    hex(w[i].digest, sizeof w[i].digest, dg);
    /* The crossover: "4*" measured, "16" a default or configured value. */
    if (w[i].crossover_rows == UINT32_MAX)
      snprintf(xo, sizeof xo, "never%s", w[i].crossover_measured ? "*" : "");
    else
      snprintf(xo, sizeof xo, "%u%s", w[i].crossover_rows,
               w[i].crossover_measured ? "*" : "");
    dg[12] = '\0';
    printf("%-*s  %-7s %-13s %-4s  %-6s  %-7s  %-12s  %10s  %s\n", namew,
           w[i].name, fmt, shape, w[i].has_bias ? "yes" : "no",
           w[i].persistent ? "yes" : "no", xo, dg,
           human_bytes(w[i].bytes_resident, bytes, sizeof bytes),
           w[i].devices);
  }
  ql_free(w);
  return 0;
}

/* ------------------------------------------------------------ load */

/* The progress bar of 'load', drawn on stderr when it is a terminal. */
typedef struct bar {
  const char *name;
  int last; /* last permille drawn, -1 before the first */
} bar;

static void draw_bar(void *arg, uint64_t done, uint64_t total) {
  bar *b = arg;
  char d[32], t[32];
  int permille = total > 0 ? (int)((double)done * 1000 / (double)total) : 1000;
  if (permille == b->last)
    return;
  b->last = permille;
  int fill = permille * 30 / 1000;
  fprintf(stderr, "\r\033[Kloading %s [%.*s%*s] %3d%% %s / %s", b->name, fill,
          "##############################", 30 - fill, "", permille / 10,
          human_bytes(done, d, sizeof d), human_bytes(total, t, sizeof t));
  fflush(stderr);
}

static int cmd_load(ctx *cx, int argc, char **argv) {
  enum { OPT_FORMAT = 256, OPT_BIAS, OPT_POLICY, OPT_SCALE, OPT_BF16, OPT_PERSISTENT };
  static const struct option opts[] = {
      {"format", required_argument, NULL, OPT_FORMAT},
      {"bias", required_argument, NULL, OPT_BIAS},
      {"policy", required_argument, NULL, OPT_POLICY},
      {"scale-dtype", required_argument, NULL, OPT_SCALE},
      {"bf16", no_argument, NULL, OPT_BF16},
      {"persistent", no_argument, NULL, OPT_PERSISTENT},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0}};
  const char *bias_path = NULL, *format = NULL;
  ql__npy w = {0}, b = {0};
  ql_load_desc d = {0};
  ql_dtype wdt = QL_DTYPE_F32, bdt = QL_DTYPE_F32;
  bool bf16 = false;
  bar pb = {NULL, -1};
  int ch, rv, shared = 0;

  getopt_reset();
  while ((ch = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    switch (ch) {
    case OPT_FORMAT:
      format = optarg;
      if (parse_format(optarg, &d.format, &d.group_size, &d.asymmetric) != 0)
        return usage_error("load: unknown format '%s' (q4g32..q4g256, q8c, "
                           "q8b32..q8b256, q8b32a..q8b256a or f8r)", optarg);
      break;
    case OPT_BIAS:
      bias_path = optarg;
      break;
    case OPT_POLICY:
      if (strcmp(optarg, "auto") == 0)
        d.policy = QL_PATH_AUTO;
      else if (strcmp(optarg, "weight-only") == 0 || strcmp(optarg, "wo") == 0)
        d.policy = QL_PATH_WEIGHT_ONLY;
      else
        return usage_error("load: unknown policy '%s' (auto or weight-only)",
                           optarg);
      break;
    case OPT_SCALE:
      if (parse_dtype(optarg, &d.scale_dtype) != 0)
        return usage_error("load: unknown scale dtype '%s' (bf16, f16 or "
                           "f32)", optarg);
      break;
    case OPT_BF16:
      bf16 = true;
      break;
    case OPT_PERSISTENT:
      d.persistent = 1;
      break;
    case 'h':
      puts("usage: qlinearctl load NAME FILE.npy --format "
           "q4g{32,64,128,256}|q8c|q8b{32,64,128,256}[a]|f8r\n"
           "                       [--bias FILE.npy] [--policy "
           "auto|weight-only]\n"
           "                       [--scale-dtype bf16|f16|f32] [--bf16] [--persistent]");
      return 0;
    default:
      return bad_option("load", argv);
    }
  }
  if (argc - optind != 2)
    return usage_error("load needs NAME and FILE.npy");
  if (format == NULL)
    return usage_error("load needs --format");
  d.name = argv[optind];
  const char *wpath = argv[optind + 1];

  if ((rv = load_array(wpath, bf16, &w, &wdt)) != 0)
    goto done;
  if (w.ndim != 2) {
    rv = fail_local(wpath, QL_ESHAPE, "the weight must be 2-D [N, K], this "
                                      "array is 1-D");
    goto done;
  }
  if (bias_path != NULL) {
    if ((rv = load_array(bias_path, bf16, &b, &bdt)) != 0)
      goto done;
    if (b.ndim != 1 || b.shape[0] != w.shape[0]) {
      rv = fail_local(bias_path, QL_ESHAPE,
                      "the bias must be 1-D [N] with N = %" PRIu64,
                      w.shape[0]);
      goto done;
    }
    if (bdt != wdt) {
      rv = fail_local(bias_path, QL_EDTYPE, "the bias is %s, the weight %s",
                      dtype_name(bdt), dtype_name(wdt));
      goto done;
    }
    d.bias = b.data;
  }
  d.n = w.shape[0];
  d.k = w.shape[1];
  d.dtype = wdt;
  d.data = w.data;
  if (isatty(STDERR_FILENO)) {
    pb.name = d.name;
    d.progress = draw_bar;
    d.progress_arg = &pb;
  }

  if ((rv = connect_ctx(cx)) != 0)
    goto done;
  rv = ql_load_float(cx->client, &d, NULL, &shared);
  if (pb.last >= 0)
    fputs("\r\033[K", stderr);
  if (rv != 0) {
    char what[QL_NAME_MAX + 8];
    snprintf(what, sizeof what, "load %s", d.name);
    rv = fail_ql(what, rv);
    goto done;
  }
  printf("loaded %s%s\n", d.name, shared ? " (shared)" : "");

done:
  ql__npy_free(&w);
  ql__npy_free(&b);
  return rv;
}

/* ------------------------------------------------------------ unload */

static int cmd_unload(ctx *cx, int argc, char **argv) {
  static const struct option opts[] = {{"help", no_argument, NULL, 'h'},
                                       {NULL, 0, NULL, 0}};
  int ch, rv;

  getopt_reset();
  while ((ch = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    if (ch == 'h') {
      puts("usage: qlinearctl unload NAME");
      return 0;
    }
    return bad_option("unload", argv);
  }
  if (argc - optind != 1)
    return usage_error("unload needs NAME");
  const char *name = argv[optind];
  if ((rv = connect_ctx(cx)) != 0)
    return rv;
  if ((rv = ql_unload(cx->client, name)) != 0) {
    char what[QL_NAME_MAX + 8];
    snprintf(what, sizeof what, "unload %s", name);
    return fail_ql(what, rv);
  }
  printf("unloaded %s\n", name);
  return 0;
}

/* ------------------------------------------------------------ linear */

static float f16_to_f32(uint16_t h) {
  int sign = h >> 15, e = (h >> 10) & 0x1f, m = h & 0x3ff;
  float v;
  if (e == 0)
    v = ldexpf((float)m, -24); /* zero or subnormal */
  else if (e == 31)
    v = m != 0 ? NAN : INFINITY;
  else
    v = ldexpf((float)(m | 0x400), e - 25);
  return sign ? -v : v;
}

static float element(const void *data, ql_dtype dt, size_t i) {
  const unsigned char *p = data;
  if (dt == QL_DTYPE_F32) {
    float f;
    memcpy(&f, p + 4 * i, 4);
    return f;
  }
  uint16_t h;
  memcpy(&h, p + 2 * i, 2);
  if (dt == QL_DTYPE_F16)
    return f16_to_f32(h);
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* Prints up to PRINT_ROWS x PRINT_COLS values, the first and last ones of
 * each dimension when there are more. */
static void print_matrix(const void *y, ql_dtype dt, uint64_t m, uint64_t n) {
  for (uint64_t i = 0; i < m; i++) {
    if (m > PRINT_ROWS && i == PRINT_ROWS / 2) {
      puts("  ...");
      i = m - PRINT_ROWS / 2;
    }
    fputs(" ", stdout);
    for (uint64_t j = 0; j < n; j++) {
      if (n > PRINT_COLS && j == PRINT_COLS / 2) {
        fputs(" ...", stdout);
        j = n - PRINT_COLS / 2;
      }
      printf(" %12.6g", (double)element(y, dt, (size_t)(i * n + j)));
    }
    putchar('\n');
  }
}

static int cmd_linear(ctx *cx, int argc, char **argv) {
  enum { OPT_PATH = 256, OPT_BF16 };
  static const struct option opts[] = {
      {"output", required_argument, NULL, 'o'},
      {"path", required_argument, NULL, OPT_PATH},
      {"bf16", no_argument, NULL, OPT_BF16},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0}};
  const char *out = NULL;
  ql_path path = QL_PATH_AUTO;
  bool bf16 = false;
  ql__npy x = {0};
  ql_dtype dt = QL_DTYPE_F32;
  ql_weight_info info;
  ql_linear_result res;
  void *y = NULL;
  char what[QL_NAME_MAX + 8], err[256];
  int ch, rv;

  getopt_reset();
  while ((ch = getopt_long(argc, argv, "o:h", opts, NULL)) != -1) {
    switch (ch) {
    case 'o':
      out = optarg;
      break;
    case OPT_PATH:
      if (parse_path(optarg, &path) != 0)
        return usage_error("linear: unknown path '%s' (auto, wo or aq)",
                           optarg);
      break;
    case OPT_BF16:
      bf16 = true;
      break;
    case 'h':
      puts("usage: qlinearctl linear NAME X.npy [-o Y.npy] [--path "
           "auto|wo|aq] [--bf16]");
      return 0;
    default:
      return bad_option("linear", argv);
    }
  }
  if (argc - optind != 2)
    return usage_error("linear needs NAME and X.npy");
  const char *name = argv[optind], *xpath = argv[optind + 1];
  snprintf(what, sizeof what, "linear %s", name);

  if ((rv = load_array(xpath, bf16, &x, &dt)) != 0)
    goto done;
  /* A 1-D x is one row. */
  uint64_t m = x.ndim == 2 ? x.shape[0] : 1, k = x.ndim == 2 ? x.shape[1]
                                                            : x.shape[0];
  if (m == 0 || k == 0) {
    rv = fail_local(xpath, QL_ESHAPE, "x is empty");
    goto done;
  }
  if ((rv = connect_ctx(cx)) != 0)
    goto done;
  /* The reply's width is the weight's N, which only the daemon knows. */
  if ((rv = ql_lookup(cx->client, name, &info)) != 0) {
    rv = fail_ql(what, rv);
    goto done;
  }
  if (info.k != k) {
    rv = fail_local(what, QL_ESHAPE,
                    "x has K = %" PRIu64 ", the weight has K = %" PRIu64, k,
                    info.k);
    goto done;
  }
  size_t esz = ql_dtype_size(dt);
  if (info.n > SIZE_MAX / esz / m ||
      (y = malloc((size_t)(m * info.n) * esz)) == NULL) {
    rv = fail_local(what, QL_ENOMEM, "y [%" PRIu64 ", %" PRIu64 "]", m,
                    info.n);
    goto done;
  }
  if ((rv = ql_linear(cx->client, name, path, dt, m, k, x.data, info.n, y,
                      &res)) != 0) {
    rv = fail_ql(what, rv);
    goto done;
  }

  if (out != NULL) {
    /* y keeps x's layout: [N] for a 1-D x, [M, N] otherwise. */
    uint64_t shape[2] = {m, info.n};
    if (x.ndim == 1)
      shape[0] = info.n;
    if ((rv = ql__npy_write(out, x.type, x.ndim, shape, y, err,
                            sizeof err)) != 0) {
      rv = fail_local(out, rv, "%s", err);
      goto done;
    }
    fprintf(stderr, "wrote %s: [%" PRIu64 ", %" PRIu64 "] %s, path %s, "
                    "impl %s\n", out, m, info.n, dtype_name(dt),
            path_name(res.path), res.impl);
  } else {
    printf("# y [%" PRIu64 ", %" PRIu64 "] %s, path %s, impl %s\n", m, info.n,
           dtype_name(dt), path_name(res.path), res.impl);
    print_matrix(y, dt, m, info.n);
    if (m > PRINT_ROWS || info.n > PRINT_COLS)
      puts("# not every value is shown; use -o Y.npy to save them all");
  }
  rv = 0;

done:
  free(y);
  ql__npy_free(&x);
  return rv;
}

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

#define PM(n, t, h, f, s) {n, t, h, offsetof(ql_weight_stats, f), s}
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
                      const ql_stats_info *s, size_t hist_off,
                      size_t sum_off) {
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
      printf(",le=\"%.9g\"} %" PRIu64 "\n", (double)(1024ull << b) * 1e-9,
             cum);
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

  for (size_t m = 0; m < sizeof per_weight_metrics / sizeof per_weight_metrics[0];
       m++) {
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
  printf("requests      %" PRIu64 " (%" PRIu64 " errors)\n", s->requests,
         s->errors);
  printf("traffic       %s in, %s out\n",
         human_bytes(s->bytes_in, b1, sizeof b1),
         human_bytes(s->bytes_out, b2, sizeof b2));
  printf("weights       %" PRIu64 " (%" PRIu64 " stored, %" PRIu64
         " uploads in progress)\n",
         s->weights, s->persistent_weights, s->uploads_in_progress);
  for (size_t i = 0; i < s->n_devices; i++) {
    const ql_device_memory *d = &s->devices[i];
    printf("memory        %s: %s", d->device,
           human_bytes(d->bytes_resident, b1, sizeof b1));
    if (d->budget_bytes != 0)
      printf(" of %s budget", human_bytes(d->budget_bytes, b2, sizeof b2));
    putchar('\n');
  }
  if (s->n_per_weight == 0)
    return;

  for (size_t i = 0; i < s->n_per_weight; i++) {
    int l = (int)strlen(s->per_weight[i].weight);
    int d = (int)strlen(s->per_weight[i].device);
    namew = l > namew ? l : namew;
    devw = d > devw ? d : devw;
  }
  printf("\n%-*s  %-*s  %9s %10s %9s %7s %9s %9s %8s %10s %10s  %10s  %s\n",
         namew, "WEIGHT", devw, "DEVICE", "REQUESTS", "ROWS", "BATCHES",
         "ROWS/B", "WO", "AQ", "EXPIRED", "QUEUE/REQ", "KERNEL/B",
         "RESIDENT", "IMPL");
  for (size_t i = 0; i < s->n_per_weight; i++) {
    const ql_weight_stats *w = &s->per_weight[i];
    char q[32], k[32], r[32];
    human_ns(w->requests ? (double)w->queue_ns / (double)w->requests : 0, q,
             sizeof q);
    human_ns(w->batches ? (double)w->kernel_ns / (double)w->batches : 0, k,
             sizeof k);
    printf("%-*s  %-*s  %9" PRIu64 " %10" PRIu64 " %9" PRIu64 " %7.1f %9" PRIu64
           " %9" PRIu64 " %8" PRIu64 " %10s %10s  %10s  %s\n",
           namew, w->weight, devw, w->device, w->requests, w->rows, w->batches,
           w->batches ? (double)w->rows / (double)w->batches : 0.0,
           w->wo_batches, w->aq_batches, w->expired, q, k,
           human_bytes(w->bytes_resident, r, sizeof r), w->impl);
  }
}

static int cmd_stats(ctx *cx, int argc, char **argv) {
  static const struct option opts[] = {
      {"prometheus", no_argument, NULL, 'p'},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0}};
  ql_stats_info *s = NULL;
  bool prom = false;
  int ch, rv;

  getopt_reset();
  while ((ch = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    switch (ch) {
    case 'p':
      prom = true;
      break;
    case 'h':
      puts("usage: qlinearctl stats [--prometheus]");
      return 0;
    default:
      return bad_option("stats", argv);
    }
  }
  if (optind != argc)
    return usage_error("stats takes no arguments");
  if ((rv = connect_ctx(cx)) != 0)
    return rv;
  if ((rv = ql_stats(cx->client, &s)) != 0)
    return fail_ql("stats", rv);
  if (prom)
    print_prometheus(s);
  else
    print_stats_table(s);
  ql_stats_free(s);
  return 0;
}

/* ------------------------------------------------------------ reload */

static int cmd_reload(ctx *cx, int argc, char **argv) {
  static const struct option opts[] = {{"help", no_argument, NULL, 'h'},
                                       {NULL, 0, NULL, 0}};
  char report[1024];
  int ch, rv;

  getopt_reset();
  while ((ch = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    if (ch == 'h') {
      puts("usage: qlinearctl --admin reload");
      return 0;
    }
    return bad_option("reload", argv);
  }
  if (optind != argc)
    return usage_error("reload takes no arguments");
  if (!cx->admin)
    return usage_error("reload goes through the admin socket: "
                       "qlinearctl --admin reload");
  if ((rv = connect_ctx(cx)) != 0)
    return rv;
  if ((rv = ql_reload_config(cx->client, report, sizeof report)) != 0)
    return fail_ql("reload", rv);
  printf("%s\n", report);
  return 0;
}

/* ------------------------------------------------------------ main */

static const struct command {
  const char *name;
  int (*run)(ctx *cx, int argc, char **argv);
} commands[] = {
    {"status", cmd_status}, {"list", cmd_list},     {"load", cmd_load},
    {"unload", cmd_unload}, {"linear", cmd_linear}, {"stats", cmd_stats},
    {"reload", cmd_reload},
};

int main(int argc, char **argv) {
  static const struct option opts[] = {
      {"address", required_argument, NULL, 'a'},
      {"timeout", required_argument, NULL, 't'},
      {"admin", no_argument, NULL, 'A'},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0}};
  ctx cx = {NULL, 0, 0, NULL};
  int ch, rv;

  /* '+': stop at the command; its options are its own. */
  opterr = 0;
  while ((ch = getopt_long(argc, argv, "+a:t:h", opts, NULL)) != -1) {
    switch (ch) {
    case 'a':
      if (optarg[0] == '\0')
        return usage_error("empty address");
      cx.address = optarg;
      break;
    case 't': {
      char *end;
      errno = 0;
      long v = strtol(optarg, &end, 10);
      if (errno != 0 || end == optarg || *end != '\0' || v < 0 ||
          v > INT_MAX)
        return usage_error("bad timeout '%s' (milliseconds, 0 waits "
                           "forever)", optarg);
      cx.timeout_ms = v == 0 ? -1 : (int)v;
      break;
    }
    case 'A':
      cx.admin = 1;
      break;
    case 'h':
      fputs(usage_text, stdout);
      return 0;
    default:
      return usage_error("unknown option or missing argument: '%s'",
                         argv[optind - 1]);
    }
  }
  if (optind >= argc)
    return usage_error("no command given");
  char admin_addr[QL_ADDRESS_MAX + 64];
  if (cx.admin && cx.address == NULL) {
    if (ql_default_admin_address(admin_addr, sizeof admin_addr) != 0)
      return usage_error("the default admin address does not fit; use -a");
    cx.address = admin_addr;
  }

  const char *name = argv[optind];
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
    if (strcmp(name, commands[i].name) == 0) {
      rv = commands[i].run(&cx, argc - optind, argv + optind);
      ql_close(cx.client);
      if (fflush(stdout) != 0 && rv == 0) {
        fprintf(stderr, "qlinearctl: writing the output: %s\n",
                strerror(errno));
        rv = EXIT_FAILURE;
      }
      return rv;
    }
  }
  return usage_error("unknown command '%s'", name);
}
