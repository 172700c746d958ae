/* fuzz_openai_request.c - libFuzzer target for the OpenAI request validator
 * (df_oai_parse): any bytes must give either a validated request or an
 * OpenAI-shaped 4xx error, never a crash, leak or undefined behaviour.
 * The first byte picks the validator (chat, completions, and the two that
 * turn their bodies into chat requests: the Anthropic Messages API and the
 * OpenAI Responses API); the rest is the request body. Build and run: make fuzz (clang, libFuzzer + ASan/UBSan). */
#include "server/oai_int.h"

#include <stdint.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int which = data[0] & 3;
    df_oai_kind kind = which == 1 ? DF_OAI_COMPLETIONS : DF_OAI_CHAT;
    df_oai_limits lim = {.model_id = "m", .vocab_size = 1000, .max_tokens = 4096};
    df_oai_request r;
    df_oai_error e;
    json_t *echo = NULL;
    const char *body = (const char *)data + 1;
    int rc = which < 2 ? df_oai_parse(kind, &lim, body, size - 1, &r, &e)
           : which == 2 ? df_anth_parse(data[0] & 4, &lim, body, size - 1, &r, &e)
                        : df_resp_parse(&lim, body, size - 1, &r, &echo, &e);
    json_decref(echo);
    if (rc == 0) {
        /* A validated request is internally consistent. */
        if (r.n_stop < 0 || r.n_stop > DF_OAI_MAX_STOP) __builtin_trap();
        if (r.top_logprobs < 0 || r.top_logprobs > DF_OAI_MAX_TOP_LOGPROBS) __builtin_trap();
        if (r.max_tokens == 0 || r.max_tokens > lim.max_tokens) __builtin_trap();
        if (kind == DF_OAI_CHAT && !r.messages_json) __builtin_trap();
        if (kind == DF_OAI_COMPLETIONS && !r.prompt && !r.prompt_ids) __builtin_trap();
        for (size_t i = 0; i < r.n_prompt_ids; i++)
            if (r.prompt_ids[i] < 0 || r.prompt_ids[i] >= lim.vocab_size) __builtin_trap();
        (void)df_oai_deterministic(&r);
        df_oai_request_free(&r);
    } else {
        if (e.status < 400 || e.status > 599 || !e.message[0] || strlen(e.type) == 0) __builtin_trap();
    }
    return 0;
}
