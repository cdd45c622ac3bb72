/* Rendering: spec + layout -> CUDA source and C header, through the Lua template
 * engine (render.lua) and the templates embedded at build time (or a directory
 * given with --templates). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "embedded.h"
#include "kl_abi.h"
#include "klgen.h"
#include "lauxlib.h"
#include "sandbox.h"

#define TEMPLATE_MAX (1u << 20)

/* The kernel source is these templates, rendered and concatenated in order:
 * a tiny prelude of constants, then readable kernel logic (FlashInfer's
 * split), by concern, each part using only those before it
 * (templates/README.md). */
static const char *const source_parts[] = {
    "prelude.cuh.tmpl", "kl_abi.h",                          /* constants, the contract */
    "memory.cuh.tmpl", "lamport.cuh.tmpl", "epilogue.cuh.tmpl", /* what every kernel uses */
    "oneshot.cu.tmpl",                                       /* the gather */
    "keys.cuh.tmpl", "scan.cuh.tmpl", "noise.cuh.tmpl",      /* select parts: a CTA's scan, */
    "exchange.cuh.tmpl", "merge.cuh.tmpl",                   /* the records between ranks */
    "argmax.cu.tmpl", "topk.cu.tmpl",                        /* the select kernels, */
    "process.cuh.tmpl", "lists.cu.tmpl",                     /* the logits processors, */
    "candidates.cuh.tmpl", "sample.cu.tmpl",                 /* the samplers: the row's, */
    "shards_part.cuh.tmpl", "shards_merge.cuh.tmpl",         /* the shards' (a part, */
    "shards_filter.cuh.tmpl", "shards.cu.tmpl",              /* filters, the kernels), */
    "relayout.cu.tmpl", NULL};
static const char *const header_part = "header.h.tmpl";

uint64_t kl_template_set_hash(void) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (int part = 0; part < 2; part++)
    for (const kl_embedded_file *f = part ? kl_engine : kl_templates; f->name; f++) {
      const unsigned char *p = (const unsigned char *)f->data;
      for (size_t i = 0; i < f->size; i++) h = (h ^ p[i]) * 0x100000001b3ULL;
      h = (h ^ 0xff) * 0x100000001b3ULL; /* a boundary between files */
    }
  return h;
}

void kl_entry_name(const kl_spec *s, const char *kind, char *buf, size_t n) {
  snprintf(buf, n, "kl_%s_%s", s->name, kind);
}

static int get_template(const char *dir, const char *name, char **text, size_t *len,
                        kl_err *err) {
  if (dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return kl_read_file(path, text, len, TEMPLATE_MAX, err);
  }
  for (const kl_embedded_file *f = kl_templates; f->name; f++)
    if (strcmp(f->name, name) == 0) {
      *text = malloc(f->size + 1);
      if (!*text) return kl_fail(err, KL_ENOMEM, "out of memory");
      memcpy(*text, f->data, f->size + 1);
      *len = f->size;
      return 0;
    }
  return kl_fail(err, KL_ETEMPLATE, "template %s is not embedded", name);
}

static void set_int(lua_State *L, const char *k, long long v) {
  lua_pushinteger(L, v);
  lua_setfield(L, -2, k);
}
static void set_str(lua_State *L, const char *k, const char *v) {
  lua_pushstring(L, v);
  lua_setfield(L, -2, k);
}

/* A float as an exact C++ literal: "0x1.4p+4f". */
static void set_float(lua_State *L, const char *k, float v) {
  char buf[64];
  snprintf(buf, sizeof buf, "%af", (double)v);
  set_str(L, k, buf);
}

/* The constants a template sees. */
static void push_env(lua_State *L, const kl_spec *s, const kl_layout *l) {
  char buf[128];
  lua_newtable(L);
  set_str(L, "KLGEN_VERSION", KLGEN_VERSION);
  set_str(L, "NAME", s->name);
  char label[KL_FILE_LABEL_MAX + 1];
  kl_file_label(s->file, label, sizeof label);
  set_str(L, "SPEC_FILE", label);
  set_str(L, "DTYPE", kl_dtype_name(s->dtype));
  set_int(L, "VOCAB", s->vocab_size);
  set_int(L, "PADDED_VOCAB", l->padded_vocab);
  set_int(L, "TP", s->tp);
  set_int(L, "SHARD", l->shard);
  set_int(L, "MAX_TOKENS", s->max_tokens);
  set_int(L, "ELEM_BYTES", l->elem_bytes);
  set_int(L, "VEC_BYTES", l->vec_bytes);
  set_int(L, "SHARD_BYTES", l->shard_bytes);
  set_int(L, "VOCAB_BYTES", s->vocab_size * l->elem_bytes);
  set_int(L, "ROW_CHUNKS", l->row_chunks);
  set_int(L, "SLOT_BYTES", l->slot_bytes);
  set_int(L, "BUFFER_BYTES", l->buffer_bytes);
  set_int(L, "TOTAL_BYTES", l->total_bytes);
  set_int(L, "BLOCK", l->block);
  set_int(L, "CHUNK_THREADS", l->chunk_threads);
  set_int(L, "RELAYOUT_BLOCK", l->relayout_block);
  set_int(L, "MAX_CTAS", l->max_ctas);
  set_int(L, "TIMEOUT_NS", l->timeout_ns);
  set_int(L, "TIMEOUT_MS", l->timeout_ns / 1000000);
  set_int(L, "PAD_TO", s->pad_to);
  set_int(L, "DTYPE_ID", (long long)s->dtype);
  set_int(L, "ABI_VERSION", KL_ABI_VERSION);
  /* The epilogue (EPILOGUE 0: none, and none of the rest is used). Constants
   * are float literals in hex: exact, as the engine's torch ops see them
   * (a Python float scalar becomes a float for bf16/fp16/fp32 tensors). */
  set_int(L, "EPILOGUE", l->epilogue);
  set_int(L, "OUT_ELEM_BYTES", l->out_elem_bytes);
  set_int(L, "OUT_VEC_BYTES", l->out_vec_bytes);
  set_str(L, "OUT_DTYPE", kl_dtype_name(s->out_dtype));
  set_str(L, "NUMERICS", s->numerics == KL_NUMERICS_FP32 ? "fp32" : "engine");
  set_int(L, "HAS_SOFTCAP", s->softcap > 0);
  set_int(L, "HAS_SCALE", s->scale != 0 && s->scale != 1);
  set_float(L, "SOFTCAP_F", (float)s->softcap);
  set_float(L, "INV_SOFTCAP_F", s->softcap > 0 ? 1.0f / (float)s->softcap : 0.0f);
  set_float(L, "SCALE_F", s->scale != 0 ? (float)s->scale : 1.0f);
  set_int(L, "OUT_DTYPE_ID", (long long)s->out_dtype);
  set_int(L, "NUMERICS_ID", (long long)s->numerics);
  snprintf(buf, sizeof buf, "%.17g", s->softcap);
  set_str(L, "SOFTCAP_D", buf);
  snprintf(buf, sizeof buf, "%.17g", s->scale);
  set_str(L, "SCALE_D", buf);
  snprintf(buf, sizeof buf, "0x%08xu", (unsigned)l->sentinel32);
  set_str(L, "SENTINEL32", buf);
  kl_entry_name(s, "oneshot", buf, sizeof buf);
  set_str(L, "ONESHOT", buf);
  kl_entry_name(s, "relayout", buf, sizeof buf);
  set_str(L, "RELAYOUT", buf);
  /* kl_argmax / kl_topk (argmax.cu.tmpl, topk.cu.tmpl) */
  set_int(L, "TOPK", s->topk);
  set_int(L, "NOISE_ID", (long long)s->noise);
  set_str(L, "NOISE", kl_noise_name(s->noise));
  set_int(L, "SEL_BLOCK", l->sel_block);
  set_int(L, "TOPK_THREAD_CHUNKS", l->topk_thread_chunks);
  set_int(L, "TOPK_SPLIT", l->topk_split);
  set_int(L, "SHARD_SUBPARTS", l->shard_subparts);
  set_int(L, "SHARD_CTAS", l->shard_ctas);
  set_int(L, "ARGMAX_THREAD_CHUNKS", l->argmax_thread_chunks);
  set_int(L, "ARGMAX_SPLIT", l->argmax_split);
  set_int(L, "REC_SPLIT", l->rec_split);
  set_int(L, "REC_CHUNKS", l->rec_chunks);
  set_int(L, "SEL_OFFSET", l->sel_offset);
  set_int(L, "SEL_SLOT_BYTES", l->sel_slot_bytes);
  set_int(L, "SEL_BUFFER_BYTES", l->sel_buffer_bytes);
  set_int(L, "RECV_BYTES", l->recv_bytes);
  set_int(L, "STAGE_OFFSET", l->stage_offset);
  set_int(L, "STAGE_BUFFER_BYTES", l->stage_buffer_bytes);
  set_int(L, "MARK_OFFSET", l->mark_offset);
  set_int(L, "MARK_BUFFER_BYTES", l->mark_buffer_bytes);
  set_int(L, "FAULT_OFFSET", l->fault_offset);
  set_int(L, "SAMPLE_SLICES", l->sample_slices);
  set_int(L, "SAMPLE_SLICE_COLS", l->sample_slice_cols);
  set_int(L, "SEL_MAX_CTAS", l->sel_max_ctas);
  kl_entry_name(s, "argmax", buf, sizeof buf);
  set_str(L, "ARGMAX", buf);
  kl_entry_name(s, "topk", buf, sizeof buf);
  set_str(L, "TOPK_ENTRY", buf);
  kl_entry_name(s, "sample", buf, sizeof buf); /* sample.cu.tmpl */
  set_str(L, "SAMPLE_ENTRY", buf);
  kl_entry_name(s, "shards", buf, sizeof buf); /* shards.cu.tmpl */
  set_str(L, "SHARDS_ENTRY", buf);
  kl_entry_name(s, "shards_lists", buf, sizeof buf); /* shards.cu.tmpl, calls with lists */
  set_str(L, "SHARDS_LISTS_ENTRY", buf);
  kl_entry_name(s, "candidates", buf, sizeof buf); /* shards.cu.tmpl, with filters */
  set_str(L, "CANDIDATES_ENTRY", buf);
  kl_entry_name(s, "lists", buf, sizeof buf); /* lists.cu.tmpl */
  set_str(L, "LISTS_ENTRY", buf);
}

/* One rendering: what the protected function needs, and its outcome. */
typedef struct render_job {
  kl_sandbox *sb;
  const kl_spec *s;
  const kl_layout *l;
  const char *source, *dir;
  const char *const *parts;
  int lines;
  char **result;
  kl_err *err;
  int rc;
} render_job;

static int lua_fail(kl_sandbox *sb, int status, const char *what, kl_err *err) {
  return kl_fail(err, KL_ETEMPLATE, "%s%s", what, kl_sandbox_message(sb, status));
}

/* Loads render.lua, handing it the sandbox's load and the environment of
 * template code; leaves its module table at the top of the stack. */
static int load_engine(kl_sandbox *sb, kl_err *err) {
  const kl_embedded_file *e = kl_engine;
  int st = kl_sandbox_load(sb, "=render.lua", e->data, e->size);
  if (st != LUA_OK) return lua_fail(sb, st, "template engine: ", err);
  lua_getfield(sb->L, LUA_REGISTRYINDEX, KL_SANDBOX_LOAD_KEY);
  lua_getfield(sb->L, LUA_REGISTRYINDEX, KL_SANDBOX_ENV_KEY);
  if ((st = kl_sandbox_call(sb, 2, 1)) != LUA_OK) return lua_fail(sb, st, "template engine: ", err);
  return 0;
}

/* Renders one template; appends the result to the Lua buffer. */
static int render_one(kl_sandbox *sb, int engine, int env, const char *dir, const char *name,
                      int lines, luaL_Buffer *out, kl_err *err) {
  char *text;
  size_t len;
  int rc = get_template(dir, name, &text, &len, err);
  if (rc) return rc;
  lua_State *L = sb->L;
  char tname[300];
  snprintf(tname, sizeof tname, "templates/%s", name);
  lua_getfield(L, engine, "render");
  lua_pushlstring(L, text, len);
  free(text);
  lua_pushstring(L, tname);
  lua_pushvalue(L, env);
  lua_pushboolean(L, lines);
  int st = kl_sandbox_call(sb, 4, 1);
  if (st != LUA_OK) return lua_fail(sb, st, "", err);
  luaL_addvalue(out);
  return 0;
}

/* Inside lua_pcall: every Lua error (memory, time) is caught, none aborts. */
static int render_protected(lua_State *L) {
  render_job *j = lua_touserdata(L, 1);
  int rc = load_engine(j->sb, j->err);
  if (rc == 0) {
    int engine = lua_gettop(L);
    push_env(L, j->s, j->l);
    int env = lua_gettop(L);
    if (j->source) {
      set_str(L, "SOURCE", j->source);
      lua_getfield(L, engine, "c_lines");
      lua_setfield(L, env, "c_lines");
    }
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    for (int i = 0; j->parts[i] && rc == 0; i++)
      rc = render_one(j->sb, engine, env, j->dir, j->parts[i], j->lines, &b, j->err);
    if (rc == 0) {
      luaL_pushresult(&b);
      size_t n;
      const char *r = lua_tolstring(L, -1, &n);
      *j->result = malloc(n + 1);
      if (!*j->result) rc = kl_fail(j->err, KL_ENOMEM, "out of memory");
      else memcpy(*j->result, r, n + 1);
    }
  }
  j->rc = rc;
  return 0;
}

/* Renders `parts` in a fresh sandbox with the engine and the constants loaded. */
static int with_engine(const kl_spec *s, const kl_layout *l, const char *source,
                       const char *dir, const char *const *parts, int lines, char **result,
                       kl_err *err) {
  kl_sandbox sb;
  if (kl_sandbox_open(&sb, KL_SANDBOX_ENGINE, NULL) != 0)
    return kl_fail(err, KL_ENOMEM, "cannot create a Lua state");
  render_job j = {&sb, s, l, source, dir, parts, lines, result, err, 0};
  int st = kl_sandbox_run(&sb, render_protected, &j);
  /* Past the deadline the result buffer's close handler raises the time
   * limit too: its message already names the place. */
  int rc = st != LUA_OK ? lua_fail(&sb, st, sb.expired ? "" : "rendering: ", err) : j.rc;
  kl_sandbox_close(&sb);
  if (rc) {
    free(*result);
    *result = NULL;
  }
  return rc;
}

int kl_render(const kl_spec *s, const kl_layout *l, const char *template_dir, char **source,
              kl_err *err) {
  if (!s || !l || !source) return kl_fail(err, KL_EARG, "kl_render: NULL argument");
  *source = NULL;
  return with_engine(s, l, NULL, template_dir, source_parts, 1, source, err);
}

int kl_render_header(const kl_spec *s, const kl_layout *l, const char *source,
                     const char *template_dir, char **header, kl_err *err) {
  if (!s || !l || !source || !header) return kl_fail(err, KL_EARG, "kl_render_header: NULL argument");
  *header = NULL;
  const char *const parts[] = {header_part, NULL};
  return with_engine(s, l, source, template_dir, parts, 0, header, err);
}
