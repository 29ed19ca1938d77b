/*
 * main.c - qlinearctl: the command table and main(), the messages, formatting
 * and argument parsing every command shares, and the small commands (status,
 * list, unload, reload).
 */
#include "ctl.h"

static const char usage_text[] =
    "usage: qlinearctl [--admin] [-a ADDRESS] [-t TIMEOUT_MS] COMMAND [ARGS]\n"
    "\n"
    "Talks to qlineard, the daemon that serves quantized linear layers.\n"
    "\n"
    "options:\n"
    "  -a, --address ADDRESS  daemon address (default: $QLINEAR_ADDRESS, else\n"
    "                         ipc://$XDG_RUNTIME_DIR/qlinear/qlineard.sock, "
    "else\n"
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
    "                         quantize; FMT is q4g32..q4g256, q8c, "
    "q8b32..q8b256\n"
    "                         (q8b32a.. asymmetric) or f8r; POLICY auto or\n"
    "                         weight-only; DTYPE of the scales bf16, f16 or\n"
    "                         f32 (default: TorchAO's, byte for byte);\n"
    "                         --persistent (with --admin) stores it: it stays\n"
    "                         resident, across restarts, until an admin "
    "unload;\n"
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
    "       [--prefix NAME/] [--policy POLICY] [--scale-dtype DTYPE] "
    "[--persist]\n"
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

/* ------------------------------------------------------------ messages */

__attribute__((format(printf, 1, 2))) int ql__ctl_usage_error(const char *fmt,
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
int ql__ctl_bad_option(const char *cmd, char **argv) {
  const char *arg = optind > 0 ? argv[optind - 1] : "";
  if (strncmp(arg, "--", 2) != 0 && optopt > ' ' && optopt < 127)
    return ql__ctl_usage_error("%s: unknown option or missing argument: '-%c'",
                               cmd, optopt);
  return ql__ctl_usage_error("%s: unknown option or missing argument: '%s'",
                             cmd, arg);
}

/* "qlinearctl: <what>: <ql_strerror(code)>: <ql_errmsg()>" for a failed
 * library call. */
int ql__ctl_fail_ql(const char *what, int code) {
  const char *detail = ql_errmsg();
  fprintf(stderr, "qlinearctl: %s: %s%s%s\n", what, ql_strerror(code),
          detail[0] != '\0' ? ": " : "", detail);
  return EXIT_FAILURE;
}

/* The same shape for a local failure with its own detail. */
__attribute__((format(printf, 3, 4))) int
ql__ctl_fail_local(const char *what, int code, const char *fmt, ...) {
  va_list ap;
  fprintf(stderr, "qlinearctl: %s: %s: ", what, ql_strerror(code));
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  return EXIT_FAILURE;
}

int ql__ctl_connect_ctx(ctx *cx) {
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
    return ql__ctl_fail_ql(what, rv);
  }
  return 0;
}

/* ------------------------------------------------------------ formatting */

const char *ql__ctl_human_bytes(uint64_t b, char *buf, size_t len) {
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

const char *ql__ctl_human_ns(double ns, char *buf, size_t len) {
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

const char *ql__ctl_format_name(int format, uint32_t group, char *buf,
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

const char *ql__ctl_path_name(int path) {
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

const char *ql__ctl_dtype_name(int dt) {
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
void ql__ctl_getopt_reset(void) {
  optind = 0;
  opterr = 0;
}

/* q4g<G>, q8b<B> (symmetric), q8b<B>a (asymmetric), q8c, f8r; G and B
 * in 32, 64, 128, 256. */
int ql__ctl_parse_format(const char *s, ql_format *fmt, uint32_t *group,
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

int ql__ctl_parse_path(const char *s, ql_path *p) {
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

int ql__ctl_parse_dtype(const char *s, int *dt) {
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

/* Loads an .npy file and maps its ql__ctl_element type to a ql_dtype; '<u2' is
 * bf16 only when the user said so. */
int ql__ctl_load_array(const char *path, bool bf16, ql__npy *a, ql_dtype *dt) {
  char err[256];
  int rv = ql__npy_load(path, a, err, sizeof err);
  if (rv != 0)
    return ql__ctl_fail_local(path, rv, "%s", err);
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
    rv = ql__ctl_fail_local(path, QL_EDTYPE,
                            "'<u2' data; pass --bf16 if it holds "
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

  ql__ctl_getopt_reset();
  while ((ch = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    if (ch == 'h') {
      puts("usage: qlinearctl status");
      return 0;
    }
    return ql__ctl_bad_option("status", argv);
  }
  if (optind != argc)
    return ql__ctl_usage_error("status takes no arguments");
  if ((rv = ql__ctl_connect_ctx(cx)) != 0)
    return rv;
  if ((rv = ql_hello(cx->client, &h)) != 0)
    return ql__ctl_fail_ql("hello", rv);

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
         ql__ctl_human_bytes(h.max_message_bytes, b1, sizeof b1),
         h.max_message_bytes);
  if (h.max_chunk_bytes != 0)
    printf("chunk limit   %s (%" PRIu64 " bytes)\n",
           ql__ctl_human_bytes(h.max_chunk_bytes, b1, sizeof b1),
           h.max_chunk_bytes);
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

  ql__ctl_getopt_reset();
  while ((ch = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    if (ch == 'h') {
      puts("usage: qlinearctl list");
      return 0;
    }
    return ql__ctl_bad_option("list", argv);
  }
  if (optind != argc)
    return ql__ctl_usage_error("list takes no arguments");
  if ((rv = ql__ctl_connect_ctx(cx)) != 0)
    return rv;
  if ((rv = ql_list(cx->client, &w, &n)) != 0)
    return ql__ctl_fail_ql("list", rv);
  /* By name: the daemon answers in its table's order (w is NULL when n
   * is 0, which qsort may not be given). */
  if (n > 1)
    qsort(w, n, sizeof *w, by_name);

  for (size_t i = 0; i < n; i++) {
    int len = (int)strlen(w[i].name);
    if (len > namew)
      namew = len;
  }
  printf("%-*s  %-7s %-13s %-4s  %-6s  %-7s  %-12s  %10s  %s\n", namew, "NAME",
         "FORMAT", "N x K", "BIAS", "STORED", "AQ FROM", "DIGEST", "RESIDENT",
         "DEVICES");
  for (size_t i = 0; i < n; i++) {
    char fmt[32], shape[48], dg[2 * QL_DIGEST_BYTES + 1], bytes[32], xo[24];
    ql__ctl_format_name(w[i].format, w[i].group_size, fmt, sizeof fmt);
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
           ql__ctl_human_bytes(w[i].bytes_resident, bytes, sizeof bytes),
           w[i].devices);
  }
  ql_free(w);
  return 0;
}

/* ------------------------------------------------------------ unload */

static int cmd_unload(ctx *cx, int argc, char **argv) {
  static const struct option opts[] = {{"help", no_argument, NULL, 'h'},
                                       {NULL, 0, NULL, 0}};
  int ch, rv;

  ql__ctl_getopt_reset();
  while ((ch = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    if (ch == 'h') {
      puts("usage: qlinearctl unload NAME");
      return 0;
    }
    return ql__ctl_bad_option("unload", argv);
  }
  if (argc - optind != 1)
    return ql__ctl_usage_error("unload needs NAME");
  const char *name = argv[optind];
  if ((rv = ql__ctl_connect_ctx(cx)) != 0)
    return rv;
  if ((rv = ql_unload(cx->client, name)) != 0) {
    char what[QL_NAME_MAX + 8];
    snprintf(what, sizeof what, "unload %s", name);
    return ql__ctl_fail_ql(what, rv);
  }
  printf("unloaded %s\n", name);
  return 0;
}

/* ------------------------------------------------------------ reload */

static int cmd_reload(ctx *cx, int argc, char **argv) {
  static const struct option opts[] = {{"help", no_argument, NULL, 'h'},
                                       {NULL, 0, NULL, 0}};
  char report[1024];
  int ch, rv;

  ql__ctl_getopt_reset();
  while ((ch = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    if (ch == 'h') {
      puts("usage: qlinearctl --admin reload");
      return 0;
    }
    return ql__ctl_bad_option("reload", argv);
  }
  if (optind != argc)
    return ql__ctl_usage_error("reload takes no arguments");
  if (!cx->admin)
    return ql__ctl_usage_error("reload goes through the admin socket: "
                               "qlinearctl --admin reload");
  if ((rv = ql__ctl_connect_ctx(cx)) != 0)
    return rv;
  if ((rv = ql_reload_config(cx->client, report, sizeof report)) != 0)
    return ql__ctl_fail_ql("reload", rv);
  printf("%s\n", report);
  return 0;
}

/* ------------------------------------------------------------ main */

static const struct command {
  const char *name;
  int (*run)(ctx *cx, int argc, char **argv);
} commands[] = {
    {"status", cmd_status},     {"list", cmd_list},
    {"load", ql__cmd_load},     {"unload", cmd_unload},
    {"linear", ql__cmd_linear}, {"stats", ql__cmd_stats},
    {"reload", cmd_reload},     {"import", ql__cmd_import},
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
        return ql__ctl_usage_error("empty address");
      cx.address = optarg;
      break;
    case 't': {
      char *end;
      errno = 0;
      long v = strtol(optarg, &end, 10);
      if (errno != 0 || end == optarg || *end != '\0' || v < 0 || v > INT_MAX)
        return ql__ctl_usage_error("bad timeout '%s' (milliseconds, 0 waits "
                                   "forever)",
                                   optarg);
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
      return ql__ctl_usage_error("unknown option or missing argument: '%s'",
                                 argv[optind - 1]);
    }
  }
  if (optind >= argc)
    return ql__ctl_usage_error("no command given");
  char admin_addr[QL_ADDRESS_MAX + 64];
  if (cx.admin && cx.address == NULL) {
    if (ql_default_admin_address(admin_addr, sizeof admin_addr) != 0)
      return ql__ctl_usage_error(
          "the default admin address does not fit; use -a");
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
  return ql__ctl_usage_error("unknown command '%s'", name);
}
