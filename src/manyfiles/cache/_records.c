/* A batch of packed records read in one call: the cache's hit table (cache/_hits.py) for a
 * dataset's batch.
 *
 * A 4 KiB hit costs one pread (about a microsecond), and the Python around it (the loop, the
 * bookkeeping) costs as much again per sample.  pread_records() takes the batch's positions and the
 * table's own arrays (pack slot, offset, length per position; a descriptor per slot), makes each
 * payload's bytes object, sorts the records by (descriptor, offset) and reads each run of records
 * that lie close together in one pack with one preadv straight into those bytes objects (the small
 * gaps between them, the records' headers, into a scratch buffer): one copy, one system call per
 * run, the GIL released around the reads.  What a slot or descriptor does not hold, or a read that
 * comes back short or fails, is None: the caller reads it another way.  Nothing here decides what
 * may be served; the table does (cache/_hits.py).
 */
#include "_dents.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/uio.h>

#define MAX_IOV 1024          /* IOV_MAX on Linux */

typedef struct {
    int fd;
    int slot;
    int64_t off;
    int64_t len;
    Py_ssize_t pos;           /* where it goes in the result */
    PyObject *bytes;
    int ok;
} Rec;

static int rec_order(const void *a, const void *b) {
    const Rec *x = a, *y = b;
    if (x->fd != y->fd) return x->fd < y->fd ? -1 : 1;
    if (x->off != y->off) return x->off < y->off ? -1 : 1;
    return x->pos < y->pos ? -1 : x->pos > y->pos;
}

/* preadv every byte of iov[0..cnt) at off, continuing a short read; returns the bytes read (fewer
 * at the end of the file) or -1 (errno set). */
static int64_t preadv_all(int fd, struct iovec *iov, int cnt, int64_t off) {
    int64_t done = 0;
    while (cnt > 0) {
        ssize_t n = preadv(fd, iov, cnt, (off_t)(off + done));
        if (n < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        if (n == 0) break;
        done += n;
        while (cnt > 0 && (size_t)n >= iov->iov_len) {
            n -= (ssize_t)iov->iov_len;
            iov++;
            cnt--;
        }
        if (cnt > 0 && n > 0) {
            iov->iov_base = (char *)iov->iov_base + n;
            iov->iov_len -= (size_t)n;
        }
    }
    return done;
}

/* Read recs[0..m) (sorted), GIL released: each run of one descriptor whose records start at most
 * max_gap bytes after the previous one ends is one preadv.  Sets each record's ok. */
static void read_runs(Rec *recs, Py_ssize_t m, char *scratch, int64_t max_gap, struct iovec *iov) {
    Py_ssize_t r = 0;
    while (r < m) {
        Py_ssize_t first = r;
        int64_t start = recs[r].off, end = start + recs[r].len;
        int cnt = 0;
        iov[cnt].iov_base = PyBytes_AS_STRING(recs[r].bytes);
        iov[cnt++].iov_len = (size_t)recs[r].len;
        r++;
        while (r < m && recs[r].fd == recs[first].fd && recs[r].off >= end &&
               recs[r].off - end <= max_gap && cnt + 2 <= MAX_IOV) {
            if (recs[r].off > end) {
                iov[cnt].iov_base = scratch;
                iov[cnt++].iov_len = (size_t)(recs[r].off - end);
            }
            iov[cnt].iov_base = PyBytes_AS_STRING(recs[r].bytes);
            iov[cnt++].iov_len = (size_t)recs[r].len;
            end = recs[r].off + recs[r].len;
            r++;
        }
        int64_t got = preadv_all(recs[first].fd, iov, cnt, start);
        for (Py_ssize_t k = first; k < r; k++)
            recs[k].ok = got >= 0 && recs[k].off + recs[k].len <= start + got;
    }
}

static int get_buffer(PyObject *obj, Py_buffer *view, Py_ssize_t itemsize, int writable, const char *what) {
    if (PyObject_GetBuffer(obj, view, (writable ? PyBUF_WRITABLE : 0) | PyBUF_FORMAT | PyBUF_ND) < 0)
        return -1;
    if (view->itemsize != itemsize || view->ndim != 1) {
        PyErr_Format(PyExc_TypeError, "pread_records: %s must be a 1-d buffer of %zd-byte items", what,
                     itemsize);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static PyObject *records_pread(PyObject *self, PyObject *args) {
    PyObject *indexes, *slots_obj, *fds_obj, *offs_obj, *lens_obj, *used_obj;
    long long max_gap;
    if (!PyArg_ParseTuple(args, "OOOOOOL:pread_records", &indexes, &slots_obj, &fds_obj, &offs_obj,
                          &lens_obj, &used_obj, &max_gap))
        return NULL;
    if (max_gap < 0) max_gap = 0;
    if (max_gap > (1 << 20)) max_gap = 1 << 20;

    Py_buffer slots, fds, offs, lens, used;
    int held = 0;
    PyObject *seq = NULL, *out = NULL, *result = NULL;
    Rec *recs = NULL;
    char *scratch = NULL;
    struct iovec *iov = NULL;
    Py_ssize_t m = 0;

    if (get_buffer(slots_obj, &slots, 4, 0, "slots") < 0) goto done;
    held = 1;
    if (get_buffer(fds_obj, &fds, 4, 0, "fds") < 0) goto done;
    held = 2;
    if (get_buffer(offs_obj, &offs, 8, 0, "offsets") < 0) goto done;
    held = 3;
    if (get_buffer(lens_obj, &lens, 8, 0, "lengths") < 0) goto done;
    held = 4;
    if (get_buffer(used_obj, &used, 1, 1, "used") < 0) goto done;
    held = 5;
    Py_ssize_t n = slots.len / 4, nslots = fds.len / 4;
    if (offs.len / 8 != n || lens.len / 8 != n || used.len < nslots) {
        PyErr_SetString(PyExc_ValueError, "pread_records: the table's arrays differ in length");
        goto done;
    }
    const int32_t *slot = slots.buf, *fd = fds.buf;
    const int64_t *off = offs.buf, *len = lens.buf;
    unsigned char *use = used.buf;

    seq = PySequence_Fast(indexes, "pread_records: indexes must be a sequence");
    if (!seq) goto done;
    Py_ssize_t k = PySequence_Fast_GET_SIZE(seq);
    out = PyList_New(k);
    if (!out) goto done;
    for (Py_ssize_t p = 0; p < k; p++) PyList_SET_ITEM(out, p, Py_NewRef(Py_None));
    recs = PyMem_Malloc((size_t)(k ? k : 1) * sizeof(Rec));
    if (!recs) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t p = 0; p < k; p++) {
        Py_ssize_t i = PyNumber_AsSsize_t(PySequence_Fast_GET_ITEM(seq, p), PyExc_IndexError);
        if (i == -1 && PyErr_Occurred()) goto done;
        if (i < 0 || i >= n) {
            PyErr_Format(PyExc_IndexError, "pread_records: index %zd out of range (%zd)", i, n);
            goto done;
        }
        int s = slot[i];
        if (s < 0 || s >= nslots || fd[s] < 0 || len[i] < 0 || off[i] < 0) continue;
        Rec *r = &recs[m];
        r->fd = fd[s];
        r->slot = s;
        r->off = off[i];
        r->len = len[i];
        r->pos = p;
        r->ok = 0;
        r->bytes = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)len[i]);
        if (!r->bytes) goto done;
        m++;
    }
    qsort(recs, (size_t)m, sizeof(Rec), rec_order);
    scratch = PyMem_Malloc((size_t)(max_gap ? max_gap : 1));
    iov = PyMem_Malloc(MAX_IOV * sizeof(struct iovec));
    if (!scratch || !iov) {
        PyErr_NoMemory();
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    read_runs(recs, m, scratch, (int64_t)max_gap, iov);
    Py_END_ALLOW_THREADS

    long long hits = 0, nbytes = 0;
    for (Py_ssize_t j = 0; j < m; j++) {
        if (!recs[j].ok) continue;
        PyObject *old = PyList_GET_ITEM(out, recs[j].pos);
        PyList_SET_ITEM(out, recs[j].pos, recs[j].bytes);   /* the list takes the reference */
        recs[j].bytes = NULL;
        Py_DECREF(old);
        use[recs[j].slot] = 1;
        hits++;
        nbytes += recs[j].len;
    }
    result = Py_BuildValue("OLL", out, hits, nbytes);

done:
    if (recs)
        for (Py_ssize_t j = 0; j < m; j++) Py_XDECREF(recs[j].bytes);
    PyMem_Free(recs);
    PyMem_Free(scratch);
    PyMem_Free(iov);
    Py_XDECREF(out);
    Py_XDECREF(seq);
    if (held >= 5) PyBuffer_Release(&used);
    if (held >= 4) PyBuffer_Release(&lens);
    if (held >= 3) PyBuffer_Release(&offs);
    if (held >= 2) PyBuffer_Release(&fds);
    if (held >= 1) PyBuffer_Release(&slots);
    return result;
}

static PyMethodDef records_functions[] = {
    {"pread_records", records_pread, METH_VARARGS,
     "pread_records(indexes, slots, fds, offsets, lengths, used, max_gap) -> (list, hits, bytes): "
     "the payload of record i at offsets[i] (lengths[i] bytes) in descriptor fds[slots[i]] for each i "
     "of indexes, None where the slot or descriptor is -1 or the read fell short; runs of records at "
     "most max_gap bytes apart in one file are one preadv.  Marks used[slot] of each record read."},
    {NULL, NULL, 0, NULL},
};

int records_add_functions(PyObject *m) { return PyModule_AddFunctions(m, records_functions); }
