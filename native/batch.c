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
#include <string.h>

#include "io_uring_core.h"

typedef int (*run_fn)(struct kv_ring *, struct kv_req *, size_t, char *const *,
                      const uint64_t *);
typedef int (*push_fn)(struct kv_ring *, struct kv_batch *, char *const *, const uint64_t *);
typedef int (*wait_fn)(struct kv_ring *, struct kv_batch *);

/* The most pieces of one vectored item (engine.py's MAX_PIECES): more is the general
   path's to refuse. */
#define MAX_PIECES 65536

static PyObject *name_fd, *name_direct;

/* The requests of one batch and what they hold: a buffer view per single-buffer item and
   per non-empty piece, and the pieces' addresses and lengths in batch order (what
   kv_ring_run/kv_ring_push take for vectored requests). */
struct build {
    struct kv_req *reqs;
    Py_ssize_t n;
    Py_buffer *views;
    Py_ssize_t held, views_cap;
    char **bases;
    uint64_t *lens;
    size_t pieces, pieces_cap;
};

static void release(struct build *b)
{
    for (Py_ssize_t i = 0; i < b->held; i++)
        PyBuffer_Release(&b->views[i]);
    b->held = 0;
    PyMem_Free(b->views);
    PyMem_Free(b->bases);
    PyMem_Free(b->lens);
    PyMem_Free(b->reqs);
    b->views = NULL;
    b->bases = NULL;
    b->lens = NULL;
    b->reqs = NULL;
}

/* A view slot for the next buffer, or NULL (a Python error set) when out of memory. */
static Py_buffer *next_view(struct build *b)
{
    if (b->held == b->views_cap) {
        Py_ssize_t cap = b->views_cap ? 2 * b->views_cap : b->n + 8;
        Py_buffer *grown = PyMem_Realloc(b->views, (size_t)cap * sizeof *grown);
        if (!grown) {
            PyErr_NoMemory();
            return NULL;
        }
        b->views = grown;
        b->views_cap = cap;
    }
    return &b->views[b->held];
}

/* Holds `buffer` for the request. 1 when held (*view is it), 0 when it is not a buffer of
   the kind needed (no Python error left set), -1 on a Python error. */
static int hold(struct build *b, PyObject *buffer, int writable, Py_buffer **view)
{
    Py_buffer *slot = next_view(b);
    if (!slot)
        return -1;
    if (PyObject_GetBuffer(buffer, slot, writable ? PyBUF_WRITABLE : PyBUF_SIMPLE) < 0) {
        PyErr_Clear(); /* not a buffer, read-only, not contiguous: Python says which */
        return 0;
    }
    b->held++;
    *view = slot;
    return 1;
}

static int add_piece(struct build *b, char *base, uint64_t len)
{
    if (b->pieces == b->pieces_cap) {
        size_t cap = b->pieces_cap ? 2 * b->pieces_cap : 64;
        char **bases = PyMem_Realloc(b->bases, cap * sizeof *bases);
        if (bases)
            b->bases = bases;
        uint64_t *lens = PyMem_Realloc(b->lens, cap * sizeof *lens);
        if (lens)
            b->lens = lens;
        if (!bases || !lens) {
            PyErr_NoMemory();
            return -1;
        }
        b->pieces_cap = cap;
    }
    b->bases[b->pieces] = base;
    b->lens[b->pieces++] = len;
    return 0;
}

/* Fills `q` with a vectored item's pieces. 1, 0 (the general path), or -1 as fill(). */
static int fill_pieces(struct build *b, PyObject *pieces, int writable, int direct,
                       uint64_t align, long long at, struct kv_req *q)
{
    Py_ssize_t count = PySequence_Size(pieces);
    if (count < 0)
        return -1;
    if (count > MAX_PIECES)
        return 0;
    uint64_t total = 0, misaligned = (uint64_t)at;
    uint32_t used = 0;
    for (Py_ssize_t k = 0; k < count; k++) {
        PyObject *piece = PyList_Check(pieces) ? PyList_GetItem(pieces, k)
                                               : PyTuple_GetItem(pieces, k);
        if (PyList_Check(piece) || PyTuple_Check(piece))
            return 0; /* nested: the general path refuses it */
        Py_buffer *view;
        int taken = hold(b, piece, writable, &view);
        if (taken <= 0)
            return taken;
        uint64_t len = (uint64_t)view->len;
        if (len == 0)
            continue; /* empty pieces are skipped, as engine.py does */
        if (add_piece(b, view->buf, len) < 0)
            return -1;
        misaligned |= len | (uint64_t)(uintptr_t)view->buf;
        total += len;
        used++;
        if (total > (uint64_t)INT64_MAX - (uint64_t)at)
            return 0;
    }
    if (direct && total && (misaligned & (align - 1)))
        return 0; /* O_DIRECT cannot take these pieces as they are: joined and bounced */
    q->offset = (uint64_t)at;
    q->nvec = used;
    q->len = total;
    q->buf = NULL;
    q->align = direct && total ? (uint32_t)align : 0;
    return 1;
}

/* Fills `q` from `item`. 1 when done, 0 when the item needs the general path (no Python
   error is left set), -1 on a Python error (out of memory). */
static int fill(struct build *b, PyObject *item, PyObject *file_type, int writable,
                uint64_t align, struct kv_req *q)
{
    if (!PyTuple_Check(item) || PyTuple_Size(item) != 3)
        return 0;
    PyObject *file = PyTuple_GetItem(item, 0);
    PyObject *offset = PyTuple_GetItem(item, 1);
    PyObject *buffer = PyTuple_GetItem(item, 2);
    int is_file = PyObject_IsInstance(file, file_type);
    if (is_file <= 0)
        return is_file;
    if (!PyLong_CheckExact(offset))
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
    q->fd = (int32_t)fd;
    if (PyList_Check(buffer) || PyTuple_Check(buffer))
        return fill_pieces(b, buffer, writable, direct, align, at, q);
    Py_buffer *view;
    int taken = hold(b, buffer, writable, &view);
    if (taken <= 0)
        return taken;
    uint64_t len = (uint64_t)view->len;
    if (len > (uint64_t)INT64_MAX - (uint64_t)at)
        return 0;
    if (direct && len && (((uint64_t)at | len | (uint64_t)(uintptr_t)view->buf) & (align - 1)))
        return 0; /* unaligned on O_DIRECT: the bounce path */
    q->offset = (uint64_t)at;
    q->buf = view->buf;
    q->len = len;
    q->align = direct && len ? (uint32_t)align : 0;
    q->nvec = 0;
    return 1;
}

/* Builds every request of `items` before any goes to the kernel: a batch the general path
   must take (or that raises there) starts no I/O here. 1 when built, 0 for the general
   path (an empty batch too: it answers that without a ring), -1 on a Python error; on 0
   and -1, `b` holds nothing. */
static int build(struct build *b, unsigned code, PyObject *items, PyObject *file_type,
                 uint64_t align)
{
    memset(b, 0, sizeof *b);
    b->n = PyList_Size(items);
    if (b->n <= 0)
        return 0;
    b->reqs = PyMem_Calloc((size_t)b->n, sizeof *b->reqs);
    if (!b->reqs) {
        PyErr_NoMemory();
        return -1;
    }
    int outcome = 1;
    for (Py_ssize_t i = 0; i < b->n && outcome == 1; i++) {
        b->reqs[i].op = code;
        outcome = fill(b, PyList_GetItem(items, i), file_type, code == KV_OP_READ, align,
                       &b->reqs[i]);
    }
    if (outcome != 1)
        release(b);
    return outcome;
}

static PyObject *results_of(const struct kv_req *reqs, Py_ssize_t n)
{
    PyObject *results = PyList_New(n);
    if (!results)
        return NULL;
    Py_ssize_t failed = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        const struct kv_req *q = &reqs[i];
        PyObject *entry = q->result >= 0
            ? PyLong_FromLongLong(q->result)
            : Py_BuildValue("(LK)", (long long)q->result, (unsigned long long)q->done);
        if (!entry) {
            Py_DECREF(results);
            return NULL;
        }
        failed += q->result < 0;
        PyList_SetItem(results, i, entry); /* steals entry */
    }
    return Py_BuildValue("(Nn)", results, failed);
}

/* (rc, results, failed) of a finished batch. */
static PyObject *answer(int rc, const struct kv_req *reqs, Py_ssize_t n)
{
    PyObject *pair = results_of(reqs, n);
    if (!pair)
        return NULL;
    PyObject *results = PyTuple_GetItem(pair, 0), *failed = PyTuple_GetItem(pair, 1);
    PyObject *triple = Py_BuildValue("(iOO)", rc, results, failed);
    Py_DECREF(pair);
    return triple;
}

static int check_args(unsigned code, unsigned align, unsigned long long ring,
                      unsigned long long fn, const char *what)
{
    if ((code != KV_OP_READ && code != KV_OP_WRITE) || align == 0 || (align & (align - 1))
        || !ring || !fn) {
        PyErr_Format(PyExc_ValueError, "%s: a read or write, a ring, the ring's functions "
                                       "and a power-of-two alignment", what);
        return -1;
    }
    return 0;
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
    if (check_args(code, align, ring_address, run_address, "transfer") < 0)
        return NULL;
    struct kv_ring *ring = (struct kv_ring *)(uintptr_t)ring_address;
    run_fn run = (run_fn)(uintptr_t)run_address;
    struct build b;
    int outcome = build(&b, code, items, file_type, align);
    if (outcome <= 0)
        return outcome == 0 ? Py_NewRef(Py_None) : NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = run(ring, b.reqs, (size_t)b.n, b.bases, b.lens);
    Py_END_ALLOW_THREADS
    PyObject *result = answer(rc, b.reqs, b.n);
    release(&b);
    return result;
}

/* -- Pending: a batch pushed into a ring, not yet waited for ----------------------------

   It owns the requests and holds every buffer they name until wait() has seen the batch
   finish, and keeps the Python ring object alive as long, so that the kernel never writes
   into memory that was given back or through a ring that was freed. One dropped without
   wait() waits in its destructor; if that is impossible (another thread: a ring takes
   requests from its own thread only), it keeps its buffers and ring for the life of the
   process rather than free memory the kernel may still write. */

typedef struct {
    PyObject_HEAD
    PyObject *ring;          /* the Python ring object; NULL once waited */
    struct kv_ring *handle;
    wait_fn wait;
    unsigned long thread;    /* the ring's thread */
    int rc;                  /* kv_ring_push's */
    struct build b;
    struct kv_batch batch;
} Pending;

static PyObject *pending_type;

/* Waits for the batch with the GIL released. */
static int pending_finish(Pending *p)
{
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = p->wait(p->handle, &p->batch);
    Py_END_ALLOW_THREADS
    return p->rc < 0 ? p->rc : rc;
}

static PyObject *pending_wait(PyObject *self, PyObject *unused)
{
    (void)unused;
    Pending *p = (Pending *)self;
    if (!p->ring) {
        PyErr_SetString(PyExc_RuntimeError, "this batch was waited for already");
        return NULL;
    }
    if (PyThread_get_thread_ident() != p->thread) {
        PyErr_SetString(PyExc_RuntimeError, "a pending batch is waited for by the thread "
                                            "that started it (its ring is that thread's)");
        return NULL;
    }
    int rc = pending_finish(p);
    PyObject *result = answer(rc, p->b.reqs, p->b.n);
    release(&p->b);
    Py_CLEAR(p->ring);
    return result;
}

static void pending_dealloc(PyObject *self)
{
    Pending *p = (Pending *)self;
    PyTypeObject *type = Py_TYPE(self);
    if (p->ring) {
        /* Another thread cannot wait: leak the whole object on purpose (see above). Its
           struct kv_batch stays linked in the ring's queue until the ring finishes it,
           so even the object's own memory must not be freed. */
        if (PyThread_get_thread_ident() != p->thread)
            return;
        pending_finish(p);
        release(&p->b);
        Py_CLEAR(p->ring);
    }
    freefunc tp_free = (freefunc)PyType_GetSlot(type, Py_tp_free);
    tp_free(self);
    Py_DECREF(type);
}

static PyMethodDef pending_methods[] = {
    {"wait", pending_wait, METH_NOARGS,
     "wait() -> (rc, results, failed): blocks until the batch is done (GIL released)."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot pending_slots[] = {
    {Py_tp_dealloc, pending_dealloc},
    {Py_tp_methods, pending_methods},
    {Py_tp_doc, "A batch pushed into a ring (see batch.c); wait() for its results."},
    {0, NULL},
};

static PyType_Spec pending_spec = {
    "kvstored.native._batch.Pending", sizeof(Pending), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION, pending_slots,
};

static PyObject *submit(PyObject *self, PyObject *args)
{
    (void)self;
    unsigned int code;
    PyObject *items, *file_type, *ring_object;
    unsigned long long ring_address, push_address, wait_address;
    unsigned int align;
    if (!PyArg_ParseTuple(args, "IO!OOKKKI:submit", &code, &PyList_Type, &items, &file_type,
                          &ring_object, &ring_address, &push_address, &wait_address, &align))
        return NULL;
    if (check_args(code, align, ring_address, push_address && wait_address ? 1 : 0,
                   "submit") < 0)
        return NULL;
    struct build b;
    int outcome = build(&b, code, items, file_type, align);
    if (outcome <= 0)
        return outcome == 0 ? Py_NewRef(Py_None) : NULL;
    allocfunc alloc = (allocfunc)PyType_GetSlot((PyTypeObject *)pending_type, Py_tp_alloc);
    Pending *p = (Pending *)alloc((PyTypeObject *)pending_type, 0);
    if (!p) {
        release(&b);
        return NULL;
    }
    p->ring = Py_NewRef(ring_object);
    p->handle = (struct kv_ring *)(uintptr_t)ring_address;
    p->wait = (wait_fn)(uintptr_t)wait_address;
    p->thread = PyThread_get_thread_ident();
    p->b = b;
    p->batch.reqs = b.reqs;
    p->batch.n = (size_t)b.n;
    push_fn push = (push_fn)(uintptr_t)push_address;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = push(p->handle, &p->batch, b.bases, b.lens);
    Py_END_ALLOW_THREADS
    p->rc = rc;
    /* The pieces' addresses were copied into the ring's iovecs: the arrays can go. */
    PyMem_Free(p->b.bases);
    PyMem_Free(p->b.lens);
    p->b.bases = NULL;
    p->b.lens = NULL;
    return (PyObject *)p;
}

static PyMethodDef methods[] = {
    {"transfer", transfer, METH_VARARGS,
     "transfer(code, items, file_type, ring, run, align) -> "
     "(rc, results, failed), or None for a batch the general path must take."},
    {"submit", submit, METH_VARARGS,
     "submit(code, items, file_type, ring_object, ring, push, wait, align) -> Pending, "
     "or None for a batch the general path must take (nothing started)."},
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
    pending_type = PyType_FromSpec(&pending_spec);
    if (!pending_type)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m)
        return NULL;
    if (PyModule_AddObjectRef(m, "Pending", pending_type) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
