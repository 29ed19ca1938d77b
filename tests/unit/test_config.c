/*
 * test_config.c - unit tests for daemon/conf.c: the table of options, the
 * parser of each value type, the INI reader (line numbers in errors,
 * sections, comments, quotes, CRLF, NUL bytes, long lines), the command
 * line and its precedence over the file, the SIGHUP reload, the writers,
 * and the example config in deploy/, which must show every option with its
 * default.
 *
 * Failed parses are checked against the whole message where the wording is
 * part of the interface (the "file:line: key: reason" shape), and against
 * a fragment elsewhere; every failure must also leave the config as it was.
 */
#include <arpa/inet.h>
#include <check.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "conf.h"
#include "net/listen.h"
#include "log.h"
#include "dispatch/xover.h"
#include "testutil.h"

#ifndef QL_EXAMPLE_CONF
#define QL_EXAMPLE_CONF "deploy/qlineard.conf.example"
#endif

/* ------------------------------------------------------------- helpers */

/* Two configs hold the same options (compared as text: bytes after a
 * string's NUL do not matter). */
static int cfg_equal(const ql__config *a, const ql__config *b) {
  static char x[PATH_MAX + 64], y[PATH_MAX + 64];
  size_t n;
  const ql__option *t = ql__config_options(&n);
  for (size_t i = 0; i < n; i++) {
    ql__option_format(&t[i], a, x, sizeof x);
    ql__option_format(&t[i], b, y, sizeof y);
    if (strcmp(x, y) != 0)
      return 0;
  }
  return 1;
}

static int same_option(const ql__option *o, const ql__config *a,
                       const ql__config *b) {
  static char x[PATH_MAX + 64], y[PATH_MAX + 64];
  ql__option_format(o, a, x, sizeof x);
  ql__option_format(o, b, y, sizeof y);
  return strcmp(x, y) == 0;
}

static const ql__option *opt(const char *name) {
  const ql__option *o = ql__config_find(name);
  ck_assert_msg(o != NULL, "no option %s", name);
  return o;
}

/* Sets key = value on cfg; must succeed. */
static void set_ok(ql__config *cfg, const char *key, const char *value) {
  char err[512] = "";
  int rc = ql__config_set(cfg, key, value, err, sizeof err);
  ck_assert_msg(rc == 0, "%s = '%s': %s", key, value, err);
}

/* key = value must fail on the defaults with a message containing want,
 * and leave the config as it was. */
static void set_fails(const char *key, const char *value, const char *want) {
  ql__config cfg, before;
  char err[512] = "";
  ql__config_init_defaults(&cfg);
  memcpy(&before, &cfg, sizeof cfg);
  int rc = ql__config_set(&cfg, key, value, err, sizeof err);
  ck_assert_msg(rc == QL_EINVAL, "%s = '%s' accepted", key, value);
  ck_assert_msg(strstr(err, want) != NULL, "%s = '%s': '%s' lacks '%s'", key,
                value, err, want);
  ck_assert(memcmp(&cfg, &before, sizeof cfg) == 0);
}

/* The text of value as option key formats it after parsing. */
static const char *roundtrip(const char *key, const char *value) {
  static char buf[PATH_MAX + 64];
  ql__config cfg;
  ql__config_init_defaults(&cfg);
  set_ok(&cfg, key, value);
  ql__option_format(opt(key), &cfg, buf, sizeof buf);
  return buf;
}

static int parse_text(const char *text, size_t len, ql__config *cfg,
                      char *err, size_t errlen) {
  return ql__config_parse_buffer("t.conf", text, len, cfg, err, errlen);
}

/* text must parse on the defaults; returns the result. */
static ql__config parse_ok(const char *text) {
  ql__config cfg;
  char err[512] = "";
  ql__config_init_defaults(&cfg);
  int rc = parse_text(text, strlen(text), &cfg, err, sizeof err);
  ck_assert_msg(rc == 0, "'%s': %s", text, err);
  return cfg;
}

/* len bytes of text must fail with exactly the message want, config
 * untouched. */
static void parse_fails_len(const char *text, size_t len, const char *want) {
  ql__config cfg, before;
  char err[512] = "";
  ql__config_init_defaults(&cfg);
  memcpy(&before, &cfg, sizeof cfg);
  int rc = parse_text(text, len, &cfg, err, sizeof err);
  ck_assert_msg(rc == QL_EINVAL, "accepted: '%s'", text);
  ck_assert_msg(strcmp(err, want) == 0, "got '%s', want '%s'", err, want);
  ck_assert(memcmp(&cfg, &before, sizeof cfg) == 0);
}

static void parse_fails(const char *text, const char *want) {
  parse_fails_len(text, strlen(text), want);
}

/* A file in a fresh temporary directory; the caller frees the path. */
static char *write_temp(const char *name, const char *text, size_t len) {
  char dir[] = "/tmp/test_config.XXXXXX";
  ck_assert_ptr_nonnull(mkdtemp(dir));
  /* Room for the tests to put another name in place of name. */
  char *path = tu_xmalloc(strlen(dir) + strlen(name) + 32);
  sprintf(path, "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  ck_assert_ptr_nonnull(f);
  ck_assert_uint_eq(fwrite(text, 1, len, f), len);
  ck_assert_int_eq(fclose(f), 0);
  return path;
}

static void remove_temp(char *path) {
  unlink(path);
  *strrchr(path, '/') = '\0';
  rmdir(path);
  free(path);
}

/* ql__config_from_args on a NULL-terminated list of arguments. */
static int from_args(const char *const *args, ql__config *cfg,
                     ql__cmdline *cl, char *err, size_t errlen) {
  char *argv[64];
  int argc = 0;
  argv[argc++] = "qlineard";
  for (; *args != NULL; args++)
    argv[argc++] = (char *)*args;
  argv[argc] = NULL;
  return ql__config_from_args(argc, argv, cfg, cl, err, errlen);
}

/* --------------------------------------------------------------- table */

START_TEST(test_table_invariants) {
  size_t n;
  const ql__option *t = ql__config_options(&n);
  static const char *reserved[] = {"config", "set", "help", "version",
                                   "print_config", "h"};
  ck_assert_uint_ge(n, 15);
  for (size_t i = 0; i < n; i++) {
    const ql__option *o = &t[i];
    ck_assert_msg(strspn(o->name, "abcdefghijklmnopqrstuvwxyz0123456789_") ==
                      strlen(o->name) && o->name[0] != '\0',
                  "name '%s'", o->name);
    ck_assert_msg(strlen(o->name) < 48, "%s: name too long", o->name);
    for (size_t r = 0; r < sizeof reserved / sizeof reserved[0]; r++)
      ck_assert_str_ne(o->name, reserved[r]);
    for (size_t j = 0; j < i; j++) {
      ck_assert_str_ne(o->name, t[j].name);
      /* No two options share bytes of ql__config. */
      ck_assert_msg(o->offset + o->size <= t[j].offset ||
                        t[j].offset + t[j].size <= o->offset,
                    "%s overlaps %s", o->name, t[j].name);
    }
    ck_assert_ptr_eq(ql__config_find(o->name), o);
    ck_assert_uint_le(o->offset + o->size, sizeof(ql__config));
    ck_assert_msg(o->help != NULL && o->help[0] != '\0', "%s: help", o->name);
    ck_assert_msg((o->def != NULL) != (o->def_fn != NULL), "%s: default",
                  o->name);
    switch (o->type) {
    case QL_OPT_UINT:
    case QL_OPT_SIZE:
    case QL_OPT_DURATION:
      ck_assert_msg(o->size == 4 || o->size == 8, "%s: size", o->name);
      ck_assert_uint_le(o->min, o->max);
      if (o->size == 4)
        ck_assert_uint_le(o->max, UINT32_MAX);
      break;
    case QL_OPT_PATH:
    case QL_OPT_ADDRESS:
      ck_assert_uint_lt(o->max, o->size);
      break;
    case QL_OPT_ENUM:
      ck_assert_ptr_nonnull(o->names);
      ck_assert_uint_eq(o->size, sizeof(int));
      break;
    case QL_OPT_LIST:
      ck_assert_uint_eq(o->size, sizeof(ql__config_list));
      ck_assert_uint_le(o->max, QL_CONFIG_LIST_MAX);
      break;
    case QL_OPT_BOOL:
      ck_assert_uint_eq(o->size, sizeof(bool));
      break;
    case QL_OPT_PERCENT:
      ck_assert_uint_eq(o->size, sizeof(uint32_t));
      ck_assert_uint_le(o->min, o->max);
      break;
    default:
      ck_abort_msg("%s: type %d", o->name, (int)o->type);
    }
  }
  /* Every field of ql__config has an option: the fields known today. */
  static const char *fields[] = {
      "socket_dir", "max_message_bytes", "max_chunk_bytes", "max_upload_bytes",
      "upload_idle_ms", "max_queue", "max_queued_bytes", "max_pinned_bytes",
      "drain_ms", "crossover_rows", "log_level", "state_dir", "admin_dir", "cpu_threads",
      "cpu_budget_bytes", "required_devices", "session_lease_ms",
      "max_batch_rows", "prefill_chunk_rows", "prefill_chunk_us",
      "max_queue_delay_us", "decode_hold_us",
      "session_max_requests", "crossover_default_rows", "decode_max_rows",
      "cpu_level", "kernel_timeout_ms", "accel_budget_percent",
      "device_budget_bytes", "batches_in_flight", "max_connections",
      "max_connections_per_uid", "max_sessions_per_uid", "frame_timeout_ms",
      "max_buffered_bytes", "ring_spin_us", "mapped_mode", "metrics_listen",
      "metrics_weights", "uid_share"};
  ck_assert_uint_eq(n, sizeof fields / sizeof fields[0]);
  for (size_t i = 0; i < n; i++)
    ck_assert_ptr_nonnull(ql__config_find(fields[i]));
}
END_TEST

/* Each default parses, and is written the way the formatter writes it (so
 * --print-config and the example config show the table's own text). */
START_TEST(test_defaults_canonical) {
  size_t n;
  const ql__option *t = ql__config_options(&n);
  for (size_t i = 0; i < n; i++) {
    if (t[i].def == NULL)
      continue;
    ck_assert_msg(strcmp(roundtrip(t[i].name, t[i].def), t[i].def) == 0,
                  "%s: default '%s' formats as '%s'", t[i].name, t[i].def,
                  roundtrip(t[i].name, t[i].def));
  }
}
END_TEST

/* The defaults are those the daemon always had (server.c). */
START_TEST(test_defaults_values) {
  ql__config c;
  ql__config_init_defaults(&c);
  ck_assert_uint_eq(c.max_message_bytes, 64u << 20);
  ck_assert_uint_eq(c.max_chunk_bytes, 4u << 20);
  ck_assert_uint_eq(c.max_upload_bytes, (size_t)4 << 30);
  ck_assert_uint_eq(c.upload_idle_ms, 120000);
  ck_assert_uint_eq(c.max_queue, 1024);
  ck_assert_uint_eq(c.max_queued_bytes, (size_t)1 << 30);
  ck_assert_uint_eq(c.drain_ms, 30000);
  ck_assert_uint_eq(c.crossover_rows, 0);
  ck_assert_uint_eq(c.crossover_default_rows, 16);
  ck_assert_int_eq(c.log_level, QL_LOG_INFO);
  ck_assert_str_eq(c.state_dir, "");
  ck_assert_str_eq(c.admin_dir, "");
  ck_assert_uint_eq(c.cpu_threads, 0);
  ck_assert_uint_eq(c.cpu_budget_bytes, 0);
  ck_assert_uint_eq(c.required_devices.n, 0);
  ck_assert_uint_eq(c.batches_in_flight, 2);
}
END_TEST

START_TEST(test_default_socket_dir) {
  ql__config c;
  char want[64], longdir[PATH_MAX];
  const char *saved = getenv("XDG_RUNTIME_DIR");
  char *keep = saved != NULL ? strdup(saved) : NULL;

  snprintf(want, sizeof want, "/tmp/qlinear-%u", (unsigned)getuid());
  setenv("XDG_RUNTIME_DIR", "/run/user/1234", 1);
  ql__config_init_defaults(&c);
  ck_assert_str_eq(c.socket_dir, "/run/user/1234/qlinear");
  /* Not absolute, empty, or no valid path: the /tmp rule. */
  setenv("XDG_RUNTIME_DIR", "run/user", 1);
  ql__config_init_defaults(&c);
  ck_assert_str_eq(c.socket_dir, want);
  setenv("XDG_RUNTIME_DIR", "", 1);
  ql__config_init_defaults(&c);
  ck_assert_str_eq(c.socket_dir, want);
  setenv("XDG_RUNTIME_DIR", "/run/\"x", 1);
  ql__config_init_defaults(&c);
  ck_assert_str_eq(c.socket_dir, want);
  memset(longdir, 'a', sizeof longdir - 1);
  longdir[0] = '/';
  longdir[sizeof longdir - 1] = '\0';
  setenv("XDG_RUNTIME_DIR", longdir, 1);
  ql__config_init_defaults(&c);
  ck_assert_str_eq(c.socket_dir, want);
  unsetenv("XDG_RUNTIME_DIR");
  ql__config_init_defaults(&c);
  ck_assert_str_eq(c.socket_dir, want);
  if (keep != NULL)
    setenv("XDG_RUNTIME_DIR", keep, 1);
  free(keep);
}
END_TEST

START_TEST(test_find) {
  ck_assert_ptr_eq(ql__config_find("max_queue"), ql__config_find("max-queue"));
  ck_assert_ptr_nonnull(ql__config_find("max-queue"));
  ck_assert_ptr_null(ql__config_find("max_queu"));
  ck_assert_ptr_null(ql__config_find("max_queue_"));
  ck_assert_ptr_null(ql__config_find("MAX_QUEUE"));
  ck_assert_ptr_null(ql__config_find(""));
  ck_assert_ptr_null(ql__config_find(NULL));
}
END_TEST

/* --------------------------------------------------------------- types */

START_TEST(test_uint) {
  ql__config c;
  ql__config_init_defaults(&c);
  set_ok(&c, "max_queue", "5");
  ck_assert_uint_eq(c.max_queue, 5);
  set_ok(&c, "max_queue", "1");
  set_ok(&c, "max_queue", "1048576");
  ck_assert_uint_eq(c.max_queue, 1048576);
  set_ok(&c, "max_queue", "007");
  ck_assert_uint_eq(c.max_queue, 7);
  set_ok(&c, "crossover_rows", "0");
  set_ok(&c, "crossover_rows", "1073741824");
  ck_assert_uint_eq(c.crossover_rows, 1u << 30);
  set_ok(&c, "cpu_threads", "1024");
  ck_assert_uint_eq(c.cpu_threads, 1024);

  set_fails("max_queue", "0", "max_queue: 0 is not in [1, 1048576]");
  set_fails("max_queue", "1048577", "1048577 is not in [1, 1048576]");
  set_fails("max_queue", "-1", "-1 is not in [1, 1048576]");
  set_fails("max_queue", "-0", "is not in");
  set_fails("max_queue", "99999999999999999999", "is not in [1, 1048576]");
  set_fails("max_queue", "18446744073709551616", "is not in");
  set_fails("max_queue", "18446744073709551615", "is not in");
  set_fails("max_queue", "", "empty value");
  set_fails("max_queue", "abc", "'abc' is not an integer");
  set_fails("max_queue", "5x", "'5x' is not an integer");
  set_fails("max_queue", "5K", "is not an integer"); /* no suffixes */
  set_fails("max_queue", " 5", "is not an integer");
  set_fails("max_queue", "5 ", "is not an integer");
  set_fails("max_queue", "+5", "is not an integer");
  set_fails("max_queue", "0x10", "is not an integer");
  set_fails("max_queue", "1e3", "is not an integer");
  set_fails("max_queue", "-", "is not an integer");
  set_fails("cpu_threads", "1025", "not in [0, 1024]");
  set_ok(&c, "batches_in_flight", "3");
  ck_assert_uint_eq(c.batches_in_flight, 3);
  set_fails("batches_in_flight", "0", "not in [1, 3]");
  set_fails("batches_in_flight", "4", "not in [1, 3]");
  set_fails("crossover_rows", "4294967296", "not in [0, 1073741824]");
}
END_TEST

START_TEST(test_size) {
  ql__config c;
  ql__config_init_defaults(&c);
  set_ok(&c, "max_message_bytes", "64M");
  ck_assert_uint_eq(c.max_message_bytes, 64u << 20);
  set_ok(&c, "max_message_bytes", "32MiB");
  ck_assert_uint_eq(c.max_message_bytes, 32u << 20);
  set_ok(&c, "max_message_bytes", "16m");
  ck_assert_uint_eq(c.max_message_bytes, 16u << 20);
  set_ok(&c, "max_message_bytes", "8k");
  ck_assert_uint_eq(c.max_message_bytes, 8192);
  set_ok(&c, "max_message_bytes", "8192");
  set_ok(&c, "max_message_bytes", "1G");
  ck_assert_uint_eq(c.max_message_bytes, 1u << 30);
  set_ok(&c, "max_message_bytes", "1gib");
  set_ok(&c, "max_upload_bytes", "16T");
  ck_assert_uint_eq(c.max_upload_bytes, (uint64_t)16 << 40);
  set_ok(&c, "max_upload_bytes", "1");
  set_ok(&c, "cpu_budget_bytes", "0");
  set_ok(&c, "cpu_budget_bytes", "256TiB");
  ck_assert_uint_eq(c.cpu_budget_bytes, (uint64_t)1 << 48);

  set_fails("max_message_bytes", "8191",
            "max_message_bytes: 8191 is not in [8K, 1G]");
  set_fails("max_message_bytes", "1025M", "1025M is not in [8K, 1G]");
  set_fails("max_message_bytes", "99999999999999999999G",
            "99999999999999999999G is not in [8K, 1G]");
  set_fails("max_upload_bytes", "16777216T", "is not in [1, 16T]");
  set_fails("max_upload_bytes", "17T", "is not in [1, 16T]");
  set_fails("max_upload_bytes", "18446744073709551615T", "is not in");
  set_fails("max_upload_bytes", "0", "0 is not in [1, 16T]");
  set_fails("max_message_bytes", "-1K", "-1K is not in");
  set_fails("max_message_bytes", "64MB", "ambiguous: write M or MiB");
  set_fails("max_message_bytes", "64kb", "ambiguous");
  set_fails("max_message_bytes", "64 M", "is not a size");
  set_fails("max_message_bytes", "64Mi", "is not a size");
  set_fails("max_message_bytes", "64P", "is not a size");
  set_fails("max_message_bytes", "M", "is not a size");
  set_fails("max_message_bytes", "1.5G", "is not a size");
  set_fails("max_message_bytes", "", "empty value (expected a size");
  set_fails("max_message_bytes", "64MM", "is not a size");
}
END_TEST

START_TEST(test_duration) {
  ql__config c;
  ql__config_init_defaults(&c);
  set_ok(&c, "drain_ms", "0");
  ck_assert_uint_eq(c.drain_ms, 0);
  set_ok(&c, "drain_ms", "250");
  ck_assert_uint_eq(c.drain_ms, 250);
  set_ok(&c, "drain_ms", "250ms");
  ck_assert_uint_eq(c.drain_ms, 250);
  set_ok(&c, "drain_ms", "30s");
  ck_assert_uint_eq(c.drain_ms, 30000);
  set_ok(&c, "drain_ms", "2min");
  ck_assert_uint_eq(c.drain_ms, 120000);
  set_ok(&c, "drain_ms", "1h");
  ck_assert_uint_eq(c.drain_ms, 3600000);
  set_ok(&c, "drain_ms", "60MIN");
  set_ok(&c, "upload_idle_ms", "24h");
  ck_assert_uint_eq(c.upload_idle_ms, 86400000);

  set_fails("drain_ms", "61min", "drain_ms: 61min is not in [0, 1h]");
  set_fails("drain_ms", "3600001", "is not in [0, 1h]");
  set_fails("upload_idle_ms", "0", "0 is not in [1, 24h]");
  set_fails("upload_idle_ms", "0s", "0s is not in [1, 24h]");
  set_fails("drain_ms", "5m", "is not a duration");
  set_fails("drain_ms", "1.5s", "is not a duration");
  set_fails("drain_ms", "s", "is not a duration");
  set_fails("drain_ms", "-5s", "is not in");
  set_fails("drain_ms", "99999999999999999999h", "is not in");
  set_fails("drain_ms", "5124095576030432h", "is not in"); /* wraps */
  set_fails("drain_ms", "", "empty value");

  ck_assert_str_eq(roundtrip("drain_ms", "90000"), "90s");
  ck_assert_str_eq(roundtrip("drain_ms", "90001"), "90001");
  ck_assert_str_eq(roundtrip("drain_ms", "120s"), "2min");
  ck_assert_str_eq(roundtrip("drain_ms", "60min"), "1h");
  ck_assert_str_eq(roundtrip("drain_ms", "0ms"), "0");
  ck_assert_str_eq(roundtrip("max_message_bytes", "1048576"), "1M");
  ck_assert_str_eq(roundtrip("max_message_bytes", "1049600"), "1025K");
  ck_assert_str_eq(roundtrip("max_message_bytes", "8193"), "8193");
}
END_TEST

/* No option is a bool today; the type is tested on an option of a local
 * struct, through the same entry point. */
START_TEST(test_bool) {
  struct {
    int pad;
    bool flag;
  } s = {0, false};
  const ql__option o = {.name = "flag", .type = QL_OPT_BOOL,
                        .offset = offsetof(__typeof__(s), flag),
                        .size = sizeof(bool), .def = "no", .help = "x"};
  static const char *yes[] = {"yes", "true", "on", "1", "YES", "True"};
  static const char *no[] = {"no", "false", "off", "0", "No", "OFF"};
  static const char *bad[] = {"", "y", "2", "maybe", "yes ", "10", "-1"};
  char why[256], buf[16];
  for (size_t i = 0; i < sizeof yes / sizeof yes[0]; i++) {
    s.flag = false;
    ck_assert_int_eq(ql__option_parse(&o, yes[i], &s, why, sizeof why), 0);
    ck_assert(s.flag);
    ql__option_format(&o, &s, buf, sizeof buf);
    ck_assert_str_eq(buf, "yes");
  }
  for (size_t i = 0; i < sizeof no / sizeof no[0]; i++) {
    s.flag = true;
    ck_assert_int_eq(ql__option_parse(&o, no[i], &s, why, sizeof why), 0);
    ck_assert(!s.flag);
    ql__option_format(&o, &s, buf, sizeof buf);
    ck_assert_str_eq(buf, "no");
  }
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    s.flag = true;
    ck_assert_int_eq(ql__option_parse(&o, bad[i], &s, why, sizeof why),
                     QL_EINVAL);
    ck_assert(s.flag);
    ck_assert_msg(strstr(why, "is not yes/no") != NULL, "%s", why);
  }
  ck_assert_int_eq(s.pad, 0);
}
END_TEST

START_TEST(test_enum) {
  ql__config c;
  ql__config_init_defaults(&c);
  set_ok(&c, "log_level", "debug");
  ck_assert_int_eq(c.log_level, QL_LOG_DEBUG);
  set_ok(&c, "log_level", "ERR");
  ck_assert_int_eq(c.log_level, QL_LOG_ERR);
  set_ok(&c, "log_level", "warning");
  ck_assert_int_eq(c.log_level, QL_LOG_WARNING);
  set_ok(&c, "log_level", "notice");
  ck_assert_int_eq(c.log_level, QL_LOG_NOTICE);
  ck_assert_str_eq(roundtrip("log_level", "INFO"), "info");
  set_fails("log_level", "loud",
            "log_level: 'loud' is not one of err, warning, notice, info, "
            "debug");
  set_fails("log_level", "", "'' is not one of");
  set_fails("log_level", "6", "is not one of");
  set_fails("log_level", "info ", "is not one of");
}
END_TEST

START_TEST(test_path) {
  ql__config c;
  char longp[PATH_MAX + 16];
  const ql__option *sd = opt("state_dir");
  ql__config_init_defaults(&c);
  set_ok(&c, "socket_dir", "/run/qlinear");
  ck_assert_str_eq(c.socket_dir, "/run/qlinear");
  set_ok(&c, "state_dir", "/var/lib/qlinear");
  ck_assert_str_eq(c.state_dir, "/var/lib/qlinear");
  set_ok(&c, "state_dir", "");
  ck_assert_str_eq(c.state_dir, "");
  set_ok(&c, "admin_dir", "/run/qlinear/admin dir#1;x");
  ck_assert_str_eq(c.admin_dir, "/run/qlinear/admin dir#1;x");
  set_ok(&c, "state_dir", "/");

  set_fails("socket_dir", "", "socket_dir: empty value");
  set_fails("socket_dir", "run/qlinear",
            "'run/qlinear' is not an absolute path");
  set_fails("state_dir", "./x", "is not an absolute path");
  set_fails("state_dir", "~/x", "is not an absolute path");
  set_fails("state_dir", "/a\tb", "control character");
  set_fails("state_dir", "/a\nb", "control character");
  set_fails("state_dir", "/a\x7f", "control character");
  set_fails("state_dir", "/a\"b", "control character or '\"'");

  /* The longest accepted path, and one byte more. */
  memset(longp, 'p', sizeof longp);
  longp[0] = '/';
  longp[sd->max] = '\0';
  set_ok(&c, "state_dir", longp);
  ck_assert_uint_eq(strlen(c.state_dir), sd->max);
  longp[sd->max] = 'p';
  longp[sd->max + 1] = '\0';
  set_fails("state_dir", longp, "path longer than");
  longp[PATH_MAX + 15] = '\0';
  set_fails("socket_dir", longp, "path longer than");

  /* Echoes of long values are cut, and control characters hidden. */
  memset(longp, 'x', 200);
  longp[200] = '\0';
  char err[512];
  ck_assert_int_eq(ql__config_set(&c, "state_dir", longp, err, sizeof err),
                   QL_EINVAL);
  ck_assert_msg(strlen(err) < 120 && strstr(err, "...") != NULL, "%s", err);
  ck_assert_int_eq(ql__config_set(&c, "state_dir", "\x1b[31m", err,
                                  sizeof err), QL_EINVAL);
  ck_assert_msg(strchr(err, '\x1b') == NULL, "%s", err);
}
END_TEST

START_TEST(test_list) {
  ql__config c;
  char items[2048], err[512];
  ql__config_init_defaults(&c);
  set_ok(&c, "required_devices", "cpu,cuda:0");
  ck_assert_uint_eq(c.required_devices.n, 2);
  ck_assert_str_eq(c.required_devices.item[0], "cpu");
  ck_assert_str_eq(c.required_devices.item[1], "cuda:0");
  set_ok(&c, "required_devices",
         "  cpu ,\tcuda:GPU-8f3c0a1e-1b2c-4d5e  , ze:1 ");
  ck_assert_uint_eq(c.required_devices.n, 3);
  ck_assert_str_eq(c.required_devices.item[1], "cuda:GPU-8f3c0a1e-1b2c-4d5e");
  ck_assert_str_eq(c.required_devices.item[2], "ze:1");
  ck_assert_str_eq(roundtrip("required_devices", " cpu , ze:1"), "cpu,ze:1");
  set_ok(&c, "required_devices", "");
  ck_assert_uint_eq(c.required_devices.n, 0);
  set_ok(&c, "required_devices", "cpu");
  set_ok(&c, "required_devices", "   ");
  ck_assert_uint_eq(c.required_devices.n, 0);

  set_fails("required_devices", "cpu,,cuda:0", "empty item");
  set_fails("required_devices", "cpu,", "empty item");
  set_fails("required_devices", "cpu, ", "empty item");
  set_fails("required_devices", ",cpu", "empty item");
  set_fails("required_devices", ",", "empty item");
  set_fails("required_devices", "cpu,cpu", "'cpu' is listed twice");
  set_fails("required_devices", "CUDA:0", "'CUDA:0' is not a device name");
  set_fails("required_devices", "cuda:", "is not a device name");
  set_fails("required_devices", "cuda:0:1", "is not a device name");
  set_fails("required_devices", "cuda 0", "is not a device name");
  set_fails("required_devices", "0cuda", "is not a device name");
  set_fails("required_devices", "cpu;cuda:0", "is not a device name");
  set_fails("required_devices", "cpu\n", "is not a device name");

  /* At most QL_CONFIG_LIST_MAX items of at most QL_CONFIG_ITEM_MAX - 1
   * bytes. */
  items[0] = '\0';
  for (int i = 0; i < QL_CONFIG_LIST_MAX; i++)
    sprintf(items + strlen(items), "%scuda:%d", i ? "," : "", i);
  set_ok(&c, "required_devices", items);
  ck_assert_uint_eq(c.required_devices.n, QL_CONFIG_LIST_MAX);
  strcat(items, ",ze:0");
  set_fails("required_devices", items, "more than 16 items");
  memset(items, 'a', sizeof items);
  memcpy(items, "cuda:", 5);
  items[QL_CONFIG_ITEM_MAX - 1] = '\0';
  set_ok(&c, "required_devices", items);
  items[QL_CONFIG_ITEM_MAX - 1] = 'a';
  items[QL_CONFIG_ITEM_MAX] = '\0';
  set_fails("required_devices", items, "longer than 63 bytes");

  /* A bad list leaves the old one. */
  set_ok(&c, "required_devices", "cpu,ze:0");
  ck_assert_int_eq(ql__config_set(&c, "required_devices", "cuda:0,BAD", err,
                                  sizeof err), QL_EINVAL);
  ck_assert_uint_eq(c.required_devices.n, 2);
  ck_assert_str_eq(c.required_devices.item[1], "ze:0");
}
END_TEST

/* Percentages: up to two decimals, an optional '%', kept exactly in
 * hundredths and written back in the shortest form. */
START_TEST(test_percent) {
  ql__config c;
  ql__config_init_defaults(&c);
  ck_assert_uint_eq(c.accel_budget_percent, 8750);
  set_ok(&c, "accel_budget_percent", "50%");
  ck_assert_uint_eq(c.accel_budget_percent, 5000);
  set_ok(&c, "accel_budget_percent", "12.25");
  ck_assert_uint_eq(c.accel_budget_percent, 1225);
  set_ok(&c, "accel_budget_percent", "0.01");
  ck_assert_uint_eq(c.accel_budget_percent, 1);
  set_ok(&c, "accel_budget_percent", "100");
  ck_assert_uint_eq(c.accel_budget_percent, 10000);
  ck_assert_str_eq(roundtrip("accel_budget_percent", "87.50"), "87.5");
  ck_assert_str_eq(roundtrip("accel_budget_percent", "7.05%"), "7.05");
  ck_assert_str_eq(roundtrip("accel_budget_percent", "070"), "70");
  set_fails("accel_budget_percent", "0", "0 is not in [0.01, 100]");
  set_fails("accel_budget_percent", "0.00", "is not in [0.01, 100]");
  set_fails("accel_budget_percent", "100.01", "is not in [0.01, 100]");
  set_fails("accel_budget_percent", "99999999999999999999999",
            "is not in [0.01, 100]");
  set_fails("accel_budget_percent", "87.555", "at most two decimals");
  set_fails("accel_budget_percent", "-5", "is not a percentage");
  set_fails("accel_budget_percent", "", "is not a percentage");
  set_fails("accel_budget_percent", "5.", "is not a percentage");
  set_fails("accel_budget_percent", ".5", "is not a percentage");
  set_fails("accel_budget_percent", "5%%", "is not a percentage");
  set_fails("accel_budget_percent", "0x10", "is not a percentage");
}
END_TEST

/* device_budget_bytes: DEVICE=SIZE items, one per device name. */
START_TEST(test_device_budget) {
  ql__config c;
  char dev[64], why[256];
  uint64_t bytes = 0;
  ql__config_init_defaults(&c);
  ck_assert_uint_eq(c.device_budget_bytes.n, 0);
  set_ok(&c, "device_budget_bytes",
         "cuda:0=8G, cuda:GPU-8f3c0a1e-1b2c-4d5e-8f90-0123456789ab = 512M");
  ck_assert_uint_eq(c.device_budget_bytes.n, 2);
  ck_assert_int_eq(ql__config_device_budget(c.device_budget_bytes.item[0],
                                            dev, sizeof dev, &bytes, why,
                                            sizeof why),
                   0);
  ck_assert_str_eq(dev, "cuda:0");
  ck_assert_uint_eq(bytes, (uint64_t)8 << 30);
  ck_assert_int_eq(ql__config_device_budget(c.device_budget_bytes.item[1],
                                            dev, sizeof dev, &bytes, why,
                                            sizeof why),
                   0);
  ck_assert_str_eq(dev, "cuda:GPU-8f3c0a1e-1b2c-4d5e-8f90-0123456789ab");
  ck_assert_uint_eq(bytes, (uint64_t)512 << 20);
  set_fails("device_budget_bytes", "cuda:0", "is not DEVICE=SIZE");
  set_fails("device_budget_bytes", "=1G", "is not DEVICE=SIZE");
  set_fails("device_budget_bytes", "cuda:0=", "cuda:0: empty value");
  set_fails("device_budget_bytes", "cuda:0=0", "cuda:0: 0 is not in [1, ");
  set_fails("device_budget_bytes", "cuda:0=1.5G", "is not a size");
  set_fails("device_budget_bytes", "cuda:0=1GB", "ambiguous");
  set_fails("device_budget_bytes", "CUDA:0=1G", "is not a device name");
  set_fails("device_budget_bytes", "cpu=1G", "cpu_budget_bytes");
  set_fails("device_budget_bytes", "cuda:0=1G,cuda:0 = 2G",
            "'cuda:0' is listed twice");
  set_fails("device_budget_bytes", "cuda:0=1G,,cuda:1=1G", "empty item");
  /* In a file, the error names the line. */
  parse_fails("[qlineard]\n\ndevice_budget_bytes = cuda:1=4G,cuda:1=5G\n",
              "t.conf:3: device_budget_bytes: 'cuda:1' is listed twice");
  parse_fails("[qlineard]\naccel_budget_percent = 101\n",
              "t.conf:2: accel_budget_percent: 101 is not in [0.01, 100]");
}
END_TEST

START_TEST(test_set) {
  ql__config c;
  char err[512];
  ql__config_init_defaults(&c);
  set_ok(&c, "max-queue", "9");
  ck_assert_uint_eq(c.max_queue, 9);
  ck_assert_int_eq(ql__config_set(&c, "max-queue", "0", err, sizeof err),
                   QL_EINVAL);
  ck_assert_str_eq(err, "max-queue: 0 is not in [1, 1048576]");
  ck_assert_int_eq(ql__config_set(&c, "nope", "1", err, sizeof err),
                   QL_EINVAL);
  ck_assert_str_eq(err, "unknown option 'nope'");
  /* A tiny message buffer is still terminated. */
  ck_assert_int_eq(ql__config_set(&c, "max_queue", "0", err, 5), QL_EINVAL);
  ck_assert_uint_eq(strlen(err), 4);
  ck_assert_uint_eq(c.max_queue, 9);
}
END_TEST

/* ---------------------------------------------------------------- INI */

START_TEST(test_ini_syntax) {
  ql__config c = parse_ok(
      "# a comment\n"
      "; another\n"
      "\n"
      "   \t\n"
      "  [ qlineard ]   # trailing comment\n"
      "max_queue=5\n"
      "  log_level   =\tdebug   \n"
      "max_message_bytes = 32M # inline\n"
      "drain_ms = 10s ; inline too\n"
      "state_dir = \"/var/lib/q l\"  # quoted keeps blanks\n"
      "admin_dir = /run/a#b;c\n"
      "required_devices = cpu , cuda:0\n"
      "  # indented comment\n"
      "[qlineard]\n"
      "crossover_rows = \"8\"\n"
      "socket_dir = \"/run/x #1\"\n");
  ck_assert_uint_eq(c.max_queue, 5);
  ck_assert_int_eq(c.log_level, QL_LOG_DEBUG);
  ck_assert_uint_eq(c.max_message_bytes, 32u << 20);
  ck_assert_uint_eq(c.drain_ms, 10000);
  ck_assert_str_eq(c.state_dir, "/var/lib/q l");
  ck_assert_str_eq(c.admin_dir, "/run/a#b;c");
  ck_assert_uint_eq(c.required_devices.n, 2);
  ck_assert_uint_eq(c.crossover_rows, 8);
  ck_assert_str_eq(c.socket_dir, "/run/x #1");

  /* Empty values: quoted or not, with a comment or not. */
  c = parse_ok("[qlineard]\nstate_dir =\nadmin_dir = \"\"\n"
               "required_devices = # none\n");
  ck_assert_str_eq(c.state_dir, "");
  ck_assert_str_eq(c.admin_dir, "");
  ck_assert_uint_eq(c.required_devices.n, 0);

  /* Nothing at all, only comments, a section alone, no final newline, a
   * UTF-8 byte order mark. */
  ql__config d;
  ql__config_init_defaults(&d);
  c = parse_ok("");
  ck_assert(cfg_equal(&c, &d));
  c = parse_ok("# nothing\n;\n");
  ck_assert(cfg_equal(&c, &d));
  c = parse_ok("[qlineard]");
  ck_assert(cfg_equal(&c, &d));
  c = parse_ok("[qlineard]\nmax_queue = 3");
  ck_assert_uint_eq(c.max_queue, 3);
  c = parse_ok("\xEF\xBB\xBF[qlineard]\nmax_queue = 4\n");
  ck_assert_uint_eq(c.max_queue, 4);
  /* Values not given keep what the config held. */
  ck_assert_uint_eq(c.max_message_bytes, d.max_message_bytes);
}
END_TEST

START_TEST(test_ini_crlf) {
  ql__config c = parse_ok("[qlineard]\r\nmax_queue = 5\r\n"
                          "state_dir = /var/lib/q\r\n\r\n"
                          "log_level = debug # c\r\n"
                          "drain_ms = 1s");
  ck_assert_uint_eq(c.max_queue, 5);
  ck_assert_str_eq(c.state_dir, "/var/lib/q");
  ck_assert_int_eq(c.log_level, QL_LOG_DEBUG);
  ck_assert_uint_eq(c.drain_ms, 1000);
  /* A lone CR is not a line end. */
  parse_fails("[qlineard]\rmax_queue = 5\n",
              "t.conf:1: text after the section header");
  parse_fails("[qlineard]\nmax_queue = 5\r\r\n",
              "t.conf:2: max_queue: '5?' is not an integer");
}
END_TEST

START_TEST(test_ini_errors) {
  parse_fails("[qlineard]\n\n# c\nmax_queue = 0\n",
              "t.conf:4: max_queue: 0 is not in [1, 1048576]");
  parse_fails("[qlineard]\nmax_queue = 5\nbogus = 1\n",
              "t.conf:3: unknown option 'bogus'");
  parse_fails("[qlineard]\nmax-queue = 5\n",
              "t.conf:2: unknown option 'max-queue' (did you mean "
              "max_queue?)");
  parse_fails("[qlineard]\nMax_Queue = 5\n",
              "t.conf:2: unknown option 'Max_Queue'");
  parse_fails("[qlineard]\nmax_queue = 5\nlog_level = info\nmax_queue = 5\n",
              "t.conf:4: max_queue: set twice (first on line 2)");
  parse_fails("[qlineard]\nmax_queue = 5\n[qlineard]\nmax_queue = 6\n",
              "t.conf:4: max_queue: set twice (first on line 2)");
  parse_fails("max_queue = 5\n[qlineard]\n",
              "t.conf:1: max_queue: outside a section (options go under "
              "[qlineard])");
  parse_fails("[qlineard]\n[other]\nmax_queue = 5\n",
              "t.conf:2: unknown section [other] (only [qlineard] is known)");
  parse_fails("[QLINEARD]\n", "t.conf:1: unknown section [QLINEARD] (only "
              "[qlineard] is known)");
  parse_fails("[]\n", "t.conf:1: unknown section [] (only [qlineard] is "
              "known)");
  parse_fails("[qlineard\n", "t.conf:1: malformed section header (no ']')");
  parse_fails("[qlineard] x\n", "t.conf:1: text after the section header");
  parse_fails("[qlineard]\nmax_queue 5\n", "t.conf:2: expected 'key = value'");
  parse_fails("[qlineard]\n= 5\n", "t.conf:2: no key before '='");
  parse_fails("[qlineard]\nmax_queue =\n",
              "t.conf:2: max_queue: empty value (expected an integer)");
  parse_fails("[qlineard]\nmax_queue = 5 5\n",
              "t.conf:2: max_queue: '5 5' is not an integer");
  parse_fails("[qlineard]\nstate_dir = \"/x\n",
              "t.conf:2: state_dir: unterminated quoted value");
  parse_fails("[qlineard]\nstate_dir = \"/x\" y\n",
              "t.conf:2: state_dir: text after the quoted value");
  parse_fails("[qlineard]\nstate_dir = \"/x\"\"/y\"\n",
              "t.conf:2: state_dir: text after the quoted value");
  parse_fails("[qlineard]\nstate_dir = /a\"b\n",
              "t.conf:2: state_dir: '/a\"b': control character or '\"' in a "
              "path");
  parse_fails("[qlineard]\nlog_level = \"debug\n",
              "t.conf:2: log_level: unterminated quoted value");
  /* The first error wins, even when a later line is also bad. */
  parse_fails("[qlineard]\nmax_queue = x\nbogus = 1\n",
              "t.conf:2: max_queue: 'x' is not an integer");
}
END_TEST

START_TEST(test_ini_nul) {
  static const char text[] = "[qlineard]\nmax_queue = 5\0 6\nlog_level = x\n";
  parse_fails_len(text, sizeof text - 1, "t.conf:2: NUL byte in the line");
  static const char text2[] = "[qlineard]\n\0";
  parse_fails_len(text2, sizeof text2 - 1, "t.conf:2: NUL byte in the line");
  /* A NUL past len is not seen. */
  ql__config c;
  char err[256];
  ql__config_init_defaults(&c);
  ck_assert_int_eq(parse_text(text, 24, &c, err, sizeof err), 0);
  ck_assert_uint_eq(c.max_queue, 5);
}
END_TEST

START_TEST(test_ini_long_lines) {
  size_t n = 5000;
  char *t = tu_xmalloc(n + 64);
  /* A comment of exactly the longest line is fine, with LF or CRLF. */
  strcpy(t, "[qlineard]\n#");
  memset(t + 12, 'x', 4095);
  strcpy(t + 12 + 4095, "\r\nmax_queue = 2\n");
  ql__config c = parse_ok(t);
  ck_assert_uint_eq(c.max_queue, 2);
  /* One byte more is refused, whatever the line holds. */
  strcpy(t, "[qlineard]\n#");
  memset(t + 12, 'x', 4096);
  strcpy(t + 12 + 4096, "\nmax_queue = 2\n");
  parse_fails(t, "t.conf:2: line longer than 4096 bytes");
  strcpy(t, "[qlineard]\nmax_queue = 1\nstate_dir = /");
  size_t base = strlen(t);
  memset(t + base, 'd', n);
  t[base + n] = '\0';
  parse_fails(t, "t.conf:3: line longer than 4096 bytes");
  free(t);

  /* The whole file is bounded too. */
  size_t big = (64u << 10) + 1;
  t = tu_xmalloc(big + 1);
  memset(t, '\n', big);
  t[big] = '\0';
  parse_fails(t, "t.conf: larger than 65536 bytes");
  ql__config_init_defaults(&c);
  char err[128];
  ck_assert_int_eq(parse_text(t, big - 1, &c, err, sizeof err), 0);
  free(t);
}
END_TEST

/* Whatever the input, the message names the file and the config only
 * changes on success. */
START_TEST(test_ini_random) {
  static const char *tok[] = {
      "[qlineard]", "[x]", "[", "]", "=", " ", "\t", "\n", "\r\n", "\r",
      "#", ";", "\"", "max_queue", "log_level", "state_dir", "drain_ms",
      "required_devices", "5", "0", "64M", "2min", "/var/x", "debug", ",",
      "cpu", "cuda:0", "-", "99999999999999999999G", "\xEF\xBB\xBF",
      "max_message_bytes", "admin_dir"};
  uint64_t st = 42;
  char buf[512];
  for (int iter = 0; iter < 20000; iter++) {
    size_t len = 0;
    int ntok = (int)(tu_rng_next(&st) % 24);
    for (int k = 0; k < ntok; k++) {
      const char *s = tok[tu_rng_next(&st) % (sizeof tok / sizeof tok[0])];
      size_t n = strlen(s);
      if (len + n >= sizeof buf)
        break;
      memcpy(buf + len, s, n);
      len += n;
    }
    if (len > 0 && tu_rng_next(&st) % 8 == 0)
      buf[tu_rng_next(&st) % len] = (char)tu_rng_next(&st);
    ql__config c, before;
    char err[256] = "x";
    ql__config_init_defaults(&c);
    memcpy(&before, &c, sizeof c);
    int rc = parse_text(buf, len, &c, err, sizeof err);
    if (rc != 0) {
      REQUIRE(rc == QL_EINVAL, "rc %d", rc);
      REQUIRE(strncmp(err, "t.conf:", 7) == 0, "'%s'", err);
      REQUIRE(memcmp(&c, &before, sizeof c) == 0, "changed on error");
    } else {
      REQUIRE(err[0] == '\0', "'%s'", err);
    }
  }
}
END_TEST

START_TEST(test_parse_file) {
  ql__config c, before;
  char err[512];
  static const char text[] = "[qlineard]\nmax_queue = 77\n";
  char *path = write_temp("q.conf", text, sizeof text - 1);
  ql__config_init_defaults(&c);
  ck_assert_int_eq(ql__config_parse_file(path, &c, err, sizeof err), 0);
  ck_assert_uint_eq(c.max_queue, 77);
  remove_temp(path);

  static const char bad[] = "[qlineard]\n\nmax_queue = 0\n";
  path = write_temp("q.conf", bad, sizeof bad - 1);
  memcpy(&before, &c, sizeof c);
  ck_assert_int_eq(ql__config_parse_file(path, &c, err, sizeof err),
                   QL_EINVAL);
  char want[512];
  snprintf(want, sizeof want, "%s:3: max_queue: 0 is not in [1, 1048576]",
           path);
  ck_assert_str_eq(err, want);
  ck_assert(memcmp(&c, &before, sizeof c) == 0);

  /* Missing file, directory. */
  strcpy(strrchr(path, '/'), "/missing.conf");
  ck_assert_int_eq(ql__config_parse_file(path, &c, err, sizeof err), QL_EIO);
  ck_assert_msg(strstr(err, "missing.conf: No such file") != NULL, "%s", err);
  *strrchr(path, '/') = '\0';
  ck_assert_int_eq(ql__config_parse_file(path, &c, err, sizeof err), QL_EIO);
  ck_assert_msg(strstr(err, "is a directory") != NULL, "%s", err);
  /* A FIFO: refused at once, where the open waited for a writer. */
  strcat(path, "/fifo.conf");
  ck_assert_int_eq(mkfifo(path, 0600), 0);
  ck_assert_int_eq(ql__config_parse_file(path, &c, err, sizeof err), QL_EIO);
  ck_assert_msg(strstr(err, "is a FIFO") != NULL, "%s", err);
  unlink(path);
  strcpy(strrchr(path, '/'), "/q.conf");
  remove_temp(path);

  /* A file larger than the bound. */
  size_t big = (64u << 10) + 100;
  char *t = tu_xmalloc(big);
  memset(t, '\n', big);
  path = write_temp("big.conf", t, big);
  free(t);
  ck_assert_int_eq(ql__config_parse_file(path, &c, err, sizeof err),
                   QL_EINVAL);
  ck_assert_msg(strstr(err, "larger than 65536 bytes") != NULL, "%s", err);
  remove_temp(path);

  /* /dev/null: empty, fine. */
  ck_assert_int_eq(ql__config_parse_file("/dev/null", &c, err, sizeof err),
                   0);
}
END_TEST

/* ------------------------------------------------------- command line */

START_TEST(test_args_basic) {
  ql__config c, d;
  ql__cmdline cl;
  char err[512];
  const char *none[] = {NULL};
  ck_assert_int_eq(from_args(none, &c, &cl, err, sizeof err), 0);
  ql__config_init_defaults(&d);
  ck_assert(cfg_equal(&c, &d));
  ck_assert_ptr_null(cl.config_file);
  ck_assert(!cl.help && !cl.version && !cl.print_config);

  /* The names the integration tests use, and every spelling. */
  const char *a[] = {"--socket-dir", "/tmp/q", "--log-level", "debug",
                     "--max-message-bytes", "65536", "--max-chunk-bytes",
                     "16384", "--max-queued-bytes", "1048576", "--drain-ms",
                     "0", "--max-queue=5", "--set", "crossover_rows=3",
                     "--set", "cpu-threads=2", "--max_upload_bytes", "1G",
                     "--required-devices", "cpu,cuda:0", "--state-dir=",
                     "--print-config", NULL};
  ck_assert_int_eq(from_args(a, &c, &cl, err, sizeof err), 0);
  ck_assert_str_eq(c.socket_dir, "/tmp/q");
  ck_assert_int_eq(c.log_level, QL_LOG_DEBUG);
  ck_assert_uint_eq(c.max_message_bytes, 65536);
  ck_assert_uint_eq(c.max_chunk_bytes, 16384);
  ck_assert_uint_eq(c.max_queued_bytes, 1048576);
  ck_assert_uint_eq(c.drain_ms, 0);
  ck_assert_uint_eq(c.max_queue, 5);
  ck_assert_uint_eq(c.crossover_rows, 3);
  ck_assert_uint_eq(c.cpu_threads, 2);
  ck_assert_uint_eq(c.max_upload_bytes, 1u << 30);
  ck_assert_uint_eq(c.required_devices.n, 2);
  ck_assert_str_eq(c.state_dir, "");
  ck_assert(cl.print_config);

  /* The last of a repeated option wins. */
  const char *r[] = {"--max-queue", "5", "--max-queue", "6", NULL};
  ck_assert_int_eq(from_args(r, &c, &cl, err, sizeof err), 0);
  ck_assert_uint_eq(c.max_queue, 6);

  /* A value that looks like an option is still the value. */
  const char *v[] = {"--state-dir", "--log-level", NULL};
  ck_assert_int_eq(from_args(v, &c, &cl, err, sizeof err), QL_EINVAL);
  ck_assert_str_eq(err, "--state-dir: '--log-level' is not an absolute path");
}
END_TEST

/* max_chunk_bytes is clamped to what fits in a message with its envelope,
 * whichever source set either. */
START_TEST(test_args_clamp) {
  ql__config c;
  ql__cmdline cl;
  char err[512];
  const char *a[] = {"--max-message-bytes", "8192", NULL};
  ck_assert_int_eq(from_args(a, &c, &cl, err, sizeof err), 0);
  ck_assert_uint_eq(c.max_chunk_bytes, 8192 - QL_ENVELOPE_BYTES);
  const char *b[] = {"--max-message-bytes", "65536", "--max-chunk-bytes",
                     "1M", NULL};
  ck_assert_int_eq(from_args(b, &c, &cl, err, sizeof err), 0);
  ck_assert_uint_eq(c.max_chunk_bytes, 65536 - QL_ENVELOPE_BYTES);
  const char *d[] = {"--max-message-bytes", "65536", "--max-chunk-bytes",
                     "16384", NULL};
  ck_assert_int_eq(from_args(d, &c, &cl, err, sizeof err), 0);
  ck_assert_uint_eq(c.max_chunk_bytes, 16384);
}
END_TEST

START_TEST(test_args_errors) {
  static const struct {
    const char *args[6];
    const char *want;
  } cases[] = {
      {{"--bogus", "1"}, "unknown option '--bogus'"},
      {{"--max-queue"}, "--max-queue needs a value"},
      {{"--max-queue", "0"}, "--max-queue: 0 is not in [1, 1048576]"},
      {{"--max_queue=0"}, "--max_queue: 0 is not in [1, 1048576]"},
      {{"stray"}, "unexpected argument 'stray'"},
      {{"-x"}, "unexpected argument '-x'"},
      {{"--"}, "unexpected argument '--'"},
      {{"--config", "/a", "--config", "/b"}, "--config given twice"},
      {{"--config"}, "--config needs a value"},
      {{"--set", "max_queue"}, "--set 'max_queue': expected KEY=VALUE"},
      {{"--set", "=5"}, "--set '=5': expected KEY=VALUE"},
      {{"--set", "nope=5"}, "--set: unknown option 'nope'"},
      {{"--set", "max_queue=0"}, "--set max_queue: 0 is not in [1, 1048576]"},
      {{"--print-config=yes"}, "unknown option '--print-config'"},
      {{"--log-level", "loud"},
       "--log-level: 'loud' is not one of err, warning, notice, info, debug"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    ql__config c;
    ql__cmdline cl;
    char err[512] = "";
    ck_assert_int_eq(from_args(cases[i].args, &c, &cl, err, sizeof err),
                     QL_EINVAL);
    ck_assert_str_eq(err, cases[i].want);
  }
}
END_TEST

/* --help and --version stop everything else: a bad value or a missing
 * file after them does not matter. */
START_TEST(test_args_help) {
  ql__config c;
  ql__cmdline cl;
  char err[512];
  const char *h[] = {"--max-queue", "0", "--config", "/nonexistent", "--help",
                     NULL};
  ck_assert_int_eq(from_args(h, &c, &cl, err, sizeof err), 0);
  ck_assert(cl.help);
  const char *v[] = {"--version", "--bogus", NULL};
  ck_assert_int_eq(from_args(v, &c, &cl, err, sizeof err), 0);
  ck_assert(cl.version);
  const char *s[] = {"-h", NULL};
  ck_assert_int_eq(from_args(s, &c, &cl, err, sizeof err), 0);
  ck_assert(cl.help);
}
END_TEST

/* Defaults, then the file, then the command line: wherever --config is. */
START_TEST(test_args_precedence) {
  static const char text[] = "[qlineard]\nmax_queue = 7\nlog_level = debug\n"
                             "drain_ms = 5s\n";
  char *path = write_temp("p.conf", text, sizeof text - 1);
  ql__config c;
  ql__cmdline cl;
  char err[512];
  const char *a[] = {"--max-queue", "5", "--config", path, "--set",
                     "drain_ms=1s", NULL};
  ck_assert_int_eq(from_args(a, &c, &cl, err, sizeof err), 0);
  ck_assert_str_eq(cl.config_file, path);
  ck_assert_uint_eq(c.max_queue, 5);           /* command line */
  ck_assert_int_eq(c.log_level, QL_LOG_DEBUG); /* file */
  ck_assert_uint_eq(c.drain_ms, 1000);         /* command line */
  ck_assert_uint_eq(c.crossover_default_rows, 16); /* default */
  const char *b[] = {"--config=", NULL};
  ck_assert_int_eq(from_args(b, &c, &cl, err, sizeof err), QL_EIO);

  /* A file error names the file and line; the command line is not
   * applied. */
  remove_temp(path);
  static const char bad[] = "[qlineard]\nmax_queue = 7\nlog_level = loud\n";
  path = write_temp("p.conf", bad, sizeof bad - 1);
  const char *d[] = {"--config", path, "--log-level", "info", NULL};
  ck_assert_int_eq(from_args(d, &c, &cl, err, sizeof err), QL_EINVAL);
  char want[512];
  snprintf(want, sizeof want, "%s:3: log_level: 'loud' is not one of err, "
           "warning, notice, info, debug", path);
  ck_assert_str_eq(err, want);
  remove_temp(path);
}
END_TEST

/* -------------------------------------------------------------- reload */

START_TEST(test_reload) {
  ql__config old, parsed, out;
  char report[1024];
  ql__config_init_defaults(&old);
  memcpy(&parsed, &old, sizeof old);
  set_ok(&parsed, "max_queue", "5");
  set_ok(&parsed, "log_level", "debug");
  set_ok(&parsed, "max_message_bytes", "32M");
  set_ok(&parsed, "socket_dir", "/elsewhere");
  int n = ql__config_reload(&old, &parsed, &out, report, sizeof report);
  ck_assert_int_eq(n, 2);
  ck_assert_uint_eq(out.max_queue, 5);
  ck_assert_int_eq(out.log_level, QL_LOG_DEBUG);
  ck_assert_uint_eq(out.max_message_bytes, 64u << 20);
  ck_assert_str_eq(out.socket_dir, old.socket_dir);
  char want[PATH_MAX + 512];
  snprintf(want, sizeof want,
           "applied: max_queue = 5, log_level = debug; needs a restart: "
           "socket_dir (running %s, configured /elsewhere), "
           "max_message_bytes (running 64M, configured 32M)",
           old.socket_dir);
  ck_assert_str_eq(report, want);

  /* Nothing changed. */
  ck_assert_int_eq(ql__config_reload(&old, &old, &out, report, sizeof report),
                   0);
  ck_assert_str_eq(report, "no changes");
  ck_assert(cfg_equal(&out, &old));

  /* Only restart-only changes. */
  memcpy(&parsed, &old, sizeof old);
  set_ok(&parsed, "state_dir", "/var/lib/qlinear");
  ck_assert_int_eq(
      ql__config_reload(&old, &parsed, &out, report, sizeof report), 0);
  ck_assert_str_eq(report, "needs a restart: state_dir (running , configured "
                           "/var/lib/qlinear)");
  ck_assert_str_eq(out.state_dir, "");

  /* out may be old. */
  memcpy(&parsed, &old, sizeof old);
  set_ok(&parsed, "drain_ms", "1s");
  ck_assert_int_eq(
      ql__config_reload(&old, &parsed, &old, report, sizeof report), 1);
  ck_assert_uint_eq(old.drain_ms, 1000);
  ck_assert_str_eq(report, "applied: drain_ms = 1s");

  /* A short report is cut and terminated. */
  memcpy(&parsed, &old, sizeof old);
  set_ok(&parsed, "max_queue", "5");
  set_ok(&parsed, "crossover_rows", "1");
  ck_assert_int_eq(ql__config_reload(&old, &parsed, &out, report, 16), 2);
  ck_assert_uint_eq(strlen(report), 15);
  ck_assert_str_eq(report + 12, "...");
  ck_assert_uint_eq(out.crossover_rows, 1);
}
END_TEST

/* Every option, changed alone: applied exactly when it is live. */
START_TEST(test_reload_each) {
  size_t n;
  const ql__option *t = ql__config_options(&n);
  for (size_t i = 0; i < n; i++) {
    const ql__option *o = &t[i];
    ql__config old, parsed, out;
    char report[8192], cur[PATH_MAX + 64], want[PATH_MAX + 64], err[512];
    const char *v;
    ql__config_init_defaults(&old);
    memcpy(&parsed, &old, sizeof old);
    ql__option_format(o, &old, cur, sizeof cur);
    switch (o->type) {
    case QL_OPT_PATH:
      v = "/changed";
      break;
    case QL_OPT_ADDRESS:
      v = "127.0.0.1:9464";
      break;
    case QL_OPT_LIST:
      v = o->flags & QL_OPT_KEYED ? "cuda:0=1G" : "cpu";
      break;
    case QL_OPT_PERCENT:
      v = "50";
      break;
    case QL_OPT_ENUM: /* a name other than the current one */
      v = o->names[0].name;
      if (strcmp(v, cur) == 0)
        v = o->names[1].name;
      break;
    default:
      snprintf(want, sizeof want, "%" PRIu64, o->max);
      v = strcmp(roundtrip(o->name, want), cur) != 0 ? want : "1";
      break;
    }
    ck_assert_int_eq(ql__config_set(&parsed, o->name, v, err, sizeof err), 0);
    int applied = ql__config_reload(&old, &parsed, &out, report, sizeof report);
    ql__option_format(o, &out, want, sizeof want);
    if (o->flags & QL_OPT_LIVE) {
      ck_assert_msg(applied == 1 && strcmp(want, cur) != 0, "%s", o->name);
      ck_assert_msg(strncmp(report, "applied: ", 9) == 0, "%s", report);
    } else {
      ck_assert_msg(applied == 0 && strcmp(want, cur) == 0, "%s", o->name);
      ck_assert_msg(strncmp(report, "needs a restart: ", 17) == 0, "%s",
                    report);
    }
    ck_assert_msg(strstr(report, o->name) != NULL, "%s", report);
  }
}
END_TEST

/* The cache's text: what it holds reads back the same; past its bound the
 * first (oldest) entries are left out and the rest fit, where the file
 * used to outgrow what the daemon reads at start (1 MiB) and all of it
 * was measured again. */
START_TEST(test_xover_dump) {
  enum { N = 3000 };
  ql__xover_entry *e = calloc(N, sizeof *e), *back;
  size_t n, kept;
  char err[160], *text;
  ck_assert_ptr_nonnull(e);
  for (unsigned i = 0; i < N; i++) {
    snprintf(e[i].key, sizeof e[i].key,
             "cpu.avx512.linear_wo|cpu.avx512.linear_aq|q4g|128|f32|%u|4096",
             i);
    e[i].rows = 1 + i % 512;
    e[i].n = QL_XOVER_POINTS;
    for (unsigned j = 0; j < QL_XOVER_POINTS; j++) {
      e[i].m[j] = 1u << (j % 11);
      e[i].wo_ns[j] = 1000000000ull + i * 17 + j;
      e[i].aq_ns[j] = j == 0 ? 0 : 2000000000ull + i + j;
    }
  }
  /* A few: all of them, the same values back. */
  ck_assert_int_eq(ql__xover_dump(e + N - 3, 3, 1u << 20, &text, &kept), 0);
  ck_assert_uint_eq(kept, 3);
  ck_assert_int_eq(ql__xover_parse(text, strlen(text), &back, &n, err,
                                   sizeof err),
                   0);
  ck_assert_uint_eq(n, 3);
  for (size_t i = 0; i < n; i++) {
    const ql__xover_entry *w = NULL;
    for (size_t j = N - 3; j < N; j++)
      if (strcmp(e[j].key, back[i].key) == 0)
        w = &e[j];
    ck_assert_ptr_nonnull(w);
    ck_assert_uint_eq(back[i].rows, w->rows);
    ck_assert_uint_eq(back[i].n, w->n);
    ck_assert(memcmp(back[i].m, w->m, sizeof w->m) == 0);
    ck_assert(memcmp(back[i].wo_ns, w->wo_ns, sizeof w->wo_ns) == 0);
    ck_assert(memcmp(back[i].aq_ns, w->aq_ns, sizeof w->aq_ns) == 0);
  }
  free(back);
  free(text);
  /* All 3000: past 1 MiB; the newest that fit are written, and read. */
  ck_assert_int_eq(ql__xover_dump(e, N, 1u << 20, &text, &kept), 0);
  ck_assert_uint_lt(kept, N);
  ck_assert_uint_gt(kept, N / 4);
  ck_assert_uint_le(strlen(text), 1u << 20);
  ck_assert_int_eq(ql__xover_parse(text, strlen(text), &back, &n, err,
                                   sizeof err),
                   0);
  ck_assert_uint_eq(n, kept);
  int newest = 0, oldest = 0;
  for (size_t i = 0; i < n; i++) {
    newest |= strcmp(back[i].key, e[N - 1].key) == 0;
    oldest |= strcmp(back[i].key, e[0].key) == 0;
  }
  ck_assert(newest && !oldest);
  free(back);
  free(text);
  free(e);
}
END_TEST

/* The crossover cache (xover.h, a file of the state directory like the
 * config): version 1's bare rows still read, version 2's times read back,
 * and times out of bounds or of unequal lengths refused. */
START_TEST(test_xover_file) {
  ql__xover_entry *e;
  size_t n;
  char err[160];
  const char *v1 = "{\"version\": 1, \"crossover\": {\"a\": 2}}";
  ck_assert_int_eq(ql__xover_parse(v1, strlen(v1), &e, &n, err, sizeof err),
                   0);
  ck_assert_uint_eq(n, 1);
  ck_assert_uint_eq(e[0].rows, 2);
  ck_assert_uint_eq(e[0].n, 0);
  free(e);
  const char *v2 = "{\"version\": 2, \"crossover\": {\"a\": 3, \"b\": "
                   "{\"rows\": 4, \"m\": [1, 512], \"wo_ns\": [10, 900], "
                   "\"aq_ns\": [0, 300]}}}";
  ck_assert_int_eq(ql__xover_parse(v2, strlen(v2), &e, &n, err, sizeof err),
                   0);
  ck_assert_uint_eq(n, 2);
  const ql__xover_entry *b = strcmp(e[0].key, "b") == 0 ? &e[0] : &e[1];
  ck_assert_uint_eq(b->rows, 4);
  ck_assert_uint_eq(b->n, 2);
  ck_assert_uint_eq(b->m[1], 512);
  ck_assert_uint_eq(b->wo_ns[1], 900);
  ck_assert_uint_eq(b->aq_ns[0], 0);
  ck_assert_uint_eq(b->aq_ns[1], 300);
  free(e);
  static const char *bad[] = {
      "{\"version\": 3, \"crossover\": {}}",
      "{\"version\": 1, \"crossover\": {\"a\": {\"rows\": 4, \"m\": [], "
      "\"wo_ns\": [], \"aq_ns\": []}}}",
      "{\"version\": 2, \"crossover\": {\"a\": {\"rows\": 4, \"m\": [1], "
      "\"wo_ns\": [], \"aq_ns\": [1]}}}",
      "{\"version\": 2, \"crossover\": {\"a\": {\"rows\": 4, \"m\": [0], "
      "\"wo_ns\": [1], \"aq_ns\": [1]}}}",
      "{\"version\": 2, \"crossover\": {\"a\": {\"rows\": 4, \"m\": [1], "
      "\"wo_ns\": [0], \"aq_ns\": [1]}}}",
      "{\"version\": 2, \"crossover\": {\"a\": {\"rows\": 4, \"m\": [1], "
      "\"wo_ns\": [1], \"aq_ns\": [-1]}}}",
      "{\"version\": 2, \"crossover\": {\"a\": {\"rows\": 4, \"m\": [1], "
      "\"wo_ns\": [1], \"aq_ns\": [1], \"x\": 1}}}",
      "{\"version\": 2, \"crossover\": {\"a\": {\"m\": [1], \"wo_ns\": [1], "
      "\"aq_ns\": [1], \"x\": 1}}}",
      "{\"version\": 2, \"crossover\": {\"a\": {\"rows\": 4, \"m\": "
      "[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17], \"wo_ns\": "
      "[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1], \"aq_ns\": "
      "[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1]}}}",
      "{\"version\": 2, \"crossover\": {\"a\": {\"rows\": 4, \"m\": [1], "
      "\"wo_ns\": [1099511627777], \"aq_ns\": [1]}}}",
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    err[0] = '\0';
    ck_assert_msg(ql__xover_parse(bad[i], strlen(bad[i]), &e, &n, err,
                                  sizeof err) == QL_EBADFILE,
                  "accepted: %s", bad[i]);
    ck_assert_ptr_null(e);
    ck_assert(err[0] != '\0');
  }
}
END_TEST

/* metrics_listen: loopback addresses only, each refusal saying why; the
 * parser (listen.h) gives the address the listener binds. */
START_TEST(test_metrics_listen) {
  static const struct {
    const char *v, *why; /* why NULL: accepted */
  } cases[] = {
      {"127.0.0.1:9464", NULL},
      {"127.1.2.3:1", NULL},
      {"127.255.255.255:65535", NULL},
      {"[::1]:9464", NULL},
      {"localhost:9464", NULL},
      {"LocalHost:80", NULL},
      {"", NULL}, /* none */
      {"0.0.0.0:9464", "not a loopback address"},
      {"192.0.2.1:9464", "not a loopback address"},
      {"128.0.0.1:9464", "not a loopback address"},
      {"[::]:9464", "not a loopback address"},
      {"[::ffff:127.0.0.1]:9464", "not a loopback address"},
      {"[fe80::1]:9464", "not a loopback address"},
      {"::1:9464", "in brackets"},
      {"[::1]9464", "not [IPV6]:PORT"},
      {"[::1", "not [IPV6]:PORT"},
      {"[zz]:1", "not an IPv6 address"},
      {"example.com:9464", "names are not looked up"},
      {"127.0.0.1", "has no port"},
      {"127.0.0.1:", "port"},
      {"127.0.0.1:0", "port"},
      {"127.0.0.1:65536", "port"},
      {"127.0.0.1:09464", "port"},
      {"127.0.0.1:+80", "port"},
      {"127.0.0.1: 80", "port"},
      {"127.0.0.01:80", "not an IPv4 address"},
      {"127.1:80", "not an IPv4 address"},
      {":80", "not an IPv4 address"},
      {"127.0.0.1:80:80", "in brackets"},
      {"127.0.0.1:123456789012345678901234567890", "longer than"},
      {"127.0.0.1\t:80", "control character"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    ql__config c;
    char err[512] = "";
    ql__config_init_defaults(&c);
    int rc = ql__config_set(&c, "metrics_listen", cases[i].v, err, sizeof err);
    if (cases[i].why == NULL) {
      ck_assert_msg(rc == 0, "%s: %s", cases[i].v, err);
      ck_assert_str_eq(c.metrics_listen, cases[i].v);
    } else {
      ck_assert_msg(rc == QL_EINVAL, "accepted: %s", cases[i].v);
      ck_assert_msg(strstr(err, "metrics_listen: ") == err &&
                        strstr(err, cases[i].why) != NULL,
                    "%s: '%s' does not say '%s'", cases[i].v, err,
                    cases[i].why);
      ck_assert_str_eq(c.metrics_listen, ""); /* unchanged */
    }
  }
  /* The address the listener binds. */
  struct sockaddr_storage sa;
  socklen_t len = 0;
  char why[256];
  ck_assert_int_eq(
      ql__listen_parse_loopback("localhost:9464", &sa, &len, why, sizeof why),
      0);
  ck_assert_int_eq(sa.ss_family, AF_INET);
  ck_assert_uint_eq(len, sizeof(struct sockaddr_in));
  ck_assert_uint_eq(ntohs(((struct sockaddr_in *)&sa)->sin_port), 9464);
  ck_assert_uint_eq(ntohl(((struct sockaddr_in *)&sa)->sin_addr.s_addr),
                    INADDR_LOOPBACK);
  ck_assert_int_eq(
      ql__listen_parse_loopback("[::1]:1", &sa, &len, why, sizeof why), 0);
  ck_assert_int_eq(sa.ss_family, AF_INET6);
  ck_assert(IN6_IS_ADDR_LOOPBACK(&((struct sockaddr_in6 *)&sa)->sin6_addr));
  /* The command line names the option in its message. */
  ql__config c;
  ql__cmdline cl;
  char err[512];
  const char *args[] = {"--metrics-listen", "0.0.0.0:9464", NULL};
  ck_assert_int_eq(from_args(args, &c, &cl, err, sizeof err), QL_EINVAL);
  ck_assert_msg(strstr(err, "--metrics-listen: '0.0.0.0:9464' is not a "
                            "loopback address") == err, "%s", err);
}
END_TEST

/* systemd's handover: the descriptor of a name, or nothing for another
 * process, or a clear refusal of malformed values. */
START_TEST(test_listen_fds) {
  char why[256];
  int fd = -1, n = -1;
  /* Not handed over, or to another process (inherited variables). */
  ck_assert_int_eq(ql__listen_fds_find(NULL, NULL, NULL, 42, "metrics", &fd,
                                       &n, why, sizeof why), 0);
  ck_assert_int_eq(n, 0);
  ck_assert_int_eq(ql__listen_fds_find("41", "1", "metrics", 42, "metrics",
                                       &fd, &n, why, sizeof why), 0);
  ck_assert_int_eq(n, 0);
  /* Ours. */
  ck_assert_int_eq(ql__listen_fds_find("42", "1", "metrics", 42, "metrics",
                                       &fd, &n, why, sizeof why), 1);
  ck_assert_int_eq(fd, 3);
  ck_assert_int_eq(n, 1);
  ck_assert_int_eq(ql__listen_fds_find("42", "3", "a:b c:metrics", 42,
                                       "metrics", &fd, &n, why, sizeof why),
                   1);
  ck_assert_int_eq(fd, 5);
  ck_assert_int_eq(n, 3);
  /* Handed over, but none by that name (or no names at all). */
  ck_assert_int_eq(ql__listen_fds_find("42", "2", "a:b", 42, "metrics", &fd,
                                       &n, why, sizeof why), 0);
  ck_assert_int_eq(n, 2);
  ck_assert_int_eq(ql__listen_fds_find("42", "1", NULL, 42, "metrics", &fd,
                                       &n, why, sizeof why), 0);
  ck_assert_int_eq(ql__listen_fds_find("42", "0", "", 42, "metrics", &fd, &n,
                                       why, sizeof why), 0);
  /* Malformed. */
  static const struct {
    const char *pid, *fds, *names, *why;
  } bad[] = {
      {"x", "1", "metrics", "LISTEN_PID"},
      {"042", "1", "metrics", "LISTEN_PID"},
      {"-42", "1", "metrics", "LISTEN_PID"},
      {"", "1", "metrics", "LISTEN_PID"},
      {"42", "", "metrics", "LISTEN_FDS"},
      {"42", "1x", "metrics", "LISTEN_FDS"},
      {"42", "1025", "metrics", "LISTEN_FDS"},
      {"42", "99999999999", "metrics", "LISTEN_FDS"},
      {"42", "1", "a:metrics", "more descriptors"},
      {"42", "3", "a:metrics", "names 2 descriptors"},
      {"42", "2", "metrics:", "empty"},
      {"42", "2", ":metrics", "empty"},
      {"42", "1", "", "empty"},
      {"42", "2", "metrics:metrics", "twice"},
      {"42", "1", "met\nrics", "printable"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    why[0] = '\0';
    ck_assert_msg(ql__listen_fds_find(bad[i].pid, bad[i].fds, bad[i].names, 42,
                                      "metrics", &fd, &n, why,
                                      sizeof why) == QL_EINVAL,
                  "accepted %s/%s/%s", bad[i].pid, bad[i].fds, bad[i].names);
    ck_assert_msg(strstr(why, bad[i].why) != NULL, "'%s' does not say '%s'",
                  why, bad[i].why);
  }
  /* A name past systemd's 255 bytes. */
  char lng[300];
  memset(lng, 'a', 256);
  lng[256] = '\0';
  ck_assert_int_eq(ql__listen_fds_find("42", "1", lng, 42, "metrics", &fd, &n,
                                       why, sizeof why), QL_EINVAL);
  lng[255] = '\0';
  ck_assert_int_eq(ql__listen_fds_find("42", "1", lng, 42, "metrics", &fd, &n,
                                       why, sizeof why), 0);
}
END_TEST

/* The options meant to change without a restart. */
START_TEST(test_live_set) {
  static const char *live[] = {"max_upload_bytes", "upload_idle_ms",
                               "max_queue", "max_queued_bytes",
                               "max_pinned_bytes",
                               "crossover_rows", "drain_ms", "log_level",
                               "cpu_budget_bytes", "session_lease_ms",
                               "max_batch_rows", "prefill_chunk_rows",
                               "prefill_chunk_us",
                               "max_queue_delay_us", "decode_hold_us",
                               "session_max_requests",
                               "crossover_default_rows", "decode_max_rows",
                               "accel_budget_percent", "device_budget_bytes",
                               "ring_spin_us", "mapped_mode",
                               "metrics_weights", "uid_share"};
  size_t n, nlive = 0;
  const ql__option *t = ql__config_options(&n);
  for (size_t i = 0; i < n; i++)
    nlive += (t[i].flags & QL_OPT_LIVE) != 0;
  ck_assert_uint_eq(nlive, sizeof live / sizeof live[0]);
  for (size_t i = 0; i < sizeof live / sizeof live[0]; i++)
    ck_assert(opt(live[i])->flags & QL_OPT_LIVE);
}
END_TEST

/* ------------------------------------------------------------- writers */

static char *dump_to_string(const ql__config *cfg, size_t *len) {
  char *s = NULL;
  FILE *f = open_memstream(&s, len);
  ck_assert_ptr_nonnull(f);
  ql__config_dump(cfg, f);
  ck_assert_int_eq(fclose(f), 0);
  return s;
}

START_TEST(test_dump_roundtrip) {
  ql__config c, back;
  char err[512];
  size_t len;
  ql__config_init_defaults(&c);
  char *s = dump_to_string(&c, &len);
  ck_assert_msg(strstr(s, "\n[qlineard]\n") != NULL, "%s", s);
  ck_assert_msg(strstr(s, "\nmax_message_bytes = 64M\n") != NULL, "%s", s);
  ck_assert_msg(strstr(s, "\nstate_dir = \"\"\n") != NULL, "%s", s);
  ck_assert_msg(strstr(s, "\nlog_level = info\n") != NULL, "%s", s);
  /* Read back onto a config that differs everywhere it can. */
  memset(&back, 0, sizeof back);
  ck_assert_int_eq(parse_text(s, len, &back, err, sizeof err), 0);
  ck_assert(cfg_equal(&back, &c));
  free(s);

  /* Values that need quotes. */
  set_ok(&c, "state_dir", "/a b#c;d ");
  set_ok(&c, "admin_dir", "/x ");
  set_ok(&c, "socket_dir", "/s;t");
  set_ok(&c, "required_devices", "cpu,cuda:0");
  set_ok(&c, "max_queued_bytes", "1048577");
  s = dump_to_string(&c, &len);
  ck_assert_msg(strstr(s, "\nstate_dir = \"/a b#c;d \"\n") != NULL, "%s", s);
  ql__config_init_defaults(&back);
  ck_assert_int_eq(parse_text(s, len, &back, err, sizeof err), 0);
  ck_assert(cfg_equal(&back, &c));
  ck_assert_str_eq(back.state_dir, "/a b#c;d ");
  free(s);
}
END_TEST

START_TEST(test_help) {
  size_t n, len;
  char *s = NULL, dash[64];
  const ql__option *t = ql__config_options(&n);
  FILE *f = open_memstream(&s, &len);
  ql__config_help(f);
  fclose(f);
  /* The help text with its lines joined again. */
  char *flat = tu_xmalloc(len + 1), *o = flat;
  for (const char *p = s; *p != '\0'; p++) {
    if (strncmp(p, "\n      ", 7) == 0 && p[7] != ' ' && p[-1] != '\n' &&
        strncmp(p + 7, "default ", 8) != 0) {
      *o++ = ' ';
      p += 6;
    } else {
      *o++ = *p;
    }
  }
  *o = '\0';
  ck_assert_msg(strstr(s, "--config FILE") != NULL, "%s", s);
  ck_assert_msg(strstr(s, "--print-config") != NULL, "%s", s);
  ck_assert_msg(strstr(s, "--max-queue N\n") != NULL, "%s", s);
  ck_assert_msg(strstr(s, "--log-level err|warning|notice|info|debug\n"),
                "%s", s);
  ck_assert_msg(strstr(s, "default 64M, 8K to 1G\n") != NULL, "%s", s);
  ck_assert_msg(strstr(s, "default 1024, 1 to 1048576 [SIGHUP]\n") != NULL,
                "%s", s);
  for (size_t i = 0; i < n; i++) {
    size_t k;
    for (k = 0; t[i].name[k] != '\0'; k++)
      dash[k] = t[i].name[k] == '_' ? '-' : t[i].name[k];
    dash[k] = '\0';
    char want[96];
    snprintf(want, sizeof want, "  --%s ", dash);
    ck_assert_msg(strstr(s, want) != NULL, "no %s in --help", want);
    ck_assert_msg(strstr(flat, t[i].help) != NULL, "no help of %s",
                  t[i].name);
  }
  /* At most 78 columns. */
  for (char *line = s; *line != '\0';) {
    size_t ll = strcspn(line, "\n");
    ck_assert_msg(ll <= 78, "long line in --help: %.*s", (int)ll, line);
    line += ll + (line[ll] == '\n');
  }
  free(flat);
  free(s);
}
END_TEST

/* -------------------------------------------------------------- example */

static char *read_example(size_t *len) {
  FILE *f = fopen(QL_EXAMPLE_CONF, "rb");
  ck_assert_msg(f != NULL, "cannot open %s", QL_EXAMPLE_CONF);
  char *buf = tu_xmalloc(1 << 17);
  *len = fread(buf, 1, (1 << 17) - 1, f);
  buf[*len] = '\0';
  fclose(f);
  return buf;
}

/* Every option appears once in the example: set (the service's
 * directories) or commented out as "#key = default". The file parses. */
START_TEST(test_example_names_every_key) {
  size_t n, len;
  const ql__option *t = ql__config_options(&n);
  char *ex = read_example(&len);
  ql__config c, d;
  char err[512], set[128], commented[PATH_MAX + 128], def[PATH_MAX + 64];

  ql__config_init_defaults(&c);
  ql__config_init_defaults(&d);
  ck_assert_msg(ql__config_parse_file(QL_EXAMPLE_CONF, &c, err, sizeof err) ==
                    0, "%s", err);
  for (size_t i = 0; i < n; i++) {
    snprintf(set, sizeof set, "\n%s = ", t[i].name);
    if (t[i].def != NULL) {
      ql__option_format(&t[i], &d, def, sizeof def);
      snprintf(commented, sizeof commented, "\n#%s = %s\n", t[i].name,
               def[0] != '\0' ? def : "\"\"");
    } else {
      snprintf(commented, sizeof commented, "\n#%s = ", t[i].name);
    }
    const char *at_set = strstr(ex, set), *at_com = strstr(ex, commented);
    ck_assert_msg((at_set != NULL) != (at_com != NULL),
                  "%s: the example needs either '%s' or '%s'", t[i].name,
                  set + 1, commented + 1);
    const char *at = at_set != NULL ? at_set : at_com;
    const char *again = strstr(at + 1, at_set != NULL ? set : commented);
    ck_assert_msg(again == NULL, "%s twice in the example", t[i].name);
    /* An option left commented out has its default. */
    if (at_com != NULL)
      ck_assert_msg(same_option(&t[i], &c, &d), "%s", t[i].name);
  }
  /* The service's directories. */
  ck_assert_str_eq(c.socket_dir, "/run/qlinear");
  ck_assert_str_eq(c.admin_dir, "/run/qlinear-admin");
  ck_assert_str_eq(c.state_dir, "/var/lib/qlinear");
  free(ex);
}
END_TEST

/* Uncommented, every "#key = value" line of the example is valid and
 * sets the option's default (the lines cannot show a stale default). */
START_TEST(test_example_uncommented) {
  size_t n, len;
  const ql__option *t = ql__config_options(&n);
  char *ex = read_example(&len);
  char *out = tu_xmalloc(len + 1), *o = out;
  char err[512];
  int uncommented[64] = {0};
  ck_assert_uint_le(n, 64);
  for (char *line = ex; *line != '\0';) {
    char *nl = strchr(line, '\n');
    size_t ll = nl != NULL ? (size_t)(nl - line + 1) : strlen(line);
    int opt_line = 0;
    for (size_t i = 0; i < n && !opt_line; i++) {
      size_t k = strlen(t[i].name);
      opt_line = line[0] == '#' && strncmp(line + 1, t[i].name, k) == 0 &&
                 strncmp(line + 1 + k, " = ", 3) == 0;
      if (opt_line)
        uncommented[i] = 1;
    }
    memcpy(o, line + opt_line, ll - opt_line);
    o += ll - opt_line;
    line += ll;
  }
  *o = '\0';
  ql__config c, d;
  ql__config_init_defaults(&d);
  memset(&c, 0, sizeof c);
  ck_assert_msg(parse_text(out, strlen(out), &c, err, sizeof err) == 0,
                "uncommented example: %s", err);
  for (size_t i = 0; i < n; i++)
    if (uncommented[i] && t[i].def != NULL)
      ck_assert_msg(same_option(&t[i], &c, &d), "%s: not the default",
                    t[i].name);
  free(out);
  free(ex);
}
END_TEST

static Suite *config_suite(void) {
  Suite *s = suite_create("config");
  TCase *tc = tcase_create("table");
  tcase_add_test(tc, test_table_invariants);
  tcase_add_test(tc, test_defaults_canonical);
  tcase_add_test(tc, test_defaults_values);
  tcase_add_test(tc, test_default_socket_dir);
  tcase_add_test(tc, test_find);
  tcase_add_test(tc, test_live_set);
  tcase_add_test(tc, test_xover_file);
  tcase_add_test(tc, test_xover_dump);
  suite_add_tcase(s, tc);

  tc = tcase_create("types");
  tcase_add_test(tc, test_uint);
  tcase_add_test(tc, test_size);
  tcase_add_test(tc, test_duration);
  tcase_add_test(tc, test_bool);
  tcase_add_test(tc, test_enum);
  tcase_add_test(tc, test_path);
  tcase_add_test(tc, test_list);
  tcase_add_test(tc, test_set);
  tcase_add_test(tc, test_percent);
  tcase_add_test(tc, test_device_budget);
  suite_add_tcase(s, tc);

  tc = tcase_create("ini");
  tcase_add_test(tc, test_ini_syntax);
  tcase_add_test(tc, test_ini_crlf);
  tcase_add_test(tc, test_ini_errors);
  tcase_add_test(tc, test_ini_nul);
  tcase_add_test(tc, test_ini_long_lines);
  tcase_add_test(tc, test_ini_random);
  tcase_add_test(tc, test_parse_file);
  suite_add_tcase(s, tc);

  tc = tcase_create("args");
  tcase_add_test(tc, test_args_basic);
  tcase_add_test(tc, test_args_clamp);
  tcase_add_test(tc, test_args_errors);
  tcase_add_test(tc, test_args_help);
  tcase_add_test(tc, test_args_precedence);
  suite_add_tcase(s, tc);

  tc = tcase_create("reload");
  tcase_add_test(tc, test_reload);
  tcase_add_test(tc, test_reload_each);
  tcase_add_test(tc, test_metrics_listen);
  tcase_add_test(tc, test_listen_fds);
  suite_add_tcase(s, tc);

  tc = tcase_create("writers");
  tcase_add_test(tc, test_dump_roundtrip);
  tcase_add_test(tc, test_help);
  tcase_add_test(tc, test_example_names_every_key);
  tcase_add_test(tc, test_example_uncommented);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_run_suite(config_suite(), CK_ENV); }
