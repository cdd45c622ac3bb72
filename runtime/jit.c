/* JIT: NVRTC output cached on disk (docs/design/dispatch.md, "The JIT cache").
 *
 * Key: a 128-bit hash of everything that changes the cubin: the rendered
 * source, klgen's version and its template set, the NVRTC options and
 * version, and the arch. Entries are named <name>.<arch>.<key>.cubin so that
 * a person can tell them apart, written to a temp file and renamed (no
 * reader sees a partial file), and checked when read: header, key, checksum,
 * and a payload that is a CUDA ELF. The cache is only as trustworthy as its
 * directory and the path to it, so the directory is opened once by walking
 * its path from / a component at a time (O_NOFOLLOW, each checked on its
 * descriptor, ssh's StrictModes: an ancestor writable by another user could
 * swap what follows it) and every entry is opened relative to that
 * descriptor, only as a regular file, never through a link. A cache that
 * cannot be used means compiling every time. */
/* realpath and S_ISVTX are XSI, beyond the project-wide POSIX.1-2008 base. */
#define _XOPEN_SOURCE 700
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "rt.h"

#define ENTRY_MAGIC "KLGCUBIN"
#define ENTRY_VERSION 2u
/* A cubin of the largest spec, every kernel, is ~5 MiB (sm_100): room for
 * three times that. Larger entries are neither written nor read. */
#define ENTRY_MAX (16u << 20)
#define EM_CUDA 190

typedef struct entry_header {
  char magic[8];
  uint32_t version, reserved;
  uint64_t key[2];
  uint64_t size, checksum[2];
} entry_header;
_Static_assert(sizeof(entry_header) == 56, "entry header layout (tests/runtime/test_cache.c forges one)");

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

/* May the directory at `shown` (stat st) be trusted? Owned by root or this
 * user, and writable by no one else, unless sticky (/tmp: others cannot
 * rename what is not theirs). `mine`: it must be this user's, sticky or
 * not, as a directory we write to and read code from. */
static int trusted(const struct stat *st, int mine, const char *shown, char *why, size_t n) {
  uid_t me = geteuid();
  if (!S_ISDIR(st->st_mode)) return snprintf(why, n, "%s is not a directory", shown), 0;
  if (st->st_uid != me && (mine || st->st_uid != 0))
    return snprintf(why, n, "%s belongs to uid %u, not to this user (%u)%s", shown,
                    (unsigned)st->st_uid, (unsigned)me, mine ? "" : " or root"), 0;
  if ((st->st_mode & 022) && (mine || !(st->st_mode & S_ISVTX)))
    return snprintf(why, n, "%s is writable by others (mode %03o); chmod go-w to use it", shown,
                    (unsigned)(st->st_mode & 0777)), 0;
  return 1;
}

int kl_trusted_dir(const char *dir, int mine, char *why, size_t n) {
  char real[PATH_MAX], shown[PATH_MAX], part[PATH_MAX];
  if (!realpath(dir, real)) return snprintf(why, n, "%s: %s", dir, strerror(errno)), -1;
  int fd = open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC), err = errno;
  size_t at = 0; /* fd is the directory real[0, at) ("/" while at is 0) */
  for (;;) {
    size_t from = at + strspn(real + at, "/"), len = strcspn(real + from, "/");
    snprintf(shown, sizeof shown, "%.*s", at ? (int)at : 1, at ? real : "/");
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
      snprintf(why, n, "%s: %s", shown, strerror(fd < 0 ? err : errno));
      break;
    }
    if (!trusted(&st, mine && len == 0, shown, why, n)) break;
    if (len == 0) return fd;
    snprintf(part, sizeof part, "%.*s", (int)len, real + from);
    int child = openat(fd, part, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    err = errno;
    close(fd);
    fd = child, at = from + len;
  }
  if (fd >= 0) close(fd);
  return -1;
}

int kl_cache_open(const char *dir, char *why, size_t n) {
  if (mkdir_p(dir) != 0)
    return snprintf(why, n, "%s cannot be created: %s", dir, strerror(errno)), -1;
  return kl_trusted_dir(dir, 1, why, n);
}

/* v if it is an absolute path, else NULL: XDG's rule for its variables (a
 * relative one is invalid and ignored), and HOME's here. */
static const char *absolute(const char *v) { return v && v[0] == '/' ? v : NULL; }

int kl_cache_dir(const char *configured, char *buf, size_t n) {
  const char *env;
  char cwd[PATH_MAX];
  int w;
  if (configured && *configured) {
    if (configured[0] == '/') w = snprintf(buf, n, "%s", configured);
    else if (getcwd(cwd, sizeof cwd)) w = snprintf(buf, n, "%s/%s", cwd, configured);
    else return 0;
  } else if ((env = kl_param_str(KL_P_CACHE_DIR))) {
    w = snprintf(buf, n, "%s", env);
  } else if ((env = absolute(getenv("XDG_CACHE_HOME")))) {
    w = snprintf(buf, n, "%s/klgen", env);
  } else if ((env = absolute(getenv("HOME")))) {
    w = snprintf(buf, n, "%s/.cache/klgen", env);
  } else {
    return 0;
  }
  return w > 0 && (size_t)w < n;
}

static void entry_name(const char *name, const char *arch, const uint64_t key[2], char *buf,
                       size_t n) {
  snprintf(buf, n, "%s.%s.%016llx%016llx.cubin", name, arch, (unsigned long long)key[0],
           (unsigned long long)key[1]);
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

/* 0 and a malloc'd payload on a valid entry of this user's in the cache
 * directory dfd; -1 on a miss or a bad entry. The file's size is checked
 * before anything is read: a file larger than an entry can be is not read. */
static int read_entry(int dfd, const char *name, const uint64_t key[2], kl_binary *out) {
  int fd = kl_open_regular_at(dfd, name, 1);
  if (fd < 0) return -1;
  entry_header h;
  struct stat st;
  int rc = -1;
  if (fstat(fd, &st) == 0 && st.st_uid == geteuid() && st.st_size > (off_t)sizeof h &&
      st.st_size <= (off_t)(sizeof h + ENTRY_MAX) && read_all(fd, &h, sizeof h) == 0 &&
      memcmp(h.magic, ENTRY_MAGIC, 8) == 0 && h.version == ENTRY_VERSION &&
      h.key[0] == key[0] && h.key[1] == key[1] && (uint64_t)st.st_size == sizeof h + h.size) {
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

static int write_all(int fd, const void *p, size_t n) {
  for (size_t done = 0; done < n;) {
    ssize_t w = write(fd, (const char *)p + done, n - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    done += (size_t)w;
  }
  return 0;
}

/* Best effort: a cache that cannot be written is no reason to fail. A temp
 * file in the directory, renamed into place: no reader sees half an entry. */
static void write_entry(int dfd, const char *name, const uint64_t key[2], const kl_binary *bin) {
  char tmp[] = ".tmp.XXXXXX";
  if (bin->size > ENTRY_MAX) return; /* read_entry would refuse it */
  int fd = kl_create_temp_at(dfd, tmp, 0600);
  if (fd < 0) return;
  entry_header h;
  memset(&h, 0, sizeof h);
  memcpy(h.magic, ENTRY_MAGIC, 8);
  h.version = ENTRY_VERSION;
  h.key[0] = key[0], h.key[1] = key[1];
  h.size = bin->size;
  kl_cache_checksum(bin->data, bin->size, h.checksum);
  int ok = write_all(fd, &h, sizeof h) == 0 && write_all(fd, bin->data, bin->size) == 0;
  ok = close(fd) == 0 && ok;
  if (!ok || renameat(dfd, tmp, dfd, name) != 0) unlinkat(dfd, tmp, 0);
}

#ifdef KL_TESTING
kl_testing_jit_fn kl_testing_jit;
#endif

int kl_jit_cubin(const char *source, const char *name, const char *arch, const char *dir,
                 kl_binary *out, int *hit, kl_err *err) {
  memset(out, 0, sizeof *out);
  *hit = 0;
#ifdef KL_TESTING
  if (kl_testing_jit) return kl_testing_jit(source, name, out, err);
#endif
  uint64_t key[2];
  char entry[256], why[4400];
  int dfd = dir ? kl_cache_open(dir, why, sizeof why) : -1;
  if (dir && dfd < 0 && kl_log_enabled()) kl_log("JIT cache not used: %s", why);
  if (dfd >= 0) {
    cache_key(source, arch, key);
    entry_name(name, arch, key, entry, sizeof entry);
    if (read_entry(dfd, entry, key, out) == 0) {
      close(dfd);
      return *hit = 1, 0;
    }
  }
  int rc = kl_nvrtc_compile(source, name, arch, out, err);
  if (rc == 0 && dfd >= 0) write_entry(dfd, entry, key, out);
  if (dfd >= 0) close(dfd);
  return rc;
}
