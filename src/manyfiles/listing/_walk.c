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
 *           that finished its last child (post-order)                -> remove_tree()
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
#include "_dents.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

enum { M_COUNT, M_WRITE, M_EVENTS, M_REMOVE };
enum { F_LINES, F_JSON };
enum { EV_DIR, EV_POST };

#define OUT_BUFSIZE (256 * 1024)
#define WAIT_SLICE_NS (100 * 1000 * 1000) /* the Python thread checks signals this often */

/* Operations in the I/O log (names as manyfiles.trace.iotrace calls them). */
enum { OP_GETDENTS, OP_OPEN, OP_UNLINK, OP_RMDIR, OP_STAT, N_OPS };
static const char *const OP_NAMES[N_OPS] = {"getdents", "open", "unlink", "rmdir", "stat"};

/* ---- directories ---------------------------------------------------------------------------- */

typedef struct WDir {
    struct WDir *parent; /* referenced while we still need its fd (see dir_release) */
    atomic_int refs;
    int fd;
    int depth;
    int listed;        /* read to the end: only such directories get a post-order event */
    /* remove mode */
    uint8_t take;      /* everything inside goes (no include filter below here) */
    uint8_t take_self; /* rmdir it once its subtree is done */
    uint8_t gone;      /* vanished (or was not a directory any more): nothing left to do */
    uint8_t anchor;    /* the root's parent: an fd the caller owns, never closed or removed */
    atomic_int blocked; /* something inside stays: no rmdir (ancestors stay too, silently) */
    uint32_t len;      /* bytes of path */
    uint32_t name_off; /* path + name_off is the directory's own name */
    uint32_t rel_off;  /* path + rel_off is the path relative to the root ("" for the root) */
    char path[];
} WDir;

static WDir *dir_new(const WDir *parent, const char *name, size_t name_len) {
    size_t plen = parent->len;
    int slash = plen > 0 && parent->path[plen - 1] != '/';
    size_t len = plen + (size_t)slash + name_len;
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
    d->len = (uint32_t)len;
    d->name_off = (uint32_t)(plen + slash);
    /* the root's children: rel = name; deeper: parent's rel + '/' + name */
    d->rel_off = parent->depth == 0 ? d->name_off : parent->rel_off;
    return d;
}

/* ---- configuration and shared state --------------------------------------------------------- */

typedef struct {
    int mode, fmt;
    char sep;
    int out_fd;
    int threads;
    int max_depth; /* < 0: no limit */
    int min_depth; /* entries are reported from directories at this depth or deeper */
    int follow, xdev, postorder;
    unsigned types; /* bit (1 << d_type) per type to report; 0 = all */
    const GlobSet *include, *exclude, *prune;
    const GlobSet *descend[8]; /* descend[d]: a directory at depth d+1 is entered only if it matches */
    int ndescend;
    size_t bufsize;
    int fake_dtype;
    int trace;
    int max_batches;
    /* remove mode */
    int dry_run, cross, retries;
    int collect;             /* removed paths go to the Python thread in batches (on_removed) */
    int has_expect;          /* the root must be this (st_dev, st_ino): a plan's identity check */
    dev_t expect_dev, dev;   /* dev: the argument's filesystem, for the mount check */
    ino_t expect_ino;
} Config;

typedef struct {
    int64_t start, dur;
    long a, b;       /* getdents: entries, bytes */
    int op, result;  /* OP_x; 0 or the errno */
    size_t path_off; /* into the owner's arena */
} TraceRec;

typedef struct {
    TraceRec *v;
    size_t n, cap;
    char *arena;
    size_t used, acap;
} TraceLog;

typedef struct Batch {
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
} Batch;

typedef struct {
    char *path;
    int err;
    int depth;
    char *detail; /* a longer reason (remove mode: what keeps a directory from being empty), or NULL */
} Failure;

/* Removed paths on their way to the Python thread (remove mode with on_removed): NUL-ended. */
typedef struct {
    char *buf;
    size_t used, cap, n;
} PathBatch;

struct slot {
    uint64_t ino;
    struct linux_dirent64 *d;
};

struct Walk;

typedef struct Worker {
    struct Walk *w;
    pthread_t tid;
    int started;
    char *buf;
    size_t bufsize;
    /* the deque: owner pushes and pops at hi, thieves take at lo */
    pthread_mutex_t mu;
    WDir **dq;
    size_t lo, hi, cap;
    /* children found in the current directory, pushed when it is fully read */
    WDir **kids;
    size_t nkids, kcap;
    /* mode state */
    unsigned long long counts[N_DTYPES];
    unsigned long long dirs;
    char *out;
    size_t used, ocap;
    char *scratch; /* relative paths for '/' patterns */
    size_t scap;
    Batch *batch;
    TraceLog trace;            /* count/write/remove modes: drained by the Python thread */
    pthread_mutex_t trace_mu;
    long ktid;                 /* kernel thread id, for the I/O log */
    /* remove mode */
    char *pathbuf;             /* full paths of entries (failures, output, trace) */
    size_t pcap;
    struct slot *slots;        /* one getdents batch, sorted by inode before unlinking */
    size_t slcap;
    PathBatch removed;         /* collect: paths waiting to be handed over */
    int waiting;               /* collect: our batch is posted and not consumed yet (under q_mu) */
    struct Worker *cq_next;
} Worker;

typedef struct Walk {
    Config cfg;
    int nworkers;
    Worker *workers;
    pthread_mutex_t mu;
    pthread_cond_t work_cv; /* idle workers */
    atomic_long pending;    /* directories queued or being processed */
    atomic_long queued;     /* directories sitting in deques */
    atomic_int idle;
    atomic_int stop;        /* cancel: Ctrl-C, a closed pipe, the consumer went away, ENOMEM */
    int nstarted;           /* worker threads that started */
    dev_t root_dev;
    /* remove mode counters */
    atomic_llong files, dirs, found, kept, retries;
    atomic_llong progress;  /* entries reported so far */
    int fatal;              /* errno that stopped the walk (ENOMEM), under mu */
    /* -L: directories seen, by (st_dev, st_ino) */
    pthread_mutex_t seen_mu;
    struct DevIno { dev_t dev; ino_t ino; } *seen;
    size_t nseen, seen_cap;
    /* failures (count/write modes) */
    pthread_mutex_t err_mu;
    Failure *fails;
    size_t nfails, fcap;
    /* write mode */
    pthread_mutex_t out_mu;
    int out_err;
    /* events mode */
    pthread_mutex_t q_mu;
    pthread_cond_t q_cv;    /* the Python thread waits for a batch, or for the workers' end */
    pthread_cond_t free_cv; /* producers wait for a free batch (remove: for their batch's consumption) */
    Batch *q_head, *q_tail, *free_list;
    int nbatches, nfree, free_waiters;
    int producers_done;     /* worker threads that returned */
    /* remove mode, collect: workers whose removed-path batch waits for the Python thread */
    Worker *cq_head, *cq_tail;
    Worker *cq_busy;        /* the one the Python thread is reading */
} Walk;

/* ---- small helpers ---------------------------------------------------------------------------- */

static void set_fatal(Walk *w, int err) {
    pthread_mutex_lock(&w->mu);
    if (!w->fatal) w->fatal = err;
    pthread_mutex_unlock(&w->mu);
    atomic_store(&w->stop, 1);
}

/* One record of the I/O log: `op` on d's path (+ "/" + name when name is not NULL).  A
 * worker's own log is read by the Python thread meanwhile: `mu` (its lock) or NULL for a
 * batch's log, which only the worker touches until the batch is handed over. */
static void trace_add(Walk *w, TraceLog *t, pthread_mutex_t *mu, int op, const WDir *d, const char *name,
                      size_t nl, int64_t start, int64_t dur, int result, long a, long b) {
    size_t slash = name && d->len > 0 && d->path[d->len - 1] != '/';
    size_t plen = d->len + (name ? slash + nl : 0);
    if (mu) pthread_mutex_lock(mu);
    int ok = grow_array((void **)&t->v, &t->cap, t->n + 1, sizeof(TraceRec)) == 0 &&
             grow_array((void **)&t->arena, &t->acap, t->used + plen + 1, 1) == 0;
    if (ok) {
        char *p = t->arena + t->used;
        memcpy(p, d->path, d->len);
        if (name) {
            if (slash) p[d->len] = '/';
            memcpy(p + d->len + slash, name, nl);
        }
        p[plen] = 0;
        t->v[t->n++] = (TraceRec){start, dur, a, b, op, result, t->used};
        t->used += plen + 1;
    }
    if (mu) pthread_mutex_unlock(mu);
    if (!ok) set_fatal(w, ENOMEM);
}

/* A worker's own log (count, write and remove modes), for a call that started at `start`. */
static inline void wtrace(Worker *wk, int op, const WDir *d, const char *name, size_t nl, int64_t start,
                          int result) {
    trace_add(wk->w, &wk->trace, &wk->trace_mu, op, d, name, nl, start, now_ns() - start, result, 0, 0);
}

static void add_failure_path(Walk *w, const char *path, size_t len, int err, int depth, const char *detail) {
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

static void add_failure(Walk *w, const WDir *d, int err) { add_failure_path(w, d->path, d->len, err, d->depth, NULL); }

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

static void push_kids(Worker *wk) {
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

/* ---- events: batches handed to the Python consumer -------------------------------------------------- */

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

static int out_flush(Walk *w, Worker *wk) {
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

static int out_reserve(Worker *wk, size_t need) {
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
    size_t plen = d->len, slash = plen > 0 && d->path[plen - 1] != '/';
    size_t full = plen + slash + nl;
    size_t need = 6 * full + 6 * nl + 4 * (full / 3 + 1) + 128;
    if (out_reserve(wk, need + full) < 0) return -1;
    /* the raw path first, at the end of the reserved area, for base64 */
    char *raw = wk->out + wk->used + need;
    memcpy(raw, d->path, plen);
    if (slash) raw[plen] = '/';
    memcpy(raw + plen + slash, name, nl);
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
    size_t plen = d->len, slash = plen > 0 && d->path[plen - 1] != '/';
    if (out_reserve(wk, plen + slash + nl + 1) < 0) return -1;
    char *p = wk->out + wk->used;
    p = put(p, d->path, plen);
    if (slash) *p++ = '/';
    p = put(p, name, nl);
    *p++ = wk->w->cfg.sep;
    wk->used = (size_t)(p - wk->out);
    return 0;
}

/* ---- one directory ------------------------------------------------------------------------------- */

static void dir_release(Worker *wk, WDir *d);

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

/* Drops one reference; the last one closes the fd, emits the post-order event and (in
 * post-order mode, where children hold their parent until they finish) walks up. */
static void rm_finish(Worker *wk, WDir *d);
static void rm_sync(Worker *wk);

static void dir_release(Worker *wk, WDir *d) {
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

static long read_dir(Worker *wk, int fd) {
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

/* The entry's path relative to the root, in the worker's scratch buffer (for '/' patterns). */
static const char *rel_path(Worker *wk, const WDir *d, const char *name, size_t nl, size_t *rl) {
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

static int open_dir(Walk *w, WDir *d) {
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
        for (size_t i = 0; i < wk->nkids; i++) free(wk->kids[i]);
        wk->nkids = 0;
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
    d->listed = 1;
    atomic_fetch_add(&w->progress, listed);
    if (wk->batch) {
        batch_put(w, wk->batch);
        wk->batch = NULL;
    }
    /* children reference us (our fd) until they have opened themselves (or finished) */
    atomic_fetch_add(&d->refs, (int)wk->nkids);
    push_kids(wk);
    goto done;
nomem:
    set_fatal(w, ENOMEM);
stopped:
    for (size_t i = 0; i < wk->nkids; i++) free(wk->kids[i]);
    wk->nkids = 0;
    if (wk->batch) {
        batch_recycle(w, wk->batch);
        wk->batch = NULL;
    }
done:
    dir_release(wk, d);
}

/* ---- remove mode (fastrm) ---------------------------------------------------------------------------
 *
 * Every unlink(2) and rmdir(2) takes the parent directory's lock, so a worker owns one directory
 * at a time: it lists it and unlinks each non-directory with unlinkat(dir_fd, name) as it reads
 * (sorted by inode per getdents batch, as GNU rm does, so the inode table is read in order).
 * The d_type says "directory"; when it is DT_UNKNOWN (sshfs, NFSv3) the unlink's EISDIR says so,
 * and only EPERM (which POSIX allows for a directory) costs an fstatat.  Subdirectories are
 * queued after the directory's own files are gone; a directory is removed once its subtree is
 * done, by the thread that finished its last child, relative to its parent's fd (children keep
 * it open).  Nothing follows a symlink (O_NOFOLLOW), mounts are not entered unless asked, and a
 * failure (path + errno) blocks the removal of its ancestors without stopping the walk.
 * An rmdir meeting ENOTEMPTY (a concurrent writer, an NFS .nfsXXXX silly-rename) empties the
 * directory again, in this thread, and retries with back-off. */

#define FLUSH_PATHS 4096 /* removed paths per batch handed to on_removed */
#define RETRY_BACKOFF_NS (50 * 1000 * 1000)

/* d's path + "/" + name in the worker's path buffer (failures, output). */
static const char *entry_path(Worker *wk, const WDir *d, const char *name, size_t nl, size_t *len) {
    size_t slash = d->len > 0 && d->path[d->len - 1] != '/';
    size_t n = d->len + slash + nl;
    if (grow_array((void **)&wk->pathbuf, &wk->pcap, n + 1, 1) < 0) return NULL;
    memcpy(wk->pathbuf, d->path, d->len);
    if (slash) wk->pathbuf[d->len] = '/';
    memcpy(wk->pathbuf + d->len + slash, name, nl);
    wk->pathbuf[n] = 0;
    *len = n;
    return wk->pathbuf;
}

static void rm_fail(Worker *wk, const WDir *d, const char *name, size_t nl, int err, const char *detail) {
    size_t len = d->len;
    const char *path = name ? entry_path(wk, d, name, nl, &len) : d->path;
    if (!path) {
        set_fatal(wk->w, ENOMEM);
        return;
    }
    add_failure_path(wk->w, path, len, err, d->depth + (name != NULL), detail);
}

/* The Python thread runs on_removed with this worker's batch; the worker waits meanwhile, so
 * the callback sees the tree as it is (the directory holding these paths is not removed yet). */
static void collect_post(Worker *wk) {
    Walk *w = wk->w;
    PathBatch *pb = &wk->removed;
    if (!pb->n) return;
    pthread_mutex_lock(&w->q_mu);
    if (!atomic_load(&w->stop)) {
        wk->waiting = 1;
        wk->cq_next = NULL;
        if (w->cq_tail) w->cq_tail->cq_next = wk;
        else w->cq_head = wk;
        w->cq_tail = wk;
        pthread_cond_broadcast(&w->q_cv);
        while (wk->waiting && !(atomic_load(&w->stop) && w->cq_busy != wk)) pthread_cond_wait(&w->free_cv, &w->q_mu);
        wk->waiting = 0;
    }
    pthread_mutex_unlock(&w->q_mu);
    pb->used = pb->n = 0;
}

/* A removed (or, in a dry run, removable) path goes to the output: an fd, or on_removed. */
static void rm_emit(Worker *wk, const char *path, size_t len) {
    Walk *w = wk->w;
    if (w->cfg.out_fd >= 0) {
        if (out_reserve(wk, len + 1) < 0) return;
        memcpy(wk->out + wk->used, path, len);
        wk->out[wk->used + len] = w->cfg.sep;
        wk->used += len + 1;
    } else if (w->cfg.collect) {
        PathBatch *pb = &wk->removed;
        if (grow_array((void **)&pb->buf, &pb->cap, pb->used + len + 1, 1) < 0) {
            set_fatal(w, ENOMEM);
            return;
        }
        memcpy(pb->buf + pb->used, path, len);
        pb->buf[pb->used + len] = 0;
        pb->used += len + 1;
        if (++pb->n >= FLUSH_PATHS) collect_post(wk);
    }
}

static void rm_emit_entry(Worker *wk, const WDir *d, const char *name, size_t nl) {
    if (wk->w->cfg.out_fd < 0 && !wk->w->cfg.collect) return;
    size_t len;
    const char *path = entry_path(wk, d, name, nl, &len);
    if (!path) set_fatal(wk->w, ENOMEM);
    else rm_emit(wk, path, len);
}

static void rm_sync(Worker *wk) {
    Walk *w = wk->w;
    if (w->cfg.out_fd >= 0) out_flush(w, wk);
    else if (w->cfg.collect) collect_post(wk);
}

/* on_removed has seen every path removed so far from inside a directory before that directory is
 * removed (so a callback may still act on it, as a concurrent writer would). */
static inline void before_rmdir(Worker *wk) {
    if (wk->w->cfg.collect) collect_post(wk);
}

static int rm_unlink(Worker *wk, const WDir *d, const char *name, size_t nl) {
    int trace = wk->w->cfg.trace;
    int64_t t0 = trace ? now_ns() : 0;
    int err = unlinkat(d->fd, name, 0) < 0 ? errno : 0;
    if (trace) wtrace(wk, OP_UNLINK, d, name, nl, t0, err);
    return err;
}

/* fstatat without following: is `name` in d a directory (a symlink to one is not)? */
static int rm_is_dir(Worker *wk, const WDir *d, const char *name, size_t nl) {
    int trace = wk->w->cfg.trace;
    int64_t t0 = trace ? now_ns() : 0;
    struct stat st;
    int err = fstatat(d->fd, name, &st, AT_SYMLINK_NOFOLLOW) < 0 ? errno : 0;
    if (trace) wtrace(wk, OP_STAT, d, name, nl, t0, err);
    return !err && S_ISDIR(st.st_mode);
}

static int rm_open(Worker *wk, WDir *d) {
    int trace = wk->w->cfg.trace;
    int64_t t0 = trace ? now_ns() : 0;
    int fd = open_dir(wk->w, d); /* relative to the parent, O_NOFOLLOW */
    int err = fd < 0 ? errno : 0;
    if (trace) wtrace(wk, OP_OPEN, d, NULL, 0, t0, err);
    d->fd = fd;
    return err;
}

enum { RM_KEPT, RM_FILE, RM_DIR };

/* An entry of d that goes (or would go): RM_FILE once unlinked, RM_DIR when it is a directory
 * (to enter), RM_KEPT when it stays (gone already, or a failure, recorded). */
static int rm_entry(Worker *wk, WDir *d, const char *name, size_t nl, unsigned char type) {
    if (wk->w->cfg.dry_run) {
        if (type == DT_UNKNOWN && rm_is_dir(wk, d, name, nl)) return RM_DIR;
        rm_emit_entry(wk, d, name, nl);
        return RM_FILE;
    }
    int err = rm_unlink(wk, d, name, nl);
    if (!err) {
        rm_emit_entry(wk, d, name, nl);
        return RM_FILE;
    }
    if (err == ENOENT) return RM_KEPT; /* removed by someone else meanwhile */
    /* Linux answers unlink on a directory with EISDIR; POSIX also allows EPERM, which on Linux
     * means immutable/append-only or a sticky directory: only then look */
    if (err == EISDIR || (err == EPERM && rm_is_dir(wk, d, name, nl))) return RM_DIR;
    rm_fail(wk, d, name, nl, err, NULL);
    atomic_store(&d->blocked, 1);
    return RM_KEPT;
}

static int by_inode(const void *a, const void *b) {
    uint64_t x = ((const struct slot *)a)->ino, y = ((const struct slot *)b)->ino;
    return (x > y) - (x < y);
}

/* Opening d failed: gone, replaced, or a real failure. */
static void rm_open_failed(Worker *wk, WDir *d, int err) {
    const Config *c = &wk->w->cfg;
    if (err == ENOENT) {
        d->gone = 1; /* removed by someone else: fine */
        return;
    }
    int replaced = err == ELOOP || err == ENOTDIR;
    if (replaced && !(c->has_expect && d->depth == 0)) {
        /* a symlink or a file took its place since it was listed: remove that, never follow it */
        d->gone = 1;
        if (d->take) {
            WDir *p = d->parent;
            int e = c->dry_run ? 0 : unlinkat(p->fd, d->path + d->name_off, 0) < 0 ? errno : 0;
            if (!e) {
                atomic_fetch_add(&wk->w->files, 1);
                rm_emit(wk, d->path, d->len);
            } else if (e != ENOENT) {
                add_failure(wk->w, d, e);
                atomic_store(&p->blocked, 1);
            }
        }
        return;
    }
    add_failure(wk->w, d, replaced ? ESTALE : err);
    atomic_store(&d->blocked, 1);
}

/* Identity (a plan's root) and mount checks on the opened d; 0 or the errno that stops it. */
static int rm_check(Walk *w, WDir *d) {
    Config *c = &w->cfg;
    int root = d->depth == 0;
    if (c->cross && !(root && c->has_expect)) return 0;
    struct stat st;
    if (fstat(d->fd, &st) < 0) return errno;
    if (root && c->has_expect && (st.st_dev != c->expect_dev || st.st_ino != c->expect_ino)) return ESTALE;
    /* only this thread runs while the root is processed: the children see the value (push_kids' lock) */
    if (root && c->dev == (dev_t)-1) c->dev = st.st_dev;
    if (!c->cross && st.st_dev != c->dev) return EXDEV;
    return 0;
}

static void process_remove(Worker *wk, WDir *d) {
    Walk *w = wk->w;
    const Config *c = &w->cfg;
    long long files = 0, found = 0, kept = 0;
    int err;
    if (d->fd < 0 && (err = rm_open(wk, d)) != 0) {
        rm_open_failed(wk, d, err);
        goto done;
    }
    if ((err = rm_check(w, d)) != 0) {
        add_failure(w, d, err);
        atomic_store(&d->blocked, 1);
        goto done;
    }
    int need_rel = (c->include && c->include->any_slash) || (c->exclude && c->exclude->any_slash);
    for (;;) {
        int64_t t0 = c->trace ? now_ns() : 0;
        long n = read_dir(wk, d->fd);
        if (n < 0) {
            err = errno;
            break;
        }
        size_t m = 0;
        for (long pos = 0; pos < n;) {
            struct linux_dirent64 *e = (struct linux_dirent64 *)(wk->buf + pos);
            pos += e->d_reclen;
            if (is_dot(e->d_name)) continue;
            if (grow_array((void **)&wk->slots, &wk->slcap, m + 1, sizeof(struct slot)) < 0) goto nomem;
            wk->slots[m++] = (struct slot){e->d_ino, e};
        }
        if (c->trace) trace_add(w, &wk->trace, &wk->trace_mu, OP_GETDENTS, d, NULL, 0, t0, now_ns() - t0, 0, (long)m, n);
        if (n == 0) break;
        found += (long long)m;
        if (!c->dry_run && m > 1) qsort(wk->slots, m, sizeof(struct slot), by_inode);
        for (size_t i = 0; i < m; i++) {
            struct linux_dirent64 *e = wk->slots[i].d;
            const char *name = e->d_name;
            size_t nl = strlen(name);
            unsigned char type = effective_dtype(c->fake_dtype, e->d_type);
            size_t rl = 0;
            const char *rel = need_rel ? rel_path(wk, d, name, nl, &rl) : NULL;
            if (need_rel && !rel) goto nomem;
            if (c->exclude && globset_match(c->exclude, name, nl, rel, rl)) {
                kept++; /* kept, and a kept directory is not entered; its ancestors stay */
                atomic_store(&d->blocked, 1);
                continue;
            }
            int take = d->take || (c->include && globset_match(c->include, name, nl, rel, rl));
            int is_dir = type == DT_DIR;
            if (!is_dir && take) {
                int r = rm_entry(wk, d, name, nl, type);
                files += r == RM_FILE;
                is_dir = r == RM_DIR;
            } else if (!is_dir && type == DT_UNKNOWN) {
                is_dir = rm_is_dir(wk, d, name, nl); /* a directory that does not match is still searched */
            }
            if (!is_dir) continue;
            if (grow_array((void **)&wk->kids, &wk->kcap, wk->nkids + 1, sizeof(WDir *)) < 0) goto nomem;
            WDir *kid = dir_new(d, name, nl);
            if (!kid) goto nomem;
            kid->take = kid->take_self = (uint8_t)take;
            wk->kids[wk->nkids++] = kid;
        }
        atomic_fetch_add(&w->files, files);
        atomic_fetch_add(&w->found, found);
        files = found = 0;
        if (atomic_load(&w->stop)) goto stopped;
    }
    if (err) { /* the listing is incomplete: say so, keep the directory and all above it */
        add_failure(w, d, err);
        atomic_store(&d->blocked, 1);
        goto stopped;
    }
    d->listed = 1;
    /* children reference us (our fd) until they are finished */
    atomic_fetch_add(&d->refs, (int)wk->nkids);
    push_kids(wk);
    goto done;
nomem:
    set_fatal(w, ENOMEM);
stopped:
    for (size_t i = 0; i < wk->nkids; i++) free(wk->kids[i]);
    wk->nkids = 0;
done:
    atomic_fetch_add(&w->files, files);
    atomic_fetch_add(&w->found, found);
    atomic_fetch_add(&w->kept, kept);
    dir_release(wk, d);
}

static void backoff(Walk *w, int attempt) {
    if (attempt == 0) return; /* the first retry at once: a racing writer is usually beaten by then */
    uint64_t x = (uint64_t)now_ns() * 0x9E3779B97F4A7C15ull;
    int64_t cap = (int64_t)RETRY_BACKOFF_NS << (attempt - 1 < 10 ? attempt - 1 : 10);
    int64_t ns = (int64_t)((x >> 11) % (uint64_t)cap); /* full jitter */
    while (ns > 0 && !atomic_load(&w->stop)) {
        int64_t slice = ns < WAIT_SLICE_NS ? ns : WAIT_SLICE_NS;
        struct timespec ts = {slice / 1000000000, slice % 1000000000};
        nanosleep(&ts, NULL);
        ns -= slice;
    }
}

/* Empties d again, depth-first, in this thread (the ENOTEMPTY retry path).  Errors are not
 * reported here: the rmdir that follows says what stayed. */
static void rm_clean(Worker *wk, WDir *d) {
    Walk *w = wk->w;
    const Config *c = &w->cfg;
    if (rm_open(wk, d) != 0) return;
    struct stat st;
    if (!c->cross && (fstat(d->fd, &st) < 0 || st.st_dev != c->dev)) goto out;
    /* every name first: our unlinks must not disturb the listing, and children need the buffer */
    char *names = NULL;
    size_t used = 0, cap = 0;
    long n;
    while ((n = read_dir(wk, d->fd)) > 0) {
        for (long pos = 0; pos < n;) {
            struct linux_dirent64 *e = (struct linux_dirent64 *)(wk->buf + pos);
            pos += e->d_reclen;
            if (is_dot(e->d_name)) continue;
            size_t nl = strlen(e->d_name);
            if (grow_array((void **)&names, &cap, used + nl + 2, 1) < 0) {
                free(names);
                set_fatal(w, ENOMEM);
                goto out;
            }
            names[used] = (char)effective_dtype(c->fake_dtype, e->d_type);
            memcpy(names + used + 1, e->d_name, nl + 1);
            used += nl + 2;
        }
    }
    long long files = 0, dirs = 0;
    for (size_t off = 0; off < used && !atomic_load(&w->stop);) {
        unsigned char type = (unsigned char)names[off];
        const char *name = names + off + 1;
        size_t nl = strlen(name);
        off += nl + 2;
        size_t rl = 0;
        const char *rel = c->exclude && c->exclude->any_slash ? rel_path(wk, d, name, nl, &rl) : NULL;
        if (c->exclude && globset_match(c->exclude, name, nl, rel, rl)) continue;
        if (type != DT_DIR) {
            int err = rm_unlink(wk, d, name, nl);
            if (!err) {
                files++;
                rm_emit_entry(wk, d, name, nl);
                continue;
            }
            if (!(err == EISDIR || (err == EPERM && rm_is_dir(wk, d, name, nl)))) continue;
        }
        WDir *kid = dir_new(d, name, nl);
        if (!kid) {
            set_fatal(w, ENOMEM);
            break;
        }
        rm_clean(wk, kid);
        before_rmdir(wk);
        int64_t t0 = c->trace ? now_ns() : 0;
        int err = unlinkat(d->fd, name, AT_REMOVEDIR) < 0 ? errno : 0;
        if (c->trace) wtrace(wk, OP_RMDIR, kid, NULL, 0, t0, err);
        if (!err) {
            dirs++;
            rm_emit(wk, kid->path, kid->len);
        }
        free(kid);
    }
    free(names);
    atomic_fetch_add(&w->files, files);
    atomic_fetch_add(&w->dirs, dirs);
    atomic_fetch_add(&w->found, files + dirs);
out:
    close(d->fd);
    d->fd = -1;
}

static int by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Why d is still not empty, naming a few entries (and NFS silly-renames, which go away only
 * when the last process holding the deleted file closes it); NULL if d cannot be read. */
static char *not_empty_detail(Worker *wk, WDir *d) {
    if (rm_open(wk, d) != 0) return NULL;
    char *names = NULL, **list = NULL, *out = NULL;
    size_t used = 0, cap = 0, n = 0, lcap = 0;
    long k;
    while ((k = read_dir(wk, d->fd)) > 0) {
        for (long pos = 0; pos < k;) {
            struct linux_dirent64 *e = (struct linux_dirent64 *)(wk->buf + pos);
            pos += e->d_reclen;
            if (is_dot(e->d_name)) continue;
            size_t nl = strlen(e->d_name);
            if (grow_array((void **)&names, &cap, used + nl + 1, 1) < 0) goto out;
            memcpy(names + used, e->d_name, nl + 1);
            used += nl + 1;
            n++;
        }
    }
    if (!n || grow_array((void **)&list, &lcap, n, sizeof(char *)) < 0) goto out;
    for (size_t off = 0, i = 0; i < n; i++) {
        list[i] = names + off;
        off += strlen(names + off) + 1;
    }
    qsort(list, n, sizeof(char *), by_name);
    size_t nfs = 0, shown[3], ns = 0, total = 0;
    for (size_t i = 0; i < n && nfs < 3; i++)
        if (strncmp(list[i], ".nfs", 4) == 0) shown[nfs++] = i;
    if (!nfs)
        for (size_t i = 0; i < n && i < 3; i++) shown[ns++] = i;
    size_t count = nfs ? nfs : ns;
    for (size_t i = 0; i < count; i++) total += strlen(list[shown[i]]) + 2;
    out = malloc(total + 80);
    if (!out) goto out;
    char *p = out;
    p += sprintf(p, "%s (%s: ", strerror(ENOTEMPTY),
                 nfs ? "NFS silly-renamed files still open" : "new entries keep appearing");
    for (size_t i = 0; i < count; i++) p += sprintf(p, "%s%s", i ? ", " : "", list[shown[i]]);
    sprintf(p, "%s)", !nfs && n > 3 ? ", ..." : "");
out:
    free(names);
    free(list);
    close(d->fd);
    d->fd = -1;
    return out;
}

/* rmdir d (its fd closed) relative to its parent; on ENOTEMPTY empty it again and retry.
 * Returns 0 or the errno; *detail may say what keeps appearing. */
static int rm_rmdir(Worker *wk, WDir *d, char **detail) {
    Walk *w = wk->w;
    const Config *c = &w->cfg;
    for (int attempt = 0;; attempt++) {
        before_rmdir(wk);
        int64_t t0 = c->trace ? now_ns() : 0;
        int err = unlinkat(d->parent->fd, d->path + d->name_off, AT_REMOVEDIR) < 0 ? errno : 0;
        if (c->trace) wtrace(wk, OP_RMDIR, d, NULL, 0, t0, err);
        if (err != ENOTEMPTY && err != EEXIST) return err;
        if (attempt >= c->retries || atomic_load(&w->stop)) {
            *detail = atomic_load(&w->stop) ? NULL : not_empty_detail(wk, d);
            return ENOTEMPTY;
        }
        atomic_fetch_add(&w->retries, 1);
        backoff(w, attempt);
        rm_clean(wk, d);
    }
}

/* d and everything below it are done: close it, remove it if it goes, tell the parent if it stays. */
static void rm_finish(Worker *wk, WDir *d) {
    Walk *w = wk->w;
    if (d->anchor) return; /* the caller's fd */
    if (d->fd >= 0) {
        close(d->fd);
        d->fd = -1;
    }
    WDir *parent = d->parent;
    if (d->gone) return;
    if (!d->listed || atomic_load(&d->blocked) || atomic_load(&w->stop)) {
        atomic_store(&parent->blocked, 1);
        return;
    }
    if (!d->take_self) return;
    if (w->cfg.dry_run) {
        atomic_fetch_add(&w->dirs, 1);
        rm_emit(wk, d->path, d->len);
        return;
    }
    char *detail = NULL;
    int err = rm_rmdir(wk, d, &detail);
    if (!err) {
        atomic_fetch_add(&w->dirs, 1);
        rm_emit(wk, d->path, d->len);
    } else if (err != ENOENT) {
        add_failure_path(w, d->path, d->len, err, d->depth, detail);
        atomic_store(&parent->blocked, 1);
    }
    free(detail);
}

/* The root: `label` (its path, for messages) names `label + name_off` in the open directory
 * `parent_fd`, which stays the caller's.  Queued on worker 0; 0 or an errno. */
static int walk_seed_remove(Walk *w, int parent_fd, const char *label, size_t label_len, size_t name_off,
                            int take, int take_self) {
    WDir *a = calloc(1, sizeof(WDir) + 1);
    WDir *d = calloc(1, sizeof(WDir) + label_len + 1);
    Worker *wk = &w->workers[0];
    if (!a || !d || grow_array((void **)&wk->kids, &wk->kcap, 1, sizeof(WDir *)) < 0) {
        free(a);
        free(d);
        return ENOMEM;
    }
    a->fd = parent_fd;
    a->anchor = 1;
    a->depth = -1;
    atomic_init(&a->refs, 1); /* the root's */
    d->parent = a;
    atomic_init(&d->refs, 1);
    d->fd = -1;
    memcpy(d->path, label, label_len);
    d->len = (uint32_t)label_len;
    d->name_off = (uint32_t)name_off;
    d->rel_off = (uint32_t)label_len;
    d->take = (uint8_t)take;
    d->take_self = (uint8_t)take_self;
    wk->kids[0] = d;
    wk->nkids = 1;
    push_kids(wk);
    return 0;
}

/* ---- workers ----------------------------------------------------------------------------------- */

static void process_remove(Worker *wk, WDir *d);

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

static void walk_free(Walk *w) {
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
static void drain_queues(Walk *w) {
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

static Walk *walk_alloc(const Config *cfg) {
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
    d->len = (uint32_t)label_len;
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

static int walk_start(Walk *w) {
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

typedef struct {
    PyObject *root, *label, *include, *exclude, *prune, *descend, *progress, *trace;
    int root_fd;
    Py_ssize_t bufsize;
    int threads, max_depth, min_depth, follow, xdev;
    unsigned types;
} PyArgs;

#define PYARGS_DEFAULTS {.bufsize = 32 * 1024, .threads = 4, .max_depth = -1}

static const GlobSet *glob_or_none(PyObject *o, ModState *st, int *ok) {
    if (o == NULL || o == Py_None) return NULL;
    const GlobSet *g = globset_from_object(o, st);
    if (!g) *ok = 0;
    return g;
}

static PyObject *callable_or_null(PyObject *o, const char *what, int *ok) {
    if (o == NULL || o == Py_None || o == Py_False) return NULL;
    if (!PyCallable_Check(o)) {
        PyErr_Format(PyExc_TypeError, "%s must be a callable or None", what);
        *ok = 0;
        return NULL;
    }
    return o;
}

/* Fills cfg's common fields from the keyword arguments (the mode's fields are the caller's);
 * returns 0, or -1 with an exception set. */
static int config_common(PyObject *module, Config *cfg, PyArgs *a) {
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

static PyObject *failures_list(Walk *w) {
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

typedef struct {
    PyObject *progress;   /* called about ten times a second with progress_value() */
    PyObject *trace;      /* trace(flat, threads), or NULL */
    PyObject *on_removed; /* remove mode: on_removed([path, ...]) per batch, or NULL */
    PyObject *(*progress_value)(Walk *w);
    int as_bytes;         /* on_removed paths as bytes (else str, decoded like os.fsdecode) */
} Hooks;

/* on_removed(the paths in wk's batch); the worker waits until this returns. */
static int hand_over(Worker *wk, const Hooks *h) {
    PathBatch *pb = &wk->removed;
    PyObject *list = PyList_New((Py_ssize_t)pb->n);
    if (!list) return -1;
    size_t off = 0;
    for (size_t i = 0; i < pb->n; i++) {
        size_t len = strlen(pb->buf + off);
        PyObject *p = make_name(pb->buf + off, len, h->as_bytes);
        if (!p) {
            Py_DECREF(list);
            return -1;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, p);
        off += len + 1;
    }
    PyObject *r = PyObject_CallOneArg(h->on_removed, list);
    Py_DECREF(list);
    Py_XDECREF(r);
    return r ? 0 : -1;
}

/* Waits (GIL released) for the started walk to end, waking for on_removed batches and, every
 * 100 ms, for signals (Ctrl-C cancels: the threads stop and every fd is closed), progress and
 * the I/O log.  Returns 0, or -1 with a Python exception set (the walk was cancelled). */
static int wait_walk(Walk *w, const Hooks *h) {
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
            if (hand_over(wk, h) < 0) failed = 1;
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

/* ---- remove_tree: fastrm's walk ------------------------------------------------------------------ */

static PyObject *removal_counts(Walk *w) {
    return Py_BuildValue("(LLLn)", (long long)atomic_load(&w->files), (long long)atomic_load(&w->dirs),
                         (long long)atomic_load(&w->found), (Py_ssize_t)w->nfails);
}

static PyObject *remove_tree(PyObject *module, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"parent_fd", "name", "label", "threads", "bufsize", "include", "exclude", "take",
                             "rmdir_root", "dry_run", "cross_mounts", "dev", "expect", "retries", "out_fd", "sep",
                             "on_removed", "as_bytes", "progress", "trace", NULL};
    PyArgs a = {.bufsize = DEFAULT_BUFSIZE, .threads = 8};
    PyObject *name, *expect = Py_None, *on_removed = Py_None;
    int take = 1, rmdir_root = 1, dry_run = 0, cross = 0, retries = 5, out_fd = -1, as_bytes = 0;
    long long dev = -1;
    char sep = '\n';
    if (!PyArg_ParseTupleAndKeywords(args, kw, "iOO!|$inOOppppLOiicOpOO:remove_tree", kwlist, &a.root_fd, &name,
                                     &PyBytes_Type, &a.label, &a.threads, &a.bufsize, &a.include, &a.exclude, &take,
                                     &rmdir_root, &dry_run, &cross, &dev, &expect, &retries, &out_fd, &sep,
                                     &on_removed, &as_bytes, &a.progress, &a.trace))
        return NULL;
    const char *label = PyBytes_AS_STRING(a.label);
    size_t label_len = (size_t)PyBytes_GET_SIZE(a.label);
    if (!PyBytes_Check(name) || (size_t)PyBytes_GET_SIZE(name) > label_len || PyBytes_GET_SIZE(name) == 0 ||
        memcmp(label + label_len - PyBytes_GET_SIZE(name), PyBytes_AS_STRING(name), PyBytes_GET_SIZE(name)) != 0 ||
        strlen(label) != label_len || memchr(PyBytes_AS_STRING(name), '/', PyBytes_GET_SIZE(name))) {
        PyErr_SetString(PyExc_ValueError, "name must be the last component of label (bytes, no '/')");
        return NULL;
    }
    Config cfg = {.mode = M_REMOVE, .dry_run = dry_run, .cross = cross, .retries = retries < 0 ? 0 : retries,
                  .out_fd = out_fd, .sep = sep, .dev = (dev_t)dev};
    if (config_common(module, &cfg, &a) < 0) return NULL;
    if (expect != Py_None) {
        unsigned long long edev, eino;
        if (!PyArg_ParseTuple(expect, "KK;expect must be (st_dev, st_ino)", &edev, &eino)) return NULL;
        cfg.has_expect = 1;
        cfg.expect_dev = (dev_t)edev;
        cfg.expect_ino = (ino_t)eino;
    }
    int ok = 1;
    on_removed = callable_or_null(on_removed, "on_removed", &ok);
    if (!ok) return NULL;
    cfg.collect = on_removed != NULL && out_fd < 0;
    Walk *w = walk_alloc(&cfg);
    if (!w) return PyErr_NoMemory();
    size_t name_off = label_len - (size_t)PyBytes_GET_SIZE(name);
    int seed_err, started = 0, parent_fd = a.root_fd;
    Py_BEGIN_ALLOW_THREADS
    seed_err = walk_seed_remove(w, parent_fd, label, label_len, name_off, take, rmdir_root && take);
    if (!seed_err) started = walk_start(w) == 0;
    Py_END_ALLOW_THREADS
    PyObject *res = NULL;
    if (seed_err || !started) {
        Py_BEGIN_ALLOW_THREADS
        drain_queues(w);
        Py_END_ALLOW_THREADS
        if (seed_err) PyErr_NoMemory();
        else PyErr_SetString(PyExc_RuntimeError, "could not start walker threads");
        walk_free(w);
        return NULL;
    }
    Hooks h = {.progress = a.progress, .trace = a.trace, .on_removed = cfg.collect ? on_removed : NULL,
               .progress_value = removal_counts, .as_bytes = as_bytes};
    if (wait_walk(w, &h) == 0) {
        PyObject *fails = failures_list(w);
        if (fails)
            res = Py_BuildValue("(LLLLLN)", (long long)atomic_load(&w->files), (long long)atomic_load(&w->dirs),
                                (long long)atomic_load(&w->found), (long long)atomic_load(&w->kept),
                                (long long)atomic_load(&w->retries), fails);
    }
    walk_free(w);
    return res;
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
        d->len = (uint32_t)label_len;
        memcpy(d->path, label, label_len + 1);
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
    {"remove_tree", (PyCFunction)(void (*)(void))remove_tree, METH_VARARGS | METH_KEYWORDS,
     "remove_tree(parent_fd, name, label, *, threads=8, bufsize=1M, include=None, exclude=None, take=True, "
     "rmdir_root=True, dry_run=False, cross_mounts=False, dev=-1, expect=None, retries=5, out_fd=-1, sep=b'\\n', "
     "on_removed=None, as_bytes=False, progress=None, trace=None) -> (files, dirs, found, kept, retries, "
     "failures [(path, errno, depth, detail)]): fastrm's walk of directory `name` in the open directory "
     "parent_fd (label: its path); see docs/fastls.md"},
    {"walk_write", (PyCFunction)(void (*)(void))walk_write, METH_VARARGS | METH_KEYWORDS,
     "walk_write(root, out_fd, json=False, sep=b'\\n', *, <walk_count's options>) -> the same tuple; writes "
     "one path + sep (or one JSON line) per entry to out_fd, in whole lines per write(2)"},
    {NULL, NULL, 0, NULL},
};
