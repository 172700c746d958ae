/* inspect.c - `deltafin inspect --model M`: family, shapes, dtype mix,
 * total and active parameters and bytes. */
#include "cli/args.h"
#include "cli/cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *usage = "usage: deltafin inspect [--model M]\n"
                           "  M: checkpoint directory, store, GGUF file or installed name (default " DF_DEFAULT_MODEL ").\n"
                           "  Describes a model: family, layer and expert shapes, dtype mix, total and active\n"
                           "  (per token) parameters and weight bytes.\n";

int df_cmd_inspect(int argc, char **argv) {
    df_args a;
    df_args_init(&a, argc, argv);
    df_options o;
    df_cli_options_default(&o);
    const char *model = NULL, *opt;
    while ((opt = df_args_next(&a))) {
        if (!strcmp(opt, "--help") || !strcmp(opt, "-h")) { fputs(usage, stdout); return 0; }
        if (df_args_model_opts(&a, opt, &model, &o)) continue;
        if (!a.bad) df_args_fail(&a, "unknown option '%s'", opt);
    }
    if (a.bad) return 2;
    if (!model) model = DF_DEFAULT_MODEL;
    char err[1024];
    df_engine *e = df_engine_open(model, &o, err, sizeof err);
    if (!e) { fprintf(stderr, "deltafin inspect: %s\n", err); return 2; }
    char *d = df_engine_describe(e);
    fputs(d, stdout);
    free(d);
    df_engine_close(e);
    return 0;
}
