/*
 * fuzz_store.c - libFuzzer target for ql__store_parse() (daemon/state/store.c),
 * the validator of persistent weight store files: the input is the whole
 * contents of one file, as ql__store_load_all() maps it.
 *
 * The input is copied to an allocation of exactly its size, so ASan traps
 * any read past the end of the "file". A refused file must come back with
 * QL_EBADFILE (or QL_ENOMEM/QL_EINTERNAL), a message and no weight. An
 * accepted one must be a canonical weight whose digest is the one in the
 * file, with a valid name and policy, and it must survive a round trip:
 * encoded again with ql__store_header() and the writer's array order, it
 * parses to the same weight.
 *
 * Built under libFuzzer by 'make fuzz' and, with replay_main.c, run over the
 * seed corpus in tests/fuzz/corpus/store/ by 'make check'.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "wire/protocol.h"
#include "state/store.h"
#include "state/digest.h"

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond))                                                               \
      abort();                                                                 \
  } while (0)

static void append(uint8_t *buf, size_t *at, const void *p, size_t n) {
  memcpy(buf + *at, p, n);
  *at += n;
}

static void same_weight(const ql_qweight *a, const ql_qweight *b) {
  CHECK(a->format == b->format && a->group_size == b->group_size &&
        a->n == b->n && a->k == b->k && a->groups == b->groups &&
        a->asymmetric == b->asymmetric && a->scale_dtype == b->scale_dtype &&
        a->qdata_bytes == b->qdata_bytes && a->scale_bytes == b->scale_bytes);
  CHECK(memcmp(a->qdata, b->qdata, a->qdata_bytes) == 0);
  CHECK(memcmp(a->scale, b->scale, a->scale_bytes) == 0);
  CHECK((a->zero == NULL) == (b->zero == NULL));
  CHECK(a->zero == NULL || memcmp(a->zero, b->zero, a->scale_bytes) == 0);
  CHECK((a->bias == NULL) == (b->bias == NULL));
  CHECK(a->bias == NULL ||
        memcmp(a->bias, b->bias, (size_t)a->n * sizeof(float)) == 0);
}

/* Encodes w as ql__store_put would and parses it back. */
static void round_trip(const ql__stored_weight *w) {
  const ql_qweight *q = w->q;
  uint8_t *hdr = NULL, *buf;
  size_t hdr_len = 0, len, at = 0, bias = q->bias ? (size_t)q->n * 4 : 0;
  ql__stored_weight back;
  char err[256];

  CHECK(ql__store_header(w->name, q, w->digest, w->policy, w->devices, &hdr,
                         &hdr_len) ==
        0);
  CHECK(hdr_len % QL_STORE_ALIGN == 0);
  len = hdr_len + bias + q->scale_bytes * (q->zero ? 2 : 1) + q->qdata_bytes;
  CHECK((buf = malloc(len)) != NULL);
  append(buf, &at, hdr, hdr_len);
  if (q->bias)
    append(buf, &at, q->bias, bias);
  append(buf, &at, q->scale, q->scale_bytes);
  if (q->zero)
    append(buf, &at, q->zero, q->scale_bytes);
  append(buf, &at, q->qdata, q->qdata_bytes);
  CHECK(at == len);
  CHECK(ql__store_parse(buf, len, &back, err, sizeof err) == 0);
  same_weight(q, back.q);
  CHECK(strcmp(back.name, w->name) == 0 && back.policy == w->policy &&
        strcmp(back.devices, w->devices) == 0 &&
        memcmp(back.digest, w->digest, QL_DIGEST_BYTES) == 0);
  ql_qweight_free(back.q);
  free(buf);
  free(hdr);
}

/* The same input as the head of a cached layout file whose size is the
 * input's, and then a page larger: accepted only when its header says
 * exactly that size, its id is the one wanted, and the file holds the
 * image after the header's page. */
static void layout_head(const uint8_t *buf, size_t size) {
  static const char *const ids[] = {"cpu-1", "x"};
  for (int i = 0; i < 2; i++) {
    for (uint64_t extra = 0; extra <= 4096; extra += 4096) {
      uint64_t len = 99, fsize = (uint64_t)size + extra;
      int rc = ql__store_layout_check(buf, size, fsize, ids[i], &len);
      CHECK(rc == 0 || rc == QL_EBADFILE);
      CHECK(rc == 0 ? fsize >= 4096 && len == fsize - 4096 && size >= 96
                    : len == 0);
    }
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  uint8_t *buf = malloc(size ? size : 1);
  ql__stored_weight w;
  char err[256], file[QL_STORE_FILE_NAME_MAX];
  uint8_t digest[QL_DIGEST_BYTES];
  int rc;

  CHECK(buf != NULL);
  memcpy(buf, data, size);
  layout_head(buf, size);
  memset(err, 'x', sizeof err);
  w.q = (ql_qweight *)&w; /* must be overwritten */
  rc = ql__store_parse(buf, size, &w, err, sizeof err);
  CHECK(memchr(err, '\0', sizeof err) != NULL);
  if (rc == 0) {
    CHECK(w.q != NULL && ql_qweight_check(w.q) == 0);
    CHECK(ql__name_valid(w.name) && ql_path_valid(w.policy));
    CHECK(ql__qweight_digest(w.q, digest) == 0);
    CHECK(memcmp(digest, w.digest, QL_DIGEST_BYTES) == 0);
    CHECK(ql__store_file_name(w.name, w.digest, file) == 0);
    CHECK(strchr(file, '/') == NULL);
    round_trip(&w);
    ql_qweight_free(w.q);
  } else {
    CHECK(w.q == NULL);
    CHECK(rc == QL_EBADFILE || rc == QL_ENOMEM || rc == QL_EINTERNAL);
    CHECK(err[0] != '\0');
  }
  free(buf);
  return 0;
}
