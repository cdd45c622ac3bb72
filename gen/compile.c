/* NVRTC: rendered source -> cubin for one sm_XY. Used by `klgen --check/--cubin`
 * and by the runtime's JIT. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "klgen.h"
#include "nvrtc_api.h"

#define NVRTC_TRY(call, what)                                                        \
  do {                                                                               \
    nvrtcResult r_ = (call);                                                         \
    if (r_ != NVRTC_SUCCESS) {                                                       \
      rc = kl_fail(err, KL_ECOMPILE, "%s: %s: %s", name, what, api->nvrtcGetErrorString(r_)); \
      goto done;                                                                     \
    }                                                                                \
  } while (0)

static int valid_arch(const char *arch) {
  /* sm_XY or sm_XYZ, optionally with an a/f suffix (sm_90a, sm_100f). */
  if (strncmp(arch, "sm_", 3) != 0) return 0;
  size_t n = 0;
  while (arch[3 + n] >= '0' && arch[3 + n] <= '9') n++;
  if (n < 2 || n > 3) return 0;
  const char *rest = arch + 3 + n;
  return *rest == 0 || ((*rest == 'a' || *rest == 'f') && rest[1] == 0);
}

static char *get_log(const kl_nvrtc_api *api, nvrtcProgram prog) {
  size_t n = 0;
  if (api->nvrtcGetProgramLogSize(prog, &n) != NVRTC_SUCCESS || n == 0) n = 1;
  char *log = calloc(n + 1, 1);
  if (log && n > 1) api->nvrtcGetProgramLog(prog, log);
  /* NVRTC's log is "\0" or "\n\0" when there is nothing to say. */
  if (log && log[0] == '\n' && log[1] == 0) log[0] = 0;
  return log;
}

/* Every option besides the arch: the JIT cache's key covers them
 * (kl_nvrtc_options), so a change here never reuses an old cubin.
 * -std=c++17 for static_assert/constexpr; no fast-math: the kernels move bits. */
static const char *const fixed_opts[] = {"-std=c++17", "-lineinfo"};
#define N_FIXED (int)(sizeof fixed_opts / sizeof *fixed_opts)

void kl_nvrtc_options(char *buf, size_t n) {
  size_t used = 0;
  buf[0] = 0;
  for (int i = 0; i < N_FIXED && used < n; i++)
    used += (size_t)snprintf(buf + used, n - used, "%s%s", i ? " " : "", fixed_opts[i]);
}

static _Atomic unsigned long compiles;

unsigned long kl_nvrtc_compiles(void) { return compiles; }

int kl_nvrtc_compile(const char *source, const char *name, const char *arch, kl_binary *out,
                     kl_err *err) {
  if (!source || !name || !arch || !out) return kl_fail(err, KL_EARG, "kl_nvrtc_compile: NULL argument");
  memset(out, 0, sizeof *out);
  if (!valid_arch(arch))
    return kl_fail(err, KL_EARG, "'%s' is not a GPU architecture (expected sm_XY, e.g. sm_90)", arch);
  char why[1024];
  const kl_nvrtc_api *api = kl_nvrtc_api_get(why, sizeof why);
  if (!api) return kl_fail(err, KL_ECOMPILE, "%s: %s", name, why);
  char arch_opt[32];
  snprintf(arch_opt, sizeof arch_opt, "--gpu-architecture=%s", arch);
  const char *opts[1 + N_FIXED] = {arch_opt};
  for (int i = 0; i < N_FIXED; i++) opts[1 + i] = fixed_opts[i];
  nvrtcProgram prog = NULL;
  int rc = 0;
  char file[128];
  snprintf(file, sizeof file, "%s.cu", name);
  NVRTC_TRY(api->nvrtcCreateProgram(&prog, source, file, 0, NULL, NULL), "create");
  compiles++;
  nvrtcResult cr = api->nvrtcCompileProgram(prog, (int)(sizeof opts / sizeof *opts), opts);
  out->log = get_log(api, prog);
  if (cr != NVRTC_SUCCESS) {
    rc = kl_fail_log(err, KL_ECOMPILE, "%s: NVRTC failed for %s:\n%s", name, arch,
                 out->log ? out->log : "(no log)");
    goto done;
  }
  NVRTC_TRY(api->nvrtcGetCUBINSize(prog, &out->size), "cubin size");
  out->data = malloc(out->size ? out->size : 1);
  if (!out->data) {
    rc = kl_fail(err, KL_ENOMEM, "out of memory");
    goto done;
  }
  NVRTC_TRY(api->nvrtcGetCUBIN(prog, out->data), "cubin");
done:
  if (prog) api->nvrtcDestroyProgram(&prog);
  if (rc) kl_binary_free(out);
  return rc;
}

void kl_binary_free(kl_binary *b) {
  if (!b) return;
  free(b->data);
  free(b->log);
  memset(b, 0, sizeof *b);
}

int kl_nvrtc_version(int *major, int *minor) {
  char why[1024];
  const kl_nvrtc_api *api = kl_nvrtc_api_get(why, sizeof why);
  return api && api->nvrtcVersion(major, minor) == NVRTC_SUCCESS ? 0 : KL_ECOMPILE;
}
