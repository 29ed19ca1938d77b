/*
 * conf.h - qlineard's configuration: one table of options and the parsers
 * that fill a ql__config from it (DESIGN §10).
 *
 * Every option of ql__config is described once, in the table of conf.c:
 * its name (the INI key; on the command line --name with dashes), its type,
 * its default, its bounds, whether a SIGHUP reload may change it, and a
 * line of help. The INI file, the command line, --print-config, --help and
 * the reload all work from that table, so an option cannot be known to one
 * of them and missing from another.
 *
 * Precedence: the table's defaults, then the --config file, then the
 * command line in order; then the cross-field rules (max_chunk_bytes is
 * clamped to max_message_bytes - QL_ENVELOPE_BYTES).
 *
 * Nothing here logs or asserts on input: a bad file or argument
 * comes back as QL_EINVAL with a message that names where the problem is
 * ("qlineard.conf:12: max_queue: 0 is not in [1, 1048576]"), and the
 * config passed in is left unchanged.
 *
 * (Named conf.h, not config.h: daemon/config.h would shadow autoconf's
 * config.h for every `#include "config.h"` in daemon/.)
 */
#ifndef QL_CONF_H
#define QL_CONF_H

#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "net/listen.h" /* QL_LISTEN_ADDR_MAX */
#include "ql_defs.h"

/* The most weights metrics_weights may name (serve/metrics.h). */
#define QL_METRICS_WEIGHTS_MAX 256

/* cpu_level values; names in conf.c. */
enum {
  QL_CPU_LEVEL_OPT_AUTO,
  QL_CPU_LEVEL_OPT_C,
  QL_CPU_LEVEL_OPT_AVX2,
  QL_CPU_LEVEL_OPT_AVX2VNNI,
  QL_CPU_LEVEL_OPT_AVX512
};

/* mapped_mode values; names in conf.c. A mapping can be made writable by
 * its importer whatever the daemon asks (the exported descriptor carries
 * no access right), so the choice is whose sessions may map. */
enum {
  QL_MAPPED_OFF,   /* MapWeight refused */
  QL_MAPPED_OWNER, /* sessions of the daemon's own user, or of root */
  QL_MAPPED_ANY    /* every session (a host whose clients trust each
                      other) */
};

/* A list option's value, e.g. required_devices = cpu,cuda:0: up to
 * QL_CONFIG_LIST_MAX distinct items, each a NUL-terminated name. */
#define QL_CONFIG_LIST_MAX 16
#define QL_CONFIG_ITEM_MAX 64
typedef struct ql__config_list {
  unsigned n;
  char item[QL_CONFIG_LIST_MAX][QL_CONFIG_ITEM_MAX];
} ql__config_list;

/* Options. Each field is described once in the table of conf.c (type,
 * default, bounds, whether SIGHUP changes it); main.c fills them from the
 * config file and the command line through that table. */
typedef struct ql__config {
  char socket_dir[PATH_MAX]; /* directory of qlineard.sock; created 0700 */
  size_t max_message_bytes;  /* larger messages are refused (NN_RCVMAXSIZE) */
  uint32_t max_connections; /* per request socket, open at once */
  uint32_t max_connections_per_uid; /* of one peer uid */
  uint32_t max_sessions_per_uid; /* sessions of one peer uid */
  uint64_t frame_timeout_ms; /* a half-sent message or unread reply */
  size_t max_buffered_bytes; /* half-received messages and unread replies
                                of one socket's connections */
  size_t max_chunk_bytes;    /* largest LoadChunk payload */
  size_t max_upload_bytes;   /* all uploads in progress together */
  uint64_t upload_idle_ms;   /* an idle upload is dropped after this */
  uint64_t session_lease_ms; /* a session idle this long ends; 0: never */
  uint32_t ring_spin_us;     /* a quiet ring is polled this long before
                                the loop sleeps on its doorbell */
  size_t max_queue;          /* waiting requests per (weight, device,
                                path) queue */
  uint32_t max_batch_rows;   /* rows of one launch */
  uint32_t decode_max_rows;  /* requests up to this are decode work */
  uint32_t prefill_chunk_rows; /* most rows of a prefill launch; 0: none */
  uint32_t prefill_chunk_us; /* a prefill launch's time budget while
                                decode work is about; 0: none */
  uint64_t max_queue_delay_us; /* a small batch may wait this long */
  uint64_t decode_hold_us; /* the most a decode launch waits for the rows
                              of the one before to come back */
  size_t session_max_requests; /* requests of one session in the queues */
  size_t max_queued_bytes;   /* tensor bytes held by waiting jobs */
  uint32_t uid_share;        /* percent of a shared budget one uid may
                                hold (tenants.h, upload.h) */
  size_t max_pinned_bytes;   /* region bytes page-locked for devices' DMA,
                                over every session; 0: none */
  uint64_t drain_ms;         /* shutdown: queued work not started by then
                                is answered QL_ESHUTDOWN */
  uint32_t crossover_rows;   /* AUTO: rows below this run weight-only;
                                0: measured per shape (calibrate.h) */
  uint32_t crossover_default_rows; /* until a shape's is measured */
  int log_level;             /* QL_LOG_* */
  int mapped_mode;           /* QL_MAPPED_*: whether sessions may map
                                weight layouts into their own process */
  char state_dir[PATH_MAX];  /* persistent weight store; "" = none */
  char admin_dir[PATH_MAX];  /* directory of admin.sock; "" =
                                <socket_dir>/admin */
  uint32_t cpu_threads;      /* CPU worker threads; 0 = online CPUs */
  int cpu_level;             /* QL_CPU_LEVEL_OPT_*: the highest kernel
                                level to use; 0 = the best detected */
  size_t cpu_budget_bytes;   /* weight bytes resident on the CPU; 0 = no
                                limit */
  uint64_t kernel_timeout_ms; /* an accelerator launch not done by then
                                 takes its device out of service */
  uint32_t batches_in_flight; /* worker threads (lanes) of an accelerator,
                                 1 .. QL__WORKER_MAX_THREADS; at start */
  ql__config_list required_devices; /* must be present before READY=1 */
  uint32_t accel_budget_percent; /* an accelerator's weight budget, in
                                    hundredths of a percent of its memory
                                    (8750: 87.5 %) */
  ql__config_list device_budget_bytes; /* "DEVICE=SIZE" items: a device's
                                          budget, instead of the percent */
  char metrics_listen[QL_LISTEN_ADDR_MAX + 1]; /* HOST:PORT of /metrics,
                                                  loopback; "" = none */
  uint32_t metrics_weights; /* weights named in /metrics; 0 = none */
} ql__config;

/* Sessions open at once (sessionsock.c), the bound of max_sessions_per_uid. */
#define QL_SESSIONS_MAX 256

typedef enum ql__opt_type {
  QL_OPT_PATH,     /* absolute path, no control characters or '"' */
  QL_OPT_UINT,     /* decimal integer */
  QL_OPT_SIZE,     /* bytes: integer with an optional binary suffix K, M,
                      G, T (or KiB, MiB, GiB, TiB) */
  QL_OPT_DURATION, /* milliseconds: integer with an optional suffix ms,
                      s, min, h */
  QL_OPT_BOOL,     /* yes/no, true/false, on/off, 1/0 (stored as bool) */
  QL_OPT_ENUM,     /* one of a list of names (stored as int) */
  QL_OPT_LIST,     /* comma-separated distinct items (ql__config_list) */
  QL_OPT_PERCENT,  /* a percentage with up to two decimals and an
                      optional '%' ("87.5"), stored as uint32_t in
                      hundredths of a percent (8750) */
  QL_OPT_ADDRESS,  /* a listen address HOST:PORT, printable, no '"'
                      (stored as a string; check says which ones) */
  QL_OPT_TYPE_COUNT_
} ql__opt_type;

enum {
  QL_OPT_LIVE = 1u << 0,     /* a SIGHUP reload applies a new value */
  QL_OPT_EMPTY_OK = 1u << 1, /* PATH, ADDRESS: "" is allowed (means
                                "none") */
  QL_OPT_KEYED = 1u << 2,    /* LIST: items are KEY=VALUE, and a key may
                                appear once */
};

typedef struct ql__opt_name {
  const char *name;
  int value;
} ql__opt_name;

/* One entry of the table. */
typedef struct ql__option {
  const char *name; /* INI key, lower case with '_' */
  ql__opt_type type;
  unsigned flags;   /* QL_OPT_* */
  size_t offset;    /* of the field in ql__config */
  size_t size;      /* of the field: 4 or 8 for numbers; capacity for PATH */
  /* UINT, SIZE, DURATION, PERCENT (in hundredths): the accepted range.
   * PATH, ADDRESS: max is the longest accepted length in bytes. LIST: max
   * is the most items. */
  uint64_t min, max;
  /* The default as text, parsed by the same parser as a file value (so it
   * obeys the same rules); NULL when def_fn computes it at start. */
  const char *def;
  void (*def_fn)(char *buf, size_t len);
  const ql__opt_name *names; /* ENUM: the accepted names, NULL-terminated */
  /* PATH, ADDRESS, LIST: an extra rule for a value or a list item; writes
   * why it refused into why. NULL when the type's rules are enough. */
  int (*check)(const char *s, char *why, size_t whylen);
  const char *help; /* one line for --help and the example config */
} ql__option;

/* What the command line asked for besides options. Pointers point into
 * argv. */
typedef struct ql__cmdline {
  const char *config_file; /* --config FILE, or NULL */
  int print_config;        /* --print-config */
  int help;                /* --help or -h: nothing else was parsed */
  int version;             /* --version: nothing else was parsed */
} ql__cmdline;

/* The table, in the order of --help and --print-config. */
const ql__option *ql__config_options(size_t *count);

/* The option named name (INI spelling, '_' or '-' as separators), or NULL. */
const ql__option *ql__config_find(const char *name);

/* Fills cfg with the table's defaults. The socket directory follows the
 * rule of ql_default_address(): $XDG_RUNTIME_DIR/qlinear when that is an
 * absolute path short enough for a socket, else /tmp/qlinear-<uid>. */
void ql__config_init_defaults(ql__config *cfg);

/* Parses value as option o and stores it in the field at base + o->offset.
 * 0, or QL_EINVAL with the reason in why ("0 is not in [1, 1048576]"; no
 * option name) and the field unchanged. base is usually a ql__config; the
 * tests also use other structs. */
int ql__option_parse(const ql__option *o, const char *value, void *base,
                     char *why, size_t whylen);

/* The field of o at base as text that ql__option_parse() reads back to the
 * same value: sizes and durations with the largest exact suffix ("64M",
 * "2min"), lists joined by ','. Always NUL-terminated; truncated to len. */
void ql__option_format(const ql__option *o, const void *base, char *buf,
                       size_t len);

/* Sets the option named key (as ql__config_find) from value.
 * 0, or QL_EINVAL with "key: reason" in err and cfg unchanged. */
int ql__config_set(ql__config *cfg, const char *key, const char *value,
                   char *err, size_t errlen);

/* Parses an INI text of len bytes (NULs included) named name in messages.
 * Only the [qlineard] section is known; `key = value` lines, whole-line
 * comments starting with '#' or ';', inline comments after whitespace,
 * optional double quotes around a value, CRLF or LF line ends. Each key
 * may appear once. On success the values found replace those in cfg; on
 * error cfg is unchanged and err holds "name:line: reason". 0 or
 * QL_EINVAL. */
int ql__config_parse_buffer(const char *name, const char *buf, size_t len,
                            ql__config *cfg, char *err, size_t errlen);

/* ql__config_parse_buffer() on the contents of the file at path (at most
 * 64 KiB). QL_EIO when it cannot be read. */
int ql__config_parse_file(const char *path, ql__config *cfg, char *err,
                          size_t errlen);

/*
 * The whole command line: qlineard [--config FILE] [--print-config]
 * [--KEY VALUE | --KEY=VALUE | --set KEY=VALUE]... [--help] [--version].
 * Builds cfg from the defaults, the config file and the options in argv
 * (argv[0] is the program), then applies the cross-field rules. With
 * --help or --version nothing else is parsed and cfg holds the defaults.
 * The daemon calls it again on SIGHUP with the same argv, so that the
 * command line still overrides the reloaded file.
 * 0, or QL_EINVAL / QL_EIO with the reason in err and cfg unspecified.
 */
int ql__config_from_args(int argc, char *const argv[], ql__config *cfg,
                         ql__cmdline *cl, char *err, size_t errlen);

/*
 * A SIGHUP reload: out becomes the running config old with every live
 * option taken from parsed (a complete config, from ql__config_from_args).
 * report says what happened in one line: "applied: max_queue = 5,
 * log_level = debug; needs a restart: max_message_bytes (running 64M,
 * configured 32M)", or "no changes". Returns how many options it applied.
 * out may be the same object as old.
 */
int ql__config_reload(const ql__config *old, const ql__config *parsed,
                      ql__config *out, char *report, size_t len);

/*
 * Splits one item of device_budget_bytes, "DEVICE=SIZE": the device name
 * into dev (len bytes, may be NULL) and the size into *bytes (may be
 * NULL). The daemon matches the name against its devices when it applies
 * the budgets; whether the device exists is not known here. 0, or
 * QL_EINVAL with the reason in why.
 */
int ql__config_device_budget(const char *item, char *dev, size_t devlen,
                             uint64_t *bytes, char *why, size_t whylen);

/* Writes cfg as an INI file that ql__config_parse_buffer() reads back to
 * the same config (--print-config). */
void ql__config_dump(const ql__config *cfg, FILE *f);

/* Writes the usage and every option with its default and range (--help). */
void ql__config_help(FILE *f);

/* Writes the manual page qlineard.conf(5) in roff: the file's syntax, its
 * values and the reload, around one entry per option of the table with
 * its type, default, range and [SIGHUP] as --help gives them (the hidden
 * `qlineard --print-man-conf`, from which make builds
 * man/qlineard.conf.5). version goes into the title line. The page does
 * not depend on the environment. */
void ql__config_man(FILE *f, const char *version);

#endif /* QL_CONF_H */
