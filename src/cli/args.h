/* args.h - tiny option parsing shared by the subcommands. Options are
 * "--name value" or "--name=value"; flags take no value. */
#ifndef DF_ARGS_H
#define DF_ARGS_H
#include "deltafin.h"

typedef struct {
    int argc, i;
    char **argv;
    const char *cmd;
    const char *val; /* value of the option just matched */
    char *pending;   /* value after '=' */
    int bad;
} df_args;

void df_args_init(df_args *a, int argc, char **argv);
/* Next option name, or NULL at the end. Non-option arguments are errors. */
const char *df_args_next(df_args *a);
/* If the current option is name (and takes a value), stores it in a->val. */
int df_args_opt(df_args *a, const char *opt, const char *name, int takes_value);
/* Common model options (--model, --threads, --ram, --expert-cache). Returns 1 if consumed. */
int df_args_model_opts(df_args *a, const char *opt, const char **model, df_options *o);
/* Speculative decoding options of run and serve: --spec MODE, --spec-max K,
 * --draft MODEL. Returns 1 if consumed. */
typedef struct { int mode, k; const char *draft; } df_spec_opts;
void df_spec_opts_default(df_spec_opts *s); /* auto, K 8, no draft model */
int df_args_spec_opts(df_args *a, const char *opt, df_spec_opts *s);
/* After parsing: refusals of combinations (mtp, draft without --draft, ...);
 * 0 or 2 (the message printed). */
int df_spec_opts_check(df_args *a, const df_spec_opts *s);
/* Opens the --draft model (NULL when none) and checks its vocabulary
 * against e's; on failure *err holds one line and it returns NULL with
 * *failed set. */
df_engine *df_spec_open_draft(const df_spec_opts *s, df_engine *e, const df_options *o, int *failed, char *err, size_t errlen);
int df_args_fail(df_args *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int df_parse_int(const char *s, long lo, long hi, long *out);
/* A whole-string decimal that is finite and within float range (the options
 * it parses are floats); NaN, infinities and overflow are refused (-1). */
int df_parse_float(const char *s, double *out);
#endif
