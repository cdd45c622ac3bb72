/* Reading inputs with a size limit, and writing outputs all-or-nothing: a
 * failed run must leave no half-written .cu or .h behind. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "klgen.h"

int kl_read_file(const char *path, char **data, size_t *size, size_t limit, kl_err *err) {
  *data = NULL;
  *size = 0;
  FILE *f = fopen(path, "rb");
  if (!f) return kl_fail(err, KL_EIO, "%s: cannot open: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
    fclose(f);
    return kl_fail(err, KL_EIO, "%s: not a regular file", path);
  }
  if ((size_t)st.st_size > limit) {
    fclose(f);
    return kl_fail(err, KL_EIO, "%s: %lld bytes, larger than the %zu-byte limit", path,
                   (long long)st.st_size, limit);
  }
  char *buf = malloc((size_t)st.st_size + 1);
  if (!buf) {
    fclose(f);
    return kl_fail(err, KL_ENOMEM, "out of memory");
  }
  size_t n = fread(buf, 1, (size_t)st.st_size, f);
  int bad = ferror(f);
  fclose(f);
  if (bad) {
    free(buf);
    return kl_fail(err, KL_EIO, "%s: read error", path);
  }
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

static int write_temp(const kl_file_out *f, char *tmp, kl_err *err) {
  int fd = mkstemp(tmp);
  if (fd < 0) return kl_fail(err, KL_EIO, "%s: cannot create: %s", f->path, strerror(errno));
  int bad = write_all(fd, f->data, f->size) != 0;
  bad |= fchmod(fd, 0644) != 0;
  bad |= close(fd) != 0;
  if (bad) {
    int e = errno;
    unlink(tmp);
    return kl_fail(err, KL_EIO, "%s: write failed: %s", f->path, strerror(e));
  }
  return 0;
}

int kl_write_files_atomic(const kl_file_out *files, int n, kl_err *err) {
  char **tmp = calloc((size_t)(n > 0 ? n : 1), sizeof *tmp);
  if (!tmp) return kl_fail(err, KL_ENOMEM, "out of memory");
  int rc = 0, i;
  for (i = 0; i < n && rc == 0; i++) {
    tmp[i] = temp_beside(files[i].path);
    if (!tmp[i]) rc = kl_fail(err, KL_ENOMEM, "out of memory");
    else if ((rc = write_temp(&files[i], tmp[i], err)) != 0) {
      free(tmp[i]);
      tmp[i] = NULL;
    }
  }
  /* All written: now the renames, which cannot fail for lack of space. */
  for (i = 0; i < n && rc == 0; i++)
    if (rename(tmp[i], files[i].path) != 0)
      rc = kl_fail(err, KL_EIO, "%s: cannot rename into place: %s", files[i].path, strerror(errno));
    else {
      free(tmp[i]);
      tmp[i] = NULL;
    }
  for (i = 0; i < n; i++) {
    if (tmp[i]) unlink(tmp[i]);
    free(tmp[i]);
  }
  free(tmp);
  return rc;
}
