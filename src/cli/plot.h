/* plot.h - a small SVG (and PNG) line-plot writer for `deltafin bench` (plot.c): axes
 * with "nice" ticks (1, 2, 5 x 10^k), axis labels, a title, one coloured
 * line per series (points marked when a series is short) and a legend. */
#ifndef DF_PLOT_H
#define DF_PLOT_H
#include <stddef.h>

typedef struct {
    const char *name;       /* legend text */
    int n;                  /* points */
    const double *x, *y;    /* [n] each; NaN y values are skipped */
    int dashed;             /* reference lines (floors) are dashed */
    int step;               /* draw as a step function (CDFs) */
} df_plot_series;

typedef struct {
    const char *title, *xlabel, *ylabel;
    int y_from_zero;        /* the y axis starts at 0 (rates); else at the data's minimum */
    int x_integer;          /* x values are counts (runs): ticks at whole numbers only */
} df_plot;

/* Writes one SVG file of ns series to path; 0, or DF_EIO with err naming the path.
 * Series with n == 0 get a legend entry only. */
int df_plot_svg(const char *path, const df_plot *p, const df_plot_series *s, int ns, char *err, size_t errlen);

/* The same drawing rasterized (2 pixels per SVG unit, text in a built-in
 * 5x7 font) and written as an RGB PNG with libpng; 0 or DF_EIO. */
int df_plot_png(const char *path, const df_plot *p, const df_plot_series *s, int ns, char *err, size_t errlen);

/* The tick step for a span divided into about `want` intervals: 1, 2 or 5 x 10^k. */
double df_plot_tick_step(double span, int want);
#endif
