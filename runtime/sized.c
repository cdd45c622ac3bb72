/* The caller's size-prefixed input structs (kl_config, kl_sampling) as this
 * library knows them (klrt.h's "Growth"). */
#include <string.h>

#include "rt.h"

kl_result kl_read_input(void *dst, size_t dst_size, size_t oldest, const void *src,
                        const char *fn, const char *what, const char *type, const char *init) {
  const size_t n = *(const size_t *)src;
  if (n == 0)
    return kl_rt_fail(KLRT_EINVAL, "%s: %s->size is 0: initialize it with %s (or set it to "
                      "sizeof(%s))", fn, what, init, type);
  if (n < oldest)
    return kl_rt_fail(KLRT_EINVAL, "%s: %s->size is %zu, less than the oldest %s this libklrt "
                      "(%s) reads, %zu bytes", fn, what, n, type, KLRT_VERSION, oldest);
  /* an older caller's struct: the fields it does not have stay 0, off */
  const size_t have = n < dst_size ? n : dst_size;
  const unsigned char *extra = (const unsigned char *)src + have;
  for (size_t i = 0; i < n - have; i++)
    if (extra[i])
      return kl_rt_fail(KLRT_EINVAL, "%s: %s sets fields this libklrt (%s) does not know", fn, what,
                        KLRT_VERSION);
  memset(dst, 0, dst_size);
  memcpy(dst, src, have);
  *(size_t *)dst = dst_size;
  return KLRT_OK;
}
