/*
 * replay_main.c - runs a libFuzzer target over its seed corpus (or over the
 * files named on the command line) without libFuzzer, so that 'make check'
 * executes every fuzz target's code on every seed with the normal compiler
 * and, in the sanitizer build, under ASan/UBSan.
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (f == NULL) {
    perror(path);
    return -1;
  }
  uint8_t *buf = NULL;
  size_t len = 0, cap = 0;
  for (;;) {
    if (len == cap) {
      size_t ncap = cap ? cap * 2 : 4096;
      uint8_t *nb = realloc(buf, ncap);
      if (nb == NULL) {
        free(buf);
        fclose(f);
        return -1;
      }
      buf = nb;
      cap = ncap;
    }
    size_t got = fread(buf + len, 1, cap - len, f);
    if (got == 0)
      break;
    len += got;
  }
  fclose(f);
  LLVMFuzzerTestOneInput(buf, len);
  free(buf);
  return 0;
}

int main(int argc, char **argv) {
  int n = 0;
  if (argc > 1) {
    for (int i = 1; i < argc; i++)
      if (run_file(argv[i]) == 0)
        n++;
  } else {
    DIR *d = opendir(CORPUS_DIR);
    if (d == NULL) {
      perror(CORPUS_DIR);
      return 1;
    }
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
      if (e->d_name[0] == '.')
        continue;
      char path[4096];
      snprintf(path, sizeof path, "%s/%s", CORPUS_DIR, e->d_name);
      if (run_file(path) != 0) {
        closedir(d);
        return 1;
      }
      n++;
    }
    closedir(d);
  }
  /* Also the empty input, which every target must survive. */
  LLVMFuzzerTestOneInput((const uint8_t *)"", 0);
  printf("%d passed, 0 failed\n", n + 1);
  return n > 0 ? 0 : 1;
}
