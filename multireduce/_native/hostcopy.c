/*
 * multireduce's native copy engine: copy pageable host memory into pinned staging buffers and
 * queue each piece's upload to the GPU, on several threads, without Python.
 *
 * Why: the Python copy threads of multireduce.stream release the GIL around each copy and each
 * upload, but must take it back in between, so eight threads spend much of a 2 ms call waiting
 * for each other (bench/results/h200_8f15cce and earlier: threads start 50-110 us apart). Here
 * the whole job runs with the GIL released (ctypes releases it for the call), and the threads
 * take pieces from one atomic counter.
 *
 * The library knows nothing of CUDA's headers or libraries. The caller passes the upload
 * function (the driver's cuMemcpyHtoDAsync_v2, whose ABI is that of mr_upload_fn) and the
 * function and context that make the caller's CUDA context current on a worker thread
 * (cuCtxSetCurrent and the context). The CPU tests pass mr_test_upload instead, which copies
 * host to host, so that the engine itself is tested where there is no GPU.
 *
 * Built by multireduce/_hostcopy.py with the system C compiler (cc -O2 -shared -fPIC -pthread).
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

/* The most threads one call may ask for (_hostcopy.MAX_THREADS, which refuses more first). */
#define MR_MAX_THREADS 256

/* Errors of the engine itself (the upload function's own codes are positive CUresults). */
#define MR_ERR_ARGS (-2) /* bad arguments (-1, a worker that could not be started, is no error now) */

/* CUresult (*)(CUdeviceptr dst, const void *src, size_t bytes, CUstream stream) */
typedef int (*mr_upload_fn)(uint64_t dst, const void *src, size_t nbytes, void *stream);
/* CUresult (*)(CUcontext ctx) */
typedef int (*mr_setctx_fn)(void *ctx);

/* One piece: copy nbytes from src to staged (pinned), then upload staged to device. Matches
 * the NumPy structured dtype in _hostcopy.py: five 8-byte fields. */
typedef struct {
    uint64_t src;
    uint64_t staged;
    uint64_t device;
    uint64_t nbytes;
    uint64_t stream;
} mr_piece;

#define MR_FLAG_STREAMING_STORES 1u

typedef struct {
    const mr_piece *pieces;
    size_t npieces;
    unsigned flags;
    mr_upload_fn upload;
    mr_setctx_fn setctx;
    void *ctx;
    atomic_size_t next;     /* next piece to take */
    atomic_int stop;        /* set on the first error */
    atomic_int error;       /* the first error's code (0: none) */
    atomic_size_t failed;   /* the first error's piece */
    int helpers;            /* pool workers taking part */
    int finished;           /* of those, how many are done (under the pool's mutex) */
} mr_job;

/* ------------------------------------------------------------------------------------------ */

static void copy_piece(void *dst, const void *src, size_t n, unsigned flags) {
#if defined(__SSE2__)
    if ((flags & MR_FLAG_STREAMING_STORES) && n >= 4096) {
        /* Non-temporal stores: the pinned buffer is never read by this CPU, so skip the read
         * for ownership and keep the caches for the source. Head up to 16-byte alignment. */
        char *d = (char *)dst;
        const char *s = (const char *)src;
        size_t head = (16 - ((uintptr_t)d & 15)) & 15;
        memcpy(d, s, head);
        d += head;
        s += head;
        n -= head;
        size_t blocks = n / 64;
        for (size_t i = 0; i < blocks; ++i) {
            __m128i a = _mm_loadu_si128((const __m128i *)(s + 0));
            __m128i b = _mm_loadu_si128((const __m128i *)(s + 16));
            __m128i c = _mm_loadu_si128((const __m128i *)(s + 32));
            __m128i e = _mm_loadu_si128((const __m128i *)(s + 48));
            _mm_stream_si128((__m128i *)(d + 0), a);
            _mm_stream_si128((__m128i *)(d + 16), b);
            _mm_stream_si128((__m128i *)(d + 32), c);
            _mm_stream_si128((__m128i *)(d + 48), e);
            d += 64;
            s += 64;
        }
        memcpy(d, s, n - blocks * 64);
        _mm_sfence(); /* the stores are visible before the upload reads the buffer */
        return;
    }
#endif
    (void)flags;
    memcpy(dst, src, n);
}

static void run_job(mr_job *job, int set_context) {
    if (set_context && job->setctx != NULL) {
        int rc = job->setctx(job->ctx);
        if (rc != 0) {
            int none = 0;
            if (atomic_compare_exchange_strong(&job->error, &none, rc)) {
                atomic_store(&job->failed, (size_t)-1);
            }
            atomic_store(&job->stop, 1);
            return;
        }
    }
    while (!atomic_load_explicit(&job->stop, memory_order_relaxed)) {
        size_t i = atomic_fetch_add(&job->next, 1);
        if (i >= job->npieces) {
            return;
        }
        const mr_piece *p = &job->pieces[i];
        copy_piece((void *)(uintptr_t)p->staged, (const void *)(uintptr_t)p->src, (size_t)p->nbytes, job->flags);
        int rc = job->upload(p->device, (const void *)(uintptr_t)p->staged, (size_t)p->nbytes,
                             (void *)(uintptr_t)p->stream);
        if (rc != 0) {
            int none = 0;
            if (atomic_compare_exchange_strong(&job->error, &none, rc)) {
                atomic_store(&job->failed, i);
            }
            atomic_store(&job->stop, 1);
            return;
        }
    }
}

/* ------------------------------------------------------------------------------------------ */
/* The worker pool: threads started once and reused, one job at a time. */

static struct {
    pthread_mutex_t mutex;      /* guards everything below */
    pthread_cond_t start;       /* a new job (generation) */
    pthread_cond_t done;        /* a worker finished its part */
    pthread_mutex_t call;       /* held by the call using the pool */
    int nworkers;
    unsigned long generation;
    mr_job *job;
    unsigned long start_generation[MR_MAX_THREADS]; /* the generation each worker was made in */
} pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, PTHREAD_COND_INITIALIZER,
          PTHREAD_MUTEX_INITIALIZER, 0, 0, NULL, {0}};

/* A forked child has none of the parent's threads: it starts its own pool. */
static void pool_after_fork_in_child(void) {
    pthread_mutex_init(&pool.mutex, NULL);
    pthread_cond_init(&pool.start, NULL);
    pthread_cond_init(&pool.done, NULL);
    pthread_mutex_init(&pool.call, NULL);
    pool.nworkers = 0;
    pool.generation = 0;
    pool.job = NULL;
}

static pthread_once_t pool_once = PTHREAD_ONCE_INIT;

static void pool_register_fork_handler(void) { pthread_atfork(NULL, NULL, pool_after_fork_in_child); }

static void *worker_main(void *arg) {
    int index = (int)(intptr_t)arg;
    pthread_mutex_lock(&pool.mutex);
    /* The job of the generation it was made in is not its own: the next one is. */
    unsigned long seen = pool.start_generation[index];
    for (;;) {
        while (pool.generation == seen) {
            pthread_cond_wait(&pool.start, &pool.mutex);
        }
        seen = pool.generation;
        mr_job *job = pool.job; /* NULL if that job has ended already (this worker was not in it) */
        if (job == NULL || index >= job->helpers) {
            continue;
        }
        pthread_mutex_unlock(&pool.mutex);
        run_job(job, 1);
        pthread_mutex_lock(&pool.mutex);
        job->finished += 1;
        pthread_cond_signal(&pool.done);
    }
    return NULL;
}

/* Start workers until there are `want` (under pool.mutex). Returns how many exist. */
static int grow_pool(int want) {
    while (pool.nworkers < want) {
        pthread_t thread;
        pthread_attr_t attr;
        pool.start_generation[pool.nworkers] = pool.generation;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        int rc = pthread_create(&thread, &attr, worker_main, (void *)(intptr_t)pool.nworkers);
        pthread_attr_destroy(&attr);
        if (rc != 0) {
            break;
        }
        pool.nworkers += 1;
    }
    return pool.nworkers;
}

/* ------------------------------------------------------------------------------------------ */

/*
 * Copy and upload every piece, on `nthreads` threads (the calling thread and nthreads - 1
 * pool workers; fewer where the system cannot start more threads). Returns when every piece has been copied and its upload queued, or after
 * the first failure (the pieces not yet taken are then skipped). Returns 0, the upload or
 * context function's nonzero code, or a negative MR_ERR_* (MR_ERR_ARGS for nthreads outside
 * 1..MR_MAX_THREADS); *failed is the failing piece (SIZE_MAX for a failure to set the context).
 *
 * If another call is using the pool, this one copies on the calling thread alone rather than
 * wait for it.
 */
int mr_stage(const mr_piece *pieces, size_t npieces, int nthreads, unsigned flags, mr_upload_fn upload,
             mr_setctx_fn setctx, void *ctx, size_t *failed) {
    if (failed != NULL) {
        *failed = 0;
    }
    if (upload == NULL || (npieces > 0 && pieces == NULL) || nthreads < 1 || nthreads > MR_MAX_THREADS) {
        return MR_ERR_ARGS;
    }
    if ((size_t)nthreads > npieces) {
        nthreads = npieces > 0 ? (int)npieces : 1;
    }
    mr_job job;
    job.pieces = pieces;
    job.npieces = npieces;
    job.flags = flags;
    job.upload = upload;
    job.setctx = setctx;
    job.ctx = ctx;
    atomic_init(&job.next, 0);
    atomic_init(&job.stop, 0);
    atomic_init(&job.error, 0);
    atomic_init(&job.failed, 0);
    job.helpers = 0;
    job.finished = 0;

    pthread_once(&pool_once, pool_register_fork_handler);
    int pooled = nthreads > 1 && pthread_mutex_trylock(&pool.call) == 0;
    if (pooled) {
        pthread_mutex_lock(&pool.mutex);
        /* Under a thread or process limit fewer workers may exist than asked for: the job runs
           on those and the calling thread (failing the call would fail every later one too). */
        int have = grow_pool(nthreads - 1);
        job.helpers = have < nthreads - 1 ? have : nthreads - 1;
        pool.job = &job;
        pool.generation += 1;
        pthread_cond_broadcast(&pool.start);
        pthread_mutex_unlock(&pool.mutex);
    }
    run_job(&job, 0); /* the calling thread's context is current already */
    if (pooled) {
        pthread_mutex_lock(&pool.mutex);
        while (job.finished < job.helpers) {
            pthread_cond_wait(&pool.done, &pool.mutex);
        }
        pool.job = NULL;
        pthread_mutex_unlock(&pool.mutex);
        pthread_mutex_unlock(&pool.call);
    }
    int error = atomic_load(&job.error);
    if (error != 0 && failed != NULL) {
        *failed = atomic_load(&job.failed);
    }
    return error;
}

/* The most threads mr_stage takes (MR_MAX_THREADS). */
int mr_max_threads(void) { return MR_MAX_THREADS; }

/* The number of pool workers started so far (for tests and diagnostics). */
int mr_pool_workers(void) {
    pthread_mutex_lock(&pool.mutex);
    int n = pool.nworkers;
    pthread_mutex_unlock(&pool.mutex);
    return n;
}

/* ------------------------------------------------------------------------------------------ */
/* A host-to-host stand-in for the upload, for the CPU tests: `device` is a host address. It
 * fails with `code` on the call that makes the count of calls reach `fail_at` (0: never). */

static atomic_long test_calls;
static atomic_long test_fail_at;
static atomic_int test_code;

int mr_test_upload(uint64_t dst, const void *src, size_t nbytes, void *stream) {
    (void)stream;
    long call = atomic_fetch_add(&test_calls, 1) + 1;
    long fail_at = atomic_load(&test_fail_at);
    if (fail_at != 0 && call == fail_at) {
        return atomic_load(&test_code);
    }
    memcpy((void *)(uintptr_t)dst, src, nbytes);
    return 0;
}

int mr_test_setctx(void *ctx) {
    (void)ctx;
    return 0;
}

/* Reset the stand-in: count calls from zero, fail the `fail_at`-th with `code`. */
void mr_test_configure(long fail_at, int code) {
    atomic_store(&test_calls, 0);
    atomic_store(&test_fail_at, fail_at);
    atomic_store(&test_code, code);
}

long mr_test_calls(void) { return atomic_load(&test_calls); }
