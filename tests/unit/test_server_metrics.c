/* test_server_metrics.c - metrics.c on its own: the outcome of each status,
 * routes folded onto the fixed list, histogram buckets cumulative with the
 * +Inf bucket equal to _count, counters summed across threads. */
#include "server/metrics.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fails;
#define CHECK(c) do { if (!(c)) { fprintf(stderr, "%s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #c); fails++; } } while (0)

/* The value of the sample line that starts with prefix (followed by a space), or -1. */
static double sample(const char *text, const char *prefix) {
    size_t n = strlen(prefix);
    for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        if (!strncmp(p, prefix, n) && p[n] == ' ') return atof(p + n + 1);
    return -1;
}

static void *hammer(void *m) {
    for (int i = 0; i < 1000; i++) {
        df_metrics_request(m, "/v1/completions", 200, 1);
        df_metrics_token_gap(m, 0.003);
    }
    return NULL;
}

int main(void) {
    CHECK(!strcmp(df_metrics_outcome(200), "ok"));
    CHECK(!strcmp(df_metrics_outcome(302), "ok"));
    CHECK(!strcmp(df_metrics_outcome(400), "bad_request"));
    CHECK(!strcmp(df_metrics_outcome(401), "unauthorized"));
    CHECK(!strcmp(df_metrics_outcome(413), "payload_too_large"));
    CHECK(!strcmp(df_metrics_outcome(418), "client_error"));
    CHECK(!strcmp(df_metrics_outcome(429), "rate_limited"));
    CHECK(!strcmp(df_metrics_outcome(499), "cancelled"));
    CHECK(!strcmp(df_metrics_outcome(0), "cancelled"));
    CHECK(!strcmp(df_metrics_outcome(503), "server_error"));

    df_metrics *m = df_metrics_new("tiny");
    CHECK(m != NULL);
    df_metrics_request(m, "/v1/chat/completions", 200, 1);
    df_metrics_request(m, "/v1/chat/completions", 200, 0); /* connection closed before the end: cancelled */
    df_metrics_request(m, "/v1/models/anything", 404, 1);  /* folded onto /v1/models */
    df_metrics_request(m, "/random/path/1", 404, 1);       /* other */
    df_metrics_request(m, "/random/path/2", 404, 1);
    df_metrics_ttft(m, 0.004);  /* le 0.005 */
    df_metrics_ttft(m, 0.3);    /* le 0.5 */
    df_metrics_ttft(m, 1000.0); /* +Inf only */
    pthread_t t[4];
    for (int i = 0; i < 4; i++) pthread_create(&t[i], NULL, hammer, m);
    for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
    df_metrics_generation(m, 10, 4, 7, 3, 2);
    size_t len;
    char *s = df_metrics_render(m, 2, 1, &len);
    CHECK(s && strlen(s) == len);
    CHECK(sample(s, "deltafin_requests_total{route=\"/v1/chat/completions\",outcome=\"ok\"}") == 1);
    CHECK(sample(s, "deltafin_requests_total{route=\"/v1/chat/completions\",outcome=\"cancelled\"}") == 1);
    CHECK(sample(s, "deltafin_requests_total{route=\"/v1/models\",outcome=\"not_found\"}") == 1);
    CHECK(sample(s, "deltafin_requests_total{route=\"other\",outcome=\"not_found\"}") == 2);
    CHECK(sample(s, "deltafin_requests_total{route=\"/v1/completions\",outcome=\"ok\"}") == 4000);
    CHECK(sample(s, "deltafin_time_to_first_token_seconds_bucket{le=\"0.005\"}") == 1);
    CHECK(sample(s, "deltafin_time_to_first_token_seconds_bucket{le=\"0.25\"}") == 1);
    CHECK(sample(s, "deltafin_time_to_first_token_seconds_bucket{le=\"0.5\"}") == 2);
    CHECK(sample(s, "deltafin_time_to_first_token_seconds_bucket{le=\"120\"}") == 2);
    CHECK(sample(s, "deltafin_time_to_first_token_seconds_bucket{le=\"+Inf\"}") == 3);
    CHECK(sample(s, "deltafin_time_to_first_token_seconds_count") == 3);
    CHECK(sample(s, "deltafin_inter_token_latency_seconds_bucket{le=\"0.0025\"}") == 0);
    CHECK(sample(s, "deltafin_inter_token_latency_seconds_bucket{le=\"0.005\"}") == 4000);
    CHECK(sample(s, "deltafin_inter_token_latency_seconds_count") == 4000);
    CHECK(sample(s, "deltafin_prompt_tokens_total") == 10 && sample(s, "deltafin_prompt_tokens_cached_total") == 4);
    CHECK(sample(s, "deltafin_completion_tokens_total") == 7);
    CHECK(sample(s, "deltafin_spec_drafted_tokens_total") == 3 && sample(s, "deltafin_spec_accepted_tokens_total") == 2);
    CHECK(sample(s, "deltafin_queue_waiting") == 2 && sample(s, "deltafin_generation_running") == 1);
    CHECK(strstr(s, "# TYPE deltafin_requests_total counter\n") != NULL);
    CHECK(strstr(s, "# TYPE deltafin_time_to_first_token_seconds histogram\n") != NULL);
    free(s);
    df_metrics_free(m);
    if (fails) { fprintf(stderr, "%d check(s) failed\n", fails); return 1; }
    printf("test_server_metrics: ok\n");
    return 0;
}
