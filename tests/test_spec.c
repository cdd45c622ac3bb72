/* Spec loading and validation: every malformed spec gets its precise error. */
#include <string.h>

#include "check.h"
#include "klgen.h"

static int load(const char *src, kl_spec_list *l, kl_err *e) {
  return kl_spec_load_string("t.lua", src, strlen(src), l, e);
}

/* src must fail with a message that starts with `prefix` and contains `part`. */
static void bad(const char *src, const char *prefix, const char *part) {
  kl_spec_list l;
  kl_err e = {{0}};
  int rc = load(src, &l, &e);
  CHECK(rc == KL_ESPEC, "accepted (rc %d): %s", rc, src);
  if (rc != KL_ESPEC) return kl_spec_list_free(&l);
  CHECK(strncmp(e.msg, prefix, strlen(prefix)) == 0, "message '%s' does not start with '%s'",
        e.msg, prefix);
  CHECK(strstr(e.msg, part) != NULL, "message '%s' lacks '%s'", e.msg, part);
  CHECK(l.v == NULL && l.n == 0, "a failed load left specs behind");
}

#define OK_FIELDS "vocab_size = 163840, tp = 8, dtype = 'bf16', max_tokens = 64"
#define SPEC(extra) "return { name = 'm', " OK_FIELDS extra " }"

static void good_specs(void) {
  kl_spec_list l;
  kl_err e;
  int rc = load("return {\n name = 'kimi',\n vocab_size = 163840,\n pad_to = 64,\n tp = 8,\n"
                " dtype = 'bf16',\n max_tokens = 64,\n timeout_ms = 500 }", &l, &e);
  CHECK(rc == 0, "good spec rejected: %s", e.msg);
  if (rc == 0) {
    const kl_spec *s = &l.v[0];
    CHECK(l.n == 1 && !strcmp(s->name, "kimi") && s->vocab_size == 163840 && s->pad_to == 64 &&
              s->tp == 8 && s->dtype == KL_BF16 && s->max_tokens == 64 && s->timeout_ms == 500,
          "fields not read back");
    CHECK(s->line[KL_F_TP] == 5 && s->line[KL_F_NAME] == 2, "lines %d %d", s->line[KL_F_TP],
          s->line[KL_F_NAME]);
    kl_spec_list_free(&l);
  }
  /* A loop generating several TP degrees; integral floats are integers. */
  rc = load("local t = {}\nfor _, tp in ipairs{2, 4, 8} do\n t[#t+1] = { name = 'x_tp'..tp, "
            "vocab_size = 2^17, tp = tp, dtype = 'fp16', max_tokens = 8 }\nend\nreturn t",
            &l, &e);
  CHECK(rc == 0 && l.n == 3, "loop spec: %s", e.msg);
  if (rc == 0) {
    CHECK(!strcmp(l.v[2].name, "x_tp8") && l.v[2].tp == 8 && l.v[0].vocab_size == 131072,
          "loop specs wrong");
    kl_spec_list_free(&l);
  }
  rc = load("return { name = 'f', vocab_size = 1000, padded_vocab = 1024, tp = 4, dtype = "
            "'fp32', max_tokens = 1 }", &l, &e);
  CHECK(rc == 0 && l.v[0].padded_vocab == 1024 && l.v[0].dtype == KL_FP32, "padded_vocab: %s",
        e.msg);
  kl_spec_list_free(&l);
}

static void sandbox(void) {
  bad("return {", "t.lua:1:", "expected");
  bad("x = = 1", "t.lua:1:", "unexpected symbol");
  bad("\n\nerror('boom')", "t.lua:3:", "boom");
  bad("error({})", "t.lua:1:", "error object");
  bad("local x = nil + 1", "t.lua:1:", "arithmetic");
  bad("while true do end", "t.lua:1:", "instruction budget");
  bad("local t = {} for i = 1, 1e9 do t[i] = i end", "t.lua:1:", "memory limit");
  bad("local s = 'x' while true do s = s .. s end", "t.lua:1:", "memory limit");
  bad("return string.rep('x', 1 << 30)", "t.lua:1:", "memory limit");
  bad("return os.execute('true')", "t.lua:1:", "global 'os'");
  bad("return os.getenv('HOME')", "t.lua:1:", "global 'os'");
  bad("return io.open('/etc/passwd')", "t.lua:1:", "global 'io'");
  bad("return require('os')", "t.lua:1:", "global 'require'");
  bad("return load('return 1')()", "t.lua:1:", "global 'load'");
  bad("return dofile('/etc/passwd')", "t.lua:1:", "global 'dofile'");
  bad("return loadfile('/etc/passwd')", "t.lua:1:", "global 'loadfile'");
  bad("return string.dump(function() end)", "t.lua:1:", "field 'dump'");
  bad("return ('').dump(print)", "t.lua:1:", "field 'dump'");
  bad("return debug.getinfo(1)", "t.lua:1:", "global 'debug'");
  bad("return package.loadlib('x', 'y')", "t.lua:1:", "global 'package'");
  bad("return collectgarbage('count')", "t.lua:1:", "global 'collectgarbage'");
  bad("print('hi') return {}", "t.lua:1:", "global 'print'");
  bad("\x1bLua\x54\x00\x19\x93\r\n\x1a\n", "t.lua:1:", "binary");
}

static void shape(void) {
  bad("return 42", "t.lua:1:", "must return a table");
  bad("\nreturn 'x'", "t.lua:2:", "must return a table");
  bad("return { { name = 'a', " OK_FIELDS " }, 5 }", "t.lua:1:", "list entry 2");
  bad("return { { name = 'a', " OK_FIELDS " }, { name = 'a', " OK_FIELDS " } }", "t.lua:1: name:",
      "used by two specs");
  bad("return {}", "t.lua:1: name:", "missing");
}

static void fields(void) {
  bad("return {\n vocab_size = 5,\n tp = 1, dtype = 'bf16', max_tokens = 1 }", "t.lua:", "name: missing");
  bad("return { name = 'm', tp = 8, dtype = 'bf16', max_tokens = 1 }", "t.lua:1: vocab_size:",
      "missing");
  bad("return { name = 'm', vocab_size = 8, dtype = 'bf16', max_tokens = 1 }", "t.lua:1: tp:",
      "missing");
  bad("return { name = 'm', vocab_size = 8, tp = 1, max_tokens = 1 }", "t.lua:1: dtype:", "missing");
  bad("return { name = 'm', vocab_size = 8, tp = 1, dtype = 'bf16' }", "t.lua:1: max_tokens:",
      "missing");
  bad("return {\n name = 'm',\n vocab_sise = 5 }", "t.lua:3: vocab_sise:",
      "unknown field (did you mean 'vocab_size'?)");
  bad(SPEC(", colour = 'red'"), "t.lua:1: colour:", "unknown field");
  bad(SPEC(", [1] = 'x'"), "t.lua:1: name:", "non-string key");
  bad("return { name = 'm', vocab_size = '163840', tp = 8, dtype = 'bf16', max_tokens = 1 }",
      "t.lua:1: vocab_size:", "expected an integer, got string");
  bad("return { name = 'm', vocab_size = 1.5, tp = 8, dtype = 'bf16', max_tokens = 1 }",
      "t.lua:1: vocab_size:", "expected an integer, got 1.5");
  bad("return { name = 'm', vocab_size = 0/0, tp = 8, dtype = 'bf16', max_tokens = 1 }",
      "t.lua:1: vocab_size:", "expected an integer");
  bad("return { name = 'm', vocab_size = 8, tp = true, dtype = 'bf16', max_tokens = 1 }",
      "t.lua:1: tp:", "got boolean");
  bad("return { name = 'm', vocab_size = 8, tp = 1, dtype = 'bf8', max_tokens = 1 }",
      "t.lua:1: dtype:", "'bf8' is not one of bf16, fp16, fp32");
  bad("return { name = 'm', vocab_size = 8, tp = 1, dtype = 16, max_tokens = 1 }",
      "t.lua:1: dtype:", "expected a string");
  bad("return { name = 7, " OK_FIELDS " }", "t.lua:1: name:", "expected a string, got number");
}

static void names(void) {
  const char *bads[][2] = {
      {"kimi-k3", "not a C identifier"},  {"9abc", "must start with a letter"},
      {"../etc/passwd", "not a C identifier"}, {"a b", "not a C identifier"},
      {"x\\\"; evil", "not a C identifier"}, {"", "empty"},
      {"int", "keyword"},                 {"__x", "reserved"},
      {"_X", "reserved"},                 {"caf\\u{e9}", "not a C identifier"},
      {"a/b", "not a C identifier"},      {"x\\0y", "NUL"},
      {"abcdefghijabcdefghijabcdefghijabcdefghijabcdefghi", "at most 48"}};
  for (size_t i = 0; i < sizeof bads / sizeof *bads; i++) {
    char src[512];
    snprintf(src, sizeof src, "return { name = \"%s\", " OK_FIELDS " }", bads[i][0]);
    bad(src, "t.lua:1: name:", bads[i][1]);
  }
}

static void ranges(void) {
  bad("return { name = 'm', vocab_size = 0, tp = 1, dtype = 'bf16', max_tokens = 1 }",
      "t.lua:1: vocab_size:", "0 is out of range");
  bad("return { name = 'm', vocab_size = -5, tp = 1, dtype = 'bf16', max_tokens = 1 }",
      "t.lua:1: vocab_size:", "out of range");
  bad("return { name = 'm', vocab_size = 2^40, tp = 1, dtype = 'bf16', max_tokens = 1 }",
      "t.lua:1: vocab_size:", "out of range");
  bad("return { name = 'm', vocab_size = 8, tp = 0, dtype = 'bf16', max_tokens = 1 }",
      "t.lua:1: tp:", "out of range (1..64)");
  bad("return { name = 'm', vocab_size = 8, tp = -1, dtype = 'bf16', max_tokens = 1 }",
      "t.lua:1: tp:", "out of range");
  bad("return { name = 'm', vocab_size = 4096, tp = 65, dtype = 'bf16', max_tokens = 1 }",
      "t.lua:1: tp:", "out of range");
  bad("return { name = 'm', vocab_size = 8, tp = 1, dtype = 'bf16', max_tokens = 0 }",
      "t.lua:1: max_tokens:", "out of range");
  bad("return { name = 'm', vocab_size = 8, tp = 1, dtype = 'bf16', max_tokens = 1e9 }",
      "t.lua:1: max_tokens:", "out of range");
  bad(SPEC(", pad_to = 0"), "t.lua:1: pad_to:", "out of range");
  bad(SPEC(", padded_vocab = 100"), "t.lua:1: padded_vocab:", "out of range");
  bad(SPEC(", pad_to = 64, padded_vocab = 163840"), "t.lua:1: padded_vocab:", "not both");
  bad(SPEC(", timeout_ms = 0"), "t.lua:1: timeout_ms:", "out of range");
  bad(SPEC(", pad_to = 0.0"), "t.lua:1: pad_to:", "out of range");
  bad(SPEC(", timeout_ms = 600001"), "t.lua:1: timeout_ms:", "out of range");
  bad("return {\n name = 'gpt2',\n vocab_size = 50257,\n pad_to = 64,\n tp = 5,\n dtype = "
      "'fp16', max_tokens = 1 }",
      "t.lua:5: tp:", "padded vocab 50304 (vocab_size 50257 padded to a multiple of 64) is not "
      "divisible by tp 5; pad_to = 320 would work (padded vocab 50560), or tp in 1, 2, 4, 8, 16, "
      "32, 64");
  bad("return { name = 'm', vocab_size = 1000, padded_vocab = 1001, tp = 2, dtype = 'bf16', "
      "max_tokens = 1 }", "t.lua:1: tp:", "padded_vocab = 1002 would work");
  bad("return { name = 'm', vocab_size = 163840, tp = 8, dtype = 'fp32', max_tokens = 65536 }",
      "t.lua:1: max_tokens:", "over the 1024 MiB cap; max_tokens <= 546 fits");
}

int main(void) {
  good_specs();
  sandbox();
  shape();
  fields();
  names();
  ranges();
  return check_done();
}
