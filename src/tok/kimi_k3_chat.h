/* kimi_k3_chat.h - Kimi K3's chat format ("XTML"), which K3 builds with a
 * Python program (encoding_k3.py) instead of a Jinja template.
 *
 *   <|open|>message role="user"<|sep|>...<|close|>message<|sep|><|end_of_msg|>
 *
 * A prompt is a list of segments: structure (the four tokens <|open|>,
 * <|close|>, <|sep|>, <|end_of_msg|>, matched as special tokens) and text
 * (tag names, attributes, content: encoded with special tokens NOT matched,
 * so a user who writes "<|open|>" cannot forge structure). Each segment is
 * encoded on its own, as the vendor tokenizer's _encode_chat_segments does,
 * so the ids depend on the segment borders, not only on the text.
 *
 * Invariants: rendering is a pure function of its JSON inputs; every error is
 * DF_EINPUT (or DF_ENOMEM) with a one-line message naming the field; nothing
 * here exits, aborts or prints. Output is bounded by the input's size times a
 * constant (no loops the input can multiply). */
#ifndef DF_TOK_KIMI_K3_CHAT_H
#define DF_TOK_KIMI_K3_CHAT_H

#include <stddef.h>
#include <stdint.h>

struct df_tokenizer;

typedef struct {
    size_t off, len; /* bytes of the prompt text */
    int special;     /* 1: structure, special tokens matched; 0: text */
} df_k3_seg;

typedef struct {
    char *text; /* the whole prompt, NUL-terminated (malloc'd) */
    size_t len;
    df_k3_seg *seg; /* in order; they tile text exactly (malloc'd) */
    size_t n_seg;
} df_k3_prompt;

/* Renders a conversation as the vendor tokenizer's apply_chat_template does.
 * messages_json: a JSON array of OpenAI-style messages (role, content as a
 * string or a list of {type, text} parts, name, reasoning_content or
 * reasoning, tool_calls with arguments as an object or a JSON string,
 * tool_call_id / tool / name on tool results, tools on a system message).
 * tools_json: the OpenAI tools array, or NULL / "null" for none.
 * options_json (NULL = {}): {"thinking": bool (default true),
 * "thinking_effort": "low" | "high" | "max" | null (default "max", as the
 * vendor's apply_chat_template; null leaves the message out), "tool_choice":
 * "required" | "none" | ..., "response_format": {...}}. Unknown option keys
 * are ignored. Returns 0 and fills *out, or DF_EINPUT / DF_ENOMEM with err. */
int df_k3_chat_render(const char *messages_json, const char *tools_json, int add_generation_prompt,
                      const char *options_json, df_k3_prompt *out, char *err, size_t errlen);
void df_k3_prompt_free(df_k3_prompt *p);

/* Token ids of a rendered prompt: every segment encoded alone (structure with
 * special tokens, text without), concatenated. *ids is malloc'd. */
int df_k3_prompt_encode(const struct df_tokenizer *t, const df_k3_prompt *p, int n_threads, int32_t **ids,
                        size_t *n, char *err, size_t errlen);

/* 1 if dir/config.json says "model_type": "kimi_k3", else 0 (also when the
 * file is missing or unreadable). */
int df_k3_is_model_dir(const char *dir);

#endif
