/* Finding a shared library at run time (NVRTC for libklgen, NCCL for libklrt),
 * the way the CUDA driver is already found: never linked, so that a host
 * process (PyTorch) keeps the one copy it loaded and no second one comes in. */
#ifndef KL_DYNLIB_H
#define KL_DYNLIB_H

#include <stddef.h>

/* The first of, in order: the library already in the process (by soname);
 * `hint`, a path (NULL: none); the soname through the system's search; each
 * path of `fallbacks` (NULL-terminated, may be NULL). Returns the handle, or
 * NULL with `why` saying what was tried and why each failed. */
void *kl_dynlib_open(const char *what, const char *soname, const char *hint,
                     const char *const *fallbacks, char *why, size_t n);

#endif
