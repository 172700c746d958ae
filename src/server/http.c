/* http.c - see http.h. libmicrohttpd does all HTTP parsing and framing
 * (keep-alive, chunked encoding, 100-continue); this file buffers bodies
 * under a limit, checks the API key, wraps responses, and frees each request
 * once both the library and any stream it owns are done with it (a small
 * reference count: a stream can outlive the library's completion notice). */
#include "server/http.h"

#include <microhttpd.h>

#include <jansson.h>
#include <netdb.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "util/util.h"

struct df_http_server {
    struct MHD_Daemon *d;
    df_http_config cfg;
    char *api_key;
    int port;
};

struct df_http_req {
    df_http_server *srv;
    struct MHD_Connection *c;
    char method[16];
    char *path;
    char *body;     /* NUL-terminated once complete */
    size_t len, cap;
    int too_big;    /* body over max_body: drained, then 413 */
    int oom;
    int answered;   /* a response was queued (or the request was dropped) */
    int drop;       /* answer by closing the connection */
    int status;
    double t0;
    atomic_int refs; /* the library's hold + one per live stream */
};

/* Most bytes beyond --max-request-bytes read and discarded before a 413. */
#define DRAIN_MAX ((unsigned long long)1 << 30)

static void req_unref(df_http_req *r) {
    if (atomic_fetch_sub(&r->refs, 1) != 1) return;
    free(r->path);
    free(r->body);
    free(r);
}

/* ---- helpers ------------------------------------------------------------ */

/* Constant-time comparison of a given token with the (non-empty) key: the
 * time depends on the given length only, never on where they differ. */
static int ct_equal(const char *key, const char *given) {
    size_t lk = strlen(key), lg = strlen(given);
    unsigned d = lk != lg;
    for (size_t i = 0; i < lg; i++) d |= (unsigned char)(given[i] ^ key[i % lk]);
    return d == 0;
}

char *df_http_error_body(const char *type, const char *param, const char *code, const char *message) {
    json_t *e = json_object();
    json_object_set_new(e, "message", json_string(message ? message : ""));
    json_object_set_new(e, "type", json_string(type ? type : "invalid_request_error"));
    json_object_set_new(e, "param", param ? json_string(param) : json_null());
    json_object_set_new(e, "code", code ? json_string(code) : json_null());
    /* json_string returns NULL for invalid UTF-8; set_new then fails and the
     * key is absent: keep the four keys no matter what. */
    if (!json_object_get(e, "message")) json_object_set_new(e, "message", json_string("(message not valid UTF-8)"));
    if (!json_object_get(e, "param")) json_object_set_new(e, "param", json_null());
    if (!json_object_get(e, "code")) json_object_set_new(e, "code", json_null());
    json_t *root = json_object();
    json_object_set_new(root, "error", e);
    char *s = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    return s;
}

/* ---- answers ------------------------------------------------------------ */

static int queue(df_http_req *r, int status, struct MHD_Response *resp) {
    if (!resp) return -1;
    enum MHD_Result ok = MHD_queue_response(r->c, (unsigned)status, resp);
    MHD_destroy_response(resp);
    if (ok != MHD_YES) { r->drop = 1; r->answered = 1; return -1; }
    r->answered = 1;
    r->status = status;
    return 0;
}

int df_http_respond(df_http_req *r, int status, const char *content_type, const char *body, size_t len,
                    const char *extra_name, const char *extra_value) {
    if (r->answered) return -1;
    struct MHD_Response *resp = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!resp) { r->drop = 1; r->answered = 1; return -1; }
    if (content_type) MHD_add_response_header(resp, "Content-Type", content_type);
    if (extra_name && extra_value) MHD_add_response_header(resp, extra_name, extra_value);
    return queue(r, status, resp);
}

int df_http_respond_error(df_http_req *r, int status, const char *type, const char *param, const char *code,
                          const char *message) {
    char *b = df_http_error_body(type, param, code, message);
    if (!b) { df_http_drop(r); return -1; }
    int rc = df_http_respond(r, status, "application/json", b, strlen(b), NULL, NULL);
    free(b);
    return rc;
}

typedef struct {
    df_http_req *req;
    df_http_stream_fn fn;
    df_http_stream_done done;
    void *ctx;
    int complete, finished;
} stream;

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    stream *st = cls;
    if (st->finished) return MHD_CONTENT_READER_END_WITH_ERROR;
    ssize_t n = st->fn(st->ctx, buf, max);
    if (n > 0) return n;
    st->finished = 1;
    if (n == 0) { st->complete = 1; return MHD_CONTENT_READER_END_OF_STREAM; }
    return MHD_CONTENT_READER_END_WITH_ERROR;
}

static void stream_free(void *cls) {
    stream *st = cls;
    st->done(st->ctx, st->complete);
    req_unref(st->req);
    free(st);
}

int df_http_respond_stream(df_http_req *r, int status, const char *content_type, df_http_stream_fn fn,
                           df_http_stream_done done, void *ctx) {
    stream *st = r->answered ? NULL : calloc(1, sizeof *st);
    if (!st) { done(ctx, 0); df_http_drop(r); return -1; }
    st->req = r;
    st->fn = fn;
    st->done = done;
    st->ctx = ctx;
    atomic_fetch_add(&r->refs, 1);
    struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 32 * 1024, stream_read, st, stream_free);
    if (!resp) { stream_free(st); df_http_drop(r); return -1; }
    MHD_add_response_header(resp, "Content-Type", content_type);
    MHD_add_response_header(resp, "Cache-Control", "no-cache");
    MHD_add_response_header(resp, "X-Accel-Buffering", "no");
    return queue(r, status, resp); /* destroying our handle frees st later, or now on failure */
}

void df_http_drop(df_http_req *r) {
    r->drop = 1;
    r->answered = 1;
    r->status = 499; /* nginx's "client closed request", for the log only */
}

/* ---- the request -------------------------------------------------------- */

const char *df_http_method(const df_http_req *r) { return r->method; }
const char *df_http_path(const df_http_req *r) { return r->path; }
const char *df_http_body(const df_http_req *r, size_t *len) {
    if (len) *len = r->len;
    return r->body ? r->body : "";
}
const char *df_http_header(const df_http_req *r, const char *name) {
    return MHD_lookup_connection_value(r->c, MHD_HEADER_KIND, name);
}

int df_http_peer_closed(const df_http_req *r) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(r->c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return 1;
    /* POLLRDHUP: the peer shut down its side (closed the socket). Pending
     * readable data (a pipelined request) is not a close. */
    struct pollfd p = {.fd = ci->connect_fd, .events = POLLRDHUP};
    if (poll(&p, 1, 0) < 0) return 0;
    return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

/* ---- the library's callbacks ------------------------------------------- */

static int needs_auth(const df_http_req *r) {
    return r->srv->api_key && strcmp(r->path, "/health") != 0;
}

static int authorized(const df_http_req *r) {
    const char *h = df_http_header(r, "Authorization");
    if (!h || strncasecmp(h, "Bearer ", 7)) return 0;
    h += 7;
    while (*h == ' ') h++;
    return ct_equal(r->srv->api_key, h);
}

static void too_large(df_http_req *r) {
    char msg[160];
    snprintf(msg, sizeof msg, "Request body too large: the limit is %zu bytes (--max-request-bytes).", r->srv->cfg.max_body);
    df_http_respond_error(r, 413, "invalid_request_error", NULL, "request_too_large", msg);
}

/* Called by the library for each request: first with the headers, then with
 * each piece of body, then once with *upload_data_size == 0 at the end. */
static enum MHD_Result on_access(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                 const char *version, const char *upload_data, size_t *upload_data_size,
                                 void **con_cls) {
    (void)version;
    df_http_server *s = cls;
    df_http_req *r = *con_cls;
    if (!r) {
        r = calloc(1, sizeof *r);
        if (!r) return MHD_NO;
        atomic_init(&r->refs, 1);
        r->srv = s;
        r->c = c;
        r->t0 = df_now();
        snprintf(r->method, sizeof r->method, "%s", method);
        size_t ul = strcspn(url, "?");
        r->path = malloc(ul + 1);
        if (!r->path) { free(r); return MHD_NO; }
        memcpy(r->path, url, ul);
        r->path[ul] = 0;
        *con_cls = r;
        if (needs_auth(r) && !authorized(r)) {
            df_http_respond_error(r, 401, "invalid_request_error", NULL, "invalid_api_key",
                                  "Incorrect API key provided. Send it as 'Authorization: Bearer KEY'.");
            return r->drop ? MHD_NO : MHD_YES;
        }
        const char *cl = df_http_header(r, "Content-Length");
        if (cl) {
            char *end;
            unsigned long long n = strtoull(cl, &end, 10);
            /* Over the limit: read and discard the body, then answer 413 (a
             * client still sending would otherwise see a broken pipe instead
             * of the answer); absurd sizes are answered at once and closed. */
            if (end != cl && n > s->cfg.max_body) {
                r->too_big = 1;
                if (n - s->cfg.max_body > DRAIN_MAX) { too_large(r); return r->drop ? MHD_NO : MHD_YES; }
            }
        }
        return MHD_YES;
    }
    if (r->answered) { /* answered early (401/413): discard the rest */
        *upload_data_size = 0;
        return r->drop ? MHD_NO : MHD_YES;
    }
    if (*upload_data_size) {
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        if (r->too_big || r->oom) return MHD_YES;
        if (n > s->cfg.max_body - r->len) {
            r->too_big = 1;
            free(r->body);
            r->body = NULL;
            r->len = r->cap = 0;
            return MHD_YES;
        }
        if (r->len + n + 1 > r->cap) {
            size_t cap = r->cap ? r->cap : 4096;
            while (cap < r->len + n + 1) cap *= 2;
            char *p = realloc(r->body, cap);
            if (!p) { r->oom = 1; return MHD_YES; }
            r->body = p;
            r->cap = cap;
        }
        memcpy(r->body + r->len, upload_data, n);
        r->len += n;
        r->body[r->len] = 0;
        return MHD_YES;
    }
    if (r->too_big) too_large(r);
    else if (r->oom) df_http_respond_error(r, 503, "server_error", NULL, "out_of_memory", "The server ran out of memory reading the request.");
    else {
        s->cfg.handler(s->cfg.app, r);
        if (!r->answered) df_http_respond_error(r, 500, "server_error", NULL, NULL, "The request was not answered.");
    }
    return r->drop ? MHD_NO : MHD_YES;
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)c;
    df_http_server *s = cls;
    df_http_req *r = *con_cls;
    if (!r) return;
    *con_cls = NULL;
    if (!s->cfg.quiet) {
        const char *how = toe == MHD_REQUEST_TERMINATED_COMPLETED_OK ? "" : " (connection closed early)";
        fprintf(stderr, "deltafin serve: %s %s -> %d in %.1f ms%s\n", r->method, r->path, r->status,
                (df_now() - r->t0) * 1e3, how);
    }
    req_unref(r);
}

/* ---- the server --------------------------------------------------------- */

df_http_server *df_http_start(const df_http_config *cfg, char *err, size_t errlen) {
    df_http_server *s = calloc(1, sizeof *s);
    if (!s) { df_err(err, errlen, -5, "out of memory"); return NULL; }
    s->cfg = *cfg;
    if (cfg->api_key && *cfg->api_key) s->api_key = strdup(cfg->api_key);
    const char *host = cfg->host && *cfg->host ? cfg->host : "127.0.0.1";
    char port[16];
    snprintf(port, sizeof port, "%d", cfg->port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *ai = NULL;
    int g = getaddrinfo(host, port, &hints, &ai);
    if (g || !ai) {
        df_err(err, errlen, -1, "--host %s: %s", host, g ? gai_strerror(g) : "no address");
        free(s->api_key);
        free(s);
        return NULL;
    }
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL;
    if (!cfg->quiet) flags |= MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    size_t mem = cfg->header_bytes ? cfg->header_bytes : 64 * 1024;
    s->d = MHD_start_daemon(flags, 0, NULL, NULL, on_access, s,
                            MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                            MHD_OPTION_CONNECTION_MEMORY_LIMIT, mem,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)(cfg->max_connections > 0 ? cfg->max_connections : 256),
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)600,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                            MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!s->d) {
        df_err(err, errlen, -4, "cannot listen on %s port %d (in use, or not an address of this machine?)", host, cfg->port);
        free(s->api_key);
        free(s);
        return NULL;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : cfg->port;
    return s;
}

int df_http_port(const df_http_server *s) { return s->port; }

void df_http_stop(df_http_server *s) {
    if (!s) return;
    MHD_stop_daemon(s->d);
    free(s->api_key);
    free(s);
}
