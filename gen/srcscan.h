/* Line numbers of `name =` assignments in Lua text (see srcscan.c). */
#ifndef KL_SRCSCAN_H
#define KL_SRCSCAN_H

#include <stddef.h>

typedef struct kl_assign {
  char name[32];
  int line;
} kl_assign;

typedef struct kl_srcscan {
  kl_assign *v;
  int n, cap;
  int return_line; /* first `return`, 0 if none */
} kl_srcscan;

int kl_srcscan_run(kl_srcscan *s, const char *src, size_t len);
/* Line of `field =` for the index-th of count specs; 0 if never assigned. */
int kl_srcscan_line(const kl_srcscan *s, const char *field, int index, int count);
void kl_srcscan_free(kl_srcscan *s);

#endif
