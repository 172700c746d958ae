/* metrics.h - the server's counters for GET /metrics, in the Prometheus
 * text exposition format 0.0.4 (docs/SERVER.md lists every family).
 *
 * Invariants:
 *   - every update and the rendering take one mutex: connection threads
 *     update concurrently, /metrics reads a consistent picture;
 *   - labels come from fixed tables (the known routes, the outcome kinds,
 *     the tiers), never from request bytes, so the number of series is
 *     bounded whatever clients send;
 *   - the engine's own counters (expert cache, prefetch, GPU tiers) are
 *     copied in by the holder of the engine's turn (df_metrics_engine), so
 *     /metrics never reads the engine while a generation runs: they are as
 *     of the end of the last generation (or the server's start).
 */
#ifndef DF_SERVER_METRICS_H
#define DF_SERVER_METRICS_H

#include "deltafin.h"

#include <stddef.h>

typedef struct df_metrics df_metrics;

/* model_id: the served id, exported as a label of deltafin_build_info. */
df_metrics *df_metrics_new(const char *model_id);
void df_metrics_free(df_metrics *m);

/* One answered request: its path (mapped onto the known routes, the rest is
 * "other"), its HTTP status, and complete = 0 when the connection closed
 * before the answer was sent in full (counted as "cancelled"). */
void df_metrics_request(df_metrics *m, const char *path, int status, int complete);
/* The outcome label of a status: "ok", "bad_request", "unauthorized",
 * "not_found", "method_not_allowed", "payload_too_large", "rate_limited",
 * "client_error" (other 4xx), "server_error" (5xx), "cancelled" (499). */
const char *df_metrics_outcome(int status);
/* One generation the engine ran: prompt tokens (of them, cached ones reused
 * from the session), tokens generated, speculation's drafted/accepted. */
void df_metrics_generation(df_metrics *m, long prompt, long cached, long generated, long drafted, long accepted);
/* An answer given from the exact-response memo (no engine work). */
void df_metrics_memo_hit(df_metrics *m);
void df_metrics_ttft(df_metrics *m, double seconds);      /* request arrival -> first token chosen */
void df_metrics_token_gap(df_metrics *m, double seconds); /* between two tokens of one generation */
/* The engine's counters (call with the engine's turn held). */
void df_metrics_engine(df_metrics *m, const df_stats *st);

/* The exposition text (malloc'd, *len bytes), with the queue's state now:
 * waiting requests and whether a generation runs. NULL if out of memory. */
char *df_metrics_render(df_metrics *m, int queue_waiting, int running, size_t *len);

#define DF_METRICS_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

#endif
