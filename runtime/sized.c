/* The caller's size-prefixed input structs (kl_config, kl_sampling) as this
 * library knows them (klrt.h's "Growth"). */
#include <string.h>

#include "rt.h"

kl_result kl_read_input(void *dst, size_t dst_size, const void *src, const char *fn,
                        const char *what, const char *type, const char *init) {
  const size_t n = *(const size_t *)src;
  if (n < dst_size) {
    if (n == 0)
      return kl_rt_fail(KLRT_EINVAL, "%s: %s->size is 0: initialize it with %s (or set it to "
                        "sizeof(%s))", fn, what, init, type);
    return kl_rt_fail(KLRT_EINVAL, "%s: %s->size is %zu, less than sizeof(%s) %zu", fn, what, n,
                      type, dst_size);
  }
  const unsigned char *extra = (const unsigned char *)src + dst_size;
  for (size_t i = 0; i < n - dst_size; i++)
    if (extra[i])
      return kl_rt_fail(KLRT_EINVAL, "%s: %s sets fields this libklrt (%s) does not know", fn, what,
                        KLRT_VERSION);
  memcpy(dst, src, dst_size);
  *(size_t *)dst = dst_size;
  return KLRT_OK;
}
