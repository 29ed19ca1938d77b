/*
 * fuzz_safetensors.c - libFuzzer target for the safetensors reader
 * (client/lib/safetensors.c), the part of `qlinearctl import` that reads
 * untrusted checkpoint files, for the GPTQ/AWQ conversion that reads the
 * tensors it hands out (client/lib/ckpt_import.c), and for the parser of
 * the quantization_config JSON beside them (ql__ck_config_parse(), which
 * ql_ckpt_convert() runs on whatever its caller read): a metadata value
 * under "quantization_config" is parsed as that file, and what it gives
 * drives the conversion.
 *
 * Beyond "no crash, no out-of-bounds read", it checks what a caller relies
 * on: an accepted file's tensors lie inside the input, have exactly the
 * bytes their shape and dtype say, and do not overlap; a rejected one comes
 * with a reason.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt_import.h"
#include "safetensors.h"

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond))                                                               \
      abort();                                                                 \
  } while (0)

static const ql__st_tensor *find_in(void *arg, const char *name) {
  return ql__st_find(arg, name);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  ql__st_file *f = NULL;
  char err[256] = "";

  int rv = ql__st_parse(data, size, &f, err, sizeof err);
  if (rv != 0) {
    CHECK(rv == QL_EBADFILE || rv == QL_EDTYPE || rv == QL_ESHAPE ||
          rv == QL_ENOMEM);
    CHECK(err[0] != '\0');
    CHECK(f == NULL);
    return 0;
  }
  for (size_t i = 0; i < f->n_tensors; i++) {
    const ql__st_tensor *t = &f->tensors[i];
    uint64_t count = 1;
    CHECK(t->ndim >= 0 && t->ndim <= QL__ST_MAX_DIMS);
    for (int d = 0; d < t->ndim; d++)
      count *= t->shape[d];
    CHECK(t->bytes == count * ql__st_dtype_size(t->dtype));
    CHECK(t->offset <= size && t->bytes <= size - t->offset);
    CHECK(t->data == data + t->offset);
    for (size_t j = 0; j < i; j++) {
      const ql__st_tensor *u = &f->tensors[j];
      CHECK(t->bytes == 0 || u->bytes == 0 ||
            t->offset + t->bytes <= u->offset ||
            u->offset + u->bytes <= t->offset);
    }
    if (t->bytes > 0)
      (void)(volatile unsigned char)t->data[t->bytes - 1];
  }
  /* The converter on whatever three tensors the file has: it must refuse
   * or convert without reading outside them. */
  if (f->n_tensors >= 3) {
    ql__ck_layer l = {"x", &f->tensors[0], &f->tensors[1], &f->tensors[2],
                      f->n_tensors >= 4 ? &f->tensors[3] : NULL, 0};
    ql__ck_canon c;
    ql__ck_config cfg = {.present = 1, .bits = 4, .sym = -1,
                         .desc_act = -1};
    const char *qc = ql__st_meta(f, "quantization_config");
    if (qc != NULL) {
      ql__ck_config parsed;
      int prv = ql__ck_config_parse(qc, strlen(qc), &parsed, err, sizeof err);
      CHECK(prv == 0 || (prv == QL_EBADFILE && err[0] != '\0'));
      CHECK(prv != 0 || parsed.bits >= 0);
      if (prv == 0)
        cfg = parsed;
    }
    for (int pass = 0; pass < 2; pass++) {
      /* The check alone refuses what the conversion refuses and gives
       * its sizes, allocating nothing. */
      ql__ck_canon chk;
      l.check_only = 1;
      int crv = ql__ck_convert(&l, pass ? &cfg : NULL, &chk, err, sizeof err);
      CHECK(chk.qdata == NULL && chk.scale == NULL && chk.zero == NULL);
      l.check_only = 0;
      rv = ql__ck_convert(&l, pass ? &cfg : NULL, &c, err, sizeof err);
      CHECK(crv == rv);
      if (rv == 0) {
        CHECK(c.qdata != NULL && c.scale != NULL);
        CHECK(chk.qdata_bytes == c.qdata_bytes &&
              chk.scale_bytes == c.scale_bytes &&
              chk.has_zero == (c.zero != NULL) && chk.n == c.n &&
              chk.k == c.k && chk.format == c.format &&
              chk.group_size == c.group_size);
        ql__ck_canon_free(&c);
      } else {
        CHECK(err[0] != '\0' && c.qdata == NULL);
      }
    }
  }
  /* TorchAO subclass descriptions in the metadata, with their parts
   * looked up in the file. */
  for (size_t i = 0; i < f->n_meta; i++) {
    ql__ck_torchao t;
    char x[512];
    size_t l = strlen(f->meta_keys[i]);
    /* The key is "X.weight"; the parts are "X._weight_<part>". */
    if (l < 7 || l - 7 >= sizeof x ||
        strcmp(f->meta_keys[i] + l - 7, ".weight") != 0)
      continue;
    memcpy(x, f->meta_keys[i], l - 7);
    x[l - 7] = '\0';
    rv = ql__ck_torchao_layer(x, f->meta_values[i], find_in, f, &t, err,
                              sizeof err);
    CHECK(rv == 0 ? t.qdata.data != NULL : err[0] != '\0');
  }
  ql__st_free(f);
  return 0;
}
