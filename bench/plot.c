/* A latency-against-tokens chart as SVG: one line per path, log-log axes, so
 * the decode sizes (left) and the bandwidth end (right) read at a glance. */
#include <math.h>
#include <stdio.h>

#define W 820
#define H 500
#define L 70  /* plot area margins */
#define R 200
#define T 50
#define B 60

static const char *const colors[] = {"#d62728", "#ff9896", "#1f77b4", "#2ca02c", "#9467bd",
                                     "#8c564b"};

static double xpos(double tok, double lo, double hi) {
  return L + (log2(tok) - log2(lo)) / (log2(hi) - log2(lo) + 1e-9) * (W - L - R);
}
static double ypos(double us, double lo, double hi) {
  return H - B - (log10(us) - log10(lo)) / (log10(hi) - log10(lo)) * (H - T - B);
}

int klbench_plot(const char *path, const char *title, const int *tokens, int n,
                 const double *series, const char *const *names, int nseries) {
  FILE *f = fopen(path, "w");
  if (!f) return -1;
  double lo = 1e300, hi = 0;
  for (int i = 0; i < n * nseries; i++)
    if (!isnan(series[i]) && series[i] > 0) lo = fmin(lo, series[i]), hi = fmax(hi, series[i]);
  lo = pow(10, floor(log10(lo)));
  double top = pow(10, floor(log10(hi))); /* 1, 2 or 5 x 10^k: no empty decade on top */
  hi = hi <= top ? top : hi <= 2 * top ? 2 * top : hi <= 5 * top ? 5 * top : 10 * top;
  double x0 = tokens[0], x1 = tokens[n - 1] > tokens[0] ? tokens[n - 1] : tokens[0] * 2;
  fprintf(f, "<svg xmlns='http://www.w3.org/2000/svg' width='%d' height='%d' "
             "font-family='sans-serif' font-size='12'>\n<rect width='100%%' height='100%%' "
             "fill='white'/>\n<text x='%d' y='24' font-size='14' font-weight='bold'>%s</text>\n",
          W, H, L, title);
  /* grid: decades of microseconds, token counts */
  for (double v = lo; v <= hi * 1.001; v *= 10)
    for (int m = 1; m < 10 && v * m <= hi * 1.001; m++) {
      double y = ypos(v * m, lo, hi);
      fprintf(f, "<line x1='%d' x2='%d' y1='%.1f' y2='%.1f' stroke='%s'/>\n", L, W - R, y, y,
              m == 1 ? "#bbb" : "#eee");
      if (m == 1 || m == 2 || m == 5)
        fprintf(f, "<text x='%d' y='%.1f' text-anchor='end'>%g</text>\n", L - 6, y + 4, v * m);
    }
  for (int i = 0; i < n; i++) {
    double x = xpos(tokens[i], x0, x1);
    fprintf(f, "<line x1='%.1f' x2='%.1f' y1='%d' y2='%d' stroke='#eee'/>\n<text x='%.1f' "
               "y='%d' text-anchor='middle'>%d</text>\n", x, x, T, H - B, x, H - B + 16, tokens[i]);
  }
  fprintf(f, "<text x='%d' y='%d' text-anchor='middle'>tokens per step (log scale)</text>\n",
          (L + W - R) / 2, H - 18);
  fprintf(f, "<text transform='translate(18 %d) rotate(-90)' text-anchor='middle'>"
             "microseconds per step (log scale, lower is better)</text>\n", (T + H - B) / 2);
  for (int s = 0; s < nseries; s++) {
    const char *c = colors[s % 6];
    fprintf(f, "<polyline fill='none' stroke='%s' stroke-width='%d'%s points='", c,
            s == 0 ? 3 : 2, s == nseries - 1 ? " stroke-dasharray='6 4'" : "");
    for (int i = 0; i < n; i++) {
      double v = series[s * n + i];
      if (!isnan(v) && v > 0)
        fprintf(f, "%.1f,%.1f ", xpos(tokens[i], x0, x1), ypos(v, lo, hi));
    }
    fprintf(f, "'/>\n");
    for (int i = 0; i < n; i++) {
      double v = series[s * n + i];
      if (!isnan(v) && v > 0)
        fprintf(f, "<circle cx='%.1f' cy='%.1f' r='3' fill='%s'/>\n", xpos(tokens[i], x0, x1),
                ypos(v, lo, hi), c);
    }
    fprintf(f, "<line x1='%d' x2='%d' y1='%d' y2='%d' stroke='%s' stroke-width='3'/>"
               "<text x='%d' y='%d'>%s</text>\n", W - R + 16, W - R + 40, T + 20 + 22 * s,
            T + 20 + 22 * s, c, W - R + 46, T + 24 + 22 * s, names[s]);
  }
  fprintf(f, "<rect x='%d' y='%d' width='%d' height='%d' fill='none' stroke='#444'/>\n</svg>\n",
          L, T, W - L - R, H - T - B);
  return fclose(f) == 0 ? 0 : -1;
}
