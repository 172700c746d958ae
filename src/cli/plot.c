/* plot.c - see plot.h. The drawing is plain SVG 1.1 text: a white canvas, a
 * frame, grid lines at the ticks, tick labels, the series as polylines (and
 * small circles when a series has at most 40 points), and a legend to the
 * right of the frame. Sizes are fixed (760 x 440) so plots line up side by
 * side in a report. */
#include "cli/plot.h"
#include "deltafin.h"
#include "util/util.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

enum { W = 760, H = 440, ML = 78, MR = 190, MT = 44, MB = 58 };

static const char *palette[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"};

double df_plot_tick_step(double span, int want) {
    if (!(span > 0) || want < 1) return 1;
    double raw = span / want, mag = pow(10, floor(log10(raw))), f = raw / mag;
    return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * mag;
}

static void put_esc(FILE *f, const char *s) {
    for (; s && *s; s++) {
        switch (*s) {
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '&': fputs("&amp;", f); break;
        case '"': fputs("&quot;", f); break;
        default:
            if ((unsigned char)*s >= 0x20 || *s == '\t') fputc(*s, f);
        }
    }
}

/* A tick label: no trailing zeros, k/M suffix for big values. */
static void fmt_tick(char *b, size_t n, double v, double step) {
    double a = fabs(v);
    if (a >= 1e6 && step >= 1e5) snprintf(b, n, "%gM", v / 1e6);
    else if (a >= 1e4 && step >= 1e3) snprintf(b, n, "%gk", v / 1e3);
    else {
        int dec = step >= 1 ? 0 : (int)ceil(-log10(step) - 1e-9);
        snprintf(b, n, "%.*f", dec > 6 ? 6 : dec, v);
    }
}

int df_plot_svg(const char *path, const df_plot *p, const df_plot_series *s, int ns, char *err, size_t errlen) {
    double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
    for (int k = 0; k < ns; k++)
        for (int i = 0; i < s[k].n; i++) {
            if (!isfinite(s[k].x[i]) || !isfinite(s[k].y[i])) continue;
            x0 = fmin(x0, s[k].x[i]), x1 = fmax(x1, s[k].x[i]);
            y0 = fmin(y0, s[k].y[i]), y1 = fmax(y1, s[k].y[i]);
        }
    if (!(x0 <= x1)) x0 = 0, x1 = 1, y0 = 0, y1 = 1; /* no data: an empty frame */
    if (p->y_from_zero && y0 > 0) y0 = 0;
    if (x1 - x0 < 1e-12) x0 -= 0.5, x1 += 0.5;
    if (y1 - y0 < 1e-12 * fmax(1, fabs(y1))) { double d = fabs(y1) > 0 ? fabs(y1) * 0.1 : 1; y0 -= d, y1 += d; }
    if (p->y_from_zero && y0 < 0 && y1 > 0 && y0 > -1e-12) y0 = 0;
    double xs = df_plot_tick_step(x1 - x0, 8), ys = df_plot_tick_step(y1 - y0, 6);
    if (p->x_integer && xs < 1) xs = 1;
    x0 = floor(x0 / xs) * xs, x1 = ceil(x1 / xs) * xs;
    y0 = floor(y0 / ys) * ys, y1 = ceil(y1 / ys) * ys;
    const double pw = W - ML - MR, ph = H - MT - MB;
#define PX(v) (ML + ((v) - x0) / (x1 - x0) * pw)
#define PY(v) (MT + ph - ((v) - y0) / (y1 - y0) * ph)
    FILE *f = fopen(path, "w");
    if (!f) return df_err(err, errlen, DF_EIO, "%s: cannot create the plot: %s", path, strerror(errno));
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
               "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
               "font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\" font-size=\"12\">\n"
               "<rect x=\"0\" y=\"0\" width=\"%d\" height=\"%d\" fill=\"white\"/>\n",
            W, H, W, H, W, H);
    fputs("<text class=\"title\" x=\"", f);
    fprintf(f, "%d\" y=\"24\" font-size=\"15\" font-weight=\"bold\">", ML);
    put_esc(f, p->title);
    fputs("</text>\n<g class=\"grid\" stroke=\"#e4e4e4\" stroke-width=\"1\">\n", f);
    for (double v = x0; v <= x1 + xs * 1e-6; v += xs) fprintf(f, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%.1f\"/>\n", PX(v), MT, PX(v), MT + ph);
    for (double v = y0; v <= y1 + ys * 1e-6; v += ys) fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", ML, PY(v), ML + pw, PY(v));
    fputs("</g>\n<g class=\"ticks\" fill=\"#333\">\n", f);
    char b[64];
    for (double v = x0; v <= x1 + xs * 1e-6; v += xs) {
        fmt_tick(b, sizeof b, fabs(v) < xs * 1e-9 ? 0 : v, xs);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n", PX(v), MT + ph + 17, b);
    }
    for (double v = y0; v <= y1 + ys * 1e-6; v += ys) {
        fmt_tick(b, sizeof b, fabs(v) < ys * 1e-9 ? 0 : v, ys);
        fprintf(f, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n", ML - 6, PY(v) + 4, b);
    }
    fprintf(f, "</g>\n<rect x=\"%d\" y=\"%d\" width=\"%.0f\" height=\"%.0f\" fill=\"none\" stroke=\"#333\"/>\n", ML, MT, pw, ph);
    fprintf(f, "<text class=\"xlabel\" x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">", ML + pw / 2, H - 14);
    put_esc(f, p->xlabel);
    fprintf(f, "</text>\n<text class=\"ylabel\" x=\"18\" y=\"%.1f\" text-anchor=\"middle\" transform=\"rotate(-90 18 %.1f)\">", MT + ph / 2, MT + ph / 2);
    put_esc(f, p->ylabel);
    fputs("</text>\n", f);
    for (int k = 0; k < ns; k++) {
        const char *col = s[k].dashed ? "#555" : palette[k % (int)(sizeof palette / sizeof *palette)];
        fprintf(f, "<g class=\"series\" data-name=\"");
        put_esc(f, s[k].name);
        fprintf(f, "\">\n<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"%s\"%s points=\"", col, s[k].dashed ? "1.5" : "2",
                s[k].dashed ? " stroke-dasharray=\"6 4\"" : "");
        double py = NAN;
        for (int i = 0; i < s[k].n; i++) {
            if (!isfinite(s[k].x[i]) || !isfinite(s[k].y[i])) continue;
            if (s[k].step && isfinite(py)) fprintf(f, "%.1f,%.1f ", PX(s[k].x[i]), PY(py));
            fprintf(f, "%.1f,%.1f ", PX(s[k].x[i]), PY(s[k].y[i]));
            py = s[k].y[i];
        }
        fputs("\"/>\n", f);
        if (s[k].n <= 40 && !s[k].dashed && !s[k].step)
            for (int i = 0; i < s[k].n; i++)
                if (isfinite(s[k].x[i]) && isfinite(s[k].y[i]))
                    fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n", PX(s[k].x[i]), PY(s[k].y[i]), col);
        fputs("</g>\n", f);
        /* legend entry */
        double ly = MT + 10 + k * 20;
        fprintf(f, "<g class=\"legend\"><line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"2.5\"%s/>"
                   "<text x=\"%.1f\" y=\"%.1f\">",
                ML + pw + 12, ly, ML + pw + 36, ly, col, s[k].dashed ? " stroke-dasharray=\"6 4\"" : "", ML + pw + 42, ly + 4);
        put_esc(f, s[k].name);
        fputs("</text></g>\n", f);
    }
#undef PX
#undef PY
    fputs("</svg>\n", f);
    if (ferror(f) | fclose(f)) return df_err(err, errlen, DF_EIO, "%s: cannot write the plot", path);
    return 0;
}
