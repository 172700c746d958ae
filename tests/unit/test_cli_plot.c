/* test_cli_plot.c - the bench plotter (src/cli/plot.c): tick steps of 1, 2
 * and 5 x 10^k, SVG text that escapes names and skips NaN points, an
 * empty series drawn as a legend entry only, flat data, a PNG with the
 * expected signature and size, and a path that cannot be written refused
 * with DF_EIO naming it. */
#include "cli/plot.h"
#include "deltafin.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int failures;
#define CHECK(c, ...) do { if (!(c)) { failures++; fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } } while (0)

static char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)len + 1);
    *n = fread(b, 1, (size_t)len, f);
    b[*n] = 0;
    fclose(f);
    return b;
}

static int count(const char *s, const char *needle) {
    int n = 0;
    for (const char *p = s; (p = strstr(p, needle)); p++) n++;
    return n;
}

int main(void) {
    CHECK(df_plot_tick_step(10, 5) == 2, "10/5 -> 2");
    CHECK(df_plot_tick_step(100, 8) == 20, "100/8 = 12.5 -> 20");
    CHECK(fabs(df_plot_tick_step(0.7, 6) - 0.2) < 1e-12, "0.7/6 -> 0.2, got %g", df_plot_tick_step(0.7, 6));
    CHECK(df_plot_tick_step(3000, 6) == 500, "3000/6 -> 500");
    CHECK(df_plot_tick_step(0, 6) == 1 && df_plot_tick_step(NAN, 6) == 1, "a degenerate span -> 1");

    char dir[] = "/tmp/df_plot_XXXXXX", svg[256], png[256], err[512];
    if (!mkdtemp(dir)) { perror("mkdtemp"); return 1; }
    snprintf(svg, sizeof svg, "%s/p.svg", dir);
    snprintf(png, sizeof png, "%s/p.png", dir);
    double x[] = {1, 2, 3, 4}, y[] = {5, NAN, 7, 6}, fx[] = {1, 4}, fy[] = {9, 9};
    df_plot_series s[] = {{"a<b&\"c\"", 4, x, y, 0, 0}, {"empty", 0, x, y, 0, 0}, {"floor", 2, fx, fy, 1, 0}};
    df_plot p = {"title <1>", "x & more", "y", 1, 1};
    CHECK(df_plot_svg(svg, &p, s, 3, err, sizeof err) == 0, "svg: %s", err);
    size_t n = 0;
    char *t = slurp(svg, &n);
    CHECK(t && strstr(t, "<svg xmlns=\"http://www.w3.org/2000/svg\"") && strstr(t, "</svg>"), "an svg document");
    CHECK(t && strstr(t, "data-name=\"a&lt;b&amp;&quot;c&quot;\"") && strstr(t, "title &lt;1&gt;") && strstr(t, "x &amp; more"),
          "names and labels escaped");
    CHECK(t && count(t, "class=\"series\"") == 3 && count(t, "class=\"legend\"") == 3, "3 series, 3 legend entries");
    CHECK(t && count(t, "<circle") == 3, "a circle per finite point of the short series (NaN skipped), none for the floor: %d",
          t ? count(t, "<circle") : -1);
    CHECK(t && strstr(t, "stroke-dasharray"), "the floor is dashed");
    CHECK(t && !strstr(t, "nan") && !strstr(t, "inf"), "no NaN or infinity in the coordinates");
    free(t);
    /* flat data from zero: the axis spans 0 .. 1.25 x the value, not negative */
    double zy[] = {0, 0, 0, 0};
    df_plot_series z = {"zero", 4, x, zy, 0, 0};
    CHECK(df_plot_svg(svg, &p, &z, 1, err, sizeof err) == 0, "flat svg: %s", err);
    t = slurp(svg, &n);
    CHECK(t && !strstr(t, ">-"), "no negative tick for flat data from zero");
    free(t);
    CHECK(df_plot_png(png, &p, s, 3, err, sizeof err) == 0, "png: %s", err);
    unsigned char *b = (unsigned char *)slurp(png, &n);
    CHECK(b && n > 33 && !memcmp(b, "\x89PNG\r\n\x1a\n", 8) && !memcmp(b + 12, "IHDR", 4), "a PNG signature and IHDR");
    if (b && n > 24) {
        unsigned w = (unsigned)b[16] << 24 | b[17] << 16 | b[18] << 8 | b[19], h = (unsigned)b[20] << 24 | b[21] << 16 | b[22] << 8 | b[23];
        CHECK(w == 1520 && h == 880, "1520 x 880, got %u x %u", w, h);
    }
    free(b);
    err[0] = 0;
    CHECK(df_plot_svg("/nonexistent-dir/p.svg", &p, s, 3, err, sizeof err) == DF_EIO && strstr(err, "/nonexistent-dir/p.svg"), "svg: %s", err);
    err[0] = 0;
    CHECK(df_plot_png("/nonexistent-dir/p.png", &p, s, 3, err, sizeof err) == DF_EIO && strstr(err, "/nonexistent-dir/p.png"), "png: %s", err);
    unlink(svg), unlink(png), rmdir(dir);
    if (failures) fprintf(stderr, "%d failures\n", failures);
    else printf("test_cli_plot: ok\n");
    return failures != 0;
}
