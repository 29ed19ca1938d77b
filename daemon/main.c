/*
 * main.c - qlineard's command line. Options override the defaults of
 * ql__config_defaults(); every number is validated and a bad one names
 * itself.
 */
#include "config.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "qlineard.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: qlineard [options]\n"
          "Serves quantized linear layers to local processes.\n\n"
          "  --socket-dir DIR         directory of qlineard.sock (default\n"
          "                           $XDG_RUNTIME_DIR/qlinear, else "
          "/tmp/qlinear-UID)\n"
          "  --max-message-bytes N    message cap (default 67108864)\n"
          "  --max-chunk-bytes N      largest upload chunk (default 4194304)\n"
          "  --max-upload-bytes N     all uploads in progress (default 4 GiB)\n"
          "  --upload-idle-ms N       drop idle uploads after N ms (120000)\n"
          "  --max-queue N            waiting requests per device (1024)\n"
          "  --max-queued-bytes N     tensor bytes of waiting requests (1 GiB)\n"
          "  --drain-ms N             at shutdown, refuse work not started\n"
          "                           after N ms (30000)\n"
          "  --crossover-rows N       AUTO path: fewer rows run weight-only "
          "(16)\n"
          "  --log-level LEVEL        err|warning|notice|info|debug (info)\n"
          "  --version, --help\n");
}

/* Parses a decimal integer in [lo, hi]; -1 with a message otherwise. */
static int parse_u64(const char *opt, const char *s, uint64_t lo, uint64_t hi,
                     uint64_t *out) {
  char *end;
  errno = 0;
  if (*s == '-' || *s == '\0')
    goto bad;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno != 0 || *end != '\0' || v < lo || v > hi)
    goto bad;
  *out = v;
  return 0;
bad:
  fprintf(stderr, "qlineard: --%s: '%s' is not a number in [%" PRIu64
          ", %" PRIu64 "]\n", opt, s, lo, hi);
  return -1;
}

int main(int argc, char **argv) {
  ql__config cfg;
  ql__config_defaults(&cfg);
  static const struct option opts[] = {
      {"socket-dir", required_argument, NULL, 'd'},
      {"max-message-bytes", required_argument, NULL, 'm'},
      {"max-chunk-bytes", required_argument, NULL, 'c'},
      {"max-upload-bytes", required_argument, NULL, 'u'},
      {"upload-idle-ms", required_argument, NULL, 'i'},
      {"max-queue", required_argument, NULL, 'q'},
      {"max-queued-bytes", required_argument, NULL, 'Q'},
      {"drain-ms", required_argument, NULL, 'D'},
      {"crossover-rows", required_argument, NULL, 'x'},
      {"log-level", required_argument, NULL, 'l'},
      {"version", no_argument, NULL, 'V'},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0},
  };
  int c, idx;
  uint64_t v;
  while ((c = getopt_long(argc, argv, "h", opts, &idx)) != -1) {
    const char *name = c == '?' || c == 'h' || c == 'V' ? "" : opts[idx].name;
    switch (c) {
    case 'd':
      if (optarg[0] != '/' ||
          strlen(optarg) >= sizeof cfg.socket_dir - 32) {
        fprintf(stderr, "qlineard: --socket-dir needs an absolute path\n");
        return 2;
      }
      snprintf(cfg.socket_dir, sizeof cfg.socket_dir, "%s", optarg);
      break;
    case 'm':
      /* At least one envelope and a 4 KiB chunk. */
      if (parse_u64(name, optarg, QL_ENVELOPE_BYTES + 4096, 1u << 30, &v))
        return 2;
      cfg.max_message_bytes = v;
      break;
    case 'c':
      if (parse_u64(name, optarg, 1024, 1u << 30, &v))
        return 2;
      cfg.max_chunk_bytes = v;
      break;
    case 'u':
      if (parse_u64(name, optarg, 1, (uint64_t)1 << 44, &v))
        return 2;
      cfg.max_upload_bytes = v;
      break;
    case 'i':
      if (parse_u64(name, optarg, 1, 86400000, &v))
        return 2;
      cfg.upload_idle_ms = v;
      break;
    case 'q':
      if (parse_u64(name, optarg, 1, 1u << 20, &v))
        return 2;
      cfg.max_queue = v;
      break;
    case 'Q':
      if (parse_u64(name, optarg, 1u << 20, (uint64_t)1 << 44, &v))
        return 2;
      cfg.max_queued_bytes = v;
      break;
    case 'D':
      if (parse_u64(name, optarg, 0, 3600000, &v))
        return 2;
      cfg.drain_ms = v;
      break;
    case 'x':
      if (parse_u64(name, optarg, 0, 1u << 30, &v))
        return 2;
      cfg.crossover_rows = (uint32_t)v;
      break;
    case 'l':
      if ((cfg.log_level = ql__log_level_parse(optarg)) < 0) {
        fprintf(stderr, "qlineard: --log-level: unknown level '%s'\n", optarg);
        return 2;
      }
      break;
    case 'V':
      printf("qlineard %s (protocol %u)\n", PACKAGE_VERSION,
             QL_PROTOCOL_VERSION);
      return 0;
    case 'h':
      usage(stdout);
      return 0;
    default:
      usage(stderr);
      return 2;
    }
  }
  if (optind != argc) {
    fprintf(stderr, "qlineard: unexpected argument '%s'\n", argv[optind]);
    return 2;
  }
  /* A chunk plus its envelope must fit in one message. */
  if (cfg.max_chunk_bytes > cfg.max_message_bytes - QL_ENVELOPE_BYTES)
    cfg.max_chunk_bytes = cfg.max_message_bytes - QL_ENVELOPE_BYTES;
  return ql__server_run(&cfg);
}
