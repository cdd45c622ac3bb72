/* Reading inputs with a size limit, and writing outputs all-or-nothing: a
 * failed run must leave no half-written .cu or .h behind. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "klgen.h"

int kl_open_regular_at(int dirfd, const char *path, int nofollow) {
  /* O_NONBLOCK: opening a FIFO would otherwise wait for a writer forever. */
  int fd = openat(dirfd, path,
                  O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC | (nofollow ? O_NOFOLLOW : 0));
  if (fd < 0) return -1;
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    errno = EINVAL;
    return -1;
  }
  return fd;
}

int kl_open_regular(const char *path, int nofollow) {
  return kl_open_regular_at(AT_FDCWD, path, nofollow);
}

int kl_read_file(const char *path, char **data, size_t *size, size_t limit, kl_err *err) {
  *data = NULL;
  *size = 0;
  int fd = kl_open_regular(path, 0);
  if (fd < 0 && errno == EINVAL) return kl_fail(err, KL_EIO, "%s: not a regular file", path);
  if (fd < 0) return kl_fail(err, KL_EIO, "%s: cannot open: %s", path, strerror(errno));
  struct stat st;
  int rc = 0;
  char *buf = NULL;
  if (fstat(fd, &st) != 0) rc = kl_fail(err, KL_EIO, "%s: %s", path, strerror(errno));
  else if ((size_t)st.st_size > limit)
    rc = kl_fail(err, KL_EIO, "%s: %lld bytes, larger than the %zu-byte limit", path,
                 (long long)st.st_size, limit);
  else if (!(buf = malloc((size_t)st.st_size + 1))) rc = kl_fail(err, KL_ENOMEM, "out of memory");
  size_t n = 0;
  while (!rc && n < (size_t)st.st_size) {
    ssize_t r = read(fd, buf + n, (size_t)st.st_size - n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break; /* shrank while read: what was there */
    n += (size_t)r;
  }
  close(fd);
  if (rc) return rc;
  buf[n] = 0;
  *data = buf;
  *size = n;
  return 0;
}

static int write_all(int fd, const void *data, size_t size) {
  const char *p = data;
  while (size) {
    ssize_t w = write(fd, p, size);
    if (w < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    p += w, size -= (size_t)w;
  }
  return 0;
}

/* DIR/.NAME.XXXXXX beside the target, so rename() stays on one filesystem. */
static char *temp_beside(const char *path) {
  const char *slash = strrchr(path, '/');
  size_t dir = slash ? (size_t)(slash - path + 1) : 0;
  size_t n = strlen(path) + 16;
  char *t = malloc(n);
  if (t) snprintf(t, n, "%.*s.%s.XXXXXX", (int)dir, path, path + dir);
  return t;
}

int kl_create_temp_at(int dirfd, char *name, int mode) {
  static unsigned long seq;
  char *x = name + strlen(name) - 6;
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  unsigned long r = (unsigned long)t.tv_nsec ^ ((unsigned long)getpid() << 20);
  for (int tries = 0; tries < 100; tries++) {
    r = r * 6364136223846793005UL + 1442695040888963407UL + ++seq;
    for (int i = 0; i < 6; i++)
      x[i] = "abcdefghijklmnopqrstuvwxyz0123456789"[(r >> (8 * i + 9)) % 36];
    int fd = openat(dirfd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
    if (fd >= 0 || errno != EEXIST) return fd;
  }
  return -1;
}

static int write_temp(const kl_file_out *f, char *tmp, kl_err *err) {
  /* 0666: the caller's umask decides, as for any file a program writes. */
  int fd = kl_create_temp_at(AT_FDCWD, tmp, 0666);
  if (fd < 0) return kl_fail(err, KL_EIO, "%s: cannot create: %s", f->path, strerror(errno));
  int bad = write_all(fd, f->data, f->size) != 0;
  bad |= close(fd) != 0;
  if (bad) {
    int e = errno;
    unlink(tmp);
    return kl_fail(err, KL_EIO, "%s: write failed: %s", f->path, strerror(e));
  }
  return 0;
}

enum { ABSENT = 0, SAME = 1, DIFFERS = 2 };
/* SAME if path holds exactly data (then it is not rewritten), DIFFERS,
 * ABSENT, or -1 (with err) if it is something a rename must not replace. */
static int same_content(const kl_file_out *f, kl_err *err) {
  struct stat st;
  if (lstat(f->path, &st) != 0) {
    if (errno == ENOENT) return ABSENT;
    return kl_fail(err, KL_EIO, "%s: %s", f->path, strerror(errno)), -1;
  }
  if (!S_ISREG(st.st_mode))
    return kl_fail(err, KL_EIO, "%s: exists and is not a regular file; not replaced", f->path), -1;
  if ((size_t)st.st_size != f->size) return DIFFERS;
  char *old;
  size_t n;
  kl_err ignore;
  if (kl_read_file(f->path, &old, &n, f->size, &ignore) != 0) return DIFFERS;
  int same = n == f->size && memcmp(old, f->data, n) == 0;
  free(old);
  return same ? SAME : DIFFERS;
}

/* A hard link to the current file, to put back if a later rename fails. */
static char *backup(const char *path) {
  char *b = temp_beside(path);
  if (!b) return NULL;
  int fd = mkstemp(b);
  if (fd < 0) return free(b), NULL;
  close(fd);
  unlink(b);
  if (link(path, b) != 0) return free(b), NULL;
  return b;
}

int kl_write_files_atomic(const kl_file_out *files, int n, kl_err *err) {
  char **tmp = calloc((size_t)(n > 0 ? n : 1) * 2, sizeof *tmp);
  if (!tmp) return kl_fail(err, KL_ENOMEM, "out of memory");
  char **bak = tmp + (n > 0 ? n : 1);
  int rc = 0, i, *skip = calloc((size_t)(n > 0 ? n : 1), sizeof *skip);
  if (!skip) rc = kl_fail(err, KL_ENOMEM, "out of memory");
  /* Every target checked before anything is written. */
  for (i = 0; i < n && rc == 0; i++) {
    int s = same_content(&files[i], err);
    if (s < 0) rc = KL_EIO;
    else skip[i] = s;
  }
  for (i = 0; i < n && rc == 0; i++) {
    if (skip[i] == SAME) continue;
    tmp[i] = temp_beside(files[i].path);
    if (!tmp[i]) rc = kl_fail(err, KL_ENOMEM, "out of memory");
    else if ((rc = write_temp(&files[i], tmp[i], err)) != 0) {
      free(tmp[i]);
      tmp[i] = NULL;
    }
  }
  /* All written: now the renames; a failure puts back what was replaced. */
  for (i = 0; i < n && rc == 0; i++) {
    if (skip[i] == SAME) continue;
    bak[i] = skip[i] == DIFFERS ? backup(files[i].path) : NULL;
    if (rename(tmp[i], files[i].path) != 0) {
      rc = kl_fail(err, KL_EIO, "%s: cannot rename into place: %s", files[i].path, strerror(errno));
      for (int k = 0; k < i; k++) {
        if (bak[k]) rename(bak[k], files[k].path);
        else if (skip[k] == ABSENT) unlink(files[k].path);
      }
    } else {
      free(tmp[i]);
      tmp[i] = NULL;
    }
  }
  for (i = 0; i < n; i++) {
    if (tmp[i]) unlink(tmp[i]);
    if (bak[i]) unlink(bak[i]);
    free(tmp[i]);
    free(bak[i]);
  }
  free(tmp);
  free(skip);
  return rc;
}
