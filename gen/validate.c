/* Field ranges and the C-identifier rules for `name`. Layout-level checks
 * (divisibility, buffer sizes) live in layout.c, the one place that derives it. */
#include "klgen.h"

#include <ctype.h>
#include <string.h>

/* C, C++ and CUDA words a name must not be: it becomes symbol names in the
 * generated .cu (compiled as C++ by NVRTC) and .h (included from C). */
static const char *const reserved[] = {
    "alignas", "alignof", "and", "asm", "auto", "bool", "break", "case", "catch", "char",
    "class", "const", "constexpr", "continue", "decltype", "default", "delete", "do",
    "double", "else", "enum", "explicit", "export", "extern", "false", "float", "for",
    "friend", "goto", "if", "inline", "int", "long", "mutable", "namespace", "new",
    "noexcept", "not", "nullptr", "operator", "or", "private", "protected", "public",
    "register", "restrict", "return", "short", "signed", "sizeof", "static", "struct",
    "switch", "template", "this", "throw", "true", "try", "typedef", "typeid", "typename",
    "union", "unsigned", "using", "virtual", "void", "volatile", "while", "main",
    "dim3", "warpSize", "threadIdx", "blockIdx", "blockDim", "gridDim", NULL};

static int check_name(const kl_spec *s, kl_err *err) {
  const char *n = s->name;
  size_t len = strlen(n);
  if (len == 0) return kl_spec_fail(err, s, KL_F_NAME, "empty");
  if (len > KL_NAME_MAX)
    return kl_spec_fail(err, s, KL_F_NAME, "'%s' is %zu chars long (at most %d)", n, len,
                        KL_NAME_MAX);
  if (!(isalpha((unsigned char)n[0]) || n[0] == '_'))
    return kl_spec_fail(err, s, KL_F_NAME,
                        "'%s' is not a C identifier (must start with a letter or '_'); it "
                        "becomes file and symbol names", n);
  for (size_t i = 0; i < len; i++)
    if (!(isalnum((unsigned char)n[i]) || n[i] == '_') || (n[i] & 0x80))
      return kl_spec_fail(err, s, KL_F_NAME,
                          "'%s' is not a C identifier (character %zu is '%c'; use letters, "
                          "digits and '_'); it becomes file and symbol names", n, i + 1,
                          isprint((unsigned char)n[i]) ? n[i] : '?');
  if (n[0] == '_' && (n[1] == '_' || isupper((unsigned char)n[1])))
    return kl_spec_fail(err, s, KL_F_NAME, "'%s' is reserved to the C implementation", n);
  for (const char *const *r = reserved; *r; r++)
    if (strcmp(n, *r) == 0) return kl_spec_fail(err, s, KL_F_NAME, "'%s' is a C/C++ keyword", n);
  return 0;
}

static int range(const kl_spec *s, kl_field f, int64_t v, int64_t lo, int64_t hi, kl_err *err) {
  if (v >= lo && v <= hi) return 0;
  return kl_spec_fail(err, s, f, "%lld is out of range (%lld..%lld)", (long long)v,
                      (long long)lo, (long long)hi);
}

int kl_spec_validate(const kl_spec *s, kl_err *err) {
  int rc;
  if ((rc = check_name(s, err))) return rc;
  if ((rc = range(s, KL_F_VOCAB_SIZE, s->vocab_size, 1, KL_VOCAB_MAX, err))) return rc;
  if (s->pad_to && s->padded_vocab)
    return kl_spec_fail(err, s, KL_F_PADDED_VOCAB, "give pad_to or padded_vocab, not both");
  if (s->pad_to && (rc = range(s, KL_F_PAD_TO, s->pad_to, 1, 1 << 16, err))) return rc;
  if (s->padded_vocab &&
      (rc = range(s, KL_F_PADDED_VOCAB, s->padded_vocab, s->vocab_size, 2 * KL_VOCAB_MAX, err)))
    return rc;
  if ((rc = range(s, KL_F_TP, s->tp, 1, KL_TP_MAX, err))) return rc;
  if ((rc = range(s, KL_F_MAX_TOKENS, s->max_tokens, 1, KL_TOKENS_MAX, err))) return rc;
  if (s->timeout_ms && (rc = range(s, KL_F_TIMEOUT_MS, s->timeout_ms, 1, 600000, err))) return rc;
  if (s->out_dtype != s->dtype && s->out_dtype != KL_FP32)
    return kl_spec_fail(err, s, KL_F_OUT_DTYPE, "must be fp32 or the input dtype %s",
                        kl_dtype_name(s->dtype));
  if (s->softcap < 0 || (s->softcap > 0 && (s->softcap < 1e-6 || s->softcap > 1e6)) ||
      s->softcap != s->softcap)
    return kl_spec_fail(err, s, KL_F_SOFTCAP, "%g is out of range (a positive number, 1e-6..1e6)",
                        s->softcap);
  if (s->scale != 0 && (s->scale != s->scale || s->scale < -1e6 || s->scale > 1e6 ||
                        (s->scale > -1e-6 && s->scale < 1e-6)))
    return kl_spec_fail(err, s, KL_F_SCALE, "%g is out of range (a number of magnitude "
                        "1e-6..1e6)", s->scale);
  if (s->numerics != KL_NUMERICS_ENGINE && s->numerics != KL_NUMERICS_FP32)
    return kl_spec_fail(err, s, KL_F_NUMERICS, "must be engine or fp32");
  if (s->topk && (rc = range(s, KL_F_TOPK, s->topk, 1, KL_TOPK_MAX, err))) return rc;
  if (s->topk > s->vocab_size)
    return kl_spec_fail(err, s, KL_F_TOPK, "%d is more than the vocabulary (%lld)", s->topk,
                        (long long)s->vocab_size);
  if (s->noise != KL_NOISE_PHILOX && s->noise != KL_NOISE_VLLM)
    return kl_spec_fail(err, s, KL_F_NOISE, "must be philox or vllm");
  if (s->noise != KL_NOISE_PHILOX && !s->topk)
    return kl_spec_fail(err, s, KL_F_NOISE, "'%s' without topk: only a spec with topk samples",
                        kl_noise_name(s->noise));
  kl_layout l;
  return kl_layout_derive(s, &l, err);
}
