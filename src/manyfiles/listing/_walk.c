/*
 * The tree walker: a pool of native threads (pthreads, no GIL) walking a directory tree.
 *
 * Each directory is opened with openat() relative to its parent's fd (O_NOFOLLOW unless
 * symlinks are followed) and read with getdents64 into the worker's own buffer, reused for
 * every directory.  d_type decides what is a directory; fstatat() is called only for
 * DT_UNKNOWN (sshfs, NFSv3, XFS ftype=0), for symlinks when following them, and fstat()
 * once per directory when following symlinks (cycle detection by st_dev/st_ino) or staying
 * on one filesystem.
 *
 * Scheduling: every worker owns a deque of directories; it pushes the subdirectories it
 * finds and pops the newest (depth-first: few open fds, warm caches), and an idle worker
 * steals the oldest directory of another worker (a big subtree).  A directory keeps its fd
 * open while children still have to open themselves relative to it (pre-order) or, in
 * post-order mode, until its whole subtree is finished; a reference count says when.
 *
 * What happens to the entries is the mode's business, and none creates a Python object
 * per entry while walking:
 *   count   counts per d_type                                      -> walk_count()
 *   write   formats paths (newline/NUL) or JSON lines into a per-worker buffer that is
 *           written to an fd in whole lines                         -> walk_write()
 *   events  copies each directory's entries into a recycled batch handed to the Python
 *           consumer: one GIL acquisition per directory             -> Walk (an iterator)
 *   remove  fastrm: unlinks every non-directory it lists (unlinkat relative to the directory's
 *           fd), and rmdirs each directory once everything below it is gone, on the thread
 *           that finished its last child (post-order)                -> remove_tree(), in
 *           _remove_tree.c; the types and functions both files use are in _walk.h
 * The consumer of `events` can also ask for post-order events: (path, depth) once a
 * directory and everything below it has been reported (children before parents).
 *
 * Tracing (the --trace I/O log): each worker logs its syscalls with its own kernel thread id;
 * the Python thread that waits for the walk hands them to the trace callable about ten times
 * a second (events mode: with each batch), so the log says which worker did what.
 *
 * Order: directories are visited in parallel, so the order of output is not deterministic
 * across runs; within one directory entries come in getdents order.
 */

#include "_walk.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

enum { F_LINES, F_JSON };
enum { EV_DIR, EV_POST };

#define OUT_BUFSIZE (256 * 1024)

static const char *const OP_NAMES[N_OPS] = {"getdents", "open", "unlink", "rmdir", "stat"};

/* ---- directories ---------------------------------------------------------------------------- */

WDir *dir_new(const WDir *parent, const char *name, size_t name_len) {
    size_t plen = parent->len, slash = parent->slash;
    size_t len = plen + slash + name_len;
    if (len > UINT32_MAX - 1) {
        errno = ENAMETOOLONG;
        return NULL;
    }
    WDir *d = calloc(1, sizeof(WDir) + len + 1);
    if (!d) return NULL;
    d->parent = (WDir *)parent;
    atomic_init(&d->refs, 1);
    d->fd = -1;
    d->take = d->take_self = parent->take;
    d->depth = parent->depth + 1;
    memcpy(d->path, parent->path, plen);
    if (slash) d->path[plen] = '/';
    memcpy(d->path + plen + slash, name, name_len);
    d->path[len] = 0;
    dir_set_len(d, len);
    d->name_off = (uint32_t)(plen + slash);
    /* the root's children: rel = name; deeper: parent's rel + '/' + name */
    d->rel_off = parent->depth == 0 ? d->name_off : parent->rel_off;
    return d;
}

/* ---- events: batches handed to the Python consumer -------------------------------------------------- */

struct Batch {
    struct Batch *next;
    int kind, depth, err;
    char *path;
    size_t pathlen, pathcap;
    char *names;
    size_t names_len, names_cap;
    struct BEnt {
        uint64_t ino;
        uint32_t off;
        uint16_t len;
        uint8_t type;
    } *ents;
    size_t n, cap;
    TraceLog trace;
    long tid; /* the worker that filled it (for its trace records) */
};

/* ---- small helpers ---------------------------------------------------------------------------- */

void set_fatal(Walk *w, int err) {
    pthread_mutex_lock(&w->mu);
    if (!w->fatal) w->fatal = err;
    pthread_mutex_unlock(&w->mu);
    atomic_store(&w->stop, 1);
}

/* A worker's own log is read by the Python thread meanwhile: `mu` (its lock) or NULL for a
 * batch's log, which only the worker touches until the batch is handed over. */
void trace_add(Walk *w, TraceLog *t, pthread_mutex_t *mu, int op, const WDir *d, const char *name, size_t nl,
               int64_t start, int64_t dur, int result, long a, long b) {
    size_t plen = name ? entry_path_len(d, nl) : d->len;
    if (mu) pthread_mutex_lock(mu);
    int ok = grow_array((void **)&t->v, &t->cap, t->n + 1, sizeof(TraceRec)) == 0 &&
             grow_array((void **)&t->arena, &t->acap, t->used + plen + 1, 1) == 0;
    if (ok) {
        char *p = t->arena + t->used;
        if (name) put_entry_path(p, d, name, nl);
        else memcpy(p, d->path, d->len);
        p[plen] = 0;
        t->v[t->n++] = (TraceRec){start, dur, a, b, op, result, t->used};
        t->used += plen + 1;
    }
    if (mu) pthread_mutex_unlock(mu);
    if (!ok) set_fatal(w, ENOMEM);
}

void add_failure_path(Walk *w, const char *path, size_t len, int err, int depth, const char *detail) {
    char *copy = malloc(len + 1);
    char *dcopy = detail ? strdup(detail) : NULL;
    pthread_mutex_lock(&w->err_mu);
    if (!copy || (detail && !dcopy) ||
        grow_array((void **)&w->fails, &w->fcap, w->nfails + 1, sizeof(Failure)) < 0) {
        pthread_mutex_unlock(&w->err_mu);
        free(copy);
        free(dcopy);
        set_fatal(w, ENOMEM);
        return;
    }
    memcpy(copy, path, len);
    copy[len] = 0;
    w->fails[w->nfails++] = (Failure){copy, err, depth, dcopy};
    pthread_mutex_unlock(&w->err_mu);
}

void add_failure(Walk *w, const WDir *d, int err) { add_failure_path(w, d->path, d->len, err, d->depth, NULL); }

/* ---- -L cycle detection ----------------------------------------------------------------------- */

static size_t devino_hash(dev_t dev, ino_t ino) {
    uint64_t h = (uint64_t)ino * 0x9E3779B97F4A7C15ull ^ (uint64_t)dev * 0xC2B2AE3D27D4EB4Full;
    return (size_t)(h ^ (h >> 29));
}

/* Returns 1 if (dev, ino) is new (and records it), 0 if seen before, -1 on ENOMEM. */
static int seen_insert(Walk *w, dev_t dev, ino_t ino) {
    pthread_mutex_lock(&w->seen_mu);
    if ((w->nseen + 1) * 2 > w->seen_cap) {
        size_t cap = w->seen_cap ? w->seen_cap * 2 : 1024;
        struct DevIno *t = calloc(cap, sizeof(*t));
        if (!t) {
            pthread_mutex_unlock(&w->seen_mu);
            return -1;
        }
        for (size_t i = 0; i < w->seen_cap; i++) {
            if (w->seen[i].ino == 0 && w->seen[i].dev == 0) continue;
            size_t j = devino_hash(w->seen[i].dev, w->seen[i].ino) & (cap - 1);
            while (t[j].ino || t[j].dev) j = (j + 1) & (cap - 1);
            t[j] = w->seen[i];
        }
        free(w->seen);
        w->seen = t;
        w->seen_cap = cap;
    }
    /* (0, 0) marks an empty slot; no real directory has inode 0 on device 0 */
    size_t j = devino_hash(dev, ino) & (w->seen_cap - 1);
    int fresh = 1;
    while (w->seen[j].ino || w->seen[j].dev) {
        if (w->seen[j].dev == dev && w->seen[j].ino == ino) {
            fresh = 0;
            break;
        }
        j = (j + 1) & (w->seen_cap - 1);
    }
    if (fresh) {
        w->seen[j] = (struct DevIno){dev, ino};
        w->nseen++;
    }
    pthread_mutex_unlock(&w->seen_mu);
    return fresh;
}

/* ---- scheduling ------------------------------------------------------------------------------- */

void push_kids(Worker *wk) {
    Walk *w = wk->w;
    size_t n = wk->nkids;
    if (!n) return;
    atomic_fetch_add(&w->pending, (long)n);
    pthread_mutex_lock(&wk->mu);
    if (wk->lo == wk->hi) wk->lo = wk->hi = 0;
    if (grow_array((void **)&wk->dq, &wk->cap, wk->hi + n, sizeof(WDir *)) < 0) {
        pthread_mutex_unlock(&wk->mu);
        /* cannot queue them: drop them (the walk stops with ENOMEM) */
        for (size_t i = 0; i < n; i++) {
            WDir *kid = wk->kids[i];
            if (kid->parent) atomic_fetch_sub(&kid->parent->refs, 1);
            if (kid->fd >= 0) close(kid->fd);
            free(kid);
        }
        atomic_fetch_sub(&w->pending, (long)n);
        wk->nkids = 0;
        set_fatal(w, ENOMEM);
        return;
    }
    /* reversed, so that popping from the top visits them in listing order; `queued` is
     * raised under the deque's lock, so no thief can take one before it is counted */
    for (size_t i = n; i-- > 0;) wk->dq[wk->hi++] = wk->kids[i];
    atomic_fetch_add(&w->queued, (long)n);
    pthread_mutex_unlock(&wk->mu);
    wk->nkids = 0;
    int idle = atomic_load(&w->idle);
    if (idle > 0) {
        pthread_mutex_lock(&w->mu);
        if ((int)n >= idle) pthread_cond_broadcast(&w->work_cv);
        else
            for (size_t i = 0; i < n; i++) pthread_cond_signal(&w->work_cv);
        pthread_mutex_unlock(&w->mu);
    }
}

void queue_subdirs(Worker *wk, WDir *d) {
    d->listed = 1;
    atomic_fetch_add(&d->refs, (int)wk->nkids);
    push_kids(wk);
}

void discard_kids(Worker *wk) {
    for (size_t i = 0; i < wk->nkids; i++) free(wk->kids[i]);
    wk->nkids = 0;
}

static WDir *pop_own(Worker *wk) {
    WDir *d = NULL;
    pthread_mutex_lock(&wk->mu);
    if (wk->hi > wk->lo) d = wk->dq[--wk->hi];
    pthread_mutex_unlock(&wk->mu);
    return d;
}

static WDir *steal(Worker *wk) {
    Walk *w = wk->w;
    int n = w->nworkers, me = (int)(wk - w->workers);
    for (int k = 1; k < n; k++) {
        Worker *v = &w->workers[(me + k) % n];
        WDir *d = NULL;
        pthread_mutex_lock(&v->mu);
        if (v->hi > v->lo) d = v->dq[v->lo++];
        pthread_mutex_unlock(&v->mu);
        if (d) return d;
    }
    return NULL;
}

static WDir *next_dir(Worker *wk) {
    Walk *w = wk->w;
    for (;;) {
        if (atomic_load(&w->stop)) return NULL;
        WDir *d = atomic_load(&w->queued) > 0 ? pop_own(wk) : NULL;
        if (!d && atomic_load(&w->queued) > 0) d = steal(wk);
        if (d) {
            atomic_fetch_sub(&w->queued, 1);
            return d;
        }
        pthread_mutex_lock(&w->mu);
        atomic_fetch_add(&w->idle, 1);
        while (atomic_load(&w->queued) == 0 && atomic_load(&w->pending) > 0 && !atomic_load(&w->stop))
            pthread_cond_wait(&w->work_cv, &w->mu);
        atomic_fetch_sub(&w->idle, 1);
        int over = atomic_load(&w->pending) == 0 || atomic_load(&w->stop);
        pthread_mutex_unlock(&w->mu);
        if (over) return NULL;
    }
}

static Batch *batch_get(Walk *w) {
    pthread_mutex_lock(&w->q_mu);
    Batch *b = NULL;
    for (;;) {
        if (atomic_load(&w->stop)) break;
        if (w->free_list) {
            b = w->free_list;
            w->free_list = b->next;
            w->nfree--;
            break;
        }
        if (w->nbatches < w->cfg.max_batches) {
            b = calloc(1, sizeof(*b));
            if (b) w->nbatches++;
            break;
        }
        w->free_waiters++;
        pthread_cond_wait(&w->free_cv, &w->q_mu);
        w->free_waiters--;
    }
    pthread_mutex_unlock(&w->q_mu);
    if (b) {
        b->next = NULL;
        b->n = b->names_len = b->pathlen = 0;
        b->trace.n = b->trace.used = 0;
        b->err = 0;
    }
    return b;
}

static void batch_put(Walk *w, Batch *b) {
    pthread_mutex_lock(&w->q_mu);
    if (w->q_tail) w->q_tail->next = b;
    else w->q_head = b;
    w->q_tail = b;
    pthread_cond_signal(&w->q_cv);
    pthread_mutex_unlock(&w->q_mu);
}

static void batch_free(Batch *b) {
    free(b->path);
    free(b->names);
    free(b->ents);
    free(b->trace.v);
    free(b->trace.arena);
    free(b);
}

/* Back to the free list; a batch that once held a huge directory gives its memory back. */
static void batch_recycle(Walk *w, Batch *b) {
    if (b->names_cap > (8u << 20) || b->cap > (1u << 18)) {
        free(b->names);
        free(b->ents);
        b->names = NULL;
        b->ents = NULL;
        b->names_cap = b->cap = 0;
    }
    pthread_mutex_lock(&w->q_mu);
    b->next = w->free_list;
    w->free_list = b;
    w->nfree++;
    /* When the consumer is the bottleneck, producers wait for batches: waking one per
     * recycled batch costs a context switch per directory.  Wake them all once a quarter of
     * the batches is free instead. */
    if (w->free_waiters && w->nfree >= (w->cfg.max_batches + 3) / 4) pthread_cond_broadcast(&w->free_cv);
    pthread_mutex_unlock(&w->q_mu);
}

static int batch_set_path(Batch *b, const WDir *d, int kind, int err) {
    if (grow_array((void **)&b->path, &b->pathcap, d->len + 1, 1) < 0) return -1;
    memcpy(b->path, d->path, d->len + 1);
    b->pathlen = d->len;
    b->kind = kind;
    b->depth = d->depth;
    b->err = err;
    return 0;
}

static int batch_add(Batch *b, const char *name, size_t len, unsigned char type, uint64_t ino) {
    if (grow_array((void **)&b->ents, &b->cap, b->n + 1, sizeof(struct BEnt)) < 0 ||
        grow_array((void **)&b->names, &b->names_cap, b->names_len + len, 1) < 0)
        return -1;
    memcpy(b->names + b->names_len, name, len);
    b->ents[b->n++] = (struct BEnt){ino, (uint32_t)b->names_len, (uint16_t)len, type};
    b->names_len += len;
    return 0;
}

/* An error event (events mode) or a recorded failure (other modes). */
static void report_failure(Worker *wk, const WDir *d, int err) {
    Walk *w = wk->w;
    if (w->cfg.mode != M_EVENTS) {
        add_failure(w, d, err);
        return;
    }
    Batch *b = wk->batch ? wk->batch : batch_get(w);
    wk->batch = NULL;
    if (!b) return; /* stopping */
    b->n = b->names_len = 0;
    if (batch_set_path(b, d, EV_DIR, err) < 0) {
        batch_recycle(w, b);
        set_fatal(w, ENOMEM);
        return;
    }
    batch_put(w, b);
}

/* ---- output: paths and JSON lines --------------------------------------------------------------- */

int out_flush(Walk *w, Worker *wk) {
    if (!wk->used) return 0;
    int rc = 0;
    pthread_mutex_lock(&w->out_mu);
    if (w->out_err) rc = -1;
    for (size_t off = 0; !rc && off < wk->used;) {
        ssize_t k = write(w->cfg.out_fd, wk->out + off, wk->used - off);
        if (k < 0) {
            if (errno == EINTR) continue;
            w->out_err = errno;
            rc = -1;
        } else {
            off += (size_t)k;
        }
    }
    pthread_mutex_unlock(&w->out_mu);
    wk->used = 0;
    if (rc) atomic_store(&w->stop, 1);
    return rc;
}

int out_reserve(Worker *wk, size_t need) {
    Walk *w = wk->w;
    if (wk->used + need <= wk->ocap) return 0;
    if (out_flush(w, wk) < 0) return -1;
    if (need > wk->ocap && grow_array((void **)&wk->out, &wk->ocap, need, 1) < 0) {
        set_fatal(w, ENOMEM);
        return -1;
    }
    return 0;
}

static inline char *put(char *p, const void *s, size_t n) {
    memcpy(p, s, n);
    return p + n;
}

static const char HEX[] = "0123456789abcdef";

static inline char *put_u16(char *p, uint32_t u) {
    *p++ = '\\';
    *p++ = 'u';
    *p++ = HEX[(u >> 12) & 15];
    *p++ = HEX[(u >> 8) & 15];
    *p++ = HEX[(u >> 4) & 15];
    *p++ = HEX[u & 15];
    return p;
}

/* json.dumps(os.fsdecode(s), ensure_ascii=True) without the quotes: the glob's decoding
 * (fs_next_char: UTF-8, invalid bytes as U+DC80..U+DCFF) and the same escapes as CPython's
 * encoder (\" \\ \n \r \t \b \f, \u00XX for other controls and DEL, \uXXXX for non-ASCII,
 * surrogate pairs above U+FFFF, lowercase hex).  Sets *valid = 0 if s is not valid UTF-8. */
static char *put_json_str(char *p, const unsigned char *s, size_t len, int *valid) {
    for (size_t i = 0; i < len;) {
        unsigned char b = s[i];
        if (b >= 0x20 && b < 0x7f && b != '"' && b != '\\') {
            *p++ = (char)b;
            i++;
            continue;
        }
        uint32_t c = fs_next_char(s, len, &i);
        if (c >= 0xDC80 && c <= 0xDCFF) *valid = 0; /* a byte that is not UTF-8 */
        switch (c) {
        case '"': p = put(p, "\\\"", 2); break;
        case '\\': p = put(p, "\\\\", 2); break;
        case '\n': p = put(p, "\\n", 2); break;
        case '\r': p = put(p, "\\r", 2); break;
        case '\t': p = put(p, "\\t", 2); break;
        case '\b': p = put(p, "\\b", 2); break;
        case '\f': p = put(p, "\\f", 2); break;
        default:
            if (c >= 0x10000) {
                uint32_t v = c - 0x10000;
                p = put_u16(p, 0xD800 | (v >> 10));
                p = put_u16(p, 0xDC00 | (v & 0x3FF));
            } else {
                p = put_u16(p, c);
            }
        }
    }
    return p;
}

static char *put_b64(char *p, const unsigned char *s, size_t len) {
    static const char T[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t i = 0;
    for (; i + 2 < len; i += 3) {
        uint32_t v = ((uint32_t)s[i] << 16) | ((uint32_t)s[i + 1] << 8) | s[i + 2];
        *p++ = T[v >> 18];
        *p++ = T[(v >> 12) & 63];
        *p++ = T[(v >> 6) & 63];
        *p++ = T[v & 63];
    }
    if (i < len) {
        uint32_t v = (uint32_t)s[i] << 16;
        if (i + 1 < len) v |= (uint32_t)s[i + 1] << 8;
        *p++ = T[v >> 18];
        *p++ = T[(v >> 12) & 63];
        *p++ = i + 1 < len ? T[(v >> 6) & 63] : '=';
        *p++ = '=';
    }
    return p;
}

static const char TYPE_LETTER[N_DTYPES] = {'?', 'p', 'c', '?', 'd', '?', 'b', '?', 'f', '?', 'l', '?', 's',
                                          '?', '?', '?'};

/* The record fastls --json has always printed (manyfiles.fastls._json_line without -l):
 * {"path": P, "name": N, "type": T, "inode": I} plus "path_b64" when the path is not UTF-8. */
static int emit_json(Worker *wk, const WDir *d, const char *name, size_t nl, unsigned char type, uint64_t ino) {
    size_t full = entry_path_len(d, nl);
    size_t need = 6 * full + 6 * nl + 4 * (full / 3 + 1) + 128;
    if (out_reserve(wk, need + full) < 0) return -1;
    /* the raw path first, at the end of the reserved area, for base64 */
    char *raw = wk->out + wk->used + need;
    put_entry_path(raw, d, name, nl);
    char *p = wk->out + wk->used;
    int valid = 1;
    p = put(p, "{\"path\": \"", 10);
    p = put_json_str(p, (const unsigned char *)raw, full, &valid);
    p = put(p, "\", \"name\": \"", 12);
    int ignore = 1;
    p = put_json_str(p, (const unsigned char *)name, nl, &ignore);
    p = put(p, "\", \"type\": \"", 12);
    *p++ = TYPE_LETTER[type];
    p += sprintf(p, "\", \"inode\": %llu", (unsigned long long)ino);
    if (!valid) {
        p = put(p, ", \"path_b64\": \"", 15);
        p = put_b64(p, (const unsigned char *)raw, full);
        *p++ = '"';
    }
    p = put(p, "}\n", 2);
    wk->used = (size_t)(p - wk->out);
    return 0;
}

static int emit_line(Worker *wk, const WDir *d, const char *name, size_t nl) {
    if (out_reserve(wk, entry_path_len(d, nl) + 1) < 0) return -1;
    char *p = put_entry_path(wk->out + wk->used, d, name, nl);
    *p++ = wk->w->cfg.sep;
    wk->used = (size_t)(p - wk->out);
    return 0;
}

/* ---- one directory ------------------------------------------------------------------------------- */

static void emit_post(Worker *wk, WDir *d) {
    Walk *w = wk->w;
    if (!d->listed || d->depth < w->cfg.min_depth) return;
    Batch *b = batch_get(w);
    if (!b) return;
    if (batch_set_path(b, d, EV_POST, 0) < 0) {
        batch_recycle(w, b);
        set_fatal(w, ENOMEM);
        return;
    }
    batch_put(w, b);
}

/* The last reference closes the fd, emits the post-order event and (in post-order mode, where
 * children hold their parent until they finish) walks up. */
void dir_release(Worker *wk, WDir *d) {
    const Config *c = &wk->w->cfg;
    int remove = c->mode == M_REMOVE, sync = remove && (c->out_fd >= 0 || c->collect);
    while (d) {
        /* remove mode: when another thread will finish d (and emit its path), the paths this
         * one emitted from inside d go out first: the output lists entries before their directory */
        if (sync && atomic_load(&d->refs) > 1) rm_sync(wk);
        if (atomic_fetch_sub(&d->refs, 1) != 1) return;
        WDir *parent = d->parent;
        if (c->postorder && !remove) emit_post(wk, d);
        if (remove) rm_finish(wk, d);
        else if (d->fd >= 0) close(d->fd);
        free(d);
        d = parent;
    }
}

long read_dir(Worker *wk, int fd) {
    for (;;) {
        long n = syscall(SYS_getdents64, fd, wk->buf, wk->bufsize);
        if (n >= 0) return n;
        if (errno == EINTR) continue;
        if (errno == EINVAL && wk->bufsize < MAX_BUFSIZE) {
            /* a record bigger than the buffer: grow it (this worker keeps the bigger one) */
            char *bigger = realloc(wk->buf, wk->bufsize * 2);
            if (!bigger) {
                errno = ENOMEM;
                return -1;
            }
            wk->buf = bigger;
            wk->bufsize *= 2;
            continue;
        }
        return -1;
    }
}

static int wanted(const Config *c, const char *name, size_t nl, unsigned char type, const char *rel,
                  size_t rl) {
    if (c->types && !(c->types & (1u << type))) return 0;
    if (c->exclude && globset_match(c->exclude, name, nl, rel, rl)) return 0;
    if (c->include && !globset_match(c->include, name, nl, rel, rl)) return 0;
    return 1;
}

const char *rel_path(Worker *wk, const WDir *d, const char *name, size_t nl, size_t *rl) {
    size_t dl = d->len - d->rel_off;
    size_t need = dl + 1 + nl;
    if (grow_array((void **)&wk->scratch, &wk->scap, need + 1, 1) < 0) return NULL;
    char *p = wk->scratch;
    if (dl) {
        memcpy(p, d->path + d->rel_off, dl);
        p[dl++] = '/';
    }
    memcpy(p + dl, name, nl);
    *rl = dl + nl;
    return wk->scratch;
}

static int enter_ok(const Config *c, int child_depth, const char *name, size_t nl, Worker *wk, const WDir *d) {
    if (c->max_depth >= 0 && child_depth > c->max_depth) return 0;
    int level = child_depth - 1;
    if (level < c->ndescend && c->descend[level] && !globset_match(c->descend[level], name, nl, NULL, 0))
        return 0;
    if (c->prune) {
        size_t rl = 0;
        const char *rel = c->prune->any_slash ? rel_path(wk, d, name, nl, &rl) : NULL;
        if (globset_match(c->prune, name, nl, rel, rl)) return 0;
    }
    return 1;
}

int open_dir(Walk *w, WDir *d) {
    int flags = O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOCTTY | (w->cfg.follow ? 0 : O_NOFOLLOW);
    int fd;
    do {
        fd = openat(d->parent->fd, d->path + d->name_off, flags);
    } while (fd < 0 && errno == EINTR);
    return fd;
}

static void process(Worker *wk, WDir *d) {
    Walk *w = wk->w;
    const Config *c = &w->cfg;
    int err = 0;
    if (d->fd < 0) {
        int fd = open_dir(w, d);
        err = fd < 0 ? errno : 0;
        if (!c->postorder) { /* pre-order: the parent's fd is no longer needed by us */
            dir_release(wk, d->parent);
            d->parent = NULL;
        }
        if (fd < 0) {
            report_failure(wk, d, err);
            goto done;
        }
        d->fd = fd;
    }
    if (c->follow || c->xdev) {
        struct stat st;
        if (fstat(d->fd, &st) < 0) {
            report_failure(wk, d, errno);
            goto done;
        }
        if (c->xdev && st.st_dev != w->root_dev) {
            report_failure(wk, d, EXDEV);
            goto done;
        }
        if (c->follow && d->depth > 0) {
            int fresh = seen_insert(w, st.st_dev, st.st_ino);
            if (fresh <= 0) {
                report_failure(wk, d, fresh < 0 ? ENOMEM : ELOOP);
                goto done;
            }
        }
    }
    int report = d->depth >= c->min_depth;
    int child_depth = d->depth + 1;
    int may_descend = c->max_depth < 0 || child_depth <= c->max_depth;
    int need_rel = (c->include && c->include->any_slash) || (c->exclude && c->exclude->any_slash);
    if (report && c->mode == M_EVENTS) {
        wk->batch = batch_get(w);
        if (!wk->batch) goto done;
        wk->batch->tid = wk->ktid;
        if (batch_set_path(wk->batch, d, EV_DIR, 0) < 0) goto nomem;
    }
    long listed = 0;
    for (;;) {
        int64_t t0 = c->trace ? now_ns() : 0;
        long n = read_dir(wk, d->fd);
        int64_t dur = c->trace ? now_ns() - t0 : 0;
        if (n < 0) {
            err = errno;
            break;
        }
        if (n == 0) break;
        long kept = 0;
        for (long pos = 0; pos < n;) {
            struct linux_dirent64 *e = (struct linux_dirent64 *)(wk->buf + pos);
            pos += e->d_reclen;
            const char *name = e->d_name;
            if (is_dot(name)) continue;
            size_t nl = strlen(name);
            unsigned char type = effective_dtype(c->fake_dtype, e->d_type);
            struct stat st;
            if (type == DT_UNKNOWN && fstatat(d->fd, name, &st, AT_SYMLINK_NOFOLLOW) == 0)
                type = type_from_mode(st.st_mode);
            int is_dir = type == DT_DIR;
            if (!is_dir && type == DT_LNK && c->follow && may_descend)
                is_dir = fstatat(d->fd, name, &st, 0) == 0 && S_ISDIR(st.st_mode);
            if (is_dir && may_descend && enter_ok(c, child_depth, name, nl, wk, d)) {
                if (grow_array((void **)&wk->kids, &wk->kcap, wk->nkids + 1, sizeof(WDir *)) < 0) goto nomem;
                WDir *kid = dir_new(d, name, nl);
                if (!kid) goto nomem;
                wk->kids[wk->nkids++] = kid;
            }
            if (!report) continue;
            size_t rl = 0;
            const char *rel = need_rel ? rel_path(wk, d, name, nl, &rl) : NULL;
            if (need_rel && !rel) goto nomem;
            if (!wanted(c, name, nl, type, rel, rl)) continue;
            kept++;
            switch (c->mode) {
            case M_COUNT: wk->counts[type]++; break;
            case M_WRITE:
                if ((c->fmt == F_JSON ? emit_json(wk, d, name, nl, type, e->d_ino) : emit_line(wk, d, name, nl)) < 0)
                    goto stopped;
                break;
            default:
                if (batch_add(wk->batch, name, nl, type, e->d_ino) < 0) goto nomem;
            }
        }
        listed += kept;
        if (c->trace) {
            int own = !(c->mode == M_EVENTS && wk->batch);
            trace_add(w, own ? &wk->trace : &wk->batch->trace, own ? &wk->trace_mu : NULL, OP_GETDENTS, d, NULL, 0,
                      t0, dur, 0, kept, n);
        }
        if (atomic_load(&w->stop)) goto stopped;
    }
    if (err) {
        /* the listing is incomplete: report the failure, do not descend */
        discard_kids(wk);
        if (wk->batch) {
            wk->batch->n = wk->batch->names_len = 0;
            wk->batch->err = err;
            batch_put(w, wk->batch);
            wk->batch = NULL;
        } else {
            report_failure(wk, d, err);
        }
        goto done;
    }
    wk->dirs++;
    atomic_fetch_add(&w->progress, listed);
    if (wk->batch) {
        batch_put(w, wk->batch);
        wk->batch = NULL;
    }
    queue_subdirs(wk, d);
    goto done;
nomem:
    set_fatal(w, ENOMEM);
stopped:
    discard_kids(wk);
    if (wk->batch) {
        batch_recycle(w, wk->batch);
        wk->batch = NULL;
    }
done:
    dir_release(wk, d);
}

/* ---- workers ----------------------------------------------------------------------------------- */

static void *worker_main(void *arg) {
    Worker *wk = arg;
    Walk *w = wk->w;
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL); /* signals are the Python thread's business */
    wk->ktid = (long)syscall(SYS_gettid);
    /* a name in top -H, py-spy and /proc/PID/task/TID/comm (the tests count the walkers by it) */
    char tname[16];
    snprintf(tname, sizeof tname, "mf-walker-%d", (int)(wk - w->workers));
    pthread_setname_np(pthread_self(), tname);
    WDir *d;
    while ((d = next_dir(wk)) != NULL) {
        if (w->cfg.mode == M_REMOVE) process_remove(wk, d);
        else process(wk, d);
        if (atomic_fetch_sub(&w->pending, 1) == 1) {
            pthread_mutex_lock(&w->mu);
            pthread_cond_broadcast(&w->work_cv);
            pthread_mutex_unlock(&w->mu);
        }
    }
    if (w->cfg.mode == M_WRITE) out_flush(w, wk);
    else if (w->cfg.mode == M_REMOVE) rm_sync(wk); /* what the last directories' removal emitted */
    /* the Python thread waits for this (and, in events and collect modes, for batches) */
    pthread_mutex_lock(&w->q_mu);
    w->producers_done++;
    pthread_cond_broadcast(&w->q_cv);
    pthread_mutex_unlock(&w->q_mu);
    return NULL;
}

void walk_free(Walk *w) {
    if (!w) return;
    for (int i = 0; i < w->nworkers; i++) {
        Worker *wk = &w->workers[i];
        free(wk->dq);
        free(wk->kids);
        free(wk->buf);
        free(wk->out);
        free(wk->scratch);
        free(wk->trace.v);
        free(wk->trace.arena);
        free(wk->pathbuf);
        free(wk->slots);
        free(wk->removed.buf);
        if (wk->batch) batch_free(wk->batch);
        pthread_mutex_destroy(&wk->mu);
        pthread_mutex_destroy(&wk->trace_mu);
    }
    free(w->workers);
    for (Batch *b = w->q_head; b;) {
        Batch *n = b->next;
        batch_free(b);
        b = n;
    }
    for (Batch *b = w->free_list; b;) {
        Batch *n = b->next;
        batch_free(b);
        b = n;
    }
    for (size_t i = 0; i < w->nfails; i++) {
        free(w->fails[i].path);
        free(w->fails[i].detail);
    }
    free(w->fails);
    free(w->seen);
    pthread_mutex_destroy(&w->mu);
    pthread_mutex_destroy(&w->seen_mu);
    pthread_mutex_destroy(&w->err_mu);
    pthread_mutex_destroy(&w->out_mu);
    pthread_mutex_destroy(&w->q_mu);
    pthread_cond_destroy(&w->work_cv);
    pthread_cond_destroy(&w->q_cv);
    pthread_cond_destroy(&w->free_cv);
    free(w);
}

/* Directories left in deques after a cancel hold references on their parents (whose fds
 * are then still open): release them so every fd is closed. */
void drain_queues(Walk *w) {
    atomic_store(&w->stop, 1); /* remove mode: nothing more is removed (rm_finish) */
    for (int i = 0; i < w->nworkers; i++) {
        Worker *wk = &w->workers[i];
        while (wk->hi > wk->lo) {
            WDir *d = wk->dq[--wk->hi];
            WDir *p = d->parent;
            if (d->fd >= 0) close(d->fd); /* only the root is queued open */
            free(d);
            if (p) dir_release(wk, p);
        }
    }
}

Walk *walk_alloc(const Config *cfg) {
    Walk *w = calloc(1, sizeof(*w));
    if (!w) return NULL;
    w->cfg = *cfg;
    pthread_mutex_init(&w->mu, NULL);
    pthread_mutex_init(&w->seen_mu, NULL);
    pthread_mutex_init(&w->err_mu, NULL);
    pthread_mutex_init(&w->out_mu, NULL);
    pthread_mutex_init(&w->q_mu, NULL);
    pthread_cond_init(&w->work_cv, NULL);
    pthread_cond_init(&w->q_cv, NULL);
    pthread_cond_init(&w->free_cv, NULL);
    w->nworkers = cfg->threads;
    w->workers = calloc((size_t)w->nworkers, sizeof(Worker));
    if (!w->workers) {
        free(w);
        return NULL;
    }
    for (int i = 0; i < w->nworkers; i++) {
        Worker *wk = &w->workers[i];
        wk->w = w;
        pthread_mutex_init(&wk->mu, NULL);
        pthread_mutex_init(&wk->trace_mu, NULL);
        wk->bufsize = cfg->bufsize;
        wk->buf = malloc(wk->bufsize);
        if (!wk->buf) {
            w->nworkers = i + 1;
            walk_free(w);
            return NULL;
        }
        if (cfg->mode == M_WRITE || (cfg->mode == M_REMOVE && cfg->out_fd >= 0)) {
            wk->ocap = OUT_BUFSIZE;
            wk->out = malloc(wk->ocap);
            if (!wk->out) {
                w->nworkers = i + 1;
                walk_free(w);
                return NULL;
            }
        }
    }
    return w;
}

/* Opens the root (GIL released by the caller) and queues it on worker 0.  Returns 0, or an
 * errno for a root that cannot be opened (then the walk is not started). */
static int walk_seed(Walk *w, int root_fd, const char *label, size_t label_len) {
    WDir *d = malloc(sizeof(WDir) + label_len + 1);
    if (!d) return ENOMEM;
    atomic_init(&d->refs, 1);
    d->parent = NULL;
    d->depth = 0;
    d->listed = 0;
    memcpy(d->path, label, label_len);
    d->path[label_len] = 0;
    dir_set_len(d, label_len);
    d->name_off = 0;
    d->rel_off = (uint32_t)label_len;
    int flags = O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOCTTY;
    /* a root fd is reopened: a new open file description with its own offset */
    d->fd = root_fd >= 0 ? openat(root_fd, ".", flags) : open(d->path, flags);
    if (d->fd < 0) {
        int err = errno;
        free(d);
        return err;
    }
    if (w->cfg.follow || w->cfg.xdev) {
        struct stat st;
        if (fstat(d->fd, &st) < 0) {
            int err = errno;
            close(d->fd);
            free(d);
            return err;
        }
        w->root_dev = st.st_dev;
        if (w->cfg.follow && seen_insert(w, st.st_dev, st.st_ino) < 0) {
            close(d->fd);
            free(d);
            return ENOMEM;
        }
    }
    Worker *wk = &w->workers[0];
    wk->kids = malloc(sizeof(WDir *));
    if (!wk->kids) {
        close(d->fd);
        free(d);
        return ENOMEM;
    }
    wk->kcap = 1;
    wk->kids[0] = d;
    wk->nkids = 1;
    push_kids(wk);
    return 0;
}

int walk_start(Walk *w) {
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 256 * 1024);
    for (int i = 0; i < w->nworkers; i++) {
        if (pthread_create(&w->workers[i].tid, &attr, worker_main, &w->workers[i]) != 0) break;
        w->workers[i].started = 1;
        w->nstarted++;
    }
    pthread_attr_destroy(&attr);
    /* with fewer threads than asked the walk still completes; with none it cannot start */
    return w->nstarted > 0 ? 0 : -1;
}

static void walk_join(Walk *w) {
    for (int i = 0; i < w->nworkers; i++)
        if (w->workers[i].started) pthread_join(w->workers[i].tid, NULL);
    drain_queues(w);
}

static void walk_cancel(Walk *w) {
    atomic_store(&w->stop, 1);
    pthread_mutex_lock(&w->mu);
    pthread_cond_broadcast(&w->work_cv);
    pthread_mutex_unlock(&w->mu);
    pthread_mutex_lock(&w->q_mu);
    pthread_cond_broadcast(&w->free_cv);
    pthread_mutex_unlock(&w->q_mu);
}

static void deadline_after(struct timespec *ts, long ns) {
    clock_gettime(CLOCK_REALTIME, ts);
    ts->tv_nsec += ns;
    if (ts->tv_nsec >= 1000000000) {
        ts->tv_sec += ts->tv_nsec / 1000000000;
        ts->tv_nsec %= 1000000000;
    }
}

/* ---- Python arguments ------------------------------------------------------------------------------ */

#define PYARGS_DEFAULTS {.bufsize = 32 * 1024, .threads = 4, .max_depth = -1}

static const GlobSet *glob_or_none(PyObject *o, ModState *st, int *ok) {
    if (o == NULL || o == Py_None) return NULL;
    const GlobSet *g = globset_from_object(o, st);
    if (!g) *ok = 0;
    return g;
}

PyObject *callable_or_null(PyObject *o, const char *what, int *ok) {
    if (o == NULL || o == Py_None || o == Py_False) return NULL;
    if (!PyCallable_Check(o)) {
        PyErr_Format(PyExc_TypeError, "%s must be a callable or None", what);
        *ok = 0;
        return NULL;
    }
    return o;
}

int config_common(PyObject *module, Config *cfg, PyArgs *a) {
    ModState *st = mod_state(module);
    int threads = a->threads <= 0 ? 1 : a->threads > 256 ? 256 : a->threads;
    cfg->threads = threads;
    cfg->bufsize = clamp_bufsize(a->bufsize);
    cfg->fake_dtype = read_fake_dtype(st);
    cfg->max_batches = 4 * threads + 4;
    int ok = 1;
    cfg->include = glob_or_none(a->include, st, &ok);
    cfg->exclude = glob_or_none(a->exclude, st, &ok);
    a->progress = callable_or_null(a->progress, "progress", &ok);
    a->trace = callable_or_null(a->trace, "trace", &ok);
    cfg->trace = a->trace != NULL;
    return ok ? 0 : -1;
}

static int config_from(PyObject *module, Config *cfg, PyArgs *a) {
    ModState *st = mod_state(module);
    if (config_common(module, cfg, a) < 0) return -1;
    cfg->max_depth = a->max_depth;
    cfg->min_depth = a->min_depth < 0 ? 0 : a->min_depth;
    cfg->follow = a->follow;
    cfg->xdev = a->xdev;
    cfg->types = a->types & ((1u << N_DTYPES) - 1);
    int ok = 1;
    cfg->prune = glob_or_none(a->prune, st, &ok);
    if (!ok) return -1;
    if (a->descend && a->descend != Py_None) {
        if (!PyTuple_Check(a->descend) || PyTuple_GET_SIZE(a->descend) > 8) {
            PyErr_SetString(PyExc_TypeError, "descend must be a tuple of at most 8 Glob objects or None");
            return -1;
        }
        cfg->ndescend = (int)PyTuple_GET_SIZE(a->descend);
        for (int i = 0; i < cfg->ndescend; i++) {
            cfg->descend[i] = glob_or_none(PyTuple_GET_ITEM(a->descend, i), st, &ok);
            if (!ok) return -1;
        }
    }
    /* the root: a bytes path, or an int fd with a bytes label used as its path */
    if (PyLong_Check(a->root)) {
        a->root_fd = (int)PyLong_AsLong(a->root);
        if (a->root_fd < 0) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "root fd must be >= 0");
            return -1;
        }
        if (!a->label || !PyBytes_Check(a->label)) {
            PyErr_SetString(PyExc_TypeError, "a root fd needs label= (bytes: the path it stands for)");
            return -1;
        }
    } else if (PyBytes_Check(a->root)) {
        a->root_fd = -1;
        if (!a->label || a->label == Py_None) a->label = a->root;
        if (!PyBytes_Check(a->label)) {
            PyErr_SetString(PyExc_TypeError, "label must be bytes");
            return -1;
        }
        if (strlen(PyBytes_AS_STRING(a->root)) != (size_t)PyBytes_GET_SIZE(a->root)) {
            PyErr_SetString(PyExc_ValueError, "embedded null byte");
            return -1;
        }
    } else {
        PyErr_SetString(PyExc_TypeError, "root must be bytes (os.fsencode it) or an int fd");
        return -1;
    }
    return 0;
}

PyObject *failures_list(Walk *w) {
    PyObject *out = PyList_New((Py_ssize_t)w->nfails);
    if (!out) return NULL;
    for (size_t i = 0; i < w->nfails; i++) {
        const Failure *f = &w->fails[i];
        PyObject *t = f->detail ? Py_BuildValue("(y#iiy)", f->path, (Py_ssize_t)strlen(f->path), f->err, f->depth,
                                                f->detail)
                                : Py_BuildValue("(y#iiO)", f->path, (Py_ssize_t)strlen(f->path), f->err, f->depth,
                                                Py_None);
        if (!t) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, (Py_ssize_t)i, t);
    }
    return out;
}

/* ---- the I/O log -------------------------------------------------------------------------------------
 * Records go to the trace callable as trace(flat, threads): `flat` holds 8 values per record,
 * manyfiles.trace.iotrace's layout (op, path, offset, length, start_ns, dur_ns, result, tid; getdents:
 * offset = entries, length = bytes), `threads` maps each kernel tid to a thread name. */

static int trace_append(PyObject *flat, PyObject *const *ops, const TraceLog *t, long tid) {
    for (size_t i = 0; i < t->n; i++) {
        const TraceRec *r = &t->v[i];
        const char *p = t->arena + r->path_off;
        PyObject *vals[8] = {Py_NewRef(ops[r->op]), PyBytes_FromStringAndSize(p, (Py_ssize_t)strlen(p)),
                             PyLong_FromLong(r->a), PyLong_FromLong(r->b), PyLong_FromLongLong(r->start),
                             PyLong_FromLongLong(r->dur), PyLong_FromLong(r->result), PyLong_FromLong(tid)};
        int rc = 0;
        for (int k = 0; k < 8; k++) {
            if (!vals[k] || (rc == 0 && PyList_Append(flat, vals[k]) < 0)) rc = -1;
            Py_XDECREF(vals[k]);
        }
        if (rc < 0) return -1;
    }
    return 0;
}

/* Calls trace(flat, threads) with the records of `logs` (one per worker, `tids` theirs). */
static int trace_deliver(PyObject *trace, TraceLog *const *logs, const long *tids, int n) {
    size_t total = 0;
    for (int i = 0; i < n; i++) total += logs[i]->n;
    if (!total) return 0;
    PyObject *ops[N_OPS] = {NULL};
    PyObject *flat = PyList_New(0), *names = PyDict_New();
    int rc = flat && names ? 0 : -1;
    for (int k = 0; rc == 0 && k < N_OPS; k++)
        if (!(ops[k] = PyUnicode_InternFromString(OP_NAMES[k]))) rc = -1;
    for (int i = 0; rc == 0 && i < n; i++) {
        if (!logs[i]->n) continue;
        PyObject *tid = PyLong_FromLong(tids[i]);
        PyObject *name = PyUnicode_FromFormat("manyfiles-walker-%d", i);
        if (!tid || !name || PyDict_SetItem(names, tid, name) < 0 || trace_append(flat, ops, logs[i], tids[i]) < 0)
            rc = -1;
        Py_XDECREF(tid);
        Py_XDECREF(name);
    }
    if (rc == 0) {
        PyObject *r = PyObject_CallFunctionObjArgs(trace, flat, names, NULL);
        if (!r) rc = -1;
        Py_XDECREF(r);
    }
    for (int k = 0; k < N_OPS; k++) Py_XDECREF(ops[k]);
    Py_XDECREF(flat);
    Py_XDECREF(names);
    return rc;
}

/* Takes what the workers logged so far (each under its lock, swapped for an empty log) and
 * delivers it from this (the Python) thread. */
static int trace_drain(Walk *w, PyObject *trace) {
    if (!trace) return 0;
    TraceLog *taken = calloc((size_t)w->nworkers, sizeof(TraceLog));
    TraceLog **logs = calloc((size_t)w->nworkers, sizeof(TraceLog *));
    long *tids = calloc((size_t)w->nworkers, sizeof(long));
    if (!taken || !logs || !tids) {
        free(taken);
        free(logs);
        free(tids);
        PyErr_NoMemory();
        return -1;
    }
    for (int i = 0; i < w->nworkers; i++) {
        Worker *wk = &w->workers[i];
        pthread_mutex_lock(&wk->trace_mu);
        taken[i] = wk->trace;
        memset(&wk->trace, 0, sizeof(wk->trace));
        tids[i] = wk->ktid;
        pthread_mutex_unlock(&wk->trace_mu);
        logs[i] = &taken[i];
    }
    int rc = trace_deliver(trace, logs, tids, w->nworkers);
    for (int i = 0; i < w->nworkers; i++) {
        free(taken[i].v);
        free(taken[i].arena);
    }
    free(taken);
    free(logs);
    free(tids);
    return rc;
}

/* ---- waiting for a count, write or remove walk ---------------------------------------------------- */

/* Waits (GIL released) for the started walk to end, waking for on_removed batches and, every
 * 100 ms, for signals (Ctrl-C cancels: the threads stop and every fd is closed), progress and
 * the I/O log.  Returns 0, or -1 with a Python exception set (the walk was cancelled). */
int wait_walk(Walk *w, const Hooks *h) {
    int failed = 0;
    int64_t next_tick = now_ns() + WAIT_SLICE_NS;
    for (;;) {
        Worker *wk = NULL;
        int over;
        Py_BEGIN_ALLOW_THREADS
        pthread_mutex_lock(&w->q_mu);
        if (!w->cq_head && w->producers_done < w->nstarted) {
            struct timespec ts;
            int64_t left = next_tick - now_ns();
            deadline_after(&ts, left > 0 ? (long)left : 0);
            pthread_cond_timedwait(&w->q_cv, &w->q_mu, &ts);
        }
        wk = w->cq_head;
        if (wk) {
            w->cq_head = wk->cq_next;
            if (!w->cq_head) w->cq_tail = NULL;
            if (failed || atomic_load(&w->stop)) {
                wk->waiting = 0;
                pthread_cond_broadcast(&w->free_cv);
                wk = NULL;
            } else {
                w->cq_busy = wk;
            }
        }
        over = !wk && !w->cq_head && w->producers_done >= w->nstarted;
        pthread_mutex_unlock(&w->q_mu);
        Py_END_ALLOW_THREADS
        if (wk) {
            if (hand_over_removed(wk, h) < 0) failed = 1;
            pthread_mutex_lock(&w->q_mu);
            w->cq_busy = NULL;
            wk->waiting = 0;
            pthread_cond_broadcast(&w->free_cv);
            pthread_mutex_unlock(&w->q_mu);
            if (failed) walk_cancel(w);
        }
        if (over) break;
        if (failed || now_ns() < next_tick) continue;
        next_tick = now_ns() + WAIT_SLICE_NS;
        if (PyErr_CheckSignals() < 0 || trace_drain(w, h->trace) < 0) failed = 1;
        else if (h->progress) {
            PyObject *v = h->progress_value(w);
            PyObject *r = v ? PyObject_CallOneArg(h->progress, v) : NULL;
            Py_XDECREF(v);
            if (!r) failed = 1;
            Py_XDECREF(r);
        }
        if (failed) walk_cancel(w);
    }
    Py_BEGIN_ALLOW_THREADS
    walk_join(w);
    Py_END_ALLOW_THREADS
    if (failed) return -1;
    if (trace_drain(w, h->trace) < 0) return -1;
    if (w->fatal) {
        errno = w->fatal;
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    if (w->out_err) {
        errno = w->out_err;
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    return 0;
}

static PyObject *entries_so_far(Walk *w) { return PyLong_FromLongLong((long long)atomic_load(&w->progress)); }

/* Runs a count or write walk to the end. */
static PyObject *run_blocking(Walk *w, PyArgs *a) {
    int seed_err;
    const char *label = PyBytes_AS_STRING(a->label);
    size_t label_len = (size_t)PyBytes_GET_SIZE(a->label);
    int started = 0;
    Py_BEGIN_ALLOW_THREADS
    seed_err = walk_seed(w, a->root_fd, label, label_len);
    if (!seed_err) started = walk_start(w) == 0;
    Py_END_ALLOW_THREADS
    if (seed_err) {
        errno = seed_err;
        return PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, a->label);
    }
    if (!started) {
        Py_BEGIN_ALLOW_THREADS
        drain_queues(w);
        Py_END_ALLOW_THREADS
        PyErr_SetString(PyExc_RuntimeError, "could not start walker threads");
        return NULL;
    }
    Hooks h = {.progress = a->progress, .trace = a->trace, .progress_value = entries_so_far};
    if (wait_walk(w, &h) < 0) return NULL;
    unsigned long long counts[N_DTYPES] = {0}, dirs = 0;
    for (int i = 0; i < w->nworkers; i++) {
        for (int t = 0; t < N_DTYPES; t++) counts[t] += w->workers[i].counts[t];
        dirs += w->workers[i].dirs;
    }
    PyObject *ct = PyTuple_New(N_DTYPES);
    if (!ct) return NULL;
    for (int t = 0; t < N_DTYPES; t++) {
        PyObject *v = PyLong_FromUnsignedLongLong(counts[t]);
        if (!v) {
            Py_DECREF(ct);
            return NULL;
        }
        PyTuple_SET_ITEM(ct, t, v);
    }
    PyObject *fails = failures_list(w);
    if (!fails) {
        Py_DECREF(ct);
        return NULL;
    }
    return Py_BuildValue("(NLKN)", ct, (long long)atomic_load(&w->progress), dirs, fails);
}

#define WALK_KWLIST "threads", "max_depth", "min_depth", "follow", "xdev", "types", "bufsize", "include", \
                    "exclude", "prune", "descend", "label", "trace"

/* The keyword options every walk takes, in WALK_KWLIST order (for PyArg_ParseTupleAndKeywords). */
#define WALK_FORMAT "iiippInOOOOOO"
#define WALK_ARGS(a) &(a).threads, &(a).max_depth, &(a).min_depth, &(a).follow, &(a).xdev, &(a).types, \
                     &(a).bufsize, &(a).include, &(a).exclude, &(a).prune, &(a).descend, &(a).label, &(a).trace

static PyObject *walk_to_the_end(PyObject *module, Config *cfg, PyArgs *a) {
    if (config_from(module, cfg, a) < 0) return NULL;
    Walk *w = walk_alloc(cfg);
    if (!w) return PyErr_NoMemory();
    PyObject *res = run_blocking(w, a);
    walk_free(w);
    return res;
}

static PyObject *walk_count(PyObject *module, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"root", WALK_KWLIST, "progress", NULL};
    PyArgs a = PYARGS_DEFAULTS;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|$" WALK_FORMAT "O:walk_count", kwlist, &a.root, WALK_ARGS(a),
                                     &a.progress))
        return NULL;
    Config cfg = {.mode = M_COUNT};
    return walk_to_the_end(module, &cfg, &a);
}

static PyObject *walk_write(PyObject *module, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"root", "out_fd", "json", "sep", WALK_KWLIST, "progress", NULL};
    PyArgs a = PYARGS_DEFAULTS;
    int json = 0;
    Config cfg = {.mode = M_WRITE, .sep = '\n'};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "Oi|pc$" WALK_FORMAT "O:walk_write", kwlist, &a.root, &cfg.out_fd,
                                     &json, &cfg.sep, WALK_ARGS(a), &a.progress))
        return NULL;
    cfg.fmt = json ? F_JSON : F_LINES;
    return walk_to_the_end(module, &cfg, &a);
}

/* ---- the events iterator: manyfiles._dents.Walk --------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    Walk *w;
    PyObject *keep; /* (include, exclude, prune, descend, label): the Glob objects the workers read */
    PyObject *label;
    PyObject *trace; /* trace(flat, threads), or NULL (see the I/O log above) */
    int as_bytes;
    int state;      /* 0 running, 1 finished */
    /* next() releases the GIL while it waits: a close() from another thread meanwhile only
     * cancels, and the iterating thread frees the walk when it wakes up */
    atomic_int busy;
    atomic_int close_pending;
} WalkObject;

static void walkobj_finish(WalkObject *self) {
    if (!self->w) return;
    if (atomic_load(&self->busy)) {
        walk_cancel(self->w);
        atomic_store(&self->close_pending, 1);
        return;
    }
    Walk *w = self->w;
    Py_BEGIN_ALLOW_THREADS
    walk_cancel(w);
    walk_join(w);
    walk_free(w);
    Py_END_ALLOW_THREADS
    self->w = NULL;
    self->state = 1;
}

static PyObject *walkobj_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"root", WALK_KWLIST, "as_bytes", "postorder", NULL};
    PyArgs a = PYARGS_DEFAULTS;
    int as_bytes = 0, post = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|$" WALK_FORMAT "pp:Walk", kwlist, &a.root, WALK_ARGS(a),
                                     &as_bytes, &post))
        return NULL;
    PyObject *module = PyType_GetModule(type);
    ModState *st = mod_state(module);
    if (!st->entry_type || !st->listing_type) {
        PyErr_SetString(PyExc_RuntimeError, "set_types() was not called");
        return NULL;
    }
    Config cfg = {.mode = M_EVENTS, .postorder = post};
    if (config_from(module, &cfg, &a) < 0) return NULL;
    WalkObject *self = (WalkObject *)type->tp_alloc(type, 0);
    if (!self) return NULL;
    self->as_bytes = as_bytes;
    self->label = Py_NewRef(a.label);
    self->keep = Py_BuildValue("(OOOO)", a.include ? a.include : Py_None, a.exclude ? a.exclude : Py_None,
                               a.prune ? a.prune : Py_None, a.descend ? a.descend : Py_None);
    if (!self->keep) {
        Py_DECREF(self);
        return NULL;
    }
    self->trace = Py_XNewRef(a.trace);
    Walk *w = walk_alloc(&cfg);
    if (!w) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    self->w = w;
    int seed_err, started = 0;
    const char *label = PyBytes_AS_STRING(a.label);
    size_t label_len = (size_t)PyBytes_GET_SIZE(a.label);
    int root_fd = a.root_fd;
    Py_BEGIN_ALLOW_THREADS
    seed_err = walk_seed(w, root_fd, label, label_len);
    if (!seed_err) started = walk_start(w) == 0;
    Py_END_ALLOW_THREADS
    if (seed_err) {
        /* the root itself failed: one error event, like any other unreadable directory */
        Batch *b = calloc(1, sizeof(*b));
        WDir *d = malloc(sizeof(WDir) + label_len + 1);
        if (!b || !d) {
            free(b);
            free(d);
            Py_DECREF(self);
            return PyErr_NoMemory();
        }
        d->depth = 0;
        memcpy(d->path, label, label_len + 1);
        dir_set_len(d, label_len);
        int rc = batch_set_path(b, d, EV_DIR, seed_err);
        free(d);
        if (rc < 0) {
            batch_free(b);
            Py_DECREF(self);
            return PyErr_NoMemory();
        }
        w->q_head = w->q_tail = b;
    } else if (!started) {
        Py_DECREF(self);
        PyErr_SetString(PyExc_RuntimeError, "could not start walker threads");
        return NULL;
    }
    return (PyObject *)self;
}

static void walkobj_dealloc(WalkObject *self) {
    PyTypeObject *tp = Py_TYPE(self);
    walkobj_finish(self);
    Py_XDECREF(self->keep);
    Py_XDECREF(self->label);
    Py_XDECREF(self->trace);
    tp->tp_free(self);
    Py_DECREF(tp);
}

static PyObject *batch_to_python(WalkObject *self, ModState *st, Batch *b) {
    PyObject *path = make_name(b->path, b->pathlen, self->as_bytes);
    if (!path) return NULL;
    if (b->kind == EV_POST) {
        PyObject *t = Py_BuildValue("(sNi)", "post", path, b->depth);
        return t;
    }
    PyObject *entries = PyList_New((Py_ssize_t)b->n);
    PyObject *error = Py_None;
    if (!entries) goto fail;
    PyTypeObject *et = (PyTypeObject *)st->entry_type;
    for (size_t i = 0; i < b->n; i++) {
        const struct BEnt *e = &b->ents[i];
        PyObject *name = make_name(b->names + e->off, e->len, self->as_bytes);
        PyObject *ino = name ? PyLong_FromUnsignedLongLong(e->ino) : NULL;
        PyObject *item = ino ? et->tp_alloc(et, 3) : NULL;
        if (!item) {
            Py_XDECREF(name);
            Py_XDECREF(ino);
            goto fail;
        }
        PyTuple_SET_ITEM(item, 0, name);
        PyTuple_SET_ITEM(item, 1, Py_NewRef(st->type_letters[e->type]));
        PyTuple_SET_ITEM(item, 2, ino);
        PyObject_GC_UnTrack(item); /* a str and two ints: never part of a cycle */
        PyList_SET_ITEM(entries, (Py_ssize_t)i, item);
    }
    if (b->err) {
        PyObject *msg = PyUnicode_DecodeLocale(strerror(b->err), "surrogateescape");
        if (b->err == ELOOP) {
            Py_XDECREF(msg);
            msg = PyUnicode_FromString("File system loop detected");
        } else if (b->err == EXDEV) {
            Py_XDECREF(msg);
            msg = PyUnicode_FromString("is a mount point; not crossed");
        }
        if (!msg) goto fail;
        error = PyObject_CallFunction(PyExc_OSError, "iOO", b->err, msg, path);
        Py_DECREF(msg);
        if (!error) goto fail;
    } else {
        Py_INCREF(error);
    }
    if (b->trace.n && self->trace) {
        TraceLog *one = &b->trace;
        if (trace_deliver(self->trace, &one, &b->tid, 1) < 0) {
            Py_DECREF(error);
            goto fail;
        }
    }
    PyTypeObject *lt = (PyTypeObject *)st->listing_type;
    PyObject *res = lt->tp_alloc(lt, 5);
    if (!res) {
        Py_DECREF(error);
        goto fail;
    }
    /* DirListing(path, depth, entries, error, stats) */
    PyTuple_SET_ITEM(res, 0, path);
    PyTuple_SET_ITEM(res, 1, PyLong_FromLong(b->depth));
    PyTuple_SET_ITEM(res, 2, entries);
    PyTuple_SET_ITEM(res, 3, error);
    PyTuple_SET_ITEM(res, 4, Py_NewRef(Py_None));
    if (!PyTuple_GET_ITEM(res, 1)) {
        Py_DECREF(res);
        return NULL;
    }
    return res;
fail:
    Py_DECREF(path);
    Py_XDECREF(entries);
    return NULL;
}

static PyObject *walkobj_next_locked(WalkObject *self);

static PyObject *walkobj_next(WalkObject *self) {
    if (atomic_exchange(&self->busy, 1)) {
        PyErr_SetString(PyExc_ValueError, "walk already executing (in another thread)");
        return NULL;
    }
    PyObject *res = walkobj_next_locked(self);
    atomic_store(&self->busy, 0);
    if (atomic_load(&self->close_pending)) {
        Py_CLEAR(res);
        walkobj_finish(self);
    }
    return res;
}

static PyObject *walkobj_next_locked(WalkObject *self) {
    if (self->state || !self->w) return NULL;
    Walk *w = self->w;
    Batch *b = NULL;
    for (;;) {
        int over;
        Py_BEGIN_ALLOW_THREADS
        pthread_mutex_lock(&w->q_mu);
        if (!w->q_head && w->producers_done < w->nstarted) {
            struct timespec ts;
            deadline_after(&ts, WAIT_SLICE_NS);
            pthread_cond_timedwait(&w->q_cv, &w->q_mu, &ts);
        }
        b = w->q_head;
        if (b) {
            w->q_head = b->next;
            if (!w->q_head) w->q_tail = NULL;
        }
        over = !b && w->producers_done >= w->nstarted;
        pthread_mutex_unlock(&w->q_mu);
        Py_END_ALLOW_THREADS
        if (b) break;
        if (over) {
            int fatal = w->fatal;
            int rc = trace_drain(w, self->trace); /* directories that reported nothing (min_depth) */
            atomic_store(&self->busy, 0);
            walkobj_finish(self);
            if (rc < 0) return NULL;
            if (fatal) {
                errno = fatal;
                PyErr_SetFromErrno(PyExc_OSError);
            }
            return NULL;
        }
        if (PyErr_CheckSignals() < 0 || atomic_load(&self->close_pending)) {
            atomic_store(&self->busy, 0);
            walkobj_finish(self);
            return NULL;
        }
    }
    PyObject *res = batch_to_python(self, mod_state_of_type(Py_TYPE(self)), b);
    batch_recycle(w, b);
    return res;
}

static PyObject *walkobj_close(WalkObject *self, PyObject *unused) {
    walkobj_finish(self);
    Py_RETURN_NONE;
}

static PyObject *walkobj_enter(PyObject *self, PyObject *unused) { return Py_NewRef(self); }

static PyObject *walkobj_exit(WalkObject *self, PyObject *args) {
    walkobj_finish(self);
    Py_RETURN_FALSE;
}

static PyObject *walkobj_progress(WalkObject *self, void *closure) {
    return PyLong_FromLongLong(self->w ? (long long)atomic_load(&self->w->progress) : -1);
}

static PyMethodDef walkobj_methods[] = {
    {"close", (PyCFunction)walkobj_close, METH_NOARGS, "Stop the walk: cancel, join the threads, close every fd."},
    {"__enter__", walkobj_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)walkobj_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef walkobj_getset[] = {
    {"entries_so_far", (getter)walkobj_progress, NULL, "entries reported by the workers so far", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot walk_slots[] = {
    {Py_tp_new, walkobj_new},
    {Py_tp_dealloc, walkobj_dealloc},
    {Py_tp_iter, PyObject_SelfIter},
    {Py_tp_iternext, walkobj_next},
    {Py_tp_methods, walkobj_methods},
    {Py_tp_getset, walkobj_getset},
    {Py_tp_doc, "Walk(root, *, threads, max_depth, min_depth, follow, xdev, types, bufsize, include, exclude, "
                "prune, descend, label, trace, as_bytes, postorder): iterate one DirListing per directory "
                "(and ('post', path, depth) after a directory's subtree when postorder)."},
    {0, NULL},
};

static PyType_Spec walk_spec = {
    "manyfiles._dents.Walk", sizeof(WalkObject), 0, Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE, walk_slots,
};

int walk_add_type(PyObject *module, ModState *st) {
    st->walk_type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &walk_spec, NULL);
    if (!st->walk_type) return -1;
    return PyModule_AddType(module, st->walk_type);
}

PyMethodDef walk_functions[] = {
    {"walk_count", (PyCFunction)(void (*)(void))walk_count, METH_VARARGS | METH_KEYWORDS,
     "walk_count(root, *, threads=4, max_depth=-1, min_depth=0, follow=False, xdev=False, types=0, "
     "bufsize=32K, include=None, exclude=None, prune=None, descend=None, label=None, trace=None, "
     "progress=None) -> (counts per d_type (16-tuple), entries, directories, failures [(path, errno, depth, None)]); "
     "trace(flat, threads) receives the I/O log (see docs/fastls.md), progress(entries so far) is called "
     "about ten times a second"},
    {"remove_tree", (PyCFunction)(void (*)(void))remove_tree, METH_VARARGS | METH_KEYWORDS, remove_tree_doc},
    {"walk_write", (PyCFunction)(void (*)(void))walk_write, METH_VARARGS | METH_KEYWORDS,
     "walk_write(root, out_fd, json=False, sep=b'\\n', *, <walk_count's options>) -> the same tuple; writes "
     "one path + sep (or one JSON line) per entry to out_fd, in whole lines per write(2)"},
    {NULL, NULL, 0, NULL},
};
