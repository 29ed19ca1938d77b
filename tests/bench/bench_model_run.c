/*
 * bench_model_run.c - `qlinear-bench model`: a whole causal LM through
 * qlineard against bf16 and TorchAO (DESIGN §12). The bench itself is
 * Python (tests/bench/bench_model.py: transformers and TorchAO have no C
 * interface); this subcommand only runs it, with the interpreter and the
 * paths of this build, the way the other subcommands find the daemon:
 *
 *   python   $QL_PYTHON, else what `deploy/python-env --find` prints
 *            (the venv of the pinned stack)
 *   qlineard $QLINEARD, else this build's (the script's --daemon wins)
 *   library  $QLINEAR_LIB, else this build's .libs/libqlinear.so.0
 *   package  client/python of the source tree, first on PYTHONPATH
 *
 * Every argument after `model` goes to the script unchanged.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"

#ifndef QL_BENCH_SRCDIR
#define QL_BENCH_SRCDIR "."
#endif
#ifndef QL_BENCH_BUILDDIR
#define QL_BENCH_BUILDDIR "."
#endif

/* The venv's python as deploy/python-env --find prints it, into buf;
 * 0 on success. */
static int find_python(char *buf, size_t len) {
  const char *env = getenv("QL_PYTHON");
  FILE *f;
  size_t n;
  if (env != NULL && *env != '\0') {
    if (strlen(env) >= len)
      return -1;
    strcpy(buf, env);
    return 0;
  }
  f = popen("'" QL_BENCH_SRCDIR "/deploy/python-env' --find", "r");
  if (f == NULL)
    return -1;
  n = fread(buf, 1, len - 1, f);
  if (pclose(f) != 0 || n == 0)
    return -1;
  buf[n] = '\0';
  buf[strcspn(buf, "\n")] = '\0';
  return buf[0] != '\0' ? 0 : -1;
}

int bench_model(int argc, char **argv) {
  static const char script[] = QL_BENCH_SRCDIR "/tests/bench/bench_model.py";
  char python[4096], *path, **args;
  const char *old = getenv("PYTHONPATH");
  size_t len;

  if (find_python(python, sizeof python) != 0) {
    fprintf(stderr, "qlinear-bench model: no Python environment: set "
            "QL_PYTHON or run deploy/python-env\n");
    return 2;
  }
  len = sizeof QL_BENCH_SRCDIR + sizeof "/client/python" +
        (old != NULL ? strlen(old) + 1 : 0);
  if ((path = malloc(len)) == NULL)
    return 1;
  snprintf(path, len, "%s/client/python%s%s", QL_BENCH_SRCDIR,
           old != NULL && *old != '\0' ? ":" : "",
           old != NULL ? old : "");
  setenv("PYTHONPATH", path, 1);
  free(path);
  setenv("QLINEAR_LIB", QL_BENCH_BUILDDIR "/.libs/libqlinear.so.0", 0);
  setenv("QLINEARD", QL_BENCH_BUILDDIR "/qlineard", 0);
  setenv("PYTHONDONTWRITEBYTECODE", "1", 0);

  /* python script argv[1..] NULL */
  if ((args = calloc((size_t)argc + 2, sizeof *args)) == NULL)
    return 1;
  args[0] = python;
  args[1] = (char *)script;
  for (int i = 1; i < argc; i++)
    args[i + 1] = argv[i];
  execv(python, args);
  perror("qlinear-bench model: exec python");
  free(args);
  return 1;
}
