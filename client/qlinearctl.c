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
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <regex.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ckpt_import.h"
#include "npy.h"
#include "safetensors.h"
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
    "       [--scale-dtype DTYPE] [--bf16] [--persistent] [--devices LIST]\n"
    "                         upload a float weight [N, K] for the daemon to\n"
    "                         quantize; FMT is q4g32..q4g256, q8c, q8b32..q8b256\n"
    "                         (q8b32a.. asymmetric) or f8r; POLICY auto or\n"
    "                         weight-only; DTYPE of the scales bf16, f16 or\n"
    "                         f32 (default: TorchAO's, byte for byte);\n"
    "                         --persistent (with --admin) stores it: it stays\n"
    "                         resident, across restarts, until an admin unload;\n"
    "                         LIST (names or aliases, comma-separated) places\n"
    "                         it on those devices only (default: every\n"
    "                         accelerator, or the CPU when there is none)\n"
    "  unload NAME            drop this client's hold on a weight; with\n"
    "                         --admin, remove it (and its stored file)\n"
    "  linear NAME X.npy [-o Y.npy] [--path auto|wo|aq] [--bf16]\n"
    "                         y = x.W^T + b for x [M, K] (or [K]); y has x's\n"
    "                         data type; without -o the values are printed\n"
    "  stats [--prometheus]   request, batch and kernel counters\n"
    "  reload                 (with --admin) re-read the daemon's config\n"
    "  import FILE.safetensors|INDEX.json ... [--format FMT] [--match REGEX]\n"
    "       [--prefix NAME/] [--policy POLICY] [--scale-dtype DTYPE] [--persist]\n"
    "       [--devices LIST] [--dry-run]\n"
    "                         import a checkpoint: every GPTQ, AWQ or TorchAO\n"
    "                         layer (converted exactly) and every 2-D float\n"
    "                         X.weight (quantized by the daemon to FMT,\n"
    "                         default q4g128; in a quantized checkpoint only\n"
    "                         with --format, DTYPE of the scales as for\n"
    "                         load), each with its X.bias, as\n"
    "                         weight NAME/X; REGEX (extended) selects X;\n"
    "                         --devices places them as load does;\n"
    "                         --dry-run lists them without a daemon;\n"
    "                         without --admin they live as long as this\n"
    "                         command's session\n"
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
 * nothing): name the offending argument. Within a cluster of short
 * options (-xh) optind has not moved past it yet: optopt names the
 * character. */
static int bad_option(const char *cmd, char **argv) {
  const char *arg = optind > 0 ? argv[optind - 1] : "";
  if (strncmp(arg, "--", 2) != 0 && optopt > ' ' && optopt < 127)
    return usage_error("%s: unknown option or missing argument: '-%c'", cmd,
                       optopt);
  return usage_error("%s: unknown option or missing argument: '%s'", cmd,
                     arg);
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
  /* The address to name in a failure, found first: ql_default_address()
   * after a failed connect would clear the reason it failed. */
  char def[QL_ADDRESS_MAX];
  const char *a = cx->address;
  if (a == NULL)
    a = ql_default_address(def, sizeof def) == 0 ? def : "default address";
  int rv = ql_connect(cx->address, &opts, &cx->client);
  if (rv != 0) {
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
  printf("quantizer     %" PRIu32 "\n", h.quantizer_version);
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

static int by_name(const void *a, const void *b) {
  return strcmp(((const ql_weight_info *)a)->name,
                ((const ql_weight_info *)b)->name);
}

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
  /* By name: the daemon answers in its table's order (w is NULL when n
   * is 0, which qsort may not be given). */
  if (n > 1)
    qsort(w, n, sizeof *w, by_name);

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
  enum { OPT_FORMAT = 256, OPT_BIAS, OPT_POLICY, OPT_SCALE, OPT_BF16,
         OPT_PERSISTENT, OPT_DEVICES };
  static const struct option opts[] = {
      {"format", required_argument, NULL, OPT_FORMAT},
      {"bias", required_argument, NULL, OPT_BIAS},
      {"policy", required_argument, NULL, OPT_POLICY},
      {"scale-dtype", required_argument, NULL, OPT_SCALE},
      {"bf16", no_argument, NULL, OPT_BF16},
      {"persistent", no_argument, NULL, OPT_PERSISTENT},
      {"devices", required_argument, NULL, OPT_DEVICES},
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
    case OPT_DEVICES:
      d.devices = optarg;
      break;
    case 'h':
      puts("usage: qlinearctl load NAME FILE.npy --format "
           "q4g{32,64,128,256}|q8c|q8b{32,64,128,256}[a]|f8r\n"
           "                       [--bias FILE.npy] [--policy "
           "auto|weight-only]\n"
           "                       [--scale-dtype bf16|f16|f32] [--bf16] [--persistent]\n"
           "                       [--devices NAME,...]");
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
  /* A weight lives while a session holds it: this command's session ends
   * when it exits. Say so, not only in the manual. */
  if (!cx->admin)
    printf("note: %s is held by this command's session only and is "
           "unloaded when qlinearctl exits; a serving process loads (or "
           "holds) it itself, and --admin load --persistent keeps it\n",
           d.name);

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
  printf("requests      %" PRIu64 " (%" PRIu64 " errors; %" PRIu64
         " through the rings of %" PRIu64 " sessions)\n",
         s->requests, s->errors, s->ring_requests, s->rings);
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
  printf("\n%-*s  %-*s  %9s %10s %9s %7s %9s %9s %8s %10s %10s  %10s  "
         "%-20s %s\n",
         namew, "WEIGHT", devw, "DEVICE", "REQUESTS", "ROWS", "BATCHES",
         "ROWS/B", "WO", "AQ", "EXPIRED", "QUEUE/REQ", "KERNEL/B",
         "RESIDENT", "IMPL", "AQ FROM");
  for (size_t i = 0; i < s->n_per_weight; i++) {
    const ql_weight_stats *w = &s->per_weight[i];
    char q[32], k[32], r[32];
    human_ns(w->requests ? (double)w->queue_ns / (double)w->requests : 0, q,
             sizeof q);
    human_ns(w->batches ? (double)w->kernel_ns / (double)w->batches : 0, k,
             sizeof k);
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
           human_bytes(w->bytes_resident, r, sizeof r), w->impl, xo);
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

/* ------------------------------------------------------------ import */

/*
 * `qlinearctl import`: every matching layer of safetensors checkpoints,
 * float ones quantized by the daemon (ql_load_float), GPTQ/AWQ ones
 * converted here to the canonical packed form (client/ckpt_import.c) and
 * TorchAO ones, already canonical, uploaded as they are (ql_load_packed).
 */

/* One layer to import. */
typedef struct imp_layer {
  char *name;        /* the layer prefix X (tensor names X.weight, ...) */
  char *wname;       /* the weight's name in the daemon: --prefix + X */
  int quantized;     /* 1: GPTQ/AWQ (canon), 0: float (w) */
  int torchao;       /* 1: a TorchAO subclass (tao) */
  const ql__st_tensor *w, *bias;
  ql__ck_layer ql;
  ql__ck_canon canon;
  ql__ck_torchao tao;
  uint64_t bytes;    /* what is uploaded */
} imp_layer;

typedef struct imp_state {
  ql__st_file **files;
  char **paths;
  size_t n_files;
  imp_layer *layers;
  size_t n_layers, skipped;
  size_t skipped_float; /* float weights of a quantized checkpoint */
  ql__ck_config cfg;
  char cfg_source[4200]; /* where cfg came from, "" for nowhere */
} imp_state;

static void imp_free(imp_state *s) {
  for (size_t i = 0; i < s->n_layers; i++) {
    free(s->layers[i].name);
    free(s->layers[i].wname);
    ql__ck_canon_free(&s->layers[i].canon);
  }
  free(s->layers);
  for (size_t i = 0; i < s->n_files; i++) {
    ql__st_free(s->files[i]);
    free(s->paths[i]);
  }
  free(s->files);
  free(s->paths);
}

static int ends_with(const char *s, const char *suffix) {
  size_t a = strlen(s), b = strlen(suffix);
  return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* The tensor called name in any of the files, or NULL. */
static const ql__st_tensor *imp_find(const imp_state *s, const char *name) {
  for (size_t i = 0; i < s->n_files; i++) {
    const ql__st_tensor *t = ql__st_find(s->files[i], name);
    if (t != NULL)
      return t;
  }
  return NULL;
}

static const ql__st_tensor *imp_find2(const imp_state *s, const char *prefix,
                                      const char *suffix) {
  char buf[1024];
  if (snprintf(buf, sizeof buf, "%s%s", prefix, suffix) >= (int)sizeof buf)
    return NULL;
  return imp_find(s, buf);
}

/* Reads a whole small file (index, config) into a malloc'd buffer. */
static int read_small(const char *path, char **buf, size_t *len) {
  /* Opened O_NONBLOCK and refused unless a regular file: a FIFO beside an
   * untrusted checkpoint would otherwise block the open for good. */
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  struct stat st;
  FILE *f = NULL;
  char *b = NULL;
  long l;
  *buf = NULL;
  if (fd < 0)
    return -errno;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
      (f = fdopen(fd, "rb")) == NULL) {
    close(fd);
    return -EINVAL;
  }
  if (fseek(f, 0, SEEK_END) != 0 || (l = ftell(f)) < 0 || l > (64L << 20) ||
      fseek(f, 0, SEEK_SET) != 0 || (b = malloc((size_t)l + 1)) == NULL ||
      fread(b, 1, (size_t)l, f) != (size_t)l) {
    free(b);
    fclose(f);
    return -EIO;
  }
  fclose(f);
  *buf = b;
  *len = (size_t)l;
  return 0;
}

static int imp_add_file(imp_state *s, const char *path) {
  char err[512];
  for (size_t i = 0; i < s->n_files; i++)
    if (strcmp(s->paths[i], path) == 0)
      return 0;
  ql__st_file **nf = realloc(s->files, (s->n_files + 1) * sizeof *nf);
  if (nf == NULL)
    return fail_local(path, QL_ENOMEM, "out of memory");
  s->files = nf;
  char **np = realloc(s->paths, (s->n_files + 1) * sizeof *np);
  if (np == NULL)
    return fail_local(path, QL_ENOMEM, "out of memory");
  s->paths = np;
  int rc = ql__st_open(path, &s->files[s->n_files], err, sizeof err);
  if (rc != 0)
    return fail_local(path, rc, "%s", err);
  if ((s->paths[s->n_files] = strdup(path)) == NULL) {
    ql__st_free(s->files[s->n_files]);
    return fail_local(path, QL_ENOMEM, "out of memory");
  }
  s->n_files++;
  return 0;
}

/* The shards of one index, opened beside it (for shard_holds). */
typedef struct shard_dir {
  const imp_state *s;
  const char *index; /* its path */
  int dirlen;        /* of its directory, '/' included */
} shard_dir;

/* ql__st_index_check(): does the opened shard of that name hold tensor? */
static int shard_holds(void *arg, const char *shard, const char *tensor) {
  const shard_dir *sd = arg;
  char path[4200];
  snprintf(path, sizeof path, "%.*s%s", sd->dirlen, sd->index, shard);
  for (size_t i = 0; i < sd->s->n_files; i++)
    if (strcmp(sd->s->paths[i], path) == 0)
      return ql__st_find(sd->s->files[i], tensor) != NULL;
  return 0;
}

/* A checkpoint argument: a .safetensors file, or a sharded checkpoint's
 * index whose shards are opened beside it. */
static int imp_add_arg(imp_state *s, const char *arg) {
  char *buf, err[512], path[4200], **shards = NULL;
  size_t len, n = 0;
  int rc;
  if (!ends_with(arg, ".index.json"))
    return imp_add_file(s, arg);
  if ((rc = read_small(arg, &buf, &len)) != 0)
    return fail_local(arg, QL_EIO, "cannot read: %s", strerror(-rc));
  rc = ql__st_index_parse(buf, len, &shards, &n, err, sizeof err);
  if (rc != 0) {
    free(buf);
    return fail_local(arg, rc, "%s", err);
  }
  const char *slash = strrchr(arg, '/');
  int dirlen = slash != NULL ? (int)(slash - arg + 1) : 0;
  for (size_t i = 0; i < n && rc == 0; i++) {
    snprintf(path, sizeof path, "%.*s%s", dirlen, arg, shards[i]);
    rc = imp_add_file(s, path);
  }
  ql__st_strv_free(shards, n);
  /* Every tensor the index names must be in its shard: a shard of another
   * revision, or cut short, would import part of the model as success. */
  shard_dir sd = {s, arg, dirlen};
  if (rc == 0 &&
      (rc = ql__st_index_check(buf, len, shard_holds, &sd, err, sizeof err)) !=
          0)
    rc = fail_local(arg, rc, "%s", err);
  free(buf);
  return rc;
}

/* quantization_config: config.json or quantize_config.json beside the
 * first file, else a "quantization_config" metadata string of a shard. */
static int imp_config(imp_state *s) {
  static const char *const names[] = {"config.json", "quantize_config.json"};
  char *buf, err[512];
  size_t len;
  int rc;
  const char *first = s->paths[0], *slash = strrchr(first, '/');
  int dirlen = slash != NULL ? (int)(slash - first + 1) : 0;

  for (size_t i = 0; i < 2; i++) {
    snprintf(s->cfg_source, sizeof s->cfg_source, "%.*s%s", dirlen, first,
             names[i]);
    if (read_small(s->cfg_source, &buf, &len) != 0)
      continue;
    rc = ql__ck_config_parse(buf, len, &s->cfg, err, sizeof err);
    free(buf);
    if (rc != 0)
      return fail_local(s->cfg_source, rc, "%s", err);
    if (s->cfg.present)
      return 0;
  }
  for (size_t i = 0; i < s->n_files; i++) {
    const char *m = ql__st_meta(s->files[i], "quantization_config");
    if (m == NULL)
      continue;
    snprintf(s->cfg_source, sizeof s->cfg_source, "%s (__metadata__)",
             s->paths[i]);
    rc = ql__ck_config_parse(m, strlen(m), &s->cfg, err, sizeof err);
    if (rc != 0)
      return fail_local(s->cfg_source, rc, "%s", err);
    return 0;
  }
  s->cfg_source[0] = '\0';
  memset(&s->cfg, 0, sizeof s->cfg);
  return 0;
}

static const ql__st_tensor *imp_find_cb(void *arg, const char *name) {
  return imp_find(arg, name);
}

static int is_float(ql__st_dtype dt) {
  return dt == QL__ST_F32 || dt == QL__ST_F16 || dt == QL__ST_BF16;
}

static ql_dtype float_dtype(ql__st_dtype dt) {
  return dt == QL__ST_F32 ? QL_DTYPE_F32
         : dt == QL__ST_F16 ? QL_DTYPE_F16
                            : QL_DTYPE_BF16;
}

/*
 * Finds the layers: X.qweight makes a quantized layer (with X.qzeros,
 * X.scales, X.g_idx), a 2-D float X.weight a float one; X.bias pairs with
 * either. Tensors that belong to neither (norms, 1-D parameters) are
 * skipped, except those that look quantized: an integer X.weight, or
 * X.qzeros / X.scales / X.g_idx without X.qweight, are errors naming the
 * tensor rather than silently left out.
 */
static int imp_plan(imp_state *s, const regex_t *match, const char *prefix,
                                      const char *fmt_arg) {
  static const char *const qparts[] = {".qzeros", ".scales", ".g_idx"};
  char err[512], x[1024];
  int rc, quantized_ckpt = s->cfg.present && s->cfg.method != QL__CK_UNKNOWN;

  for (size_t fi = 0; fi < s->n_files; fi++)
    for (size_t ti = 0; ti < s->files[fi]->n_tensors; ti++)
      quantized_ckpt |=
          ends_with(s->files[fi]->tensors[ti].name, ".qweight") ||
          ends_with(s->files[fi]->tensors[ti].name, "._weight_qdata");

  for (size_t fi = 0; fi < s->n_files; fi++) {
    for (size_t ti = 0; ti < s->files[fi]->n_tensors; ti++) {
      const ql__st_tensor *t = &s->files[fi]->tensors[ti];
      int quant = ends_with(t->name, ".qweight"), tao = 0;
      const char *meta = NULL, *part = strstr(t->name, "._weight_");
      /* TorchAO's serializer: "X._weight_<part>" with the subclass's JSON
       * under "X.weight" in the metadata. The qdata part makes the layer;
       * the other parts belong to it. */
      if (part != NULL && (size_t)(part - t->name) < sizeof x) {
        snprintf(x, sizeof x, "%.*s.weight", (int)(part - t->name), t->name);
        meta = ql__st_meta(s->files[fi], x);
      }
      if (meta != NULL) {
        if (!ends_with(t->name, "._weight_qdata"))
          continue;
        tao = 1;
      }
      size_t stem = tao     ? (size_t)(part - t->name)
                    : quant ? strlen(t->name) - 8
                            : strlen(t->name) - 7;
      if (!tao && !quant && !ends_with(t->name, ".weight")) {
        int part = 0;
        for (size_t q = 0; q < 3; q++) {
          if (!ends_with(t->name, qparts[q]))
            continue;
          size_t l = strlen(t->name) - strlen(qparts[q]);
          snprintf(x, sizeof x, "%.*s", (int)l, t->name);
          if (imp_find2(s, x, ".qweight") == NULL)
            return fail_local(t->name, QL_EFORMAT, "a quantized layer's "
                              "tensor without %s.qweight", x);
          part = 1;
        }
        /* A 2-D integer or float8 matrix that no known layout claims is
         * some other quantization (compressed-tensors, bitsandbytes, ...):
         * importing the rest without it would be a silent half import. */
        if (!part && t->ndim == 2 && !is_float(t->dtype))
          return fail_local(t->name, QL_EFORMAT, "dtype %s: a quantized "
                            "tensor of no recognised layout (GPTQ, AWQ)",
                            ql__st_dtype_name(t->dtype));
        if (!ends_with(t->name, ".bias"))
          s->skipped++;
        continue;
      }
      if (stem >= sizeof x)
        return fail_local(t->name, QL_EINVAL, "tensor name too long");
      snprintf(x, sizeof x, "%.*s", (int)stem, t->name);
      if (!tao && !quant && !is_float(t->dtype)) {
        if (t->ndim == 2 || imp_find2(s, x, ".qzeros") != NULL ||
            imp_find2(s, x, ".weight_scale") != NULL)
          return fail_local(t->name, QL_EFORMAT, "dtype %s: not a float "
                            "weight, and not part of a GPTQ or AWQ layer "
                            "(%s.qweight); this quantization is not "
                            "recognised", ql__st_dtype_name(t->dtype), x);
        s->skipped++;
        continue;
      }
      if (!tao && !quant && t->ndim != 2) {
        s->skipped++;
        continue;
      }
      if (match != NULL && regexec(match, x, 0, NULL, 0) != 0) {
        s->skipped++;
        continue;
      }
      /* The float weights of a quantized checkpoint (embeddings, lm_head)
       * were left unquantized on purpose: imported only when --format
       * says how to quantize them. */
      if (!tao && !quant && quantized_ckpt && fmt_arg == NULL) {
        s->skipped_float++;
        continue;
      }
      imp_layer *nl = realloc(s->layers, (s->n_layers + 1) * sizeof *nl);
      if (nl == NULL)
        return fail_local(t->name, QL_ENOMEM, "out of memory");
      s->layers = nl;
      imp_layer *L = &s->layers[s->n_layers];
      memset(L, 0, sizeof *L);
      s->n_layers++;
      size_t wl = strlen(prefix) + stem + 1;
      if ((L->name = strdup(x)) == NULL || (L->wname = malloc(wl)) == NULL)
        return fail_local(t->name, QL_ENOMEM, "out of memory");
      snprintf(L->wname, wl, "%s%s", prefix, x);
      L->quantized = quant;
      L->torchao = tao;
      L->bias = imp_find2(s, x, ".bias");
      if (tao) {
        rc = ql__ck_torchao_layer(x, meta, imp_find_cb, s, &L->tao, err,
                                  sizeof err);
        if (rc != 0)
          return fail_local("import", rc, "%s", err);
        L->bytes = L->tao.qdata.bytes + L->tao.scale.bytes + L->tao.zero.bytes;
      } else if (quant) {
        L->ql.name = L->name;
        L->ql.qweight = t;
        L->ql.qzeros = imp_find2(s, x, ".qzeros");
        L->ql.scales = imp_find2(s, x, ".scales");
        L->ql.g_idx = imp_find2(s, x, ".g_idx");
        if (s->cfg.present && s->cfg.method == QL__CK_UNKNOWN &&
            s->cfg.method_name[0] != '\0')
          return fail_local(t->name, QL_EFORMAT, "quantization_config (%s) "
                            "says quant_method \"%s\", which is not "
                            "supported (gptq and awq are)", s->cfg_source,
                            s->cfg.method_name);
        /* Checked now, converted just before its upload (imp_convert). */
        L->ql.check_only = 1;
        rc = ql__ck_convert(&L->ql, &s->cfg, &L->canon, err, sizeof err);
        if (rc != 0)
          return fail_local("import", rc, "%s", err);
        L->bytes = L->canon.qdata_bytes +
                   L->canon.scale_bytes * (L->canon.has_zero ? 2 : 1);
      } else {
        L->w = t;
        L->bytes = t->bytes;
      }
      if (L->bias != NULL) {
        uint64_t n = tao ? L->tao.n : quant ? L->canon.n : t->shape[0];
        if (L->bias->ndim != 1 || L->bias->shape[0] != n ||
            !is_float(L->bias->dtype))
          return fail_local(L->bias->name, QL_ESHAPE, "expected a 1-D float "
                            "bias of %" PRIu64 " entries", n);
        if (!quant && !tao && L->bias->dtype != t->dtype)
          return fail_local(L->bias->name, QL_EDTYPE, "bias is %s, the "
                            "weight %s", ql__st_dtype_name(L->bias->dtype),
                            ql__st_dtype_name(t->dtype));
        L->bytes += L->bias->bytes;
      }
    }
  }
  return 0;
}

/* Converts a GPTQ/AWQ layer that imp_plan() checked: on success
 * L->canon owns its arrays until the caller frees them after the upload.
 * The files are mapped read-only, so it cannot fail where the check passed
 * but for memory. */
static int imp_convert(const imp_state *s, imp_layer *L) {
  char err[512];
  L->ql.check_only = 0;
  int rc = ql__ck_convert(&L->ql, &s->cfg, &L->canon, err, sizeof err);
  return rc != 0 ? fail_local("import", rc, "%s", err) : 0;
}

static void imp_describe(const imp_layer *L, ql_format ffmt, uint32_t fgroup,
                         int fasym, char *src, size_t slen, char *fmt,
                         size_t flen) {
  char f[20]; /* "q4g" and a uint32: at most 14 bytes */
  if (L->torchao) {
    snprintf(src, slen, "torchao %s", L->tao.type);
    format_name(L->tao.format, L->tao.group_size, f, sizeof f);
    snprintf(fmt, flen, "%s", f);
  } else if (L->quantized) {
    const ql__ck_canon *c = &L->canon;
    if (c->method == QL__CK_AWQ)
      snprintf(src, slen, "awq 4-bit g%" PRIu32, c->src_group);
    else
      snprintf(src, slen, "gptq%s %d-bit g%" PRIu32 "%s",
               c->gptq_v2 ? " v2" : "", c->bits, c->src_group,
               c->symmetric_src ? " sym" : "");
    format_name(c->format, c->group_size, f, sizeof f);
    snprintf(fmt, flen, "%s%s", f, c->asymmetric ? "a" : "");
  } else {
    snprintf(src, slen, "%s", ql__st_dtype_name(L->w->dtype));
    format_name(ffmt, fgroup, f, sizeof f);
    snprintf(fmt, flen, "%s%s", f, fasym ? "a" : "");
  }
}

typedef struct imp_bar {
  int on;
  size_t done_layers, n_layers;
  uint64_t done_bytes, total_bytes;
  int last;
} imp_bar;

static void imp_draw(void *arg, uint64_t done, uint64_t total) {
  imp_bar *b = arg;
  char d[32], t[32];
  (void)total;
  uint64_t at = b->done_bytes + done;
  int permille = b->total_bytes > 0
                     ? (int)((double)at * 1000 / (double)b->total_bytes)
                     : 1000;
  if (!b->on || permille == b->last)
    return;
  b->last = permille;
  int fill = permille * 30 / 1000;
  fprintf(stderr, "\r\033[Kimport [%.*s%*s] %3d%% %s / %s, %zu / %zu tensors",
          fill, "##############################", 30 - fill, "",
          permille / 10, human_bytes(at, d, sizeof d),
          human_bytes(b->total_bytes, t, sizeof t), b->done_layers,
          b->n_layers);
  fflush(stderr);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* The arrays of a quantized layer as ql_load_packed() takes them:
 * TorchAO's as saved, or the canonical form GPTQ/AWQ were converted to;
 * with its bias. */
static void imp_packed_desc(const imp_layer *L, ql_packed_desc *d) {
  uint64_t n;
  if (L->torchao) {
    const ql__ck_torchao *t = &L->tao;
    d->format = t->format;
    d->group_size = t->group_size;
    d->n = n = t->n;
    d->k = t->k;
    d->zero_kind = t->zero_kind;
    d->qdata = (ql_packed_array){t->qdata.data, t->qdata.dtype, t->qdata.ndim,
                                 {t->qdata.shape[0], t->qdata.shape[1]}};
    d->scale = (ql_packed_array){t->scale.data, t->scale.dtype, t->scale.ndim,
                                 {t->scale.shape[0], t->scale.shape[1]}};
    if (t->zero.data != NULL)
      d->zero = (ql_packed_array){t->zero.data, t->zero.dtype, t->zero.ndim,
                                  {t->zero.shape[0], t->zero.shape[1]}};
  } else {
    const ql__ck_canon *c = &L->canon;
    d->format = c->format;
    d->group_size = c->group_size;
    d->n = n = c->n;
    d->k = c->k;
    d->asymmetric = c->asymmetric;
    d->zero_kind = QL_ZERO_FLOAT;
    d->qdata = (ql_packed_array){c->qdata, c->qdata_dtype, 2,
                                 {c->n, c->qdata_bytes / c->n}};
    d->scale = (ql_packed_array){c->scale, c->scale_dtype, 2,
                                 {c->groups, c->n}};
    if (c->zero != NULL)
      d->zero = (ql_packed_array){c->zero, c->scale_dtype, 2,
                                  {c->groups, c->n}};
  }
  if (L->bias != NULL)
    d->bias = (ql_packed_array){
        L->bias->data,
        L->bias->dtype == QL__ST_F32   ? QL_ADT_F32
        : L->bias->dtype == QL__ST_F16 ? QL_ADT_F16
                                       : QL_ADT_BF16,
        1,
        {n, 0}};
}

static int cmd_import(ctx *cx, int argc, char **argv) {
  enum { OPT_FORMAT = 256, OPT_MATCH, OPT_PREFIX, OPT_PERSIST, OPT_DEVICES,
         OPT_DRY, OPT_POLICY, OPT_SCALE };
  static const struct option opts[] = {
      {"format", required_argument, NULL, OPT_FORMAT},
      {"match", required_argument, NULL, OPT_MATCH},
      {"prefix", required_argument, NULL, OPT_PREFIX},
      {"persist", no_argument, NULL, OPT_PERSIST},
      {"persistent", no_argument, NULL, OPT_PERSIST},
      {"devices", required_argument, NULL, OPT_DEVICES},
      {"dry-run", no_argument, NULL, OPT_DRY},
      {"policy", required_argument, NULL, OPT_POLICY},
      {"scale-dtype", required_argument, NULL, OPT_SCALE},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0}};
  const char *fmt_arg = NULL, *match_arg = NULL, *prefix = "",
             *devices = NULL;
  ql_format ffmt = QL_FORMAT_Q4G;
  uint32_t fgroup = 128;
  int fasym = 0, persist = 0, dry = 0, ch, rv = 0, sdt = 0;
  ql_path policy = QL_PATH_AUTO;
  regex_t re;
  int have_re = 0;
  imp_state s;
  imp_bar bar = {0, 0, 0, 0, 0, -1};
  size_t shared = 0, imported = 0;
  uint64_t resident = 0;
  double t0 = now_s();

  memset(&s, 0, sizeof s);
  getopt_reset();
  while ((ch = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    switch (ch) {
    case OPT_FORMAT:
      fmt_arg = optarg;
      if (parse_format(optarg, &ffmt, &fgroup, &fasym) != 0)
        return usage_error("import: unknown format '%s' (q4g32..q4g256, "
                           "q8c, q8b32..q8b256[a] or f8r)", optarg);
      break;
    case OPT_MATCH:
      match_arg = optarg;
      break;
    case OPT_PREFIX:
      prefix = optarg;
      break;
    case OPT_PERSIST:
      persist = 1;
      break;
    case OPT_DEVICES:
      devices = optarg;
      break;
    case OPT_DRY:
      dry = 1;
      break;
    case OPT_POLICY:
      if (parse_path(optarg, &policy) != 0 || policy == QL_PATH_ACT_QUANT)
        return usage_error("import: unknown policy '%s' (auto or "
                           "weight-only)", optarg);
      break;
    case OPT_SCALE:
      if (parse_dtype(optarg, &sdt) != 0)
        return usage_error("import: --scale-dtype '%s' (bf16, f16 or f32)",
                           optarg);
      break;
    case 'h':
      puts("usage: qlinearctl import CHECKPOINT.safetensors|INDEX.json ...\n"
           "         [--format FMT] [--match REGEX] [--prefix NAME/]\n"
           "         [--policy auto|weight-only] [--scale-dtype DTYPE]\n"
           "         [--persist] [--devices LIST] [--dry-run]");
      return 0;
    default:
      return bad_option("import", argv);
    }
  }
  if (argc - optind < 1)
    return usage_error("import needs at least one checkpoint file");
  if (match_arg != NULL) {
    int e = regcomp(&re, match_arg, REG_EXTENDED | REG_NOSUB);
    if (e != 0) {
      char msg[256];
      regerror(e, &re, msg, sizeof msg);
      return usage_error("import: --match '%s': %s", match_arg, msg);
    }
    have_re = 1;
  }

  for (int i = optind; i < argc; i++)
    if ((rv = imp_add_arg(&s, argv[i])) != 0)
      goto done;
  if (s.n_files == 0) {
    rv = fail_local("import", QL_EINVAL, "no checkpoint file");
    goto done;
  }
  if ((rv = imp_config(&s)) != 0 ||
      (rv = imp_plan(&s, have_re ? &re : NULL, prefix, fmt_arg)) != 0)
    goto done;
  if (s.n_layers == 0) {
    rv = fail_local("import", QL_ENOTFOUND, "no layer to import in %zu "
                    "file(s)%s", s.n_files,
                    match_arg != NULL ? " that matches --match" : "");
    goto done;
  }
  for (size_t i = 0; i < s.n_layers; i++)
    bar.total_bytes += s.layers[i].bytes;
  bar.n_layers = s.n_layers;

  if (dry) {
    char src[64], fmt[32], b[32];
    printf("%-48s %-28s %-12s %-8s %4s %10s\n", "NAME", "SOURCE", "SHAPE",
           "FORMAT", "BIAS", "BYTES");
    for (size_t i = 0; i < s.n_layers; i++) {
      const imp_layer *L = &s.layers[i];
      char shape[48];
      imp_describe(L, ffmt, fgroup, fasym, src, sizeof src, fmt, sizeof fmt);
      snprintf(shape, sizeof shape, "%" PRIu64 "x%" PRIu64,
               L->torchao     ? L->tao.n
               : L->quantized ? L->canon.n
                              : L->w->shape[0],
               L->torchao     ? L->tao.k
               : L->quantized ? L->canon.k
                              : L->w->shape[1]);
      printf("%-48s %-28s %-12s %-8s %4s %10s\n", L->wname, src, shape, fmt,
             L->bias != NULL ? "yes" : "-",
             human_bytes(L->bytes, b, sizeof b));
    }
    printf("would import %zu tensors (%s) from %zu file(s); %zu other "
           "tensors skipped%s%s\n",
           s.n_layers, human_bytes(bar.total_bytes, src, sizeof src),
           s.n_files, s.skipped, s.cfg_source[0] ? "; quantization_config: "
                                                 : "",
           s.cfg_source);
    if (s.skipped_float > 0)
      printf("%zu float weights of this quantized checkpoint skipped: "
             "--format FMT imports them too, quantized to FMT\n",
             s.skipped_float);
    goto done;
  }

  if ((rv = connect_ctx(cx)) != 0)
    goto done;
  bar.on = isatty(STDERR_FILENO);
  for (size_t i = 0; i < s.n_layers; i++) {
    imp_layer *L = &s.layers[i];
    ql_weight_info info;
    int sh = 0;
    imp_draw(&bar, 0, 0);
    if (L->quantized && (rv = imp_convert(&s, L)) != 0)
      goto summary;
    if (L->torchao || L->quantized) {
      ql_packed_desc d = {0};
      imp_packed_desc(L, &d);
      d.name = L->wname;
      d.policy = policy;
      d.persistent = persist;
      d.devices = devices;
      d.progress = imp_draw;
      d.progress_arg = &bar;
      rv = ql_load_packed(cx->client, &d, &info, &sh);
      ql__ck_canon_free(&L->canon); /* its metadata no longer needed */
    } else {
      ql_load_desc d = {0};
      d.name = L->wname;
      d.format = ffmt;
      d.group_size = fgroup;
      d.asymmetric = fasym;
      d.n = L->w->shape[0];
      d.k = L->w->shape[1];
      d.dtype = float_dtype(L->w->dtype);
      d.data = L->w->data;
      d.bias = L->bias != NULL ? L->bias->data : NULL;
      d.policy = policy;
      d.scale_dtype = sdt;
      d.persistent = persist;
      d.devices = devices;
      d.progress = imp_draw;
      d.progress_arg = &bar;
      rv = ql_load_float(cx->client, &d, &info, &sh);
    }
    if (rv != 0) {
      char what[QL_NAME_MAX + 64];
      if (bar.last >= 0)
        fputs("\r\033[K", stderr);
      snprintf(what, sizeof what, "import %s (%s)", L->wname, L->name);
      rv = fail_ql(what, rv);
      goto summary;
    }
    imported++;
    shared += sh != 0;
    resident += info.bytes_resident;
    bar.done_layers++;
    bar.done_bytes += L->bytes;
  }
  imp_draw(&bar, 0, 0);
  if (bar.last >= 0)
    fputs("\r\033[K", stderr);

summary: {
  char b[32], t[32];
  ql_stats_info *st = NULL;
  printf("imported %zu of %zu tensors (%zu shared) from %zu file(s) in "
         "%s; their resident bytes %s\n",
         imported, s.n_layers, shared, s.n_files,
         human_ns((now_s() - t0) * 1e9, t, sizeof t),
         human_bytes(resident, b, sizeof b));
  if (s.skipped_float > 0)
    printf("  %zu float weights of this quantized checkpoint skipped "
           "(--format FMT imports them too)\n", s.skipped_float);
  if (imported > 0 && ql_stats(cx->client, &st) == 0) {
    for (size_t i = 0; i < st->n_devices; i++)
      printf("  %s: %s resident\n", st->devices[i].device,
             human_bytes(st->devices[i].bytes_resident, b, sizeof b));
    ql_stats_free(st);
  }
}

done:
  if (have_re)
    regfree(&re);
  imp_free(&s);
  return rv;
}

/* ------------------------------------------------------------ main */

static const struct command {
  const char *name;
  int (*run)(ctx *cx, int argc, char **argv);
} commands[] = {
    {"status", cmd_status}, {"list", cmd_list},     {"load", cmd_load},
    {"unload", cmd_unload}, {"linear", cmd_linear}, {"stats", cmd_stats},
    {"reload", cmd_reload}, {"import", cmd_import},
};

int main(int argc, char **argv) {
  static const struct option opts[] = {
      {"address", required_argument, NULL, 'a'},
      {"timeout", required_argument, NULL, 't'},
      {"admin", no_argument, NULL, 'A'},
      {"help", no_argument, NULL, 'h'},
      {"version", no_argument, NULL, 'V'},
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
    case 'V':
      /* The client's own version; 'status' gives the daemon's. */
      printf("qlinearctl %s (protocol %u)\n", PACKAGE_VERSION,
             QL_PROTOCOL_VERSION);
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
