/* eval.c - `deltafin eval`: one teacher-forced pass over the given ids,
 * dumping float32 little-endian logits for every position, row-major
 * [n_ids x vocab_size]. The interface is fixed: tests and tools rely on it. */
#include "cli/args.h"
#include "cli/cli.h"
#include "util/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *usage =
    "usage: deltafin eval [--model M] --ids 1,2,3 --dump-logits FILE [--dump-mtp-logits FILE] [--decode-from K] [--threads N] [--ram SIZE]\n"
    "                     [--expert-cache SIZE] [--trace FILE] [--prefetch auto|always|never] [--mmap] [--backend cpu|cuda|auto]\n"
    "                     [--gpu-memory SIZE]\n"
    "  M: checkpoint directory, store, GGUF file or installed name (default " DF_DEFAULT_MODEL ").\n"
    "  One teacher-forced pass over the ids; FILE gets float32 little-endian logits for every\n"
    "  position, row-major [n_ids x vocab_size]. Prints the argmax of each position to stdout.\n"
    "  --decode-from K: the first K ids in that pass, then every later id as a one-token decode step (the decode\n"
    "  path's kernels), its logits in the same rows.\n";

int df_cmd_eval(int argc, char **argv) {
    df_args a;
    df_args_init(&a, argc, argv);
    df_options o;
    df_cli_options_default(&o);
    const char *model = NULL, *ids_s = NULL, *dump = NULL, *dump_mtp = NULL, *from_s = NULL;
    const char *opt;
    while ((opt = df_args_next(&a))) {
        if (!strcmp(opt, "--help") || !strcmp(opt, "-h")) { fputs(usage, stdout); return 0; }
        if (df_args_model_opts(&a, opt, &model, &o)) continue;
        if (df_args_opt(&a, opt, "--ids", 1)) ids_s = a.val;
        else if (df_args_opt(&a, opt, "--dump-logits", 1)) dump = a.val;
        else if (df_args_opt(&a, opt, "--dump-mtp-logits", 1)) dump_mtp = a.val;
        else if (df_args_opt(&a, opt, "--decode-from", 1)) from_s = a.val;
        else if (!a.bad) df_args_fail(&a, "unknown option '%s'", opt);
    }
    if (a.bad) return 2;
    if (!model) model = DF_DEFAULT_MODEL;
    if (!ids_s) return df_args_fail(&a, "--ids is required");
    char err[1024];
    int32_t *ids;
    size_t n;
    if (df_parse_ids(ids_s, &ids, &n, err, sizeof err)) { fprintf(stderr, "deltafin eval: %s\n", err); return 2; }
    if (!n) { free(ids); return df_args_fail(&a, "--ids: empty list"); }
    size_t from = n; /* --decode-from: ids from here on go one at a time through the decode step */
    if (from_s) {
        char *end = NULL;
        const long v = strtol(from_s, &end, 10);
        if (!*from_s || *end || v < 1 || (size_t)v > n) {
            free(ids);
            return df_args_fail(&a, "--decode-from: expected an integer 1..%zu (the number of ids), got '%s'", n, from_s);
        }
        from = (size_t)v;
        if (dump_mtp) { free(ids); return df_args_fail(&a, "--decode-from and --dump-mtp-logits: one at a time (the MTP rows come from the one pass)"); }
    }
    df_engine *e = df_engine_open(model, &o, err, sizeof err);
    if (!e) { fprintf(stderr, "deltafin eval: %s\n", err); free(ids); return 2; }
    df_model_info info;
    df_engine_info(e, &info);
    int code = 0;
    df_session *s = df_session_new(e, (int)n);
    float *out = NULL;
    if (!s) { fprintf(stderr, "deltafin eval: %s\n", df_engine_error(e)); code = 1; goto done; }
    out = malloc(n * (size_t)info.vocab_size * sizeof(float));
    if (!out) { fprintf(stderr, "deltafin eval: cannot allocate %zu x %d logits\n", n, info.vocab_size); code = 1; goto done; }
    int rc = df_session_eval_all(s, ids, from, out);
    for (size_t i = from; !rc && i < n; i++) { /* row i: the logits after id i, pushed as a one-token step */
        if (!(rc = df_session_push(s, ids[i]))) memcpy(out + i * (size_t)info.vocab_size, df_session_logits(s), (size_t)info.vocab_size * sizeof(float));
    }
    if (rc) { fprintf(stderr, "deltafin eval: %s\n", df_engine_error(e)); code = df_exit_code(rc); goto done; }
    if (dump) {
        FILE *f = fopen(dump, "wb");
        if (!f || fwrite(out, sizeof(float), n * (size_t)info.vocab_size, f) != n * (size_t)info.vocab_size || fclose(f)) {
            fprintf(stderr, "deltafin eval: %s: cannot write logits\n", dump);
            code = 1;
            goto done;
        }
    }
    if (dump_mtp) { /* the MTP module's logits of every position but the last, [(n-1) x vocab] */
        if (!df_engine_has_mtp(e) || n < 2) {
            fprintf(stderr, "deltafin eval: --dump-mtp-logits: %s\n", n < 2 ? "needs at least 2 ids" : "the model has no MTP module (or it is streamed)");
            code = 2;
            goto done;
        }
        const size_t cnt = (n - 1) * (size_t)info.vocab_size;
        float *ml = malloc(cnt * sizeof(float));
        if (!ml) { fprintf(stderr, "deltafin eval: cannot allocate %zu x %d logits\n", n - 1, info.vocab_size); code = 1; goto done; }
        if ((rc = df_session_mtp_logits(s, ml))) {
            fprintf(stderr, "deltafin eval: %s\n", df_engine_error(e));
            free(ml);
            code = df_exit_code(rc);
            goto done;
        }
        FILE *f = fopen(dump_mtp, "wb");
        int bad = !f || fwrite(ml, sizeof(float), cnt, f) != cnt;
        if (f && fclose(f)) bad = 1;
        free(ml);
        if (bad) { fprintf(stderr, "deltafin eval: %s: cannot write logits\n", dump_mtp); code = 1; goto done; }
    }
    for (size_t i = 0; i < n; i++) {
        const float *row = out + i * (size_t)info.vocab_size;
        int best = 0;
        for (int v = 1; v < info.vocab_size; v++) if (row[v] > row[best]) best = v;
        printf("%s%d", i ? " " : "", best);
    }
    printf("\n");
done:
    free(out);
    df_session_free(s);
    df_engine_close(e);
    free(ids);
    return code;
}
