/* CRC64/NVME and CRC32C for s3pull's checks of small objects, without loading awscrt.
 *
 * S3 (and versitygw) store a CRC64NVME for every new object; checking a 4 KiB object costs
 * about a microsecond, but loading awscrt costs ~40 ms of CPU at start-up (its TLS library
 * seeds an entropy pool), most of a 2000-object pull's client time.  These are the plain
 * reflected CRCs, slice-by-8 (~2 GB/s): awscrt's hardware-accelerated ones (and its combine
 * functions) still serve large objects, which amortise its start.  Same convention as
 * awscrt.checksums: crc(data, previous) continues a CRC from its previous (final) value.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "_dents.h"

#define CRC64NVME_POLY 0x9A6C9329AC4BC9B5ULL   /* reflected 0xAD93D23594C93659 */
#define CRC32C_POLY 0x82F63B78U                /* reflected 0x1EDC6F41 */
#define GIL_MIN (64 * 1024)                    /* release the GIL from this size up */

static uint64_t t64[8][256];
static uint32_t t32[8][256];

static void init_tables(void) {
    for (int i = 0; i < 256; i++) {
        uint64_t c = (uint64_t)i;
        uint32_t d = (uint32_t)i;
        for (int k = 0; k < 8; k++) {
            c = (c & 1) ? (c >> 1) ^ CRC64NVME_POLY : c >> 1;
            d = (d & 1) ? (d >> 1) ^ CRC32C_POLY : d >> 1;
        }
        t64[0][i] = c;
        t32[0][i] = d;
    }
    for (int i = 0; i < 256; i++)
        for (int s = 1; s < 8; s++) {
            t64[s][i] = (t64[s - 1][i] >> 8) ^ t64[0][t64[s - 1][i] & 0xff];
            t32[s][i] = (t32[s - 1][i] >> 8) ^ t32[0][t32[s - 1][i] & 0xff];
        }
}

static uint64_t crc64_run(uint64_t crc, const unsigned char *p, size_t n) {
    crc = ~crc;
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);          /* little-endian (x86_64, aarch64 as Linux runs them) */
        crc ^= v;
        crc = t64[7][crc & 0xff] ^ t64[6][(crc >> 8) & 0xff] ^ t64[5][(crc >> 16) & 0xff] ^
              t64[4][(crc >> 24) & 0xff] ^ t64[3][(crc >> 32) & 0xff] ^ t64[2][(crc >> 40) & 0xff] ^
              t64[1][(crc >> 48) & 0xff] ^ t64[0][crc >> 56];
        p += 8;
        n -= 8;
    }
    while (n--) crc = t64[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return ~crc;
}

static uint32_t crc32c_run(uint32_t crc, const unsigned char *p, size_t n) {
    crc = ~crc;
    while (n >= 8) {
        uint32_t one, two;
        memcpy(&one, p, 4);
        memcpy(&two, p + 4, 4);
        one ^= crc;
        crc = t32[7][one & 0xff] ^ t32[6][(one >> 8) & 0xff] ^ t32[5][(one >> 16) & 0xff] ^
              t32[4][one >> 24] ^ t32[3][two & 0xff] ^ t32[2][(two >> 8) & 0xff] ^
              t32[1][(two >> 16) & 0xff] ^ t32[0][two >> 24];
        p += 8;
        n -= 8;
    }
    while (n--) crc = t32[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return ~crc;
}

static PyObject *crc_crc64nvme(PyObject *self, PyObject *args) {
    Py_buffer buf;
    unsigned long long prev = 0;
    if (!PyArg_ParseTuple(args, "y*|K:crc64nvme", &buf, &prev)) return NULL;
    uint64_t crc;
    if (buf.len >= GIL_MIN) {
        Py_BEGIN_ALLOW_THREADS
        crc = crc64_run(prev, buf.buf, (size_t)buf.len);
        Py_END_ALLOW_THREADS
    } else {
        crc = crc64_run(prev, buf.buf, (size_t)buf.len);
    }
    PyBuffer_Release(&buf);
    return PyLong_FromUnsignedLongLong(crc);
}

static PyObject *crc_crc32c(PyObject *self, PyObject *args) {
    Py_buffer buf;
    unsigned long prev = 0;
    if (!PyArg_ParseTuple(args, "y*|k:crc32c", &buf, &prev)) return NULL;
    uint32_t crc;
    if (buf.len >= GIL_MIN) {
        Py_BEGIN_ALLOW_THREADS
        crc = crc32c_run((uint32_t)prev, buf.buf, (size_t)buf.len);
        Py_END_ALLOW_THREADS
    } else {
        crc = crc32c_run((uint32_t)prev, buf.buf, (size_t)buf.len);
    }
    PyBuffer_Release(&buf);
    return PyLong_FromUnsignedLong(crc);
}

static PyMethodDef crc_functions[] = {
    {"crc64nvme", crc_crc64nvme, METH_VARARGS,
     "crc64nvme(data, previous=0) -> int: CRC64/NVME of data, continuing from previous (awscrt's convention)"},
    {"crc32c", crc_crc32c, METH_VARARGS,
     "crc32c(data, previous=0) -> int: CRC32C (Castagnoli) of data, continuing from previous"},
    {NULL, NULL, 0, NULL},
};

int crc_add_functions(PyObject *m) {
    init_tables();
    return PyModule_AddFunctions(m, crc_functions);
}
