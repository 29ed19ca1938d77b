/*
 * heap.h - giving the heap back. The daemon's large buffers (an upload's
 * float data, the quantized arrays and layouts of a weight, conversion
 * scratch on the thread pool) come and go with loads; without these two
 * calls glibc keeps what they freed and the daemon's RSS stays at its
 * high-water mark with nothing resident.
 */
#ifndef QL_HEAP_H
#define QL_HEAP_H

#include <stddef.h>

/* At start, before any thread: a fixed mmap threshold (1 MiB), so that
 * large buffers are mapped and unmapped on their own. glibc's dynamic one
 * rises (to 32 MiB) after such a buffer is freed, and from then on the
 * same buffers come from the heap. */
void ql__heap_setup(void);

/* After freeing freed bytes of large buffers: returns the free pages of
 * every arena to the system when that is at least 1 MiB (malloc_trim:
 * its cost, a walk over the arenas, is small against such a free). */
void ql__heap_release(size_t freed);

#endif /* QL_HEAP_H */
