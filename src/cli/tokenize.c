/* tokenize.c - `deltafin tokenize` and `deltafin detokenize`.
 *
 *   deltafin tokenize --tokenizer PATH [--jsonl] [--allow-special] [--threads N]
 *     stdin (raw bytes) -> one JSON array of ids; with --jsonl every stdin line
 *     is a JSON string and every output line the array for it.
 *   deltafin detokenize --tokenizer PATH [--stream]
 *     stdin: a JSON array of ids -> the exact bytes on stdout. With --stream,
 *     the ids go through the streaming detokenizer one at a time and every
 *     push prints one JSON line {"id": N, "hex": "...", "text": "..."} with
 *     the bytes it completed (never ending inside a UTF-8 character; "text"
 *     is null when they are not valid UTF-8), then one line {"flush": true,
 *     "hex": ..., "text": ...} with what was held back at the end.
 *
 * Exit codes: 0 ok, 2 bad input (usage, missing/broken tokenizer, bad JSON on
 * stdin, id out of range), 1 I/O failure. Errors are one line on stderr. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "deltafin.h"
#include "tok/tokenizer.h"
#include "util/util.h"

static const char tok_usage[] =
    "usage: deltafin tokenize --tokenizer PATH [--jsonl] [--allow-special] [--threads N]\n"
    "  Reads UTF-8 text from stdin and prints its token ids as one JSON array (no BOS added).\n"
    "  PATH: a model directory (tokenizer.json, or tiktoken.model + tokenizer_config.json),\n"
    "        a tokenizer.json file, a *.tiktoken file with a same-stem *.json,\n"
    "        or a *.gguf file (its embedded tokenizer).\n"
    "  --jsonl           every stdin line is a JSON string; prints one array per line\n"
    "  --allow-special   tiktoken files: encode special-token text as special ids\n"
    "                    (tokenizer.json tokenizers always do, as Hugging Face does)\n"
    "  --threads N       encoding threads (0 = all cores, the default); ids never depend on it\n"
    "  --time            print the load and encode seconds on stderr (what `deltafin bench tokenizer` reads)\n";
static const char detok_usage[] =
    "usage: deltafin detokenize --tokenizer PATH [--stream]\n"
    "  Reads a JSON array of token ids from stdin and writes the decoded bytes to stdout.\n"
    "  PATH: as for tokenize, or a *.gguf file (its embedded tokenizer).\n"
    "  --stream   push the ids one at a time through the streaming detokenizer and print\n"
    "             one JSON line per id: {\"id\": N, \"hex\": BYTES, \"text\": STRING or null},\n"
    "             then {\"flush\": true, ...} with the bytes held back at the end\n"
    "  --time     print the load and decode seconds on stderr (what `deltafin bench tokenizer` reads)\n";

static int read_stdin(char **out, size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *b = df_xmalloc(cap);
    for (;;) {
        if (n + 65536 > cap) { cap *= 2; b = df_xrealloc(b, cap); }
        size_t r = fread(b + n, 1, cap - n - 1, stdin);
        n += r;
        if (r == 0) break;
    }
    if (ferror(stdin)) { free(b); return DF_EIO; }
    b[n] = 0;
    *out = b;
    *len = n;
    return 0;
}

static void put_ids(df_buf *o, const int32_t *ids, size_t n) {
    df_buf_put(o, "[", 1);
    char tmp[16];
    for (size_t i = 0; i < n; i++) {
        int l = snprintf(tmp, sizeof tmp, i ? ", %d" : "%d", (int)ids[i]);
        df_buf_put(o, tmp, (size_t)l);
    }
    df_buf_put(o, "]\n", 2);
}

static int write_all(const char *p, size_t n) {
    if (n && fwrite(p, 1, n, stdout) != n) return DF_EIO;
    return fflush(stdout) ? DF_EIO : 0;
}

int df_cmd_tokenize(int argc, char **argv) {
    const char *path = NULL;
    int jsonl = 0, flags = 0, threads = 0, timing = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) { fputs(tok_usage, stdout); return 0; }
        else if (!strcmp(argv[i], "--tokenizer") && i + 1 < argc) path = argv[++i];
        else if (!strcmp(argv[i], "--time")) timing = 1;
        else if (!strcmp(argv[i], "--jsonl")) jsonl = 1;
        else if (!strcmp(argv[i], "--allow-special")) flags |= DF_TOK_ALLOW_SPECIAL;
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
            char *e;
            long v = strtol(argv[++i], &e, 10);
            if (*e || v < 0 || v > 4096) { fprintf(stderr, "deltafin tokenize: --threads: expected an integer in [0, 4096], got \"%s\"\n", argv[i]); return 2; }
            threads = (int)v;
        } else {
            fprintf(stderr, "deltafin tokenize: unknown or incomplete argument \"%s\"\n%s", argv[i], tok_usage);
            return 2;
        }
    }
    if (!path) { fprintf(stderr, "deltafin tokenize: --tokenizer PATH is required\n%s", tok_usage); return 2; }
    char err[512];
    double t0 = df_now();
    df_tokenizer *t = df_tok_load(path, err, sizeof err);
    if (!t) { fprintf(stderr, "deltafin tokenize: %s\n", err); return 2; }
    double t_load = df_now() - t0;
    char *in;
    size_t n;
    int rc = read_stdin(&in, &n);
    if (rc) { df_tok_free(t); fprintf(stderr, "deltafin tokenize: cannot read stdin\n"); return 1; }
    df_buf o = {0};
    int code = 0;
    t0 = df_now();
    if (!jsonl) {
        int32_t *ids;
        size_t m;
        if (df_tok_encode_err(t, in, n, flags, threads, &ids, &m, err, sizeof err)) {
            fprintf(stderr, "deltafin tokenize: %s\n", err);
            code = 2;
        } else {
            put_ids(&o, ids, m);
            free(ids);
        }
    } else {
        size_t line = 0, p = 0;
        while (p < n) {
            line++;
            char *nl = memchr(in + p, '\n', n - p);
            size_t e = nl ? (size_t)(nl - in) : n;
            json_error_t je;
            json_t *v = json_loadb(in + p, e - p, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
            if (!v || !json_is_string(v)) {
                fprintf(stderr, "deltafin tokenize: stdin line %zu: expected a JSON string%s%s\n", line, v ? "" : ": ", v ? "" : je.text);
                json_decref(v);
                code = 2;
                break;
            }
            int32_t *ids;
            size_t m;
            if (df_tok_encode_err(t, json_string_value(v), json_string_length(v), flags, threads, &ids, &m, err, sizeof err)) {
                fprintf(stderr, "deltafin tokenize: stdin line %zu: %s\n", line, err);
                json_decref(v);
                code = 2;
                break;
            }
            put_ids(&o, ids, m);
            free(ids);
            json_decref(v);
            p = e + 1;
        }
    }
    if (timing) fprintf(stderr, "deltafin tokenize: time: load %.6f s, encode %.6f s, %zu bytes\n", t_load, df_now() - t0, n);
    if (!code && write_all(o.p, o.len)) { fprintf(stderr, "deltafin tokenize: write error\n"); code = 1; }
    df_buf_free(&o);
    free(in);
    df_tok_free(t);
    return code;
}

/* One --stream line: the bytes as hex and, when valid UTF-8, as a string. */
static void put_chunk(df_buf *o, const char *key, long id, const char *p, size_t n) {
    json_t *j = json_object();
    if (id >= 0) json_object_set_new(j, key, json_integer(id));
    else json_object_set_new(j, key, json_true());
    char *hex = df_xmalloc(2 * n + 1);
    for (size_t i = 0; i < n; i++) snprintf(hex + 2 * i, 3, "%02x", (unsigned char)p[i]);
    hex[2 * n] = 0;
    json_object_set_new(j, "hex", json_string(hex));
    json_t *txt = json_stringn(p, n); /* NULL when not valid UTF-8 */
    json_object_set_new(j, "text", txt ? txt : json_null());
    char *line = json_dumps(j, JSON_COMPACT | JSON_ENSURE_ASCII);
    df_buf_puts(o, line);
    df_buf_put(o, "\n", 1);
    free(line);
    free(hex);
    json_decref(j);
}

int df_cmd_detokenize(int argc, char **argv) {
    const char *path = NULL;
    int stream = 0, timing = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) { fputs(detok_usage, stdout); return 0; }
        else if (!strcmp(argv[i], "--tokenizer") && i + 1 < argc) path = argv[++i];
        else if (!strcmp(argv[i], "--time")) timing = 1;
        else if (!strcmp(argv[i], "--stream")) stream = 1;
        else {
            fprintf(stderr, "deltafin detokenize: unknown or incomplete argument \"%s\"\n%s", argv[i], detok_usage);
            return 2;
        }
    }
    if (!path) { fprintf(stderr, "deltafin detokenize: --tokenizer PATH is required\n%s", detok_usage); return 2; }
    char err[512];
    double t0 = df_now();
    df_tokenizer *t = df_tok_load(path, err, sizeof err);
    if (!t) { fprintf(stderr, "deltafin detokenize: %s\n", err); return 2; }
    double t_load = df_now() - t0;
    char *in;
    size_t n;
    if (read_stdin(&in, &n)) { df_tok_free(t); fprintf(stderr, "deltafin detokenize: cannot read stdin\n"); return 1; }
    json_error_t je;
    json_t *arr = json_loadb(in, n, 0, &je);
    free(in);
    int code = 0;
    if (!arr || !json_is_array(arr)) {
        fprintf(stderr, "deltafin detokenize: stdin: expected a JSON array of token ids%s%s\n", arr ? "" : ": ", arr ? "" : je.text);
        json_decref(arr);
        df_tok_free(t);
        return 2;
    }
    size_t m = json_array_size(arr);
    int32_t *ids = df_xmalloc((m ? m : 1) * sizeof *ids);
    for (size_t i = 0; i < m; i++) {
        json_t *v = json_array_get(arr, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= df_tok_vocab_size(t)) {
            fprintf(stderr, "deltafin detokenize: stdin[%zu]: expected a token id in [0, %d), got %s\n", i, df_tok_vocab_size(t),
                    json_is_integer(v) ? "an out-of-range integer" : "a non-integer");
            code = 2;
            break;
        }
        ids[i] = (int32_t)json_integer_value(v);
    }
    json_decref(arr);
    if (!code && stream) {
        df_tok_stream *st = df_tok_stream_new(t);
        df_buf o = {0};
        size_t k;
        for (size_t i = 0; i < m; i++) {
            const char *p = df_tok_stream_push(st, ids[i], &k);
            put_chunk(&o, "id", ids[i], p, k);
        }
        const char *p = df_tok_stream_flush(st, &k);
        put_chunk(&o, "flush", -1, p, k);
        if (write_all(o.p, o.len)) { fprintf(stderr, "deltafin detokenize: write error\n"); code = 1; }
        df_buf_free(&o);
        df_tok_stream_free(st);
    } else if (!code) {
        char *out;
        size_t ol;
        t0 = df_now();
        int rc = df_tok_decode_err(t, ids, m, &out, &ol, err, sizeof err);
        if (timing && !rc) fprintf(stderr, "deltafin detokenize: time: load %.6f s, decode %.6f s, %zu bytes\n", t_load, df_now() - t0, ol);
        if (rc) { fprintf(stderr, "deltafin detokenize: %s\n", err); code = 2; }
        else {
            if (write_all(out, ol)) { fprintf(stderr, "deltafin detokenize: write error\n"); code = 1; }
            free(out);
        }
    }
    free(ids);
    df_tok_free(t);
    return code;
}
