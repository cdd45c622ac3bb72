/* Line numbers of `name =` assignments and `_ENV` in Lua text (see srcscan.c). */
#ifndef KL_SRCSCAN_H
#define KL_SRCSCAN_H

#include <stddef.h>

#include "klgen.h"

typedef struct kl_lines {
  int *v;
  int n, cap;
} kl_lines;

typedef struct kl_srcscan {
  kl_lines field[KL_F_COUNT]; /* lines of `field =`, in order, per spec field */
  int return_line;            /* first `return`, 0 if none */
  int env_line;               /* first use of the name `_ENV`, 0 if none */
  const char *src;            /* the text, for names that are not fields */
  size_t len;
} kl_srcscan;

/* One pass over the text; src must outlive s. 0, or -1 out of memory. */
int kl_srcscan_run(kl_srcscan *s, const char *src, size_t len);
/* Line of field f's assignment for the index-th of count specs; 0 if never
 * assigned. Constant time. */
int kl_srcscan_line(const kl_srcscan *s, kl_field f, int index, int count);
/* The same for any other name (n bytes): another pass over the text, for
 * the one message that needs it. */
int kl_srcscan_name(const kl_srcscan *s, const char *name, size_t n, int index, int count);
void kl_srcscan_free(kl_srcscan *s);

#endif
