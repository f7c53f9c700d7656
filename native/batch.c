/* kvstored.native._batch: a read or write batch built, run and answered in one C call.
 *
 * The uring engine's per-item cost in Python (checking an item, taking its buffer's
 * address, filling its request, building its result) came to 2-7 us an item on this
 * machine, against a 4 KiB random read every 13 us at queue depth 32: the disk idled while
 * Python prepared the batch, and under load the interpreter's CPU was what the engine ran
 * out of. cffi cannot hand Python objects to C, so this small module uses the C API (the
 * stable ABI of Python 3.11) for the one job that needs it: turning the list of
 * ``(IoFile, offset, buffer)`` items into an array of ``struct kv_req``.
 *
 * transfer() takes the batch, and either runs all of it or none of it:
 *
 * - It returns None, having started no I/O, when any item is not the plain case (not a
 *   3-tuple of an IoFile, an int offset and one contiguous buffer; a vectored item; an
 *   unaligned item on an O_DIRECT file; an offset out of range; a read into read-only
 *   memory). The engine then takes the general path in Python (engine.py), which bounces,
 *   joins or raises with its messages, so the contract has one definition.
 * - Otherwise it holds each buffer (PyObject_GetBuffer, so a bytearray cannot be resized
 *   under the kernel) and runs the batch through kv_ring_run() of io_uring_core.c with the
 *   GIL released. That function is called through the address the cffi module gives, so
 *   one copy of the ring code runs every ring. It returns ``(rc, results, failed)``: rc is
 *   kv_ring_run's, results holds the bytes moved per item, or ``(result, done)`` for an
 *   item that failed (result INT64_MIN: the ring failed first), and failed counts those.
 *
 * Building the requests costs about 0.1 us an item, so the batch is checked whole before
 * its first request is submitted: the all-or-nothing choice above needs that, and the disk
 * waits about 0.1 ms for a batch of 1024.
 *
 * It is not the engine: it knows nothing of threads, rings, bounce buffers or errors'
 * wording; uring.py owns those.
 */
#ifndef Py_LIMITED_API
#define Py_LIMITED_API 0x030B0000
#endif
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>

#include "io_uring_core.h"

typedef int (*run_fn)(struct kv_ring *, struct kv_req *, size_t, char *const *,
                      const uint64_t *);

static PyObject *name_fd, *name_direct;

/* Fills `q` from `item`. 1 when done, 0 when the item needs the general path (no Python
   error is left set), -1 on a Python error (out of memory). `view` receives the buffer
   held for the request, `held` says whether it was taken. */
static int fill(PyObject *item, PyObject *file_type, int writable, uint64_t align,
                struct kv_req *q, Py_buffer *view, int *held)
{
    *held = 0;
    if (!PyTuple_Check(item) || PyTuple_Size(item) != 3)
        return 0;
    PyObject *file = PyTuple_GetItem(item, 0);
    PyObject *offset = PyTuple_GetItem(item, 1);
    PyObject *buffer = PyTuple_GetItem(item, 2);
    int is_file = PyObject_IsInstance(file, file_type);
    if (is_file <= 0)
        return is_file;
    if (!PyLong_CheckExact(offset) || PyList_Check(buffer) || PyTuple_Check(buffer))
        return 0;
    int overflow = 0;
    long long at = PyLong_AsLongLongAndOverflow(offset, &overflow);
    if (overflow || at < 0)
        return 0;
    PyObject *fd_object = PyObject_GetAttr(file, name_fd);
    if (!fd_object)
        return -1;
    long fd = PyLong_AsLong(fd_object);
    Py_DECREF(fd_object);
    if (fd == -1 && PyErr_Occurred())
        return -1;
    PyObject *direct_object = PyObject_GetAttr(file, name_direct);
    if (!direct_object)
        return -1;
    int direct = PyObject_IsTrue(direct_object);
    Py_DECREF(direct_object);
    if (direct < 0)
        return -1;
    if (PyObject_GetBuffer(buffer, view, writable ? PyBUF_WRITABLE : PyBUF_SIMPLE) < 0) {
        PyErr_Clear(); /* not a buffer, read-only, not contiguous: Python says which */
        return 0;
    }
    *held = 1;
    uint64_t len = (uint64_t)view->len;
    if (len > (uint64_t)INT64_MAX - (uint64_t)at)
        return 0;
    if (direct && len && (((uint64_t)at | len | (uint64_t)(uintptr_t)view->buf) & (align - 1)))
        return 0; /* unaligned on O_DIRECT: the bounce path */
    q->fd = (int32_t)fd;
    q->offset = (uint64_t)at;
    q->buf = view->buf;
    q->len = len;
    q->align = direct && len ? (uint32_t)align : 0;
    q->nvec = 0;
    return 1;
}

static PyObject *results_of(const struct kv_req *reqs, Py_ssize_t n, Py_ssize_t *failed)
{
    PyObject *results = PyList_New(n);
    if (!results)
        return NULL;
    *failed = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        const struct kv_req *q = &reqs[i];
        PyObject *entry = q->result >= 0
            ? PyLong_FromLongLong(q->result)
            : Py_BuildValue("(LK)", (long long)q->result, (unsigned long long)q->done);
        if (!entry) {
            Py_DECREF(results);
            return NULL;
        }
        *failed += q->result < 0;
        PyList_SetItem(results, i, entry); /* steals entry */
    }
    return results;
}

static PyObject *transfer(PyObject *self, PyObject *args)
{
    (void)self;
    unsigned int code;
    PyObject *items, *file_type;
    unsigned long long ring_address, run_address;
    unsigned int align;
    if (!PyArg_ParseTuple(args, "IO!OKKI:transfer", &code, &PyList_Type, &items, &file_type,
                          &ring_address, &run_address, &align))
        return NULL;
    if ((code != KV_OP_READ && code != KV_OP_WRITE) || align == 0 || (align & (align - 1))
        || !ring_address || !run_address) {
        PyErr_SetString(PyExc_ValueError, "transfer: a read or write, a ring, kv_ring_run "
                                          "and a power-of-two alignment");
        return NULL;
    }
    struct kv_ring *ring = (struct kv_ring *)(uintptr_t)ring_address;
    run_fn run = (run_fn)(uintptr_t)run_address;
    Py_ssize_t n = PyList_Size(items);
    if (n <= 0)
        Py_RETURN_NONE;
    struct kv_req *reqs = PyMem_Calloc((size_t)n, sizeof *reqs);
    Py_buffer *views = PyMem_Calloc((size_t)n, sizeof *views);
    if (!reqs || !views) {
        PyMem_Free(reqs);
        PyMem_Free(views);
        return PyErr_NoMemory();
    }
    /* Every item is checked before the first request goes to the kernel: a batch the
       general path must take (or that raises there) starts no I/O here. */
    Py_ssize_t held = 0;
    int outcome = 1;
    for (Py_ssize_t i = 0; i < n && outcome == 1; i++) {
        int taken;
        reqs[i].op = code;
        outcome = fill(PyList_GetItem(items, i), file_type, code == KV_OP_READ, align,
                       &reqs[i], &views[i], &taken);
        held += taken;
    }
    PyObject *answer = NULL;
    if (outcome == 1) {
        int rc;
        Py_BEGIN_ALLOW_THREADS
        rc = run(ring, reqs, (size_t)n, NULL, NULL);
        Py_END_ALLOW_THREADS
        Py_ssize_t failed;
        PyObject *results = results_of(reqs, n, &failed);
        if (results)
            answer = Py_BuildValue("(iNn)", rc, results, failed);
    } else if (outcome == 0) {
        answer = Py_NewRef(Py_None);
    }
    for (Py_ssize_t i = 0; i < held; i++)
        PyBuffer_Release(&views[i]);
    PyMem_Free(views);
    PyMem_Free(reqs);
    return answer;
}

static PyMethodDef methods[] = {
    {"transfer", transfer, METH_VARARGS,
     "transfer(code, items, file_type, ring, run, align) -> "
     "(rc, results, failed), or None for a batch the general path must take."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_batch",
    "A read or write batch built, run and answered in one C call (see batch.c).",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__batch(void)
{
    name_fd = PyUnicode_InternFromString("fd");
    name_direct = PyUnicode_InternFromString("direct");
    if (!name_fd || !name_direct)
        return NULL;
    return PyModule_Create(&module);
}
