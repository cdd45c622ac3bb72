/* Files compiled into the binaries (cmake/embed.cmake). */
#ifndef KL_EMBEDDED_H
#define KL_EMBEDDED_H
#include <stddef.h>
typedef struct kl_embedded_file {
  const char *name;
  const char *data;
  size_t size;
} kl_embedded_file;
extern const kl_embedded_file kl_templates[]; /* templates/ */
extern const kl_embedded_file kl_engine[];    /* gen/render.lua */
#endif
