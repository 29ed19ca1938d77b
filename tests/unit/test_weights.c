/*
 * test_weights.c - the daemon's weight store: sharing by digest,
 * ALREADY_EXISTS for other content, removal, reference counts that keep a
 * weight alive past its unload, and the repack made at load through the
 * registry (and freed with the weight).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <check.h>

#include "testutil.h"
#include "weights.h"

static ql_qweight *make_q(uint64_t seed, ql_format f) {
  enum { N = 8, K = 64 };
  float w[N * K];
  uint64_t st = seed;
  for (int i = 0; i < N * K; i++)
    w[i] = (float)tu_rng_gauss(&st);
  ql_quant_params p = {f, f == QL_FORMAT_Q4G ? 32 : 0, 0, QL_DTYPE_BF16};
  ql_qweight *q = NULL;
  ck_assert_int_eq(ql_qweight_quantize(&p, N, K, QL_DTYPE_F32, w, NULL, &q), 0);
  return q;
}

START_TEST(test_share_and_exists) {
  ql__weight_store *s;
  ck_assert_int_eq(ql__weight_store_create(0, &s), 0);
  ql__weight *a, *b, *c, *existing;
  ck_assert_int_eq(ql__weight_create("w", make_q(1, QL_FORMAT_Q4G),
                                     QL_PATH_AUTO, NULL, &a), 0);
  ck_assert_int_eq(ql__weight_create("w", make_q(1, QL_FORMAT_Q4G),
                                     QL_PATH_AUTO, NULL, &b), 0);
  ck_assert_int_eq(ql__weight_create("w", make_q(2, QL_FORMAT_Q4G),
                                     QL_PATH_AUTO, NULL, &c), 0);
  /* Same content, same digest; other content, other digest. */
  ck_assert(memcmp(a->digest, b->digest, QL_DIGEST_BYTES) == 0);
  ck_assert(memcmp(a->digest, c->digest, QL_DIGEST_BYTES) != 0);
  ck_assert_int_eq(ql__weight_store_insert(s, a, &existing), 0);
  ck_assert_ptr_null(existing);
  ck_assert_int_eq(a->refs, 2);
  ck_assert_int_eq(ql__weight_store_insert(s, b, &existing), 0);
  ck_assert_ptr_eq(existing, a);
  ck_assert_int_eq(ql__weight_store_insert(s, c, &existing), QL_EEXIST);
  ck_assert_ptr_eq(ql__weight_store_get(s, "w"), a);
  ck_assert_uint_eq(ql__weight_store_count(s), 1);
  ql__weight_unref(b);
  ql__weight_unref(c);
  /* A job's reference keeps the weight alive past its removal. */
  ql__weight_ref(a);
  ck_assert_int_eq(ql__weight_store_remove(s, "w"), 0);
  ck_assert_int_eq(ql__weight_store_remove(s, "w"), QL_ENOTFOUND);
  ck_assert_ptr_null(ql__weight_store_get(s, "w"));
  ck_assert_int_eq(a->in_store, 0);
  ck_assert_int_eq(a->refs, 2); /* the caller's and the job's */
  ql__weight_unref(a);
  ql__weight_unref(a);
  ql__weight_store_free(s);
}
END_TEST

START_TEST(test_many_names) {
  ql__weight_store *s;
  ck_assert_int_eq(ql__weight_store_create(0, &s), 0);
  for (int i = 0; i < 3000; i++) {
    char name[32];
    snprintf(name, sizeof name, "layer.%d", i);
    ql__weight *w, *existing;
    ck_assert_int_eq(ql__weight_create(name, make_q((uint64_t)i % 7,
                                                    QL_FORMAT_Q8C),
                                       QL_PATH_AUTO, NULL, &w), 0);
    ck_assert_int_eq(ql__weight_store_insert(s, w, &existing), 0);
    ql__weight_unref(w);
  }
  ck_assert_uint_eq(ql__weight_store_count(s), 3000);
  ck_assert_ptr_nonnull(ql__weight_store_get(s, "layer.2999"));
  ck_assert_ptr_null(ql__weight_store_get(s, "layer.3000"));
  /* Freed with weights in it: no leak under ASan. */
  ql__weight_store_free(s);
}
END_TEST

static int repacks, frees;

static int fake_repack(ql_repack_args *a) {
  repacks++;
  a->packed = malloc(100);
  a->packed_bytes = 100;
  return a->packed ? 0 : QL_ENOMEM;
}

static void fake_free(void *p) {
  frees++;
  free(p);
}

static const ql_kernel_impl fake_impls[] = {
    {.name = "fake.repack",
     .op = QL_OP_REPACK,
     .formats = QL_FMT_BIT(QL_FORMAT_Q8C),
     .dtypes = QL_ALL_DTYPES,
     .fn.repack = fake_repack,
     .free_packed = fake_free},
};
static const ql_backend fake = {"fake", fake_impls, 1, NULL};

/* The backend's repack runs at load for the formats it handles, its
 * layout counts as resident bytes, and it is freed with the weight. */
START_TEST(test_repack_at_load) {
  ck_assert_int_eq(ql_backend_check(&fake), 0);
  ql__weight *w;
  repacks = frees = 0;
  ck_assert_int_eq(ql__weight_create("r", make_q(3, QL_FORMAT_Q8C),
                                     QL_PATH_AUTO, &fake, &w), 0);
  ck_assert_int_eq(repacks, 1);
  ck_assert_ptr_nonnull(w->packed);
  ck_assert_uint_eq(w->packed_bytes, 100);
  ck_assert_uint_eq(w->bytes, w->q->qdata_bytes + w->q->scale_bytes + 100);
  ql__weight_unref(w);
  ck_assert_int_eq(frees, 1);
  /* A format the backend does not repack keeps the canonical form. */
  ck_assert_int_eq(ql__weight_create("r", make_q(3, QL_FORMAT_Q4G),
                                     QL_PATH_AUTO, &fake, &w), 0);
  ck_assert_int_eq(repacks, 1);
  ck_assert_ptr_null(w->packed);
  ql__weight_unref(w);
  ck_assert_int_eq(frees, 1);
}
END_TEST

/* The budget: a weight that would take the store past it is refused and
 * changes nothing; removal gives its bytes back; a lower budget keeps what
 * is resident. */
START_TEST(test_budget) {
  ql__weight *a, *b, *c, *existing;
  ck_assert_int_eq(ql__weight_create("a", make_q(1, QL_FORMAT_Q8C),
                                     QL_PATH_AUTO, NULL, &a), 0);
  ck_assert_int_eq(ql__weight_create("b", make_q(2, QL_FORMAT_Q8C),
                                     QL_PATH_AUTO, NULL, &b), 0);
  ck_assert_int_eq(ql__weight_create("c", make_q(3, QL_FORMAT_Q8C),
                                     QL_PATH_AUTO, NULL, &c), 0);
  ck_assert_uint_eq(a->bytes, b->bytes);
  ql__weight_store *s;
  ck_assert_int_eq(ql__weight_store_create(2 * a->bytes, &s), 0);
  ck_assert_uint_eq(ql__weight_store_budget(s), 2 * a->bytes);
  ck_assert_int_eq(ql__weight_store_insert(s, a, &existing), 0);
  ck_assert_int_eq(ql__weight_store_insert(s, b, &existing), 0);
  ck_assert_uint_eq(ql__weight_store_bytes(s), 2 * a->bytes);
  ck_assert_int_eq(ql__weight_store_insert(s, c, &existing), QL_ENOMEM);
  ck_assert_int_eq(c->refs, 1);
  ck_assert_int_eq(c->in_store, 0);
  ck_assert_uint_eq(ql__weight_store_count(s), 2);
  ck_assert_uint_eq(ql__weight_store_bytes(s), 2 * a->bytes);
  ck_assert_int_eq(ql__weight_store_remove(s, "a"), 0);
  ck_assert_uint_eq(ql__weight_store_bytes(s), b->bytes);
  ck_assert_int_eq(ql__weight_store_insert(s, c, &existing), 0);
  ql__weight_store_set_budget(s, 1);
  ck_assert_uint_eq(ql__weight_store_count(s), 2);
  ck_assert_int_eq(ql__weight_store_remove(s, "c"), 0);
  ck_assert_int_eq(ql__weight_store_insert(s, c, &existing), QL_ENOMEM);
  ql__weight_store_set_budget(s, 0); /* no limit */
  ck_assert_int_eq(ql__weight_store_insert(s, c, &existing), 0);
  ql__weight_unref(a);
  ql__weight_unref(b);
  ql__weight_unref(c);
  ql__weight_store_free(s);
}
END_TEST

int main(void) {
  Suite *s = suite_create("weights");
  TCase *tc = tcase_create("weights");
  tcase_add_test(tc, test_share_and_exists);
  tcase_add_test(tc, test_many_names);
  tcase_add_test(tc, test_repack_at_load);
  tcase_add_test(tc, test_budget);
  suite_add_tcase(s, tc);
  return tu_run_suite(s, CK_NORMAL);
}
