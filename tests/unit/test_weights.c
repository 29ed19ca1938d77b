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
#include "state/weights.h"

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

/* One host device with the generic layout (none). */
static const ql__placement host = {1, {{0, NULL, 0, 1}}};

START_TEST(test_share_and_exists) {
  ql__weight_store *s;
  ck_assert_int_eq(ql__weight_store_create(0, &s), 0);
  ql__weight *a, *b, *c, *existing;
  ck_assert_int_eq(ql__weight_create("w", make_q(1, QL_FORMAT_Q4G),
                                     QL_PATH_AUTO, &host, &a), 0);
  ck_assert_int_eq(ql__weight_create("w", make_q(1, QL_FORMAT_Q4G),
                                     QL_PATH_AUTO, &host, &b), 0);
  ck_assert_int_eq(ql__weight_create("w", make_q(2, QL_FORMAT_Q4G),
                                     QL_PATH_AUTO, &host, &c), 0);
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
                                       QL_PATH_AUTO, &host, &w), 0);
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
static const ql_backend fake = {.name = "fake", .impls = fake_impls, .n_impls = 1};
static const ql__placement on_fake = {1, {{0, &fake, 0, 1}}};

/* A device backend whose repack fails on ordinal 1 (a device out of
 * memory) and records which ordinal each layout was made on. */
static int bound = -1, bind_calls;
static int dev_bind(int ordinal) {
  bind_calls++;
  bound = ordinal;
  return 0;
}
static int dev_repack(ql_repack_args *a) {
  if (bound == 1)
    return QL_ENOMEM;
  return fake_repack(a);
}
static const ql_kernel_impl dev_impls[] = {
    {.name = "dev.repack",
     .op = QL_OP_REPACK,
     .formats = QL_ALL_FORMATS,
     .dtypes = QL_ALL_DTYPES,
     .fn.repack = dev_repack,
     .free_packed = fake_free},
};
static int dev_count(const char **why) {
  (void)why;
  return 2;
}
static int dev_info(int o, ql_device_desc *out) {
  snprintf(out->name, sizeof out->name, "dev:%d", o);
  return 0;
}
static const ql_backend devb = {.name = "dev",
                                .impls = dev_impls,
                                .n_impls = 1,
                                .device_count = dev_count,
                                .device_info = dev_info,
                                .device_bind = dev_bind};

/* The backend's repack runs at load for the formats it handles, its
 * layout counts as resident bytes, and it is freed with the weight. */
START_TEST(test_repack_at_load) {
  ck_assert_int_eq(ql_backend_check(&fake), 0);
  ql__weight *w;
  repacks = frees = 0;
  ck_assert_int_eq(ql__weight_create("r", make_q(3, QL_FORMAT_Q8C),
                                     QL_PATH_AUTO, &on_fake, &w), 0);
  ck_assert_int_eq(repacks, 1);
  ck_assert_ptr_nonnull(w->lay[0].packed);
  ck_assert_uint_eq(w->lay[0].packed_bytes, 100);
  ck_assert_uint_eq(w->bytes, w->q->qdata_bytes + w->q->scale_bytes + 100);
  ql__weight_unref(w);
  ck_assert_int_eq(frees, 1);
  /* A format the backend does not repack keeps the canonical form. */
  ck_assert_int_eq(ql__weight_create("r", make_q(3, QL_FORMAT_Q4G),
                                     QL_PATH_AUTO, &on_fake, &w), 0);
  ck_assert_int_eq(repacks, 1);
  ck_assert_ptr_null(w->lay[0].packed);
  ql__weight_unref(w);
  ck_assert_int_eq(frees, 1);
}
END_TEST

/* A weight on several devices: one layout per device, each made with its
 * device bound; layouts outside host memory count in dev_bytes and against
 * that device's budget, not the host's. A device whose repack fails fails
 * the load and leaves no layout anywhere. */
START_TEST(test_devices) {
  ql__weight *w, *w2, *existing;
  ql__placement pl = {3, {{0, &devb, 0, 0}, {2, NULL, 0, 1}, {5, &devb, 2, 0}}};
  ck_assert_int_eq(ql_backend_check(&devb), 0);
  repacks = frees = bind_calls = 0;
  ck_assert_int_eq(ql__weight_create("d", make_q(4, QL_FORMAT_Q8C),
                                     QL_PATH_AUTO, &pl, &w), 0);
  ck_assert_int_eq(bind_calls, 2);
  ck_assert_int_eq(repacks, 2);
  ck_assert_uint_eq(w->devices, (1u << 0) | (1u << 2) | (1u << 5));
  ck_assert_ptr_nonnull(w->lay[0].packed);
  ck_assert_ptr_null(w->lay[2].packed); /* the host: the generic layout */
  ck_assert_ptr_nonnull(w->lay[5].packed);
  ck_assert_uint_eq(w->dev_bytes, 200);
  ck_assert_uint_eq(w->bytes, w->q->qdata_bytes + w->q->scale_bytes);

  ql__weight_store *s;
  ck_assert_int_eq(ql__weight_store_create(0, &s), 0);
  ql__weight_store_set_device_budget(s, 5, 150);
  ck_assert_int_eq(ql__weight_store_insert(s, w, &existing), 0);
  ck_assert_uint_eq(ql__weight_store_device_bytes(s, 0), 100);
  ck_assert_uint_eq(ql__weight_store_device_bytes(s, 5), 100);
  ck_assert_uint_eq(ql__weight_store_device_bytes(s, 2), 0);
  /* Another 100 bytes on device 5 would pass its budget of 150. */
  ck_assert_int_eq(ql__weight_create("e", make_q(5, QL_FORMAT_Q8C),
                                     QL_PATH_AUTO, &pl, &w2), 0);
  ck_assert_int_eq(ql__weight_store_insert(s, w2, &existing), QL_ENOMEM);
  ck_assert_uint_eq(ql__weight_store_device_bytes(s, 5), 100);
  ql__weight_unref(w2);
  /* Removed by name while still held (here, by the test): its layouts
   * count until it is freed. */
  ck_assert_int_eq(ql__weight_store_remove(s, "d"), 0);
  ck_assert_ptr_null(ql__weight_store_get(s, "d"));
  ck_assert_uint_eq(ql__weight_store_device_bytes(s, 5), 100);
  ql__weight_unref(w);
  ck_assert_uint_eq(ql__weight_store_device_bytes(s, 5), 0);
  ck_assert_uint_eq(ql__weight_store_device_bytes(s, 0), 0);
  ck_assert_int_eq(frees, repacks);

  /* Ordinal 1's repack fails: the load fails, the first layout is freed
   * and q is still the caller's. */
  ql__placement bad = {2, {{0, &devb, 0, 0}, {1, &devb, 1, 0}}};
  ql_qweight *q = make_q(6, QL_FORMAT_Q8C);
  repacks = frees = 0;
  ck_assert_int_eq(ql__weight_create("f", q, QL_PATH_AUTO, &bad, &w),
                   QL_ENOMEM);
  ck_assert_ptr_null(w);
  ck_assert_int_eq(repacks, 1);
  ck_assert_int_eq(frees, 1);
  /* A device named twice, or no device, is refused. */
  ql__placement twice = {2, {{3, NULL, 0, 1}, {3, NULL, 0, 1}}};
  ck_assert_int_eq(ql__weight_create("f", q, QL_PATH_AUTO, &twice, &w),
                   QL_EINVAL);
  ql__placement none = {0, {{0, NULL, 0, 0}}};
  ck_assert_int_eq(ql__weight_create("f", q, QL_PATH_AUTO, &none, &w),
                   QL_EINVAL);
  ql_qweight_free(q);
  ql__weight_store_free(s);
}
END_TEST

/* The budget: a weight that would take the store past it is refused and
 * changes nothing; removal gives its bytes back; a lower budget keeps what
 * is resident. */
START_TEST(test_budget) {
  ql__weight *a, *b, *c, *existing;
  ck_assert_int_eq(ql__weight_create("a", make_q(1, QL_FORMAT_Q8C),
                                     QL_PATH_AUTO, &host, &a), 0);
  ck_assert_int_eq(ql__weight_create("b", make_q(2, QL_FORMAT_Q8C),
                                     QL_PATH_AUTO, &host, &b), 0);
  ck_assert_int_eq(ql__weight_create("c", make_q(3, QL_FORMAT_Q8C),
                                     QL_PATH_AUTO, &host, &c), 0);
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
  /* a is removed by name, but held (by the test) it still counts: c does
   * not fit until a is freed. */
  ck_assert_int_eq(ql__weight_store_remove(s, "a"), 0);
  ck_assert_uint_eq(ql__weight_store_count(s), 1);
  ck_assert_uint_eq(ql__weight_store_bytes(s), 2 * a->bytes);
  ck_assert_int_eq(ql__weight_store_insert(s, c, &existing), QL_ENOMEM);
  ql__weight_unref(a);
  a = NULL;
  ck_assert_uint_eq(ql__weight_store_bytes(s), b->bytes);
  ck_assert_int_eq(ql__weight_store_insert(s, c, &existing), 0);
  ql__weight_store_set_budget(s, 1);
  ck_assert_uint_eq(ql__weight_store_count(s), 2);
  /* c, removed and held, comes back: counted once, whether the budget
   * lets it in or not. */
  ck_assert_int_eq(ql__weight_store_remove(s, "c"), 0);
  ck_assert_uint_eq(ql__weight_store_bytes(s), 2 * b->bytes);
  ck_assert_int_eq(ql__weight_store_insert(s, c, &existing), QL_ENOMEM);
  ck_assert_uint_eq(ql__weight_store_bytes(s), 2 * b->bytes);
  ql__weight_store_set_budget(s, 0); /* no limit */
  ck_assert_int_eq(ql__weight_store_insert(s, c, &existing), 0);
  ck_assert_uint_eq(ql__weight_store_bytes(s), 2 * b->bytes);
  ck_assert_uint_eq(ql__weight_store_count(s), 2);
  /* Removed and held when the store goes: it outlives the store. */
  ck_assert_int_eq(ql__weight_store_remove(s, "b"), 0);
  ql__weight_store_free(s);
  s = NULL;
  ck_assert_ptr_null(b->counted_in);
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
  tcase_add_test(tc, test_devices);
  suite_add_tcase(s, tc);
  return tu_run_suite(s, CK_NORMAL);
}
