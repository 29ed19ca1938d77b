/*
 * main.c - qlineard's command line: the defaults, the --config file and
 * the options, all through the table of conf.c; then the server.
 */
#include "config.h"

#include <stdio.h>
#include <string.h>

#include "conf.h"
#include "qlineard.h"

int main(int argc, char **argv) {
  ql__config cfg;
  ql__cmdline cl;
  char err[1024];

  /* Hidden (not in --help): make writes man/qlineard.conf.5 with it. */
  if (argc == 2 && strcmp(argv[1], "--print-man-conf") == 0) {
    ql__config_man(stdout, PACKAGE_VERSION);
    return fflush(stdout) == 0 ? 0 : 1;
  }
  if (ql__config_from_args(argc, argv, &cfg, &cl, err, sizeof err) != 0) {
    fprintf(stderr, "qlineard: %s\n", err);
    fprintf(stderr, "(qlineard --help lists the options)\n");
    return 2;
  }
  if (cl.help) {
    ql__config_help(stdout);
    return 0;
  }
  if (cl.version) {
    printf("qlineard %s (protocol %u)\n", PACKAGE_VERSION,
           QL_PROTOCOL_VERSION);
    return 0;
  }
  if (cl.print_config) {
    ql__config_dump(&cfg, stdout);
    return fflush(stdout) == 0 ? 0 : 1;
  }
  return ql__server_run(&cfg, argc, argv);
}
