/* klbench --grid's output (grid.h): a table a setting on stdout, one CSV
 * row a kernel and cell. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "grid.h"

double grid_roofline(const grid_meta *m, long long bytes) {
  return (double)bytes / (m->copy_gbps * 1e3) + m->floor_us;
}

void grid_csv_begin(FILE *f, const grid_meta *m) {
  fprintf(f, "# klbench --grid: us per step, CUDA graphs, median of %d replays\n", m->replays);
  fprintf(f, "# gpu: %s (%s)\n# date: %s\n# command: %s\n# flashinfer: %s\n", m->gpu, m->arch,
          m->date, m->command, m->flashinfer);
  fprintf(f, "# copy_gbps: %.1f\n# floor_us: %.3f\n", m->copy_gbps, m->floor_us);
  fprintf(f, "width,dtype,tokens,kernel,bytes,copy_gbps,floor_us,roofline_us,klgen_us,"
             "pct_roofline,klgen_path,noise_us,flashinfer_us,flashinfer_call,steps,check\n");
}

static void number(FILE *f, double v, int digits) {
  if (!isnan(v)) fprintf(f, "%.*f", digits, v);
  fputc(',', f);
}

/* A field that may hold commas or quotes, as CSV quotes it. */
static void text(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    if (*s == '"') fputc('"', f);
    fputc(*s, f);
  }
  fputc('"', f);
}

void grid_csv_row(FILE *f, const grid_meta *m, const grid_row *r) {
  fprintf(f, "%d,%s,%d,%s,%lld,%.1f,%.3f,", r->width, r->dtype, r->tokens,
          grid_kernel_names[r->kernel], r->bytes, m->copy_gbps, m->floor_us);
  number(f, r->roofline_us, 3);
  number(f, r->klgen_us, 3);
  number(f, 100.0 * r->roofline_us / r->klgen_us, 1);
  fprintf(f, "%s,", r->path);
  number(f, r->noise_us, 3);
  number(f, r->fi_us, 3);
  fprintf(f, "%s,%d,", r->fi_call ? r->fi_call : "", r->steps);
  text(f, r->check);
  fputc('\n', f);
  fflush(f); /* a run cut short keeps what it measured */
}

static void cell(const char *fmt, double a, double b) {
  char buf[32];
  if (isnan(a)) snprintf(buf, sizeof buf, "-");
  else snprintf(buf, sizeof buf, fmt, a, b);
  printf(" %13s", buf);
}

void grid_print_setting(const grid_row *rows, int ntok, unsigned kernels) {
  const grid_row *r0 = rows;
  printf("\n%d columns, %s: us per step (%% of the roofline) | FlashInfer us; noise reference us\n",
         r0->width, r0->dtype);
  printf("%-7s", "tokens");
  for (int k = 0; k < G_NKERNELS; k++)
    if (kernels & (1u << k)) printf(" %13s", grid_kernel_names[k]);
  printf("\n");
  for (int i = 0; i < ntok; i++) {
    const grid_row *r = rows + (size_t)i * G_NKERNELS;
    printf("%-7d", r->tokens);
    for (int k = 0; k < G_NKERNELS; k++)
      if (kernels & (1u << k))
        cell("%.2f (%.0f%%)", r[k].klgen_us, 100 * r[k].roofline_us / r[k].klgen_us);
    printf("\n%-7s", "");
    for (int k = 0; k < G_NKERNELS; k++)
      if (kernels & (1u << k)) {
        char buf[32] = "";
        if (!isnan(r[k].fi_us)) snprintf(buf, sizeof buf, "FI %.2f", r[k].fi_us);
        if (!isnan(r[k].noise_us))
          snprintf(buf + strlen(buf), sizeof buf - strlen(buf), "%sn %.2f", *buf ? " " : "",
                   r[k].noise_us);
        printf(" %13s", buf);
      }
    printf("\n");
    for (int k = 0; k < G_NKERNELS; k++)
      if ((kernels & (1u << k)) && r[k].check[0])
        printf("  CHECK FAILED: %s at %d tokens: %s\n", grid_kernel_names[k], r->tokens,
               r[k].check);
  }
}
