/* plot.c - see plot.h. One layout (draw) paints through a small canvas
 * interface twice: as SVG 1.1 text, and as pixels written to a PNG with
 * libpng. The layout: a white canvas, a title, a frame, grid lines at the
 * ticks, tick labels, axis labels, the series as polylines (small circles
 * at the points when a series has at most 40), and a legend right of the
 * frame. Sizes are fixed (760 x 440 units) so plots line up side by side in
 * a report; the PNG is drawn at 2 pixels per unit (1520 x 880).
 *
 * The PNG's text uses the 5x7 bitmap font below (printable ASCII, drawn for
 * this file); other bytes are drawn as a box. */
#include "cli/plot.h"
#include "deltafin.h"
#include "util/util.h"

#include <errno.h>
#include <math.h>
#include <png.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { W = 760, H = 440, ML = 78, MR = 190, MT = 44, MB = 58 };
enum { A_START, A_MIDDLE, A_END };

static const char *palette[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"};

/* 5x7 glyphs of ' '..'~': 7 rows top to bottom, bit 4 the leftmost column. */
static const uint8_t font5x7[95][7] = {
    {0x00,0x00,0x00,0x00,0x00,0x00,0x00}, /* ' ' */
    {0x04,0x04,0x04,0x04,0x04,0x00,0x04}, /* '!' */
    {0x0a,0x0a,0x00,0x00,0x00,0x00,0x00}, /* '"' */
    {0x0a,0x0a,0x1f,0x0a,0x1f,0x0a,0x0a}, /* '#' */
    {0x04,0x0f,0x14,0x0e,0x05,0x1e,0x04}, /* '$' */
    {0x18,0x19,0x02,0x04,0x08,0x13,0x03}, /* '%' */
    {0x0c,0x12,0x14,0x08,0x15,0x12,0x0d}, /* '&' */
    {0x04,0x04,0x00,0x00,0x00,0x00,0x00}, /* '\'' */
    {0x02,0x04,0x08,0x08,0x08,0x04,0x02}, /* '(' */
    {0x08,0x04,0x02,0x02,0x02,0x04,0x08}, /* ')' */
    {0x00,0x04,0x15,0x0e,0x15,0x04,0x00}, /* '*' */
    {0x00,0x04,0x04,0x1f,0x04,0x04,0x00}, /* '+' */
    {0x00,0x00,0x00,0x00,0x06,0x04,0x08}, /* ',' */
    {0x00,0x00,0x00,0x1f,0x00,0x00,0x00}, /* '-' */
    {0x00,0x00,0x00,0x00,0x00,0x0c,0x0c}, /* '.' */
    {0x00,0x01,0x02,0x04,0x08,0x10,0x00}, /* '/' */
    {0x0e,0x11,0x13,0x15,0x19,0x11,0x0e}, /* '0' */
    {0x04,0x0c,0x04,0x04,0x04,0x04,0x0e}, /* '1' */
    {0x0e,0x11,0x01,0x02,0x04,0x08,0x1f}, /* '2' */
    {0x1f,0x02,0x04,0x02,0x01,0x11,0x0e}, /* '3' */
    {0x02,0x06,0x0a,0x12,0x1f,0x02,0x02}, /* '4' */
    {0x1f,0x10,0x1e,0x01,0x01,0x11,0x0e}, /* '5' */
    {0x06,0x08,0x10,0x1e,0x11,0x11,0x0e}, /* '6' */
    {0x1f,0x01,0x02,0x04,0x08,0x08,0x08}, /* '7' */
    {0x0e,0x11,0x11,0x0e,0x11,0x11,0x0e}, /* '8' */
    {0x0e,0x11,0x11,0x0f,0x01,0x02,0x0c}, /* '9' */
    {0x00,0x0c,0x0c,0x00,0x0c,0x0c,0x00}, /* ':' */
    {0x00,0x0c,0x0c,0x00,0x0c,0x04,0x08}, /* ';' */
    {0x02,0x04,0x08,0x10,0x08,0x04,0x02}, /* '<' */
    {0x00,0x00,0x1f,0x00,0x1f,0x00,0x00}, /* '=' */
    {0x08,0x04,0x02,0x01,0x02,0x04,0x08}, /* '>' */
    {0x0e,0x11,0x01,0x02,0x04,0x00,0x04}, /* '?' */
    {0x0e,0x11,0x01,0x0d,0x15,0x15,0x0e}, /* '@' */
    {0x0e,0x11,0x11,0x1f,0x11,0x11,0x11}, /* 'A' */
    {0x1e,0x11,0x11,0x1e,0x11,0x11,0x1e}, /* 'B' */
    {0x0e,0x11,0x10,0x10,0x10,0x11,0x0e}, /* 'C' */
    {0x1c,0x12,0x11,0x11,0x11,0x12,0x1c}, /* 'D' */
    {0x1f,0x10,0x10,0x1e,0x10,0x10,0x1f}, /* 'E' */
    {0x1f,0x10,0x10,0x1e,0x10,0x10,0x10}, /* 'F' */
    {0x0e,0x11,0x10,0x17,0x11,0x11,0x0f}, /* 'G' */
    {0x11,0x11,0x11,0x1f,0x11,0x11,0x11}, /* 'H' */
    {0x0e,0x04,0x04,0x04,0x04,0x04,0x0e}, /* 'I' */
    {0x07,0x02,0x02,0x02,0x02,0x12,0x0c}, /* 'J' */
    {0x11,0x12,0x14,0x18,0x14,0x12,0x11}, /* 'K' */
    {0x10,0x10,0x10,0x10,0x10,0x10,0x1f}, /* 'L' */
    {0x11,0x1b,0x15,0x15,0x11,0x11,0x11}, /* 'M' */
    {0x11,0x11,0x19,0x15,0x13,0x11,0x11}, /* 'N' */
    {0x0e,0x11,0x11,0x11,0x11,0x11,0x0e}, /* 'O' */
    {0x1e,0x11,0x11,0x1e,0x10,0x10,0x10}, /* 'P' */
    {0x0e,0x11,0x11,0x11,0x15,0x12,0x0d}, /* 'Q' */
    {0x1e,0x11,0x11,0x1e,0x14,0x12,0x11}, /* 'R' */
    {0x0f,0x10,0x10,0x0e,0x01,0x01,0x1e}, /* 'S' */
    {0x1f,0x04,0x04,0x04,0x04,0x04,0x04}, /* 'T' */
    {0x11,0x11,0x11,0x11,0x11,0x11,0x0e}, /* 'U' */
    {0x11,0x11,0x11,0x11,0x11,0x0a,0x04}, /* 'V' */
    {0x11,0x11,0x11,0x15,0x15,0x15,0x0a}, /* 'W' */
    {0x11,0x11,0x0a,0x04,0x0a,0x11,0x11}, /* 'X' */
    {0x11,0x11,0x0a,0x04,0x04,0x04,0x04}, /* 'Y' */
    {0x1f,0x01,0x02,0x04,0x08,0x10,0x1f}, /* 'Z' */
    {0x0e,0x08,0x08,0x08,0x08,0x08,0x0e}, /* '[' */
    {0x00,0x10,0x08,0x04,0x02,0x01,0x00}, /* '\\' */
    {0x0e,0x02,0x02,0x02,0x02,0x02,0x0e}, /* ']' */
    {0x04,0x0a,0x11,0x00,0x00,0x00,0x00}, /* '^' */
    {0x00,0x00,0x00,0x00,0x00,0x00,0x1f}, /* '_' */
    {0x08,0x04,0x00,0x00,0x00,0x00,0x00}, /* '`' */
    {0x00,0x00,0x0e,0x01,0x0f,0x11,0x0f}, /* 'a' */
    {0x10,0x10,0x16,0x19,0x11,0x11,0x1e}, /* 'b' */
    {0x00,0x00,0x0e,0x10,0x10,0x11,0x0e}, /* 'c' */
    {0x01,0x01,0x0d,0x13,0x11,0x11,0x0f}, /* 'd' */
    {0x00,0x00,0x0e,0x11,0x1f,0x10,0x0e}, /* 'e' */
    {0x06,0x09,0x08,0x1c,0x08,0x08,0x08}, /* 'f' */
    {0x00,0x0f,0x11,0x11,0x0f,0x01,0x0e}, /* 'g' */
    {0x10,0x10,0x16,0x19,0x11,0x11,0x11}, /* 'h' */
    {0x04,0x00,0x0c,0x04,0x04,0x04,0x0e}, /* 'i' */
    {0x02,0x00,0x06,0x02,0x02,0x12,0x0c}, /* 'j' */
    {0x10,0x10,0x12,0x14,0x18,0x14,0x12}, /* 'k' */
    {0x0c,0x04,0x04,0x04,0x04,0x04,0x0e}, /* 'l' */
    {0x00,0x00,0x1a,0x15,0x15,0x11,0x11}, /* 'm' */
    {0x00,0x00,0x16,0x19,0x11,0x11,0x11}, /* 'n' */
    {0x00,0x00,0x0e,0x11,0x11,0x11,0x0e}, /* 'o' */
    {0x00,0x00,0x1e,0x11,0x1e,0x10,0x10}, /* 'p' */
    {0x00,0x00,0x0d,0x13,0x0f,0x01,0x01}, /* 'q' */
    {0x00,0x00,0x16,0x19,0x10,0x10,0x10}, /* 'r' */
    {0x00,0x00,0x0e,0x10,0x0e,0x01,0x1e}, /* 's' */
    {0x08,0x08,0x1c,0x08,0x08,0x09,0x06}, /* 't' */
    {0x00,0x00,0x11,0x11,0x11,0x13,0x0d}, /* 'u' */
    {0x00,0x00,0x11,0x11,0x11,0x0a,0x04}, /* 'v' */
    {0x00,0x00,0x11,0x11,0x15,0x15,0x0a}, /* 'w' */
    {0x00,0x00,0x11,0x0a,0x04,0x0a,0x11}, /* 'x' */
    {0x00,0x00,0x11,0x11,0x0f,0x01,0x0e}, /* 'y' */
    {0x00,0x00,0x1f,0x02,0x04,0x08,0x1f}, /* 'z' */
    {0x02,0x04,0x04,0x08,0x04,0x04,0x02}, /* '{' */
    {0x04,0x04,0x04,0x04,0x04,0x04,0x04}, /* '|' */
    {0x08,0x04,0x04,0x02,0x04,0x04,0x08}, /* '}' */
    {0x00,0x00,0x08,0x15,0x02,0x00,0x00}, /* '~' */
};

double df_plot_tick_step(double span, int want) {
    if (!(span > 0) || want < 1) return 1;
    double raw = span / want, mag = pow(10, floor(log10(raw))), f = raw / mag;
    return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * mag;
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

/* ---- the canvas: what the layout draws with --------------------------------- */

typedef struct canvas canvas;
struct canvas {
    void (*group)(canvas *c, const char *cls, const char *name, int open);
    void (*poly)(canvas *c, const double *xy, int n, const char *col, double w, int dash); /* xy: [n][2] */
    void (*circle)(canvas *c, double cx, double cy, double r, const char *col);
    void (*rect)(canvas *c, double x, double y, double w, double h, const char *fill, const char *stroke);
    void (*text)(canvas *c, double x, double y, const char *s, int anchor, double size, int bold, int rot, const char *cls);
    FILE *f;        /* SVG */
    uint8_t *px;    /* PNG: [ph][pw][3] */
    int pw, ph;
    double scale;   /* pixels per unit */
};

static void line2(canvas *c, double x1, double y1, double x2, double y2, const char *col, double w, int dash) {
    double xy[4] = {x1, y1, x2, y2};
    c->poly(c, xy, 2, col, w, dash);
}

/* ---- SVG canvas ---------------------------------------------------------- */

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

static void svg_group(canvas *c, const char *cls, const char *name, int open) {
    if (!open) { fputs("</g>\n", c->f); return; }
    fprintf(c->f, "<g class=\"%s\"", cls);
    if (name) { fputs(" data-name=\"", c->f); put_esc(c->f, name); fputc('"', c->f); }
    fputs(">\n", c->f);
}
static void svg_poly(canvas *c, const double *xy, int n, const char *col, double w, int dash) {
    fprintf(c->f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"%g\"%s points=\"", col, w, dash ? " stroke-dasharray=\"6 4\"" : "");
    for (int i = 0; i < n; i++) fprintf(c->f, "%.1f,%.1f ", xy[2 * i], xy[2 * i + 1]);
    fputs("\"/>\n", c->f);
}
static void svg_circle(canvas *c, double cx, double cy, double r, const char *col) {
    fprintf(c->f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"%g\" fill=\"%s\"/>\n", cx, cy, r, col);
}
static void svg_rect(canvas *c, double x, double y, double w, double h, const char *fill, const char *stroke) {
    fprintf(c->f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\"%s%s%s/>\n", x, y, w, h, fill ? fill : "none",
            stroke ? " stroke=\"" : "", stroke ? stroke : "", stroke ? "\"" : "");
}
static void svg_text(canvas *c, double x, double y, const char *s, int anchor, double size, int bold, int rot, const char *cls) {
    static const char *an[] = {"start", "middle", "end"};
    fprintf(c->f, "<text%s%s%s x=\"%.1f\" y=\"%.1f\" text-anchor=\"%s\" font-size=\"%g\"%s", cls ? " class=\"" : "", cls ? cls : "",
            cls ? "\"" : "", x, y, an[anchor], size, bold ? " font-weight=\"bold\"" : "");
    if (rot) fprintf(c->f, " transform=\"rotate(-90 %.1f %.1f)\"", x, y);
    fputc('>', c->f);
    put_esc(c->f, s);
    fputs("</text>\n", c->f);
}

/* ---- raster canvas ----------------------------------------------------------- */

static void rgb_of(const char *col, uint8_t out[3]) {
    unsigned v = col && col[0] == '#' ? (unsigned)strtoul(col + 1, NULL, 16) : 0;
    out[0] = (uint8_t)(v >> 16), out[1] = (uint8_t)(v >> 8), out[2] = (uint8_t)v;
}
static void put_px(canvas *c, int x, int y, const uint8_t rgb[3]) {
    if (x < 0 || y < 0 || x >= c->pw || y >= c->ph) return;
    memcpy(c->px + ((size_t)y * c->pw + x) * 3, rgb, 3);
}
/* A filled disc of radius r pixels at (x, y) pixels. */
static void disc(canvas *c, double x, double y, double r, const uint8_t rgb[3]) {
    int x0 = (int)floor(x - r), x1 = (int)ceil(x + r), y0 = (int)floor(y - r), y1 = (int)ceil(y + r);
    for (int j = y0; j <= y1; j++)
        for (int i = x0; i <= x1; i++)
            if ((i + 0.5 - x) * (i + 0.5 - x) + (j + 0.5 - y) * (j + 0.5 - y) <= r * r) put_px(c, i, j, rgb);
}
static void ras_group(canvas *c, const char *cls, const char *name, int open) { (void)c, (void)cls, (void)name, (void)open; }
/* Lines: discs stamped every half pixel (round caps and joins); dashes 6 on, 4 off (units). */
static void ras_poly(canvas *c, const double *xy, int n, const char *col, double w, int dash) {
    uint8_t rgb[3];
    rgb_of(col, rgb);
    double r = fmax(0.5, w * c->scale / 2), along = 0;
    for (int i = 0; i + 1 < n; i++) {
        double x0 = xy[2 * i] * c->scale, y0 = xy[2 * i + 1] * c->scale, x1 = xy[2 * i + 2] * c->scale, y1 = xy[2 * i + 3] * c->scale;
        double len = hypot(x1 - x0, y1 - y0);
        int steps = (int)ceil(len / 0.5);
        if (steps > 100000) steps = 100000;
        for (int k = 0; k <= steps; k++) {
            double t = steps ? (double)k / steps : 0, d = along + t * len;
            if (dash && fmod(d / c->scale, 10.0) >= 6.0) continue;
            disc(c, x0 + t * (x1 - x0), y0 + t * (y1 - y0), r, rgb);
        }
        along += len;
    }
}
static void ras_circle(canvas *c, double cx, double cy, double r, const char *col) {
    uint8_t rgb[3];
    rgb_of(col, rgb);
    disc(c, cx * c->scale, cy * c->scale, r * c->scale, rgb);
}
static void ras_rect(canvas *c, double x, double y, double w, double h, const char *fill, const char *stroke) {
    if (fill) {
        uint8_t rgb[3];
        rgb_of(fill, rgb);
        for (int j = (int)(y * c->scale); j < (int)((y + h) * c->scale); j++)
            for (int i = (int)(x * c->scale); i < (int)((x + w) * c->scale); i++) put_px(c, i, j, rgb);
    }
    if (stroke) {
        double xy[10] = {x, y, x + w, y, x + w, y + h, x, y + h, x, y};
        ras_poly(c, xy, 5, stroke, 1, 0);
    }
}
/* Text in the 5x7 font: k pixels per font dot, k from the font size; y is the
 * baseline (the glyph's last row sits on it); rot: read bottom to top. */
static void ras_text(canvas *c, double x, double y, const char *s, int anchor, double size, int bold, int rot, const char *cls) {
    (void)cls;
    static const uint8_t ink[3] = {0x22, 0x22, 0x22};
    int k = (int)lround(size * 0.72 / 7 * c->scale);
    if (k < 1) k = 1;
    size_t n = strlen(s);
    double wpx = n ? (double)(n * 6 - 1) * k : 0, px = x * c->scale, py = y * c->scale;
    double start = anchor == A_START ? 0 : anchor == A_MIDDLE ? -wpx / 2 : -wpx;
    for (size_t ci = 0; ci < n; ci++) {
        unsigned ch = (unsigned char)s[ci];
        for (int row = 0; row < 7; row++)
            for (int col = 0; col < 5; col++) {
                int on = ch >= 32 && ch < 127 ? (font5x7[ch - 32][row] >> (4 - col)) & 1
                                              : row == 0 || row == 6 || col == 0 || col == 4; /* a box */
                if (!on) continue;
                for (int dy = 0; dy < k; dy++)
                    for (int dx = 0; dx < k + (bold ? 1 : 0); dx++) {
                        double u = start + ((double)ci * 6 + col) * k + dx; /* along the text */
                        double v = (double)(row - 6) * k - dy;              /* up from the baseline (<= 0) */
                        if (!rot) put_px(c, (int)(px + u), (int)(py + v + k - 1), ink);
                        else put_px(c, (int)(px + v + k - 1), (int)(py - u), ink);
                    }
            }
    }
}

/* ---- the layout ---------------------------------------------------------------- */

static void draw(canvas *c, const df_plot *p, const df_plot_series *s, int ns) {
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
    if (y1 - y0 < 1e-12 * fmax(1, fabs(y1))) { /* flat data: a band around it (from 0 for rates) */
        if (p->y_from_zero && y0 >= 0) y0 = 0, y1 = y1 > 0 ? y1 * 1.25 : 1;
        else { double d = fabs(y1) > 0 ? fabs(y1) * 0.1 : 1; y0 -= d, y1 += d; }
    }
    if (p->y_from_zero && y0 < 0 && y1 > 0 && y0 > -1e-12) y0 = 0;
    double xs = df_plot_tick_step(x1 - x0, 8), ys = df_plot_tick_step(y1 - y0, 6);
    if (p->x_integer && xs < 1) xs = 1;
    x0 = floor(x0 / xs) * xs, x1 = ceil(x1 / xs) * xs;
    y0 = floor(y0 / ys) * ys, y1 = ceil(y1 / ys) * ys;
    const double pw = W - ML - MR, ph = H - MT - MB;
#define PX(v) (ML + ((v) - x0) / (x1 - x0) * pw)
#define PY(v) (MT + ph - ((v) - y0) / (y1 - y0) * ph)
    c->rect(c, 0, 0, W, H, "#ffffff", NULL);
    c->text(c, ML, 24, p->title ? p->title : "", A_START, 15, 1, 0, "title");
    c->group(c, "grid", NULL, 1);
    for (double v = x0; v <= x1 + xs * 1e-6; v += xs) line2(c, PX(v), MT, PX(v), MT + ph, "#e4e4e4", 1, 0);
    for (double v = y0; v <= y1 + ys * 1e-6; v += ys) line2(c, ML, PY(v), ML + pw, PY(v), "#e4e4e4", 1, 0);
    c->group(c, NULL, NULL, 0);
    c->group(c, "ticks", NULL, 1);
    char b[64];
    for (double v = x0; v <= x1 + xs * 1e-6; v += xs) {
        fmt_tick(b, sizeof b, fabs(v) < xs * 1e-9 ? 0 : v, xs);
        c->text(c, PX(v), MT + ph + 17, b, A_MIDDLE, 12, 0, 0, NULL);
    }
    for (double v = y0; v <= y1 + ys * 1e-6; v += ys) {
        fmt_tick(b, sizeof b, fabs(v) < ys * 1e-9 ? 0 : v, ys);
        c->text(c, ML - 6, PY(v) + 4, b, A_END, 12, 0, 0, NULL);
    }
    c->group(c, NULL, NULL, 0);
    c->rect(c, ML, MT, pw, ph, NULL, "#333333");
    c->text(c, ML + pw / 2, H - 14, p->xlabel ? p->xlabel : "", A_MIDDLE, 12, 0, 0, "xlabel");
    c->text(c, 18, MT + ph / 2, p->ylabel ? p->ylabel : "", A_MIDDLE, 12, 0, 1, "ylabel");
    for (int k = 0; k < ns; k++) {
        const char *col = s[k].dashed ? "#555555" : palette[k % (int)(sizeof palette / sizeof *palette)];
        double w = s[k].dashed ? 1.5 : 2;
        double *xy = df_xmalloc(((size_t)s[k].n * 2 + 1) * 2 * sizeof *xy);
        int m = 0;
        double py = NAN;
        for (int i = 0; i < s[k].n; i++) {
            if (!isfinite(s[k].x[i]) || !isfinite(s[k].y[i])) continue;
            if (s[k].step && isfinite(py)) xy[2 * m] = PX(s[k].x[i]), xy[2 * m + 1] = PY(py), m++;
            xy[2 * m] = PX(s[k].x[i]), xy[2 * m + 1] = PY(s[k].y[i]), m++;
            py = s[k].y[i];
        }
        c->group(c, "series", s[k].name ? s[k].name : "", 1);
        c->poly(c, xy, m, col, w, s[k].dashed);
        if (s[k].n <= 40 && !s[k].dashed && !s[k].step)
            for (int i = 0; i < s[k].n; i++)
                if (isfinite(s[k].x[i]) && isfinite(s[k].y[i])) c->circle(c, PX(s[k].x[i]), PY(s[k].y[i]), 3, col);
        c->group(c, NULL, NULL, 0);
        free(xy);
        double ly = MT + 10 + k * 20;
        c->group(c, "legend", NULL, 1);
        line2(c, ML + pw + 12, ly, ML + pw + 36, ly, col, 2.5, s[k].dashed);
        c->text(c, ML + pw + 42, ly + 4, s[k].name ? s[k].name : "", A_START, 12, 0, 0, NULL);
        c->group(c, NULL, NULL, 0);
    }
#undef PX
#undef PY
}

int df_plot_svg(const char *path, const df_plot *p, const df_plot_series *s, int ns, char *err, size_t errlen) {
    FILE *f = fopen(path, "w");
    if (!f) return df_err(err, errlen, DF_EIO, "%s: cannot create the plot: %s", path, strerror(errno));
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
               "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
               "font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\" font-size=\"12\" fill=\"#222222\">\n",
            W, H, W, H);
    canvas c = {svg_group, svg_poly, svg_circle, svg_rect, svg_text, f, NULL, 0, 0, 1};
    draw(&c, p, s, ns);
    fputs("</svg>\n", f);
    if (ferror(f) | fclose(f)) return df_err(err, errlen, DF_EIO, "%s: cannot write the plot", path);
    return 0;
}

int df_plot_png(const char *path, const df_plot *p, const df_plot_series *s, int ns, char *err, size_t errlen) {
    canvas c = {ras_group, ras_poly, ras_circle, ras_rect, ras_text, NULL, NULL, 2 * W, 2 * H, 2};
    c.px = df_xmalloc((size_t)c.pw * c.ph * 3);
    memset(c.px, 0xff, (size_t)c.pw * c.ph * 3);
    draw(&c, p, s, ns);
    FILE *f = fopen(path, "wb");
    if (!f) { free(c.px); return df_err(err, errlen, DF_EIO, "%s: cannot create the plot: %s", path, strerror(errno)); }
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
    png_infop info = png ? png_create_info_struct(png) : NULL;
    png_bytep *rows = df_xmalloc((size_t)c.ph * sizeof *rows);
    for (int y = 0; y < c.ph; y++) rows[y] = c.px + (size_t)y * c.pw * 3;
    int bad = !png || !info;
    if (!bad && setjmp(png_jmpbuf(png))) bad = 1; /* libpng reports write errors by longjmp */
    else if (!bad) {
        png_init_io(png, f);
        png_set_IHDR(png, info, (png_uint_32)c.pw, (png_uint_32)c.ph, 8, PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE,
                     PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
        png_write_info(png, info);
        png_write_image(png, rows);
        png_write_end(png, NULL);
    }
    png_destroy_write_struct(png ? &png : NULL, info ? &info : NULL);
    free(rows);
    free(c.px);
    if ((ferror(f) | fclose(f)) || bad) return df_err(err, errlen, DF_EIO, "%s: cannot write the plot", path);
    return 0;
}
