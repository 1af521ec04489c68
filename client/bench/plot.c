/* The SVG plot of lnorm-bench (hand-written SVG, no dependencies):
 * left, the latency distribution of every run (latency against percentile
 * on a "nines" axis); right, throughput against concurrency (closed loop)
 * or p50/p99 latency against achieved throughput (open loop). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "report.h"

typedef struct panel {
    double x0, y0, w, h;         /* pixels: top-left and size */
    double xmin, xmax, ymin, ymax;
    int xlog, ylog;
} panel;

static const char *palette[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
#define NPAL (sizeof(palette) / sizeof(palette[0]))

static double px(const panel *p, double x)
{
    double a = p->xlog ? log10(x) : x, lo = p->xlog ? log10(p->xmin) : p->xmin,
           hi = p->xlog ? log10(p->xmax) : p->xmax;
    return p->x0 + (hi > lo ? (a - lo) / (hi - lo) : 0.5) * p->w;
}

static double py(const panel *p, double y)
{
    double a = p->ylog ? log10(y) : y, lo = p->ylog ? log10(p->ymin) : p->ymin,
           hi = p->ylog ? log10(p->ymax) : p->ymax;
    return p->y0 + p->h - (hi > lo ? (a - lo) / (hi - lo) : 0.5) * p->h;
}

static void fmt_num(char *b, size_t n, double v)
{
    if (v >= 1e6)
        snprintf(b, n, "%gM", v / 1e6);
    else if (v >= 1e3)
        snprintf(b, n, "%gk", v / 1e3);
    else
        snprintf(b, n, "%g", v);
}

/* Ticks of one axis: log axes at 1-2-5 steps, linear at a "nice" step. */
static int ticks(double lo, double hi, int logs, double *t, int max)
{
    int n = 0;
    if (logs) {
        int span = (int)ceil(log10(hi) - log10(lo));
        static const double steps[] = {1, 2, 5};
        for (double d = pow(10, floor(log10(lo))); d <= hi * 1.0001 && n < max; d *= 10)
            for (int k = 0; k < 3 && n < max; k++) {
                if (span > 3 && k)
                    continue;
                double v = d * steps[k];
                if (v >= lo * 0.9999 && v <= hi * 1.0001)
                    t[n++] = v;
            }
        return n;
    }
    double raw = (hi - lo) / 5, mag = pow(10, floor(log10(raw))), step = mag;
    if (raw / mag > 5)
        step = 10 * mag;
    else if (raw / mag > 2)
        step = 5 * mag;
    else if (raw / mag > 1)
        step = 2 * mag;
    for (double v = ceil(lo / step) * step; v <= hi + step * 1e-9 && n < max; v += step)
        t[n++] = v;
    return n;
}

static void axes(FILE *f, const panel *p, const char *title, const char *xl, const char *yl,
                 int nines_x)
{
    fprintf(f, "<rect x='%.1f' y='%.1f' width='%.1f' height='%.1f' fill='none' stroke='#444'/>\n",
            p->x0, p->y0, p->w, p->h);
    fprintf(f, "<text x='%.1f' y='%.1f' text-anchor='middle' font-size='14' font-weight='bold'>%s</text>\n",
            p->x0 + p->w / 2, p->y0 - 10, title);
    fprintf(f, "<text x='%.1f' y='%.1f' text-anchor='middle' font-size='12'>%s</text>\n",
            p->x0 + p->w / 2, p->y0 + p->h + 36, xl);
    fprintf(f, "<text transform='translate(%.1f,%.1f) rotate(-90)' text-anchor='middle' font-size='12'>%s</text>\n",
            p->x0 - 52, p->y0 + p->h / 2, yl);
    double t[64];
    char b[32];
    if (nines_x) {
        static const char *lab[] = {"0%", "90%", "99%", "99.9%", "99.99%", "99.999%"};
        for (int k = 0; k <= 5; k++) {
            if (k > p->xmax + 1e-9)
                break;
            double x = px(p, k);
            fprintf(f, "<line x1='%.1f' y1='%.1f' x2='%.1f' y2='%.1f' stroke='#ddd'/>\n", x, p->y0, x, p->y0 + p->h);
            fprintf(f, "<text x='%.1f' y='%.1f' text-anchor='middle' font-size='11'>%s</text>\n", x,
                    p->y0 + p->h + 16, lab[k]);
        }
    } else {
        int n = ticks(p->xmin, p->xmax, p->xlog, t, 64);
        for (int i = 0; i < n; i++) {
            double x = px(p, t[i]);
            fmt_num(b, sizeof b, t[i]);
            fprintf(f, "<line x1='%.1f' y1='%.1f' x2='%.1f' y2='%.1f' stroke='#ddd'/>\n", x, p->y0, x, p->y0 + p->h);
            fprintf(f, "<text x='%.1f' y='%.1f' text-anchor='middle' font-size='11'>%s</text>\n", x,
                    p->y0 + p->h + 16, b);
        }
    }
    int n = ticks(p->ymin, p->ymax, p->ylog, t, 64);
    for (int i = 0; i < n; i++) {
        double y = py(p, t[i]);
        fmt_num(b, sizeof b, t[i]);
        fprintf(f, "<line x1='%.1f' y1='%.1f' x2='%.1f' y2='%.1f' stroke='#ddd'/>\n", p->x0, y, p->x0 + p->w, y);
        fprintf(f, "<text x='%.1f' y='%.1f' text-anchor='end' font-size='11'>%s</text>\n", p->x0 - 6,
                y + 4, b);
    }
}

static void legend(FILE *f, double x, double y, int i, const char *color, const char *dash,
                   const char *text)
{
    fprintf(f, "<line x1='%.1f' y1='%.1f' x2='%.1f' y2='%.1f' stroke='%s' stroke-width='2' %s/>\n", x,
            y + i * 16, x + 22, y + i * 16, color, dash);
    fprintf(f, "<text x='%.1f' y='%.1f' font-size='11'>%s</text>\n", x + 28, y + i * 16 + 4, text);
}

/* Index of a run's load (concurrency or rate) among the distinct loads, in
 * order of first appearance: lnormd and echo at one load share a colour. */
static size_t load_index(const lnorm__report *rp, size_t i)
{
    size_t k = 0;
    for (size_t j = 0; j < i; j++) {
        int seen = 0;
        for (size_t m = 0; m < j; m++)
            if (rp->runs[m].open_loop == rp->runs[j].open_loop && rp->runs[m].rate == rp->runs[j].rate &&
                rp->runs[m].concurrency == rp->runs[j].concurrency)
                seen = 1;
        if (!seen)
            k++;
        const lnorm__runres *a = &rp->runs[j], *b = &rp->runs[i];
        if (a->open_loop == b->open_loop && a->rate == b->rate && a->concurrency == b->concurrency)
            return k - 1;
    }
    return k;
}

static void run_name(const lnorm__runres *r, char *b, size_t n)
{
    if (r->open_loop)
        snprintf(b, n, "%s %.0f/s", r->label, r->rate);
    else
        snprintf(b, n, "%s c=%d", r->label, r->concurrency);
}

/* How far along the nines axis a run has data: log10(requests). */
static int spectrum_points(const lnorm__runres *r)
{
    int k = 0;
    while (k < LNORM__SPECTRUM_N && pow(10.0, k / 10.0) <= (double)r->ok)
        k++;
    return k;
}

int lnorm__report_svg(const lnorm__report *rp, const char *path)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    /* legend rows below the panels: two runs (lnormd, echo) per row */
    size_t legend_rows = (rp->n + 1) / 2;
    if (legend_rows > 16)
        legend_rows = 16;
    const double W = 1100, H = 450 + 16.0 * (double)legend_rows;
    fprintf(f, "<svg xmlns='http://www.w3.org/2000/svg' width='%.0f' height='%.0f' font-family='sans-serif'>\n", W, H);
    fprintf(f, "<rect width='100%%' height='100%%' fill='white'/>\n");
    fprintf(f, "<text x='10' y='18' font-size='12'>lnorm-bench %s | %s | %s | commit %s</text>\n",
            rp->date, rp->device, rp->workload, rp->commit);

    /* left: latency spectrum */
    panel a = {80, 60, 400, 330, 0, 0.1, 1e300, 0, 0, 1};
    for (size_t i = 0; i < rp->n; i++) {
        const lnorm__runres *r = &rp->runs[i];
        int k = spectrum_points(r);
        for (int j = 0; j < k; j++) {
            double v = r->spectrum_ns[j] / 1e3;
            if (v > 0 && v < a.ymin)
                a.ymin = v;
            if (v > a.ymax)
                a.ymax = v;
        }
        if (k > 0 && (k - 1) / 10.0 > a.xmax)
            a.xmax = (k - 1) / 10.0;
    }
    if (a.ymax <= 0) {
        a.ymin = 1, a.ymax = 10;
    }
    a.ymin = pow(10, floor(log10(a.ymin)));
    a.ymax = pow(10, ceil(log10(a.ymax * 1.01)));
    a.xmax = ceil(a.xmax);
    axes(f, &a, "Latency distribution", "percentile", "latency (us)", 1);
    int li = 0;
    for (size_t i = 0; i < rp->n; i++) {
        const lnorm__runres *r = &rp->runs[i];
        int k = spectrum_points(r);
        if (k < 2)
            continue;
        const char *col = palette[load_index(rp, i) % NPAL];
        const char *dash = strcmp(r->label, "echo") == 0 ? "stroke-dasharray='5,3'" : "";
        fprintf(f, "<polyline fill='none' stroke='%s' stroke-width='1.8' %s points='", col, dash);
        for (int j = 0; j < k; j++)
            if (r->spectrum_ns[j] > 0)
                fprintf(f, "%.1f,%.1f ", px(&a, j / 10.0), py(&a, r->spectrum_ns[j] / 1e3));
        fprintf(f, "'/>\n");
        char name[64];
        run_name(r, name, sizeof name);
        if (li < 32) {
            /* below the panel: lnormd in the left column, echo in the right */
            int is_echo = strcmp(r->label, "echo") == 0;
            legend(f, a.x0 + (is_echo ? 200 : 0), a.y0 + a.h + 58, (int)load_index(rp, i), col, dash,
                   name);
            li++;
        }
    }

    /* right: throughput against load */
    int open = rp->n && rp->runs[0].open_loop;
    panel b = {620, 60, 440, 330, 1e300, 0, 1e300, 0, 0, 0};
    const char *labels[2] = {"lnormd", "echo"};
    for (size_t i = 0; i < rp->n; i++) {
        const lnorm__runres *r = &rp->runs[i];
        if (r->error[0] || r->ok == 0)
            continue;
        double x = open ? r->rps : (double)r->concurrency;
        double y0 = open ? r->p50_ns / 1e3 : r->rps, y1 = open ? r->p99_ns / 1e3 : r->rps;
        if (x < b.xmin)
            b.xmin = x;
        if (x > b.xmax)
            b.xmax = x;
        if (y0 < b.ymin)
            b.ymin = y0;
        if (y1 > b.ymax)
            b.ymax = y1;
    }
    if (b.xmax <= 0) {
        b.xmin = 1, b.xmax = 10, b.ymin = 0, b.ymax = 1;
    }
    if (open) {
        b.ylog = 1;
        b.ymin = pow(10, floor(log10(b.ymin > 0 ? b.ymin : 1)));
        b.ymax = pow(10, ceil(log10(b.ymax * 1.01)));
        b.xmin = 0;
        b.xmax *= 1.1;
        axes(f, &b, "Latency against throughput (open loop)", "achieved requests/s",
             "latency (us)", 0);
    } else {
        b.xlog = 1;
        if (b.xmin == b.xmax)
            b.xmin /= 2, b.xmax *= 2;
        b.ymin = 0;
        b.ymax *= 1.1;
        axes(f, &b, "Throughput against concurrency (closed loop)", "requests in flight",
             "requests/s", 0);
    }
    li = 0;
    for (int lab = 0; lab < 2; lab++) {
        for (int which = 0; which < (open ? 2 : 1); which++) {
            const char *col = palette[(lab * 2 + which) % NPAL];
            const char *dash = lab == 1 ? "stroke-dasharray='5,3'" : "";
            int np = 0;
            fprintf(f, "<polyline fill='none' stroke='%s' stroke-width='2' %s points='", col, dash);
            for (size_t i = 0; i < rp->n; i++) {
                const lnorm__runres *r = &rp->runs[i];
                int is_echo = strcmp(r->label, "echo") == 0;
                if (is_echo != lab || r->error[0] || r->ok == 0)
                    continue;
                double x = open ? r->rps : (double)r->concurrency;
                double y = open ? (which ? r->p99_ns : r->p50_ns) / 1e3 : r->rps;
                fprintf(f, "%.1f,%.1f ", px(&b, x), py(&b, y));
                np++;
            }
            fprintf(f, "'/>\n");
            for (size_t i = 0; i < rp->n; i++) {
                const lnorm__runres *r = &rp->runs[i];
                int is_echo = strcmp(r->label, "echo") == 0;
                if (is_echo != lab || r->error[0] || r->ok == 0)
                    continue;
                double x = open ? r->rps : (double)r->concurrency;
                double y = open ? (which ? r->p99_ns : r->p50_ns) / 1e3 : r->rps;
                fprintf(f, "<circle cx='%.1f' cy='%.1f' r='3' fill='%s'/>\n", px(&b, x), py(&b, y), col);
            }
            if (np) {
                char name[64];
                snprintf(name, sizeof name, "%s%s", labels[lab], open ? (which ? " p99" : " p50") : "");
                legend(f, b.x0 + 8, b.y0 + 12, li++, col, dash, name);
            }
        }
    }
    fprintf(f, "</svg>\n");
    return fclose(f) == 0 ? 0 : -1;
}
