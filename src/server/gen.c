/* gen.c - one request's generation (see oai_int.h): the prompt (rendered
 * and tokenized before the turn), the session sync, one token per step with
 * the shared generation step (df_gen, src/core/generate.c), the
 * log-probabilities in OpenAI's JSON, the per-generation log line, and the
 * memo glue.
 *
 * Invariants:
 *   - only a gen holding the turn touches the session or df_gen;
 *   - g->text is final text only: the generation step holds back what could
 *     be the start of a stop string, so anything in g->text may be sent;
 *   - nothing here exits or aborts; allocation failures become 5xx answers.
 */
#include "server/oai_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "grammar/grammar.h"
#include "server/pcache.h"
#include "util/util.h"

void sb_put(sbuf *b, const void *d, size_t n) {
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) { b->oom = 1; return; }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, d, n);
    b->len += n;
    b->p[b->len] = 0;
}

json_t *jstr(const char *p, size_t n) {
    json_t *s = json_stringn(p, n);
    if (s) return s;
    sbuf b = {0};
    size_t i = 0;
    while (i < n) {
        unsigned char c = (unsigned char)p[i];
        size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        json_t *t = len && i + len <= n ? json_stringn(p + i, len) : NULL;
        if (t) { sb_put(&b, p + i, len); json_decref(t); i += len; }
        else if (c == 0) { sb_put(&b, "\xef\xbf\xbd", 3); i++; }
        else { sb_put(&b, "\xef\xbf\xbd", 3); i++; }
    }
    s = b.oom ? NULL : json_stringn(b.p ? b.p : "", b.len);
    free(b.p);
    return s;
}

static void gen_fail(gen *g, int status, const char *msg) {
    if (g->failed) return;
    g->failed = 1;
    g->errstatus = status;
    snprintf(g->errmsg, sizeof g->errmsg, "%s", msg);
}

void gen_release(gen *g) {
    if (g->holds_turn) {
        df_stats st; /* the engine's counters for /metrics, read while no generation runs */
        df_stats_get(g->srv->e, &st);
        df_metrics_engine(g->srv->metrics, &st);
        df_pcache_submit(g->srv->pc, g->pc_job); /* with the turn: it may drop a snapshot */
        g->pc_job = NULL;
        g->holds_turn = 0;
        df_turn_release(&g->srv->turn);
    }
}

void gen_stopped(gen *g) {
    gen_release(g);
    if (!g->srv->quiet)
        fprintf(stderr, "deltafin serve: %s: client disconnected, generation stopped after %ld of at most %ld tokens\n",
                g->id, g->n_gen, g->max_new);
}

void gen_free(gen *g) {
    if (!g) return;
    gen_release(g);
    if (g->memo_hit) df_metrics_memo_hit(g->srv->metrics);
    else if (g->dg) {
        df_spec_stats ss;
        df_gen_spec_stats(g->dg, &ss);
        df_metrics_generation(g->srv->metrics, (long)g->n_prompt, (long)g->cached, g->n_gen, ss.drafted, ss.accepted);
    }
    df_gen_free(g->dg);
    df_oai_request_free(&g->rq);
    free(g->prompt);
    free(g->text.p);
    free(g->out.p);
    free(g->off);
    free(g->memo_key);
    free(g->ids);
    json_decref(g->lp);
    df_tc_free(g->tc);
    json_decref(g->ext);
    free(g);
}

void gen_sse_event(gen *g, const char *type, json_t *o) {
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!s) { g->out.oom = 1; return; }
    sb_put(&g->out, "event: ", 7);
    sb_put(&g->out, type, strlen(type));
    sb_put(&g->out, "\ndata: ", 7);
    sb_put(&g->out, s, strlen(s));
    sb_put(&g->out, "\n\n", 2);
    free(s);
}

df_tc *gen_tc(gen *g) {
    df_oai_server *s = g->srv;
    if (!g->tc) {
        const df_oai_request *rq = &g->rq;
        df_tc_config c = {.fam = s->tc_fam, .think = s->has_think, .in_think = g->think_open,
                          .tools = rq->tools_json && rq->tool_choice != DF_OAI_TOOLS_NONE, .tools_json = rq->tools_json,
                          .id_seed = s->salt ^ ((uint64_t)atomic_fetch_add(&s->idctr, 1) << 20) ^ (uint64_t)g->created};
        g->tc = df_tc_new(&c);
        if (!g->tc) return NULL;
    }
    if (g->text.len > g->tc_fed) {
        df_tc_feed(g->tc, g->text.p + g->tc_fed, g->text.len - g->tc_fed);
        g->tc_fed = g->text.len;
    }
    if (g->finish && g->tc_fed != (size_t)-1) {
        df_tc_finish(g->tc);
        g->tc_fed = (size_t)-1; /* finished: nothing more is fed */
    }
    return g->tc;
}

const char *gen_finish(gen *g) {
    if (g->rq.kind != DF_OAI_CHAT || !g->finish) return g->finish;
    df_tc *tc = gen_tc(g);
    return tc && df_tc_n_calls(tc) && strcmp(g->finish, "length") ? "tool_calls" : g->finish;
}

/* An assistant message's "content": null reaches the template as None
 * (issue 14; DeepSeek-V3 tests `content is none`). Some templates fail on
 * None where they handle "" (Qwen3: `'</think>' in message.content`), so a
 * render that failed is tried once more with "" for those contents, the
 * value every template handles; "" and None both mean "no text". Returns
 * the messages with that change (malloc'd), or NULL if there is no null
 * content. */
static char *null_content_as_empty(const char *messages_json) {
    if (!strstr(messages_json, "\"content\":null")) return NULL;
    json_t *m = json_loads(messages_json, 0, NULL), *x;
    size_t i;
    int changed = 0;
    json_array_foreach(m, i, x) {
        json_t *c = json_object_get(x, "content");
        if (c && json_is_null(c)) { json_object_set_new(x, "content", json_string("")); changed = 1; }
    }
    char *out = changed ? json_dumps(m, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(m);
    return out;
}

/* tool_choice required / a named function: the grammar of one call (several
 * when parallel_tool_calls) in the model's own call syntax, the arguments
 * constrained by each tool's parameters schema, compiled into rq->grammar.
 * The answer starts with the call: a prompt that opens a think block (the
 * output would start inside it) is refused, since the grammar cannot let the
 * model think first without also accepting text that closes the block in
 * the middle. */
static int tool_grammar(gen *g, df_oai_error *e) {
    df_oai_server *s = g->srv;
    df_oai_request *rq = &g->rq;
    if (rq->kind != DF_OAI_CHAT || !rq->tools_json || rq->grammar ||
        (rq->tool_choice != DF_OAI_TOOLS_REQUIRED && rq->tool_choice != DF_OAI_TOOLS_NAMED))
        return 0;
    if (g->think_open)
        return df_oai_fail(e, 400, "tool_choice", "unsupported_parameter",
                           "Unsupported value for 'tool_choice': this prompt opens a think block, so the answer cannot start with the required call; use 'auto', or turn thinking off (e.g. chat_template_kwargs {\"enable_thinking\": false}) where the template allows.");
    df_buf gb = {0};
    char err[400];
    const char *named = rq->tool_choice == DF_OAI_TOOLS_NAMED ? rq->tool_choice_name : NULL;
    int rc = df_toolcall_grammar(s->tc_fam, rq->tools_json, named, rq->parallel_tool_calls, "tc-", &gb, err, sizeof err);
    json_t *t = rc ? NULL : json_loads(rq->tools_json, 0, NULL), *x;
    size_t i;
    json_array_foreach(t, i, x) {
        const char *nm = json_string_value(json_object_get(json_object_get(x, "function"), "name"));
        if (rc || (named && strcmp(nm, named))) continue;
        char *schema = df_oai_tool_schema(rq->tools_json, i), pre[48];
        snprintf(pre, sizeof pre, "tc-t%zu-", i);
        rc = schema ? df_json_schema_to_grammar(schema, strlen(schema), pre, &gb, err, sizeof err) : DF_ENOMEM;
        free(schema);
    }
    json_decref(t);
    if (!rc) rc = df_grammar_compile_cached(gb.p, gb.len, "root", &rq->grammar, err, sizeof err);
    df_buf_free(&gb);
    if (rc == DF_ENOMEM) return df_oai_fail(e, 503, NULL, NULL, "Out of memory.");
    if (rc) return df_oai_fail(e, 400, "tool_choice", "unsupported_parameter", "Unsupported value for 'tool_choice': %s", err);
    return 0;
}

/* The extra template variables of a chat request (chat_template_kwargs,
 * reasoning_effort), each checked against what the template reads: a
 * variable the template never uses would be silently ignored, so it is
 * refused. *vars: malloc'd JSON object text or NULL. Returns 0 or fills e. */
static int template_vars(gen *g, char **vars, df_oai_error *e) {
    df_oai_server *s = g->srv;
    df_oai_request *rq = &g->rq;
    *vars = NULL;
    const char *src = rq->tools_json ? s->tpl_src_tools : s->tpl_src; /* the template this request renders with */
    if (rq->tools_json && !s->is_k3 && !df_tc_template_reads(src, "tools"))
        return df_oai_fail(e, 400, "tools", "unsupported_parameter",
                           "Unsupported value for 'tools': this model's chat template does not support tools (it never reads 'tools').");
    if (rq->tools_json && rq->tool_choice != DF_OAI_TOOLS_NONE && s->tc_fam == DF_TC_NONE)
        return df_oai_fail(e, 400, "tools", "unsupported_parameter",
                           "Unsupported value for 'tools': Deltafin cannot parse this model's tool call format (docs/SERVER.md lists the families it parses); use tool_choice 'none' to render the tools without parsing calls.");
    json_t *v = rq->template_kwargs_json ? json_loads(rq->template_kwargs_json, 0, NULL) : json_object();
    if (!v) return df_oai_fail(e, 503, NULL, NULL, "Out of memory.");
    const char *k;
    json_t *x;
    int rc = 0;
    json_object_foreach(v, k, x) {
        char p[96];
        df_oai_pathf(p, sizeof p, "chat_template_kwargs.%.60s", k);
        if (!strcmp(k, "messages") || !strcmp(k, "tools") || !strcmp(k, "add_generation_prompt") || !strcmp(k, "documents")) {
            rc = df_oai_fail(e, 400, p, "invalid_value", "Invalid value for '%s': '%.60s' is set by the request itself.", p, k);
            break;
        }
        int reads = s->is_k3 ? !strcmp(k, "thinking") || !strcmp(k, "thinking_effort") : df_tc_template_reads(src, k);
        if (!reads) {
            rc = df_oai_fail(e, 400, p, "unsupported_parameter",
                             "Unsupported value for '%s': this model's chat template does not read '%.60s', so it would have no effect.", p, k);
            break;
        }
    }
    if (!rc && rq->reasoning_effort) {
        const char *r = rq->reasoning_effort;
        if (s->is_k3) {
            if (strcmp(r, "low") && strcmp(r, "high"))
                rc = df_oai_fail(e, 400, "reasoning_effort", "unsupported_parameter",
                                 "Unsupported value for 'reasoning_effort': Kimi K3's thinking effort is 'low', 'high' or 'max' (the default); '%s' has no equivalent.", r);
            else json_object_set_new(v, "thinking_effort", json_string(r));
        } else if (!df_tc_template_reads(src, "reasoning_effort")) {
            rc = df_oai_fail(e, 400, "reasoning_effort", "unsupported_parameter",
                             "Unsupported value for 'reasoning_effort': this model's chat template does not read 'reasoning_effort', so it would have no effect.");
        } else {
            json_object_set_new(v, "reasoning_effort", json_string(r));
        }
    }
    if (!rc && rq->thinking) { /* Anthropic's thinking: the template's switch */
        int on = rq->thinking == 1;
        if (s->is_k3) json_object_set_new(v, "thinking", json_boolean(on));
        else if (df_tc_template_reads(src, "enable_thinking")) json_object_set_new(v, "enable_thinking", json_boolean(on));
        else if (on && !s->has_think)
            rc = df_oai_fail(e, 400, "thinking", "unsupported_parameter",
                             "this model's chat template has no thinking switch (enable_thinking) and writes no think blocks, so thinking cannot be enabled");
    }
    if (!rc && json_object_size(v)) {
        *vars = json_dumps(v, JSON_COMPACT | JSON_PRESERVE_ORDER);
        if (!*vars) rc = df_oai_fail(e, 503, NULL, NULL, "Out of memory.");
    }
    json_decref(v);
    return rc;
}

static json_t *lp_item(df_oai_server *s, int32_t id, double lp) {
    size_t n;
    char *t = df_token_text(s->e, id, &n);
    json_t *bytes = json_array();
    for (size_t i = 0; t && i < n; i++) json_array_append_new(bytes, json_integer((unsigned char)t[i]));
    json_t *o = json_object();
    json_object_set_new(o, "token", t ? jstr(t, n) : json_string(""));
    json_object_set_new(o, "logprob", json_real(lp));
    json_object_set_new(o, "bytes", bytes);
    free(t);
    return o;
}

/* Records a token's log-probability under the model's own distribution
 * (raw logits, before temperature) and the top alternatives, as the
 * generation step computed them, with the token's offset in the text. */
static void add_logprob(gen *g, const df_gen_token *t) {
    df_oai_server *s = g->srv;
    json_t *o = lp_item(s, t->id, t->logprob.logprob);
    json_t *top = json_array();
    for (int j = 0; j < t->n_top; j++) json_array_append_new(top, lp_item(s, t->top[j].id, t->top[j].logprob));
    json_object_set_new(o, "top_logprobs", top);
    json_array_append_new(g->lp, o);
    if (g->n_off == g->cap_off) {
        size_t cap = g->cap_off ? 2 * g->cap_off : 64;
        long *p = realloc(g->off, cap * sizeof *p);
        if (!p) return;
        g->off = p;
        g->cap_off = cap;
    }
    g->off[g->n_off++] = (long)t->text_offset;
}

/* Refuses, before tokenizing, a text prompt so long that it cannot fit the
 * context: no token stands for more than max_tok_bytes bytes of decoded
 * text, and the factor 4 covers normalizers that shrink text (NFKC and
 * the like). Returns 0 or fills e. */
static int check_bytes(const df_oai_server *s, const df_oai_request *rq, size_t bytes, df_oai_error *e) {
    double most = (double)s->ctx * 4.0 * (double)s->max_tok_bytes;
    if (!s->max_tok_bytes || (double)bytes <= most) return 0;
    return df_oai_fail(e, 400, rq->kind == DF_OAI_CHAT ? "messages" : "prompt", "context_length_exceeded",
                       "This model's maximum context length is %d tokens. However, your %s is %zu bytes long, more than "
                       "%d tokens can hold (%.0f bytes at most: no token is longer than %d bytes). Please reduce the length "
                       "of the messages.", s->ctx, rq->kind == DF_OAI_CHAT ? "rendered chat" : "prompt", bytes, s->ctx,
                       most, 4 * s->max_tok_bytes);
}

/* Renders and tokenizes the prompt and checks it against the context: the
 * expensive work that needs no session, done before waiting for the turn
 * (for bodies of BIG_BODY bytes or more under pmu, one at a time, so big
 * prompts cannot pile up in memory). Returns 0, or fills e (4xx: the
 * request; 5xx: the engine). */
int gen_tokenize(gen *g, df_oai_error *e) {
    df_oai_server *s = g->srv;
    df_oai_request *rq = &g->rq;
    int rc;
    if (rq->prompt_ids) {
        g->prompt = malloc(rq->n_prompt_ids * sizeof *g->prompt);
        if (!g->prompt) return df_oai_fail(e, 503, NULL, NULL, "Out of memory.");
        memcpy(g->prompt, rq->prompt_ids, rq->n_prompt_ids * sizeof *g->prompt);
        g->n_prompt = rq->n_prompt_ids;
    } else {
        const char *param = rq->kind == DF_OAI_CHAT ? "messages" : "prompt";
        if (!s->has_tok)
            return df_oai_fail(e, 400, param, "unsupported_parameter", "This model has no tokenizer: send token ids as 'prompt' to /v1/completions.");
        char *text = NULL;
        if (rq->kind == DF_OAI_CHAT) {
            char *vars = NULL;
            if (template_vars(g, &vars, e)) return -1;
            rc = df_chat_render_vars(s->e, rq->messages_json, rq->tools_json, 1, vars, &text);
            char *alt = rc == DF_EINPUT ? null_content_as_empty(rq->messages_json) : NULL;
            if (alt) { /* see null_content_as_empty */
                free(text);
                text = NULL;
                rc = df_chat_render_vars(s->e, alt, rq->tools_json, 1, vars, &text);
                free(alt);
            }
            free(vars);
            if (!rc && text) g->think_open = s->has_think && df_tc_prompt_opens_think(s->tc_fam, text, strlen(text));
            if (!rc && tool_grammar(g, e)) { free(text); return -1; }
            if (rc) {
                int st = rc == DF_ENOMEM || rc == DF_EIO || rc == DF_EINTERNAL ? 500 : 400;
                free(text);
                return df_oai_fail(e, st, "messages", st == 400 ? "invalid_value" : NULL, "The chat template failed on these messages: %s", df_engine_error(s->e));
            }
        }
        const char *src = text ? text : rq->prompt;
        size_t srclen = text ? strlen(text) : rq->prompt_len;
        if (check_bytes(s, rq, srclen, e)) { free(text); return -1; }
        int32_t *ids = NULL;
        size_t n = 0;
        rc = df_tokenize(s->e, src, srclen, &ids, &n);
        free(text);
        if (rc) {
            free(ids);
            return df_oai_fail(e, rc == DF_EINPUT ? 400 : 500, param, rc == DF_EINPUT ? "invalid_value" : NULL, "Tokenization failed: %s", df_engine_error(s->e));
        }
        int bos = rq->kind == DF_OAI_COMPLETIONS && s->info.bos_id >= 0 && df_engine_adds_bos(s->e);
        g->prompt = malloc((n + 1) * sizeof *g->prompt);
        if (!g->prompt) { free(ids); return df_oai_fail(e, 503, NULL, NULL, "Out of memory."); }
        if (bos) g->prompt[0] = s->info.bos_id;
        if (n) memcpy(g->prompt + bos, ids, n * sizeof *ids);
        g->n_prompt = n + (size_t)bos;
        free(ids);
    }
    const char *param = rq->kind == DF_OAI_CHAT ? "messages" : "prompt";
    if (!g->n_prompt) return df_oai_fail(e, 400, param, "invalid_value", "The prompt is empty.");
    if (g->count_only) return 0;
    size_t ctx = (size_t)s->ctx;
    if (rq->max_tokens > 0) {
        if (g->n_prompt + (size_t)rq->max_tokens > ctx)
            return df_oai_fail(e, 400, param, "context_length_exceeded",
                        "This model's maximum context length is %zu tokens. However, you requested %zu tokens (%zu in the prompt, %ld for the completion). Please reduce the prompt or the completion length.",
                        ctx, g->n_prompt + (size_t)rq->max_tokens, g->n_prompt, rq->max_tokens);
        g->max_new = rq->max_tokens;
    } else {
        if (g->n_prompt >= ctx)
            return df_oai_fail(e, 400, param, "context_length_exceeded",
                        "This model's maximum context length is %zu tokens. However, your prompt has %zu tokens. Please reduce the length of the messages.",
                        ctx, g->n_prompt);
        g->max_new = (long)(ctx - g->n_prompt);
        if (g->max_new > s->cap) g->max_new = s->cap;
    }
    return 0;
}

int gen_prepare(gen *g, df_oai_error *e) {
    df_oai_server *s = g->srv;
    df_oai_request *rq = &g->rq;
    const char *param = rq->kind == DF_OAI_CHAT ? "messages" : "prompt";
    int rc;
    /* Prefix reuse: df_session_sync keeps what it can of the common prefix
     * (truncation, or a snapshot for recurrent layers) and says how much. */
    if (s->pc) df_pcache_load(s->pc, g->prompt, g->n_prompt); /* a longer prefix on disk than in memory */
    rc = df_session_sync(s->s, g->prompt, g->n_prompt);
    if (rc) return df_oai_fail(e, rc == DF_EINPUT ? 400 : 500, rc == DF_EINPUT ? param : NULL, NULL, "%s", df_engine_error(s->e));
    g->cached = df_session_reused(s->s);
    if (s->pc) g->pc_job = df_pcache_plan(s->pc, g->prompt, g->n_prompt, g->cached);
    if (g->cached >= g->n_prompt) g->cached = g->n_prompt - 1; /* as reported before: the last prompt position counts as computed */
    df_gen_config gc = {.max_new = g->max_new, .max_context = (size_t)s->ctx, .text = s->has_tok,
                        .stop = (const char *const *)rq->stop, .n_stop = rq->n_stop, .logprobs = rq->logprobs,
                        .top_logprobs = rq->top_logprobs, .grammar = rq->grammar, .spec = s->spec, .spec_max = s->spec_max, .draft = s->draft};
    df_sampling_default(&gc.sampling);
    if (rq->has_temperature && rq->temperature > 0 && rq->top_p > 0) {
        gc.sampling.temperature = (float)rq->temperature;
        gc.sampling.top_p = (float)rq->top_p;
        gc.sampling.top_k = rq->top_k;
    }
    uint64_t seed = (uint64_t)rq->seed;
    if (!rq->has_seed && getrandom(&seed, sizeof seed, 0) != (ssize_t)sizeof seed) seed = (uint64_t)time(NULL) ^ (uint64_t)(uintptr_t)g;
    gc.sampling.seed = seed;
    g->dg = df_gen_new(s->e, s->s, &gc);
    if (!g->dg && rq->grammar) return df_oai_fail(e, 400, "response_format", NULL, "%s", df_engine_error(s->e));
    if (!g->dg) return df_oai_fail(e, 503, NULL, NULL, "Out of memory.");
    g->t0 = df_now();
    return 0;
}

/* One log line per finished generation: how long decoding took and how much
 * of it was not the engine's work (sampling and forward passes), i.e.
 * detokenizing, stop strings, JSON, sending, hand-offs: the server's
 * overhead per token. */
void gen_log(gen *g) {
    if (g->logged || g->memo_hit || g->srv->quiet || !g->t0 || (!g->finish && !g->failed)) return;
    g->logged = 1;
    double wall = df_now() - g->t0, other = wall - g->t_fwd;
    fprintf(stderr, "deltafin serve: %s: %zu prompt tokens (%zu reused), %ld generated (%s) in %.1f ms: engine %.1f ms, "
                    "server %.3f ms/token (%.2f%%)\n",
            g->id, g->n_prompt, g->cached, g->n_gen, g->failed ? "failed" : g->finish, wall * 1e3, g->t_fwd * 1e3,
            g->n_gen ? other * 1e3 / (double)g->n_gen : 0.0, wall > 0 ? 100 * other / wall : 0.0);
    df_spec_stats ss;
    if (g->dg && (df_gen_spec_stats(g->dg, &ss), ss.mode != DF_SPEC_NONE))
        fprintf(stderr, "deltafin serve: %s: spec %s%s%s%s: %ld passes, %ld drafted, %ld accepted, %.2f tokens per pass; "
                        "drafting %.1f ms, verifying %.1f ms, plain steps %.1f ms%s\n",
                g->id, df_spec_name(ss.mode), ss.text_level ? " (across tokenizers, text level)" : "", ss.off_reason[0] ? ": " : "",
                ss.off_reason, ss.passes, ss.drafted, ss.accepted, ss.passes ? (double)ss.pass_tokens / ss.passes : 0.0,
                ss.t_draft * 1e3, ss.t_verify * 1e3, ss.t_plain * 1e3,
                ss.mode == DF_SPEC_AUTO && !ss.off_reason[0] && !ss.k_now ? "; drafting off now (it would lose)" : "");
}

/* Which stop string ended the generation: the one that starts where the
 * final text was cut, in the text of every generated id detokenized again
 * (the text the generation step cut). -1 if none (an end-of-sequence id). */
static int find_stop_hit(gen *g) {
    df_oai_request *rq = &g->rq;
    if (!g->finish || strcmp(g->finish, "stop") || !rq->n_stop || !g->n_ids) return -1;
    df_detok *d = df_detok_new(g->srv->e);
    if (!d) return -1;
    sbuf all = {0};
    size_t n;
    const char *p;
    for (size_t i = 0; i < g->n_ids; i++) {
        p = df_detok_push(d, g->ids[i], &n);
        sb_put(&all, p, n);
    }
    p = df_detok_flush(d, &n);
    sb_put(&all, p, n);
    df_detok_free(d);
    int hit = -1;
    for (int i = 0; !all.oom && hit < 0 && i < rq->n_stop; i++) {
        size_t sl = strlen(rq->stop[i]);
        if (all.len >= g->text.len + sl && !memcmp(all.p + g->text.len, rq->stop[i], sl)) hit = i;
    }
    free(all.p);
    return hit;
}

void gen_step(gen *g) {
    df_oai_server *s = g->srv;
    if (df_turn_stopping(&s->turn)) { gen_fail(g, 503, "The server is shutting down."); return; }
    df_gen_token t;
    int rc = df_gen_step(g->dg, &t);
    g->t_fwd = df_gen_engine_seconds(g->dg);
    if (t.has_token) {
        double now = df_now();
        if (!g->n_gen) df_metrics_ttft(s->metrics, now - g->t_arrive);
        else df_metrics_token_gap(s->metrics, now - g->t_tok);
        g->t_tok = now;
        g->last = t.id;
        g->n_gen++;
        if (g->rq.logprobs) add_logprob(g, &t);
        if (g->want_stop_hit) {
            if (g->n_ids == g->cap_ids) {
                size_t cap = g->cap_ids ? 2 * g->cap_ids : 64;
                int32_t *p = realloc(g->ids, cap * sizeof *p);
                if (!p) { gen_fail(g, 503, "Out of memory."); return; }
                g->ids = p;
                g->cap_ids = cap;
            }
            g->ids[g->n_ids++] = t.id;
        }
    }
    sb_put(&g->text, t.text, t.text_len);
    if (rc < 0) {
        const char *msg = df_gen_error(g->dg);
        if (rc == DF_ENOMEM) gen_fail(g, 503, !strcmp(msg, "out of memory") ? "Out of memory." : msg);
        else gen_fail(g, 500, msg);
        return;
    }
    if (g->text.oom) { gen_fail(g, 503, "Out of memory."); return; }
    if (rc == 0) {
        g->finish = df_gen_finish_reason(g->dg);
        if (g->want_stop_hit) g->stop_hit = find_stop_hit(g);
        return;
    }
    /* parallel_tool_calls false: the answer is the first call, generation ends with it */
    if (g->rq.kind == DF_OAI_CHAT && !g->rq.parallel_tool_calls && g->rq.tools_json) {
        df_tc *tc = gen_tc(g);
        if (tc && df_tc_n_calls(tc)) g->finish = "stop";
    }
}

/* ---- the memo ------------------------------------------------------------ */

static char *lp_dump(const gen *g) {
    if (!g->rq.logprobs) return NULL;
    json_t *o = json_object(), *off = json_array();
    for (size_t i = 0; i < g->n_off; i++) json_array_append_new(off, json_integer(g->off[i]));
    json_object_set(o, "lp", g->lp);
    json_object_set_new(o, "off", off);
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s;
}

void gen_memo_store(gen *g) {
    df_oai_server *s = g->srv;
    if (!s->memo || !g->memo_key || g->memo_hit || g->failed || !g->finish) return;
    df_memo_answer a = {.tlen = g->text.len, .finish = g->finish, .n_prompt = (long)g->n_prompt, .n_gen = g->n_gen,
                        .stop_hit = g->stop_hit, .think_open = g->think_open};
    a.text = malloc(a.tlen + 1);
    a.logprobs = lp_dump(g);
    if (!a.text || (g->rq.logprobs && !a.logprobs)) { df_memo_answer_free(&a); return; }
    memcpy(a.text, g->text.p ? g->text.p : "", a.tlen);
    a.text[a.tlen] = 0;
    char *key = g->memo_key;
    g->memo_key = NULL;
    df_memo_put(s->memo, key, g->memo_klen, &a);
}

int gen_memo_lookup(gen *g) {
    df_oai_server *s = g->srv;
    df_memo_answer a;
    if (!s->memo || !g->memo_key || !df_memo_get(s->memo, g->memo_key, g->memo_klen, &a)) return g->memo_hit = 0;
    sb_put(&g->text, a.text, a.tlen);
    if (!g->text.p) sb_put(&g->text, "", 0);
    g->finish = a.finish;
    g->n_prompt = (size_t)a.n_prompt;
    g->cached = g->n_prompt;
    g->n_gen = a.n_gen;
    g->stop_hit = a.stop_hit;
    g->think_open = a.think_open;
    if (a.logprobs) {
        json_t *o = json_loads(a.logprobs, 0, NULL), *off = json_object_get(o, "off");
        json_decref(g->lp);
        g->lp = json_incref(json_object_get(o, "lp"));
        g->n_off = g->cap_off = json_array_size(off);
        g->off = calloc(g->n_off + 1, sizeof *g->off);
        for (size_t i = 0; g->off && i < g->n_off; i++) g->off[i] = (long)json_integer_value(json_array_get(off, i));
        if (!g->off) g->n_off = g->cap_off = 0;
        json_decref(o);
    }
    df_memo_answer_free(&a);
    int hit = !g->text.oom && g->lp;
    if (!hit) { /* could not be copied: generate instead */
        g->text.len = 0;
        g->text.oom = 0;
        g->finish = NULL;
        g->n_prompt = g->cached = 0;
        g->n_gen = 0;
        g->stop_hit = -1;
        g->n_off = 0;
        if (!g->lp) g->lp = json_array();
        else json_array_clear(g->lp);
    }
    g->memo_hit = hit;
    return hit;
}

/* ---- the server's facts ---------------------------------------------------- */

int gen_longest_token(df_oai_server *s) {
    if (!s->has_tok) return 0;
    size_t most = 0;
    for (int id = 0; id < s->info.vocab_size; id++) {
        size_t n;
        char *t = df_token_text(s->e, id, &n);
        if (!t) return 0;
        if (n > most) most = n;
        free(t);
    }
    return most > (size_t)1 << 20 ? 0 : (int)most;
}
