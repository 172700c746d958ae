/* http.h - a small HTTP/1.1 server on libmicrohttpd for the OpenAI routes.
 *
 * One thread per connection (keep-alive connections keep theirs), so a
 * handler may block: waiting for its turn at the engine, running a whole
 * generation, or producing a stream chunk by chunk. The layer owns
 * everything about HTTP and nothing about OpenAI semantics except the error
 * body shape, which every 4xx it produces itself (401, 413)
 * shares with the application:
 *   {"error": {"message", "type", "param", "code"}},
 * or on the Anthropic paths (/v1/messages, /v1/messages/...)
 *   {"type": "error", "error": {"type", "message"}}, the type from the status.
 *
 * Invariants:
 *   - the handler sees a request only once its whole body has arrived and is
 *     within max_body bytes (NUL-terminated, so text parsers can use it);
 *   - a body over max_body is answered 413 without being buffered: it is
 *     read and discarded first (so the client, still sending, sees the
 *     answer), unless Content-Length exceeds the limit by over 64 MiB, which
 *     is answered at once and the connection closed;
 *   - with api_key set, every path but /health needs "Authorization: Bearer
 *     KEY" or "x-api-key: KEY" (compared in constant time) before any body
 *     byte is buffered;
 *   - request headers larger than header_bytes are refused by the library
 *     (431) before the handler runs;
 *   - framing is unambiguous or refused before any body byte is read: two
 *     Content-Length headers, or Content-Length with Transfer-Encoding, get
 *     400; a Transfer-Encoding other than "chunked" gets 501; each of these
 *     answers closes the connection;
 *   - no connection can hold a slot by being slow (a watchdog thread shuts
 *     such sockets down): a new connection's request headers must be
 *     complete within header_timeout seconds; a keep-alive connection may
 *     wait idle_timeout seconds for its next request; a body must arrive at
 *     body_min_rate bytes/s after a grace of header_timeout seconds; while
 *     more than half of max_connections are open, waiting connections (no
 *     request under way) get BUSY_TIMEOUT seconds, and while more than 7/8
 *     are open the oldest waiting ones are closed at once, so a new client
 *     always finds a slot; a connection whose request is being answered is
 *     never cut by the watchdog;
 *   - at most max_per_ip connections per client address (the library
 *     refuses more);
 *   - after a request whose body was 1 MiB or more, freed memory is handed
 *     back to the system (malloc_trim);
 *   - a handler answers each request exactly once: df_http_respond*,
 *     df_http_respond_stream or df_http_drop.
 */
#ifndef DF_SERVER_HTTP_H
#define DF_SERVER_HTTP_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct df_http_server df_http_server;
typedef struct df_http_req df_http_req;

/* Called in the connection's thread with a complete request. */
typedef void (*df_http_handler)(void *app, df_http_req *req);

typedef struct {
    const char *host;     /* numeric address or name; NULL: 127.0.0.1 */
    int port;             /* 0: any free port (see df_http_port) */
    size_t max_body;      /* bytes; larger bodies get 413 */
    size_t header_bytes;  /* per-connection memory for headers + buffers */
    const char *api_key;  /* NULL or "": no authentication */
    int max_connections;  /* 0: 256 */
    int max_per_ip;       /* connections per client address; 0: no limit */
    double header_timeout;  /* seconds; 0: 10 */
    double idle_timeout;    /* keep-alive seconds between requests; 0: 30 */
    double body_min_rate;   /* bytes/s after header_timeout; 0: no rate check */
    int quiet;            /* 1: no per-request log line on stderr */
    df_http_handler handler;
    void *app;
    /* NULL, or called once per request when the library is done with it (in
     * the connection's thread): the path, the status answered (499: dropped
     * without an answer), complete = 0 when the connection closed before the
     * answer was sent in full. For counters (GET /metrics). */
    void (*on_done)(void *app, const char *path, int status, int complete);
} df_http_config;

/* Binds and starts serving. Returns NULL and fills err on failure. */
df_http_server *df_http_start(const df_http_config *cfg, char *err, size_t errlen);
/* Stops accepting, waits for the connection threads, frees. */
void df_http_stop(df_http_server *s);
int df_http_port(const df_http_server *s);

/* ---- the request -------------------------------------------------------- */

const char *df_http_method(const df_http_req *r);
const char *df_http_path(const df_http_req *r); /* without the query string */
const char *df_http_body(const df_http_req *r, size_t *len);
/* A request header's value, or NULL. */
const char *df_http_header(const df_http_req *r, const char *name);
/* 1 when the client has closed its end (or the socket failed): the caller
 * should stop working for it. Cheap (one poll with zero timeout). */
int df_http_peer_closed(const df_http_req *r);

/* ---- answers (exactly one per request) ---------------------------------- */

/* A complete response; body is copied. extra_name/extra_value: one more
 * header (e.g. Retry-After), or NULLs. Returns 0, or -1 if it could not be
 * queued (the connection is closed). */
int df_http_respond(df_http_req *r, int status, const char *content_type, const char *body, size_t len,
                    const char *extra_name, const char *extra_value);
/* The OpenAI error shape: {"error": {"message", "type", "param", "code"}};
 * param and code may be NULL (sent as null). */
int df_http_respond_error(df_http_req *r, int status, const char *type, const char *param, const char *code,
                          const char *message);
/* Builds that body (malloc'd, compact JSON). On an Anthropic path
 * (df_http_anth_path) df_http_respond_error sends Anthropic's shape instead. */
char *df_http_error_body(const char *type, const char *param, const char *code, const char *message);
/* Anthropic's error body {"type": "error", "error": {"type", "message"}}
 * (malloc'd), the type from the status (df_http_anth_type: 400
 * invalid_request_error, 401 authentication_error, 403 permission_error,
 * 404 not_found_error, 413 request_too_large, 429 rate_limit_error, 529
 * overloaded_error, other 5xx api_error). */
char *df_http_anth_error_body(int status, const char *message);
const char *df_http_anth_type(int status);
/* 1 for /v1/messages and the paths under it. */
int df_http_anth_path(const char *path);

/* Fills buf with up to max bytes of the stream. Returns the number of
 * bytes (> 0), 0 at the clean end of the stream, or -1 to abort it (the
 * connection is then closed). Runs in the connection's thread and may
 * block; it is never called again after returning 0 or -1. */
typedef ssize_t (*df_http_stream_fn)(void *ctx, char *buf, size_t max);
/* Called exactly once when the stream is over for any reason (end, abort,
 * client gone, server stopping); complete: 1 if fn returned 0. */
typedef void (*df_http_stream_done)(void *ctx, int complete);
/* A chunked streaming response. On failure (-1) done(ctx, 0) has already
 * been called. */
int df_http_respond_stream(df_http_req *r, int status, const char *content_type, df_http_stream_fn fn,
                           df_http_stream_done done, void *ctx);
/* Closes the connection without an answer (the client is gone). */
void df_http_drop(df_http_req *r);

#endif
