/*
 * ctl.h - qlinearctl's private header: the context every command gets, and
 * what the files of client/ctl/ offer each other.
 *
 *   qlinearctl [-a ADDRESS] [-t TIMEOUT_MS] COMMAND [ARGS]
 *
 * Every command is a thin layer over one or two libqlinear calls; arrays
 * come from and go to NumPy .npy files (npy.c). Exit status: 0 on success,
 * 1 when a call or a file fails (the message says which and why), 2 for
 * usage errors.
 */
#ifndef QL_CTL_H
#define QL_CTL_H

#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <regex.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ckpt_import.h"
#include "npy.h"
#include "qlinear/qlinear.h"
#include "safetensors.h"

#define EXIT_USAGE 2
/* Values printed by 'linear' without -o. */
#define PRINT_ROWS 16
#define PRINT_COLS 8

/* What every command needs: the connection settings and, once made, the
 * connection. */
typedef struct ctx {
  const char *address; /* NULL: the library's default */
  int timeout_ms;      /* 0: default, -1: forever */
  int admin;           /* --admin: the admin socket, no session */
  ql_client *client;
} ctx;

/* main.c */
int ql__ctl_bad_option(const char *cmd, char **argv);
int ql__ctl_connect_ctx(ctx *cx);
const char *ql__ctl_dtype_name(int dt);
__attribute__((format(printf, 3, 4))) int
ql__ctl_fail_local(const char *what, int code, const char *fmt, ...);
int ql__ctl_fail_ql(const char *what, int code);
const char *ql__ctl_format_name(int format, uint32_t group, char *buf,
                                size_t len);
void ql__ctl_getopt_reset(void);
const char *ql__ctl_human_bytes(uint64_t b, char *buf, size_t len);
const char *ql__ctl_human_ns(double ns, char *buf, size_t len);
int ql__ctl_load_array(const char *path, bool bf16, ql__npy *a, ql_dtype *dt);
int ql__ctl_parse_dtype(const char *s, int *dt);
int ql__ctl_parse_format(const char *s, ql_format *fmt, uint32_t *group,
                         int *asym);
int ql__ctl_parse_path(const char *s, ql_path *p);
const char *ql__ctl_path_name(int path);
__attribute__((format(printf, 1, 2))) int ql__ctl_usage_error(const char *fmt,
                                                              ...);

/* load.c */
int ql__cmd_linear(ctx *cx, int argc, char **argv);
int ql__cmd_load(ctx *cx, int argc, char **argv);
float ql__ctl_element(const void *data, ql_dtype dt, size_t i);

/* stats.c */
int ql__cmd_stats(ctx *cx, int argc, char **argv);

/* import.c */
int ql__cmd_import(ctx *cx, int argc, char **argv);

#endif /* QL_CTL_H */
