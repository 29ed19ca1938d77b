/*
 * import.c - qlinearctl: the import command: a safetensors checkpoint (GPTQ,
 * AWQ, TorchAO or float) converted and uploaded layer by layer.
 */
#include "ctl.h"

/* ------------------------------------------------------------ import */

/*
 * `qlinearctl import`: every matching layer of safetensors checkpoints,
 * float ones quantized by the daemon (ql_load_float), GPTQ/AWQ ones
 * converted here to the canonical packed form (client/ctl/ckpt_import.c) and
 * TorchAO ones, already canonical, uploaded as they are (ql_load_packed).
 */

/* One layer to import. */
typedef struct imp_layer {
  char *name;    /* the layer prefix X (tensor names X.weight, ...) */
  char *wname;   /* the weight's name in the daemon: --prefix + X */
  int quantized; /* 1: GPTQ/AWQ (canon), 0: float (w) */
  int torchao;   /* 1: a TorchAO subclass (tao) */
  const ql__st_tensor *w, *bias;
  ql__ck_layer ql;
  ql__ck_canon canon;
  ql__ck_torchao tao;
  uint64_t bytes; /* what is uploaded */
} imp_layer;

typedef struct imp_state {
  ql__st_file **files;
  char **paths;
  size_t n_files;
  imp_layer *layers;
  size_t n_layers, skipped;
  size_t skipped_float; /* float weights of a quantized checkpoint */
  size_t skipped_embed; /* embeddings: never quantized as a linear */
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

/*
 * Whether layer x (a tensor name less ".weight") is an embedding table
 * rather than a linear: its module's name (the last component) says
 * "embed" (embed_tokens, embed_in, embed_positions, word_embeddings, ...)
 * or is GPT-2's wte / wpe. A checkpoint has no module types, and both are
 * 2-D float matrices; a lookup table quantized as a linear would be a
 * weight no model ever multiplies by.
 */
static int is_embedding(const char *x) {
  const char *last = strrchr(x, '.');
  last = last != NULL ? last + 1 : x;
  return strstr(last, "embed") != NULL || strcmp(last, "wte") == 0 ||
         strcmp(last, "wpe") == 0;
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
    return ql__ctl_fail_local(path, QL_ENOMEM, "out of memory");
  s->files = nf;
  char **np = realloc(s->paths, (s->n_files + 1) * sizeof *np);
  if (np == NULL)
    return ql__ctl_fail_local(path, QL_ENOMEM, "out of memory");
  s->paths = np;
  int rc = ql__st_open(path, &s->files[s->n_files], err, sizeof err);
  if (rc != 0)
    return ql__ctl_fail_local(path, rc, "%s", err);
  if ((s->paths[s->n_files] = strdup(path)) == NULL) {
    ql__st_free(s->files[s->n_files]);
    return ql__ctl_fail_local(path, QL_ENOMEM, "out of memory");
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
    return ql__ctl_fail_local(arg, QL_EIO, "cannot read: %s", strerror(-rc));
  rc = ql__st_index_parse(buf, len, &shards, &n, err, sizeof err);
  if (rc != 0) {
    free(buf);
    return ql__ctl_fail_local(arg, rc, "%s", err);
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
  if (rc == 0 && (rc = ql__st_index_check(buf, len, shard_holds, &sd, err,
                                          sizeof err)) != 0)
    rc = ql__ctl_fail_local(arg, rc, "%s", err);
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
      return ql__ctl_fail_local(s->cfg_source, rc, "%s", err);
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
      return ql__ctl_fail_local(s->cfg_source, rc, "%s", err);
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
  return dt == QL__ST_F32   ? QL_DTYPE_F32
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
            return ql__ctl_fail_local(t->name, QL_EFORMAT,
                                      "a quantized layer's "
                                      "tensor without %s.qweight",
                                      x);
          part = 1;
        }
        /* A 2-D integer or float8 matrix that no known layout claims is
         * some other quantization (compressed-tensors, bitsandbytes, ...):
         * importing the rest without it would be a silent half import. */
        if (!part && t->ndim == 2 && !is_float(t->dtype))
          return ql__ctl_fail_local(
              t->name, QL_EFORMAT,
              "dtype %s: a quantized "
              "tensor of no recognised layout (GPTQ, AWQ)",
              ql__st_dtype_name(t->dtype));
        if (!ends_with(t->name, ".bias"))
          s->skipped++;
        continue;
      }
      if (stem >= sizeof x)
        return ql__ctl_fail_local(t->name, QL_EINVAL, "tensor name too long");
      snprintf(x, sizeof x, "%.*s", (int)stem, t->name);
      if (is_embedding(x)) {
        s->skipped_embed++;
        continue;
      }
      if (!tao && !quant && !is_float(t->dtype)) {
        if (t->ndim == 2 || imp_find2(s, x, ".qzeros") != NULL ||
            imp_find2(s, x, ".weight_scale") != NULL)
          return ql__ctl_fail_local(
              t->name, QL_EFORMAT,
              "dtype %s: not a float "
              "weight, and not part of a GPTQ or AWQ layer "
              "(%s.qweight); this quantization is not "
              "recognised",
              ql__st_dtype_name(t->dtype), x);
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
        return ql__ctl_fail_local(t->name, QL_ENOMEM, "out of memory");
      s->layers = nl;
      imp_layer *L = &s->layers[s->n_layers];
      memset(L, 0, sizeof *L);
      s->n_layers++;
      size_t wl = strlen(prefix) + stem + 1;
      if ((L->name = strdup(x)) == NULL || (L->wname = malloc(wl)) == NULL)
        return ql__ctl_fail_local(t->name, QL_ENOMEM, "out of memory");
      snprintf(L->wname, wl, "%s%s", prefix, x);
      L->quantized = quant;
      L->torchao = tao;
      L->bias = imp_find2(s, x, ".bias");
      if (tao) {
        rc = ql__ck_torchao_layer(x, meta, imp_find_cb, s, &L->tao, err,
                                  sizeof err);
        if (rc != 0)
          return ql__ctl_fail_local("import", rc, "%s", err);
        L->bytes = L->tao.qdata.bytes + L->tao.scale.bytes + L->tao.zero.bytes;
      } else if (quant) {
        L->ql.name = L->name;
        L->ql.qweight = t;
        L->ql.qzeros = imp_find2(s, x, ".qzeros");
        L->ql.scales = imp_find2(s, x, ".scales");
        L->ql.g_idx = imp_find2(s, x, ".g_idx");
        if (s->cfg.present && s->cfg.method == QL__CK_UNKNOWN &&
            s->cfg.method_name[0] != '\0')
          return ql__ctl_fail_local(t->name, QL_EFORMAT,
                                    "quantization_config (%s) "
                                    "says quant_method \"%s\", which is not "
                                    "supported (gptq and awq are)",
                                    s->cfg_source, s->cfg.method_name);
        /* Checked now, converted just before its upload (imp_convert). */
        L->ql.check_only = 1;
        rc = ql__ck_convert(&L->ql, &s->cfg, &L->canon, err, sizeof err);
        if (rc != 0)
          return ql__ctl_fail_local("import", rc, "%s", err);
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
          return ql__ctl_fail_local(L->bias->name, QL_ESHAPE,
                                    "expected a 1-D float "
                                    "bias of %" PRIu64 " entries",
                                    n);
        if (!quant && !tao && L->bias->dtype != t->dtype)
          return ql__ctl_fail_local(L->bias->name, QL_EDTYPE,
                                    "bias is %s, the "
                                    "weight %s",
                                    ql__st_dtype_name(L->bias->dtype),
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
  return rc != 0 ? ql__ctl_fail_local("import", rc, "%s", err) : 0;
}

static void imp_describe(const imp_layer *L, ql_format ffmt, uint32_t fgroup,
                         int fasym, char *src, size_t slen, char *fmt,
                         size_t flen) {
  char f[20]; /* "q4g" and a uint32: at most 14 bytes */
  if (L->torchao) {
    snprintf(src, slen, "torchao %s", L->tao.type);
    ql__ctl_format_name(L->tao.format, L->tao.group_size, f, sizeof f);
    snprintf(fmt, flen, "%s", f);
  } else if (L->quantized) {
    const ql__ck_canon *c = &L->canon;
    if (c->method == QL__CK_AWQ)
      snprintf(src, slen, "awq 4-bit g%" PRIu32, c->src_group);
    else
      snprintf(src, slen, "gptq%s %d-bit g%" PRIu32 "%s",
               c->gptq_v2 ? " v2" : "", c->bits, c->src_group,
               c->symmetric_src ? " sym" : "");
    ql__ctl_format_name(c->format, c->group_size, f, sizeof f);
    snprintf(fmt, flen, "%s%s", f, c->asymmetric ? "a" : "");
  } else {
    snprintf(src, slen, "%s", ql__st_dtype_name(L->w->dtype));
    ql__ctl_format_name(ffmt, fgroup, f, sizeof f);
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
          fill, "##############################", 30 - fill, "", permille / 10,
          ql__ctl_human_bytes(at, d, sizeof d),
          ql__ctl_human_bytes(b->total_bytes, t, sizeof t), b->done_layers,
          b->n_layers);
  fflush(stderr);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/*
 * The one naming rule (qlinear.torch.weight_name()): prefix + the layer +
 * "/" + its format + ".src-" + the hex of the source digest of its load,
 * which is pd's (packed) or fd's (float, for a daemon of quantizer version
 * qv). Replaces L->wname. 0, or the library's error, reported.
 */
static int content_name(imp_layer *L, const char *prefix,
                        const ql_packed_desc *pd, const ql_load_desc *fd,
                        uint32_t qv, ql_format ffmt, uint32_t fgroup,
                        int fasym) {
  uint8_t dg[QL_DIGEST_BYTES];
  char f[24], src[64], hex[2 * QL_DIGEST_BYTES + 1];
  int rv = pd != NULL ? ql_source_digest_packed(pd, dg)
                      : ql_source_digest_float(fd, qv, dg);
  if (rv != 0)
    return ql__ctl_fail_ql(L->name, rv);
  imp_describe(L, ffmt, fgroup, fasym, src, sizeof src, f, sizeof f);
  for (int i = 0; i < QL_DIGEST_BYTES; i++)
    snprintf(hex + 2 * i, 3, "%02x", dg[i]);
  size_t len = strlen(prefix) + strlen(L->name) + strlen(f) + 6 +
               sizeof hex;
  char *n = malloc(len);
  if (n == NULL)
    return ql__ctl_fail_local(L->name, QL_ENOMEM, "out of memory");
  snprintf(n, len, "%s%s/%s.src-%s", prefix, L->name, f, hex);
  if (strlen(n) >= QL_NAME_MAX) {
    free(n);
    return ql__ctl_fail_local(L->name, QL_ENAME, "content-addressed name "
                              "of %zu bytes (--prefix shorter)", len - 1);
  }
  free(L->wname);
  L->wname = n;
  return 0;
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
    d->qdata = (ql_packed_array){t->qdata.data,
                                 t->qdata.dtype,
                                 t->qdata.ndim,
                                 {t->qdata.shape[0], t->qdata.shape[1]}};
    d->scale = (ql_packed_array){t->scale.data,
                                 t->scale.dtype,
                                 t->scale.ndim,
                                 {t->scale.shape[0], t->scale.shape[1]}};
    if (t->zero.data != NULL)
      d->zero = (ql_packed_array){t->zero.data,
                                  t->zero.dtype,
                                  t->zero.ndim,
                                  {t->zero.shape[0], t->zero.shape[1]}};
  } else {
    const ql__ck_canon *c = &L->canon;
    d->format = c->format;
    d->group_size = c->group_size;
    d->n = n = c->n;
    d->k = c->k;
    d->asymmetric = c->asymmetric;
    d->zero_kind = QL_ZERO_FLOAT;
    d->qdata = (ql_packed_array){
        c->qdata, c->qdata_dtype, 2, {c->n, c->qdata_bytes / c->n}};
    d->scale =
        (ql_packed_array){c->scale, c->scale_dtype, 2, {c->groups, c->n}};
    if (c->zero != NULL)
      d->zero =
          (ql_packed_array){c->zero, c->scale_dtype, 2, {c->groups, c->n}};
  }
  if (L->bias != NULL)
    d->bias = (ql_packed_array){L->bias->data,
                                L->bias->dtype == QL__ST_F32   ? QL_ADT_F32
                                : L->bias->dtype == QL__ST_F16 ? QL_ADT_F16
                                                               : QL_ADT_BF16,
                                1,
                                {n, 0}};
}

int ql__cmd_import(ctx *cx, int argc, char **argv) {
  enum {
    OPT_FORMAT = 256,
    OPT_MATCH,
    OPT_PREFIX,
    OPT_PERSIST,
    OPT_DEVICES,
    OPT_DRY,
    OPT_POLICY,
    OPT_SCALE,
    OPT_NAMES
  };
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
      {"names", required_argument, NULL, OPT_NAMES},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0}};
  const char *fmt_arg = NULL, *match_arg = NULL, *prefix = "", *devices = NULL;
  ql_format ffmt = QL_FORMAT_Q4G;
  uint32_t fgroup = 128;
  int fasym = 0, persist = 0, dry = 0, ch, rv = 0, sdt = 0, content = 0;
  ql_path policy = QL_PATH_AUTO;
  regex_t re;
  int have_re = 0;
  imp_state s;
  imp_bar bar = {0, 0, 0, 0, 0, -1};
  size_t shared = 0, imported = 0;
  uint64_t resident = 0;
  double t0 = now_s();

  memset(&s, 0, sizeof s);
  ql__ctl_getopt_reset();
  while ((ch = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    switch (ch) {
    case OPT_FORMAT:
      fmt_arg = optarg;
      if (ql__ctl_parse_format(optarg, &ffmt, &fgroup, &fasym) != 0)
        return ql__ctl_usage_error(
            "import: unknown format '%s' (q4g32..q4g256, "
            "q8c, q8b32..q8b256[a] or f8r)",
            optarg);
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
      if (ql__ctl_parse_path(optarg, &policy) != 0 ||
          policy == QL_PATH_ACT_QUANT)
        return ql__ctl_usage_error("import: unknown policy '%s' (auto or "
                                   "weight-only)",
                                   optarg);
      break;
    case OPT_SCALE:
      if (ql__ctl_parse_dtype(optarg, &sdt) != 0)
        return ql__ctl_usage_error(
            "import: --scale-dtype '%s' (bf16, f16 or f32)", optarg);
      break;
    case OPT_NAMES:
      if (strcmp(optarg, "content") != 0 && strcmp(optarg, "plain") != 0)
        return ql__ctl_usage_error("import: --names '%s' (plain or content)",
                                   optarg);
      content = strcmp(optarg, "content") == 0;
      break;
    case 'h':
      puts("usage: qlinearctl import CHECKPOINT.safetensors|INDEX.json ...\n"
           "         [--format FMT] [--match REGEX] [--prefix NAME/]\n"
           "         [--names plain|content]\n"
           "         [--policy auto|weight-only] [--scale-dtype DTYPE]\n"
           "         [--persist] [--devices LIST] [--dry-run]");
      return 0;
    default:
      return ql__ctl_bad_option("import", argv);
    }
  }
  if (argc - optind < 1)
    return ql__ctl_usage_error("import needs at least one checkpoint file");
  if (match_arg != NULL) {
    int e = regcomp(&re, match_arg, REG_EXTENDED | REG_NOSUB);
    if (e != 0) {
      char msg[256];
      regerror(e, &re, msg, sizeof msg);
      return ql__ctl_usage_error("import: --match '%s': %s", match_arg, msg);
    }
    have_re = 1;
  }

  for (int i = optind; i < argc; i++)
    if ((rv = imp_add_arg(&s, argv[i])) != 0)
      goto done;
  if (s.n_files == 0) {
    rv = ql__ctl_fail_local("import", QL_EINVAL, "no checkpoint file");
    goto done;
  }
  if ((rv = imp_config(&s)) != 0 ||
      (rv = imp_plan(&s, have_re ? &re : NULL, prefix, fmt_arg)) != 0)
    goto done;
  if (s.n_layers == 0) {
    rv = ql__ctl_fail_local("import", QL_ENOTFOUND,
                            "no layer to import in %zu "
                            "file(s)%s",
                            s.n_files,
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
             ql__ctl_human_bytes(L->bytes, b, sizeof b));
    }
    printf("would import %zu tensors (%s) from %zu file(s); %zu other "
           "tensors skipped%s%s\n",
           s.n_layers, ql__ctl_human_bytes(bar.total_bytes, src, sizeof src),
           s.n_files, s.skipped,
           s.cfg_source[0] ? "; quantization_config: " : "", s.cfg_source);
    if (s.skipped_float > 0)
      printf("%zu float weights of this quantized checkpoint skipped: "
             "--format FMT imports them too, quantized to FMT\n",
             s.skipped_float);
    if (s.skipped_embed > 0)
      printf("%zu embeddings skipped: they are lookup tables, not "
             "linears\n", s.skipped_embed);
    goto done;
  }

  if ((rv = ql__ctl_connect_ctx(cx)) != 0)
    goto done;
  uint32_t qversion = 1;
  if (content) {
    ql_hello_info h;
    if ((rv = ql_hello(cx->client, &h)) != 0) {
      rv = ql__ctl_fail_ql("import: hello", rv);
      goto done;
    }
    qversion = h.quantizer_version;
  }
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
      if (content) {
        d.bias = (ql_packed_array){0};
        d.name = NULL;
        if ((rv = content_name(L, prefix, &d, NULL, 0, ffmt, fgroup,
                               fasym)) != 0)
          goto fail_layer;
        d.name = L->wname;
      }
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
      if (content) {
        d.bias = NULL;
        if ((rv = content_name(L, prefix, NULL, &d, qversion, ffmt, fgroup,
                               fasym)) != 0)
          goto fail_layer;
        d.name = L->wname;
      }
      rv = ql_load_float(cx->client, &d, &info, &sh);
    }
  fail_layer:
    if (rv != 0) {
      char what[QL_NAME_MAX + 64];
      if (bar.last >= 0)
        fputs("\r\033[K", stderr);
      snprintf(what, sizeof what, "import %s (%s)", L->wname, L->name);
      rv = ql__ctl_fail_ql(what, rv);
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

summary : {
  char b[32], t[32];
  ql_stats_info *st = NULL;
  printf("imported %zu of %zu tensors (%zu shared) from %zu file(s) in "
         "%s; their resident bytes %s\n",
         imported, s.n_layers, shared, s.n_files,
         ql__ctl_human_ns((now_s() - t0) * 1e9, t, sizeof t),
         ql__ctl_human_bytes(resident, b, sizeof b));
  if (s.skipped_float > 0)
    printf("  %zu float weights of this quantized checkpoint skipped "
           "(--format FMT imports them too)\n",
           s.skipped_float);
  if (s.skipped_embed > 0)
    printf("  %zu embeddings skipped (lookup tables, not linears)\n",
           s.skipped_embed);
  if (content && imported > 0)
    printf("  content-addressed names; biases stay with the model\n");
  if (imported > 0 && ql_stats(cx->client, &st) == 0) {
    for (size_t i = 0; i < st->n_devices; i++)
      printf("  %s: %s resident\n", st->devices[i].device,
             ql__ctl_human_bytes(st->devices[i].bytes_resident, b, sizeof b));
    ql_stats_free(st);
  }
}

done:
  if (have_re)
    regfree(&re);
  imp_free(&s);
  return rv;
}
