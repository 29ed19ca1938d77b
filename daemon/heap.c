/* heap.c - see heap.h. */
#include <malloc.h>

#include "heap.h"

/* Below this, a free gives back too little to be worth a trim. */
#define TRIM_MIN_BYTES ((size_t)1 << 20)

void ql__heap_setup(void) {
#if defined(__GLIBC__) && defined(M_MMAP_THRESHOLD)
  (void)mallopt(M_MMAP_THRESHOLD, 1 << 20);
#endif
}

void ql__heap_release(size_t freed) {
#if defined(__GLIBC__)
  if (freed >= TRIM_MIN_BYTES)
    (void)malloc_trim(0);
#else
  (void)freed;
#endif
}
