/*
 * The walker's remove mode: fastrm's walk (remove_tree()), on the engine of _walk.c (its
 * directories, worker pool and Python-thread wait; see _walk.h).
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
 * directory again, in this thread, and retries with back-off.
 *
 * Output: each removed (or, in a dry run, removable) path goes to an fd (in whole lines, through
 * the engine's output buffer) or, in batches, to on_removed on the Python thread; either way the
 * entries of a directory go out before the directory itself.
 */
#include "_walk.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

/* One record of a getdents batch and its inode: a batch is unlinked in inode order. */
struct DirentRef {
    uint64_t ino;
    struct linux_dirent64 *d;
};

#define FLUSH_PATHS 4096 /* removed paths per batch handed to on_removed */
#define RETRY_BACKOFF_NS (50 * 1000 * 1000)

/* d's path + "/" + name in the worker's path buffer (failures, output). */
static const char *entry_path(Worker *wk, const WDir *d, const char *name, size_t nl, size_t *len) {
    size_t n = entry_path_len(d, nl);
    if (grow_array((void **)&wk->pathbuf, &wk->pcap, n + 1, 1) < 0) return NULL;
    *put_entry_path(wk->pathbuf, d, name, nl) = 0;
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

void rm_sync(Worker *wk) {
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
    uint64_t x = ((const struct DirentRef *)a)->ino, y = ((const struct DirentRef *)b)->ino;
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

void process_remove(Worker *wk, WDir *d) {
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
            if (grow_array((void **)&wk->slots, &wk->slcap, m + 1, sizeof(struct DirentRef)) < 0) goto nomem;
            wk->slots[m++] = (struct DirentRef){e->d_ino, e};
        }
        if (c->trace) trace_add(w, &wk->trace, &wk->trace_mu, OP_GETDENTS, d, NULL, 0, t0, now_ns() - t0, 0, (long)m, n);
        if (n == 0) break;
        found += (long long)m;
        if (!c->dry_run && m > 1) qsort(wk->slots, m, sizeof(struct DirentRef), by_inode);
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
    queue_subdirs(wk, d); /* each holds us (our fd) until it is finished */
    goto done;
nomem:
    set_fatal(w, ENOMEM);
stopped:
    discard_kids(wk);
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

/* Every name in d (open) but . and .., read to the end: records of one d_type byte + the NUL-ended
 * name in *names (the caller frees it; NULL when empty), *used bytes, *count records.  0, or -1
 * (ENOMEM; *names is NULL). */
static int read_all_names(Worker *wk, WDir *d, char **names, size_t *used, size_t *count) {
    int fake_dtype = wk->w->cfg.fake_dtype;
    size_t cap = 0;
    long n;
    *names = NULL;
    *used = *count = 0;
    while ((n = read_dir(wk, d->fd)) > 0) {
        for (long pos = 0; pos < n;) {
            struct linux_dirent64 *e = (struct linux_dirent64 *)(wk->buf + pos);
            pos += e->d_reclen;
            if (is_dot(e->d_name)) continue;
            size_t nl = strlen(e->d_name);
            if (grow_array((void **)names, &cap, *used + nl + 2, 1) < 0) {
                free(*names);
                *names = NULL;
                return -1;
            }
            (*names)[*used] = (char)effective_dtype(fake_dtype, e->d_type);
            memcpy(*names + *used + 1, e->d_name, nl + 1);
            *used += nl + 2;
            (*count)++;
        }
    }
    return 0;
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
    char *names;
    size_t used, count;
    if (read_all_names(wk, d, &names, &used, &count) < 0) {
        set_fatal(w, ENOMEM);
        goto out;
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
    size_t used = 0, n = 0, lcap = 0;
    if (read_all_names(wk, d, &names, &used, &n) < 0 || !n ||
        grow_array((void **)&list, &lcap, n, sizeof(char *)) < 0)
        goto out;
    for (size_t off = 0, i = 0; i < n; i++) { /* past each record's d_type byte */
        list[i] = names + off + 1;
        off += strlen(names + off + 1) + 2;
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
void rm_finish(Worker *wk, WDir *d) {
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
    dir_set_len(d, label_len);
    d->name_off = (uint32_t)name_off;
    d->rel_off = (uint32_t)label_len;
    d->take = (uint8_t)take;
    d->take_self = (uint8_t)take_self;
    wk->kids[0] = d;
    wk->nkids = 1;
    push_kids(wk);
    return 0;
}

/* ---- on the Python thread --------------------------------------------------------------------------- */

/* on_removed(the paths in wk's batch); the worker waits until this returns. */
int hand_over_removed(Worker *wk, const Hooks *h) {
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

/* ---- remove_tree(): the entry point ------------------------------------------------------------ */

static PyObject *removal_counts(Walk *w) {
    return Py_BuildValue("(LLLn)", (long long)atomic_load(&w->files), (long long)atomic_load(&w->dirs),
                         (long long)atomic_load(&w->found), (Py_ssize_t)w->nfails);
}

const char remove_tree_doc[] =
    "remove_tree(parent_fd, name, label, *, threads=8, bufsize=1M, include=None, exclude=None, take=True, "
    "rmdir_root=True, dry_run=False, cross_mounts=False, dev=-1, expect=None, retries=5, out_fd=-1, sep=b'\\n', "
    "on_removed=None, as_bytes=False, progress=None, trace=None) -> (files, dirs, found, kept, retries, "
    "failures [(path, errno, depth, detail)]): fastrm's walk of directory `name` in the open directory "
    "parent_fd (label: its path); see docs/fastls.md";

PyObject *remove_tree(PyObject *module, PyObject *args, PyObject *kw) {
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
