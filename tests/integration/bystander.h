/*
 * bystander.h - another client process, served while a test attacks the
 * daemon: it holds a weight of its own and runs Linear on it in a loop
 * (both paths), each reply checked against the reference, until stopped.
 * Used by test_hostile and test_transport.
 */
#ifndef QL_TEST_BYSTANDER_H
#define QL_TEST_BYSTANDER_H

#include <sys/types.h>

#include "harness.h"

typedef struct td_bystander {
  pid_t pid;
  int stop; /* write end: closing it stops the loop */
  int out;  /* read end of the report ("served bad errors") */
} td_bystander;

/* Forks the bystander on daemon d. Call before this process touches
 * nanomsg. */
void td_bystander_start(const td *d, td_bystander *b);

/* Stops the bystander and prints its counts; it must have been served,
 * always correctly and without an error. */
void td_bystander_end(td_bystander *b);

#endif
