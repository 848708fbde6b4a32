/*
 * The walker's internals, shared by its two files (nothing outside them includes this):
 *   _walk.c          the engine (directories and their fds, the worker pool and its deques, the
 *                    failure records, the I/O log, the Python thread's wait) and the count, write
 *                    and events modes: walk_count(), walk_write(), Walk
 *   _remove_tree.c   the remove mode (fastrm): remove_tree()
 * The engine calls the remove mode at four points (a directory to process, a directory whose
 * subtree is done, the paths to flush, a batch of removed paths for on_removed), declared last.
 */
#ifndef MANYFILES_WALK_H
#define MANYFILES_WALK_H

#include "_dents.h"

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

/* Hidden: the two files share these, the extension does not export them, and (as when they were
 * static) the compiler may inline them inside the file that defines them. */
#pragma GCC visibility push(hidden)

enum { M_COUNT, M_WRITE, M_EVENTS, M_REMOVE };

#define WAIT_SLICE_NS (100 * 1000 * 1000) /* the Python thread checks signals this often */

/* Operations in the I/O log (names as manyfiles.trace.iotrace calls them). */
enum { OP_GETDENTS, OP_OPEN, OP_UNLINK, OP_RMDIR, OP_STAT, N_OPS };

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
    uint32_t len;      /* bytes of path (set with dir_set_len) */
    uint8_t slash;     /* a '/' goes between path and a child's name (not after "" or a path ending in '/') */
    uint32_t name_off; /* path + name_off is the directory's own name */
    uint32_t rel_off;  /* path + rel_off is the path relative to the root ("" for the root) */
    char path[];
} WDir;

/* A child of `parent` (not opened yet), or NULL (errno set). */
WDir *dir_new(const WDir *parent, const char *name, size_t name_len);

/* d's path is written (its first `len` bytes): its length, and whether a child's name needs a '/'
 * first (decided once per directory, not per entry: the writers below run once per entry). */
static inline void dir_set_len(WDir *d, size_t len) {
    d->len = (uint32_t)len;
    d->slash = len > 0 && d->path[len - 1] != '/';
}

/* Bytes of d's path + "/" + name (no '/' is added after a path that ends in one, as "/" does). */
static inline size_t entry_path_len(const WDir *d, size_t nl) {
    return d->len + d->slash + nl;
}

/* Writes d's path + "/" + name at p (not NUL-ended); returns the end. */
static inline char *put_entry_path(char *p, const WDir *d, const char *name, size_t nl) {
    memcpy(p, d->path, d->len);
    p += d->len;
    if (d->slash) *p++ = '/';
    memcpy(p, name, nl);
    return p + nl;
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

typedef struct Batch Batch;         /* events mode (_walk.c) */
struct DirentRef;                   /* remove mode (_remove_tree.c) */

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
    struct DirentRef *slots;   /* one getdents batch, sorted by inode before unlinking */
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

/* ---- the engine (_walk.c) --------------------------------------------------------------------- */

/* Stops the walk with `err` (the first one wins), e.g. ENOMEM. */
void set_fatal(Walk *w, int err);
/* One record of the I/O log: `op` on d's path (+ "/" + name when name is not NULL), into `t`
 * (under `mu`, or NULL for a log only the worker touches). */
void trace_add(Walk *w, TraceLog *t, pthread_mutex_t *mu, int op, const WDir *d, const char *name, size_t nl,
               int64_t start, int64_t dur, int result, long a, long b);

/* A worker's own log (count, write and remove modes), for a call that started at `start`. */
static inline void wtrace(Worker *wk, int op, const WDir *d, const char *name, size_t nl, int64_t start,
                          int result) {
    trace_add(wk->w, &wk->trace, &wk->trace_mu, op, d, name, nl, start, now_ns() - start, result, 0, 0);
}

/* A failure record: the path, its errno, depth and a longer reason (or NULL). */
void add_failure_path(Walk *w, const char *path, size_t len, int err, int depth, const char *detail);
void add_failure(Walk *w, const WDir *d, int err);

/* Queues the worker's kids (found in the directory it just read) on its deque. */
void push_kids(Worker *wk);
/* d was read to the end: marks it listed and queues its subdirectories (the worker's kids), each
 * holding a reference on d (its fd) until it has opened itself (pre-order) or finished. */
void queue_subdirs(Worker *wk, WDir *d);
/* Drops the kids found so far (d's listing failed or the walk stops): they are never queued. */
void discard_kids(Worker *wk);
/* Drops one reference on d; the last one finishes it (closes its fd; remove mode: rm_finish)
 * and walks up to its parent. */
void dir_release(Worker *wk, WDir *d);
/* getdents64 into the worker's buffer (grown for a record bigger than it): bytes, 0 at the end,
 * -1 with errno. */
long read_dir(Worker *wk, int fd);
/* The entry's path relative to the root, in the worker's scratch buffer (for '/' patterns). */
const char *rel_path(Worker *wk, const WDir *d, const char *name, size_t nl, size_t *rl);
/* openat(d's parent's fd, d's name) as a directory (O_NOFOLLOW unless following symlinks). */
int open_dir(Walk *w, WDir *d);

/* The worker's output buffer: written to out_fd in whole lines (0, or -1: the walk stops). */
int out_flush(Walk *w, Worker *wk);
int out_reserve(Worker *wk, size_t need);

Walk *walk_alloc(const Config *cfg);
void walk_free(Walk *w);
/* Starts the worker threads: 0, or -1 if none started. */
int walk_start(Walk *w);
/* Stops the walk and releases the directories left in the deques (every fd is closed). */
void drain_queues(Walk *w);

/* ---- Python arguments and the Python thread's wait (_walk.c) ---------------------------------- */

typedef struct {
    PyObject *root, *label, *include, *exclude, *prune, *descend, *progress, *trace;
    int root_fd;
    Py_ssize_t bufsize;
    int threads, max_depth, min_depth, follow, xdev;
    unsigned types;
} PyArgs;

typedef struct {
    PyObject *progress;   /* called about ten times a second with progress_value() */
    PyObject *trace;      /* trace(flat, threads), or NULL */
    PyObject *on_removed; /* remove mode: on_removed([path, ...]) per batch, or NULL */
    PyObject *(*progress_value)(Walk *w);
    int as_bytes;         /* on_removed paths as bytes (else str, decoded like os.fsdecode) */
} Hooks;

PyObject *callable_or_null(PyObject *o, const char *what, int *ok);
/* Fills cfg's common fields from the keyword arguments (the mode's fields are the caller's);
 * returns 0, or -1 with an exception set. */
int config_common(PyObject *module, Config *cfg, PyArgs *a);
/* [(path, errno, depth, detail or None)] */
PyObject *failures_list(Walk *w);
/* Waits (GIL released) for the started walk to end, running the hooks; then joins the threads.
 * Returns 0, or -1 with a Python exception set. */
int wait_walk(Walk *w, const Hooks *h);

/* ---- the remove mode (_remove_tree.c), as the engine calls it --------------------------------- */

/* One directory: list it, unlink what goes, queue its subdirectories. */
void process_remove(Worker *wk, WDir *d);
/* d and everything below it are done: close it, rmdir it if it goes, tell the parent if it stays. */
void rm_finish(Worker *wk, WDir *d);
/* The paths this worker removed so far go out (out_fd, or on_removed). */
void rm_sync(Worker *wk);
/* on_removed(the paths in wk's batch), on the Python thread; the worker waits until this returns. */
int hand_over_removed(Worker *wk, const Hooks *h);

PyObject *remove_tree(PyObject *module, PyObject *args, PyObject *kw);
extern const char remove_tree_doc[];

#pragma GCC visibility pop

#endif
