/* The install of a small object in one call: s3pull's small-object sink (s3/sink.py, SmallTarget).
 *
 * A small object's body is held in memory until it checked out; then its temp file is created
 * (O_EXCL, in s3pull's own temp folder, by descriptor), written, stat'ed, closed and renamed to
 * its final name here, with the GIL released once for the four system calls instead of once per
 * call: with dozens of pool threads, every release of the GIL is a hand-over to another thread.
 * Any failure after the create removes the temp file, so nothing half-written is left behind
 * but what a kill -9 can leave anyway (a *.tmp, which the next run tidies).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include "_dents.h"

static PyObject *install_small(PyObject *self, PyObject *args) {
    int dir_fd;
    const char *name;
    PyObject *final_obj = NULL;
    Py_buffer data;
    if (!PyArg_ParseTuple(args, "isy*O&:install_small", &dir_fd, &name, &data, PyUnicode_FSConverter,
                          &final_obj))
        return NULL;
    const char *final = PyBytes_AS_STRING(final_obj);
    struct stat st;
    int err = 0;
    const char *failed = NULL;   /* which step failed: the error names the temp or the final path */
    Py_BEGIN_ALLOW_THREADS
    int fd = openat(dir_fd, name, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) {
        err = errno;
        failed = "tmp";
    } else {
        const char *p = data.buf;
        Py_ssize_t left = data.len;
        off_t off = 0;
        while (left > 0 && !err) {
            ssize_t n = pwrite(fd, p, (size_t)left, off);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) {   /* no progress is a full disk: never a short file */
                err = n < 0 ? errno : ENOSPC;
                failed = "tmp";
                break;
            }
            p += n;
            left -= n;
            off += n;
        }
        if (!err && fstat(fd, &st) < 0) {
            err = errno;
            failed = "tmp";
        }
        if (close(fd) < 0 && !err && errno != EINTR) {
            err = errno;
            failed = "tmp";
        }
        if (!err && renameat(dir_fd, name, AT_FDCWD, final) < 0) {
            err = errno;
            failed = "final";
        }
        if (err) unlinkat(dir_fd, name, 0);
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    if (err) {
        errno = err;
        if (failed[0] == 'f')
            PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, final_obj);
        else
            PyErr_SetFromErrnoWithFilename(PyExc_OSError, name);
        Py_DECREF(final_obj);
        return NULL;
    }
    Py_DECREF(final_obj);
    long long mtime_ns = (long long)st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec;
    return Py_BuildValue("(KL)", (unsigned long long)st.st_ino, mtime_ns);
}

static PyMethodDef install_functions[] = {
    {"install_small", install_small, METH_VARARGS,
     "install_small(dir_fd, name, data, final) -> (inode, mtime_ns): create name in dir_fd (O_EXCL), "
     "write data, rename it to final; the temp file is removed if any step fails"},
    {NULL, NULL, 0, NULL},
};

int install_add_functions(PyObject *m) { return PyModule_AddFunctions(m, install_functions); }
