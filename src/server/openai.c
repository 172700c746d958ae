/* openai.c - see openai.h. Three parts, in order: the admission queue and
 * the memo, generation (one token per step, stop strings,
 * log-probabilities), and the routes with their JSON and SSE bodies.
 *
 * Validation lives in request.c (pure, fuzzed on its own).
 *
 * Invariants:
 *   - only the holder of the turn (turn_acquire .. turn_release) calls the
 *     engine (engine_call, on its own connection thread) or touches the
 *     session and its mirror;
 *   - text given to a client never contains a stop string or anything after
 *     it: text that could be the start of a stop string is held back until
 *     the next token decides;
 *   - every JSON string built here goes through jstr(), which replaces bytes
 *     that are not UTF-8 (jansson refuses them), so no response is ever lost
 *     to a malformed token;
 *   - nothing here exits or aborts; allocation failures become 5xx answers.
 */
#include "server/openai.h"

#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "util/util.h"


/* =========================================================================
 * The server: admission queue, session mirror, memo
 *
 * One generation at a time. A request that finds the engine busy waits in a
 * FIFO of at most `queue` entries, polling its connection every 50 ms so
 * that a client who gives up leaves the queue; a request beyond that gets
 * 429 with Retry-After. The memo maps the exact bytes of a deterministic
 * request to its result, least recently used first out, bounded in entries
 * and bytes; a hit is answered without waiting for the engine.
 * ========================================================================= */

typedef struct waiter { struct waiter *next; } waiter;

typedef struct memo {
    struct memo *prev, *next;
    uint64_t hash;
    char *key;
    size_t klen;
    char *text;
    size_t tlen;
    const char *finish;
    long n_prompt, n_gen;
    char *logprobs; /* {"lp": [...], "off": [...]} or NULL */
    size_t bytes;
} memo;

struct df_oai_server {
    df_engine *e;
    df_model_info info;
    df_session *s;
    int ctx;
    long cap;
    char *model_id;
    int has_tok, quiet;
    long long created;
    atomic_int stopping;

    pthread_mutex_t qmu;
    pthread_cond_t qcv;
    int running, n_waiting, qmax;
    waiter *qhead, *qtail;

    pthread_mutex_t pmu; /* one big prompt rendered/tokenized at a time */
    int max_tok_bytes;   /* the longest token's text in bytes; 0: unknown */

    int32_t *mirror; /* the tokens the session holds (valid with the turn) */
    size_t n_mirror;

    pthread_mutex_t mmu;
    int memo_on, memo_max, memo_n;
    size_t memo_max_bytes, memo_bytes;
    memo *mhead, *mtail; /* most recently used first */

    atomic_uint_least64_t idctr;
    uint64_t salt;
};

enum { TURN_OK, TURN_FULL, TURN_GONE, TURN_STOP };

/* Request bodies at least this large are prepared one at a time. */
#define BIG_BODY ((size_t)1 << 20)

/* Waits for the engine in arrival order. TURN_FULL: the queue is full;
 * TURN_GONE: the client disconnected while waiting; TURN_STOP: shutdown. */
static int turn_acquire(df_oai_server *s, df_http_req *r) {
    pthread_mutex_lock(&s->qmu);
    if (atomic_load(&s->stopping)) { pthread_mutex_unlock(&s->qmu); return TURN_STOP; }
    if (!s->running && !s->qhead) {
        s->running = 1;
        pthread_mutex_unlock(&s->qmu);
        return TURN_OK;
    }
    if (s->n_waiting >= s->qmax) { pthread_mutex_unlock(&s->qmu); return TURN_FULL; }
    waiter w = {0};
    if (s->qtail) s->qtail->next = &w; else s->qhead = &w;
    s->qtail = &w;
    s->n_waiting++;
    int res = TURN_OK;
    for (;;) {
        if (s->qhead == &w && !s->running) break;
        if (atomic_load(&s->stopping)) { res = TURN_STOP; break; }
        if (r && df_http_peer_closed(r)) { res = TURN_GONE; break; }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 50 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
        pthread_cond_timedwait(&s->qcv, &s->qmu, &ts);
    }
    waiter **pp = &s->qhead, *prev = NULL;
    while (*pp != &w) { prev = *pp; pp = &(*pp)->next; }
    *pp = w.next;
    if (s->qtail == &w) s->qtail = prev;
    s->n_waiting--;
    if (res == TURN_OK) s->running = 1;
    pthread_cond_broadcast(&s->qcv);
    pthread_mutex_unlock(&s->qmu);
    return res;
}

static void turn_release(df_oai_server *s) {
    pthread_mutex_lock(&s->qmu);
    s->running = 0;
    pthread_cond_broadcast(&s->qcv);
    pthread_mutex_unlock(&s->qmu);
}

static uint64_t fnv1a(const char *p, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) { h ^= (unsigned char)p[i]; h *= 1099511628211ull; }
    return h;
}

static void memo_unlink(df_oai_server *s, memo *m) {
    if (m->prev) m->prev->next = m->next; else s->mhead = m->next;
    if (m->next) m->next->prev = m->prev; else s->mtail = m->prev;
    m->prev = m->next = NULL;
}
static void memo_push_front(df_oai_server *s, memo *m) {
    m->next = s->mhead;
    m->prev = NULL;
    if (s->mhead) s->mhead->prev = m; else s->mtail = m;
    s->mhead = m;
}
static void memo_free(memo *m) {
    free(m->key);
    free(m->text);
    free(m->logprobs);
    free(m);
}

/* ---- running the model ----------------------------------------------------
 *
 * The turn holder (one generation at a time) calls the engine directly on its
 * connection thread. The backend's per-thread scratch is freed when a thread
 * exits, so connection threads coming and going leak nothing, and there is no
 * per-token hand-off to another thread. */
static int engine_call(df_oai_server *s, int push, const int32_t *ids, size_t n) {
    return push ? df_session_push(s->s, ids[0]) : df_session_sync(s->s, ids, n);
}

/* =========================================================================
 * Generation
 *
 * A gen is one request's generation: its prompt tokens, sampler, detokenized
 * text, log-probabilities, and (when streaming) the SSE bytes not yet sent.
 * gen_step produces one token: sample, account, detokenize, check stops,
 * then push the token (the expensive forward pass) only if another will
 * follow. Callers check the client connection before each step, so a
 * disconnect stops the work within one token.
 * ========================================================================= */

typedef struct {
    char *p;
    size_t len, cap;
    int oom;
} sbuf;

static void sb_put(sbuf *b, const void *d, size_t n) {
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

typedef struct {
    df_oai_server *srv;
    df_http_req *req;
    df_oai_request rq;
    char id[48];
    long long created;
    int32_t *prompt;
    size_t n_prompt, cached;
    long max_new;
    df_sampling sp;
    df_detok *dt;
    sbuf text;        /* generated text, cut at a stop string */
    size_t emitted;   /* text[0..emitted) is final (no stop can start in it) */
    size_t sent;      /* text[0..sent) has gone out in chunks */
    long n_gen;
    const char *finish; /* "stop" | "length" once done */
    int failed;         /* engine error or shutdown: errstatus, errmsg */
    int errstatus;
    char errmsg[256];
    json_t *lp;         /* per generated token: {token, logprob, bytes, top_logprobs} */
    long *off;          /* text offset of each token (completions' text_offset) */
    size_t n_off, cap_off, lp_sent;
    int holds_turn;
    int memo_hit;
    char *memo_key;
    size_t memo_klen;
    double t0, t_fwd;   /* start of decoding; seconds in the engine (sampling, forward passes) */
    int logged;
    int phase;          /* streaming: 0 head, 1 tokens, 2 done */
    sbuf out;
    size_t out_pos;
} gen;

/* A JSON string from n bytes of possibly invalid UTF-8: invalid bytes
 * become U+FFFD. Never NULL unless out of memory. */
static json_t *jstr(const char *p, size_t n) {
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

static void gen_release(gen *g) {
    if (g->holds_turn) { g->holds_turn = 0; turn_release(g->srv); }
}

/* The client went away mid-generation: free the engine, say so. */
static void gen_stopped(gen *g) {
    gen_release(g);
    if (!g->srv->quiet)
        fprintf(stderr, "deltafin serve: %s: client disconnected, generation stopped after %ld of at most %ld tokens\n",
                g->id, g->n_gen, g->max_new);
}

static void gen_free(gen *g) {
    if (!g) return;
    gen_release(g);
    df_detok_free(g->dt);
    df_oai_request_free(&g->rq);
    free(g->prompt);
    free(g->text.p);
    free(g->out.p);
    free(g->off);
    free(g->memo_key);
    json_decref(g->lp);
    free(g);
}

static int is_eos(const df_oai_server *s, int32_t id) {
    for (int i = 0; i < s->info.n_eos; i++) if (s->info.eos_ids[i] == id) return 1;
    return 0;
}

/* The text of one token on its own (for log-probabilities), malloc'd. */
static char *token_text(df_oai_server *s, int32_t id, size_t *n) {
    sbuf b = {0};
    df_detok *d = s->has_tok ? df_detok_new(s->e) : NULL;
    if (d) {
        size_t k;
        const char *p = df_detok_push(d, id, &k);
        sb_put(&b, p, k);
        p = df_detok_flush(d, &k);
        sb_put(&b, p, k);
        df_detok_free(d);
    }
    if (!b.p) sb_put(&b, "", 0);
    if (b.oom) { free(b.p); *n = 0; return NULL; }
    *n = b.len;
    return b.p;
}

static json_t *lp_item(df_oai_server *s, int32_t id, double lp) {
    size_t n;
    char *t = token_text(s, id, &n);
    json_t *bytes = json_array();
    for (size_t i = 0; t && i < n; i++) json_array_append_new(bytes, json_integer((unsigned char)t[i]));
    json_t *o = json_object();
    json_object_set_new(o, "token", t ? jstr(t, n) : json_string(""));
    json_object_set_new(o, "logprob", json_real(lp));
    json_object_set_new(o, "bytes", bytes);
    free(t);
    return o;
}

/* Records the chosen token's log-probability under the model's own
 * distribution (raw logits, before temperature) and the top alternatives. */
static void add_logprob(gen *g, const float *logits, int32_t id, size_t text_off) {
    df_oai_server *s = g->srv;
    const int V = s->info.vocab_size;
    float mx = logits[0];
    for (int i = 1; i < V; i++) if (logits[i] > mx) mx = logits[i];
    double sum = 0;
    for (int i = 0; i < V; i++) sum += exp((double)logits[i] - mx);
    double lse = mx + log(sum);
    json_t *o = lp_item(s, id, logits[id] - lse);
    json_t *top = json_array();
    int k = g->rq.top_logprobs, best[DF_OAI_MAX_TOP_LOGPROBS], nb = 0;
    for (int i = 0; i < V && k > 0; i++) { /* keep best[] sorted, ties to the lower id */
        if (nb == k && logits[i] <= logits[best[nb - 1]]) continue;
        int j = nb < k ? nb++ : nb - 1;
        while (j > 0 && logits[best[j - 1]] < logits[i]) { best[j] = best[j - 1]; j--; }
        best[j] = i;
    }
    for (int j = 0; j < nb; j++) json_array_append_new(top, lp_item(s, best[j], logits[best[j]] - lse));
    json_object_set_new(o, "top_logprobs", top);
    json_array_append_new(g->lp, o);
    if (g->n_off == g->cap_off) {
        size_t cap = g->cap_off ? 2 * g->cap_off : 64;
        long *p = realloc(g->off, cap * sizeof *p);
        if (!p) return;
        g->off = p;
        g->cap_off = cap;
    }
    g->off[g->n_off++] = (long)text_off;
}

/* Finds stop strings in the not-yet-final text. On a match, cuts the text
 * there and returns 1. Otherwise makes final everything that cannot be the
 * start of a stop string (all of it when final is set) and returns 0. */
static int apply_stops(gen *g, int final) {
    char *t = g->text.p;
    size_t len = g->text.len, best = (size_t)-1;
    if (!t) return 0;
    for (int i = 0; i < g->rq.n_stop; i++) {
        const char *m = memmem(t + g->emitted, len - g->emitted, g->rq.stop[i], strlen(g->rq.stop[i]));
        if (m && (size_t)(m - t) < best) best = (size_t)(m - t);
    }
    if (best != (size_t)-1) {
        g->text.len = g->emitted = best;
        t[best] = 0;
        return 1;
    }
    size_t hold = 0;
    if (!final)
        for (int i = 0; i < g->rq.n_stop; i++) {
            size_t sl = strlen(g->rq.stop[i]);
            for (size_t k = sl - 1 < len - g->emitted ? sl - 1 : len - g->emitted; k > hold; k--)
                if (!memcmp(t + len - k, g->rq.stop[i], k)) { hold = k; break; }
        }
    g->emitted = len - hold;
    return 0;
}

/* The end of generation: the detokenizer's last bytes, a last stop check. */
static void finish_text(gen *g, const char *why) {
    if (g->dt) {
        size_t n;
        const char *p = df_detok_flush(g->dt, &n);
        sb_put(&g->text, p, n);
    }
    g->finish = apply_stops(g, 1) ? "stop" : why;
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
static int gen_tokenize(gen *g, df_oai_error *e) {
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
            rc = df_chat_render(s->e, rq->messages_json, NULL, 1, &text);
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

/* Syncs the session with the prompt and sets up sampling. Needs the turn.
 * Returns 0, or fills e. */
static int gen_prepare(gen *g, df_oai_error *e) {
    df_oai_server *s = g->srv;
    df_oai_request *rq = &g->rq;
    const char *param = rq->kind == DF_OAI_CHAT ? "messages" : "prompt";
    int rc;
    /* Prefix reuse: df_session_sync keeps the common prefix; the mirror says
     * how long it is (the last prompt position is always recomputed). */
    size_t c = 0;
    while (c < s->n_mirror && c < g->n_prompt && s->mirror[c] == g->prompt[c]) c++;
    g->cached = c >= g->n_prompt ? g->n_prompt - 1 : c;
    s->n_mirror = 0;
    rc = engine_call(s, 0, g->prompt, g->n_prompt);
    if (rc) return df_oai_fail(e, rc == DF_EINPUT ? 400 : 500, rc == DF_EINPUT ? param : NULL, NULL, "%s", df_engine_error(s->e));
    memcpy(s->mirror, g->prompt, g->n_prompt * sizeof *g->prompt);
    s->n_mirror = g->n_prompt;
    df_sampling_default(&g->sp);
    if (rq->has_temperature && rq->temperature > 0 && rq->top_p > 0) {
        g->sp.temperature = (float)rq->temperature;
        g->sp.top_p = (float)rq->top_p;
    }
    uint64_t seed = (uint64_t)rq->seed;
    if (!rq->has_seed && getrandom(&seed, sizeof seed, 0) != (ssize_t)sizeof seed) seed = (uint64_t)time(NULL) ^ (uint64_t)(uintptr_t)g;
    g->sp.seed = seed;
    df_session_seed(s->s, seed);
    if (s->has_tok) g->dt = df_detok_new(s->e);
    g->t0 = df_now();
    return 0;
}

/* One log line per finished generation: how long decoding took and how much
 * of it was not the engine's work (sampling and forward passes), i.e.
 * detokenizing, stop strings, JSON, sending, hand-offs: the server's
 * overhead per token. */
static void gen_log(gen *g) {
    if (g->logged || g->memo_hit || g->srv->quiet || !g->t0 || (!g->finish && !g->failed)) return;
    g->logged = 1;
    double wall = df_now() - g->t0, other = wall - g->t_fwd;
    fprintf(stderr, "deltafin serve: %s: %zu prompt tokens (%zu reused), %ld generated (%s) in %.1f ms: engine %.1f ms, "
                    "server %.3f ms/token (%.2f%%)\n",
            g->id, g->n_prompt, g->cached, g->n_gen, g->failed ? "failed" : g->finish, wall * 1e3, g->t_fwd * 1e3,
            g->n_gen ? other * 1e3 / (double)g->n_gen : 0.0, wall > 0 ? 100 * other / wall : 0.0);
}

/* One token. Sets g->finish or g->failed when generation is over. */
static void gen_step(gen *g) {
    df_oai_server *s = g->srv;
    if (atomic_load(&s->stopping)) { gen_fail(g, 503, "The server is shutting down."); return; }
    const float *logits = g->rq.logprobs ? df_session_logits(s->s) : NULL;
    int32_t id;
    double t = df_now();
    int rc = df_session_sample(s->s, &g->sp, &id);
    g->t_fwd += df_now() - t;
    if (rc) { gen_fail(g, 500, df_engine_error(s->e)); return; }
    if (is_eos(s, id)) { finish_text(g, "stop"); return; }
    g->n_gen++;
    if (logits) add_logprob(g, logits, id, g->text.len);
    if (g->dt) {
        size_t n;
        const char *p = df_detok_push(g->dt, id, &n);
        sb_put(&g->text, p, n);
    }
    if (g->text.oom) { gen_fail(g, 503, "Out of memory."); return; }
    if (apply_stops(g, 0)) { g->finish = "stop"; return; }
    if (g->n_gen >= g->max_new || g->n_prompt + (size_t)g->n_gen >= (size_t)s->ctx) { finish_text(g, "length"); return; }
    t = df_now();
    rc = engine_call(s, 1, &id, 1);
    g->t_fwd += df_now() - t;
    if (rc) { gen_fail(g, 500, df_engine_error(s->e)); return; }
    s->mirror[s->n_mirror++] = id;
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

/* Stores a finished deterministic generation (complete, not failed). */
static void memo_store(gen *g) {
    df_oai_server *s = g->srv;
    if (!s->memo_on || !g->memo_key || g->memo_hit || g->failed || !g->finish) return;
    memo *m = calloc(1, sizeof *m);
    if (!m) return;
    m->key = g->memo_key;
    m->klen = g->memo_klen;
    g->memo_key = NULL;
    m->hash = fnv1a(m->key, m->klen);
    m->tlen = g->text.len;
    m->text = malloc(m->tlen + 1);
    m->logprobs = lp_dump(g);
    if (!m->text || (g->rq.logprobs && !m->logprobs)) { memo_free(m); return; }
    memcpy(m->text, g->text.p ? g->text.p : "", m->tlen);
    m->text[m->tlen] = 0;
    m->finish = g->finish;
    m->n_prompt = (long)g->n_prompt;
    m->n_gen = g->n_gen;
    m->bytes = sizeof *m + m->klen + m->tlen + (m->logprobs ? strlen(m->logprobs) : 0);
    if (m->bytes > s->memo_max_bytes / 4) { memo_free(m); return; }
    pthread_mutex_lock(&s->mmu);
    for (memo *x = s->mhead; x; x = x->next)
        if (x->hash == m->hash && x->klen == m->klen && !memcmp(x->key, m->key, m->klen)) {
            pthread_mutex_unlock(&s->mmu);
            memo_free(m);
            return;
        }
    memo_push_front(s, m);
    s->memo_n++;
    s->memo_bytes += m->bytes;
    while (s->mtail && (s->memo_n > s->memo_max || s->memo_bytes > s->memo_max_bytes)) {
        memo *old = s->mtail;
        memo_unlink(s, old);
        s->memo_n--;
        s->memo_bytes -= old->bytes;
        memo_free(old);
    }
    pthread_mutex_unlock(&s->mmu);
}

/* Fills a finished gen from the memo; returns 1 on a hit. */
static int memo_lookup(gen *g) {
    df_oai_server *s = g->srv;
    if (!g->memo_key) return 0;
    uint64_t h = fnv1a(g->memo_key, g->memo_klen);
    int hit = 0;
    pthread_mutex_lock(&s->mmu);
    for (memo *m = s->mhead; m; m = m->next) {
        if (m->hash != h || m->klen != g->memo_klen || memcmp(m->key, g->memo_key, m->klen)) continue;
        memo_unlink(s, m);
        memo_push_front(s, m);
        sb_put(&g->text, m->text, m->tlen);
        if (!g->text.p) sb_put(&g->text, "", 0);
        g->emitted = g->text.len;
        g->finish = m->finish;
        g->n_prompt = (size_t)m->n_prompt;
        g->cached = g->n_prompt;
        g->n_gen = m->n_gen;
        if (m->logprobs) {
            json_t *o = json_loads(m->logprobs, 0, NULL), *off = json_object_get(o, "off");
            json_decref(g->lp);
            g->lp = json_incref(json_object_get(o, "lp"));
            g->n_off = g->cap_off = json_array_size(off);
            g->off = calloc(g->n_off + 1, sizeof *g->off);
            for (size_t i = 0; g->off && i < g->n_off; i++) g->off[i] = (long)json_integer_value(json_array_get(off, i));
            if (!g->off) g->n_off = g->cap_off = 0;
            json_decref(o);
        }
        hit = !g->text.oom && g->lp;
        break;
    }
    pthread_mutex_unlock(&s->mmu);
    if (!hit) { /* not found, or could not be copied: generate instead */
        g->text.len = g->emitted = 0;
        g->text.oom = 0;
        g->finish = NULL;
        g->n_prompt = g->cached = 0;
        g->n_gen = 0;
        g->n_off = 0;
        if (!g->lp) g->lp = json_array();
        else json_array_clear(g->lp);
    }
    g->memo_hit = hit;
    return hit;
}

/* =========================================================================
 * Response bodies
 * ========================================================================= */

static json_t *usage_json(const gen *g) {
    json_t *u = json_object();
    json_object_set_new(u, "prompt_tokens", json_integer((json_int_t)g->n_prompt));
    json_object_set_new(u, "completion_tokens", json_integer(g->n_gen));
    json_object_set_new(u, "total_tokens", json_integer((json_int_t)g->n_prompt + g->n_gen));
    json_t *d = json_object();
    json_object_set_new(d, "cached_tokens", json_integer((json_int_t)g->cached));
    json_object_set_new(u, "prompt_tokens_details", d);
    return u;
}

/* Log-probabilities of tokens [a, b) in the shape of the endpoint:
 * chat {content: [...], refusal: null}; completions {tokens,
 * token_logprobs, top_logprobs, text_offset}. NULL (json null) if not asked. */
static json_t *logprobs_json(const gen *g, size_t a, size_t b) {
    if (!g->rq.logprobs) return json_null();
    if (b > json_array_size(g->lp)) b = json_array_size(g->lp);
    if (g->rq.kind == DF_OAI_CHAT) {
        json_t *o = json_object(), *c = json_array();
        for (size_t i = a; i < b; i++) json_array_append(c, json_array_get(g->lp, i));
        json_object_set_new(o, "content", c);
        json_object_set_new(o, "refusal", json_null());
        return o;
    }
    json_t *o = json_object(), *tok = json_array(), *tlp = json_array(), *top = json_array(), *off = json_array();
    for (size_t i = a; i < b; i++) {
        json_t *it = json_array_get(g->lp, i), *alts = json_object(), *alt;
        json_array_append(tok, json_object_get(it, "token"));
        json_array_append(tlp, json_object_get(it, "logprob"));
        size_t j;
        json_array_foreach(json_object_get(it, "top_logprobs"), j, alt)
            json_object_set(alts, json_string_value(json_object_get(alt, "token")), json_object_get(alt, "logprob"));
        json_array_append_new(top, alts);
        json_array_append_new(off, json_integer(i < g->n_off ? g->off[i] : 0));
    }
    json_object_set_new(o, "tokens", tok);
    json_object_set_new(o, "token_logprobs", tlp);
    json_object_set_new(o, "top_logprobs", top);
    json_object_set_new(o, "text_offset", off);
    return o;
}

static json_t *head_json(const gen *g, const char *object) {
    json_t *o = json_object();
    json_object_set_new(o, "id", json_string(g->id));
    json_object_set_new(o, "object", json_string(object));
    json_object_set_new(o, "created", json_integer(g->created));
    json_object_set_new(o, "model", json_string(g->srv->model_id));
    json_object_set_new(o, "system_fingerprint", json_string("deltafin-" DF_VERSION));
    return o;
}

/* The whole non-streaming answer. */
static char *final_body(const gen *g) {
    const int chat = g->rq.kind == DF_OAI_CHAT;
    json_t *o = head_json(g, chat ? "chat.completion" : "text_completion");
    json_t *ch = json_object(), *text = jstr(g->text.p ? g->text.p : "", g->text.len);
    json_object_set_new(ch, "index", json_integer(0));
    if (chat) {
        json_t *m = json_object();
        json_object_set_new(m, "role", json_string("assistant"));
        json_object_set_new(m, "content", text);
        json_object_set_new(m, "refusal", json_null());
        json_object_set_new(m, "annotations", json_array());
        json_object_set_new(ch, "message", m);
    } else {
        json_object_set_new(ch, "text", text);
    }
    json_object_set_new(ch, "logprobs", logprobs_json(g, 0, (size_t)-1));
    json_object_set_new(ch, "finish_reason", json_string(g->finish));
    json_t *chs = json_array();
    json_array_append_new(chs, ch);
    json_object_set_new(o, "choices", chs);
    json_object_set_new(o, "usage", usage_json(g));
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s;
}

/* Appends "data: <json>\n\n" and consumes o. */
static void sse(gen *g, json_t *o) {
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!s) { g->out.oom = 1; return; }
    sb_put(&g->out, "data: ", 6);
    sb_put(&g->out, s, strlen(s));
    sb_put(&g->out, "\n\n", 2);
    free(s);
}

/* One streaming chunk: text (may be NULL), logprobs [a, b), finish (NULL
 * while running), role on the first chat chunk. */
static void sse_chunk(gen *g, const char *text, size_t n, size_t a, size_t b, const char *finish, int role) {
    const int chat = g->rq.kind == DF_OAI_CHAT;
    json_t *o = head_json(g, chat ? "chat.completion.chunk" : "text_completion");
    json_t *ch = json_object();
    json_object_set_new(ch, "index", json_integer(0));
    if (chat) {
        json_t *d = json_object();
        if (role) {
            json_object_set_new(d, "role", json_string("assistant"));
            json_object_set_new(d, "content", json_string(""));
            json_object_set_new(d, "refusal", json_null());
        } else if (text) {
            json_object_set_new(d, "content", jstr(text, n));
        }
        json_object_set_new(ch, "delta", d);
    } else {
        json_object_set_new(ch, "text", text ? jstr(text, n) : json_string(""));
    }
    json_object_set_new(ch, "logprobs", a < b ? logprobs_json(g, a, b) : json_null());
    json_object_set_new(ch, "finish_reason", finish ? json_string(finish) : json_null());
    json_t *chs = json_array();
    json_array_append_new(chs, ch);
    json_object_set_new(o, "choices", chs);
    if (g->rq.include_usage) json_object_set_new(o, "usage", json_null());
    sse(g, o);
}

/* Pending text and log-probabilities as one chunk, if there are any. */
static void sse_pending(gen *g) {
    size_t nlp = g->lp ? json_array_size(g->lp) : 0;
    if (g->emitted > g->sent || (g->rq.logprobs && nlp > g->lp_sent)) {
        sse_chunk(g, g->text.p + g->sent, g->emitted - g->sent, g->lp_sent, nlp, NULL, 0);
        g->sent = g->emitted;
        g->lp_sent = nlp;
    }
}

/* The end of a stream: finish chunk, usage chunk, [DONE]. */
static void sse_tail(gen *g) {
    sse_pending(g);
    sse_chunk(g, NULL, 0, 0, 0, g->finish, 0);
    if (g->rq.include_usage) {
        json_t *o = head_json(g, g->rq.kind == DF_OAI_CHAT ? "chat.completion.chunk" : "text_completion");
        json_object_set_new(o, "choices", json_array());
        json_object_set_new(o, "usage", usage_json(g));
        sse(g, o);
    }
    sb_put(&g->out, "data: [DONE]\n\n", 14);
}

/* An error after the stream began: data: {"error": {...}}, then [DONE]. */
static void sse_error(gen *g) {
    char *b = df_http_error_body("server_error", NULL, NULL, g->errmsg);
    if (b) {
        sb_put(&g->out, "data: ", 6);
        sb_put(&g->out, b, strlen(b));
        sb_put(&g->out, "\n\n", 2);
        free(b);
    }
    sb_put(&g->out, "data: [DONE]\n\n", 14);
}

/* The http stream callback: hands out pending bytes, making more one token
 * at a time; checks the client before each token. */
static ssize_t stream_fn(void *ctx, char *buf, size_t max) {
    gen *g = ctx;
    for (;;) {
        if (g->out.oom) return -1;
        if (g->out_pos < g->out.len) {
            size_t n = g->out.len - g->out_pos < max ? g->out.len - g->out_pos : max;
            memcpy(buf, g->out.p + g->out_pos, n);
            g->out_pos += n;
            return (ssize_t)n;
        }
        g->out.len = g->out_pos = 0;
        if (g->phase == 2) return 0;
        if (g->phase == 0) {
            if (g->rq.kind == DF_OAI_CHAT) sse_chunk(g, NULL, 0, 0, 0, NULL, 1);
            g->phase = 1;
            continue;
        }
        if (g->failed) { gen_release(g); sse_error(g); g->phase = 2; continue; }
        if (g->finish) { gen_release(g); sse_tail(g); g->phase = 2; continue; }
        if (df_http_peer_closed(g->req)) { gen_stopped(g); return -1; }
        gen_step(g);
        if (!g->failed && !g->finish) sse_pending(g);
    }
}

static void stream_done(void *ctx, int complete) {
    gen *g = ctx;
    gen_release(g);
    if (complete) gen_log(g);
    if (complete && df_oai_deterministic(&g->rq)) memo_store(g);
    gen_free(g);
}

/* =========================================================================
 * Routes
 * ========================================================================= */

static void respond_json(df_http_req *r, int status, json_t *o) {
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!s) { df_http_respond_error(r, 503, "server_error", NULL, NULL, "Out of memory."); return; }
    df_http_respond(r, status, "application/json", s, strlen(s), NULL, NULL);
    free(s);
}

static void respond_oai_error(df_http_req *r, const df_oai_error *e) {
    df_http_respond_error(r, e->status, e->status >= 500 ? "server_error" : e->type[0] ? e->type : "invalid_request_error",
                          e->param[0] ? e->param : NULL, e->code[0] ? e->code : NULL, e->message);
}

static json_t *model_json(const df_oai_server *s) {
    json_t *m = json_object();
    json_object_set_new(m, "id", json_string(s->model_id));
    json_object_set_new(m, "object", json_string("model"));
    json_object_set_new(m, "created", json_integer(s->created));
    json_object_set_new(m, "owned_by", json_string("deltafin"));
    json_object_set_new(m, "max_model_len", json_integer(s->ctx));
    return m;
}

static void make_id(df_oai_server *s, const char *prefix, char *out, size_t n) {
    static const char al[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    uint64_t x = (atomic_fetch_add(&s->idctr, 1) + 1) * 0x9e3779b97f4a7c15ull ^ s->salt;
    char tail[25];
    for (int i = 0; i < 24; i++) {
        x ^= x >> 31; x *= 0xbf58476d1ce4e5b9ull; x ^= x >> 29;
        tail[i] = al[x % 62];
    }
    tail[24] = 0;
    snprintf(out, n, "%s%s", prefix, tail);
}

static void complete(df_oai_server *s, df_http_req *r, df_oai_kind kind) {
    size_t len;
    const char *body = df_http_body(r, &len);
    df_oai_limits lim = {s->model_id, s->info.vocab_size, s->cap};
    df_oai_error e;
    gen *g = calloc(1, sizeof *g);
    if (!g) { df_http_respond_error(r, 503, "server_error", NULL, NULL, "Out of memory."); return; }
    if (df_oai_parse(kind, &lim, body, len, &g->rq, &e)) { respond_oai_error(r, &e); free(g); return; }
    g->srv = s;
    g->req = r;
    g->lp = json_array();
    g->created = (long long)time(NULL);
    make_id(s, kind == DF_OAI_CHAT ? "chatcmpl-" : "cmpl-", g->id, sizeof g->id);
    if (s->memo_on && df_oai_deterministic(&g->rq) && len <= (1u << 20)) {
        g->memo_key = malloc(len + 1);
        if (g->memo_key) {
            g->memo_key[0] = (char)kind;
            memcpy(g->memo_key + 1, body, len);
            g->memo_klen = len + 1;
        }
    }
    if (!memo_lookup(g)) {
        int big = len >= BIG_BODY; /* big prompts are prepared one at a time, small ones at once */
        if (big) pthread_mutex_lock(&s->pmu);
        int gone = df_http_peer_closed(r), rc = gone ? 0 : gen_tokenize(g, &e);
        if (big) pthread_mutex_unlock(&s->pmu);
        if (gone) { df_http_drop(r); gen_free(g); return; } /* the client left while waiting */
        if (rc) { respond_oai_error(r, &e); gen_free(g); return; }
        switch (turn_acquire(s, r)) {
        case TURN_FULL: {
            char msg[200];
            snprintf(msg, sizeof msg, "The server is busy: one generation is running and %d are waiting (--queue %d). Retry later.", s->qmax, s->qmax);
            char *b = df_http_error_body("requests", NULL, "rate_limit_exceeded", msg);
            if (b) df_http_respond(r, 429, "application/json", b, strlen(b), "Retry-After", "1");
            else df_http_drop(r);
            free(b);
            gen_free(g);
            return;
        }
        case TURN_GONE: df_http_drop(r); gen_free(g); return;
        case TURN_STOP: df_http_respond_error(r, 503, "server_error", NULL, NULL, "The server is shutting down."); gen_free(g); return;
        default: break;
        }
        g->holds_turn = 1;
        if (gen_prepare(g, &e)) { gen_release(g); respond_oai_error(r, &e); gen_free(g); return; }
    }
    if (g->rq.stream) {
        df_http_respond_stream(r, 200, "text/event-stream", stream_fn, stream_done, g);
        return;
    }
    while (!g->finish && !g->failed) {
        if (df_http_peer_closed(r)) { gen_stopped(g); df_http_drop(r); gen_free(g); return; }
        gen_step(g);
    }
    gen_release(g);
    char *out = g->failed ? NULL : final_body(g);
    gen_log(g);
    if (g->failed) {
        df_http_respond_error(r, g->errstatus, "server_error", NULL, NULL, g->errmsg);
        gen_free(g);
        return;
    }
    if (out) df_http_respond(r, 200, "application/json", out, strlen(out), NULL, NULL);
    else df_http_respond_error(r, 503, "server_error", NULL, NULL, "Out of memory.");
    free(out);
    if (df_oai_deterministic(&g->rq)) memo_store(g);
    gen_free(g);
}

void df_oai_handle(void *app, df_http_req *r) {
    df_oai_server *s = app;
    const char *m = df_http_method(r), *p = df_http_path(r);
    int get = !strcmp(m, "GET"), post = !strcmp(m, "POST");
    if (!strcmp(p, "/health")) {
        if (!get) goto method;
        json_t *o = json_object();
        json_object_set_new(o, "status", json_string("ok"));
        respond_json(r, 200, o);
    } else if (!strcmp(p, "/v1/models")) {
        if (!get) goto method;
        json_t *o = json_object(), *d = json_array();
        json_array_append_new(d, model_json(s));
        json_object_set_new(o, "object", json_string("list"));
        json_object_set_new(o, "data", d);
        respond_json(r, 200, o);
    } else if (!strncmp(p, "/v1/models/", 11)) {
        if (!get) goto method;
        if (strcmp(p + 11, s->model_id)) {
            char msg[300];
            snprintf(msg, sizeof msg, "The model `%.200s` does not exist or you do not have access to it.", p + 11);
            df_http_respond_error(r, 404, "invalid_request_error", "model", "model_not_found", msg);
        } else {
            respond_json(r, 200, model_json(s));
        }
    } else if (!strcmp(p, "/v1/chat/completions")) {
        if (!post) goto method;
        complete(s, r, DF_OAI_CHAT);
    } else if (!strcmp(p, "/v1/completions")) {
        if (!post) goto method;
        complete(s, r, DF_OAI_COMPLETIONS);
    } else {
        char msg[300];
        snprintf(msg, sizeof msg, "Unknown request URL: %s %.200s. Please check the URL for typos.", m, p);
        df_http_respond_error(r, 404, "invalid_request_error", NULL, "unknown_url", msg);
    }
    return;
method: {
        char msg[300];
        snprintf(msg, sizeof msg, "Method %s is not allowed on %.200s.", m, p);
        df_http_respond_error(r, 405, "invalid_request_error", NULL, "method_not_allowed", msg);
    }
}

/* ---- lifetime ------------------------------------------------------------ */

/* The longest token's text in bytes (0 without a tokenizer). */
static int longest_token(df_oai_server *s) {
    if (!s->has_tok) return 0;
    size_t most = 0;
    for (int id = 0; id < s->info.vocab_size; id++) {
        size_t n;
        char *t = token_text(s, id, &n);
        if (!t) return 0;
        if (n > most) most = n;
        free(t);
    }
    return most > (size_t)1 << 20 ? 0 : (int)most;
}

df_oai_server *df_oai_new(df_engine *e, const df_oai_options *o, char *err, size_t errlen) {
    df_oai_server *s = calloc(1, sizeof *s);
    if (!s) { df_err(err, errlen, DF_ENOMEM, "out of memory"); return NULL; }
    s->e = e;
    df_engine_info(e, &s->info);
    s->ctx = o->ctx > 0 ? o->ctx : (s->info.max_context < 8192 ? s->info.max_context : 8192);
    if (s->ctx <= 1) { free(s); df_err(err, errlen, DF_EINPUT, "the context length must be at least 2 tokens"); return NULL; }
    s->cap = o->max_tokens > 0 ? o->max_tokens : s->ctx;
    s->model_id = strdup(o->model_id ? o->model_id : "model");
    s->has_tok = df_has_tokenizer(e);
    s->quiet = o->quiet;
    s->created = (long long)time(NULL);
    s->qmax = o->queue < 0 ? 0 : o->queue;
    s->memo_on = o->memo;
    s->memo_max = o->memo_entries > 0 ? o->memo_entries : 256;
    s->memo_max_bytes = o->memo_bytes > 0 ? o->memo_bytes : (size_t)64 << 20;
    s->mirror = malloc(((size_t)s->ctx + 1) * sizeof *s->mirror);
    s->s = df_session_new(e, s->ctx);
    if (!s->s || !s->mirror || !s->model_id) {
        df_err(err, errlen, DF_ENOMEM, "cannot create a session of %d tokens: %s", s->ctx, df_engine_error(e));
        df_session_free(s->s);
        free(s->mirror);
        free(s->model_id);
        free(s);
        return NULL;
    }
    if (getrandom(&s->salt, sizeof s->salt, 0) != (ssize_t)sizeof s->salt) s->salt = (uint64_t)time(NULL);
    pthread_mutex_init(&s->qmu, NULL);
    pthread_cond_init(&s->qcv, NULL);
    pthread_mutex_init(&s->mmu, NULL);
    pthread_mutex_init(&s->pmu, NULL);
    s->max_tok_bytes = longest_token(s);
    return s;
}

void df_oai_stop(df_oai_server *s) {
    atomic_store(&s->stopping, 1);
    pthread_mutex_lock(&s->qmu);
    pthread_cond_broadcast(&s->qcv);
    pthread_mutex_unlock(&s->qmu);
}

void df_oai_free(df_oai_server *s) {
    if (!s) return;
    while (s->mhead) {
        memo *m = s->mhead;
        memo_unlink(s, m);
        memo_free(m);
    }
    df_session_free(s->s);
    free(s->mirror);
    free(s->model_id);
    pthread_mutex_destroy(&s->qmu);
    pthread_cond_destroy(&s->qcv);
    pthread_mutex_destroy(&s->mmu);
    pthread_mutex_destroy(&s->pmu);
    free(s);
}
