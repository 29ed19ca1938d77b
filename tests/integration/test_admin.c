/*
 * test_admin.c - integration tests of the admin socket and the persistent
 * weight store (DESIGN §7, §8, §10): a real qlineard, clients through
 * libqlinear on both sockets, raw requests for what the library would not
 * send, and the daemon killed with SIGKILL and started again on the same
 * state directory.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <check.h>

#include "harness.h"
#include "npy.h"
#include "qlinear/qlinear.h"
#include "testutil.h"

#define QL_CROSSOVER_NEVER_ROWS UINT32_MAX

/* ------------------------------------------------------------- helpers */

static int load(ql_client *c, const char *name, const td_layer *l, ql_format f,
                uint32_t gs, int persistent, int *shared) {
  return td_load(c, name, l, f, gs, persistent, NULL, shared);
}

/* y = x·Wᵀ + b through the daemon, M rows, as f32. */
static float *linear(ql_client *c, const char *name, const float *x,
                     uint64_t m, uint64_t k, uint64_t n) {
  float *y = tu_xmalloc(m * n * sizeof(float));
  int rc = ql_linear(c, name, QL_PATH_AUTO, QL_DTYPE_F32, m, k, x, n, y, NULL);
  ck_assert_msg(rc == 0, "linear %s: %s: %s", name, ql_strerror(rc),
                ql_errmsg());
  return y;
}

/* A fresh state directory's parent (the daemon makes the directory). */
static void state_dir(char *buf, size_t len) {
  char tmpl[] = "/tmp/ql-state-XXXXXX";
  ck_assert_ptr_nonnull(mkdtemp(tmpl));
  snprintf(buf, len, "%s/store", tmpl);
}

static void rm_state(const char *dir) {
  DIR *dd = opendir(dir);
  struct dirent *e;
  char path[512];
  while (dd && (e = readdir(dd)) != NULL) {
    if (e->d_name[0] == '.')
      continue;
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    unlink(path);
  }
  if (dd)
    closedir(dd);
  rmdir(dir);
  char parent[512];
  snprintf(parent, sizeof parent, "%s", dir);
  char *slash = strrchr(parent, '/');
  if (slash) {
    *slash = '\0';
    rmdir(parent);
  }
}

static void write_text(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  fputs(text, f);
  fclose(f);
}

/* A config file with text in a fresh directory: dir is a mkdtemp()
 * template, path (len bytes) gets the file's path. */
static void config_file(char *dir, char *path, size_t len, const char *text) {
  ck_assert_ptr_nonnull(mkdtemp(dir));
  snprintf(path, len, "%s/qlineard.conf", dir);
  write_text(path, text);
}

/* Files of dir whose names contain needle. */
static int count_files(const char *dir, const char *needle) {
  DIR *dd = opendir(dir);
  struct dirent *e;
  int n = 0;
  ck_assert_ptr_nonnull(dd);
  while ((e = readdir(dd)) != NULL)
    if (e->d_name[0] != '.' && strstr(e->d_name, needle) != NULL)
      n++;
  closedir(dd);
  return n;
}

/* Copies the file src to dst (created 0600). */
static void copy_file(const char *src, const char *dst) {
  char buf[4096];
  size_t n;
  FILE *in = fopen(src, "rb"), *out = fopen(dst, "wb");
  ck_assert_msg(in != NULL && out != NULL, "copy %s to %s", src, dst);
  while ((n = fread(buf, 1, sizeof buf, in)) > 0)
    ck_assert_uint_eq(fwrite(buf, 1, n, out), n);
  ck_assert(!ferror(in));
  fclose(in);
  ck_assert_int_eq(fclose(out), 0);
}

static int resident(ql_client *c, const char *name, ql_weight_info *out) {
  return ql_lookup(c, name, out);
}

/* ------------------------------------------------------------- tests */

/* What belongs to the admin socket is refused on the request socket, and
 * computing is refused on the admin socket. */
START_TEST(admin_ops_refused_on_user_socket) {
  char st[256], report[512];
  td d;
  td_layer l;
  state_dir(st, sizeof st);
  const char *args[] = {"--state-dir", st, NULL};
  td_start(&d, args);
  td_layer_make(&l, 64, 128, 1, 1);
  ql_client *u = td_connect(&d), *a = td_connect_admin(&d);

  ck_assert_int_eq(load(u, "p", &l, QL_FORMAT_Q8C, 0, 1, NULL), QL_EPERM);
  ck_assert_int_eq(ql_reload_config(u, report, sizeof report), QL_EPERM);
  ql_weight_info wi;
  ck_assert_int_eq(resident(u, "p", &wi), QL_ENOTFOUND);

  /* A raw ReloadConfig with a valid token is still refused. */
  Qlinear__V1__Request req = QLINEAR__V1__REQUEST__INIT;
  Qlinear__V1__ReloadConfigRequest rr = QLINEAR__V1__RELOAD_CONFIG_REQUEST__INIT;
  req.request_id = 77;
  req.body_case = QLINEAR__V1__REQUEST__BODY_RELOAD;
  req.reload = &rr;
  Qlinear__V1__Response *resp = td_call(&d, &req, 10000);
  ck_assert_ptr_nonnull(resp);
  ck_assert_int_eq(resp->status->code, QL_EPERM);
  qlinear__v1__response__free_unpacked(resp, NULL);

  /* The admin socket loads; Linear there is refused, in a session it runs. */
  ck_assert_int_eq(load(a, "p", &l, QL_FORMAT_Q8C, 0, 1, NULL), 0);
  float *x = tu_xmalloc(128 * sizeof(float));
  uint64_t seed = 9;
  td_randn(&seed, x, 128, 1.0f);
  float y[64];
  ck_assert_int_eq(ql_linear(a, "p", QL_PATH_AUTO, QL_DTYPE_F32, 1, 128, x, 64,
                             y, NULL),
                   QL_EPERM);
  float *yu = linear(u, "p", x, 1, 128, 64);
  free(yu);

  /* A session cannot unload what the admin socket keeps. */
  ck_assert_int_eq(ql_unload(u, "p"), QL_EPERM);
  ck_assert_int_eq(resident(u, "p", &wi), 0);
  ck_assert_int_eq(wi.persistent, 1);
  /* Regions are a session's: the admin client has none. */
  ql_region *r = NULL;
  ck_assert_int_ne(ql_region_create(a, 4096, &r), 0);
  ck_assert_int_eq(ql_reload_config(a, report, sizeof report), 0);
  ck_assert_msg(strstr(report, "no changes") != NULL, "report: %s", report);

  free(x);
  ql_close(u);
  ql_close(a);
  td_layer_free(&l);
  ck_assert_int_eq(td_stop(&d), 0);
  rm_state(st);
}
END_TEST

/* Without a state directory a persistent load has nowhere to go; an admin
 * load still keeps the weight resident without a session. */
START_TEST(admin_without_state_dir) {
  td d;
  td_layer l;
  td_start(&d, NULL);
  td_layer_make(&l, 32, 64, 2, 1);
  ql_client *a = td_connect_admin(&d);
  ck_assert_int_eq(load(a, "q", &l, QL_FORMAT_Q8C, 0, 1, NULL), QL_ENOTSUP);
  ck_assert_int_eq(load(a, "q", &l, QL_FORMAT_Q8C, 0, 0, NULL), 0);
  ql_close(a);
  ql_client *u = td_connect(&d);
  ql_weight_info wi;
  ck_assert_int_eq(resident(u, "q", &wi), 0);
  ck_assert_int_eq(wi.persistent, 0);
  ql_close(u);
  td_layer_free(&l);
  ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

/*
 * The persistence contract: a load acknowledged on the admin socket
 * survives kill -9; the restarted daemon serves identical bytes without any
 * client loading again. An admin unload removes the file.
 */
START_TEST(persistent_survives_kill9) {
  char st[256];
  td d;
  td_layer l1, l2;
  state_dir(st, sizeof st);
  const char *args[] = {"--state-dir", st, NULL};
  td_layer_make(&l1, 96, 256, 3, 1);
  td_layer_make(&l2, 80, 200, 4, 1);
  float *x1 = tu_xmalloc(3 * 256 * sizeof(float));
  float *x2 = tu_xmalloc(2 * 200 * sizeof(float));
  uint64_t seed = 5;
  td_randn(&seed, x1, 3 * 256, 1.0f);
  td_randn(&seed, x2, 2 * 200, 1.0f);

  td_start(&d, args);
  ql_client *a = td_connect_admin(&d);
  ck_assert_int_eq(load(a, "m/q4", &l1, QL_FORMAT_Q4G, 128, 1, NULL), 0);
  ck_assert_int_eq(load(a, "m/q8", &l2, QL_FORMAT_Q8C, 0, 1, NULL), 0);
  /* The same content again is shared, and stays stored once. */
  int shared = 0;
  ck_assert_int_eq(load(a, "m/q8", &l2, QL_FORMAT_Q8C, 0, 1, &shared), 0);
  ck_assert_int_eq(shared, 1);
  ck_assert_int_eq(count_files(st, ".safetensors"), 2);
  ck_assert_int_eq(count_files(st, ".layout"), 2);
  ql_close(a);
  ql_client *u = td_connect(&d);
  ql_weight_info before;
  ck_assert_int_eq(resident(u, "m/q4", &before), 0);
  float *y1 = linear(u, "m/q4", x1, 3, 256, 96);
  float *y2 = linear(u, "m/q8", x2, 2, 200, 80);
  ql_close(u);

  td_kill(&d, SIGKILL);
  td_wait(&d, 5000);
  td_start(&d, args);
  u = td_connect(&d);
  ql_weight_info after;
  ck_assert_int_eq(resident(u, "m/q4", &after), 0);
  ck_assert_int_eq(after.persistent, 1);
  ck_assert_mem_eq(after.digest, before.digest, QL_DIGEST_BYTES);
  float *z1 = linear(u, "m/q4", x1, 3, 256, 96);
  float *z2 = linear(u, "m/q8", x2, 2, 200, 80);
  ck_assert_mem_eq(z1, y1, 3 * 96 * sizeof(float));
  ck_assert_mem_eq(z2, y2, 2 * 80 * sizeof(float));
  ql_stats_info *s = NULL;
  ck_assert_int_eq(ql_stats(u, &s), 0);
  ck_assert_uint_eq(s->persistent_weights, 2);
  ck_assert_uint_ge(s->n_devices, 1);
  ck_assert_str_eq(s->devices[0].device, "cpu");
  ck_assert_uint_ge(s->devices[0].bytes_resident, before.bytes_resident);
  ql_stats_free(s);

  /* An admin unload removes the weight and its file, for good. */
  a = td_connect_admin(&d);
  ck_assert_int_eq(ql_unload(a, "m/q8"), 0);
  ck_assert_int_eq(ql_unload(a, "m/q8"), QL_ENOTFOUND);
  ql_close(a);
  ck_assert_int_eq(count_files(st, ".safetensors"), 1);
  ck_assert_int_eq(count_files(st, ".layout"), 1);
  ck_assert_int_eq(resident(u, "m/q8", &after), QL_ENOTFOUND);
  ql_close(u);
  ck_assert_int_eq(td_stop(&d), 0);
  td_start(&d, args);
  u = td_connect(&d);
  ck_assert_int_eq(resident(u, "m/q8", &after), QL_ENOTFOUND);
  ck_assert_int_eq(resident(u, "m/q4", &after), 0);
  ql_close(u);
  ck_assert_int_eq(td_stop(&d), 0);

  free(x1);
  free(x2);
  free(y1);
  free(y2);
  free(z1);
  free(z2);
  td_layer_free(&l1);
  td_layer_free(&l2);
  rm_state(st);
}
END_TEST

/* The path of the file in dir whose name starts with the digest and ends
 * with suffix; "" if none. */
static void find_file(const char *dir, const uint8_t *digest,
                      const char *suffix, char *path, size_t len) {
  char hex[2 * QL_DIGEST_BYTES + 1];
  for (int i = 0; i < QL_DIGEST_BYTES; i++)
    snprintf(hex + 2 * i, 3, "%02x", digest[i]);
  DIR *dd = opendir(dir);
  struct dirent *e;
  path[0] = '\0';
  ck_assert_ptr_nonnull(dd);
  while ((e = readdir(dd)) != NULL) {
    size_t n = strlen(e->d_name), sl = strlen(suffix);
    if (strncmp(e->d_name, hex, 64) == 0 && n > sl &&
        strcmp(e->d_name + n - sl, suffix) == 0)
      snprintf(path, len, "%s/%s", dir, e->d_name);
  }
  closedir(dd);
}

static void truncate_half(const char *path) {
  struct stat sb;
  ck_assert_msg(path[0] != '\0', "no such file");
  ck_assert_int_eq(stat(path, &sb), 0);
  ck_assert_int_eq(truncate(path, sb.st_size / 2), 0);
}

/* Inverts the byte at off of path. */
static void flip_byte(const char *path, off_t off) {
  int fd = open(path, O_RDWR);
  uint8_t b;
  ck_assert_int_ge(fd, 0);
  ck_assert_int_eq(pread(fd, &b, 1, off), 1);
  b ^= 0xFF;
  ck_assert_int_eq(pwrite(fd, &b, 1, off), 1);
  close(fd);
}

/* A truncated store file is moved aside at start; the others still load.
 * A truncated or damaged layout cache is rebuilt, with the same results. */
START_TEST(corrupt_store_file) {
  char st[256], path[512];
  td d;
  td_layer l1, l2;
  state_dir(st, sizeof st);
  const char *args[] = {"--state-dir", st, NULL};
  td_layer_make(&l1, 64, 128, 6, 1);
  td_layer_make(&l2, 64, 128, 7, 1);
  td_start(&d, args);
  ql_client *a = td_connect_admin(&d);
  ck_assert_int_eq(load(a, "good", &l1, QL_FORMAT_Q8C, 0, 1, NULL), 0);
  ck_assert_int_eq(load(a, "bad", &l2, QL_FORMAT_Q8C, 0, 1, NULL), 0);
  ql_weight_info bad, good;
  ck_assert_int_eq(resident(a, "bad", &bad), 0);
  ck_assert_int_eq(resident(a, "good", &good), 0);
  ql_close(a);
  float x[2 * 128];
  uint64_t seed = 11;
  td_randn(&seed, x, 2 * 128, 1.0f);
  ql_client *u = td_connect(&d);
  float *y = linear(u, "good", x, 2, 128, 64);
  ql_close(u);
  ck_assert_int_eq(td_stop(&d), 0);
  ck_assert_int_eq(count_files(st, ".layout"), 2);

  find_file(st, bad.digest, ".safetensors", path, sizeof path);
  truncate_half(path);
  find_file(st, good.digest, ".layout", path, sizeof path);
  truncate_half(path);

  td_start(&d, args);
  u = td_connect(&d);
  ql_weight_info wi;
  ck_assert_int_eq(resident(u, "good", &wi), 0);
  ck_assert_int_eq(resident(u, "bad", &wi), QL_ENOTFOUND);
  ck_assert_int_eq(count_files(st, ".corrupt-"), 1);
  float *z = linear(u, "good", x, 2, 128, 64);
  ck_assert_mem_eq(z, y, 2 * 64 * sizeof(float));
  free(z);
  /* The bad weight's layout went with it; the good one's was rebuilt. */
  ck_assert_int_eq(count_files(st, ".layout"), 1);
  struct stat sb;
  find_file(st, good.digest, ".layout", path, sizeof path);
  ck_assert_int_eq(stat(path, &sb), 0);
  ck_assert_int_gt(sb.st_size, 4096 + 64 * 128);
  ql_close(u);
  /* A flipped byte in the cached image, its size still right: its SHA-256
   * catches it at start, and the layout is rebuilt, with the same
   * results (the kernels trust a layout's bytes). */
  ck_assert_int_eq(td_stop(&d), 0);
  flip_byte(path, 4096 + 100);
  td_start(&d, args);
  u = td_connect(&d);
  z = linear(u, "good", x, 2, 128, 64);
  ck_assert_mem_eq(z, y, 2 * 64 * sizeof(float));
  free(z);
  free(y);
  ql_close(u);
  /* The name is free again: a new persistent load of it works. */
  a = td_connect_admin(&d);
  ck_assert_int_eq(load(a, "bad", &l2, QL_FORMAT_Q8C, 0, 1, NULL), 0);
  ql_close(a);
  ck_assert_int_eq(td_stop(&d), 0);
  td_layer_free(&l1);
  td_layer_free(&l2);
  rm_state(st);
}
END_TEST

/* A load past the CPU budget fails with QL_ENOMEM and changes nothing; a
 * reload that raises the budget lets it in. */
START_TEST(budget_overflow) {
  char cfgdir[] = "/tmp/ql-cfg-XXXXXX", cfg[300], report[1024];
  td d;
  td_layer l1, l2;
  /* A 128x256 q8c weight with bias holds 128*256 + 2*128*4 bytes, and
   * about as much again in the CPU's repacked layout: the budget fits one
   * and not two (checked below against what the daemon reports). */
  config_file(cfgdir, cfg, sizeof cfg, "[qlineard]\ncpu_budget_bytes = 100000\n");
  const char *args[] = {"--config", cfg, NULL};
  td_start(&d, args);
  td_layer_make(&l1, 128, 256, 8, 1);
  td_layer_make(&l2, 128, 256, 9, 1);
  ql_client *u = td_connect(&d), *a = td_connect_admin(&d);
  ck_assert_int_eq(load(u, "one", &l1, QL_FORMAT_Q8C, 0, 0, NULL), 0);
  ql_weight_info one;
  ck_assert_int_eq(resident(u, "one", &one), 0);
  ck_assert_uint_le(one.bytes_resident, 100000);
  ck_assert_uint_gt(2 * one.bytes_resident, 100000);
  ck_assert_uint_le(2 * one.bytes_resident, 200000);
  ck_assert_int_eq(load(u, "two", &l2, QL_FORMAT_Q8C, 0, 0, NULL), QL_ENOMEM);
  ck_assert_msg(strstr(ql_errmsg(), "budget") != NULL, "message: %s",
                ql_errmsg());
  ck_assert_int_eq(load(a, "two", &l2, QL_FORMAT_Q8C, 0, 0, NULL), QL_ENOMEM);
  ql_weight_info wi;
  ck_assert_int_eq(resident(u, "two", &wi), QL_ENOTFOUND);
  ql_stats_info *s = NULL;
  ck_assert_int_eq(ql_stats(u, &s), 0);
  ck_assert_uint_eq(s->weights, 1);
  ck_assert_uint_eq(s->devices[0].budget_bytes, 100000);
  ck_assert_uint_eq(s->devices[0].bytes_resident, one.bytes_resident);
  ql_stats_free(s);

  write_text(cfg, "[qlineard]\ncpu_budget_bytes = 200000\n");
  ck_assert_int_eq(ql_reload_config(a, report, sizeof report), 0);
  ck_assert_msg(strstr(report, "cpu_budget_bytes") != NULL, "report: %s",
                report);
  ck_assert_int_eq(load(u, "two", &l2, QL_FORMAT_Q8C, 0, 0, NULL), 0);
  ql_close(u);
  ql_close(a);
  ck_assert_int_eq(td_stop(&d), 0);
  unlink(cfg);
  rmdir(cfgdir);
  td_layer_free(&l1);
  td_layer_free(&l2);
}
END_TEST

/* A stored weight that does not load at start (here: past the budget)
 * keeps its file; an admin unload of its name removes that file, and says
 * so, where it used to answer QL_ENOTFOUND and leave it there for good. */
START_TEST(unload_of_stored_not_resident) {
  char st[256], cfgdir[] = "/tmp/ql-cfg-XXXXXX", cfg[300];
  td d;
  td_layer l;
  state_dir(st, sizeof st);
  config_file(cfgdir, cfg, sizeof cfg, "[qlineard]\ncpu_budget_bytes = 4096\n");
  const char *args[] = {"--state-dir", st, NULL};
  const char *small[] = {"--state-dir", st, "--config", cfg, NULL};
  td_layer_make(&l, 128, 256, 8, 1);
  td_start(&d, args);
  ql_client *a = td_connect_admin(&d);
  ck_assert_int_eq(load(a, "kept", &l, QL_FORMAT_Q8C, 0, 1, NULL), 0);
  ql_close(a);
  ck_assert_int_eq(td_stop(&d), 0);
  ck_assert_int_eq(count_files(st, ".safetensors"), 1);

  td_start(&d, small);
  ql_client *u = td_connect(&d);
  a = td_connect_admin(&d);
  ql_weight_info wi;
  ck_assert_int_eq(resident(u, "kept", &wi), QL_ENOTFOUND);
  ck_assert_int_eq(count_files(st, ".safetensors"), 1);
  /* A user session cannot; the admin can. */
  ck_assert_int_eq(ql_unload(u, "kept"), QL_ENOTFOUND);
  ck_assert_int_eq(count_files(st, ".safetensors"), 1);
  ck_assert_int_eq(ql_unload(a, "kept"), 0);
  ck_assert_int_eq(count_files(st, ".safetensors"), 0);
  ck_assert_int_eq(count_files(st, ".layout"), 0);
  ck_assert_int_eq(ql_unload(a, "kept"), QL_ENOTFOUND);
  ql_close(u);
  ql_close(a);
  ck_assert_int_eq(td_stop(&d), 0);
  unlink(cfg);
  rmdir(cfgdir);
  td_layer_free(&l);
  rm_state(st);
}
END_TEST

/* An admin unload of a weight a session still holds takes its name at
 * once, but its memory only when the session lets go: until then it
 * counts against the budget, and a load that would not fit beside it is
 * refused. */
START_TEST(budget_counts_unloaded_held) {
  char cfgdir[] = "/tmp/ql-cfg-XXXXXX", cfg[300];
  td d;
  td_layer l1, l2;
  config_file(cfgdir, cfg, sizeof cfg, "[qlineard]\ncpu_budget_bytes = 100000\n");
  const char *args[] = {"--config", cfg, NULL};
  td_start(&d, args);
  td_layer_make(&l1, 128, 256, 8, 1); /* one fits the budget, two do not */
  td_layer_make(&l2, 128, 256, 9, 1);
  ql_client *u = td_connect(&d), *v = td_connect(&d), *a = td_connect_admin(&d);
  ck_assert_int_eq(load(u, "one", &l1, QL_FORMAT_Q8C, 0, 0, NULL), 0);
  ql_weight_info one;
  ck_assert_int_eq(resident(u, "one", &one), 0);
  ck_assert_int_eq(ql_unload(a, "one"), 0);
  ck_assert_int_eq(resident(v, "one", &one), QL_ENOTFOUND);
  ck_assert_int_eq(load(v, "two", &l2, QL_FORMAT_Q8C, 0, 0, NULL), QL_ENOMEM);
  ql_stats_info *s = NULL;
  ck_assert_int_eq(ql_stats(v, &s), 0);
  ck_assert_uint_eq(s->weights, 0);
  ck_assert_uint_gt(s->devices[0].bytes_resident, 0);
  ql_stats_free(s);
  /* u's hold goes with its session: the memory with it. */
  ql_close(u);
  for (int i = 0; i < 100; i++) {
    ck_assert_int_eq(ql_stats(v, &s), 0);
    size_t left = s->devices[0].bytes_resident;
    ql_stats_free(s);
    if (left == 0)
      break;
    usleep(10 * 1000);
  }
  ck_assert_int_eq(load(v, "two", &l2, QL_FORMAT_Q8C, 0, 0, NULL), 0);
  ql_close(v);
  ql_close(a);
  ck_assert_int_eq(td_stop(&d), 0);
  unlink(cfg);
  rmdir(cfgdir);
  td_layer_free(&l1);
  td_layer_free(&l2);
}
END_TEST

/*
 * A reload that lowers max_queued_bytes below what requests already hold
 * makes new requests wait for room: answered QL_EEXHAUSTED at once (the
 * room left wrapped around and let everything in), and served again once
 * the queue has drained. QL_TEST_PIECE_DELAY_US keeps the first request
 * (4 MiB of inline x, in pieces) running meanwhile, whatever this
 * machine's speed.
 */
/* The first request of reload_lowers_queued_bytes, on its own thread and
 * client. */
typedef struct big_call {
  ql_client *c;
  const float *x;
  float *y;
  int rc;
} big_call;

static void *big_run(void *arg) {
  big_call *b = arg;
  b->rc = ql_linear(b->c, "w", QL_PATH_ACT_QUANT, QL_DTYPE_F32, 1024, 1024,
                    b->x, 256, b->y, NULL);
  return NULL;
}

START_TEST(reload_lowers_queued_bytes) {
  char cfgdir[] = "/tmp/ql-cfg-XXXXXX", cfg[300], report[1024];
  enum { N = 256, K = 1024, M = 1024 };
  td d;
  td_layer l;
  config_file(cfgdir, cfg, sizeof cfg, "[qlineard]\nmax_queued_bytes = 64M\ncpu_threads = 1\n");
  const char *args[] = {"--config", cfg, NULL};
  setenv("QL_TEST_PIECE_DELAY_US", "40000", 1);
  td_start(&d, args);
  unsetenv("QL_TEST_PIECE_DELAY_US");
  td_layer_make(&l, N, K, 3, 0);
  ql_client *c = td_connect_messages(&d), *a = td_connect_admin(&d);
  ck_assert_int_eq(load(c, "w", &l, QL_FORMAT_Q8C, 0, 0, NULL), 0);
  float *x = calloc((size_t)M * K, sizeof(float)), y[N];
  ck_assert_ptr_nonnull(x);
  big_call b = {td_connect_messages(&d), x,
                tu_xmalloc((size_t)M * N * sizeof(float)), -1};
  pthread_t t;
  ck_assert_int_eq(pthread_create(&t, NULL, big_run, &b), 0);
  usleep(200 * 1000); /* the 4 MiB request is queued or running */
  write_text(cfg, "[qlineard]\nmax_queued_bytes = 1M\ncpu_threads = 1\n");
  ck_assert_int_eq(ql_reload_config(a, report, sizeof report), 0);
  ck_assert_int_eq(ql_linear(c, "w", QL_PATH_AUTO, QL_DTYPE_F32, 1, K, x, N, y,
                             NULL),
                   QL_EEXHAUSTED);
  ck_assert_msg(strstr(ql_errmsg(), "queued") != NULL, "message: %s",
                ql_errmsg());
  ck_assert_int_eq(pthread_join(t, NULL), 0);
  ck_assert_msg(b.rc == 0, "the queued request: %s", ql_strerror(b.rc));
  ck_assert_int_eq(ql_linear(c, "w", QL_PATH_AUTO, QL_DTYPE_F32, 1, K, x, N, y,
                             NULL),
                   0);
  free(b.y);
  free(x);
  ql_close(b.c);
  ql_close(c);
  ql_close(a);
  ck_assert_int_eq(td_stop(&d), 0);
  unlink(cfg);
  rmdir(cfgdir);
  td_layer_free(&l);
}
END_TEST

/* An admin unload takes a weight from every session holding it; their
 * later requests find nothing, and nothing crashes when they let go. */
START_TEST(admin_unload_of_held_weight) {
  td d;
  td_layer l;
  td_start(&d, NULL);
  td_layer_make(&l, 32, 64, 10, 1);
  ql_client *u = td_connect(&d), *a = td_connect_admin(&d);
  ck_assert_int_eq(load(u, "held", &l, QL_FORMAT_Q8C, 0, 0, NULL), 0);
  ck_assert_int_eq(ql_unload(a, "held"), 0);
  float x[64] = {0}, y[32];
  ck_assert_int_eq(ql_linear(u, "held", QL_PATH_AUTO, QL_DTYPE_F32, 1, 64, x,
                             32, y, NULL),
                   QL_ENOTFOUND);
  /* The session's own hold is still there to drop; then the name is free
   * and loads again. */
  ck_assert_int_eq(ql_unload(u, "held"), 0);
  ck_assert_int_eq(load(u, "held", &l, QL_FORMAT_Q8C, 0, 0, NULL), 0);
  /* An admin load of what a session holds makes it the admin socket's too:
   * it outlives the session. */
  int shared = 0;
  ck_assert_int_eq(load(a, "held", &l, QL_FORMAT_Q8C, 0, 0, &shared), 0);
  ck_assert_int_eq(shared, 1);
  ql_close(u);
  u = td_connect(&d);
  ql_weight_info wi;
  ck_assert_int_eq(resident(u, "held", &wi), 0);
  ql_close(u);
  ql_close(a);
  td_layer_free(&l);
  ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

/* The lease: a session with no request for session_lease_ms ends (its
 * regions with it); one that keeps asking stays. */
START_TEST(session_lease) {
  td d;
  td_layer l;
  const char *args[] = {"--session-lease-ms", "700", NULL};
  td_start(&d, args);
  td_layer_make(&l, 16, 32, 12, 1);
  ql_client *idle = td_connect(&d), *busy = td_connect(&d);
  ql_region *r = NULL;
  ck_assert_int_eq(ql_region_create(idle, 8192, &r), 0);
  ck_assert_int_eq(load(busy, "lw", &l, QL_FORMAT_Q8C, 0, 0, NULL), 0);
  ql_weight_info wi;
  for (int i = 0; i < 20; i++) { /* 2 s of requests, 100 ms apart */
    ck_assert_int_eq(resident(busy, "lw", &wi), 0);
    usleep(100 * 1000);
  }
  ck_assert_int_eq(resident(idle, "lw", &wi), QL_ESESSION);
  ql_stats_info *s = NULL;
  ck_assert_int_eq(ql_stats(busy, &s), 0);
  ck_assert_uint_eq(s->regions, 0);
  ck_assert_uint_eq(s->weights, 1); /* busy still holds it */
  ql_stats_free(s);
  ql_close(idle);
  ql_close(busy);
  td_layer_free(&l);
  ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

/* Waits until w's crossover is measured; returns it. */
static uint32_t measured_crossover(ql_client *c, const char *name) {
  ql_weight_info wi;
  for (int i = 0; i < 400; i++) {
    ck_assert_int_eq(resident(c, name, &wi), 0);
    if (wi.crossover_measured)
      return wi.crossover_rows;
    usleep(50 * 1000);
  }
  ck_abort_msg("the crossover of %s was not measured within 20 s", name);
  return 0;
}

/*
 * The crossover is measured after start and cached in the state directory:
 * a restart takes it from there (a value planted in the file proves it), a
 * bad file is measured again, and crossover_rows in the config fixes it.
 */
START_TEST(crossover_measured_and_cached) {
  char st[256], path[512], text[4096];
  td d;
  td_layer l;
  state_dir(st, sizeof st);
  snprintf(path, sizeof path, "%s/crossover.json", st);
  const char *args[] = {"--state-dir", st, "--crossover-rows", "0", NULL};
  td_layer_make(&l, 64, 128, 13, 1);
  td_start(&d, args);
  ql_client *a = td_connect_admin(&d);
  ck_assert_int_eq(load(a, "cx", &l, QL_FORMAT_Q8C, 0, 1, NULL), 0);
  uint32_t rows = measured_crossover(a, "cx");
  ck_assert(rows == QL_CROSSOVER_NEVER_ROWS || (rows >= 1 && rows <= 512));
  ql_close(a);
  ck_assert_int_eq(td_stop(&d), 0);
  FILE *f = fopen(path, "r");
  ck_assert_ptr_nonnull(f);
  size_t n = fread(text, 1, sizeof text - 1, f);
  fclose(f);
  text[n] = '\0';
  /* {"crossover": {"<key>": {..., "rows": R, ...}}, "version": 2}: plant
   * 7. */
  char *colon = strstr(text, "\"rows\": ");
  ck_assert_ptr_nonnull(colon);
  char *end = colon + 8;
  while (*end >= '0' && *end <= '9')
    end++;
  char planted[4200];
  snprintf(planted, sizeof planted, "%.*s\"rows\": 7%s", (int)(colon - text),
           text, end);
  write_text(path, planted);

  td_start(&d, args);
  ql_client *u = td_connect(&d);
  ql_weight_info wi;
  ck_assert_int_eq(resident(u, "cx", &wi), 0);
  ck_assert_int_eq(wi.crossover_measured, 1);
  ck_assert_uint_eq(wi.crossover_rows, 7);
  ql_close(u);
  ck_assert_int_eq(td_stop(&d), 0);

  /* A bad cache is only a cache: measured again, and rewritten. */
  write_text(path, "{not json");
  td_start(&d, args);
  u = td_connect(&d);
  rows = measured_crossover(u, "cx");
  ck_assert_uint_ne(rows, 7);
  ql_close(u);
  ck_assert_int_eq(td_stop(&d), 0);
  f = fopen(path, "r");
  ck_assert_ptr_nonnull(f);
  n = fread(text, 1, sizeof text - 1, f);
  fclose(f);
  text[n] = '\0';
  ck_assert_ptr_nonnull(strstr(text, "\"version\": 2"));
  /* With the times it was chosen from. */
  ck_assert_ptr_nonnull(strstr(text, "\"aq_ns\": ["));
  ck_assert_ptr_nonnull(strstr(text, "\"wo_ns\": ["));

  /* Fixed in the config: that value, not measured. */
  const char *fixed[] = {"--state-dir", st, "--crossover-rows", "5", NULL};
  td_start(&d, fixed);
  u = td_connect(&d);
  ck_assert_int_eq(resident(u, "cx", &wi), 0);
  ck_assert_int_eq(wi.crossover_measured, 0);
  ck_assert_uint_eq(wi.crossover_rows, 5);
  ql_close(u);
  ck_assert_int_eq(td_stop(&d), 0);
  td_layer_free(&l);
  rm_state(st);
}
END_TEST

/*
 * Answers do not change under a client while a new weight's crossover is
 * measured: AUTO requests of 1, 4, 8 and 12 rows sent from the moment it
 * is loaded, while its shape is measured and after, get the same path,
 * kernel and bytes for the same rows. They wait for the measurement
 * instead of being answered by the default crossover and, moments later,
 * by the measured one; the one they are answered by is the measured one.
 */
START_TEST(answers_time_invariant) {
  enum { N = 2048, K = 2048, ROUNDS_AFTER = 3 };
  static const uint64_t ms[] = {1, 4, 8, 12};
  const char *args[] = {"--crossover-rows", "0", NULL};
  td d;
  td_layer l;
  uint64_t seed = 5;
  td_layer_make(&l, N, K, 21, 1);
  float *x = tu_xmalloc(12 * K * sizeof(float));
  float *y = tu_xmalloc(12 * N * sizeof(float));
  float *first[4];
  ql_linear_result res, first_res[4];
  td_randn(&seed, x, 12 * K, 1.0f);
  td_start(&d, args);
  ql_client *c = td_connect(&d);
  ck_assert_int_eq(load(c, "tinv", &l, QL_FORMAT_Q8C, 0, 0, NULL), 0);
  int after = -1, rounds = 0;
  while (after < ROUNDS_AFTER) {
    for (int i = 0; i < 4; i++) {
      int rc = ql_linear(c, "tinv", QL_PATH_AUTO, QL_DTYPE_F32, ms[i], K, x,
                         N, y, &res);
      ck_assert_msg(rc == 0, "linear: %s", ql_errmsg());
      if (rounds == 0) {
        first[i] = tu_xmalloc(ms[i] * N * sizeof(float));
        memcpy(first[i], y, ms[i] * N * sizeof(float));
        first_res[i] = res;
        continue;
      }
      ck_assert_msg(res.path == first_res[i].path &&
                        strcmp(res.impl, first_res[i].impl) == 0,
                    "round %d, %llu rows: %s path %d, first %s path %d",
                    rounds, (unsigned long long)ms[i], res.impl, res.path,
                    first_res[i].impl, first_res[i].path);
      ck_assert_msg(memcmp(y, first[i], ms[i] * N * sizeof(float)) == 0,
                    "round %d, %llu rows: other bytes than the first reply",
                    rounds, (unsigned long long)ms[i]);
    }
    rounds++;
    ql_weight_info wi;
    ck_assert_int_eq(resident(c, "tinv", &wi), 0);
    if (after >= 0 || wi.crossover_measured)
      after++;
    ck_assert_msg(rounds < 2000, "the crossover was never measured");
  }
  /* The path each size took is the measured crossover's. */
  ql_weight_info wi;
  ck_assert_int_eq(resident(c, "tinv", &wi), 0);
  ck_assert_int_eq(wi.crossover_measured, 1);
  for (int i = 0; i < 4; i++) {
    ql_path want = ms[i] < wi.crossover_rows ? QL_PATH_WEIGHT_ONLY
                                             : QL_PATH_ACT_QUANT;
    ck_assert_msg(first_res[i].path == want,
                  "%llu rows ran path %d, the measured crossover (%u) "
                  "says %d", (unsigned long long)ms[i], first_res[i].path,
                  wi.crossover_rows, want);
    free(first[i]);
  }
  fprintf(stderr, "answers_time_invariant: %d rounds, crossover %u\n",
          rounds, wi.crossover_rows);
  ql_close(c);
  ck_assert_int_eq(td_stop(&d), 0);
  free(x);
  free(y);
  td_layer_free(&l);
}
END_TEST

/* cpu_level = c runs the plain C kernels. */
START_TEST(cpu_level_option) {
  td d;
  td_layer l;
  const char *args[] = {"--cpu-level", "c", NULL};
  td_start(&d, args);
  td_layer_make(&l, 32, 64, 14, 1);
  ql_client *u = td_connect(&d);
  ck_assert_int_eq(load(u, "lv", &l, QL_FORMAT_Q8C, 0, 0, NULL), 0);
  float x[64], y[32];
  memset(x, 0, sizeof x);
  x[3] = 1.0f;
  ql_linear_result res;
  ck_assert_int_eq(ql_linear(u, "lv", QL_PATH_WEIGHT_ONLY, QL_DTYPE_F32, 1, 64,
                             x, 32, y, &res),
                   0);
  ck_assert_msg(strncmp(res.impl, "cpu.c.", 6) == 0, "impl %s", res.impl);
  ql_close(u);
  td_layer_free(&l);
  ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

/*
 * A state directory written by the daemon before the quantizer's rules
 * changed (version 1: q8c and f8r of a bf16 weight kept bf16 scales;
 * tests/data/store_q1, made with `qlinearctl --admin load --bf16
 * --persistent` at that version) loads unchanged: every weight under its
 * name, digest and scale dtype. A load of the same bf16 weight by today's
 * rules (f32 scales, TorchAO's bytes) is another weight, so it is refused
 * under the old name instead of being taken for the stored one; q4g, whose
 * bytes did not change, is shared. Both q8c weights hold the same values,
 * so they compute the same y.
 */
START_TEST(store_from_quantizer_v1) {
  static const struct {
    const char *name, *digest16;
    ql_format f;
    uint32_t gs;
    int scale_dtype, same_now;
  } old[] = {
      {"old/q8c", "04d680ba58427b7d", QL_FORMAT_Q8C, 0, QL_DTYPE_BF16, 0},
      {"old/f8r", "b58b57f702d7497f", QL_FORMAT_F8R, 0, QL_DTYPE_BF16, 0},
      {"old/q4g32", "770b49e6f54393f9", QL_FORMAT_Q4G, 32, QL_DTYPE_BF16, 1},
      {"old/q8c_f32", "009cba490fb64f91", QL_FORMAT_Q8C, 0, QL_DTYPE_F32, 0},
  };
  const char *data = getenv("QL_TEST_DATA");
  char st[256], src[700], dst[700], err[200], hex[17];
  ck_assert_ptr_nonnull(data);
  state_dir(st, sizeof st);
  ck_assert_int_eq(mkdir(st, 0700), 0);
  snprintf(src, sizeof src, "%s/store_q1", data);
  DIR *dd = opendir(src);
  struct dirent *e;
  int copied = 0;
  ck_assert_msg(dd != NULL, "no %s", src);
  while ((e = readdir(dd)) != NULL) {
    if (strstr(e->d_name, ".safetensors") == NULL)
      continue;
    snprintf(src, sizeof src, "%s/store_q1/%s", data, e->d_name);
    snprintf(dst, sizeof dst, "%s/%s", st, e->d_name);
    copy_file(src, dst);
    copied++;
  }
  closedir(dd);
  ck_assert_int_eq(copied, 4);

  ql__npy w;
  snprintf(src, sizeof src, "%s/store_q1/w_bf16.npy", data);
  ck_assert_msg(ql__npy_load(src, &w, err, sizeof err) == 0, "%s", err);
  ck_assert(w.type == QL__NPY_U16 && w.shape[0] == 8 && w.shape[1] == 64);

  const char *args[] = {"--state-dir", st, NULL};
  td d;
  td_start(&d, args);
  ql_client *u = td_connect(&d);
  for (size_t i = 0; i < sizeof old / sizeof old[0]; i++) {
    ql_weight_info wi, now;
    ql_load_desc ld;
    char name[64];
    int shared = -1, rc;
    ck_assert_int_eq(resident(u, old[i].name, &wi), 0);
    for (int b = 0; b < 8; b++)
      snprintf(hex + 2 * b, 3, "%02x", wi.digest[b]);
    ck_assert_str_eq(hex, old[i].digest16);
    ck_assert_int_eq(wi.scale_dtype, old[i].scale_dtype);
    ck_assert_int_eq(wi.persistent, 1);
    if (old[i].scale_dtype == QL_DTYPE_F32)
      continue; /* an f32 weight's bytes did not change */

    memset(&ld, 0, sizeof ld);
    ld.name = old[i].name;
    ld.format = old[i].f;
    ld.group_size = old[i].gs;
    ld.n = 8;
    ld.k = 64;
    ld.dtype = QL_DTYPE_BF16;
    ld.data = w.data;
    rc = ql_load_float(u, &ld, &now, &shared);
    if (old[i].same_now) {
      ck_assert_int_eq(rc, 0);
      ck_assert_int_eq(shared, 1);
      continue;
    }
    ck_assert_msg(rc == QL_EEXIST, "%s: %s", old[i].name, ql_strerror(rc));
    snprintf(name, sizeof name, "new/%s", old[i].name + 4);
    ld.name = name;
    ck_assert_int_eq(ql_load_float(u, &ld, &now, &shared), 0);
    ck_assert_int_eq(shared, 0);
    ck_assert_int_eq(now.scale_dtype, QL_DTYPE_F32);
    ck_assert(memcmp(now.digest, wi.digest, QL_DIGEST_BYTES) != 0);

    float x[3 * 64], ya[3 * 8], yb[3 * 8];
    for (int j = 0; j < 3 * 64; j++)
      x[j] = (float)((j * 37) % 19) / 8.0f - 1.0f;
    ck_assert_int_eq(ql_linear(u, old[i].name, QL_PATH_WEIGHT_ONLY,
                               QL_DTYPE_F32, 3, 64, x, 8, ya, NULL),
                     0);
    ck_assert_int_eq(ql_linear(u, name, QL_PATH_WEIGHT_ONLY, QL_DTYPE_F32, 3,
                               64, x, 8, yb, NULL),
                     0);
    ck_assert_msg(memcmp(ya, yb, sizeof ya) == 0, "%s: y differs", name);
  }
  ql_close(u);
  ql__npy_free(&w);
  ck_assert_int_eq(td_stop(&d), 0);
  rm_state(st);
}
END_TEST

/* A required device that is not there stops the start with a message; the
 * daemon never reports ready without it. */
START_TEST(required_device_missing) {
  const char *bin = getenv("QLINEARD");
  char dir[] = "/tmp/ql-req-XXXXXX", log[300], buf[4096];
  ck_assert_ptr_nonnull(bin);
  ck_assert_ptr_nonnull(mkdtemp(dir));
  snprintf(log, sizeof log, "%s.log", dir);
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd >= 0)
      dup2(fd, 2);
    execl(bin, bin, "--socket-dir", dir, "--required-devices", "cpu,cuda:0",
          (char *)NULL);
    _exit(127);
  }
  int st = 0;
  ck_assert_int_eq(waitpid(pid, &st, 0), pid);
  ck_assert(WIFEXITED(st));
  ck_assert_int_ne(WEXITSTATUS(st), 0);
  FILE *f = fopen(log, "r");
  ck_assert_ptr_nonnull(f);
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  buf[n] = '\0';
  fclose(f);
  ck_assert_msg(strstr(buf, "cuda:0") != NULL, "log: %s", buf);
  char sock[400];
  snprintf(sock, sizeof sock, "%s/qlineard.sock", dir);
  ck_assert_int_ne(access(sock, F_OK), 0);
  unlink(log);
  rmdir(dir);
}
END_TEST

/*
 * A reload is all or nothing, and says when it changed nothing: a file
 * that does not parse is an error reply (it was a success whose report
 * alone told). A reload that stops fixing the crossover (crossover_rows
 * back to 0) has the weights already resident measured too.
 */
START_TEST(reload_errors_and_crossover) {
  char cfgdir[] = "/tmp/ql-cfg-XXXXXX", cfg[300], report[1024];
  td d;
  td_layer l;
  config_file(cfgdir, cfg, sizeof cfg, "[qlineard]\ncrossover_rows = 64\n");
  const char *args[] = {"--config", cfg, NULL};
  td_fix_crossover = 0; /* the file's crossover_rows counts */
  td_start(&d, args);
  td_layer_make(&l, 64, 128, 14, 1);
  ql_client *u = td_connect(&d), *a = td_connect_admin(&d);
  ck_assert_int_eq(load(u, "cx", &l, QL_FORMAT_Q8C, 0, 0, NULL), 0);
  ql_weight_info wi;
  usleep(200 * 1000);
  ck_assert_int_eq(resident(u, "cx", &wi), 0);
  ck_assert_int_eq(wi.crossover_measured, 0);

  write_text(cfg, "[qlineard]\ncrossover_rows = 0\nmax_queue = many\n");
  ck_assert_int_eq(ql_reload_config(a, report, sizeof report), QL_EINVAL);
  ck_assert_msg(strstr(ql_errmsg(), "max_queue") != NULL &&
                    strstr(ql_errmsg(), "keeping the running") != NULL,
                "message: %s", ql_errmsg());
  usleep(200 * 1000);
  ck_assert_int_eq(resident(u, "cx", &wi), 0);
  ck_assert_int_eq(wi.crossover_measured, 0); /* nothing applied */

  write_text(cfg, "[qlineard]\ncrossover_rows = 0\n");
  ck_assert_int_eq(ql_reload_config(a, report, sizeof report), 0);
  ck_assert_msg(strstr(report, "crossover_rows") != NULL, "report: %s",
                report);
  uint32_t rows = measured_crossover(u, "cx");
  ck_assert(rows == QL_CROSSOVER_NEVER_ROWS || (rows >= 1 && rows <= 512));
  ql_close(u);
  ql_close(a);
  ck_assert_int_eq(td_stop(&d), 0);
  unlink(cfg);
  rmdir(cfgdir);
  td_layer_free(&l);
}
END_TEST

/* The daemon td_start() is starting, for hup_soon(). */
static td *_Atomic starting;

/* Sends SIGHUP to the daemon being started, 300 ms after it exists. */
static void *hup_soon(void *arg) {
  (void)arg;
  td *d;
  while ((d = atomic_load(&starting)) == NULL || d->pid == 0)
    usleep(1000);
  usleep(300 * 1000);
  kill(d->pid, SIGHUP);
  return NULL;
}

/* A SIGHUP during the start (before the loop's handler is in place, here
 * held open by QL_TEST_START_DELAY_MS) does not end the daemon, whose
 * default action it is: it waits, blocked, and reloads once the loop
 * runs. */
START_TEST(hup_during_start) {
  td d;
  memset(&d, 0, sizeof d);
  pthread_t t;
  ck_assert_int_eq(pthread_create(&t, NULL, hup_soon, NULL), 0);
  atomic_store(&starting, &d);
  setenv("QL_TEST_START_DELAY_MS", "1500", 1);
  td_start(&d, NULL);
  unsetenv("QL_TEST_START_DELAY_MS");
  ck_assert_int_eq(pthread_join(t, NULL), 0);
  ql_client *u = td_connect(&d);
  ql_hello_info h;
  ck_assert_int_eq(ql_hello(u, &h), 0);
  char text[65536];
  int found = 0;
  for (int i = 0; i < 100 && !found; i++) { /* the reload's log line */
    FILE *f = fopen(d.log, "r");
    ck_assert_ptr_nonnull(f);
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    found = strstr(text, "reload: ") != NULL;
    if (!found)
      usleep(20 * 1000);
  }
  ck_assert_msg(found, "no reload in the log");
  ql_close(u);
  ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

int main(void) {
  Suite *s = suite_create("admin");
  TCase *tc = tcase_create("admin");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, admin_ops_refused_on_user_socket);
  tcase_add_test(tc, admin_without_state_dir);
  tcase_add_test(tc, persistent_survives_kill9);
  tcase_add_test(tc, corrupt_store_file);
  tcase_add_test(tc, budget_overflow);
  tcase_add_test(tc, reload_lowers_queued_bytes);
  tcase_add_test(tc, budget_counts_unloaded_held);
  tcase_add_test(tc, unload_of_stored_not_resident);
  tcase_add_test(tc, reload_errors_and_crossover);
  tcase_add_test(tc, hup_during_start);
  tcase_add_test(tc, admin_unload_of_held_weight);
  tcase_add_test(tc, required_device_missing);
  tcase_add_test(tc, store_from_quantizer_v1);
  tcase_add_test(tc, session_lease);
  tcase_add_test(tc, crossover_measured_and_cached);
  tcase_add_test(tc, answers_time_invariant);
  tcase_add_test(tc, cpu_level_option);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? 0 : 1;
}
