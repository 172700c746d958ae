/* deltafin.h - the narrow public API of Deltafin.
 *
 * An engine is a loaded model (read-only, shareable). A session is one
 * timeline over it: tokens, KV cache, recurrent state. The CLI and the server
 * talk only to this header; they never see tensors.
 *
 * Conventions: functions returning int give 0 on success or a negative
 * DF_E* code, and write a one-line message naming what was wrong into the
 * caller's err buffer (or into df_engine_error() for session calls).
 */
#ifndef DELTAFIN_H
#define DELTAFIN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DF_VERSION "0.1.0"

/* Error codes (negative). Exit code 2 for DF_EINPUT/DF_EFORMAT/DF_EUNSUPPORTED
 * in the CLI: the user's input was wrong, not Deltafin. */
enum {
    DF_OK = 0,
    DF_EINPUT = -1,       /* bad argument or request */
    DF_EFORMAT = -2,      /* malformed or inconsistent file */
    DF_EUNSUPPORTED = -3, /* valid but not supported (yet): message says what */
    DF_EIO = -4,          /* read/write failure */
    DF_ENOMEM = -5,       /* allocation or budget exceeded */
    DF_ECANCEL = -6,      /* cancelled by the caller */
    DF_EINTERNAL = -7,
};

typedef struct df_engine df_engine;
typedef struct df_session df_session;

typedef struct {
    int n_threads;              /* 0: all online cores */
    int64_t ram_bytes;          /* 0: available memory minus a safety margin */
    int64_t expert_cache_bytes; /* -1: from the budget; 0: minimum (one layer) */
    int mmap_weights;           /* 1: map weights from the files (page cache) instead of reading them into owned memory */
    const char *trace_path;     /* JSONL trace of routed experts per token and layer (streamed models), or NULL */
    int prefetch;               /* streamed models' router-lookahead prefetch: 0 auto (read predictions while at least
                                   half of the recent ones were right), 1 always, 2 never */
    int verbose;
    /* streaming switches (the CLI sets them from --evict and the DELTAFIN_* variables of docs/CLI.md) */
    int evict_lfu;              /* expert-cache eviction: 0 LRU (default), 1 LFU */
    int no_io_uring;            /* read experts with pread instead of io_uring */
    int no_populate;            /* do not fault fresh memory in ahead of use */
    int resident_embed;         /* keep an untied embedding in memory instead of reading rows from the file */
    int fresh_memory;           /* 0 measure first-touch speed; 1/2 treat fresh memory as slow/fast (tests) */
    const char *backend;        /* NULL: as selected (CPU by default); "cpu", "cuda" (a CUDA build, make CUDA=1),
                                   "auto" (CUDA when built and a device is present, else CPU); process-wide */
    int64_t gpu_memory_bytes;   /* a GPU backend's device memory budget (--gpu-memory); 0: free memory minus a margin */
} df_options;

void df_options_default(df_options *opt);

/* Opens a model: a Hugging Face checkpoint directory, a GGUF file, a store
 * directory, or the name of a model installed under $DELTAFIN_HOME.
 * Returns NULL and fills err on failure. */
df_engine *df_engine_open(const char *model, const df_options *opt, char *err, size_t errlen);
void df_engine_close(df_engine *e);
const char *df_engine_error(const df_engine *e); /* last error of a session/tokenizer call made by this thread */

/* Model facts. */
typedef struct {
    const char *family;     /* "llama", "qwen3", "qwen3_moe", "deepseek_v3", ... */
    const char *model_type; /* as written in config.json */
    int n_layers, hidden, vocab_size, n_experts, n_experts_used;
    int max_context;
    int bos_id;             /* -1 if none */
    int n_eos;
    const int32_t *eos_ids; /* stop ids from config.json + generation_config.json */
    int64_t n_params, n_params_active; /* active = per token */
    int64_t weight_bytes, weight_bytes_active;
    const char *backend;    /* where the weights, activations and session state live: "cpu", "cuda" */
    int backend_threads;    /* CPU worker threads (the CPU backend's products; a GPU backend's host side) */
} df_model_info;
void df_engine_info(const df_engine *e, df_model_info *out);
/* A multi-line human description (inspect). Caller frees. */
char *df_engine_describe(const df_engine *e);

/* ---- sessions ---------------------------------------------------------- */

df_session *df_session_new(df_engine *e, int max_context); /* 0: model default (capped by budget) */
void df_session_free(df_session *s);
/* Makes the timeline equal ids[0..n): keeps the common prefix with what is
 * already there, computes the rest. After it, df_session_logits is the
 * distribution for the next token. */
int df_session_sync(df_session *s, const int32_t *ids, size_t n);
/* Logits of the last position, vocab_size floats (valid until the next call). */
const float *df_session_logits(df_session *s);
/* Teacher-forced pass that returns logits for every one of ids (out: n*vocab). */
int df_session_eval_all(df_session *s, const int32_t *ids, size_t n, float *out);
size_t df_session_len(const df_session *s);
/* Positions the last df_session_sync kept instead of recomputing: the common
 * prefix where every layer can be truncated, else the position of the snapshot
 * it restored (recurrent layers), else 0. */
size_t df_session_reused(const df_session *s);

typedef struct {
    float temperature; /* <= 0: greedy */
    float top_p;       /* 1: off */
    int top_k;         /* 0: off */
    float min_p;       /* 0: off */
    uint64_t seed;
    const uint32_t *allow; /* NULL: every token; else a bitset over the vocabulary ((vocab_size + 31) / 32 words):
                              the logits of the others are -inf before temperature, top-k, top-p and min-p, the
                              allowed ones untouched (greedy: the best allowed token); none allowed: DF_EINPUT */
} df_sampling;
void df_sampling_default(df_sampling *s); /* greedy */

/* Picks the next token from the current logits (does not append it). */
int df_session_sample(df_session *s, const df_sampling *sp, int32_t *out_id);
/* Appends one token and computes the logits after it. */
int df_session_push(df_session *s, int32_t id);
/* Sampler state lives in the session: df_session_seed resets the RNG. */
void df_session_seed(df_session *s, uint64_t seed);

/* Snapshots: the whole state of a session at its current length (every
 * layer's fixed state, e.g. recurrent matrices, and the logits there;
 * attention caches are kept in place, since positions before a snapshot are
 * never rewritten while it exists). Going back by truncation is wrong for
 * recurrent layers; df_session_sync restores snapshots (its own, taken at
 * the end of each prompt, or these) where the model needs it.
 * df_session_snapshot returns an id >= 0 or a DF_E* code. */
int df_session_snapshot(df_session *s);
/* Back to snapshot id: the length becomes its position, the logits its logits.
 * DF_EINPUT when the id was dropped or invalidated (an earlier position was rewritten). */
int df_session_restore(df_session *s, int id);
void df_session_snapshot_drop(df_session *s, int id);
size_t df_session_snapshot_bytes(const df_session *s); /* bytes one snapshot holds */
/* Positions a df_session_sync with ids[0..n) would keep (no work done). */
size_t df_session_reusable(const df_session *s, const int32_t *ids, size_t n);

/* Session files (the server's prompt cache, docs/SERVER.md): a session's
 * state at a position, as bytes in a file: the token ids, the growing
 * caches' rows [0, pos) (attention K/V, MLA latents), every recurrent layer's
 * fixed state and the logits at pos, behind a header (magic, version, the
 * engine's fingerprint, the sizes) with a checksum per section. A file is
 * untrusted input: df_session_load checks the header and the sizes against
 * the model before it allocates, and every section's checksum; a refused
 * file (DF_EFORMAT, the message says why) leaves the session as it was or
 * empty, never half-loaded. */
/* The identity a session file must match: format version, build version,
 * backend, cache dtype, config.json, the state layout, every spine weight's
 * format, shape and first bytes. */
uint64_t df_engine_fingerprint(df_engine *e);
/* Bytes of the file df_session_save writes for n positions (with logits). */
uint64_t df_session_file_bytes(const df_session *s, size_t n);
/* Writes the state at position n to fd (from offset 0; the caller makes the
 * file durable and visible). ids[0..n) must be the session's tokens there.
 * snap >= 0: a snapshot taken at n (its fixed state and logits); snap < 0:
 * the session's current state when n is its length, or, where every layer
 * can be truncated, the caches' rows [0, n) without logits (a load then
 * recomputes the last position). *bytes (may be NULL): the file's size. */
int df_session_save(df_session *s, int snap, const int32_t *ids, size_t n, int fd, uint64_t *bytes);
/* Loads a file written by df_session_save whose tokens are a prefix of
 * ids[0..n): the session then holds them (*pos positions; its snapshots are
 * dropped) and df_session_sync(ids, n) computes only the rest. */
int df_session_load(df_session *s, int fd, const int32_t *ids, size_t n, size_t *pos);

/* ---- tokenizer and chat ------------------------------------------------- */

/* Tokenizes text with the model's own tokenizer (no BOS added; special-token
 * text is recognised). *ids is malloc'd. */
int df_tokenize(df_engine *e, const char *text, size_t len, int32_t **ids, size_t *n);
/* Renders a chat (messages JSON array, optional tools JSON array) with the
 * model's chat template. *out is malloc'd. */
int df_chat_render(df_engine *e, const char *messages_json, const char *tools_json,
                   int add_generation_prompt, char **out);
/* df_chat_render with extra template variables (a JSON object, or NULL):
 * a chat template's kwargs (enable_thinking, reasoning_effort, ...), or
 * Kimi K3's render options (thinking, thinking_effort, tool_choice). */
int df_chat_render_vars(df_engine *e, const char *messages_json, const char *tools_json,
                        int add_generation_prompt, const char *vars_json, char **out);
/* The chat template's text (NULL: none, or Kimi K3's built-in format);
 * want_tools: the one that renders requests with tools (the "tool_use"
 * template when the model has one). */
const char *df_chat_template_source(const df_engine *e, int want_tools);
/* 1 if the chat format is Kimi K3's own (no Jinja template). */
int df_chat_is_k3(const df_engine *e);
int df_has_tokenizer(const df_engine *e);
/* Whether plain-text prompts get the BOS id prepended (tokenizer_config add_bos_token). */
int df_engine_adds_bos(const df_engine *e);

/* Streaming detokenizer: feed ids, get UTF-8 bytes that are complete. */
typedef struct df_detok df_detok;
df_detok *df_detok_new(df_engine *e);
void df_detok_free(df_detok *d);
/* Appends the text of id; returns a pointer to newly completed bytes (len in
 * *n), valid until the next call. */
const char *df_detok_push(df_detok *d, int32_t id, size_t *n);
const char *df_detok_flush(df_detok *d, size_t *n);

/* ==== generation, shared by `run` and `serve` (src/core/generate.c) =====
 * Added by the server branch (issue 11 item 5); built on the calls above.
 *
 * A df_gen is one generation over a session that already holds the prompt
 * (df_session_sync). Each df_gen_step first pushes the token the previous
 * step chose (only when generation goes on), then chooses the next one:
 * sample (greedy or seeded), end-of-sequence ids, the token limit and the
 * context, detokenizing, stop strings (text that could be the start of one
 * is held back until the next token decides), and the chosen token's
 * log-probability under the model's own distribution. The last token
 * chosen is never pushed: the session ends holding the prompt and every
 * token but the last. */

#define DF_GEN_MAX_TOP 20

typedef struct { int32_t id; double logprob; } df_logprob;

/* A compiled grammar (src/grammar/grammar.h: df_grammar_compile, df_json_schema_to_grammar). */
typedef struct df_grammar df_grammar;

typedef struct {
    df_sampling sampling;    /* df_gen_new seeds the session with sampling.seed */
    long max_new;            /* most tokens to choose (0: none) */
    size_t max_context;      /* the session's context: no token is pushed beyond it; 0: not checked */
    int ignore_eos;          /* 1: end-of-sequence ids are ordinary tokens */
    int text;                /* 1: detokenize (needed for stop strings) */
    const char *const *stop; /* n_stop non-empty stop strings: the text ends before the first occurrence */
    int n_stop;
    int logprobs;            /* 1: report each token's log-probability ... */
    int top_logprobs;        /* ... and this many most likely tokens, 0..DF_GEN_MAX_TOP */
    df_grammar *grammar;     /* NULL, or constrained decoding (docs/GRAMMAR.md): each step only tokens whose bytes keep
                                the text a valid prefix of the grammar may be chosen (the others' logits are -inf, the
                                rest untouched), end-of-sequence only once the document is complete, and generation
                                ends ("stop") when the document is complete and nothing can follow it. Needs the
                                model's tokenizer. Log-probabilities stay the model's own (unmasked). */
    /* Speculative decoding (src/core/spec.c): drafts checked by one batched
     * verify pass; the chosen tokens are exactly those of DF_SPEC_NONE (the
     * same draws of the same seeded RNG). 0 (DF_SPEC_NONE) when zeroed. */
    int spec;                /* DF_SPEC_* */
    int spec_max;            /* most drafted tokens per pass, 1..DF_SPEC_MAX_K (0: DF_SPEC_DEFAULT_K) */
    df_engine *draft;        /* DF_SPEC_DRAFT: the draft model (same tokenizer; df_spec_check_draft) */
    int constrained;         /* 1: a constraint decides tokens (grammar): speculation is off, said in the stats */
} df_gen_config;

enum { DF_SPEC_NONE = 0, DF_SPEC_NGRAM, DF_SPEC_DRAFT, DF_SPEC_MTP, DF_SPEC_AUTO };
#define DF_SPEC_MAX_K 32
#define DF_SPEC_DEFAULT_K 8
/* "none" | "ngram" | "draft" | "mtp" | "auto" -> DF_SPEC_*, or -1. */
int df_spec_parse(const char *name);
const char *df_spec_name(int mode);
/* 0 if the draft engine can draft for the target: token by token when both
 * have the same vocabulary (size and bytes of every id, or the same size
 * without tokenizers), through text when both have tokenizers that differ
 * (remembered on the draft engine); else DF_EINPUT with a message. */
int df_spec_check_draft(df_engine *target, df_engine *draft, char *err, size_t errlen);
/* 1 if the model carries a loaded MTP module (--spec mtp can draft with it):
 * DeepSeek-V3/R1 or Kimi K2 checkpoints with num_nextn_predict_layers >= 1
 * and its tensors, loaded resident (a streamed model leaves it unused). */
int df_engine_has_mtp(const df_engine *e);
/* The MTP module's logits for the timeline the session holds (len >= 2):
 * out[(len-1) x vocab], row i predicting token i+2 from the model's final
 * hidden state at i and token i+1. 0 or DF_E* (df_engine_error). */
int df_session_mtp_logits(df_session *s, float *out);

typedef struct {
    int mode;                /* DF_SPEC_* asked for */
    char off_reason[160];    /* non-empty: speculation was off (or turned off) and why */
    long drafted, accepted;  /* draft tokens proposed to verify passes, and accepted */
    long passes;             /* verify passes */
    long pass_tokens;        /* tokens chosen by verify passes (accepted + one each) */
    long plain_steps;        /* plain one-token steps */
    double t_draft, t_verify, t_plain; /* seconds */
    int k_now;               /* auto: the draft length in use at the end (0: drafting off) */
    int text_level;          /* draft: the draft model's tokenizer differs; it drafts text, re-tokenized */
} df_spec_stats;
typedef struct df_gen df_gen;
void df_gen_spec_stats(const df_gen *g, df_spec_stats *out);

typedef struct {
    int has_token;           /* a token was chosen (an end-of-sequence id that ends generation is not one) */
    int32_t id;
    const char *text;        /* text that became final in this step (valid until the next call) */
    size_t text_len;
    size_t text_offset;      /* has_token: where the token's text starts in the whole detokenized text */
    df_logprob logprob;      /* logprobs: the token's own */
    df_logprob top[DF_GEN_MAX_TOP]; /* logprobs: the top_logprobs most likely, best first, ties to the lower id */
    int n_top;
} df_gen_token;

/* NULL if out of memory or the config is invalid (max_new < 0,
 * top_logprobs outside 0..DF_GEN_MAX_TOP, an empty stop string, a grammar
 * without a tokenizer); the message is df_engine_error(). The engine, the
 * session and the grammar must outlive the gen. */
typedef struct df_gen df_gen;
df_gen *df_gen_new(df_engine *e, df_session *s, const df_gen_config *cfg);
void df_gen_free(df_gen *g);
/* Returns 1: a token, more may follow; 0: generation is over (out may still
 * carry a last token and the last text); a negative DF_E* code: it failed
 * (message: df_gen_error; out->text then carries the text held back).
 * Never call again after 0 or an error. */
int df_gen_step(df_gen *g, df_gen_token *out);
const char *df_gen_finish_reason(const df_gen *g); /* "stop" | "length" once over, else NULL */
long df_gen_count(const df_gen *g);                /* tokens chosen */
size_t df_gen_pushed(const df_gen *g);             /* of those, how many the session now holds */
double df_gen_engine_seconds(const df_gen *g);     /* time in df_session_sample and df_session_push */
const char *df_gen_error(const df_gen *g);

/* Log-softmax of logits[0..vocab) in double precision: the log-probability
 * of id in *chosen, and the k (<= DF_GEN_MAX_TOP) most likely tokens in
 * top[], best first, ties to the lower id. Returns how many are in top. */
int df_logprobs(const float *logits, int vocab, int32_t id, int k, df_logprob *chosen, df_logprob *top);
/* The text of one token on its own, malloc'd (len in *n); NULL without a
 * tokenizer or out of memory. */
char *df_token_text(df_engine *e, int32_t id, size_t *n);

/* ==== end of the generation section ===================================== */

/* ---- statistics --------------------------------------------------------- */

typedef struct {
    int64_t prefill_tokens, decode_tokens;
    double prefill_seconds, decode_seconds;
    double t_attention, t_experts, t_other; /* seconds, all forward passes */
    double spine_load_seconds;              /* streamed models: reading the resident weights at load */
    int64_t spine_load_bytes;
    int64_t weight_bytes_touched;           /* bytes of weights read by decode steps */
    int streaming;                          /* routed experts stream through the expert cache */
    int spine_int8;                         /* the spine is row-int8 (--spine int8): results are NOT exact */
    int64_t expert_hits, expert_prefetch_hits, expert_misses, bytes_read;
    int64_t prefetch_issued, prefetch_unused;
    int64_t prefetch_predicted, prefetch_predicted_right; /* lookahead predictions of non-resident experts judged */
    int prefetch_mode;                                    /* as df_options.prefetch */
    int64_t stale_reuses;      /* reads that evicted an expert unused for 16 positions instead of taking fresh memory */
    double slot_touch_gbs;     /* measured first-touch speed of expert-cache memory */
    double io_wait_seconds;
    int64_t decode_ahead_tokens;            /* decode steps whose forward pass was queued before their token was known
                                               (greedy decoding one token ahead: a device backend's default) */
    int64_t decode_bytes_read;              /* expert bytes read during decode steps */
    double decode_io_wait_seconds;          /* time decode steps waited for expert reads */
    int64_t expert_cache_bytes;             /* slot memory */
    int expert_cache_slots;
    int64_t peak_rss_bytes;                 /* the process's peak resident memory (VmHWM) */
    int64_t state_bytes_per_token;          /* session state that grows with each position (KV, latent), all layers */
    int64_t state_bytes_fixed;              /* session state of fixed size (recurrent layers): also one snapshot's size */
    /* a GPU backend's memory tiers since the engine opened (gpu_budget_bytes 0: a backend without them) */
    int64_t gpu_budget_bytes, gpu_used_bytes;   /* --gpu-memory (or the default), device memory in use */
    int64_t gpu_spine_bytes;                    /* spine weights resident in device memory */
    int64_t gpu_spine_host_bytes;               /* spine weights over the budget, in host memory, copied per product */
    int gpu_spine_host_weights;
    int64_t gpu_cache_bytes;                    /* the device expert cache */
    int gpu_cache_slots, gpu_evict_lfu;
    int64_t gpu_cache_hits, gpu_cache_misses, gpu_cache_evictions, gpu_cache_bypasses; /* expert parts (gate, up, down) */
    int64_t gpu_pinned_bytes;                   /* host expert-cache memory page-locked for asynchronous copies */
    int64_t gpu_h2d_expert_bytes, gpu_h2d_expert_pinned_bytes, gpu_h2d_spine_bytes; /* copied host -> device */
    int64_t gpu_h2d_expert_staged_bytes;        /* ... experts from pageable memory through page-locked staging buffers */
    int64_t gpu_decode_h2d_expert_bytes;        /* ... experts copied during decode steps */
    /* the network (setup --stream models: routed experts fetched from the hub on first use), apart from disk */
    int hub_stream;
    int64_t net_bytes, net_requests, net_retries; /* bytes received, HTTP requests, retried attempts */
    double net_seconds;                           /* time in transfers, summed over parallel connections (process-wide, like net_bytes) */
    int64_t net_experts_fetched, net_evictions;   /* experts fetched; experts evicted from the disk cache */
    double net_fetch_seconds;                     /* time the forward pass waited for fetches (network + fdatasync) */
    int64_t stream_disk_bytes, stream_disk_budget; /* experts on local disk now; the --disk budget (-1: none) */
} df_stats;
void df_stats_get(df_engine *e, df_stats *out);
void df_stats_reset(df_engine *e);

#ifdef __cplusplus
}
#endif
#endif
