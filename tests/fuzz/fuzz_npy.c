/*
 * fuzz_npy.c - libFuzzer target for the .npy parser (client/ctl/npy.c), the
 * part of qlinearctl that reads untrusted files.
 *
 * Beyond "no crash, no out-of-bounds read", it checks what a caller relies
 * on: an accepted file's data lies inside the input and has exactly the
 * size its shape says, a rejected one comes with a reason, and an accepted
 * array written back out parses to the same array.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "npy.h"

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond))                                                               \
      abort();                                                                 \
  } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  ql__npy a, b;
  char err[256];
  void *enc;
  size_t enc_len;

  int rv = ql__npy_parse(data, size, &a, err, sizeof err);
  if (rv != 0) {
    CHECK(rv == QL_EBADFILE);
    CHECK(err[0] != '\0');
    CHECK(a.data == NULL && a.data_len == 0);
    return 0;
  }

  CHECK(a.ndim == 1 || a.ndim == 2);
  CHECK(a.elem_size == ql__npy_type_size(a.type) && a.elem_size != 0);
  CHECK(a.ndim == 2 || a.shape[1] == 1);
  CHECK(a.count == a.shape[0] * a.shape[1]);
  CHECK(a.data_len == a.count * a.elem_size);
  CHECK((const uint8_t *)a.data >= data &&
        (const uint8_t *)a.data + a.data_len == data + size);

  /* Round trip through the writer. */
  rv = ql__npy_encode(a.type, a.ndim, a.shape, a.data, &enc, &enc_len, err,
                      sizeof err);
  if (rv == QL_ENOMEM)
    return 0;
  CHECK(rv == 0);
  CHECK(ql__npy_parse(enc, enc_len, &b, err, sizeof err) == 0);
  CHECK(b.type == a.type && b.ndim == a.ndim);
  CHECK(b.shape[0] == a.shape[0] && b.shape[1] == a.shape[1]);
  CHECK(b.data_len == a.data_len);
  CHECK(a.data_len == 0 || memcmp(a.data, b.data, a.data_len) == 0);
  free(enc);
  return 0;
}
