/* queue.c - the turn at the engine (see oai_int.h): one holder at a time,
 * the others wait in arrival order, at most qmax of them.
 *
 * Invariants:
 *   - only the holder (df_turn_acquire returned TURN_OK, until
 *     df_turn_release) calls the engine or touches the session;
 *   - waiters are served first come, first served; one that disconnects or
 *     is stopped leaves the queue and wakes the others.
 */
#include "server/oai_int.h"

#include <time.h>

void df_turn_init(df_turn *t, int qmax) {
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cv, NULL);
    t->running = t->n_waiting = 0;
    t->qmax = qmax < 0 ? 0 : qmax;
    t->head = t->tail = NULL;
    atomic_init(&t->stopping, 0);
}

void df_turn_destroy(df_turn *t) {
    pthread_mutex_destroy(&t->mu);
    pthread_cond_destroy(&t->cv);
}

int df_turn_acquire(df_turn *t, df_http_req *r) {
    pthread_mutex_lock(&t->mu);
    if (atomic_load(&t->stopping)) { pthread_mutex_unlock(&t->mu); return TURN_STOP; }
    if (!t->running && !t->head) {
        t->running = 1;
        pthread_mutex_unlock(&t->mu);
        return TURN_OK;
    }
    if (t->n_waiting >= t->qmax) { pthread_mutex_unlock(&t->mu); return TURN_FULL; }
    df_waiter w = {0};
    if (t->tail) t->tail->next = &w; else t->head = &w;
    t->tail = &w;
    t->n_waiting++;
    int res = TURN_OK;
    for (;;) {
        if (t->head == &w && !t->running) break;
        if (atomic_load(&t->stopping)) { res = TURN_STOP; break; }
        if (r && df_http_peer_closed(r)) { res = TURN_GONE; break; }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 50 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
        pthread_cond_timedwait(&t->cv, &t->mu, &ts);
    }
    df_waiter **pp = &t->head, *prev = NULL;
    while (*pp != &w) { prev = *pp; pp = &(*pp)->next; }
    *pp = w.next;
    if (t->tail == &w) t->tail = prev;
    t->n_waiting--;
    if (res == TURN_OK) t->running = 1;
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
    return res;
}

void df_turn_release(df_turn *t) {
    pthread_mutex_lock(&t->mu);
    t->running = 0;
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
}

void df_turn_stop(df_turn *t) {
    atomic_store(&t->stopping, 1);
    pthread_mutex_lock(&t->mu);
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
}

int df_turn_stopping(df_turn *t) { return atomic_load(&t->stopping); }
