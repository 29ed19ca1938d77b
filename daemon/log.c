/* log.c - see log.h. */
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "log.h"

static atomic_int max_level = QL_LOG_INFO;

void ql__log_set_level(int level) { atomic_store(&max_level, level); }

int ql__log_level_parse(const char *s) {
  static const char *names[] = {"err", "warning", "notice", "info", "debug"};
  for (int i = 0; i < 5; i++)
    if (strcmp(s, names[i]) == 0)
      return QL_LOG_ERR + i;
  return -1;
}

/* One fprintf per line: stdio locks the stream, so lines from the loop and
 * the workers never interleave mid-line. */
void ql__log(int level, const char *fmt, ...) {
  if (level > atomic_load(&max_level))
    return;
  char line[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  fprintf(stderr, "<%d>qlineard: %s\n", level, line);
}
