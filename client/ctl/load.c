/*
 * load.c - qlinearctl: the load and linear commands (arrays from and to .npy
 * files).
 */
#include "ctl.h"

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
          ql__ctl_human_bytes(done, d, sizeof d),
          ql__ctl_human_bytes(total, t, sizeof t));
  fflush(stderr);
}

int ql__cmd_load(ctx *cx, int argc, char **argv) {
  enum {
    OPT_FORMAT = 256,
    OPT_BIAS,
    OPT_POLICY,
    OPT_SCALE,
    OPT_BF16,
    OPT_PERSISTENT,
    OPT_DEVICES
  };
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

  ql__ctl_getopt_reset();
  while ((ch = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    switch (ch) {
    case OPT_FORMAT:
      format = optarg;
      if (ql__ctl_parse_format(optarg, &d.format, &d.group_size,
                               &d.asymmetric) != 0)
        return ql__ctl_usage_error(
            "load: unknown format '%s' (q4g32..q4g256, q8c, "
            "q8b32..q8b256, q8b32a..q8b256a or f8r)",
            optarg);
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
        return ql__ctl_usage_error(
            "load: unknown policy '%s' (auto or weight-only)", optarg);
      break;
    case OPT_SCALE:
      if (ql__ctl_parse_dtype(optarg, &d.scale_dtype) != 0)
        return ql__ctl_usage_error(
            "load: unknown scale dtype '%s' (bf16, f16 or "
            "f32)",
            optarg);
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
           "                       [--scale-dtype bf16|f16|f32] [--bf16] "
           "[--persistent]\n"
           "                       [--devices NAME,...]");
      return 0;
    default:
      return ql__ctl_bad_option("load", argv);
    }
  }
  if (argc - optind != 2)
    return ql__ctl_usage_error("load needs NAME and FILE.npy");
  if (format == NULL)
    return ql__ctl_usage_error("load needs --format");
  d.name = argv[optind];
  const char *wpath = argv[optind + 1];

  if ((rv = ql__ctl_load_array(wpath, bf16, &w, &wdt)) != 0)
    goto done;
  if (w.ndim != 2) {
    rv = ql__ctl_fail_local(wpath, QL_ESHAPE,
                            "the weight must be 2-D [N, K], this "
                            "array is 1-D");
    goto done;
  }
  if (bias_path != NULL) {
    if ((rv = ql__ctl_load_array(bias_path, bf16, &b, &bdt)) != 0)
      goto done;
    if (b.ndim != 1 || b.shape[0] != w.shape[0]) {
      rv = ql__ctl_fail_local(bias_path, QL_ESHAPE,
                              "the bias must be 1-D [N] with N = %" PRIu64,
                              w.shape[0]);
      goto done;
    }
    if (bdt != wdt) {
      rv = ql__ctl_fail_local(bias_path, QL_EDTYPE,
                              "the bias is %s, the weight %s",
                              ql__ctl_dtype_name(bdt), ql__ctl_dtype_name(wdt));
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

  if ((rv = ql__ctl_connect_ctx(cx)) != 0)
    goto done;
  rv = ql_load_float(cx->client, &d, NULL, &shared);
  if (pb.last >= 0)
    fputs("\r\033[K", stderr);
  if (rv != 0) {
    char what[QL_NAME_MAX + 8];
    snprintf(what, sizeof what, "load %s", d.name);
    rv = ql__ctl_fail_ql(what, rv);
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

float ql__ctl_element(const void *data, ql_dtype dt, size_t i) {
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
      printf(" %12.6g", (double)ql__ctl_element(y, dt, (size_t)(i * n + j)));
    }
    putchar('\n');
  }
}

int ql__cmd_linear(ctx *cx, int argc, char **argv) {
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

  ql__ctl_getopt_reset();
  while ((ch = getopt_long(argc, argv, "o:h", opts, NULL)) != -1) {
    switch (ch) {
    case 'o':
      out = optarg;
      break;
    case OPT_PATH:
      if (ql__ctl_parse_path(optarg, &path) != 0)
        return ql__ctl_usage_error("linear: unknown path '%s' (auto, wo or aq)",
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
      return ql__ctl_bad_option("linear", argv);
    }
  }
  if (argc - optind != 2)
    return ql__ctl_usage_error("linear needs NAME and X.npy");
  const char *name = argv[optind], *xpath = argv[optind + 1];
  snprintf(what, sizeof what, "linear %s", name);

  if ((rv = ql__ctl_load_array(xpath, bf16, &x, &dt)) != 0)
    goto done;
  /* A 1-D x is one row. */
  uint64_t m = x.ndim == 2 ? x.shape[0] : 1,
           k = x.ndim == 2 ? x.shape[1] : x.shape[0];
  if (m == 0 || k == 0) {
    rv = ql__ctl_fail_local(xpath, QL_ESHAPE, "x is empty");
    goto done;
  }
  if ((rv = ql__ctl_connect_ctx(cx)) != 0)
    goto done;
  /* The reply's width is the weight's N, which only the daemon knows. */
  if ((rv = ql_lookup(cx->client, name, &info)) != 0) {
    rv = ql__ctl_fail_ql(what, rv);
    goto done;
  }
  if (info.k != k) {
    rv = ql__ctl_fail_local(
        what, QL_ESHAPE, "x has K = %" PRIu64 ", the weight has K = %" PRIu64,
        k, info.k);
    goto done;
  }
  size_t esz = ql_dtype_size(dt);
  if (info.n > SIZE_MAX / esz / m ||
      (y = malloc((size_t)(m * info.n) * esz)) == NULL) {
    rv = ql__ctl_fail_local(what, QL_ENOMEM, "y [%" PRIu64 ", %" PRIu64 "]", m,
                            info.n);
    goto done;
  }
  if ((rv = ql_linear(cx->client, name, path, dt, m, k, x.data, info.n, y,
                      &res)) != 0) {
    rv = ql__ctl_fail_ql(what, rv);
    goto done;
  }

  if (out != NULL) {
    /* y keeps x's layout: [N] for a 1-D x, [M, N] otherwise. */
    uint64_t shape[2] = {m, info.n};
    if (x.ndim == 1)
      shape[0] = info.n;
    if ((rv = ql__npy_write(out, x.type, x.ndim, shape, y, err, sizeof err)) !=
        0) {
      rv = ql__ctl_fail_local(out, rv, "%s", err);
      goto done;
    }
    fprintf(stderr,
            "wrote %s: [%" PRIu64 ", %" PRIu64 "] %s, path %s, "
            "impl %s\n",
            out, m, info.n, ql__ctl_dtype_name(dt), ql__ctl_path_name(res.path),
            res.impl);
  } else {
    printf("# y [%" PRIu64 ", %" PRIu64 "] %s, path %s, impl %s\n", m, info.n,
           ql__ctl_dtype_name(dt), ql__ctl_path_name(res.path), res.impl);
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
