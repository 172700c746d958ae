/* run.c - `deltafin run`: prefill a prompt (text, chat or ids), then decode
 * up to --max-new tokens with the shared generation step (df_gen, as the
 * server does), streaming each as it is produced; stops at the model's EOS
 * ids. --stats prints speed and the time split to stderr. */
#include "cli/args.h"
#include "cli/cli.h"
#include "grammar/grammar.h"
#include "util/util.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *usage =
    "usage: deltafin run [--model M] (--prompt TEXT | --ids LIST) [options]\n"
    "  --model M           checkpoint dir, GGUF file or installed name (default " DF_DEFAULT_MODEL ")\n"
    "  --max-new N         tokens to generate (default 256)\n"
    "  --chat              wrap --prompt as one user message with the model's chat template\n"
    "  --system TEXT       system message for --chat\n"
    "  --temperature T     0 = greedy (default); > 0 samples\n"
    "  --top-k K --top-p P --min-p P   sampling filters (temperature > 0)\n"
    "  --seed S            sampler seed (same seed, same tokens; default 0)\n"
    "  --print-ids         print generated token ids instead of text\n"
    "  --ignore-eos        do not stop at end-of-sequence tokens\n"
    "  --json-schema FILE  constrained decoding: the output is a JSON document valid under the schema in FILE\n"
    "                      (docs/GRAMMAR.md: supported keywords; others are refused)\n"
    "  --grammar FILE      constrained decoding: the output matches the grammar in FILE (docs/GRAMMAR.md), rule 'root'\n"
    "  --ctx N             context length of the session (default: min(model, 4096))\n"
    "  --stats             print prefill/decode tokens/s, weight GB/s and the time split to stderr\n"
    "  --stats-json FILE   the same numbers as one JSON object in FILE, with the generated ids and per-token series\n"
    "                      (time, expert-cache hits, reads and bytes read after each token; what `deltafin bench` reads)\n"
    "  --threads N --ram SIZE --expert-cache SIZE   budget; --expert-cache streams routed experts from disk (0 = minimum)\n"
    "  --trace FILE        JSONL: per token and MoE layer, the experts chosen and how each was served\n"
    "  --prefetch MODE     router-lookahead prefetch of streamed experts: auto (default: only while at least half of\n"
    "                      the recent predictions were right), always, never\n"
    "  --mmap              map weights from the files instead of reading them into owned memory\n"
    "  --backend B         cpu (default), cuda (a build with make CUDA=1), or auto (cuda when a GPU is present)\n"
    "  --gpu-memory SIZE   VRAM budget of the cuda backend (default: free VRAM minus max(512M, 5%)); spine first, routed experts cached in the rest\n"
    "  --spec MODE         speculative decoding: auto (default: prompt lookup while it pays), none (plain steps),\n"
    "                      ngram (prompt lookup always), draft (--draft MODEL drafts), mtp (the checkpoint's MTP module:\n"
    "                      DeepSeek-V3/R1, Kimi K2). The tokens are those of none, for every temperature and seed (on\n"
    "                      the CPU a verify pass computes each position as a plain step does; where a backend cannot,\n"
    "                      cuda, auto takes plain steps). Off with a grammar and on recurrent models ([stats] says so)\n"
    "  --spec-max K        most drafted tokens per verify pass, 1..32 (default 8)\n"
    "  --draft MODEL       the draft model of --spec draft (same tokenizer: same size and bytes for every id)\n";

static void print_spec_stats(const df_gen *g, const df_stats *st) {
    df_spec_stats ss;
    df_gen_spec_stats(g, &ss);
    if (ss.mode != DF_SPEC_NONE) {
        fprintf(stderr, "[stats] spec %s: ", df_spec_name(ss.mode));
        if (ss.off_reason[0]) fprintf(stderr, "%s; ", ss.off_reason);
        if (ss.text_level) fprintf(stderr, "across tokenizers (text level); ");
        fprintf(stderr, "%ld verify passes, %ld drafted, %ld accepted (%.1f%%), %.2f tokens per pass; %ld plain steps; "
                "time: drafting %.3f s, verifying %.3f s, plain steps %.3f s",
                ss.passes, ss.drafted, ss.accepted, ss.drafted ? 100.0 * ss.accepted / ss.drafted : 0,
                ss.passes ? (double)ss.pass_tokens / ss.passes : 0, ss.plain_steps, ss.t_draft, ss.t_verify, ss.t_plain);
        if (ss.mode == DF_SPEC_AUTO && !ss.off_reason[0]) fprintf(stderr, "; draft length now %d%s", ss.k_now, ss.k_now ? "" : " (off: drafting would lose)");
        fputc('\n', stderr);
    }
    if (st->streaming) { /* with --spec none too: the baseline of the comparison */
        long toks = (long)df_gen_count(g);
        fprintf(stderr, "[stats] spec: expert bytes read per generated token %.3f MB (%.1f MB in decode passes for %ld tokens)\n",
                toks ? st->decode_bytes_read / 1e6 / toks : 0, st->decode_bytes_read / 1e6, toks);
    }
}

static void print_stats(df_engine *e) {
    df_stats st;
    df_stats_get(e, &st);
    double pf = st.prefill_seconds > 0 ? st.prefill_tokens / st.prefill_seconds : 0;
    double dc = st.decode_seconds > 0 ? st.decode_tokens / st.decode_seconds : 0;
    double gbs = st.decode_seconds > 0 ? st.weight_bytes_touched / st.decode_seconds / 1e9 : 0;
    double tot = st.t_attention + st.t_experts + st.t_other;
    fprintf(stderr, "\n[stats] prefill %lld tokens in %.3f s (%.2f tok/s); decode %lld tokens in %.3f s (%.2f tok/s, %.2f GB/s of weights)\n",
            (long long)st.prefill_tokens, st.prefill_seconds, pf, (long long)st.decode_tokens, st.decode_seconds, dc, gbs);
    if (tot > 0)
        fprintf(stderr, "[stats] time split: attention %.1f%%, ffn/experts %.1f%%, other %.1f%%\n", 100 * st.t_attention / tot,
                100 * st.t_experts / tot, 100 * st.t_other / tot);
    fprintf(stderr, "[stats] peak RSS %.1f MB; session state %lld B per token + %lld B fixed (per snapshot)\n", st.peak_rss_bytes / 1e6,
            (long long)st.state_bytes_per_token, (long long)st.state_bytes_fixed);
    {
        df_model_info mi;
        df_engine_info(e, &mi);
        fprintf(stderr, "[stats] backend %s (%d CPU threads)\n", mi.backend, mi.backend_threads);
    }
    if (st.decode_ahead_tokens)
        fprintf(stderr, "[stats] decode ahead: %lld of %lld decode steps queued before their token was known (greedy, one token ahead)\n",
                (long long)st.decode_ahead_tokens, (long long)st.decode_tokens);
    if (st.gpu_budget_bytes) {
        const int64_t req = st.gpu_cache_hits + st.gpu_cache_misses;
        const double secs = st.prefill_seconds + st.decode_seconds;
        fprintf(stderr, "[stats] vram: budget %.1f MB, in use %.1f MB (%lld B); spine %.1f MB in VRAM, %.1f MB (%d weights) in host memory copied per product\n",
                st.gpu_budget_bytes / 1e6, st.gpu_used_bytes / 1e6, (long long)st.gpu_used_bytes, st.gpu_spine_bytes / 1e6, st.gpu_spine_host_bytes / 1e6, st.gpu_spine_host_weights);
        fprintf(stderr, "[stats] vram expert cache: %d slots (%lld B, %s), hit rate %.1f%% (%lld hits, %lld misses of %lld expert parts), %lld evictions, %lld bypasses\n",
                st.gpu_cache_slots, (long long)st.gpu_cache_bytes, st.gpu_evict_lfu ? "LFU" : "LRU", req ? 100.0 * st.gpu_cache_hits / req : 0,
                (long long)st.gpu_cache_hits, (long long)st.gpu_cache_misses, (long long)req, (long long)st.gpu_cache_evictions,
                (long long)st.gpu_cache_bypasses);
        fprintf(stderr, "[stats] host -> vram: experts %.1f MB (%.1f MB from pinned memory, %.1f MB staged through page-locked buffers, %.2f GB/s over the run), spine %.1f MB; pinned host memory %.1f MB\n",
                st.gpu_h2d_expert_bytes / 1e6, st.gpu_h2d_expert_pinned_bytes / 1e6, st.gpu_h2d_expert_staged_bytes / 1e6, secs > 0 ? st.gpu_h2d_expert_bytes / secs / 1e9 : 0,
                st.gpu_h2d_spine_bytes / 1e6, st.gpu_pinned_bytes / 1e6);
        if (st.decode_tokens)
            fprintf(stderr, "[stats] decode: %.1f MB of experts host -> vram per token, %.2f GB/s of decode time\n",
                    st.gpu_decode_h2d_expert_bytes / 1e6 / st.decode_tokens, st.decode_seconds > 0 ? st.gpu_decode_h2d_expert_bytes / st.decode_seconds / 1e9 : 0);
    }
    if (st.spine_int8) fprintf(stderr, "[stats] spine: row-int8 (store built with --spine int8): results are NOT exact\n");
    if (st.streaming) {
        int64_t req = st.expert_hits + st.expert_prefetch_hits + st.expert_misses;
        double secs = st.prefill_seconds + st.decode_seconds;
        fprintf(stderr, "[stats] experts streamed: cache %lld slots (%.1f MB), hit rate %.1f%% (%lld hits, %lld prefetch hits, %lld reads of %lld)\n",
                (long long)st.expert_cache_slots, st.expert_cache_bytes / 1e6, req ? 100.0 * (st.expert_hits + st.expert_prefetch_hits) / req : 0,
                (long long)st.expert_hits, (long long)st.expert_prefetch_hits, (long long)st.expert_misses, (long long)req);
        static const char *pfm[] = {"auto", "always", "never"};
        fprintf(stderr, "[stats] prefetch (%s): %lld issued, precision %.1f%%, recall %.1f%%; lookahead right %lld of %lld (%.1f%%); read %.1f MB (%.2f GB/s over the run), I/O wait %.3f s\n",
                pfm[st.prefetch_mode >= 0 && st.prefetch_mode <= 2 ? st.prefetch_mode : 0], (long long)st.prefetch_issued,
                st.prefetch_issued ? 100.0 * st.expert_prefetch_hits / st.prefetch_issued : 0, req ? 100.0 * st.expert_prefetch_hits / req : 0,
                (long long)st.prefetch_predicted_right, (long long)st.prefetch_predicted,
                st.prefetch_predicted ? 100.0 * st.prefetch_predicted_right / st.prefetch_predicted : 0, st.bytes_read / 1e6,
                secs > 0 ? st.bytes_read / secs / 1e9 : 0, st.io_wait_seconds);
        if (st.slot_touch_gbs > 0)
            fprintf(stderr, "[stats] cache memory: first touch %.2f GB/s%s; %lld reads took a stale expert's slot instead of fresh memory\n",
                    st.slot_touch_gbs, st.slot_touch_gbs < 4.0 ? " (lazily backed: stale experts are reused first)" : "",
                    (long long)st.stale_reuses);
        if (st.spine_load_bytes)
            fprintf(stderr, "[stats] load: resident weights %.1f MB read in %.3f s (%.2f GB/s)\n", st.spine_load_bytes / 1e6,
                    st.spine_load_seconds, st.spine_load_seconds > 0 ? st.spine_load_bytes / st.spine_load_seconds / 1e9 : 0);
        if (st.decode_tokens)
            fprintf(stderr, "[stats] decode: %.1f MB of experts read per token, %.3f s I/O wait per token\n",
                    st.decode_bytes_read / 1e6 / st.decode_tokens, st.decode_io_wait_seconds / st.decode_tokens);
    }
    if (st.hub_stream) {
        char budget[64];
        if (st.stream_disk_budget >= 0) snprintf(budget, sizeof budget, "%.3f MB", st.stream_disk_budget / 1e6);
        else snprintf(budget, sizeof budget, "no limit");
        fprintf(stderr, "[stats] network (hub stream): %lld experts fetched, %.1f MB received in %lld requests (%lld retried), "
                        "%.3f s in transfers (summed over connections), %.3f s waited for fetches; disk (above): expert cache on disk %.3f MB (budget %s), %lld evicted\n",
                (long long)st.net_experts_fetched, st.net_bytes / 1e6, (long long)st.net_requests, (long long)st.net_retries, st.net_seconds,
                st.net_fetch_seconds, st.stream_disk_bytes / 1e6, budget, (long long)st.net_evictions);
    }
}

/* Per-token series of --stats-json: after each generated token, the time
 * since the generation loop began and the cumulative expert-cache counters.
 * Sized once for max_new tokens before the loop (no allocation per token). */
typedef struct {
    long n, cap;
    int32_t *ids;                 /* [cap] generated ids */
    double *t;                    /* [cap] seconds since the loop began */
    int64_t *hits, *reqs, *bytes; /* [cap] cumulative hits (incl. prefetch hits), lookups, bytes read */
} tok_series;

static void series_push(tok_series *ts, df_engine *e, int32_t id, double t) {
    if (ts->n >= ts->cap) return;
    df_stats st;
    df_stats_get(e, &st);
    ts->ids[ts->n] = id;
    ts->t[ts->n] = t;
    ts->hits[ts->n] = st.expert_hits + st.expert_prefetch_hits;
    ts->reqs[ts->n] = st.expert_hits + st.expert_prefetch_hits + st.expert_misses;
    ts->bytes[ts->n] = st.bytes_read;
    ts->n++;
}

static json_t *jarr_d(const double *v, long n) {
    json_t *a = json_array();
    for (long i = 0; i < n; i++) json_array_append_new(a, json_real(v[i]));
    return a;
}
static json_t *jarr_i(const int64_t *v, long n) {
    json_t *a = json_array();
    for (long i = 0; i < n; i++) json_array_append_new(a, json_integer(v[i]));
    return a;
}

/* Writes the --stats-json object to path; 0 or DF_EIO with err filled. */
static int write_stats_json(const char *path, df_engine *e, const tok_series *ts, double ttft, double wall, char *err, size_t errlen) {
    df_stats st;
    df_stats_get(e, &st);
    df_model_info mi;
    df_engine_info(e, &mi);
    int64_t req = st.expert_hits + st.expert_prefetch_hits + st.expert_misses;
    json_t *o = json_object(), *ids = json_array();
    for (long i = 0; i < ts->n; i++) json_array_append_new(ids, json_integer(ts->ids[i]));
    json_object_set_new(o, "prefill_tokens", json_integer(st.prefill_tokens));
    json_object_set_new(o, "prefill_seconds", json_real(st.prefill_seconds));
    json_object_set_new(o, "prefill_tok_s", json_real(st.prefill_seconds > 0 ? st.prefill_tokens / st.prefill_seconds : 0));
    json_object_set_new(o, "decode_tokens", json_integer(st.decode_tokens));
    json_object_set_new(o, "decode_seconds", json_real(st.decode_seconds));
    json_object_set_new(o, "decode_tok_s", json_real(st.decode_seconds > 0 ? st.decode_tokens / st.decode_seconds : 0));
    json_object_set_new(o, "weight_bytes_touched", json_integer(st.weight_bytes_touched));
    json_object_set_new(o, "weight_gbs", json_real(st.decode_seconds > 0 ? st.weight_bytes_touched / st.decode_seconds / 1e9 : 0));
    json_object_set_new(o, "ttft_s", json_real(ttft));
    json_object_set_new(o, "wall_s", json_real(wall));
    json_object_set_new(o, "peak_rss_bytes", json_integer(st.peak_rss_bytes));
    json_object_set_new(o, "backend", json_string(mi.backend ? mi.backend : "?"));
    json_object_set_new(o, "threads", json_integer(mi.backend_threads));
    json_object_set_new(o, "n_params_active", json_integer(mi.n_params_active));
    json_object_set_new(o, "weight_bytes", json_integer(mi.weight_bytes));
    json_object_set_new(o, "weight_bytes_active", json_integer(mi.weight_bytes_active));
    json_object_set_new(o, "streaming", json_boolean(st.streaming));
    json_object_set_new(o, "expert_hits", json_integer(st.expert_hits));
    json_object_set_new(o, "expert_prefetch_hits", json_integer(st.expert_prefetch_hits));
    json_object_set_new(o, "expert_misses", json_integer(st.expert_misses));
    json_object_set_new(o, "hit_rate", json_real(req ? (double)(st.expert_hits + st.expert_prefetch_hits) / req : 0));
    json_object_set_new(o, "bytes_read", json_integer(st.bytes_read));
    json_object_set_new(o, "read_gbs", json_real(st.prefill_seconds + st.decode_seconds > 0 ? st.bytes_read / (st.prefill_seconds + st.decode_seconds) / 1e9 : 0));
    json_object_set_new(o, "io_wait_seconds", json_real(st.io_wait_seconds));
    json_object_set_new(o, "decode_bytes_read", json_integer(st.decode_bytes_read));
    json_object_set_new(o, "decode_bytes_per_token", json_real(st.decode_tokens ? (double)st.decode_bytes_read / st.decode_tokens : 0));
    json_object_set_new(o, "expert_cache_bytes", json_integer(st.expert_cache_bytes));
    json_object_set_new(o, "decode_ahead_tokens", json_integer(st.decode_ahead_tokens));
    json_object_set_new(o, "ids", ids);
    json_t *se = json_object();
    json_object_set_new(se, "t", jarr_d(ts->t, ts->n));
    json_object_set_new(se, "hits", jarr_i(ts->hits, ts->n));
    json_object_set_new(se, "lookups", jarr_i(ts->reqs, ts->n));
    json_object_set_new(se, "bytes_read", jarr_i(ts->bytes, ts->n));
    json_object_set_new(o, "series", se);
    int rc = json_dump_file(o, path, JSON_COMPACT);
    json_decref(o);
    if (rc) return df_err(err, errlen, DF_EIO, "--stats-json %s: cannot write it: %s", path, strerror(errno));
    return 0;
}

/* The engine opens the --trace file and writes it without looking at write
 * errors (src/core/engine.c, src/store/ecache.c), so `--trace /dev/full`
 * or a full or read-only disk went unnoticed. Until it checks, the CLI
 * does the part it can before loading the model: open the file for writing
 * and write one byte (the engine truncates it again). Pipes, sockets and
 * terminals are only opened: a probe byte would reach their reader. */
int df_trace_probe(const char *path, char *err, size_t errlen) {
    struct stat st;
    if (stat(path, &st) == 0 && (S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode))) return 0;
    FILE *f = fopen(path, "w");
    if (!f) return df_err(err, errlen, DF_EIO, "--trace %s: cannot open it for writing: %s", path, strerror(errno));
    int bad = 0, e = 0;
    if (!isatty(fileno(f)) && (fputc('\n', f) == EOF || fflush(f) != 0)) { bad = 1; e = errno; }
    if (fclose(f) != 0 && !bad) { bad = 1; e = errno; }
    if (bad) return df_err(err, errlen, DF_EIO, "--trace %s: cannot write to it: %s", path, strerror(e));
    return 0;
}

int df_cmd_run(int argc, char **argv) {
    const double t_start = df_now();
    double t_first = 0;
    df_args a;
    df_args_init(&a, argc, argv);
    df_options o;
    df_cli_options_default(&o);
    df_sampling sp;
    df_sampling_default(&sp);
    const char *model = NULL, *prompt = NULL, *ids_s = NULL, *system = NULL, *opt, *schema_f = NULL, *grammar_f = NULL;
    const char *stats_json = NULL;
    tok_series ts = {0};
    long max_new = 256, ctx = 0, v;
    double f;
    int chat = 0, stats = 0, print_ids = 0, ignore_eos = 0;
    df_spec_opts so;
    df_spec_opts_default(&so);
    while ((opt = df_args_next(&a))) {
        if (!strcmp(opt, "--help") || !strcmp(opt, "-h")) { fputs(usage, stdout); return 0; }
        if (df_args_model_opts(&a, opt, &model, &o)) continue;
        if (df_args_spec_opts(&a, opt, &so)) continue;
        if (df_args_opt(&a, opt, "--prompt", 1)) prompt = a.val;
        else if (df_args_opt(&a, opt, "--ids", 1)) ids_s = a.val;
        else if (df_args_opt(&a, opt, "--system", 1)) system = a.val;
        else if (df_args_opt(&a, opt, "--chat", 0)) chat = 1;
        else if (df_args_opt(&a, opt, "--stats", 0)) stats = 1;
        else if (df_args_opt(&a, opt, "--stats-json", 1)) stats_json = a.val;
        else if (df_args_opt(&a, opt, "--print-ids", 0)) print_ids = 1;
        else if (df_args_opt(&a, opt, "--ignore-eos", 0)) ignore_eos = 1;
        else if (df_args_opt(&a, opt, "--json-schema", 1)) schema_f = a.val;
        else if (df_args_opt(&a, opt, "--grammar", 1)) grammar_f = a.val;
        else if (df_args_opt(&a, opt, "--max-new", 1)) { if (df_parse_int(a.val, 0, 1 << 24, &max_new)) df_args_fail(&a, "--max-new: expected a count, got '%s'", a.val); }
        else if (df_args_opt(&a, opt, "--ctx", 1)) { if (df_parse_int(a.val, 1, 1 << 24, &ctx)) df_args_fail(&a, "--ctx: expected a positive count, got '%s'", a.val); }
        else if (df_args_opt(&a, opt, "--temperature", 1)) { if (df_parse_float(a.val, &f) || f < 0) df_args_fail(&a, "--temperature: expected a number >= 0, got '%s'", a.val); else sp.temperature = (float)f; }
        else if (df_args_opt(&a, opt, "--top-p", 1)) { if (df_parse_float(a.val, &f) || f <= 0 || f > 1) df_args_fail(&a, "--top-p: expected 0 < P <= 1, got '%s'", a.val); else sp.top_p = (float)f; }
        else if (df_args_opt(&a, opt, "--min-p", 1)) { if (df_parse_float(a.val, &f) || f < 0 || f > 1) df_args_fail(&a, "--min-p: expected 0 <= P <= 1, got '%s'", a.val); else sp.min_p = (float)f; }
        else if (df_args_opt(&a, opt, "--top-k", 1)) { if (df_parse_int(a.val, 0, 1 << 30, &v)) df_args_fail(&a, "--top-k: expected a count, got '%s'", a.val); else sp.top_k = (int)v; }
        else if (df_args_opt(&a, opt, "--seed", 1)) { char *end; unsigned long long s = strtoull(a.val, &end, 10); if (*end || end == a.val) df_args_fail(&a, "--seed: expected an unsigned integer, got '%s'", a.val); else sp.seed = s; }
        else if (!a.bad) df_args_fail(&a, "unknown option '%s'", opt);
    }
    if (a.bad) return 2;
    if (df_spec_opts_check(&a, &so)) return 2;
    if (!model) model = DF_DEFAULT_MODEL;
    if (!!prompt == !!ids_s) return df_args_fail(&a, "give exactly one of --prompt and --ids");
    if (chat && !prompt) return df_args_fail(&a, "--chat needs --prompt");
    char err[1024];
    if (schema_f && grammar_f) return df_args_fail(&a, "give at most one of --json-schema and --grammar");
    df_grammar *grammar = NULL;
    if (schema_f || grammar_f) { /* compiled before the model loads: a bad file costs no load */
        char *txt = NULL;
        size_t tl = 0;
        df_buf gb = {0};
        const char *fn = schema_f ? schema_f : grammar_f;
        int rc = df_read_file(fn, &txt, &tl, err, sizeof err);
        if (!rc && schema_f) rc = df_json_schema_to_grammar(txt, tl, "", &gb, err, sizeof err);
        if (!rc) rc = df_grammar_compile(schema_f ? gb.p : txt, schema_f ? gb.len : tl, "root", &grammar, err, sizeof err);
        free(txt);
        df_buf_free(&gb);
        if (rc) {
            fprintf(stderr, "deltafin run: %s %s: %s\n", schema_f ? "--json-schema" : "--grammar", fn, err);
            return rc == DF_EIO ? 1 : 2;
        }
    }
    if (o.trace_path && df_trace_probe(o.trace_path, err, sizeof err)) { fprintf(stderr, "deltafin run: %s\n", err); df_grammar_free(grammar); return 1; }
    if (stats_json) { /* a path that cannot be written fails before the model loads */
        FILE *sf = fopen(stats_json, "w");
        if (!sf || fclose(sf)) {
            fprintf(stderr, "deltafin run: --stats-json %s: cannot open it for writing: %s\n", stats_json, strerror(errno));
            df_grammar_free(grammar);
            return 1;
        }
    }
    df_engine *e = df_engine_open(model, &o, err, sizeof err);
    if (!e) { fprintf(stderr, "deltafin run: %s\n", err); df_grammar_free(grammar); return 2; }
    df_model_info info;
    df_engine_info(e, &info);
    int code = 0, dfail;
    df_engine *draft = df_spec_open_draft(&so, e, &o, &dfail, err, sizeof err);
    if (dfail) { fprintf(stderr, "deltafin run: %s\n", err); df_engine_close(e); df_grammar_free(grammar); return 2; }
    int32_t *ids = NULL;
    size_t n = 0;
    df_session *s = NULL;
    df_gen *gen = NULL;
    int text_out = !print_ids && df_has_tokenizer(e);
    if (ids_s) {
        if (df_parse_ids(ids_s, &ids, &n, err, sizeof err)) { fprintf(stderr, "deltafin run: %s\n", err); code = 2; goto done; }
    } else {
        if (!df_has_tokenizer(e)) { fprintf(stderr, "deltafin run: %s has no tokenizer; use --ids\n", model); code = 2; goto done; }
        char *text = NULL;
        if (chat) {
            json_t *msgs = json_array();
            if (system) json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "system", "content", system));
            json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "user", "content", prompt));
            char *mj = json_dumps(msgs, JSON_COMPACT);
            json_decref(msgs);
            int rc = df_chat_render(e, mj, NULL, 1, &text);
            free(mj);
            if (rc) { fprintf(stderr, "deltafin run: %s\n", df_engine_error(e)); code = df_exit_code(rc); goto done; }
        } else {
            text = df_xstrdup(prompt);
        }
        int rc = df_tokenize(e, text, strlen(text), &ids, &n);
        free(text);
        if (rc) { fprintf(stderr, "deltafin run: %s\n", df_engine_error(e)); code = df_exit_code(rc); goto done; }
        if (!chat && info.bos_id >= 0 && df_engine_adds_bos(e)) {
            ids = df_xrealloc(ids, (n + 1) * sizeof *ids);
            memmove(ids + 1, ids, n * sizeof *ids);
            ids[0] = info.bos_id;
            n++;
        }
    }
    if (!n) { fprintf(stderr, "deltafin run: the prompt is empty\n"); code = 2; goto done; }
    if (!ctx) ctx = (long)n + max_new < info.max_context ? (long)n + max_new : info.max_context;
    s = df_session_new(e, (int)ctx);
    if (!s) { fprintf(stderr, "deltafin run: %s\n", df_engine_error(e)); code = 1; goto done; }
    int rc = df_session_sync(s, ids, n);
    if (rc) { fprintf(stderr, "deltafin run: %s\n", df_engine_error(e)); code = df_exit_code(rc); goto done; }
    df_gen_config gc = {.sampling = sp, .max_new = max_new, .max_context = (size_t)ctx, .ignore_eos = ignore_eos,
                        .text = text_out, .grammar = grammar, .spec = so.mode, .spec_max = so.k, .draft = draft};
    gen = df_gen_new(e, s, &gc);
    if (!gen) {
        fprintf(stderr, "deltafin run: %s\n", df_engine_error(e)[0] ? df_engine_error(e) : "out of memory");
        code = grammar ? 2 : 1;
        goto done;
    }
    long printed = 0;
    if (stats_json) {
        ts.cap = max_new + 1;
        ts.ids = df_xmalloc((size_t)ts.cap * sizeof *ts.ids);
        ts.t = df_xmalloc((size_t)ts.cap * sizeof *ts.t);
        ts.hits = df_xmalloc((size_t)ts.cap * sizeof *ts.hits);
        ts.reqs = df_xmalloc((size_t)ts.cap * sizeof *ts.reqs);
        ts.bytes = df_xmalloc((size_t)ts.cap * sizeof *ts.bytes);
    }
    const double t_loop = df_now();
    for (;;) {
        df_gen_token t;
        rc = df_gen_step(gen, &t);
        if (t.has_token && printed++ == 0) t_first = df_now();
        if (t.has_token && stats_json) series_push(&ts, e, t.id, df_now() - t_loop);
        if (text_out) fwrite(t.text, 1, t.text_len, stdout);
        else if (t.has_token) printf("%s%d", printed > 1 ? " " : "", t.id);
        fflush(stdout);
        if (rc <= 0) break;
    }
    printf("\n");
    if (rc < 0) { fprintf(stderr, "deltafin run: %s\n", df_gen_error(gen)); code = df_exit_code(rc); }
    if (stats) {
        print_stats(e);
        {
            df_stats st;
            df_stats_get(e, &st);
            print_spec_stats(gen, &st);
        }
        if (t_first > 0) fprintf(stderr, "[stats] time to first token %.3f s (from the start of the command, model load included)\n", t_first - t_start);
    }
    if (stats_json && write_stats_json(stats_json, e, &ts, t_first > 0 ? t_first - t_start : 0, df_now() - t_start, err, sizeof err)) {
        fprintf(stderr, "deltafin run: %s\n", err);
        if (!code) code = 1;
    }
done:
    df_gen_free(gen);
    df_session_free(s);
    df_engine_close(e);
    df_grammar_free(grammar);
    df_engine_close(draft);
    free(ids);
    free(ts.ids), free(ts.t), free(ts.hits), free(ts.reqs), free(ts.bytes);
    return code;
}
