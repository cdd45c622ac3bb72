/* The words a spec is written in: its fields' names and its dtypes' names.
 * The loader (spec.c), the checks (validate.c), the messages (util.c) and the
 * outputs (render.c, main.c) all name fields and dtypes; they take the names
 * from here, and this calls none of them. */
#include "klgen.h"

const char *const kl_field_names[KL_F_COUNT] = {
    "name",       "vocab_size", "pad_to",    "padded_vocab", "tp",      "dtype",
    "max_tokens", "timeout_ms", "out_dtype", "softcap",      "scale",   "numerics",
    "topk",       "noise"};

const char *kl_dtype_name(kl_dtype d) {
  switch (d) {
    case KL_BF16: return "bf16";
    case KL_FP16: return "fp16";
    case KL_FP32: return "fp32";
  }
  return "?";
}

const char *kl_noise_name(kl_noise n) { return n == KL_NOISE_VLLM ? "vllm" : "philox"; }
