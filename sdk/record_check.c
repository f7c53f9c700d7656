/* kvstored.sdk._record_check: the success path of record.py's verify_record, for a whole
 * batch of records in one call.
 *
 * A 4 KiB read of a record costs a backend a dozen Python operations of checking (decode
 * the header, two CRCs, compare key, size, sequence number and value CRC with the index,
 * copy the value out of scratch) against a few microseconds of disk: at queue depth 32,
 * on two vCPUs, that was what kept 4 KiB reads at a third of fio. check() does all of it
 * in C for the records that pass, and names the ones that do not; record.py then runs the
 * Python verify_record on those alone, so the reasons (and the zeroing of the caller's
 * buffer) have one definition, and a record passes here only if it passes there
 * (tests/sdk/test_record_check.py holds the two to each other).
 *
 * check(records) takes a list of (dest, head, value, key, size, seq, checksum): the
 * record's header block as read, its value as read (None: it was read straight into
 * dest[:size]) and what the index holds; or of record.py's ReadBack, the same with the
 * read's error and whether it read whole after them (one that has an error or did not
 * read whole fails without being looked at). It returns the list of the indexes of those that
 * fail; each one that passes has its value in dest[:size] (copied from value when that is
 * not dest's memory already). The GIL is held throughout: the work is a few hundred
 * nanoseconds a record.
 *
 * The stable ABI of 3.11 (PyObject_GetBuffer), like native/batch.c.
 */
#ifndef Py_LIMITED_API
#define Py_LIMITED_API 0x030B0000
#endif
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

#include "crc32c.h"

/* The record header (sdk/record.py): magic, version, flags, key_len, reserved,
   value_len, seq, write_ns, value_crc, header_crc, then the key. Little-endian. */
#define HEADER_CORE 40
#define HEADER_SIZE 44
#define RECORD_VERSION 1
#define FLAG_TOMBSTONE 1
#define MAX_KEY_BYTES 1024

/* -- CRC-32C (sdk/crc32c.h) --------------------------------------------------------- */

static int hw_crc;

/* crc32c(data, value) of the crc32c package: `value` is a finished CRC to continue. */
static uint32_t crc32c(uint32_t value, const void *data, size_t n)
{
#ifdef CRC32C_HAVE_HW
    if (hw_crc)
        return ~crc32c_hw(~value, data, n);
#endif
    return ~crc32c_soft(~value, data, n);
}

/* -- the check ------------------------------------------------------------------------ */

static uint16_t le16(const unsigned char *p) { return (uint16_t)(p[0] | p[1] << 8); }

static uint32_t le32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t le64(const unsigned char *p) { return le32(p) | (uint64_t)le32(p + 4) << 32; }

/* Whether the header block `head` (n bytes) and the value pass every check of
   verify_record against (key, size, seq, checksum). */
static int passes(const unsigned char *head, Py_ssize_t n, const char *key, Py_ssize_t key_len,
                  uint64_t size, uint64_t seq, uint32_t checksum, const void *value)
{
    if (n < HEADER_SIZE || memcmp(head, "KVSR", 4) != 0 || le16(head + 4) != RECORD_VERSION)
        return 0;
    uint16_t flags = le16(head + 6), stored_key_len = le16(head + 8);
    if (flags & FLAG_TOMBSTONE)
        return 0;
    if (stored_key_len == 0 || stored_key_len > MAX_KEY_BYTES
        || n < HEADER_SIZE + stored_key_len || stored_key_len != key_len)
        return 0;
    if (le64(head + 12) != size || le64(head + 20) != seq || le32(head + 36) != checksum)
        return 0;
    if (memcmp(head + HEADER_SIZE, key, (size_t)key_len) != 0)
        return 0;
    uint32_t header_crc = crc32c(crc32c(0, head, HEADER_CORE), head + HEADER_SIZE,
                                 (size_t)key_len);
    if (header_crc != le32(head + HEADER_CORE))
        return 0;
    return crc32c(0, value, (size_t)size) == checksum;
}

/* 1 when the record passes (its value now in dest), 0 when it fails, -1 on a Python
   error (a malformed entry). */
static int check_one(PyObject *entry)
{
    Py_ssize_t fields = PyTuple_Check(entry) ? PyTuple_Size(entry) : 0;
    if (fields != 7 && fields != 9) {
        PyErr_SetString(PyExc_TypeError, "check: each record is (dest, head, value, key, "
                                         "size, seq, checksum[, error, complete])");
        return -1;
    }
    if (fields == 9) { /* record.py's ReadBack: a read that failed or fell short fails */
        int complete = PyObject_IsTrue(PyTuple_GetItem(entry, 8));
        if (complete < 0)
            return -1;
        if (PyTuple_GetItem(entry, 7) != Py_None || !complete)
            return 0;
    }
    PyObject *dest = PyTuple_GetItem(entry, 0), *head = PyTuple_GetItem(entry, 1);
    PyObject *value = PyTuple_GetItem(entry, 2), *key = PyTuple_GetItem(entry, 3);
    unsigned long long size = PyLong_AsUnsignedLongLong(PyTuple_GetItem(entry, 4));
    unsigned long long seq = PyLong_AsUnsignedLongLong(PyTuple_GetItem(entry, 5));
    unsigned long checksum = PyLong_AsUnsignedLong(PyTuple_GetItem(entry, 6));
    if (PyErr_Occurred())
        return -1;
    Py_ssize_t key_len;
    const char *key_bytes = PyUnicode_AsUTF8AndSize(key, &key_len);
    if (!key_bytes)
        return -1;
    Py_buffer d, h, v;
    if (PyObject_GetBuffer(dest, &d, PyBUF_WRITABLE) < 0)
        return -1;
    if (PyObject_GetBuffer(head, &h, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&d);
        return -1;
    }
    int ok = 0, has_value = value != Py_None;
    if (has_value && PyObject_GetBuffer(value, &v, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&h);
        PyBuffer_Release(&d);
        return -1;
    }
    const void *got = has_value ? v.buf : d.buf;
    Py_ssize_t got_len = has_value ? v.len : d.len;
    if ((has_value ? (uint64_t)got_len == size : (uint64_t)got_len >= size)
        && (uint64_t)d.len >= size && checksum <= UINT32_MAX
        && passes(h.buf, h.len, key_bytes, key_len, size, seq, (uint32_t)checksum, got)) {
        if (has_value && got != d.buf)
            memmove(d.buf, got, (size_t)size);
        ok = 1;
    }
    if (has_value)
        PyBuffer_Release(&v);
    PyBuffer_Release(&h);
    PyBuffer_Release(&d);
    return ok;
}

static PyObject *check(PyObject *self, PyObject *records)
{
    (void)self;
    if (!PyList_Check(records)) {
        PyErr_SetString(PyExc_TypeError, "check: a list of records");
        return NULL;
    }
    PyObject *failed = PyList_New(0);
    if (!failed)
        return NULL;
    Py_ssize_t n = PyList_Size(records);
    for (Py_ssize_t i = 0; i < n; i++) {
        int ok = check_one(PyList_GetItem(records, i));
        if (ok < 0) {
            Py_DECREF(failed);
            return NULL;
        }
        if (!ok) {
            PyObject *index = PyLong_FromSsize_t(i);
            if (!index || PyList_Append(failed, index) < 0) {
                Py_XDECREF(index);
                Py_DECREF(failed);
                return NULL;
            }
            Py_DECREF(index);
        }
    }
    return failed;
}

static PyObject *crc(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer data;
    unsigned long value = 0;
    if (!PyArg_ParseTuple(args, "y*|k:crc32c", &data, &value))
        return NULL;
    uint32_t result = crc32c((uint32_t)value, data.buf, (size_t)data.len);
    PyBuffer_Release(&data);
    return PyLong_FromUnsignedLong(result);
}

static PyMethodDef methods[] = {
    {"check", check, METH_O,
     "check(records) -> indexes of the records that fail (see record_check.c)."},
    {"crc32c", crc, METH_VARARGS, "crc32c(data, value=0): this module's CRC-32C (tests)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_record_check",
    "The success path of verify_record for a batch of records (see record_check.c).",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__record_check(void)
{
    crc32c_make_table();
#ifdef CRC32C_HAVE_HW
    hw_crc = __builtin_cpu_supports("sse4.2");
#endif
    return PyModule_Create(&module);
}
