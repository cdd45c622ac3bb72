/* JIT: NVRTC output cached on disk (DESIGN §5).
 *
 * Key: a 128-bit hash of the rendered source, the NVRTC options (fixed by
 * kl_nvrtc_compile), the NVRTC version, the arch and klgen's version. Entries
 * are written to a temp file and renamed, so concurrent writers never expose a
 * partial file; an entry that fails its header or checksum is recompiled and
 * replaced; a directory that cannot be created or written means no cache. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "rt.h"

#define ENTRY_MAGIC "KLGCUBIN"
#define ENTRY_VERSION 1u
#define ENTRY_MAX (64u << 20)

typedef struct entry_header {
  char magic[8];
  uint32_t version, reserved;
  uint64_t key[2];
  uint64_t size, checksum;
} entry_header;

uint64_t kl_fnv1a(uint64_t h, const void *p, size_t n) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ULL;
  return h;
}

/* Two independently seeded FNV-1a lanes, finalised with a mixer: not
 * cryptographic, which a cache keyed by our own rendered source does not need. */
static uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  return x ^ (x >> 33);
}

static void cache_key(const char *source, const char *arch, uint64_t key[2]) {
  int maj = 0, min = 0;
  kl_nvrtc_version(&maj, &min);
  char meta[128];
  int n = snprintf(meta, sizeof meta, "klgen %s|nvrtc %d.%d|%s|", KLGEN_VERSION, maj, min, arch);
  uint64_t a = kl_fnv1a(KL_FNV_BASIS, meta, (size_t)n);
  uint64_t b = kl_fnv1a(0x84222325cbf29ce4ULL ^ 0x9e3779b97f4a7c15ULL, meta, (size_t)n);
  a = kl_fnv1a(a, source, strlen(source));
  b = kl_fnv1a(b, source, strlen(source));
  key[0] = mix(a);
  key[1] = mix(b ^ key[0]);
}

static int mkdir_p(const char *dir) {
  char tmp[4096];
  if (snprintf(tmp, sizeof tmp, "%s", dir) >= (int)sizeof tmp) return -1;
  for (char *p = tmp + 1; *p; p++)
    if (*p == '/') {
      *p = 0;
      if (mkdir(tmp, 0755) != 0 && errno != EEXIST) return -1;
      *p = '/';
    }
  if (mkdir(tmp, 0755) != 0 && errno != EEXIST) return -1;
  return access(tmp, W_OK | X_OK);
}

int kl_cache_dir(const char *configured, char *buf, size_t n) {
  const char *env;
  int w;
  if (configured && *configured) w = snprintf(buf, n, "%s", configured);
  else if ((env = getenv("KLGEN_CACHE_DIR")) && *env) w = snprintf(buf, n, "%s", env);
  else if ((env = getenv("XDG_CACHE_HOME")) && *env) w = snprintf(buf, n, "%s/klgen", env);
  else if ((env = getenv("HOME")) && *env) w = snprintf(buf, n, "%s/.cache/klgen", env);
  else return 0;
  return w > 0 && (size_t)w < n;
}

static void entry_path(const char *dir, const uint64_t key[2], char *buf, size_t n) {
  snprintf(buf, n, "%s/%016llx%016llx.cubin", dir, (unsigned long long)key[0],
           (unsigned long long)key[1]);
}

/* 0 and a malloc'd payload on a valid entry; -1 on a miss or a bad entry. */
static int read_entry(const char *path, const uint64_t key[2], kl_binary *out) {
  FILE *f = fopen(path, "rb");
  if (!f) return -1;
  entry_header h;
  int rc = -1;
  if (fread(&h, sizeof h, 1, f) == 1 && memcmp(h.magic, ENTRY_MAGIC, 8) == 0 &&
      h.version == ENTRY_VERSION && h.key[0] == key[0] && h.key[1] == key[1] && h.size > 0 &&
      h.size <= ENTRY_MAX) {
    out->data = malloc(h.size);
    if (out->data && fread(out->data, 1, h.size, f) == h.size && fgetc(f) == EOF &&
        kl_fnv1a(KL_FNV_BASIS, out->data, h.size) == h.checksum) {
      out->size = h.size;
      rc = 0;
    }
  }
  fclose(f);
  if (rc) kl_binary_free(out);
  return rc;
}

/* Best effort: a cache that cannot be written is no reason to fail. */
static void write_entry(const char *dir, const char *path, const uint64_t key[2],
                        const kl_binary *bin) {
  char tmp[4200];
  snprintf(tmp, sizeof tmp, "%s/.tmp.XXXXXX", dir);
  int fd = mkstemp(tmp);
  if (fd < 0) return;
  entry_header h;
  memset(&h, 0, sizeof h);
  memcpy(h.magic, ENTRY_MAGIC, 8);
  h.version = ENTRY_VERSION;
  h.key[0] = key[0], h.key[1] = key[1];
  h.size = bin->size;
  h.checksum = kl_fnv1a(KL_FNV_BASIS, bin->data, bin->size);
  FILE *f = fdopen(fd, "wb");
  int ok = f && fwrite(&h, sizeof h, 1, f) == 1 && fwrite(bin->data, 1, bin->size, f) == bin->size;
  ok = (f ? fclose(f) == 0 : (close(fd), 0)) && ok;
  if (!ok || chmod(tmp, 0644) != 0 || rename(tmp, path) != 0) unlink(tmp);
}

int kl_jit_cubin(const char *source, const char *name, const char *arch, const char *dir,
                 kl_binary *out, int *hit, kl_err *err) {
  memset(out, 0, sizeof *out);
  *hit = 0;
  uint64_t key[2];
  char path[4200];
  int usable = dir && mkdir_p(dir) == 0;
  if (usable) {
    cache_key(source, arch, key);
    entry_path(dir, key, path, sizeof path);
    if (read_entry(path, key, out) == 0) return *hit = 1, 0;
  }
  int rc = kl_nvrtc_compile(source, name, arch, out, err);
  if (rc == 0 && usable) write_entry(dir, path, key, out);
  return rc;
}
