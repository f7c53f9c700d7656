/* Batched reads, writes and syncs through one io_uring (liburing).
 *
 * kv_ring_run() keeps up to `depth` requests in flight, completes short transfers by
 * asking for the rest, and writes each request's outcome into it. It blocks until the
 * whole batch is done; cffi releases the GIL around every call into this file, so other
 * Python threads run while it waits.
 *
 * kv_ring_push() and kv_ring_wait() split that in two, so that a caller can keep the
 * queue full across batches: push starts a batch and returns, wait returns when one
 * batch is done, and the ring's queue of batches (first..last) feeds the kernel from every
 * pushed batch in order. Returning from wait for batch N leaves batch N+1's requests in
 * flight while the caller looks at N's results and pushes N+2, so the disk does not idle
 * at the batch boundary. kv_ring_run is push and wait in one.
 *
 * A ring is run one of two ways:
 * - by its caller (kv_ring_create): one thread owns it (the Python layer keeps one per
 *   thread) and nothing takes a lock. The ring runs only during that thread's calls, so
 *   between them (while Python looks at a batch's results) nothing refills the queue.
 * - by a worker thread of its own (kv_ring_create_served), the only thread that submits
 *   to it or takes its completions: it refills the queue as each request completes,
 *   whatever the caller does meanwhile. The caller's calls hand batches over under the
 *   worker's lock; an eventfd (the doorbell, of which the worker keeps a read in the
 *   ring) wakes the worker when it sleeps in the kernel and the queue has room, and a
 *   condition variable wakes a caller whose batch finished. Each handover wakes the
 *   other thread, tens of microseconds on a VM whose idle vCPU halts, so the Python
 *   layer serves only batches that stay in flight across calls (read streams) this way.
 *
 * Each request goes to the kernel in an io_uring_enter of its own, as soon as it is
 * queued (fio's default, iodepth_batch_submit=1), not several per call. A call carrying
 * several requests is plugged by the block layer, which hands them to the device as one
 * list behind one notification; on the virtio disk of the machine this was measured on,
 * the device then served them far more slowly: 4 KiB random reads at 0.76-0.84x fio's
 * rate and 1 MiB sequential reads at 0.44x, against 0.92-1.00x and 0.88-0.91x one per
 * call (docs/benchmarks.md, "One request per entry into the kernel"). It costs a system
 * call per request, about 1.5 us of CPU per 4 KiB read there.
 *
 * A sync (FSYNC/FDATASYNC) always runs on an io-wq worker, which may drop its last
 * reference to the request, and so to the file, a moment after the completion reached us;
 * with DEFER_TASKRUN that final put even waits for this thread's next io_uring_enter.
 * A caller that closes the file right after the sync (as a backend's close() does after
 * its last checkpoint) would then return while the kernel still holds the file open. So
 * each sync is followed by a NOP linked to it (a fence): the kernel starts the NOP only
 * once the sync's request is freed, and posts its completion after that free, so when
 * kv_ring_run has seen every fence, no sync of the batch still holds its file.
 *
 * A vectored request (nvec > 0) goes as READV/WRITEV. Its pieces are copied into an iovec
 * array the ring owns for the length of the batch, so the kernel's view of them stays
 * valid until the request completes whatever the caller's array does; after a short
 * transfer the request's own part of that array is advanced past what was moved and the
 * rest is asked for, as for one buffer.
 *
 * Built with KV_HAVE_URING=0 (liburing missing at build time), every entry point reports
 * -ENOSYS and Python uses the POSIX engine instead.
 */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "io_uring_core.h"

#ifndef KV_HAVE_URING
#define KV_HAVE_URING 0
#endif

#if KV_HAVE_URING
#include <liburing.h>
#include <pthread.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/uio.h>
#include <unistd.h>

/* Linux moves at most about 2 GiB per read or write; bigger requests are sent in chunks,
   each later chunk going round as if the previous one had come back short. */
#define KV_MAX_CHUNK (1u << 30)

/* The worker's stack: it calls only liburing and pthreads. */
#define KV_WORKER_STACK (256u << 10)

/* What a ring served by a worker thread (kv_ring_create_served) shares between that
   worker and the caller's thread, under `lock` with the ring's queue of batches. */
struct kv_worker {
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t done;        /* a batch finished, or the ring broke */
    pid_t pid;                  /* the process it runs in (a forked child has none) */
    int doorbell;               /* eventfd the caller writes when there is work */
    int bell_armed;             /* the worker's read of the doorbell is in flight */
    int sleeping;               /* the worker waits in the kernel, none has rung since */
    int stopping;               /* kv_ring_destroy asked it to end */
    uint64_t bell_value;        /* what the doorbell's read brings */
};

struct kv_ring {
    struct io_uring ring;
    unsigned depth;
    unsigned nfixed;
    unsigned inflight;          /* completions the kernel owes us, fences included (not
                                   the doorbell's) */
    int broken;                 /* -errno once io_uring_enter failed for good, else 0 */
    struct kv_span fixed[KV_MAX_FIXED_BUFFERS];
    struct kv_stats stats;
    struct kv_batch *first;     /* the batches with requests still to queue, in order */
    struct kv_batch *last;
    struct kv_worker *worker;   /* NULL: the caller's thread runs the ring itself */
};

int kv_built_with_uring(void) { return 1; }

static int setup_ring(unsigned entries, struct io_uring *ring, int served)
{
    /* Single issuer + deferred task work suit a ring that one thread both submits to and
       waits on (Linux 6.1+); older kernels reject the flags with EINVAL, so step down.
       A served ring is not single-issuer: its worker submits, the caller's thread
       registers buffers (which a single-issuer ring refuses from another thread). Its
       task work is cooperative all the same: the worker enters the kernel for every
       request and to wait, and the completions run then. */
    static const unsigned flag_sets[] = {
        IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN,
        IORING_SETUP_COOP_TASKRUN,
        0,
    };
    int rc = -EINVAL;
    for (size_t i = served ? 1 : 0; i < sizeof flag_sets / sizeof flag_sets[0]; i++) {
        rc = io_uring_queue_init(entries, ring, flag_sets[i]);
        if (rc != -EINVAL)
            break;
    }
    return rc;
}

/* The caller's side of a served ring takes the worker's lock; a ring the caller runs
   itself has nobody to share with. */
static void lock(struct kv_ring *r)
{
    if (r->worker)
        pthread_mutex_lock(&r->worker->lock);
}

static void unlock(struct kv_ring *r)
{
    if (r->worker)
        pthread_mutex_unlock(&r->worker->lock);
}

/* Wakes the callers waiting for a batch of a served ring: one finished, or it broke. */
static void wake_waiters(struct kv_ring *r)
{
    if (r->worker)
        pthread_cond_broadcast(&r->worker->done);
}

int kv_uring_probe(void)
{
    static const int needed[] = {
        IORING_OP_READ, IORING_OP_WRITE, IORING_OP_FSYNC,
        IORING_OP_READ_FIXED, IORING_OP_WRITE_FIXED,
        IORING_OP_READV, IORING_OP_WRITEV,
    };
    struct io_uring ring;
    int rc = setup_ring(2, &ring, 0);
    if (rc < 0)
        return rc;
    struct io_uring_probe *probe = io_uring_get_probe_ring(&ring);
    rc = probe ? 0 : -EOPNOTSUPP;
    for (size_t i = 0; probe && i < sizeof needed / sizeof needed[0]; i++)
        if (!io_uring_opcode_supported(probe, needed[i]))
            rc = -EOPNOTSUPP;
    if (probe)
        io_uring_free_probe(probe);
    io_uring_queue_exit(&ring);
    return rc;
}

int kv_ring_create(unsigned depth, struct kv_ring **out)
{
    struct kv_ring *r = calloc(1, sizeof *r);
    if (!r)
        return -ENOMEM;
    int rc = setup_ring(depth, &r->ring, 0);
    if (rc < 0) {
        free(r);
        return rc;
    }
    r->depth = depth;
    *out = r;
    return 0;
}

static void *serve(void *arg);

int kv_ring_create_served(unsigned depth, struct kv_ring **out)
{
    struct kv_ring *r = calloc(1, sizeof *r);
    struct kv_worker *w = calloc(1, sizeof *w);
    int rc = -ENOMEM;
    if (!r || !w)
        goto fail;
    /* One entry more than the depth, for the doorbell's read. */
    rc = setup_ring(depth + 1, &r->ring, 1);
    if (rc < 0)
        goto fail;
    r->depth = depth;
    r->worker = w;
    w->pid = getpid();
    w->doorbell = eventfd(0, EFD_CLOEXEC);
    if (w->doorbell < 0) {
        rc = -errno;
        goto fail_ring;
    }
    pthread_mutex_init(&w->lock, NULL);
    pthread_cond_init(&w->done, NULL);
    /* The worker blocks every signal, so that they go to the caller's threads (Python
       handles them on its main thread) and never interrupt the worker. */
    pthread_attr_t attr;
    sigset_t all, before;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, KV_WORKER_STACK);
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &before);
    rc = -pthread_create(&w->thread, &attr, serve, r);
    pthread_sigmask(SIG_SETMASK, &before, NULL);
    pthread_attr_destroy(&attr);
    if (rc < 0) {
        pthread_cond_destroy(&w->done);
        pthread_mutex_destroy(&w->lock);
        close(w->doorbell);
        goto fail_ring;
    }
    *out = r;
    return 0;
fail_ring:
    io_uring_queue_exit(&r->ring);
fail:
    free(w);
    free(r);
    return rc;
}

/* Writes the doorbell of a served ring. */
static void ring_bell(struct kv_worker *w)
{
    uint64_t one = 1;
    w->sleeping = 0; /* once is enough until the worker goes to sleep again */
    while (write(w->doorbell, &one, sizeof one) < 0 && errno == EINTR)
        ;
}

void kv_ring_destroy(struct kv_ring *r)
{
    if (!r)
        return;
    struct kv_worker *w = r->worker;
    if (w && w->pid == getpid()) {
        /* The worker ends once nothing it started is in flight, so no request outlives
           it and writes into memory after this returns. (Python destroys a ring only
           when no batch of it is pending: a pending batch holds its ring.) */
        pthread_mutex_lock(&w->lock);
        w->stopping = 1;
        ring_bell(w);
        pthread_mutex_unlock(&w->lock);
        pthread_join(w->thread, NULL);
        pthread_cond_destroy(&w->done);
        pthread_mutex_destroy(&w->lock);
    }
    /* In a forked child no worker runs and the lock may have been held at the fork:
       only the memory and the descriptors are let go. */
    if (w)
        close(w->doorbell);
    io_uring_queue_exit(&r->ring);
    free(w);
    free(r);
}

static int register_spans(struct kv_ring *r, const struct kv_span *spans, unsigned n)
{
    struct iovec iov[KV_MAX_FIXED_BUFFERS];
    for (unsigned i = 0; i < n; i++) {
        iov[i].iov_base = spans[i].base;
        iov[i].iov_len = spans[i].len;
    }
    int rc = n ? io_uring_register_buffers(&r->ring, iov, n) : 0;
    if (rc == 0) {
        memcpy(r->fixed, spans, n * sizeof *spans);
        r->nfixed = n;
    }
    return rc;
}

int kv_ring_register_buffers(struct kv_ring *r, const struct kv_span *spans, unsigned n)
{
    if (n > KV_MAX_FIXED_BUFFERS)
        return -EINVAL;
    lock(r); /* a served ring's worker looks the set up for every request it queues */
    struct kv_span previous[KV_MAX_FIXED_BUFFERS];
    unsigned nprevious = r->nfixed;
    memcpy(previous, r->fixed, nprevious * sizeof *previous);
    if (r->nfixed) {
        /* The kernel replaces a set only by unregistering it first. */
        io_uring_unregister_buffers(&r->ring);
        r->nfixed = 0;
    }
    int rc = register_spans(r, spans, n);
    if (rc < 0)
        register_spans(r, previous, nprevious);
    unlock(r);
    return rc;
}

/* The index of the fixed buffer that holds all of [buf, buf+len), or -1. */
static int fixed_index(const struct kv_ring *r, const char *buf, uint64_t len)
{
    for (unsigned i = 0; i < r->nfixed; i++) {
        const struct kv_span *s = &r->fixed[i];
        if (buf >= s->base && len <= s->len && (uint64_t)(buf - s->base) <= s->len - len)
            return (int)i;
    }
    return -1;
}

static int is_transfer(const struct kv_req *q)
{
    return q->op == KV_OP_READ || q->op == KV_OP_WRITE;
}

static int is_sync(const struct kv_req *q)
{
    return q->op == KV_OP_FSYNC || q->op == KV_OP_FDATASYNC;
}

/* A fence's user data is its sync's request with the low bit set (a kv_req is aligned
   to 8), so that its completion is counted against that request's batch. */
static void *fence_data(struct kv_req *q) { return (void *)((uintptr_t)q | 1); }

/* Submission entries queue() takes for `q`: a sync and its fence, or one. A ring of depth
   1 has no room for fences: its syncs go alone. */
static unsigned entries_for(const struct kv_ring *r, const struct kv_req *q)
{
    return is_sync(q) && r->depth >= 2 ? 2 : 1;
}

/* Queues what is left of `q`, and a fence after a sync when the queue has room for it.
   The caller has made sure a submission entry is free. Returns the completions to
   expect (2 with a fence). */
static unsigned queue(struct kv_ring *r, struct kv_req *q)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(&r->ring);
    if (is_sync(q)) {
        io_uring_prep_fsync(sqe, q->fd, q->op == KV_OP_FDATASYNC ? IORING_FSYNC_DATASYNC : 0);
        io_uring_sqe_set_data(sqe, q);
        r->stats.sqes++;
        if (r->depth < 2 || io_uring_sq_space_left(&r->ring) < 1)
            return 1; /* no room for the fence: depth 1, or a resubmit in a full queue */
        io_uring_sqe_set_flags(sqe, IOSQE_IO_LINK);
        struct io_uring_sqe *fence = io_uring_get_sqe(&r->ring);
        io_uring_prep_nop(fence);
        io_uring_sqe_set_data(fence, fence_data(q));
        q->batch->left++; /* its batch is done once the fence is seen too */
        r->stats.sqes++;
        r->stats.fences++;
        return 2;
    } else if (q->nvec) {
        /* More than KV_IOV_MAX pieces left go round again like a short transfer; the
           kernel itself moves at most about 2 GiB per call, and says so the same way. */
        unsigned count = q->iov_left > KV_IOV_MAX ? KV_IOV_MAX : q->iov_left;
        uint64_t offset = q->offset + q->done;
        if (q->op == KV_OP_READ)
            io_uring_prep_readv(sqe, q->fd, q->iov, count, offset);
        else
            io_uring_prep_writev(sqe, q->fd, q->iov, count, offset);
        r->stats.vec_sqes++;
    } else {
        char *buf = q->buf + q->done;
        uint64_t left = q->len - q->done;
        unsigned chunk = left > KV_MAX_CHUNK ? KV_MAX_CHUNK : (unsigned)left;
        uint64_t offset = q->offset + q->done;
        int idx = fixed_index(r, q->buf, q->len);
        if (q->op == KV_OP_READ) {
            if (idx >= 0)
                io_uring_prep_read_fixed(sqe, q->fd, buf, chunk, offset, idx);
            else
                io_uring_prep_read(sqe, q->fd, buf, chunk, offset);
        } else {
            if (idx >= 0)
                io_uring_prep_write_fixed(sqe, q->fd, buf, chunk, offset, idx);
            else
                io_uring_prep_write(sqe, q->fd, buf, chunk, offset);
        }
        if (idx >= 0)
            r->stats.fixed_sqes++;
    }
    io_uring_sqe_set_data(sqe, q);
    r->stats.sqes++;
    return 1;
}

/* Moves a vectored request's iovec past `n` more bytes done. */
static void advance(struct kv_req *q, uint64_t n)
{
    struct iovec *v = q->iov;
    while (n && q->iov_left) {
        if (n < v->iov_len) {
            v->iov_base = (char *)v->iov_base + n;
            v->iov_len -= n;
            break;
        }
        n -= v->iov_len;
        v++;
        q->iov_left--;
    }
    q->iov = v;
}

/* Gives every vectored request of the batch its own copy of its pieces in an iovec array
   the batch owns (b->iov, freed when the batch is done) and sets its len to their total.
   -ENOMEM when the array cannot be had. */
static int lay_out_iovecs(struct kv_batch *b, char *const *bases, const uint64_t *lens)
{
    struct kv_req *reqs = b->reqs;
    size_t need = 0;
    for (size_t i = 0; i < b->n; i++)
        if (is_transfer(&reqs[i]))
            need += reqs[i].nvec;
    if (need == 0)
        return 0;
    struct iovec *at = malloc(need * sizeof *at);
    if (!at)
        return -ENOMEM;
    b->iov = at;
    for (size_t i = 0; i < b->n; i++) {
        struct kv_req *q = &reqs[i];
        if (!is_transfer(q) || q->nvec == 0)
            continue;
        q->iov = at;
        q->iov_left = q->nvec;
        q->len = 0;
        for (uint32_t k = 0; k < q->nvec; k++) {
            at[k].iov_base = *bases++;
            at[k].iov_len = *lens;
            q->len += *lens++;
        }
        at += q->nvec;
    }
    return 0;
}

/* Accounts one completion of `q`. Returns 1 when q is finished, 0 when it must go again. */
static int complete(struct kv_req *q, int res)
{
    if (res == -EINTR)
        return 0;
    if (res < 0) {
        q->result = res;
        return 1;
    }
    if (!is_transfer(q)) {
        q->result = 0;
        return 1;
    }
    q->done += (unsigned)res;
    if (q->nvec)
        advance(q, (unsigned)res);
    if (q->done == q->len) {
        q->result = (int64_t)q->done;
        return 1;
    }
    if (res == 0) {
        /* A read that returns nothing is at end of file; a write that makes no progress
           would loop forever, so it is an I/O error. */
        q->result = q->op == KV_OP_READ ? (int64_t)q->done : -EIO;
        return 1;
    }
    if (q->op == KV_OP_READ && q->align && (q->offset + q->done) % q->align) {
        /* An O_DIRECT read stops off a block boundary only at end of file. Stop here: a
           follow-up at that unaligned offset costs a round trip and is outside what
           O_DIRECT promises to accept (ext4 and tmpfs answer 0, others may say EINVAL). */
        q->result = (int64_t)q->done;
        return 1;
    }
    return 0;
}

/* Makes `b` ready and puts it last in the ring's queue of batches; starts nothing. */
static void enqueue(struct kv_ring *r, struct kv_batch *b, char *const *vec_base,
                    const uint64_t *vec_len)
{
    b->next = 0;
    b->left = b->n;
    b->later = NULL;
    b->iov = NULL;
    for (size_t i = 0; i < b->n; i++) {
        b->reqs[i].result = INT64_MIN;
        b->reqs[i].done = 0;
        b->reqs[i].batch = b;
    }
    if (lay_out_iovecs(b, vec_base, vec_len) < 0) {
        /* No memory for the iovecs: the vectored requests fail, the others go on. */
        for (size_t i = 0; i < b->n; i++)
            if (is_transfer(&b->reqs[i]) && b->reqs[i].nvec)
                b->reqs[i].result = -ENOMEM;
    }
    if (b->n == 0)
        return;
    if (r->last)
        r->last->later = b;
    else
        r->first = b;
    r->last = b;
}

static int transient(int rc) { return rc == -EINTR || rc == -EAGAIN || rc == -EBUSY; }

/* Records a failure of the ring itself: every later call reports it. */
static int fail(struct kv_ring *r, int rc)
{
    r->broken = rc;
    return rc;
}

/* Tops the queue up to its depth from the queued batches, in order: every batch goes in
   as fast as the queue drains, each request submitted on its own (see the top of this
   file). A sync needs room for its fence too (a ring of depth 1 never has it), and the
   two go in one submission, since a link does not span two. Requests that failed before
   they could start, or move no bytes, finish here. 0, or -errno when the ring failed. */
static int fill(struct kv_ring *r)
{
    while (r->first) {
        struct kv_batch *b = r->first;
        while (b->next < b->n) {
            struct kv_req *q = &b->reqs[b->next];
            if (r->inflight + entries_for(r, q) > r->depth)
                return 0;
            b->next++;
            if (q->result == INT64_MIN && is_transfer(q) && q->len == 0)
                q->result = 0; /* moves no bytes */
            if (q->result != INT64_MIN) {
                /* Done without the kernel: failed before it could start, or empty. */
                if (--b->left == 0)
                    wake_waiters(r);
                continue;
            }
            r->inflight += queue(r, q);
            /* An entry left in the ring (EAGAIN, EBUSY) goes with the next submission. */
            int sent = io_uring_submit(&r->ring);
            if (sent < 0 && !transient(sent))
                return fail(r, sent);
            r->stats.submits += sent > 0;
        }
        r->first = b->later;
        if (!r->first)
            r->last = NULL;
    }
    return 0;
}

/* Takes every completion that is ready, requeueing the rest of short transfers.
   Returns how many batches it finished. */
static int reap(struct kv_ring *r)
{
    struct io_uring_cqe *cqe;
    unsigned head, seen = 0;
    int finished = 0;
    uintptr_t bell = r->worker ? (uintptr_t)&r->worker->bell_value : 0;
    io_uring_for_each_cqe(&r->ring, head, cqe) {
        uintptr_t data = (uintptr_t)io_uring_cqe_get_data(cqe);
        seen++;
        if (data == bell) {
            r->worker->bell_armed = 0; /* rung: armed again before the worker sleeps */
            continue;
        }
        struct kv_req *q = (struct kv_req *)(data & ~(uintptr_t)1);
        if (!(data & 1) && !complete(q, cqe->res)) {
            /* Its own entry was just consumed, so a free one exists. */
            r->inflight += queue(r, q) - 1;
            r->stats.resubmits++;
            continue;
        }
        /* Finished; or a fence, whose sync has let go of its file. */
        r->inflight--;
        finished += --q->batch->left == 0;
    }
    io_uring_cq_advance(&r->ring, seen);
    return finished;
}

/* Takes `b` out of the queue of batches if it is still there (a broken ring). */
static void unlink_batch(struct kv_ring *r, struct kv_batch *b)
{
    struct kv_batch *before = NULL;
    for (struct kv_batch *at = r->first; at; before = at, at = at->later) {
        if (at != b)
            continue;
        if (before)
            before->later = b->later;
        else
            r->first = b->later;
        if (r->last == b)
            r->last = before;
        return;
    }
}

/* Runs the ring until `b` is done, then hands what it queued meanwhile to the kernel, so
   later batches stay in flight while the caller looks at b's results. The caller's
   thread runs the ring itself (a ring without a worker). */
static int finish(struct kv_ring *r, struct kv_batch *b)
{
    int rc = r->broken;
    while (rc == 0) {
        rc = fill(r);
        if (rc < 0)
            break;
        if (b->left == 0) {
            if (io_uring_sq_ready(&r->ring)) {
                int sent = io_uring_submit(&r->ring);
                if (sent < 0 && !transient(sent))
                    rc = fail(r, sent);
            }
            break;
        }
        if (r->inflight == 0) {
            rc = fail(r, -EIO); /* cannot happen: b has requests nobody runs */
            break;
        }
        int got = io_uring_submit_and_wait(&r->ring, 1);
        if (got < 0 && !transient(got)) {
            rc = fail(r, got);
            break;
        }
        reap(r);
    }
    if (rc < 0)
        unlink_batch(r, b);
    free(b->iov);
    b->iov = NULL;
    return rc;
}

/* Puts the worker's read of the doorbell into the ring (not counted in `inflight`: it
   belongs to no batch). 0, or -errno when the ring failed. */
static int arm_bell(struct kv_ring *r)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(&r->ring);
    if (!sqe)
        return 0; /* entries wait in the ring: their completions wake the worker */
    struct kv_worker *w = r->worker;
    io_uring_prep_read(sqe, w->doorbell, &w->bell_value, sizeof w->bell_value, 0);
    io_uring_sqe_set_data(sqe, &w->bell_value);
    w->bell_armed = 1;
    int sent = io_uring_submit(&r->ring);
    return sent < 0 && !transient(sent) ? sent : 0;
}

/* The worker of a served ring: the only thread that submits to it or takes its
   completions. It tops the queue up from the queued batches, waits in the kernel for a
   completion or the doorbell, takes what completed, wakes the callers whose batches
   finished, and goes round again, so the queue is refilled as each request completes,
   whatever the caller's thread is doing meanwhile. It ends when kv_ring_destroy asks (or
   the ring broke), once nothing it started is still in flight. */
static void *serve(void *arg)
{
    struct kv_ring *r = arg;
    struct kv_worker *w = r->worker;
    pthread_mutex_lock(&w->lock);
    for (;;) {
        int rc = 0;
        if (!r->broken && !w->stopping) {
            rc = fill(r);
            if (rc == 0 && !w->bell_armed)
                rc = arm_bell(r);
            if (rc < 0) {
                fail(r, rc);
                wake_waiters(r);
            }
        }
        /* Ending, it waits for its read of the doorbell too: nothing may write into the
           ring's memory once kv_ring_destroy frees it. */
        if (r->inflight == 0 && ((w->stopping && !w->bell_armed) || r->broken))
            break;
        w->sleeping = 1;
        pthread_mutex_unlock(&w->lock);
        /* Only this thread touches the submission queue, so it needs no lock; this also
           sends an entry that a transient failure left there. */
        int got = io_uring_submit_and_wait(&r->ring, 1);
        pthread_mutex_lock(&w->lock);
        w->sleeping = 0;
        if (got < 0 && !transient(got)) {
            fail(r, got);
            wake_waiters(r);
            break; /* the kernel takes nothing more from this ring */
        }
        if (reap(r))
            wake_waiters(r);
    }
    pthread_mutex_unlock(&w->lock);
    return NULL;
}

/* Waits until a served ring's worker has finished `b`, or the ring broke; later batches
   stay in flight. Called with the lock held. */
static int await_batch(struct kv_ring *r, struct kv_batch *b)
{
    while (b->left && !r->broken)
        pthread_cond_wait(&r->worker->done, &r->worker->lock);
    int rc = b->left ? r->broken : 0;
    if (rc < 0)
        unlink_batch(r, b);
    free(b->iov);
    b->iov = NULL;
    return rc;
}

/* Queues `b` on a served ring and wakes its worker if it sleeps while the queue has
   room (with a full queue, the next completion wakes it). Called with the lock held. */
static int hand_over(struct kv_ring *r, struct kv_batch *b, char *const *vec_base,
                     const uint64_t *vec_len)
{
    enqueue(r, b, vec_base, vec_len);
    if (r->broken)
        return r->broken;
    if (b->n && r->worker->sleeping && r->inflight < r->depth)
        ring_bell(r->worker);
    return 0;
}

int kv_ring_push(struct kv_ring *r, struct kv_batch *b, char *const *vec_base,
                 const uint64_t *vec_len)
{
    if (r->worker) {
        lock(r);
        int rc = hand_over(r, b, vec_base, vec_len);
        unlock(r);
        return rc;
    }
    enqueue(r, b, vec_base, vec_len);
    if (r->broken)
        return r->broken;
    int rc = fill(r);
    if (rc < 0)
        return rc;
    /* One entry into the kernel runs any completions due (with DEFER_TASKRUN they wait
       for us), so that the queue can be topped up again. */
    rc = io_uring_submit_and_get_events(&r->ring);
    if (rc < 0 && !transient(rc))
        return fail(r, rc);
    reap(r);
    rc = fill(r);
    if (rc < 0)
        return rc;
    if (io_uring_sq_ready(&r->ring)) {
        rc = io_uring_submit(&r->ring);
        if (rc < 0 && !transient(rc))
            return fail(r, rc);
    }
    return 0;
}

int kv_ring_wait(struct kv_ring *r, struct kv_batch *b)
{
    if (!r->worker)
        return finish(r, b);
    lock(r);
    int rc = await_batch(r, b);
    unlock(r);
    return rc;
}

int kv_ring_run(struct kv_ring *r, struct kv_req *reqs, size_t n,
                char *const *vec_base, const uint64_t *vec_len)
{
    struct kv_batch b = {.reqs = reqs, .n = n};
    if (!r->worker) {
        enqueue(r, &b, vec_base, vec_len);
        return finish(r, &b);
    }
    lock(r);
    int handed = hand_over(r, &b, vec_base, vec_len);
    int rc = await_batch(r, &b);
    unlock(r);
    return handed < 0 ? handed : rc;
}

unsigned kv_ring_pending(struct kv_ring *r)
{
    lock(r);
    unsigned pending = r->inflight;
    for (struct kv_batch *b = r->first; b; b = b->later)
        pending += (unsigned)(b->n - b->next);
    unlock(r);
    return pending;
}

void kv_ring_stats(struct kv_ring *r, struct kv_stats *out)
{
    lock(r);
    *out = r->stats;
    unlock(r);
}

#else /* !KV_HAVE_URING: the POSIX-only build */

int kv_built_with_uring(void) { return 0; }
int kv_uring_probe(void) { return -ENOSYS; }
int kv_ring_create(unsigned depth, struct kv_ring **out)
{
    (void)depth;
    *out = NULL;
    return -ENOSYS;
}
int kv_ring_create_served(unsigned depth, struct kv_ring **out)
{
    return kv_ring_create(depth, out);
}
void kv_ring_destroy(struct kv_ring *r) { (void)r; }
int kv_ring_register_buffers(struct kv_ring *r, const struct kv_span *s, unsigned n)
{
    (void)r, (void)s, (void)n;
    return -ENOSYS;
}
int kv_ring_run(struct kv_ring *r, struct kv_req *reqs, size_t n,
                char *const *vec_base, const uint64_t *vec_len)
{
    (void)r, (void)reqs, (void)n, (void)vec_base, (void)vec_len;
    return -ENOSYS;
}
int kv_ring_push(struct kv_ring *r, struct kv_batch *b, char *const *vec_base,
                 const uint64_t *vec_len)
{
    (void)r, (void)b, (void)vec_base, (void)vec_len;
    return -ENOSYS;
}
int kv_ring_wait(struct kv_ring *r, struct kv_batch *b)
{
    (void)r, (void)b;
    return -ENOSYS;
}
unsigned kv_ring_pending(struct kv_ring *r)
{
    (void)r;
    return 0;
}
void kv_ring_stats(struct kv_ring *r, struct kv_stats *out)
{
    (void)r;
    memset(out, 0, sizeof *out);
}

#endif
