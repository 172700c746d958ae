/* toolcall.h - a model's output split into what OpenAI and Anthropic
 * clients expect: content, reasoning (think blocks) and tool calls, parsed
 * from the model's own native syntax, incrementally, as the text streams.
 *
 * The family is decided from the chat template's text (the special-token
 * strings it writes), once per model (df_tc_detect):
 *
 *   DEEPSEEK  "<｜tool▁calls▁begin｜>"            DeepSeek-V3 / R1 / V3.1
 *   KIMI_K2   "<|tool_calls_section_begin|>"      Kimi K2 / K2 Thinking
 *   KIMI_K3   the engine renders K3's own format  (no template; is_k3)
 *   HERMES    "<tool_call>"                       Qwen3, Qwen2.5, Hermes, SmolLM3
 *   MISTRAL   "[TOOL_CALLS]"                      Mistral (GGUF templates)
 *   LLAMA3    "<|python_tag|>" or a template that asks for
 *             {"name": ..., "parameters": ...}    Llama 3.1 / 3.2 / 3.3
 *   NONE      anything else (gpt-oss harmony is not parsed)
 *
 * Think blocks: "<think>" / "</think>" when the template writes "<think>"
 * (Qwen3, DeepSeek-R1, Kimi K2 Thinking), K3's think part. The output may
 * start inside one (the generation prompt opened it: df_tc_config.in_think).
 *
 * Invariants: content, reasoning and the list of calls only grow, so a
 * stream sends their new parts; text that could still be the start of a
 * marker is held back until the next piece (or the end) decides; a call is
 * added only once it is complete and valid (its name one of the declared
 * tools, its arguments a JSON object), and a malformed one is returned as
 * content, unchanged. Nothing here exits or aborts.
 */
#ifndef DF_SERVER_TOOLCALL_H
#define DF_SERVER_TOOLCALL_H

#include <stddef.h>
#include <stdint.h>

#include "util/util.h"

typedef enum {
    DF_TC_NONE = 0,
    DF_TC_HERMES,
    DF_TC_DEEPSEEK,
    DF_TC_KIMI_K2,
    DF_TC_KIMI_K3,
    DF_TC_LLAMA3,
    DF_TC_MISTRAL,
} df_tc_family;

/* "hermes", "deepseek", ... ("none"). */
const char *df_tc_family_name(df_tc_family f);
/* The family of a chat template (src: its text; NULL with is_k3). */
df_tc_family df_tc_detect(const char *src, int is_k3);
/* 1 if the template's text uses the identifier name (a whole word outside
 * string quotes is not required: "tools", "enable_thinking" ...). */
int df_tc_template_reads(const char *src, const char *name);
/* Whether the template writes think blocks (its text has "<think>"; K3). */
int df_tc_has_think(const char *src, int is_k3);
/* 1 if a rendered prompt ends inside an open think block (the generation
 * prompt opened it), so the output starts as reasoning. */
int df_tc_prompt_opens_think(df_tc_family f, const char *prompt, size_t len);

typedef struct {
    df_tc_family fam;
    int think;       /* parse think blocks */
    int in_think;    /* the output starts inside one */
    int tools;       /* parse tool calls (tools given, tool_choice not none) */
    const char *tools_json; /* the declared tools (OpenAI shape): call names are checked against them; NULL: any */
    uint64_t id_seed;       /* call ids "call_" + 24 characters from this */
} df_tc_config;

typedef struct {
    char id[64];
    char *name;
    char *args;      /* the arguments as compact JSON text */
} df_tc_call;

typedef struct df_tc df_tc;

df_tc *df_tc_new(const df_tc_config *c);
void df_tc_free(df_tc *p);
/* Feeds n more bytes of output text. */
void df_tc_feed(df_tc *p, const char *s, size_t n);
/* The output is complete: held-back text is decided (an unfinished call is
 * returned as content). */
void df_tc_finish(df_tc *p);

const char *df_tc_content(const df_tc *p, size_t *len);
const char *df_tc_reasoning(const df_tc *p, size_t *len);
size_t df_tc_n_calls(const df_tc *p);
const df_tc_call *df_tc_call_at(const df_tc *p, size_t i);

/* ---- constrained decoding: the grammar text of a call -------------------
 *
 * Appends to out a grammar (GBNF-like: `name ::= alt | alt`, "literals",
 * [classes], ( ), * + ? {m,n}) with root `root` that accepts exactly one
 * call (parallel: one or more) in the family's native syntax, to one of the
 * tools of tools_json (named != NULL: that one only), whose arguments are
 * the rule `<prefix>tN-root` for tool N: the rules the JSON-schema
 * converter (df_json_schema_to_grammar(schema, ..., prefix "<prefix>tN-"))
 * adds for that tool's parameters. Returns 0, or a negative DF_E* code with
 * err (no tools, an unknown named tool, a family without a call syntax). */
int df_toolcall_grammar(df_tc_family fam, const char *tools_json, const char *named, int parallel, const char *prefix,
                        df_buf *out, char *err, size_t errlen);

#endif
