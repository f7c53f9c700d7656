/* The C interface of kvstored.native._io.
 *
 * build_io.py feeds this file verbatim to cffi's cdef() as well as to the compiler, so it
 * holds plain declarations only: no #include, no include guard, no macro but integer
 * constants. io_uring_core.c includes it once.
 */

#define KV_OP_READ 0
#define KV_OP_WRITE 1
#define KV_OP_FSYNC 2
#define KV_OP_FDATASYNC 3

/* The most buffers one ring registers as fixed buffers. */
#define KV_MAX_FIXED_BUFFERS 16

/* The most buffers one READV/WRITEV entry carries (the kernel's UIO_MAXIOV); a vectored
   request with more goes in several entries, one after the other. */
#define KV_IOV_MAX 1024

/* A span of memory: a fixed buffer, or one piece of a vectored request. */
struct kv_span {
    char *base;
    uint64_t len;
};

struct kv_batch;

/* One item of a batch. The caller fills the inputs; kv_ring_run() fills the outputs. */
struct kv_req {
    /* inputs */
    int32_t fd;
    uint32_t op;        /* KV_OP_* */
    uint32_t align;     /* O_DIRECT block size, 0 when buffered (see kv_ring_run) */
    uint32_t nvec;      /* 0: the buffer is buf; else how many pieces this request takes
                           from kv_ring_run's vec arrays (see there) */
    uint64_t offset;
    char *buf;
    uint64_t len;
    /* outputs */
    int64_t result;     /* bytes transferred, or -errno */
    uint64_t done;      /* bytes transferred, also when result is an error */
    /* private to the ring: the request's own iovec copy, advanced past `done`, and the
       batch it belongs to */
    void *iov;
    uint32_t iov_left;
    struct kv_batch *batch;
};

/* A batch handed to kv_ring_push(): its requests run while the caller does other work and
   while later batches are pushed, until kv_ring_wait() returns for it. The caller fills
   reqs and n and keeps them (and every buffer they name) until then; the rest is the
   ring's. */
struct kv_batch {
    struct kv_req *reqs;
    size_t n;
    /* private to the ring */
    size_t next;              /* the first request not yet queued */
    size_t left;              /* requests not finished, plus fences not yet seen */
    struct kv_batch *later;   /* the next batch with requests to queue */
    void *iov;                /* the vectored requests' iovecs, freed when it is done */
};

/* Counters of one ring since it was created, for diagnostics and tests. */
struct kv_stats {
    uint64_t sqes;       /* submission entries queued */
    uint64_t fixed_sqes; /* of which used READ_FIXED / WRITE_FIXED */
    uint64_t resubmits;  /* short transfers completed by asking for the rest */
    uint64_t vec_sqes;   /* of all sqes, those that used READV / WRITEV */
    uint64_t fences;     /* NOPs linked after a sync, so it has let go of its file */
    uint64_t submits;    /* entries into the kernel that started a request: one each
                            (a sync's with its fence), see io_uring_core.c */
};

struct kv_ring;

/* 1 when the module was compiled against liburing, 0 when it is the POSIX-only build. */
int kv_built_with_uring(void);

/* 0 when this process may create an io_uring that supports every operation the engine
   uses, else -errno: -ENOSYS (no io_uring or a seccomp filter), -EPERM (sysctl, seccomp,
   LSM), -EOPNOTSUPP (an operation is missing: kernel older than 5.6), -ENOMEM. */
int kv_uring_probe(void);

/* Creates a ring that keeps up to `depth` requests in flight, run by the thread that
   calls into it: requests are submitted and completions taken only during its calls.
   0 or -errno. */
int kv_ring_create(unsigned depth, struct kv_ring **out);

/* Creates a ring served by a worker thread of its own, which submits each request and
   takes each completion as it comes, refilling the queue while the caller's thread does
   other work. Push, wait and run behave as on any ring (and may then be called from any
   thread); each hands over to the worker and back, which costs tens of microseconds on
   a virtual machine whose other CPU sleeps, so it suits batches kept in flight across
   calls (read streams), not one request waited for at once. 0 or -errno. */
int kv_ring_create_served(unsigned depth, struct kv_ring **out);

/* Destroys a ring; a served ring's worker first waits for what it started. */
void kv_ring_destroy(struct kv_ring *ring);

/* Replaces the ring's fixed buffers by `spans`. On failure (-ENOMEM when RLIMIT_MEMLOCK
   is too low, -EFAULT, -EINVAL) the previous set stays registered. 0 or -errno. */
int kv_ring_register_buffers(struct kv_ring *ring, const struct kv_span *spans, unsigned n);

/* Runs the batch and blocks until every request has finished (kv_ring_push and
   kv_ring_wait in one; batches pushed before it go first). Returns 0, or -errno
   when the ring itself failed (then requests still marked pending keep result INT64_MIN).

   Vectored requests (nvec > 0) take their pieces from vec_base/vec_len in batch order:
   the first vectored request the first nvec entries, the next the following ones, and
   so on; their len is set to the pieces' total. The pieces are moved back to back from
   the request's offset (READV/WRITEV). The arrays may be NULL when no request is
   vectored. If the iovecs cannot be allocated, the vectored requests fail with -ENOMEM
   and the others run. */
int kv_ring_run(struct kv_ring *ring, struct kv_req *reqs, size_t n,
                char *const *vec_base, const uint64_t *vec_len);

/* Starts `batch` (its vectored pieces as for kv_ring_run) and returns without waiting for
   it: as many of its requests as the queue has room for go to the kernel now, the rest as
   earlier requests complete, during any later kv_ring_push/kv_ring_wait/kv_ring_run on
   this ring. Batches start in the order they were pushed. 0, or -errno when the ring
   failed (then kv_ring_wait reports it too). Only the ring's thread may call it. */
int kv_ring_push(struct kv_ring *ring, struct kv_batch *batch,
                 char *const *vec_base, const uint64_t *vec_len);

/* Blocks until every request of `batch` (pushed on this ring) is finished, keeping the
   queue filled from every pushed batch meanwhile, and returns with as many requests of
   later batches in flight as the queue holds. 0, or -errno when the ring failed: then
   requests still pending keep result INT64_MIN. Call it once per pushed batch. */
int kv_ring_wait(struct kv_ring *ring, struct kv_batch *batch);

/* Requests of the ring in flight or queued to go in (on a ring its caller runs, as of
   its last call). */
unsigned kv_ring_pending(struct kv_ring *ring);

void kv_ring_stats(struct kv_ring *ring, struct kv_stats *out);
