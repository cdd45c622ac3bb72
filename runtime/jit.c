/* JIT: NVRTC output cached on disk (docs/DESIGN.md §5).
 *
 * Key: a 128-bit hash of everything that changes the cubin: the rendered
 * source, klgen's version and its template set, the NVRTC options and
 * version, and the arch. Entries are named <name>.<arch>.<key>.cubin so that
 * a person can tell them apart, written to a temp file and renamed (no
 * reader sees a partial file), and checked when read: header, key, checksum,
 * and a payload that is a CUDA ELF. The cache is only as trustworthy as its
 * directory, so a directory not owned by this user, or writable by others,
 * is not used at all; entries are opened only as regular files, never
 * through a link. A cache that cannot be used means compiling every time. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "rt.h"

#define ENTRY_MAGIC "KLGCUBIN"
#define ENTRY_VERSION 2u
#define ENTRY_MAX (64u << 20)
#define EM_CUDA 190

typedef struct entry_header {
  char magic[8];
  uint32_t version, reserved;
  uint64_t key[2];
  uint64_t size, checksum[2];
} entry_header;
_Static_assert(sizeof(entry_header) == 56, "entry header layout (tests/test_cache.c forges one)");

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

static void hash128(const void *p, size_t n, uint64_t h[2]) {
  h[0] = kl_fnv1a(h[0], p, n);
  h[1] = kl_fnv1a(h[1], p, n);
}

static void cache_key(const char *source, const char *arch, uint64_t key[2]) {
  int maj = 0, min = 0;
  kl_nvrtc_version(&maj, &min);
  char opts[256], meta[512];
  kl_nvrtc_options(opts, sizeof opts);
  int n = snprintf(meta, sizeof meta, "klgen %s|templates %016llx|nvrtc %d.%d|%s|%s|", KLGEN_VERSION,
                   (unsigned long long)kl_template_set_hash(), maj, min, opts, arch);
  uint64_t h[2] = {KL_FNV_BASIS, 0x84222325cbf29ce4ULL ^ 0x9e3779b97f4a7c15ULL};
  hash128(meta, (size_t)n, h);
  hash128(source, strlen(source), h);
  key[0] = mix(h[0]);
  key[1] = mix(h[1] ^ key[0]);
}

void kl_cache_checksum(const void *p, size_t n, uint64_t c[2]) {
  c[0] = KL_FNV_BASIS, c[1] = 0x6c62272e07bb0142ULL;
  hash128(p, n, c);
  c[0] = mix(c[0]), c[1] = mix(c[1] ^ c[0]);
}

/* Creates the missing components 0700 (XDG's mode for cache directories). */
static int mkdir_p(const char *dir) {
  char tmp[4096];
  if (snprintf(tmp, sizeof tmp, "%s", dir) >= (int)sizeof tmp) return -1;
  for (char *p = tmp + 1; *p; p++)
    if (*p == '/') {
      *p = 0;
      if (mkdir(tmp, 0700) != 0 && errno != EEXIST) return -1;
      *p = '/';
    }
  if (mkdir(tmp, 0700) != 0 && errno != EEXIST) return -1;
  return 0;
}

int kl_cache_dir_usable(const char *dir, char *why, size_t n) {
  struct stat st;
  if (mkdir_p(dir) != 0 || stat(dir, &st) != 0)
    return snprintf(why, n, "%s cannot be created: %s", dir, strerror(errno)), 0;
  if (!S_ISDIR(st.st_mode)) return snprintf(why, n, "%s is not a directory", dir), 0;
  if (st.st_uid != geteuid())
    return snprintf(why, n, "%s belongs to uid %u, not to this user (%u)", dir,
                    (unsigned)st.st_uid, (unsigned)geteuid()), 0;
  if (st.st_mode & 022)
    return snprintf(why, n, "%s is writable by others (mode %03o); chmod go-w to use it", dir,
                    (unsigned)(st.st_mode & 0777)), 0;
  if (access(dir, W_OK | X_OK) != 0) return snprintf(why, n, "%s is not writable", dir), 0;
  return 1;
}

int kl_cache_dir(const char *configured, char *buf, size_t n) {
  const char *env;
  int w;
  if (configured && *configured) w = snprintf(buf, n, "%s", configured);
  else if ((env = kl_param_str(KL_P_CACHE_DIR)) && *env) w = snprintf(buf, n, "%s", env);
  else if ((env = getenv("XDG_CACHE_HOME")) && *env) w = snprintf(buf, n, "%s/klgen", env);
  else if ((env = getenv("HOME")) && *env) w = snprintf(buf, n, "%s/.cache/klgen", env);
  else return 0;
  return w > 0 && (size_t)w < n;
}

static void entry_path(const char *dir, const char *name, const char *arch, const uint64_t key[2],
                       char *buf, size_t n) {
  snprintf(buf, n, "%s/%s.%s.%016llx%016llx.cubin", dir, name, arch,
           (unsigned long long)key[0], (unsigned long long)key[1]);
}

/* What a cubin for an NVIDIA GPU starts with: a 64-bit ELF for EM_CUDA. */
static int is_cuda_elf(const unsigned char *p, size_t n) {
  return n > 64 && memcmp(p, "\x7f" "ELF", 4) == 0 && p[4] == 2 && p[5] == 1 &&
         (p[18] | p[19] << 8) == EM_CUDA;
}

static int read_all(int fd, void *buf, size_t n) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = read(fd, (char *)buf + got, n - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    got += (size_t)r;
  }
  return 0;
}

/* 0 and a malloc'd payload on a valid entry; -1 on a miss or a bad entry. */
static int read_entry(const char *path, const uint64_t key[2], kl_binary *out) {
  int fd = kl_open_regular(path, 1);
  if (fd < 0) return -1;
  entry_header h;
  struct stat st;
  int rc = -1;
  if (fstat(fd, &st) == 0 && read_all(fd, &h, sizeof h) == 0 &&
      memcmp(h.magic, ENTRY_MAGIC, 8) == 0 && h.version == ENTRY_VERSION &&
      h.key[0] == key[0] && h.key[1] == key[1] && h.size > 0 && h.size <= ENTRY_MAX &&
      (uint64_t)st.st_size == sizeof h + h.size) {
    out->data = malloc(h.size);
    uint64_t c[2];
    if (out->data && read_all(fd, out->data, h.size) == 0) {
      kl_cache_checksum(out->data, h.size, c);
      if (c[0] == h.checksum[0] && c[1] == h.checksum[1] && is_cuda_elf(out->data, h.size)) {
        out->size = h.size;
        rc = 0;
      }
    }
  }
  close(fd);
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
  kl_cache_checksum(bin->data, bin->size, h.checksum);
  FILE *f = fdopen(fd, "wb");
  int ok = f && fwrite(&h, sizeof h, 1, f) == 1 && fwrite(bin->data, 1, bin->size, f) == bin->size;
  ok = (f ? fclose(f) == 0 : (close(fd), 0)) && ok;
  if (!ok || chmod(tmp, 0600) != 0 || rename(tmp, path) != 0) unlink(tmp);
}

int kl_jit_cubin(const char *source, const char *name, const char *arch, const char *dir,
                 kl_binary *out, int *hit, kl_err *err) {
  memset(out, 0, sizeof *out);
  *hit = 0;
  uint64_t key[2];
  char path[4400], why[4400];
  int usable = dir && kl_cache_dir_usable(dir, why, sizeof why);
  if (dir && !usable && kl_log_enabled()) kl_log("JIT cache not used: %s", why);
  if (usable) {
    cache_key(source, arch, key);
    entry_path(dir, name, arch, key, path, sizeof path);
    if (read_entry(path, key, out) == 0) return *hit = 1, 0;
  }
  int rc = kl_nvrtc_compile(source, name, arch, out, err);
  if (rc == 0 && usable) write_entry(dir, path, key, out);
  return rc;
}
