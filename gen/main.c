/* klgen: specs/<model>.lua -> <name>.cu + <name>.h (and optionally cubins). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "klgen.h"
#include "param.h"

#define MAX_ARCH 8
/* The specs of one file that klgen turns into kernels: each is two
 * renderings (~25 ms) and ~400 KB of output, and with --check or --cubin an
 * NVRTC compilation per --arch (seconds to ~12 s with topk), so a file
 * cannot ask for hours. */
#define KERNEL_SPECS_MAX 16

typedef struct opts {
  const char *out_dir, *templates;
  const char *arch[MAX_ARCH];
  int n_arch, check, cubin, quiet, list;
  kl_limits lim;
  char **specs;
  int n_specs;
} opts;

/* Everything produced for one spec before anything is written. */
typedef struct job {
  kl_spec spec;
  kl_layout layout;
  char *source, *header;
  kl_binary bin[MAX_ARCH];
} job;

static void usage(FILE *f) {
  fputs("usage: klgen [options] [--] SPEC [NAME...]...\n"
        "Generates a CUDA all-gather kernel specialized for each spec.\n"
        "SPEC is a spec file, or a name --list shows: a shipped file's (kimi_k3_tp8,\n"
        "every spec it defines) or a spec's (deepseek_v3_tp4, that spec alone); a file\n"
        "of that name wins. NAMEs after a SPEC pick those of its specs alone.\n\n"
        "  -o DIR           write DIR/<name>.cu and DIR/<name>.h (default: .)\n"
        "  --list           list the shipped specs and the names each defines\n"
        "  --check          validate and compile with NVRTC; write nothing\n"
        "  --arch sm_XY     GPU architecture for --check/--cubin, sm_80 or newer\n"
        "                   (repeatable; default sm_90)\n"
        "  --cubin          also write DIR/<name>.<arch>.cubin\n"
        "  --templates DIR  read templates from DIR instead of the built-in ones\n"
        "  --time-limit MS  wall-clock limit for each spec file's code (default:\n"
        "                   $KLGEN_SPEC_TIME_MS, else 2000)\n"
        "  -q, --quiet      no summary lines\n"
        "  -h, --help       this text\n"
        "  --version        print the version\n"
        "  --               what follows is spec files, even if it starts with '-'\n\n"
        "A file gives kernels for at most 16 specs.\n"
        "Exit status: 0 ok, 1 spec, template, compile or I/O error (or stdout's),\n"
        "2 usage error (options, environment).\n",
        f);
}

/* Text from outside (a file name, a compiler's log) on f, its control bytes
 * escaped (kl_escape): it cannot drive the terminal. */
static void put_escaped(FILE *f, const char *s, int keep_newlines) {
  size_t len = strlen(s), n = 4 * len + 1;
  char *buf = malloc(n);
  if (buf) fputs(kl_escape(s, len, buf, n, keep_newlines), f);
  free(buf);
}

/* arg is the caller's text (a file name from a glob, say): escaped, it
 * cannot drive the terminal. */
static int usage_error(const char *fmt, const char *arg) {
  char shown[1024];
  fprintf(stderr, "klgen: ");
  fprintf(stderr, fmt, kl_escape(arg, strlen(arg), shown, sizeof shown, 0));
  fprintf(stderr, "\nTry 'klgen --help'.\n");
  return 2;
}

/* sm_ and two or three digits, perhaps a letter: sm_90, sm_90a, sm_100f. */
static int is_arch(const char *s) {
  size_t n = strlen(s), d = 0;
  if (strncmp(s, "sm_", 3) != 0) return 0;
  while (3 + d < n && s[3 + d] >= '0' && s[3 + d] <= '9') d++;
  if (d < 2 || d > 3) return 0;
  return 3 + d == n || (3 + d + 1 == n && s[n - 1] >= 'a' && s[n - 1] <= 'z');
}

/* The XY of sm_XY (is_arch already holds). */
static int arch_number(const char *s) { return atoi(s + 3); }

/* The limit of a spec's code: --time-limit, else $KLGEN_SPEC_TIME_MS, else
 * the default, each read as libklrt reads the variable (param.c). A
 * malformed variable is refused, with the library's message, even beside
 * --time-limit: a typo in it must not pass silently. */
static int spec_time_limit(opts *o) {
  char why[KL_PARAM_WHY], shown[4 * KL_PARAM_WHY];
  long long ms;
  if (kl_param_get(KL_P_SPEC_TIME_MS, &ms, why, sizeof why) != 0) {
    kl_escape(why, strlen(why), shown, sizeof shown, 0);
    fprintf(stderr, "klgen: environment: %s\n", shown);
    return -1;
  }
  if (o->lim.time_ms == 0) o->lim.time_ms = ms;
  return 0;
}

/* Returns -1 to continue, else an exit status. */
static int parse(int argc, char **argv, opts *o) {
  memset(o, 0, sizeof *o);
  o->out_dir = ".";
  o->specs = calloc((size_t)argc, sizeof *o->specs);
  if (!o->specs) return 1;
  int paths = 0; /* after "--" */
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    int more = i + 1 < argc;
    if (paths) {
      o->specs[o->n_specs++] = argv[i];
      continue;
    }
    if (!strcmp(a, "--")) paths = 1;
    else if (!strcmp(a, "-h") || !strcmp(a, "--help")) return usage(stdout), 0;
    else if (!strcmp(a, "--version")) return printf("klgen %s\n", KLGEN_VERSION), 0;
    else if (!strcmp(a, "--check")) o->check = 1;
    else if (!strcmp(a, "--list")) o->list = 1;
    else if (!strcmp(a, "--cubin")) o->cubin = 1;
    else if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) o->quiet = 1;
    else if (!strcmp(a, "-o") || !strcmp(a, "--templates") || !strcmp(a, "--arch") ||
             !strcmp(a, "--time-limit")) {
      if (!more) return usage_error("option %s needs an argument", a);
      const char *v = argv[++i];
      if (!strcmp(a, "--time-limit")) {
        char what[96], why[KL_PARAM_WHY];
        long long ms;
        snprintf(what, sizeof what, "--time-limit %.64s", v);
        if (kl_param_parse(KL_P_SPEC_TIME_MS, v, what, &ms, why, sizeof why) != 0)
          return usage_error("%s", why);
        o->lim.time_ms = ms;
      } else if (!strcmp(a, "-o")) o->out_dir = v;
      else if (!strcmp(a, "--templates")) o->templates = v;
      else if (o->n_arch == MAX_ARCH) return usage_error("too many --arch (at most 8): %s", v);
      else o->arch[o->n_arch++] = v;
    } else if (a[0] == '-' && a[1] != 0) return usage_error("unknown option %s", a);
    else o->specs[o->n_specs++] = argv[i];
  }
  if (spec_time_limit(o) != 0) return 2;
  if (o->list) return o->n_specs ? usage_error("%s", "--list takes no spec") : -1;
  if (o->n_specs == 0) return usage_error("%s", "no spec file given");
  if (o->check && o->cubin) return usage_error("%s", "--check writes nothing; drop --cubin");
  if (o->n_arch == 0) o->arch[o->n_arch++] = "sm_90";
  for (int i = 0; i < o->n_arch; i++)
    if (!is_arch(o->arch[i]))
      return usage_error("--arch %s: expected sm_XY (e.g. sm_90, sm_100)", o->arch[i]);
    else if (arch_number(o->arch[i]) < 80) /* one line: --help would not help */
      return fprintf(stderr, "klgen: --arch %s: the kernels need sm_80 or newer (Ampere, Hopper, "
                     "Blackwell)\n", o->arch[i]), 2;
  return -1;
}

static int render(job *j, const opts *o, kl_err *err) {
  int rc = kl_layout_derive(&j->spec, &j->layout, err);
  if (!rc) rc = kl_render(&j->spec, &j->layout, o->templates, &j->source, err);
  if (!rc) rc = kl_render_header(&j->spec, &j->layout, j->source, o->templates, &j->header, err);
  if (rc || !(o->check || o->cubin)) return rc;
  for (int a = 0; a < o->n_arch && !rc; a++) {
    rc = kl_nvrtc_compile(j->source, j->spec.name, o->arch[a], &j->bin[a], err);
    if (!rc && j->bin[a].log && j->bin[a].log[0]) {
      fprintf(stderr, "klgen: %s (%s): NVRTC says:\n", j->spec.name, o->arch[a]);
      put_escaped(stderr, j->bin[a].log, 1);
    }
  }
  return rc;
}

/* ---- shipped specs, by name ----
 * Where they are, relative to this executable: an installed klgen
 * (bin/../share/klgen/specs) and the Python package's (klgen/bin/../specs);
 * the build tree's klgen also looks in the source tree. */
static const char *const spec_dirs_rel[] = {"../share/klgen/specs", "../specs"};
#define N_SPEC_DIRS (sizeof spec_dirs_rel / sizeof *spec_dirs_rel + 1)

/* The directories that exist, in order of preference; returns their number. */
static int spec_dirs(char dirs[N_SPEC_DIRS][4096]) {
  char exe[4096];
  int n = 0;
  ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
  struct stat st;
  if (len > 0) {
    exe[len] = 0;
    char *slash = strrchr(exe, '/');
    if (slash) *slash = 0;
    for (size_t i = 0; i < N_SPEC_DIRS - 1; i++) {
      int w = snprintf(dirs[n], sizeof dirs[n], "%s/%s", exe, spec_dirs_rel[i]);
      if (w > 0 && (size_t)w < sizeof dirs[n] && stat(dirs[n], &st) == 0 && S_ISDIR(st.st_mode))
        n++;
    }
  }
#ifdef KL_SOURCE_SPECS_DIR
  snprintf(dirs[n], sizeof dirs[n], "%s", KL_SOURCE_SPECS_DIR);
  if (stat(dirs[n], &st) == 0 && S_ISDIR(st.st_mode)) n++;
#endif
  return n;
}

/* A shipped spec's name: letters, digits and '_' (no path, no extension). */
static int is_spec_name(const char *s) {
  if (!*s) return 0;
  for (; *s; s++)
    if (!(*s == '_' || (*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9')))
      return 0;
  return 1;
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The shipped spec files (their stems sorted) of the first directory that
 * has them: *stems malloc'd, each entry too. 0, or an error. */
static int shipped_stems(char dir[4096], char ***stems, int *n, kl_err *err) {
  char dirs[N_SPEC_DIRS][4096];
  *stems = NULL, *n = 0;
  if (spec_dirs(dirs) == 0) return kl_fail(err, KL_EIO, "no shipped specs beside this klgen");
  memcpy(dir, dirs[0], sizeof dirs[0]);
  DIR *d = opendir(dir);
  if (!d) return kl_fail(err, KL_EIO, "%s: cannot open: %s", dir, strerror(errno));
  int rc = 0;
  for (struct dirent *e; (e = readdir(d)) != NULL && !rc;) {
    size_t len = strlen(e->d_name);
    if (len < 5 || strcmp(e->d_name + len - 4, ".lua") != 0) continue;
    char **grown = realloc(*stems, (size_t)(*n + 1) * sizeof **stems);
    if (!grown || !(grown[*n] = strndup(e->d_name, len - 4)))
      rc = kl_fail(err, KL_ENOMEM, "out of memory");
    if (grown) *stems = grown;
    if (!rc) (*n)++;
  }
  closedir(d);
  if (!rc) qsort(*stems, (size_t)*n, sizeof **stems, cmp_str);
  return rc;
}

/* In the shipped files, the file defining the spec `name` (*path malloc'd;
 * NULL if none does). The files are read under `lim`. */
static int shipped_defining(const char *name, const kl_limits *lim, char **path, kl_err *err) {
  char dir[4096];
  char **stems = NULL;
  int n = 0, rc = shipped_stems(dir, &stems, &n, err);
  *path = NULL;
  for (int i = 0; i < n && !rc && !*path; i++) {
    char file[8192];
    kl_spec_list l;
    snprintf(file, sizeof file, "%s/%s.lua", dir, stems[i]); /* both fit */
    if ((rc = kl_spec_load_file(file, lim, &l, err)) != 0) break;
    if (kl_spec_list_find(&l, name) >= 0 && !(*path = strdup(file)))
      rc = kl_fail(err, KL_ENOMEM, "out of memory");
    kl_spec_list_free(&l);
  }
  for (int i = 0; i < n; i++) free(stems[i]);
  free(stems);
  return rc;
}

/* arg as a spec file: itself when it exists or is no name; else the shipped
 * file of that stem, or the shipped file that defines a spec of that name
 * (*pick: the name; *path malloc'd, NULL: arg itself). */
static int resolve_spec(const char *arg, const kl_limits *lim, char **path, const char **pick,
                        kl_err *err) {
  struct stat st;
  *path = NULL, *pick = NULL;
  if (stat(arg, &st) == 0 || !is_spec_name(arg)) return 0;
  char dirs[N_SPEC_DIRS][4096];
  int n = spec_dirs(dirs);
  for (int i = 0; i < n; i++) {
    size_t len = strlen(dirs[i]) + strlen(arg) + 6;
    char *p = malloc(len);
    if (!p) return kl_fail(err, KL_ENOMEM, "out of memory");
    snprintf(p, len, "%s/%s.lua", dirs[i], arg);
    if (stat(p, &st) == 0) return *path = p, 0;
    free(p);
  }
  int rc = n ? shipped_defining(arg, lim, path, err) : 0;
  if (rc || *path) return *pick = arg, rc;
  return kl_fail(err, KL_EIO, "%s: no such file, and no shipped spec file or spec of that name "
                 "(klgen --list shows them)", arg);
}

/* klgen --list: each shipped spec file's stem and the names it defines. */
static int list_specs(const opts *o, kl_err *err) {
  char dir[4096];
  char **stems;
  int n, rc = shipped_stems(dir, &stems, &n, err);
  if (!rc) {
    printf("shipped specs in ");
    put_escaped(stdout, dir, 0);
    printf(" (name: the specs it defines):\n");
  }
  for (int i = 0; i < n && !rc; i++) {
    char path[8192];
    kl_spec_list l;
    snprintf(path, sizeof path, "%s/%s.lua", dir, stems[i]); /* both fit */
    rc = kl_spec_load_file(path, &o->lim, &l, err);
    if (rc) break;
    put_escaped(stdout, stems[i], 0);
    printf(":");
    for (int k = 0; k < l.n; k++) printf(" %s", l.v[k].name);
    printf("\n");
    kl_spec_list_free(&l);
  }
  for (int i = 0; i < n; i++) free(stems[i]);
  free(stems);
  return rc;
}

/* A file's specs that the command line picked (keep[i]; none kept: all) into
 * jobs; names must be unique across them all. l is freed. */
static int add_picked(kl_spec_list *l, const unsigned char *keep, job **jobs, int *n,
                      kl_err *err) {
  int picked = 0, rc = 0;
  for (int i = 0; i < l->n; i++) picked += keep[i];
  for (int i = 0, taken = 0; i < l->n && !rc; i++) {
    if (picked && !keep[i]) continue;
    const kl_spec *sp = &l->v[i];
    if (++taken > KERNEL_SPECS_MAX) {
      rc = kl_spec_fail(err, sp, KL_F_NAME, "'%s' is spec %d of the %d picked from the file; "
                        "klgen generates kernels for at most %d specs a file (split it, or "
                        "name the specs after it)", sp->name, taken, picked ? picked : l->n,
                        KERNEL_SPECS_MAX);
      break;
    }
    for (int k = 0; k < *n && !rc; k++) {
      const kl_spec *prev = &(*jobs)[k].spec;
      if (!kl_name_equal_nocase(prev->name, sp->name)) continue;
      if (strcmp(prev->name, sp->name) == 0)
        rc = kl_spec_fail(err, sp, KL_F_NAME, "'%s' is also defined in %s", sp->name, prev->file);
      else
        rc = kl_spec_fail(err, sp, KL_F_NAME, "'%s' differs only in case from '%s' in %s (files "
                          "and header guards would collide)", sp->name, prev->name, prev->file);
    }
    job *grown = rc ? NULL : realloc(*jobs, (size_t)(*n + 1) * sizeof **jobs);
    if (!rc && !grown) rc = kl_fail(err, KL_ENOMEM, "out of memory");
    if (rc) break;
    *jobs = grown;
    memset(&(*jobs)[*n], 0, sizeof **jobs);
    (*jobs)[(*n)++].spec = *sp;
  }
  kl_spec_list_free(l);
  return rc;
}

/* A spec argument that is no file, no shipped file and no shipped spec's
 * name, after a file that does not define it either: the error names the
 * file's specs too. */
static int not_a_pick(const char *arg, const kl_spec_list *l, kl_err *err) {
  char names[600];
  kl_spec_list_names(l, names, sizeof names);
  return kl_fail(err, KL_EIO, "%s: not a spec of %s (it defines %s), no such file, and no "
                 "shipped spec file or spec of that name (klgen --list shows them)", arg,
                 l->v[0].file, names);
}

/* Loads the specs the command line names: each SPEC's file, all of its
 * specs or the NAMEs after it (or the one a shipped spec's name stands for). */
static int load_all(const opts *o, job **jobs, int *n, kl_err *err) {
  kl_spec_list l = {NULL, 0};
  unsigned char *keep = NULL;
  int rc = 0;
  *jobs = NULL, *n = 0;
  for (int f = 0; f < o->n_specs && !rc; f++) {
    const char *arg = o->specs[f];
    struct stat st;
    int i = l.n && stat(arg, &st) != 0 ? kl_spec_list_find(&l, arg) : -1;
    if (i >= 0) { /* a NAME of the file before it */
      keep[i] = 1;
      continue;
    }
    char *path;
    const char *pick;
    kl_err why;
    rc = resolve_spec(arg, &o->lim, &path, &pick, &why);
    if (rc && l.n && is_spec_name(arg)) rc = not_a_pick(arg, &l, err);
    else if (rc) *err = why;
    if (!rc && l.n) rc = add_picked(&l, keep, jobs, n, err);
    free(keep), keep = NULL;
    if (!rc) rc = kl_spec_load_file(path ? path : arg, &o->lim, &l, err);
    free(path);
    if (!rc && !(keep = calloc((size_t)l.n, 1))) rc = kl_fail(err, KL_ENOMEM, "out of memory");
    /* the file was read once already to find the name; a spec that names
     * another one the second time is refused, never indexed blindly */
    int at = !rc && pick ? kl_spec_list_find(&l, pick) : -1;
    if (!rc && pick && at < 0)
      rc = kl_fail(err, KL_ESPEC, "%s: defined '%s' when it was searched, not now", l.v[0].file, pick);
    if (!rc && pick) keep[at] = 1;
  }
  if (!rc && l.n) rc = add_picked(&l, keep, jobs, n, err);
  kl_spec_list_free(&l);
  free(keep);
  return rc;
}

static char *path_of(const char *dir, const char *name, const char *ext) {
  size_t n = strlen(dir) + strlen(name) + strlen(ext) + 3;
  char *p = malloc(n);
  if (p) snprintf(p, n, "%s/%s%s", dir, name, ext);
  return p;
}

static int write_all(job *jobs, int n, const opts *o, kl_err *err) {
  struct stat st;
  if (stat(o->out_dir, &st) != 0 && mkdir(o->out_dir, 0777) != 0) /* the umask decides */
    return kl_fail(err, KL_EIO, "%s: cannot create directory: %s", o->out_dir, strerror(errno));
  if (stat(o->out_dir, &st) != 0 || !S_ISDIR(st.st_mode))
    return kl_fail(err, KL_EIO, "%s: not a directory", o->out_dir);
  int per = 2 + (o->cubin ? o->n_arch : 0), nf = 0, rc;
  kl_file_out *f = calloc((size_t)(n * per), sizeof *f);
  if (!f) return kl_fail(err, KL_ENOMEM, "out of memory");
  for (int i = 0; i < n; i++) {
    const char *nm = jobs[i].spec.name;
    f[nf++] = (kl_file_out){path_of(o->out_dir, nm, ".cu"), jobs[i].source, strlen(jobs[i].source)};
    f[nf++] = (kl_file_out){path_of(o->out_dir, nm, ".h"), jobs[i].header, strlen(jobs[i].header)};
    for (int a = 0; o->cubin && a < o->n_arch; a++) {
      char ext[32];
      snprintf(ext, sizeof ext, ".%s.cubin", o->arch[a]);
      f[nf++] = (kl_file_out){path_of(o->out_dir, nm, ext), jobs[i].bin[a].data, jobs[i].bin[a].size};
    }
  }
  rc = 0;
  for (int i = 0; i < nf; i++)
    if (!f[i].path) rc = kl_fail(err, KL_ENOMEM, "out of memory");
  if (!rc) rc = kl_write_files_atomic(f, nf, err);
  for (int i = 0; i < nf; i++) free(f[i].path);
  free(f);
  return rc;
}

/* v as the shortest text that reads back as v. */
static void print_double(const char *label, double v) {
  char buf[40];
  for (int prec = 6; prec <= 17; prec++) {
    snprintf(buf, sizeof buf, "%.*g", prec, v);
    if (strtod(buf, NULL) == v) break;
  }
  printf("%s%s", label, buf);
}

static void summary(const job *j, const opts *o) {
  const kl_spec *s = &j->spec;
  const kl_layout *l = &j->layout;
  printf("%s: vocab %lld -> padded %lld, tp %d, shard %lld (%lld B/rank/token), %s, "
         "vec %d B, buffers %.2f MiB/rank",
         s->name, (long long)s->vocab_size, (long long)l->padded_vocab, s->tp,
         (long long)l->shard, (long long)l->shard_bytes, kl_dtype_name(s->dtype), l->vec_bytes,
         (double)l->recv_bytes / (1 << 20));
  if (l->epilogue) {
    printf(", out %s", kl_dtype_name(s->out_dtype));
    if (s->softcap != 0) print_double(", softcap ", s->softcap);
    if (s->scale != 0) print_double(", scale ", s->scale);
    printf(", %s numerics", s->numerics == KL_NUMERICS_FP32 ? "fp32" : "engine");
  }
  if (s->topk) printf(", top-%d", s->topk);
  for (int a = 0; (o->check || o->cubin) && a < o->n_arch; a++)
    printf("%s%s", a ? " " : ", compiled for ", o->arch[a]);
  printf("\n");
}

/* With stdout or stderr closed (`>&-`) the next file opened would take its
 * number, and what is printed would go into that file: /dev/null, opened
 * read-only, takes the number instead, so writing there fails, and
 * finish_output reports it. */
static void hold_std_fds(void) {
  for (int fd = 0; fd <= 2; fd++)
    if (fcntl(fd, F_GETFD) < 0 && errno == EBADF) {
      int held = open("/dev/null", O_RDONLY);
      if (held >= 0 && held != fd) close(held);
    }
}

/* What klgen prints on stdout (the summary, --list, --help) must arrive: a
 * closed or full stdout is an error (exit 1, or 2 as it was), never success
 * with the output lost. */
static int finish_output(int status) {
  int e = fflush(stdout) != 0 ? errno : ferror(stdout) ? EIO : 0;
  if (e == 0) return status;
  fprintf(stderr, "klgen: cannot write to standard output: %s\n", strerror(e));
  return status == 2 ? 2 : 1;
}

static int run(int argc, char **argv) {
  opts o;
  int rc = parse(argc, argv, &o);
  if (rc >= 0) return free(o.specs), rc;
  kl_err err = {{0}};
  if (o.list) {
    rc = list_specs(&o, &err);
    if (rc) fprintf(stderr, "klgen: %s\n", err.msg);
    return free(o.specs), rc ? 1 : 0;
  }
  job *jobs = NULL;
  int n = 0;
  rc = load_all(&o, &jobs, &n, &err);
  for (int i = 0; i < n && !rc; i++) rc = render(&jobs[i], &o, &err);
  if (!rc && !o.check) rc = write_all(jobs, n, &o, &err);
  if (rc) fprintf(stderr, "klgen: %s\n", err.msg);
  for (int i = 0; i < n; i++) {
    if (!rc && !o.quiet) summary(&jobs[i], &o);
    free(jobs[i].source);
    free(jobs[i].header);
    for (int a = 0; a < MAX_ARCH; a++) kl_binary_free(&jobs[i].bin[a]);
  }
  free(jobs);
  free(o.specs);
  return rc ? 1 : 0;
}

int main(int argc, char **argv) {
  hold_std_fds();
  return finish_output(run(argc, argv));
}
