/*
 * conf.c - see conf.h. The table of options comes first; below it are the
 * parsers of each type, the INI reader, the command line, the reload and
 * the writers (--print-config, --help, the manual page qlineard.conf(5)).
 */
#include "conf.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "net/listen.h"
#include "log.h"
#include "ql_defs.h"

#define MAX_FILE_BYTES (64u << 10) /* a config file, whole */
#define MAX_LINE_BYTES 4096u       /* one line, without its line end */
#define MAX_PATH_LEN (PATH_MAX - 256) /* room for the file names below */
#define ECHO_MAX 40 /* bytes of a bad value repeated in a message */

/* Rules of some values beyond their type. */
static void default_socket_dir(char *buf, size_t len);
static int check_device(const char *s, char *why, size_t whylen);
static int check_device_budget(const char *s, char *why, size_t whylen);
static int check_loopback(const char *s, char *why, size_t whylen);

static const ql__opt_name cpu_levels[] = {
    {"auto", QL_CPU_LEVEL_OPT_AUTO},         {"c", QL_CPU_LEVEL_OPT_C},
    {"avx2", QL_CPU_LEVEL_OPT_AVX2},         {"avx2vnni", QL_CPU_LEVEL_OPT_AVX2VNNI},
    {"avx512", QL_CPU_LEVEL_OPT_AVX512},     {NULL, 0},
};

static const ql__opt_name log_levels[] = {
    {"err", QL_LOG_ERR},   {"warning", QL_LOG_WARNING},
    {"notice", QL_LOG_NOTICE}, {"info", QL_LOG_INFO},
    {"debug", QL_LOG_DEBUG},   {NULL, 0},
};

static const ql__opt_name mapped_modes[] = {
    {"off", QL_MAPPED_OFF},
    {"owner", QL_MAPPED_OWNER},
    {"any", QL_MAPPED_ANY},
    {NULL, 0},
};

#define FIELD(f)                                                               \
  .offset = offsetof(ql__config, f), .size = sizeof(((ql__config *)0)->f)

/*
 * The options. Defaults are text in the syntax of the file, written the
 * way ql__option_format() writes them (a unit test checks both, and that
 * deploy/qlineard.conf.example shows each one). Bounds of existing options
 * are those the command line always had; max_message_bytes must leave room
 * for an envelope and a 4 KiB chunk.
 */
static const ql__option options[] = {
    {.name = "socket_dir", .type = QL_OPT_PATH, FIELD(socket_dir),
     .max = MAX_PATH_LEN, .def_fn = default_socket_dir,
     .help = "directory of qlineard.sock, created 0700; default "
             "$XDG_RUNTIME_DIR/qlinear, else /tmp/qlinear-UID"},
    {.name = "admin_dir", .type = QL_OPT_PATH, .flags = QL_OPT_EMPTY_OK,
     FIELD(admin_dir), .max = MAX_PATH_LEN, .def = "",
     .help = "directory of admin.sock, entered only by the admin group; "
             "empty: SOCKET_DIR/admin, made 0700"},
    {.name = "state_dir", .type = QL_OPT_PATH, .flags = QL_OPT_EMPTY_OK,
     FIELD(state_dir), .max = MAX_PATH_LEN, .def = "",
     .help = "persistent weight store (the service uses /var/lib/qlinear); "
             "empty: none"},
    {.name = "required_devices", .type = QL_OPT_LIST,
     FIELD(required_devices), .max = QL_CONFIG_LIST_MAX, .def = "",
     .check = check_device,
     .help = "devices that must be present before the daemon is ready, "
             "e.g. cpu,cuda:0; a missing one is an error"},
    {.name = "cpu_level", .type = QL_OPT_ENUM, FIELD(cpu_level),
     .names = cpu_levels, .def = "auto",
     .help = "highest CPU kernel level to use (auto, avx512, avx2vnni, "
             "avx2, c): lower ones test or work around a level; the "
             "environment's QL_CPU_LEVEL also caps it"},
    {.name = "cpu_threads", .type = QL_OPT_UINT, FIELD(cpu_threads),
     .min = 0, .max = 1024, .def = "0",
     .help = "threads of the CPU device; 0: one per online CPU"},
    {.name = "cpu_budget_bytes", .type = QL_OPT_SIZE, .flags = QL_OPT_LIVE,
     FIELD(cpu_budget_bytes), .min = 0, .max = (uint64_t)1 << 48,
     .def = "0",
     .help = "weight bytes resident on the CPU; a load beyond it fails; "
             "0: no limit"},
    {.name = "accel_budget_percent", .type = QL_OPT_PERCENT,
     .flags = QL_OPT_LIVE, FIELD(accel_budget_percent), .min = 1,
     .max = 10000, .def = "87.5",
     .help = "share of an accelerator's memory that its resident weights "
             "may take (the rest is left for scratch memory, the driver's "
             "context and other processes); a load beyond it fails"},
    {.name = "device_budget_bytes", .type = QL_OPT_LIST,
     .flags = QL_OPT_LIVE | QL_OPT_KEYED, FIELD(device_budget_bytes),
     .max = QL_CONFIG_LIST_MAX, .def = "", .check = check_device_budget,
     .help = "weight budgets of single accelerators, instead of "
             "accel_budget_percent: DEVICE=SIZE,... by name or alias, e.g. "
             "cuda:0=8G (the CPU's is cpu_budget_bytes)"},
    {.name = "kernel_timeout_ms", .type = QL_OPT_DURATION,
     FIELD(kernel_timeout_ms), .min = 100, .max = 3600000, .def = "10s",
     .help = "an accelerator launch not finished by then takes its device "
             "out of service (its requests fail, the others keep serving)"},
    {.name = "batches_in_flight", .type = QL_OPT_UINT,
     FIELD(batches_in_flight), .min = 1, .max = 3, .def = "2",
     .help = "batches one GPU runs at once, each on its own worker "
             "thread, stream and scratch (the CPU and Level Zero run one)"},
    {.name = "max_message_bytes", .type = QL_OPT_SIZE,
     FIELD(max_message_bytes), .min = QL_ENVELOPE_BYTES + 4096,
     .max = 1u << 30, .def = "64M",
     .help = "larger messages are refused"},
    {.name = "max_connections", .type = QL_OPT_UINT,
     FIELD(max_connections), .min = 1, .max = 1u << 20, .def = "4096",
     .help = "connections to the request and admin sockets, each, open at "
             "once; a connection past it is closed at once"},
    {.name = "max_connections_per_uid", .type = QL_OPT_UINT,
     FIELD(max_connections_per_uid), .min = 1, .max = 1u << 20,
     .def = "1024",
     .help = "of those, connections of one user (the peer's uid)"},
    {.name = "max_sessions_per_uid", .type = QL_OPT_UINT,
     FIELD(max_sessions_per_uid), .min = 1, .max = QL_SESSIONS_MAX,
     .def = "64",
     .help = "sessions of one user (the peer's uid) open at once, of the "
             "256 the daemon keeps; one past it is refused"},
    {.name = "frame_timeout_ms", .type = QL_OPT_DURATION,
     FIELD(frame_timeout_ms), .min = 1, .max = 3600000, .def = "30s",
     .help = "a connection that leaves a message half sent, or a reply "
             "unread, this long is closed"},
    {.name = "max_buffered_bytes", .type = QL_OPT_SIZE,
     FIELD(max_buffered_bytes), .min = 1, .max = (uint64_t)1 << 40,
     .def = "1G",
     .help = "bytes of messages half received and replies not yet read, "
             "all connections of a socket together (at least two "
             "messages); a connection that would pass it is closed"},
    {.name = "max_chunk_bytes", .type = QL_OPT_SIZE, FIELD(max_chunk_bytes),
     .min = 1024, .max = 1u << 30, .def = "4M",
     .help = "largest upload chunk; at most max_message_bytes - 4K"},
    {.name = "max_upload_bytes", .type = QL_OPT_SIZE, .flags = QL_OPT_LIVE,
     FIELD(max_upload_bytes), .min = 1, .max = (uint64_t)1 << 44,
     .def = "4G", .help = "all uploads in progress together"},
    {.name = "upload_idle_ms", .type = QL_OPT_DURATION, .flags = QL_OPT_LIVE,
     FIELD(upload_idle_ms), .min = 1, .max = 86400000, .def = "2min",
     .help = "an upload idle this long is dropped"},
    {.name = "session_lease_ms", .type = QL_OPT_DURATION,
     .flags = QL_OPT_LIVE, FIELD(session_lease_ms), .min = 0,
     .max = 604800000, .def = "0",
     .help = "a session with no request for this long is ended (a "
             "backstop: a session ends when its socket closes); 0: never"},
    {.name = "ring_spin_us", .type = QL_OPT_UINT, .flags = QL_OPT_LIVE,
     FIELD(ring_spin_us), .min = 0, .max = 100000, .def = "200",
     .help = "the loop keeps polling a session's ring this long after its "
             "last request or reply before it sleeps on the ring's "
             "doorbell: a client sending one request after another finds "
             "it awake; 0: sleep at once"},
    {.name = "max_queue", .type = QL_OPT_UINT, .flags = QL_OPT_LIVE,
     FIELD(max_queue), .min = 1, .max = 1u << 20, .def = "1024",
     .help = "waiting requests per (weight, device, path) queue; a full "
             "queue answers RESOURCE_EXHAUSTED"},
    {.name = "session_max_requests", .type = QL_OPT_UINT,
     .flags = QL_OPT_LIVE, FIELD(session_max_requests), .min = 0,
     .max = 1u << 20, .def = "256",
     .help = "requests of one session waiting or running at once; 0: no "
             "quota"},
    {.name = "max_batch_rows", .type = QL_OPT_UINT, .flags = QL_OPT_LIVE,
     FIELD(max_batch_rows), .min = 1, .max = 1u << 20, .def = "512",
     .help = "rows of waiting requests coalesced into one launch"},
    {.name = "decode_max_rows", .type = QL_OPT_UINT, .flags = QL_OPT_LIVE,
     FIELD(decode_max_rows), .min = 1, .max = 1u << 20, .def = "8",
     .help = "requests of at most this many rows are decode work, run "
             "before prefill work (larger requests)"},
    {.name = "prefill_chunk_rows", .type = QL_OPT_UINT, .flags = QL_OPT_LIVE,
     FIELD(prefill_chunk_rows), .min = 0, .max = 1u << 20, .def = "0",
     .help = "the most rows of one launch of prefill work, always; 0: no "
             "bound but max_batch_rows"},
    {.name = "prefill_chunk_us", .type = QL_OPT_UINT, .flags = QL_OPT_LIVE,
     FIELD(prefill_chunk_us), .min = 0, .max = 10000000, .def = "1000",
     .help = "while decode work is about on a device of one lane, a "
             "prefill launch stops for it (the CPU) or takes the most rows "
             "whose measured time fits this many microseconds, so decode "
             "waits about that long at most; 0: prefill runs whole"},
    {.name = "max_queue_delay_us", .type = QL_OPT_UINT, .flags = QL_OPT_LIVE,
     FIELD(max_queue_delay_us), .min = 0, .max = 1000000, .def = "0",
     .help = "a batch smaller than max_batch_rows may wait this long for "
             "more requests; 0: never waits"},
    {.name = "decode_hold_us", .type = QL_OPT_UINT, .flags = QL_OPT_LIVE,
     FIELD(decode_hold_us), .min = 0, .max = 1000000, .def = "1000",
     .help = "after a decode launch, the next one of that weight may wait "
             "up to this long for the answered clients' next rows, while "
             "the weight's launch times say one launch of them all saves "
             "more than the wait; 0: never waits"},
    {.name = "max_queued_bytes", .type = QL_OPT_SIZE, .flags = QL_OPT_LIVE,
     FIELD(max_queued_bytes), .min = 1u << 20, .max = (uint64_t)1 << 44,
     .def = "1G", .help = "tensor bytes held by waiting requests"},
    {.name = "uid_share", .type = QL_OPT_UINT, .flags = QL_OPT_LIVE,
     FIELD(uid_share), .min = 1, .max = 100, .def = "50",
     .help = "percent of a budget all users share that one user (uid) may "
             "hold: of max_upload_bytes, of the uploads in progress and of "
             "max_buffered_bytes (at least two messages; this one as it "
             "was at start) always; of max_queued_bytes and max_queue (its "
             "queued requests on all weights together) while sessions of "
             "two or more users are open"},
    {.name = "max_pinned_bytes", .type = QL_OPT_SIZE, .flags = QL_OPT_LIVE,
     FIELD(max_pinned_bytes), .min = 0, .max = (uint64_t)1 << 44,
     .def = "8G",
     .help = "bytes of sessions' regions the daemon page-locks for the "
             "devices' DMA, over every session (a region past it is not "
             "locked: its tensors are staged); 0: none"},
    {.name = "crossover_rows", .type = QL_OPT_UINT, .flags = QL_OPT_LIVE,
     FIELD(crossover_rows), .min = 0, .max = 1u << 30, .def = "0",
     .help = "AUTO path: requests with fewer rows run weight-only; 0: "
             "measured per weight shape after start (and cached in "
             "state_dir)"},
    {.name = "crossover_default_rows", .type = QL_OPT_UINT,
     .flags = QL_OPT_LIVE, FIELD(crossover_default_rows), .min = 1,
     .max = 1u << 30, .def = "16",
     .help = "the crossover of a shape not measured yet"},
    {.name = "drain_ms", .type = QL_OPT_DURATION, .flags = QL_OPT_LIVE,
     FIELD(drain_ms), .min = 0, .max = 3600000, .def = "30s",
     .help = "at shutdown, queued work not started by then is refused"},
    {.name = "mapped_mode", .type = QL_OPT_ENUM, .flags = QL_OPT_LIVE,
     FIELD(mapped_mode), .names = mapped_modes, .def = "owner",
     .help = "which sessions may map the GPU layout of a weight they hold "
             "into their own process (MapWeight): owner, those of the "
             "daemon's own user or root; any, every session; off, none. A "
             "mapping client could change the weight for every client"},
    {.name = "metrics_listen", .type = QL_OPT_ADDRESS,
     .flags = QL_OPT_EMPTY_OK, FIELD(metrics_listen),
     .max = QL_LISTEN_ADDR_MAX, .def = "", .check = check_loopback,
     .help = "serve Prometheus metrics over HTTP at /metrics on this "
             "loopback address (127.0.0.0/8, [::1] or localhost) and port, "
             "e.g. 127.0.0.1:9464; every local user can read them. Empty: "
             "no listener, unless systemd hands over a socket named "
             "metrics (qlineard-metrics.socket), which is served instead"},
    {.name = "metrics_weights", .type = QL_OPT_UINT, .flags = QL_OPT_LIVE,
     FIELD(metrics_weights), .min = 0, .max = QL_METRICS_WEIGHTS_MAX,
     .def = "0",
     .help = "weights named in the metrics: the N with the most requests "
             "get a few series each, labelled by weight name; 0: no weight "
             "names, only totals per daemon, device, format and path"},
    {.name = "log_level", .type = QL_OPT_ENUM, .flags = QL_OPT_LIVE,
     FIELD(log_level), .names = log_levels, .def = "info",
     .help = "lines less important than this are dropped"},
};

#define N_OPTIONS (sizeof options / sizeof options[0])

const ql__option *ql__config_options(size_t *count) {
  *count = N_OPTIONS;
  return options;
}

/* ------------------------------------------------------------- helpers */

static int is_blank(char c) { return c == ' ' || c == '\t'; }
static int is_digit(char c) { return c >= '0' && c <= '9'; }
static char to_lower(char c) { return c >= 'A' && c <= 'Z' ? c + 32 : c; }

/* strcasecmp for ASCII, whatever the locale. */
static int ascii_caseeq(const char *a, const char *b) {
  for (; *a != '\0' && to_lower(*a) == to_lower(*b); a++, b++)
    ;
  return *a == '\0' && *b == '\0';
}

/* The name of option o with '_' replaced by '-' (a command-line name). */
static void dashed(const ql__option *o, char *buf, size_t len) {
  size_t i;
  for (i = 0; o->name[i] != '\0' && i + 1 < len; i++)
    buf[i] = o->name[i] == '_' ? '-' : o->name[i];
  buf[i] = '\0';
}

/* s, shortened and made printable, for a message: input is untrusted and
 * messages end up in the journal. */
static const char *echo(const char *s, char *buf, size_t len) {
  size_t i, n = 0;
  for (i = 0; s[i] != '\0' && n + 4 < len && i < ECHO_MAX; i++) {
    unsigned char c = (unsigned char)s[i];
    buf[n++] = c < 0x20 || c == 0x7f ? '?' : (char)c;
  }
  if (s[i] != '\0' && n + 4 <= len) {
    memcpy(buf + n, "...", 3);
    n += 3;
  }
  buf[n] = '\0';
  return buf;
}

/* A bounded string builder: appends what fits, then "...". */
typedef struct sbuf {
  char *buf;
  size_t len, pos;
} sbuf;

__attribute__((format(printf, 2, 3))) static void sb_printf(sbuf *b,
                                                            const char *fmt,
                                                            ...) {
  va_list ap;
  if (b->len == 0 || b->pos >= b->len)
    return;
  va_start(ap, fmt);
  int n = vsnprintf(b->buf + b->pos, b->len - b->pos, fmt, ap);
  va_end(ap);
  if (n < 0)
    return;
  if ((size_t)n >= b->len - b->pos) {
    b->pos = b->len;
    if (b->len >= 4)
      memcpy(b->buf + b->len - 4, "...", 4);
    return;
  }
  b->pos += (size_t)n;
}

/* Unsigned numbers live in fields of 4 or 8 bytes (uint32_t, uint64_t,
 * size_t); the table's bounds keep every value within its field. */
static uint64_t load_u(const void *field, size_t size) {
  if (size == sizeof(uint32_t)) {
    uint32_t v;
    memcpy(&v, field, sizeof v);
    return v;
  }
  uint64_t v;
  memcpy(&v, field, sizeof v);
  return v;
}

static void store_u(void *field, size_t size, uint64_t v) {
  if (size == sizeof(uint32_t)) {
    uint32_t w = (uint32_t)v;
    memcpy(field, &w, sizeof w);
  } else {
    memcpy(field, &v, sizeof v);
  }
}

/* ------------------------------------------------------------- numbers */

typedef struct unit {
  const char *suffix; /* compared without case */
  uint64_t mult;
} unit;

static const unit no_units[] = {{"", 1}, {NULL, 0}};
static const unit size_units[] = {
    {"", 1},
    {"K", 1ull << 10}, {"KiB", 1ull << 10},
    {"M", 1ull << 20}, {"MiB", 1ull << 20},
    {"G", 1ull << 30}, {"GiB", 1ull << 30},
    {"T", 1ull << 40}, {"TiB", 1ull << 40},
    {NULL, 0},
};
static const unit time_units[] = {
    {"", 1}, {"ms", 1}, {"s", 1000}, {"min", 60000}, {"h", 3600000},
    {NULL, 0},
};

/* v with the largest suffix of units that divides it exactly: "64M",
 * "2min", "0". Suffixes are taken from the one-letter spellings. */
static void format_units(uint64_t v, const unit *units, char *buf,
                         size_t len) {
  const unit *best = &units[0];
  for (const unit *u = units; u->suffix != NULL; u++)
    if (v != 0 && v % u->mult == 0 && u->mult > best->mult)
      best = u;
  snprintf(buf, len, "%" PRIu64 "%s", v / best->mult, best->suffix);
}

static const unit *units_of(ql__opt_type t) {
  return t == QL_OPT_SIZE ? size_units
         : t == QL_OPT_DURATION ? time_units
                                : no_units;
}

/* What a number of type t looks like, for messages. */
static const char *number_kind(ql__opt_type t) {
  return t == QL_OPT_SIZE ? "a size (an integer with an optional K, M, G or "
                            "T suffix)"
         : t == QL_OPT_DURATION ? "a duration (an integer with an optional "
                                  "ms, s, min or h suffix)"
                                : "an integer";
}

/*
 * UINT, SIZE, DURATION: digits, then a suffix of the type's list. Written
 * out rather than strtoull, which accepts blanks, signs and hex and
 * saturates. A minus sign in front of digits is a range error (the value
 * is a number, just not one in range).
 */
static int parse_number(const ql__option *o, const char *v, void *field,
                        char *why, size_t whylen) {
  const unit *units = units_of(o->type);
  const char *s = v;
  char e[ECHO_MAX + 8], lo[32], hi[32];
  int negative = 0, overflow = 0;
  uint64_t n = 0;

  if (*s == '\0') {
    snprintf(why, whylen, "empty value (expected %s)", number_kind(o->type));
    return QL_EINVAL;
  }
  if (*s == '-') {
    negative = 1;
    s++;
  }
  if (!is_digit(*s))
    goto syntax;
  for (; is_digit(*s); s++) {
    unsigned d = (unsigned)(*s - '0');
    if (n > (UINT64_MAX - d) / 10)
      overflow = 1;
    else
      n = n * 10 + d;
  }
  const unit *u;
  for (u = units; u->suffix != NULL; u++)
    if (ascii_caseeq(s, u->suffix))
      break;
  if (u->suffix == NULL) {
    if (o->type == QL_OPT_SIZE && s[0] != '\0' && ascii_caseeq(s + 1, "B") &&
        strchr("kKmMgGtT", s[0]) != NULL) {
      snprintf(why, whylen, "'%s' is ambiguous: write %c or %ciB (binary)",
               echo(v, e, sizeof e), s[0], s[0]);
      return QL_EINVAL;
    }
    goto syntax;
  }
  if (n > UINT64_MAX / u->mult)
    overflow = 1;
  n *= u->mult;
  if (negative || overflow || n < o->min || n > o->max) {
    format_units(o->min, units, lo, sizeof lo);
    format_units(o->max, units, hi, sizeof hi);
    snprintf(why, whylen, "%s is not in [%s, %s]", echo(v, e, sizeof e), lo,
             hi);
    return QL_EINVAL;
  }
  store_u(field, o->size, n);
  return 0;
syntax:
  snprintf(why, whylen, "'%s' is not %s", echo(v, e, sizeof e),
           number_kind(o->type));
  return QL_EINVAL;
}

static void format_number(const ql__option *o, const void *field, char *buf,
                          size_t len) {
  format_units(load_u(field, o->size), units_of(o->type), buf, len);
}

/* ------------------------------------------------------------ percents */

/* Hundredths of a percent as the shortest text that reads back the same:
 * 8750 -> "87.5", 10000 -> "100", 1 -> "0.01". */
static void format_percent_value(uint64_t v, char *buf, size_t len) {
  if (v % 100 == 0)
    snprintf(buf, len, "%" PRIu64, v / 100);
  else if (v % 10 == 0)
    snprintf(buf, len, "%" PRIu64 ".%" PRIu64, v / 100, v % 100 / 10);
  else
    snprintf(buf, len, "%" PRIu64 ".%02" PRIu64, v / 100, v % 100);
}

/*
 * PERCENT: digits, then optionally '.' and one or two digits, then an
 * optional '%': "87.5", "50%", "12.25". Kept in hundredths of a percent so
 * that the value and its text round-trip exactly (no binary fraction).
 */
static int parse_percent(const ql__option *o, const char *v, void *field,
                         char *why, size_t whylen) {
  char e[ECHO_MAX + 8];
  const char *s = v;
  uint64_t n = 0;
  int frac = 0;
  if (!is_digit(*s))
    goto syntax;
  for (; is_digit(*s); s++) {
    n = n * 10 + (unsigned)(*s - '0');
    if (n > 100000) /* far past any bound: stop before it can wrap */
      goto range;
  }
  n *= 100;
  if (*s == '.') {
    s++;
    if (!is_digit(*s))
      goto syntax;
    for (; is_digit(*s); s++, frac++) {
      if (frac == 2)
        goto syntax;
      n += (unsigned)(*s - '0') * (frac == 0 ? 10u : 1u);
    }
  }
  if (*s == '%')
    s++;
  if (*s != '\0')
    goto syntax;
  if (n < o->min || n > o->max)
    goto range;
  store_u(field, o->size, n);
  return 0;
range: {
  char lo[32], hi[32];
  format_percent_value(o->min, lo, sizeof lo);
  format_percent_value(o->max, hi, sizeof hi);
  snprintf(why, whylen, "%s is not in [%s, %s]", echo(v, e, sizeof e), lo,
           hi);
  return QL_EINVAL;
}
syntax:
  snprintf(why, whylen, "'%s' is not a percentage (e.g. 87.5, at most two "
           "decimals)", echo(v, e, sizeof e));
  return QL_EINVAL;
}

/* o's bounds as its values are written (with units, or as a percent)
 * into lo and hi (len bytes each); 0 when o has no numeric range. The
 * --help text and qlineard.conf(5) both print them. */
static int format_bounds(const ql__option *o, char *lo, char *hi, size_t len) {
  if (o->type == QL_OPT_UINT || o->type == QL_OPT_SIZE ||
      o->type == QL_OPT_DURATION) {
    format_units(o->min, units_of(o->type), lo, len);
    format_units(o->max, units_of(o->type), hi, len);
    return 1;
  }
  if (o->type == QL_OPT_PERCENT) {
    format_percent_value(o->min, lo, len);
    format_percent_value(o->max, hi, len);
    return 1;
  }
  return 0;
}

static void format_percent(const ql__option *o, const void *field, char *buf,
                           size_t len) {
  format_percent_value(load_u(field, o->size), buf, len);
}

/* --------------------------------------------------------------- paths */

/* A character a path option may hold: anything printable but '"', which
 * could not be written back inside quotes. */
static int path_char_ok(unsigned char c) {
  return c >= 0x20 && c != 0x7f && c != '"';
}

static int parse_path(const ql__option *o, const char *v, void *field,
                      char *why, size_t whylen) {
  char e[ECHO_MAX + 8];
  size_t n = strlen(v);
  if (n == 0) {
    if (o->flags & QL_OPT_EMPTY_OK) {
      memset(field, 0, 1);
      return 0;
    }
    snprintf(why, whylen, "empty value (expected an absolute path)");
    return QL_EINVAL;
  }
  if (v[0] != '/') {
    snprintf(why, whylen, "'%s' is not an absolute path", echo(v, e, sizeof e));
    return QL_EINVAL;
  }
  if (n > o->max || n >= o->size) {
    snprintf(why, whylen, "path longer than %" PRIu64 " bytes", o->max);
    return QL_EINVAL;
  }
  for (size_t i = 0; i < n; i++)
    if (!path_char_ok((unsigned char)v[i])) {
      snprintf(why, whylen, "'%s': control character or '\"' in a path",
               echo(v, e, sizeof e));
      return QL_EINVAL;
    }
  if (o->check != NULL && o->check(v, why, whylen) != 0)
    return QL_EINVAL;
  memcpy(field, v, n + 1);
  return 0;
}

static void format_path(const ql__option *o, const void *field, char *buf,
                        size_t len) {
  snprintf(buf, len, "%.*s", (int)o->size, (const char *)field);
}

/* ------------------------------------------------------------ addresses */

/* ADDRESS: "" (none, with QL_OPT_EMPTY_OK) or a HOST:PORT that the
 * option's check accepts (metrics_listen: loopback only, listen.h). */
static int parse_address(const ql__option *o, const char *v, void *field,
                         char *why, size_t whylen) {
  char e[ECHO_MAX + 8];
  size_t n = strlen(v);
  if (n == 0) {
    if (o->flags & QL_OPT_EMPTY_OK) {
      memset(field, 0, 1);
      return 0;
    }
    snprintf(why, whylen, "empty value (expected HOST:PORT)");
    return QL_EINVAL;
  }
  for (size_t i = 0; i < n; i++)
    if (!path_char_ok((unsigned char)v[i])) {
      snprintf(why, whylen, "'%s': control character or '\"' in an address",
               echo(v, e, sizeof e));
      return QL_EINVAL;
    }
  if (n > o->max || n >= o->size) {
    snprintf(why, whylen, "'%s' is longer than %" PRIu64 " bytes",
             echo(v, e, sizeof e), o->max);
    return QL_EINVAL;
  }
  if (o->check != NULL && o->check(v, why, whylen) != 0)
    return QL_EINVAL;
  memcpy(field, v, n + 1);
  return 0;
}

static int check_loopback(const char *s, char *why, size_t whylen) {
  return ql__listen_parse_loopback(s, NULL, NULL, why, whylen) != 0
             ? QL_EINVAL
             : 0;
}

/* The default socket directory: the rule of ql_default_address(), which
 * the client follows too, as long as it makes a valid path. */
static void default_socket_dir(char *buf, size_t len) {
  const char *xdg = getenv("XDG_RUNTIME_DIR");
  if (xdg != NULL && xdg[0] == '/' &&
      strlen(xdg) + sizeof "/qlinear" - 1 <= MAX_PATH_LEN) {
    size_t i;
    for (i = 0; xdg[i] != '\0' && path_char_ok((unsigned char)xdg[i]); i++)
      ;
    if (xdg[i] == '\0' &&
        (size_t)snprintf(buf, len, "%s/qlinear", xdg) < len)
      return;
  }
  snprintf(buf, len, "/tmp/qlinear-%u", (unsigned)getuid());
}

/* ------------------------------------------------------- bools, enums */

static const ql__opt_name bool_names[] = {
    {"yes", 1}, {"no", 0}, {"true", 1}, {"false", 0},
    {"on", 1},  {"off", 0}, {"1", 1},   {"0", 0},
    {NULL, 0},
};

static int parse_bool(const ql__option *o, const char *v, void *field,
                      char *why, size_t whylen) {
  char e[ECHO_MAX + 8];
  (void)o;
  for (const ql__opt_name *b = bool_names; b->name != NULL; b++)
    if (ascii_caseeq(v, b->name)) {
      bool x = b->value != 0;
      memcpy(field, &x, sizeof x);
      return 0;
    }
  snprintf(why, whylen, "'%s' is not yes/no, true/false, on/off or 1/0",
           echo(v, e, sizeof e));
  return QL_EINVAL;
}

static void format_bool(const ql__option *o, const void *field, char *buf,
                        size_t len) {
  bool x;
  (void)o;
  memcpy(&x, field, sizeof x);
  snprintf(buf, len, "%s", x ? "yes" : "no");
}

static int parse_enum(const ql__option *o, const char *v, void *field,
                      char *why, size_t whylen) {
  char e[ECHO_MAX + 8];
  sbuf b = {why, whylen, 0};
  for (const ql__opt_name *n = o->names; n->name != NULL; n++)
    if (ascii_caseeq(v, n->name)) {
      memcpy(field, &n->value, sizeof n->value);
      return 0;
    }
  sb_printf(&b, "'%s' is not one of", echo(v, e, sizeof e));
  for (const ql__opt_name *n = o->names; n->name != NULL; n++)
    sb_printf(&b, "%s %s", n == o->names ? "" : ",", n->name);
  return QL_EINVAL;
}

static void format_enum(const ql__option *o, const void *field, char *buf,
                        size_t len) {
  int x;
  memcpy(&x, field, sizeof x);
  for (const ql__opt_name *n = o->names; n->name != NULL; n++)
    if (n->value == x) {
      snprintf(buf, len, "%s", n->name);
      return;
    }
  snprintf(buf, len, "%d", x); /* not reachable from the parsers */
}

/* --------------------------------------------------------------- lists */

/* A device name as DESIGN §1 spells them: a backend kind, then optionally
 * ':' and an index or a UUID: cpu, cuda:0, cuda:GPU-8f3c..., ze:1. Whether
 * the device exists is checked at start, not here. */
static int check_device(const char *s, char *why, size_t whylen) {
  char e[ECHO_MAX + 8];
  const char *p = s;
  if (!(*p >= 'a' && *p <= 'z'))
    goto bad;
  while ((*p >= 'a' && *p <= 'z') || is_digit(*p))
    p++;
  if (*p == ':') {
    if (*++p == '\0')
      goto bad;
    for (; *p != '\0'; p++)
      if (!(is_digit(*p) || (*p >= 'a' && *p <= 'z') ||
            (*p >= 'A' && *p <= 'Z') || *p == '-'))
        goto bad;
  }
  if (*p == '\0')
    return 0;
bad:
  snprintf(why, whylen, "'%s' is not a device name (cpu, cuda:0, "
           "cuda:GPU-<uuid>, ze:0, ...)", echo(s, e, sizeof e));
  return QL_EINVAL;
}

/* The size syntax of a SIZE option, for values inside list items. */
static const ql__option budget_size = {.name = "budget", .type = QL_OPT_SIZE,
                                       .size = sizeof(uint64_t), .min = 1,
                                       .max = (uint64_t)1 << 48};

int ql__config_device_budget(const char *item, char *dev, size_t devlen,
                             uint64_t *bytes, char *why, size_t whylen) {
  char e[ECHO_MAX + 8], name[QL_CONFIG_ITEM_MAX], w[160];
  const char *eq = strchr(item, '=');
  size_t n = eq != NULL ? (size_t)(eq - item) : 0;
  uint64_t v = 0;
  if (eq == NULL || n == 0 || n >= sizeof name) {
    snprintf(why, whylen, "'%s' is not DEVICE=SIZE (e.g. cuda:0=8G)",
             echo(item, e, sizeof e));
    return QL_EINVAL;
  }
  memcpy(name, item, n);
  name[n] = '\0';
  while (n > 0 && is_blank(name[n - 1]))
    name[--n] = '\0';
  const char *val = eq + 1;
  while (is_blank(*val))
    val++;
  if (check_device(name, why, whylen) != 0)
    return QL_EINVAL;
  if (strcmp(name, "cpu") == 0) {
    snprintf(why, whylen, "cpu: the CPU's budget is cpu_budget_bytes");
    return QL_EINVAL;
  }
  if (parse_number(&budget_size, val, &v, w, sizeof w) != 0) {
    snprintf(why, whylen, "%s: %s", name, w);
    return QL_EINVAL;
  }
  if (dev != NULL)
    snprintf(dev, devlen, "%s", name);
  if (bytes != NULL)
    *bytes = v;
  return 0;
}

static int check_device_budget(const char *s, char *why, size_t whylen) {
  return ql__config_device_budget(s, NULL, 0, NULL, why, whylen);
}

/* The key of a KEYED list item: what comes before '=', without blanks. */
static void item_key(const char *item, char *key, size_t len) {
  size_t n = strcspn(item, "=");
  while (n > 0 && is_blank(item[n - 1]))
    n--;
  if (n >= len)
    n = len - 1;
  memcpy(key, item, n);
  key[n] = '\0';
}

/* Comma-separated items, blanks around each one ignored; "" is the empty
 * list. Parsed into a copy so that a bad item changes nothing. */
static int parse_list(const ql__option *o, const char *v, void *field,
                      char *why, size_t whylen) {
  ql__config_list l;
  char e[ECHO_MAX + 8];
  const char *p = v;

  memset(&l, 0, sizeof l);
  while (is_blank(*p))
    p++;
  while (*p != '\0') {
    const char *end = strchr(p, ',');
    size_t n = end != NULL ? (size_t)(end - p) : strlen(p);
    char item[QL_CONFIG_ITEM_MAX];
    while (n > 0 && is_blank(p[n - 1]))
      n--;
    if (n == 0) {
      snprintf(why, whylen, "empty item in the list");
      return QL_EINVAL;
    }
    if (n >= sizeof item) {
      snprintf(why, whylen, "list item longer than %zu bytes",
               sizeof item - 1);
      return QL_EINVAL;
    }
    memcpy(item, p, n);
    item[n] = '\0';
    if (o->check != NULL && o->check(item, why, whylen) != 0)
      return QL_EINVAL;
    for (unsigned i = 0; i < l.n; i++) {
      char a[QL_CONFIG_ITEM_MAX], b[QL_CONFIG_ITEM_MAX];
      if (o->flags & QL_OPT_KEYED) {
        item_key(l.item[i], a, sizeof a);
        item_key(item, b, sizeof b);
      } else {
        snprintf(a, sizeof a, "%s", l.item[i]);
        snprintf(b, sizeof b, "%s", item);
      }
      if (strcmp(a, b) == 0) {
        snprintf(why, whylen, "'%s' is listed twice", echo(b, e, sizeof e));
        return QL_EINVAL;
      }
    }
    if (l.n >= o->max || l.n >= QL_CONFIG_LIST_MAX) {
      snprintf(why, whylen, "more than %" PRIu64 " items", o->max);
      return QL_EINVAL;
    }
    memcpy(l.item[l.n++], item, n + 1);
    if (end == NULL)
      break;
    p = end + 1;
    while (is_blank(*p))
      p++;
    if (*p == '\0') {
      snprintf(why, whylen, "empty item in the list");
      return QL_EINVAL;
    }
  }
  memcpy(field, &l, sizeof l);
  return 0;
}

static void format_list(const ql__option *o, const void *field, char *buf,
                        size_t len) {
  ql__config_list l;
  sbuf b = {buf, len, 0};
  (void)o;
  memcpy(&l, field, sizeof l);
  if (len > 0)
    buf[0] = '\0';
  for (unsigned i = 0; i < l.n && i < QL_CONFIG_LIST_MAX; i++)
    sb_printf(&b, "%s%.*s", i ? "," : "", QL_CONFIG_ITEM_MAX - 1, l.item[i]);
}

/* --------------------------------------------------------------- types */

typedef struct type_ops {
  const char *metavar; /* for --help */
  int (*parse)(const ql__option *o, const char *v, void *field, char *why,
               size_t whylen);
  void (*format)(const ql__option *o, const void *field, char *buf,
                 size_t len);
} type_ops;

static const type_ops types[QL_OPT_TYPE_COUNT_] = {
    [QL_OPT_PATH] = {"PATH", parse_path, format_path},
    [QL_OPT_UINT] = {"N", parse_number, format_number},
    [QL_OPT_SIZE] = {"SIZE", parse_number, format_number},
    [QL_OPT_DURATION] = {"TIME", parse_number, format_number},
    [QL_OPT_BOOL] = {"yes|no", parse_bool, format_bool},
    [QL_OPT_ENUM] = {NULL, parse_enum, format_enum},
    [QL_OPT_LIST] = {"A,B,...", parse_list, format_list},
    [QL_OPT_PERCENT] = {"PERCENT", parse_percent, format_percent},
    [QL_OPT_ADDRESS] = {"HOST:PORT", parse_address, format_path},
};

int ql__option_parse(const ql__option *o, const char *value, void *base,
                     char *why, size_t whylen) {
  char dummy[1];
  if (why == NULL || whylen == 0) {
    why = dummy;
    whylen = sizeof dummy;
  }
  why[0] = '\0';
  if (o == NULL || value == NULL || base == NULL ||
      (unsigned)o->type >= QL_OPT_TYPE_COUNT_) {
    snprintf(why, whylen, "invalid argument");
    return QL_EINVAL;
  }
  return types[o->type].parse(o, value, (char *)base + o->offset, why, whylen);
}

void ql__option_format(const ql__option *o, const void *base, char *buf,
                       size_t len) {
  if (len == 0)
    return;
  buf[0] = '\0';
  if ((unsigned)o->type < QL_OPT_TYPE_COUNT_)
    types[o->type].format(o, (const char *)base + o->offset, buf, len);
}

/* --------------------------------------------------------------- table */

const ql__option *ql__config_find(const char *name) {
  if (name == NULL)
    return NULL;
  for (size_t i = 0; i < N_OPTIONS; i++) {
    const char *a = options[i].name, *b = name;
    for (; *a != '\0' && (*a == *b || (*a == '_' && *b == '-')); a++, b++)
      ;
    if (*a == '\0' && *b == '\0')
      return &options[i];
  }
  return NULL;
}

/* A default that does not parse is a bug in the table, which the unit
 * test would have caught: input cannot make this fail. */
void ql__config_init_defaults(ql__config *cfg) {
  char buf[PATH_MAX], why[256];
  memset(cfg, 0, sizeof *cfg);
  for (size_t i = 0; i < N_OPTIONS; i++) {
    const ql__option *o = &options[i];
    const char *def = o->def;
    if (def == NULL) {
      o->def_fn(buf, sizeof buf);
      def = buf;
    }
    int rc = ql__option_parse(o, def, cfg, why, sizeof why);
    assert(rc == 0);
    (void)rc;
  }
}

int ql__config_set(ql__config *cfg, const char *key, const char *value,
                   char *err, size_t errlen) {
  char e[ECHO_MAX + 8], why[256];
  const ql__option *o = ql__config_find(key);
  if (o == NULL) {
    snprintf(err, errlen, "unknown option '%s'",
             echo(key != NULL ? key : "", e, sizeof e));
    return QL_EINVAL;
  }
  if (ql__option_parse(o, value, cfg, why, sizeof why) != 0) {
    snprintf(err, errlen, "%s: %s", echo(key, e, sizeof e), why);
    return QL_EINVAL;
  }
  return 0;
}

/* ---------------------------------------------------------------- INI */

typedef struct ini {
  const char *name; /* of the file, for messages */
  unsigned line;
  int in_section; /* inside [qlineard] */
  unsigned seen[N_OPTIONS]; /* line that set each option, 0 if none */
  ql__config *cfg;
  char *err;
  size_t errlen;
} ini;

__attribute__((format(printf, 2, 3))) static int ini_error(ini *p,
                                                           const char *fmt,
                                                           ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (p->line == 0) /* about the whole file */
    snprintf(p->err, p->errlen, "%s: %s", p->name, msg);
  else
    snprintf(p->err, p->errlen, "%s:%u: %s", p->name, p->line, msg);
  return QL_EINVAL;
}

/* Where an unquoted value ends: at a '#' or ';' that begins it or follows
 * a blank (so "a#b" keeps its '#'), else at its end. */
static char *value_end(char *v) {
  for (char *p = v; *p != '\0'; p++)
    if ((*p == '#' || *p == ';') && (p == v || is_blank(p[-1])))
      return p;
  return v + strlen(v);
}

static int is_comment_or_empty(const char *s) {
  while (is_blank(*s))
    s++;
  return *s == '\0' || *s == '#' || *s == ';';
}

/* One line, NUL-terminated, without its line end; modified in place. */
static int ini_line(ini *p, char *s) {
  char e[ECHO_MAX + 8], why[256];
  while (is_blank(*s))
    s++;
  char *end = s + strlen(s);
  while (end > s && is_blank(end[-1]))
    *--end = '\0';
  if (*s == '\0' || *s == '#' || *s == ';')
    return 0;

  if (*s == '[') {
    char *close = strchr(s, ']');
    if (close == NULL)
      return ini_error(p, "malformed section header (no ']')");
    if (!is_comment_or_empty(close + 1))
      return ini_error(p, "text after the section header");
    *close = '\0';
    char *name = s + 1;
    while (is_blank(*name))
      name++;
    for (char *t = close; t > name && is_blank(t[-1]);)
      *--t = '\0';
    if (strcmp(name, "qlineard") != 0)
      return ini_error(p, "unknown section [%s] (only [qlineard] is known)",
                       echo(name, e, sizeof e));
    p->in_section = 1;
    return 0;
  }

  char *eq = strchr(s, '=');
  if (eq == NULL)
    return ini_error(p, "expected 'key = value'");
  char *key = s, *v = eq + 1;
  for (char *t = eq; t > key && is_blank(t[-1]);)
    *--t = '\0';
  *eq = '\0';
  if (*key == '\0')
    return ini_error(p, "no key before '='");

  /* An exact key: dashes are for the command line. */
  const ql__option *o = ql__config_find(key);
  if (o == NULL || strcmp(o->name, key) != 0) {
    if (o != NULL)
      return ini_error(p, "unknown option '%s' (did you mean %s?)",
                       echo(key, e, sizeof e), o->name);
    return ini_error(p, "unknown option '%s'", echo(key, e, sizeof e));
  }
  if (!p->in_section)
    return ini_error(p, "%s: outside a section (options go under "
                     "[qlineard])", o->name);
  size_t idx = (size_t)(o - options);
  if (p->seen[idx] != 0)
    return ini_error(p, "%s: set twice (first on line %u)", o->name,
                     p->seen[idx]);

  while (is_blank(*v))
    v++;
  if (*v == '"') {
    char *q = strchr(++v, '"');
    if (q == NULL)
      return ini_error(p, "%s: unterminated quoted value", o->name);
    if (!is_comment_or_empty(q + 1))
      return ini_error(p, "%s: text after the quoted value", o->name);
    *q = '\0';
  } else {
    char *t = value_end(v);
    while (t > v && is_blank(t[-1]))
      t--;
    *t = '\0';
  }
  if (ql__option_parse(o, v, p->cfg, why, sizeof why) != 0)
    return ini_error(p, "%s: %s", o->name, why);
  p->seen[idx] = p->line;
  return 0;
}

int ql__config_parse_buffer(const char *name, const char *buf, size_t len,
                            ql__config *cfg, char *err, size_t errlen) {
  ql__config tmp = *cfg;
  ini p;
  char dummy[1];
  size_t pos = 0;

  if (err == NULL || errlen == 0) {
    err = dummy;
    errlen = sizeof dummy;
  }
  err[0] = '\0';
  memset(&p, 0, sizeof p);
  p.name = name != NULL ? name : "(config)";
  p.cfg = &tmp;
  p.err = err;
  p.errlen = errlen;
  if (buf == NULL && len != 0)
    return ini_error(&p, "no data");
  if (len > MAX_FILE_BYTES)
    return ini_error(&p, "larger than %u bytes", MAX_FILE_BYTES);
  if (len >= 3 && memcmp(buf, "\xEF\xBB\xBF", 3) == 0)
    pos = 3; /* a UTF-8 byte order mark, as some editors write */
  while (pos < len) {
    char line[MAX_LINE_BYTES + 1];
    const char *start = buf + pos;
    const char *nl = memchr(start, '\n', len - pos);
    size_t n = nl != NULL ? (size_t)(nl - start) : len - pos;
    pos += n + (nl != NULL);
    p.line++;
    if (n > 0 && start[n - 1] == '\r')
      n--;
    if (n > MAX_LINE_BYTES)
      return ini_error(&p, "line longer than %u bytes", MAX_LINE_BYTES);
    if (memchr(start, '\0', n) != NULL)
      return ini_error(&p, "NUL byte in the line");
    memcpy(line, start, n);
    line[n] = '\0';
    int rc = ini_line(&p, line);
    if (rc != 0)
      return rc;
  }
  *cfg = tmp;
  return 0;
}

int ql__config_parse_file(const char *path, ql__config *cfg, char *err,
                          size_t errlen) {
  struct stat st;
  char *buf;
  size_t len = 0;
  int fd, rc;

  /* O_NONBLOCK: a FIFO at path would block the open, and with it the loop
   * thread at every reload, until something wrote to it. */
  fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0) {
    snprintf(err, errlen, "%s: %s", path, strerror(errno));
    return QL_EIO;
  }
  if (fstat(fd, &st) != 0) {
    snprintf(err, errlen, "%s: %s", path, strerror(errno));
    close(fd);
    return QL_EIO;
  }
  if (S_ISDIR(st.st_mode) || S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode)) {
    snprintf(err, errlen, "%s: is a %s, not a file", path,
             S_ISDIR(st.st_mode) ? "directory" : S_ISFIFO(st.st_mode)
                                                     ? "FIFO"
                                                     : "socket");
    close(fd);
    return QL_EIO;
  }
  /* One byte more than allowed, to see that a file is too large. */
  if ((buf = malloc(MAX_FILE_BYTES + 1)) == NULL) {
    close(fd);
    snprintf(err, errlen, "%s: out of memory", path);
    return QL_ENOMEM;
  }
  while (len <= MAX_FILE_BYTES) {
    ssize_t got = read(fd, buf + len, MAX_FILE_BYTES + 1 - len);
    if (got < 0 && errno == EINTR)
      continue;
    if (got < 0) {
      snprintf(err, errlen, "%s: %s", path, strerror(errno));
      free(buf);
      close(fd);
      return QL_EIO;
    }
    if (got == 0)
      break;
    len += (size_t)got;
  }
  close(fd);
  rc = ql__config_parse_buffer(path, buf, len, cfg, err, errlen);
  free(buf);
  return rc;
}

/* ------------------------------------------------------- command line */

/* The cross-field rules, after every source has been applied. */
static void finish(ql__config *cfg) {
  /* A chunk plus its envelope must fit in one message. */
  if (cfg->max_chunk_bytes > cfg->max_message_bytes - QL_ENVELOPE_BYTES)
    cfg->max_chunk_bytes = cfg->max_message_bytes - QL_ENVELOPE_BYTES;
}

/*
 * One walk over argv. Without cfg it only checks the syntax and fills cl
 * (and stops at --help or --version); with cfg it applies the options in
 * order. Two walks, because the file named by --config sits between the
 * defaults and the command line wherever --config appears.
 */
static int walk_args(int argc, char *const argv[], ql__config *cfg,
                     ql__cmdline *cl, char *err, size_t errlen) {
  char e[ECHO_MAX + 8], why[256];
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
      cl->help = 1;
      return 0;
    }
    if (strcmp(a, "--version") == 0) {
      cl->version = 1;
      return 0;
    }
    if (strcmp(a, "--print-config") == 0) {
      cl->print_config = 1;
      continue;
    }
    if (strncmp(a, "--", 2) != 0 || a[2] == '\0') {
      snprintf(err, errlen, "unexpected argument '%s'", echo(a, e, sizeof e));
      return QL_EINVAL;
    }

    /* --KEY=VALUE or --KEY VALUE */
    char key[64];
    const char *eq = strchr(a + 2, '='), *value;
    size_t klen = eq != NULL ? (size_t)(eq - a - 2) : strlen(a + 2);
    if (klen >= sizeof key) {
      snprintf(err, errlen, "unknown option '%s'", echo(a, e, sizeof e));
      return QL_EINVAL;
    }
    memcpy(key, a + 2, klen);
    key[klen] = '\0';
    const ql__option *o = ql__config_find(key);
    int is_config = strcmp(key, "config") == 0;
    int is_set = strcmp(key, "set") == 0;
    if (o == NULL && !is_config && !is_set) {
      snprintf(err, errlen, "unknown option '--%s'", echo(key, e, sizeof e));
      return QL_EINVAL;
    }
    if (eq != NULL) {
      value = eq + 1;
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      snprintf(err, errlen, "--%s needs a value", key);
      return QL_EINVAL;
    }

    if (is_config) {
      if (cfg == NULL && cl->config_file != NULL) {
        snprintf(err, errlen, "--config given twice");
        return QL_EINVAL;
      }
      cl->config_file = value;
    } else if (is_set) {
      /* --set KEY=VALUE, KEY as in the file */
      const char *seq = strchr(value, '=');
      char skey[64];
      size_t n = seq != NULL ? (size_t)(seq - value) : 0;
      if (seq == NULL || n == 0 || n >= sizeof skey) {
        snprintf(err, errlen, "--set '%s': expected KEY=VALUE",
                 echo(value, e, sizeof e));
        return QL_EINVAL;
      }
      memcpy(skey, value, n);
      skey[n] = '\0';
      if (cfg == NULL && ql__config_find(skey) == NULL) {
        snprintf(err, errlen, "--set: unknown option '%s'",
                 echo(skey, e, sizeof e));
        return QL_EINVAL;
      }
      if (cfg != NULL &&
          ql__config_set(cfg, skey, seq + 1, why, sizeof why) != 0) {
        snprintf(err, errlen, "--set %s", why);
        return QL_EINVAL;
      }
    } else if (cfg != NULL &&
               ql__option_parse(o, value, cfg, why, sizeof why) != 0) {
      snprintf(err, errlen, "--%s: %s", key, why);
      return QL_EINVAL;
    }
  }
  return 0;
}

int ql__config_from_args(int argc, char *const argv[], ql__config *cfg,
                         ql__cmdline *cl, char *err, size_t errlen) {
  int rc;
  char dummy[1];
  if (err == NULL || errlen == 0) {
    err = dummy;
    errlen = sizeof dummy;
  }
  err[0] = '\0';
  memset(cl, 0, sizeof *cl);
  ql__config_init_defaults(cfg);
  if ((rc = walk_args(argc, argv, NULL, cl, err, errlen)) != 0 ||
      cl->help || cl->version)
    return rc;
  if (cl->config_file != NULL &&
      (rc = ql__config_parse_file(cl->config_file, cfg, err, errlen)) != 0)
    return rc;
  if ((rc = walk_args(argc, argv, cfg, cl, err, errlen)) != 0)
    return rc;
  finish(cfg);
  return 0;
}

/* -------------------------------------------------------------- reload */

int ql__config_reload(const ql__config *old, const ql__config *parsed,
                      ql__config *out, char *report, size_t len) {
  /* Values can be as long as a path: compare and print them as text. */
  char a[PATH_MAX + 64], b[PATH_MAX + 64];
  char applied_buf[512], restart_buf[512];
  sbuf applied = {applied_buf, sizeof applied_buf, 0};
  sbuf restart = {restart_buf, sizeof restart_buf, 0};
  sbuf r = {report, len, 0};
  ql__config res = *old;
  int n_applied = 0, n_restart = 0;

  applied_buf[0] = restart_buf[0] = '\0';
  for (size_t i = 0; i < N_OPTIONS; i++) {
    const ql__option *o = &options[i];
    ql__option_format(o, old, a, sizeof a);
    ql__option_format(o, parsed, b, sizeof b);
    if (strcmp(a, b) == 0)
      continue;
    if (o->flags & QL_OPT_LIVE) {
      memcpy((char *)&res + o->offset, (const char *)parsed + o->offset,
             o->size);
      sb_printf(&applied, "%s%s = %.64s", n_applied ? ", " : "", o->name, b);
      n_applied++;
    } else {
      sb_printf(&restart, "%s%s (running %.64s, configured %.64s)",
                n_restart ? ", " : "", o->name, a, b);
      n_restart++;
    }
  }
  *out = res;
  if (len > 0)
    report[0] = '\0';
  if (n_applied)
    sb_printf(&r, "applied: %s", applied_buf);
  if (n_restart)
    sb_printf(&r, "%sneeds a restart: %s", n_applied ? "; " : "",
              restart_buf);
  if (!n_applied && !n_restart)
    sb_printf(&r, "no changes");
  return n_applied;
}

/* ------------------------------------------------------------- writers */

/* A value as the INI reader reads it back: quoted when it is empty, has
 * blanks at either end, or holds a comment character. */
static void write_value(FILE *f, const char *v) {
  size_t n = strlen(v);
  int quote = n == 0 || is_blank(v[0]) || is_blank(v[n - 1]) ||
              strpbrk(v, "#;\"") != NULL;
  fprintf(f, quote ? "\"%s\"\n" : "%s\n", v);
}

void ql__config_dump(const ql__config *cfg, FILE *f) {
  char v[PATH_MAX + 64];
  fprintf(f, "# qlineard --print-config\n[qlineard]\n");
  for (size_t i = 0; i < N_OPTIONS; i++) {
    ql__option_format(&options[i], cfg, v, sizeof v);
    fprintf(f, "%s = ", options[i].name);
    write_value(f, v);
  }
}

/* text on lines of at most 78 columns, each indented by 6. */
static void write_wrapped(FILE *f, const char *text) {
  size_t col = 0;
  while (*text != '\0') {
    size_t n = strcspn(text, " ");
    if (col > 0 && col + 1 + n > 78) {
      fputc('\n', f);
      col = 0;
    }
    col += (size_t)fprintf(f, "%s%.*s", col == 0 ? "      " : " ", (int)n,
                           text);
    text += n;
    text += strspn(text, " ");
  }
  fputc('\n', f);
}

void ql__config_help(FILE *f) {
  char def[PATH_MAX + 64], lo[32], hi[32], dash[64], meta[128];
  ql__config cfg;

  ql__config_init_defaults(&cfg);
  fprintf(f,
          "usage: qlineard [--config FILE] [--OPTION VALUE]... "
          "[--print-config]\n"
          "Serves quantized linear layers to local processes.\n\n"
          "  --config FILE       read options from FILE (INI, section "
          "[qlineard])\n"
          "  --OPTION VALUE      set an option, also --OPTION=VALUE; the "
          "command line\n"
          "                      wins over the file\n"
          "  --set KEY=VALUE     set an option by its name in the file\n"
          "  --print-config      print the effective configuration and "
          "exit\n"
          "  --version, --help\n\n"
          "Options (in the file: the name with '_'; SIZE takes K, M, G, T; "
          "TIME takes\nms, s, min, h; [SIGHUP]: a reload applies a new "
          "value):\n");
  for (size_t i = 0; i < N_OPTIONS; i++) {
    const ql__option *o = &options[i];
    sbuf m = {meta, sizeof meta, 0};
    dashed(o, dash, sizeof dash);
    if (o->type == QL_OPT_ENUM) {
      for (const ql__opt_name *n = o->names; n->name != NULL; n++)
        sb_printf(&m, "%s%s", n == o->names ? "" : "|", n->name);
    } else {
      sb_printf(&m, "%s", types[o->type].metavar);
    }
    fprintf(f, "  --%s %s\n", dash, meta);
    write_wrapped(f, o->help);
    ql__option_format(o, &cfg, def, sizeof def);
    fprintf(f, "      default %s", def[0] != '\0' ? def : "empty");
    if (format_bounds(o, lo, hi, sizeof lo))
      fprintf(f, ", %s to %s", lo, hi);
    fprintf(f, "%s\n", o->flags & QL_OPT_LIVE ? " [SIGHUP]" : "");
  }
}

/* ------------------------------------------------------------ man page */

/*
 * qlineard.conf(5), in roff: the text about the file around one entry per
 * option of the table, so that the page cannot drift from the table (nor
 * from --help, which prints the same entries). Nothing in it depends on
 * the machine or the environment: socket_dir's default, computed at start,
 * is described by its help text rather than shown.
 */

enum { ROFF_LITERAL = 1 }; /* '-' as \- (options, values: copy-pastable) */

/* s as roff text in the middle of a line, or at its start when bol: a
 * backslash becomes \e, and a '.' or '\'' that begins a line is kept from
 * being read as a request by \&. */
static void roff_put(FILE *f, const char *s, int bol, unsigned how) {
  for (; *s != '\0'; s++) {
    if (bol && (*s == '.' || *s == '\''))
      fputs("\\&", f);
    bol = *s == '\n';
    if (*s == '\\')
      fputs("\\e", f);
    else if (*s == '-' && (how & ROFF_LITERAL))
      fputs("\\-", f);
    else
      fputc(*s, f);
  }
}

/* A help text as a sentence of its own line: capitalized when its first
 * word is a plain lower-case word (not an option name), with a full
 * stop. */
static void roff_sentence(FILE *f, const char *help) {
  size_t first = strcspn(help, " ");
  int plain = first > 0;
  for (size_t i = 0; i < first; i++)
    plain &= help[i] >= 'a' && help[i] <= 'z';
  if (plain) {
    fputc(help[0] - 'a' + 'A', f);
    roff_put(f, help + 1, 0, 0);
  } else {
    roff_put(f, help, 1, 0);
  }
  size_t n = strlen(help);
  fputs(n > 0 && help[n - 1] == '.' ? "\n" : ".\n", f);
}

static const char man_head[] =
    ".SH NAME\n"
    "qlineard.conf \\- configuration file of qlineard, the qlinear daemon\n"
    ".SH SYNOPSIS\n"
    ".I /etc/qlinear/qlineard.conf\n"
    ".SH DESCRIPTION\n"
    ".BR qlineard (8)\n"
    "reads its options from the file that\n"
    ".B \\-\\-config\n"
    "names; without it no file is read.\n"
    "The system service\n"
    ".RB ( qlineard.service )\n"
    "runs\n"
    ".B qlineard \\-\\-config /etc/qlinear/qlineard.conf\n"
    "(the directory follows the\n"
    ".I sysconfdir\n"
    "given to configure: with the default prefix it is\n"
    ".IR /usr/local/etc/qlinear ).\n"
    ".PP\n"
    "Every option has a default; the file replaces the defaults, and the\n"
    "command line replaces the file.\n"
    "Each option below is also the argument\n"
    "\\fB\\-\\-\\fR\\fIname value\\fR or\n"
    "\\fB\\-\\-\\fR\\fIname\\fR\\fB=\\fR\\fIvalue\\fR,\n"
    "the name written with dashes for its underscores\n"
    "(\\fB\\-\\-max\\-queue 64\\fR), or\n"
    "\\fB\\-\\-set\\fR \\fIname\\fR\\fB=\\fR\\fIvalue\\fR with the name as in\n"
    "the file.\n"
    ".B qlineard \\-\\-config\n"
    ".I FILE\n"
    ".B \\-\\-print\\-config\n"
    "prints the configuration in effect, in the syntax of this file, and\n"
    "exits;\n"
    ".B qlineard \\-\\-help\n"
    "lists the options as this page does.\n"
    ".SH FILE FORMAT\n"
    "An INI file of at most 64 KiB:\n"
    ".IP \\(bu 2\n"
    "Options go under the section\n"
    ".BR [qlineard] ,\n"
    "one\n"
    ".IB key \" = \" value\n"
    "per line.\n"
    "It is the only section: another one is an error, and so is an option\n"
    "before the section header.\n"
    ".IP \\(bu 2\n"
    "A line whose first character other than a blank is\n"
    ".B #\n"
    "or\n"
    ".B ;\n"
    "is a comment, and so is the rest of a line from a\n"
    ".B #\n"
    "or\n"
    ".B ;\n"
    "that follows a blank.\n"
    ".IP \\(bu 2\n"
    "Blanks around keys and values are ignored.\n"
    "A value may be put in double quotes, and must be to be empty or to\n"
    "hold a\n"
    ".B #\n"
    "or\n"
    ".B ;\n"
    "after a blank.\n"
    ".IP \\(bu 2\n"
    "Lines end in LF or CR LF and hold at most 4096 bytes; a UTF\\-8 byte\n"
    "order mark at the start of the file is skipped.\n"
    ".IP \\(bu 2\n"
    "Keys are written exactly as below, with underscores, and each at most\n"
    "once.\n"
    "An unknown key, a key given twice or a value that does not parse stops\n"
    "the daemon before it serves (or fails a reload), with a message that\n"
    "names the file and the line:\n"
    ".RS\n"
    ".PP\n"
    ".EX\n"
    "qlineard.conf:12: max_queue: 0 is not in [1, 1048576]\n"
    ".EE\n"
    ".RE\n"
    ".SH VALUES\n"
    ".TP\n"
    ".I PATH\n"
    "An absolute path, without control characters or double quotes.\n"
    "Where an option says so, an empty value (\\fB\\(dq\\(dq\\fR) means none.\n"
    ".TP\n"
    ".I N\n"
    "A decimal integer.\n"
    ".TP\n"
    ".I SIZE\n"
    "A number of bytes: an integer with an optional binary suffix\n"
    ".BR K \", \" M \", \" G \" or \" T\n"
    "(or KiB, MiB, GiB, TiB; in any case): 64M is 64 MiB.\n"
    "KB, MB and the like are refused as ambiguous.\n"
    ".TP\n"
    ".I TIME\n"
    "A duration: an integer with an optional suffix\n"
    ".BR ms \", \" s \", \" min \" or \" h ;\n"
    "a bare number is milliseconds.\n"
    ".TP\n"
    ".I PERCENT\n"
    "A percentage with at most two decimals and an optional\n"
    ".BR % ,\n"
    "e.g. 87.5.\n"
    ".TP\n"
    ".I HOST:PORT\n"
    "A loopback address and a TCP port:\n"
    ".BR 127.0.0.1:9464 ,\n"
    ".B [::1]:9464\n"
    "or\n"
    ".BR localhost:9464 .\n"
    "Any other address is refused; names other than localhost are not\n"
    "looked up.\n"
    "An empty value (\\fB\\(dq\\(dq\\fR) means none.\n"
    ".TP\n"
    ".I A,B,...\n"
    "A list of distinct items separated by commas, blanks around each item\n"
    "ignored; \\fB\\(dq\\(dq\\fR is the empty list.\n"
    ".TP\n"
    ".IB a | b | c\n"
    "One of the names listed, in any case.\n"
    ".PP\n"
    "A number outside the range given with its option is an error.\n"
    ".SH OPTIONS\n"
    "In the order of\n"
    ".BR \"qlineard \\-\\-help\" .\n"
    "An option marked\n"
    ".B [SIGHUP]\n"
    "takes a new value at a reload; a change to any other one needs a\n"
    "restart.\n";

static const char man_bool[] =
    ".PP\n"
    "A\n"
    ".BR yes | no\n"
    "option also takes true/false, on/off or 1/0.\n";

static const char man_tail[] =
    ".SH RELOAD\n"
    "SIGHUP\n"
    "(\\fBsystemctl reload qlineard\\fR, or \\fBqlinearctl \\-\\-admin "
    "reload\\fR,\n"
    "which prints what changed) makes the daemon read the file again, with\n"
    "the same command line on top of it.\n"
    "A reload is all or nothing: a file that does not parse, or device\n"
    "budgets that cannot apply, change nothing, and\n"
    ".B qlinearctl \\-\\-admin reload\n"
    "says why and fails.\n"
    "Otherwise the options marked\n"
    ".B [SIGHUP]\n"
    "take their new values at once (weights already resident stay, even\n"
    "past a lowered budget); for any other option that changed, the log\n"
    "names its running and its configured value, and the running one stays\n"
    "until a restart.\n"
    ".SH EXAMPLE\n"
    ".EX\n"
    "# /etc/qlinear/qlineard.conf\n"
    "[qlineard]\n"
    "socket_dir = /run/qlinear\n"
    "admin_dir = /run/qlinear\\-admin\n"
    "state_dir = /var/lib/qlinear\n"
    "required_devices = cuda:0          # refuse to start without it\n"
    "device_budget_bytes = cuda:0=20G\n"
    "kernel_timeout_ms = 5s\n"
    "max_queue = 256\n"
    "log_level = notice\n"
    ".EE\n"
    ".SH FILES\n"
    ".TP\n"
    ".I /etc/qlinear/qlineard.conf\n"
    "The service's configuration: a copy of the example, put in place by\n"
    "the first\n"
    ".BR \"make install\" ,\n"
    "which never overwrites it after.\n"
    ".TP\n"
    ".I /etc/qlinear/qlineard.conf.example\n"
    "Every option, commented out with its default, and the directories of\n"
    "the service.\n"
    ".SH SEE ALSO\n"
    ".BR qlineard (8),\n"
    ".BR qlinearctl (1),\n"
    ".BR libqlinear (3),\n"
    ".BR systemctl (1)\n";

void ql__config_man(FILE *f, const char *version) {
  char def[PATH_MAX + 64], lo[32], hi[32], dash[64];
  ql__config cfg;
  int any_bool = 0;

  ql__config_init_defaults(&cfg);
  fputs(".\\\" qlineard.conf.5 - made by `qlineard --print-man-conf` from "
        "the table of\n"
        ".\\\" options in daemon/conf.c, which `qlineard --help` prints too: "
        "edit the\n"
        ".\\\" table, not this file.\n", f);
  fputs(".TH QLINEARD.CONF 5 \"\" \"qlinear ", f);
  roff_put(f, version, 0, 0);
  fputs("\" \"File Formats Manual\"\n.nh\n.ad l\n", f);
  fputs(man_head, f);
  for (size_t i = 0; i < N_OPTIONS; i++) {
    const ql__option *o = &options[i];
    any_bool |= o->type == QL_OPT_BOOL;
    dashed(o, dash, sizeof dash);
    fputs(".TP\n\\fB", f);
    roff_put(f, o->name, 1, ROFF_LITERAL);
    fputs("\\fR = ", f);
    if (o->type == QL_OPT_ENUM) {
      for (const ql__opt_name *n = o->names; n->name != NULL; n++) {
        fputs(n == o->names ? "\\fB" : "\\fR|\\fB", f);
        roff_put(f, n->name, 0, ROFF_LITERAL);
      }
      fputs("\\fR", f);
    } else {
      fputs("\\fI", f);
      roff_put(f, types[o->type].metavar, 0, ROFF_LITERAL);
      fputs("\\fR", f);
    }
    fputs("\\ \\ (\\fB\\-\\-", f);
    roff_put(f, dash, 0, ROFF_LITERAL);
    fputs("\\fR)\n", f);
    roff_sentence(f, o->help);
    fputs(".br\n", f);
    if (o->def == NULL) {
      fputs("Default: computed at start, as said above", f);
    } else {
      ql__option_format(o, &cfg, def, sizeof def);
      if (def[0] == '\0') {
        fputs("Default: empty", f);
      } else {
        fputs("Default: \\fB", f);
        roff_put(f, def, 0, ROFF_LITERAL);
        fputs("\\fR", f);
      }
    }
    if (format_bounds(o, lo, hi, sizeof lo)) {
      fprintf(f, "; %s to %s", lo, hi);
    } else if (o->type == QL_OPT_LIST) {
      fprintf(f, "; at most %" PRIu64 " items", o->max);
    }
    fputs(o->flags & QL_OPT_LIVE ? ". \\fB[SIGHUP]\\fR\n" : ".\n", f);
  }
  if (any_bool)
    fputs(man_bool, f);
  fputs(man_tail, f);
}
