/* http.c - see http.h. libmicrohttpd does all HTTP parsing and framing
 * (keep-alive, chunked encoding, 100-continue); this file buffers bodies
 * under a limit, checks the API key, wraps responses, and frees each request
 * once both the library and any stream it owns are done with it (a small
 * reference count: a stream can outlive the library's completion notice). */
#include "server/http.h"

#include <microhttpd.h>

#include <errno.h>
#include <jansson.h>
#include <malloc.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>

#include "util/util.h"

/* One TCP connection as the watchdog sees it. */
enum { C_HEADERS, C_BODY, C_ACTIVE, C_IDLE };
typedef struct conn {
    struct conn *prev, *next;
    int fd;
    int state;
    double since;       /* start of the state */
    size_t body_bytes;  /* C_BODY: received so far */
    int cut;            /* shut down by the watchdog */
} conn;

struct df_http_server {
    struct MHD_Daemon *d;
    df_http_config cfg;
    char *api_key;
    int port;
    /* the watchdog: connections (oldest first) and the thread that cuts slow ones */
    pthread_mutex_t cmu;
    pthread_cond_t ccv;
    conn *chead, *ctail;
    int n_conns, wd_stop, wd_started;
    pthread_t wd;
    long cut_headers, cut_idle, cut_body, cut_full; /* since the last log line */
    pthread_mutex_t lmu; /* the library's messages: one a second at most */
    double log_last;
    long log_dropped;
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
    int trim;       /* the body reached TRIM_BYTES: malloc_trim when freed */
    int answered;   /* a response was queued (or the request was dropped) */
    int drop;       /* answer by closing the connection */
    int status;
    double t0;
    conn *conn;      /* the watchdog's record of the connection, or NULL */
    atomic_int refs; /* the library's hold + one per live stream */
};

/* Most bytes beyond --max-request-bytes read and discarded before a 413. */
#define DRAIN_MAX ((unsigned long long)64 << 20)
/* Seconds a waiting connection (no request under way) may stay open while
 * more than half of the connection slots are taken. */
#define BUSY_TIMEOUT 2.0
/* Bodies at least this large are followed by malloc_trim. */
#define TRIM_BYTES ((size_t)1 << 20)

static void req_unref(df_http_req *r) {
    if (atomic_fetch_sub(&r->refs, 1) != 1) return;
    int trim = r->trim;
    free(r->path);
    free(r->body);
    free(r);
    /* a big body, and what the handler made from it, are freed by now: hand
     * the memory back instead of leaving it in the allocator's arenas */
    if (trim) malloc_trim(0);
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

const char *df_http_anth_type(int status) {
    switch (status) {
    case 400: return "invalid_request_error";
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 529: return "overloaded_error";
    default: return status >= 500 ? "api_error" : "invalid_request_error";
    }
}

char *df_http_anth_error_body(int status, const char *message) {
    json_t *e = json_object();
    json_object_set_new(e, "type", json_string(df_http_anth_type(status)));
    json_object_set_new(e, "message", json_string(message ? message : ""));
    if (!json_object_get(e, "message")) json_object_set_new(e, "message", json_string("(message not valid UTF-8)"));
    json_t *root = json_object();
    json_object_set_new(root, "type", json_string("error"));
    json_object_set_new(root, "error", e);
    char *s = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    return s;
}

int df_http_anth_path(const char *path) {
    return path && !strncmp(path, "/v1/messages", 12) && (!path[12] || path[12] == '/');
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
    char *b = df_http_anth_path(r->path) ? df_http_anth_error_body(status, message)
                                         : df_http_error_body(type, param, code, message);
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

/* ---- the watchdog ---------------------------------------------------------
 *
 * The library's own timeout counts inactivity, so a client that sends one
 * byte every few seconds would hold its connection (and thread) forever.
 * Connection start/close notices keep a list of open connections with the
 * state each is in; the request callbacks move them between states; a
 * thread sweeps the list a few times a second and shuts down (shutdown(2),
 * under the list's lock: a closing connection leaves the list before its
 * socket is closed) those that are too slow. The connection's own thread
 * then sees end-of-file and closes it the ordinary way. */

static void conn_state(df_http_server *s, conn *k, int state) {
    if (!k) return;
    pthread_mutex_lock(&s->cmu);
    k->state = state;
    k->since = df_now();
    k->body_bytes = 0;
    pthread_mutex_unlock(&s->cmu);
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe) {
    df_http_server *s = cls;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        conn *k = ci ? calloc(1, sizeof *k) : NULL;
        if (!k) return; /* unwatched, still bounded by the library's timeout */
        k->fd = ci->connect_fd;
        k->state = C_HEADERS;
        k->since = df_now();
        pthread_mutex_lock(&s->cmu);
        k->prev = s->ctail;
        if (s->ctail) s->ctail->next = k; else s->chead = k;
        s->ctail = k;
        s->n_conns++;
        if (s->n_conns * 8 > s->cfg.max_connections * 7) pthread_cond_signal(&s->ccv); /* nearly full: sweep now */
        pthread_mutex_unlock(&s->cmu);
        *socket_context = k;
    } else if (toe == MHD_CONNECTION_NOTIFY_CLOSED) {
        conn *k = *socket_context;
        if (!k) return;
        *socket_context = NULL;
        pthread_mutex_lock(&s->cmu);
        if (k->prev) k->prev->next = k->next; else s->chead = k->next;
        if (k->next) k->next->prev = k->prev; else s->ctail = k->prev;
        s->n_conns--;
        pthread_mutex_unlock(&s->cmu);
        free(k);
    }
}

static conn *conn_of(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

static void cut(conn *k, long *counter) {
    if (k->cut) return;
    k->cut = 1;
    shutdown(k->fd, SHUT_RDWR);
    (*counter)++;
}

/* One pass over the connections; needs cmu. */
static void sweep(df_http_server *s) {
    const df_http_config *cf = &s->cfg;
    double now = df_now();
    int busy = s->n_conns * 2 > cf->max_connections, full = s->n_conns * 8 > cf->max_connections * 7;
    double th = cf->header_timeout, ti = cf->idle_timeout;
    if (busy && th > BUSY_TIMEOUT) th = BUSY_TIMEOUT;
    if (busy && ti > BUSY_TIMEOUT) ti = BUSY_TIMEOUT;
    int over = full ? s->n_conns - cf->max_connections * 7 / 8 : 0; /* waiting connections to close, oldest first */
    for (conn *k = s->chead; k; k = k->next) {
        if (k->cut) continue;
        double age = now - k->since;
        if (k->state == C_HEADERS || k->state == C_IDLE) {
            if (over > 0 && age > 0.2) { cut(k, &s->cut_full); over--; }
            else if (k->state == C_HEADERS && age > th) cut(k, &s->cut_headers);
            else if (k->state == C_IDLE && age > ti) cut(k, &s->cut_idle);
        } else if (k->state == C_BODY && cf->body_min_rate > 0 && age > cf->header_timeout &&
                   (double)k->body_bytes < cf->body_min_rate * (age - cf->header_timeout)) {
            cut(k, &s->cut_body);
        }
    }
}

static void *watchdog(void *arg) {
    df_http_server *s = arg;
    double last_log = df_now();
    pthread_mutex_lock(&s->cmu);
    while (!s->wd_stop) {
        sweep(s);
        double now = df_now();
        long n = s->cut_headers + s->cut_idle + s->cut_body + s->cut_full;
        if (n && now - last_log >= 1.0) { /* one line a second at most, even under attack */
            if (!s->cfg.quiet)
                fprintf(stderr, "deltafin serve: closed %ld slow connection%s: %ld headers not complete in %g s, %ld idle over "
                                "the keep-alive timeout, %ld body slower than %g bytes/s, %ld waiting while the server was full "
                                "(%d open)\n", n, n == 1 ? "" : "s", s->cut_headers, s->cfg.header_timeout, s->cut_idle,
                        s->cut_body, s->cfg.body_min_rate, s->cut_full, s->n_conns);
            s->cut_headers = s->cut_idle = s->cut_body = s->cut_full = 0;
            last_log = now;
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 100 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
        pthread_cond_timedwait(&s->ccv, &s->cmu, &ts);
    }
    pthread_mutex_unlock(&s->cmu);
    return NULL;
}

/* The library's error messages (one per refused or broken connection) at
 * most one a second, so that a flood of connections cannot flood the log. */
static void on_log(void *cls, const char *fmt, va_list ap) {
    df_http_server *s = cls;
    char msg[300];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n && (msg[n - 1] == '\n' || msg[n - 1] == ' ')) msg[--n] = 0;
    pthread_mutex_lock(&s->lmu);
    double now = df_now();
    if (now - s->log_last >= 1.0) {
        if (s->log_dropped)
            fprintf(stderr, "deltafin serve: libmicrohttpd: %s (and %ld more messages in the last second)\n", msg, s->log_dropped);
        else
            fprintf(stderr, "deltafin serve: libmicrohttpd: %s\n", msg);
        s->log_last = now;
        s->log_dropped = 0;
    } else {
        s->log_dropped++;
    }
    pthread_mutex_unlock(&s->lmu);
}

/* ---- the library's callbacks ------------------------------------------- */

static int needs_auth(const df_http_req *r) {
    return r->srv->api_key && strcmp(r->path, "/health") != 0;
}

/* "Authorization: Bearer KEY" (OpenAI) or "x-api-key: KEY" (Anthropic). */
static int authorized(const df_http_req *r) {
    const char *x = df_http_header(r, "x-api-key");
    if (x && ct_equal(r->srv->api_key, x)) return 1;
    const char *h = df_http_header(r, "Authorization");
    if (!h || strncasecmp(h, "Bearer ", 7)) return 0;
    h += 7;
    while (*h == ' ') h++;
    return ct_equal(r->srv->api_key, h);
}

typedef struct {
    int n_cl, n_te;
    char te[96];
} framing;

static enum MHD_Result count_framing(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
    (void)kind;
    framing *f = cls;
    if (!strcasecmp(key, "Content-Length")) f->n_cl++;
    else if (!strcasecmp(key, "Transfer-Encoding")) {
        f->n_te++;
        snprintf(f->te, sizeof f->te, "%s", value ? value : "");
    }
    return MHD_YES;
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
        r->conn = conn_of(c);
        conn_state(s, r->conn, C_ACTIVE);
        framing f = {0};
        MHD_get_connection_values(c, MHD_HEADER_KIND, count_framing, &f);
        if (f.n_cl > 1 || (f.n_cl && f.n_te) || f.n_te > 1) {
            df_http_respond_error(r, 400, "invalid_request_error", NULL, "invalid_framing",
                                  f.n_cl > 1 ? "The request has more than one Content-Length header."
                                  : f.n_te > 1 ? "The request has more than one Transfer-Encoding header."
                                               : "The request has both Content-Length and Transfer-Encoding.");
            return r->drop ? MHD_NO : MHD_YES;
        }
        if (f.n_te && strcasecmp(f.te, "chunked")) {
            char msg[200];
            snprintf(msg, sizeof msg, "Transfer-Encoding '%.80s' is not supported: send the body as is, with Content-Length, or chunked.", f.te);
            df_http_respond_error(r, 501, "invalid_request_error", NULL, "unsupported_transfer_encoding", msg);
            return r->drop ? MHD_NO : MHD_YES;
        }
        if (needs_auth(r) && !authorized(r)) {
            df_http_respond_error(r, 401, "invalid_request_error", NULL, "invalid_api_key",
                                  "Incorrect API key provided. Send it as 'Authorization: Bearer KEY' or 'x-api-key: KEY'.");
            return r->drop ? MHD_NO : MHD_YES;
        }
        const char *cl = df_http_header(r, "Content-Length");
        if (cl) {
            char *end;
            unsigned long long n = strtoull(cl, &end, 10);
            /* Over the limit: read and discard the body, then answer 413 (a
             * client still sending would otherwise see a broken pipe instead
             * of the answer); absurd sizes are answered at once and closed. */
            if (end == cl || *end) {
                df_http_respond_error(r, 400, "invalid_request_error", NULL, "invalid_framing", "The Content-Length header is not a number.");
                return r->drop ? MHD_NO : MHD_YES;
            }
            if (n > s->cfg.max_body) {
                r->too_big = 1;
                if (n - s->cfg.max_body > DRAIN_MAX) { too_large(r); return r->drop ? MHD_NO : MHD_YES; }
            }
            if (n) conn_state(s, r->conn, C_BODY);
        } else if (f.n_te) {
            conn_state(s, r->conn, C_BODY);
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
        if (r->conn) {
            pthread_mutex_lock(&s->cmu);
            r->conn->body_bytes += n;
            pthread_mutex_unlock(&s->cmu);
        }
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
            if (cap >= TRIM_BYTES) r->trim = 1;
        }
        memcpy(r->body + r->len, upload_data, n);
        r->len += n;
        r->body[r->len] = 0;
        return MHD_YES;
    }
    conn_state(s, r->conn, C_ACTIVE);
    if (r->too_big) too_large(r);
    else if (r->oom) df_http_respond_error(r, 503, "server_error", NULL, "out_of_memory", "The server ran out of memory reading the request.");
    else {
        s->cfg.handler(s->cfg.app, r);
        if (!r->answered) df_http_respond_error(r, 500, "server_error", NULL, NULL, "The request was not answered.");
    }
    return r->drop ? MHD_NO : MHD_YES;
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    df_http_server *s = cls;
    df_http_req *r = *con_cls;
    if (!r) return;
    *con_cls = NULL;
    conn_state(s, conn_of(c), C_IDLE);
    if (s->cfg.on_done) s->cfg.on_done(s->cfg.app, r->path, r->status, toe == MHD_REQUEST_TERMINATED_COMPLETED_OK);
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
    if (s->cfg.max_connections <= 0) s->cfg.max_connections = 256;
    if (s->cfg.max_per_ip < 0) s->cfg.max_per_ip = 0;
    if (s->cfg.header_timeout <= 0) s->cfg.header_timeout = 10;
    if (s->cfg.idle_timeout <= 0) s->cfg.idle_timeout = 30;
    if (s->cfg.body_min_rate < 0) s->cfg.body_min_rate = 0;
    pthread_mutex_init(&s->cmu, NULL);
    pthread_cond_init(&s->ccv, NULL);
    pthread_mutex_init(&s->lmu, NULL);
    /* the library's inactivity timeout backs the watchdog up (and covers a
     * client that stops reading its answer) */
    double lib_timeout = s->cfg.idle_timeout > s->cfg.header_timeout ? s->cfg.idle_timeout : s->cfg.header_timeout;
    s->d = MHD_start_daemon(flags, 0, NULL, NULL, on_access, s,
                            MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                            MHD_OPTION_CONNECTION_MEMORY_LIMIT, mem,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)s->cfg.max_connections,
                            MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)s->cfg.max_per_ip,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)(lib_timeout + 1),
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                            MHD_OPTION_NOTIFY_CONNECTION, on_connection, s,
                            MHD_OPTION_EXTERNAL_LOGGER, on_log, s,
                            MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!s->d) {
        df_err(err, errlen, -4, "cannot listen on %s port %d (in use, or not an address of this machine?)", host, cfg->port);
        pthread_mutex_destroy(&s->cmu);
        pthread_cond_destroy(&s->ccv);
        pthread_mutex_destroy(&s->lmu);
        free(s->api_key);
        free(s);
        return NULL;
    }
    if (pthread_create(&s->wd, NULL, watchdog, s) == 0) s->wd_started = 1;
    else if (!cfg->quiet) fprintf(stderr, "deltafin serve: warning: cannot start the connection watchdog: slow clients are cut only by the %g s inactivity timeout\n", lib_timeout + 1);
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : cfg->port;
    return s;
}

int df_http_port(const df_http_server *s) { return s->port; }

void df_http_stop(df_http_server *s) {
    if (!s) return;
    if (s->wd_started) {
        pthread_mutex_lock(&s->cmu);
        s->wd_stop = 1;
        pthread_cond_signal(&s->ccv);
        pthread_mutex_unlock(&s->cmu);
        pthread_join(s->wd, NULL);
    }
    MHD_stop_daemon(s->d);
    pthread_mutex_destroy(&s->cmu);
    pthread_cond_destroy(&s->ccv);
    pthread_mutex_destroy(&s->lmu);
    free(s->api_key);
    free(s);
}
