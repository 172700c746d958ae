/* args.c - see args.h. */
#include "cli/args.h"
#include "util/util.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void df_args_init(df_args *a, int argc, char **argv) {
    memset(a, 0, sizeof *a);
    a->argc = argc;
    a->argv = argv;
    a->cmd = argv[0];
    a->i = 1;
}

static char optbuf[256];

const char *df_args_next(df_args *a) {
    if (a->bad || a->i >= a->argc) return NULL;
    const char *s = a->argv[a->i++];
    if (strncmp(s, "--", 2) && strcmp(s, "-h")) {
        df_args_fail(a, "unexpected argument '%s'", s);
        return NULL;
    }
    const char *eq = strchr(s, '=');
    if (eq) {
        size_t n = (size_t)(eq - s) < sizeof optbuf - 1 ? (size_t)(eq - s) : sizeof optbuf - 1;
        memcpy(optbuf, s, n);
        optbuf[n] = 0;
        a->pending = (char *)eq + 1;
        return optbuf;
    }
    a->pending = NULL;
    return s;
}

int df_args_opt(df_args *a, const char *opt, const char *name, int takes_value) {
    if (strcmp(opt, name)) return 0;
    if (!takes_value) {
        if (a->pending) { df_args_fail(a, "%s takes no value", name); return 0; }
        return 1;
    }
    if (a->pending) a->val = a->pending;
    else if (a->i < a->argc) a->val = a->argv[a->i++];
    else { df_args_fail(a, "%s needs a value", name); return 0; }
    return 1;
}

int df_args_fail(df_args *a, const char *fmt, ...) {
    if (a->bad) return 2;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "deltafin %s: ", a->cmd);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, " (see deltafin %s --help)\n", a->cmd);
    va_end(ap);
    a->bad = 1;
    return 2;
}

int df_parse_int(const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}
int df_parse_float(const char *s, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    /* "nan" and "inf" parse, but fail every range check by comparison (NaN) or make NaN later */
    if (errno || end == s || *end || !isfinite(v) || fabs(v) > FLT_MAX) return -1;
    *out = v;
    return 0;
}

int df_args_model_opts(df_args *a, const char *opt, const char **model, df_options *o) {
    long v;
    if (df_args_opt(a, opt, "--model", 1)) { *model = a->val; return 1; }
    if (df_args_opt(a, opt, "--threads", 1)) {
        if (df_parse_int(a->val, 1, 1024, &v)) df_args_fail(a, "--threads: expected 1..1024, got '%s'", a->val);
        else o->n_threads = (int)v;
        return 1;
    }
    if (df_args_opt(a, opt, "--ram", 1)) {
        int64_t b = df_parse_size(a->val);
        if (b <= 0) df_args_fail(a, "--ram: expected a size like 16G, got '%s'", a->val);
        else o->ram_bytes = b;
        return 1;
    }
    if (df_args_opt(a, opt, "--backend", 1)) {
        if (strcmp(a->val, "cpu") && strcmp(a->val, "cuda") && strcmp(a->val, "auto")) df_args_fail(a, "--backend: expected cpu, cuda or auto, got '%s'", a->val);
        else o->backend = a->val;
        return 1;
    }
    if (df_args_opt(a, opt, "--gpu-memory", 1)) {
        int64_t b = df_parse_size(a->val);
        if (b <= 0) df_args_fail(a, "--gpu-memory: expected a size like 24G, got '%s'", a->val);
        else o->gpu_memory_bytes = b;
        return 1;
    }
    if (df_args_opt(a, opt, "--mmap", 0)) { o->mmap_weights = 1; return 1; }
    if (df_args_opt(a, opt, "--trace", 1)) { o->trace_path = a->val; return 1; }
    if (df_args_opt(a, opt, "--prefetch", 1)) {
        if (!strcmp(a->val, "auto")) o->prefetch = 0;
        else if (!strcmp(a->val, "always")) o->prefetch = 1;
        else if (!strcmp(a->val, "never")) o->prefetch = 2;
        else df_args_fail(a, "--prefetch: expected auto, always or never, got '%s'", a->val);
        return 1;
    }
    if (df_args_opt(a, opt, "--expert-cache", 1)) {
        int64_t b = df_parse_size(a->val);
        if (b < 0) df_args_fail(a, "--expert-cache: expected a size like 8G (0 = minimum), got '%s'", a->val);
        else o->expert_cache_bytes = b;
        return 1;
    }
    return 0;
}

void df_spec_opts_default(df_spec_opts *s) {
    s->mode = DF_SPEC_AUTO; /* prompt lookup while it pays; the ids are those of none (docs/CLI.md) */
    s->k = DF_SPEC_DEFAULT_K;
    s->draft = NULL;
}

int df_args_spec_opts(df_args *a, const char *opt, df_spec_opts *s) {
    long v;
    if (df_args_opt(a, opt, "--spec", 1)) {
        int m = df_spec_parse(a->val);
        if (m < 0) df_args_fail(a, "--spec: expected none, ngram, draft, mtp or auto, got '%s'", a->val);
        else s->mode = m;
        return 1;
    }
    if (df_args_opt(a, opt, "--spec-max", 1)) {
        if (df_parse_int(a->val, 1, DF_SPEC_MAX_K, &v)) df_args_fail(a, "--spec-max: expected 1..%d drafted tokens per pass, got '%s'", DF_SPEC_MAX_K, a->val);
        else s->k = (int)v;
        return 1;
    }
    if (df_args_opt(a, opt, "--draft", 1)) { s->draft = a->val; return 1; }
    return 0;
}

int df_spec_opts_check(df_args *a, const df_spec_opts *s) {
    if (s->mode == DF_SPEC_DRAFT && !s->draft) return df_args_fail(a, "--spec draft needs --draft MODEL (a model with the same tokenizer)");
    if (s->draft && s->mode != DF_SPEC_DRAFT) return df_args_fail(a, "--draft MODEL is used by --spec draft only (got --spec %s)", df_spec_name(s->mode));
    return 0;
}

df_engine *df_spec_open_draft(const df_spec_opts *s, df_engine *e, const df_options *o, int *failed, char *err, size_t errlen) {
    *failed = 0;
    if (s->mode == DF_SPEC_MTP && !df_engine_has_mtp(e)) {
        *failed = 1;
        df_err(err, errlen, DF_EINPUT, "--spec mtp: the model has no MTP module to draft with (it needs a DeepSeek-V3/R1 or Kimi K2 checkpoint "
               "with num_nextn_predict_layers >= 1 and the layer's tensors, loaded resident, not streamed); use --spec ngram, draft or auto");
        return NULL;
    }
    if (s->mode != DF_SPEC_DRAFT || !s->draft) return NULL;
    char e2[768];
    df_options d = *o;
    d.trace_path = NULL;
    df_engine *de = df_engine_open(s->draft, &d, e2, sizeof e2);
    if (!de) {
        *failed = 1;
        df_err(err, errlen, DF_EINPUT, "--draft %s: %s", s->draft, e2);
        return NULL;
    }
    if (df_spec_check_draft(e, de, err, errlen)) {
        *failed = 1;
        df_engine_close(de);
        return NULL;
    }
    return de;
}
