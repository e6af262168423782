/* One cpu-only sweep cell read psync-style by `threads` POSIX threads, for ckptqual's POSIX engine (posix.py).

   The same schedule as posix.py's Python loop (_Schedule): the reads go out in one fixed order, the jobs in turn,
   one read each (job 0 read 0, job 1 read 0, ..., job 0 read 1, ...); each worker takes the next read of that
   order (an atomic counter), reads it with pread into the job's buffer `index % slots`, and takes the next. A
   job's batch (`slots` reads) must all be done, and checked, before any read of its next batch goes out: a worker
   that takes such a read too early waits for it. With `threads` workers, at most `threads` reads are in flight.
   Every read is timed (CLOCK_MONOTONIC, as Python's time.perf_counter_ns on Linux).

   Plain C and pthreads, no Python.h: posix.py calls ckptqual_psync_cell through ctypes, which lets go of the GIL
   for the call. Only the optional batch callback (a ctypes callback, which takes the GIL) runs Python code.
   hatch_build.py builds it with -DCKPTQUAL_PSYNC_SOURCE=<sha256 of this file>, which psync_native.py compares
   with the file beside the library, so that a library built from another version of this file is never used. */

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#ifndef CKPTQUAL_PSYNC_SOURCE
#define CKPTQUAL_PSYNC_SOURCE "unknown"
#endif

/* What stopped a cell (psync_result.stopped_by); 0: nothing, every read was done. */
enum { READ_FAILED = 1, SHORT_READ = 2, CHECK_FAILED = 3, STOP_ASKED = 4 };

/* Filled in for the caller; all int64 so that its ctypes mirror (psync_native.py) has no padding to get wrong. */
struct psync_result {
    int64_t started_ns, finished_ns; /* all workers ready; the last worker done */
    int64_t verified;                /* reads of the batches the callback checked */
    int64_t stopped_by;              /* the first problem, READ_FAILED ..., or 0 */
    int64_t job, offset, error, got; /* the read that stopped the cell: its errno, or the bytes it got */
};

/* Called once a batch of `job` (its reads [first, end)) is all done, before any read of its next batch goes out;
   nonzero stops the cell. */
typedef int (*batch_done_fn)(int32_t job, int64_t first, int64_t end);

struct cell {
    const int32_t *fds;
    const int64_t *offsets, *counts; /* offsets[job * stride + index]; reads per job */
    int64_t stride, block, total;    /* total: the reads of all jobs */
    int32_t jobs, slots, threads;
    char *buffers; /* job j slot s at (j * slots + s) * block */
    int64_t *latencies, *issued;        /* [job * stride + index], ns: each read's time and its start */
    int64_t *order;                     /* the reads in order, each as job * stride + index */
    _Atomic int64_t next;               /* the next position in `order` to hand out */
    _Atomic int64_t *done, *bytes;      /* per job: reads finished, bytes read */
    _Atomic int64_t *released;          /* per job: reads of the batches that ended (the next batch may start) */
    _Atomic int stopped;
    const volatile int32_t *stop_asked; /* set by the caller to stop the cell (an interrupt) */
    batch_done_fn batch_done;
    pthread_mutex_t lock;               /* guards the waits below, `ready`, `go` and the result */
    pthread_cond_t start, *released_cv; /* the start; per job: a batch ended */
    int32_t ready, go;
    struct psync_result *result;
};

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* Stops the cell: no worker takes another read, and every waiting worker wakes up to see it. The first problem
   is the one reported. */
static void stop(struct cell *c, int64_t why, int32_t job, int64_t offset, int64_t error, int64_t got) {
    pthread_mutex_lock(&c->lock);
    if (!c->result->stopped_by) {
        c->result->stopped_by = why;
        c->result->job = job;
        c->result->offset = offset;
        c->result->error = error;
        c->result->got = got;
    }
    atomic_store(&c->stopped, 1);
    for (int32_t j = 0; j < c->jobs; j++)
        pthread_cond_broadcast(&c->released_cv[j]);
    pthread_mutex_unlock(&c->lock);
}

/* The next read (job * stride + index), after its batch may start; -1 once all are taken or the cell stopped. */
static int64_t take(struct cell *c) {
    if (c->stop_asked && *c->stop_asked)
        stop(c, STOP_ASKED, -1, -1, 0, 0);
    if (atomic_load(&c->stopped))
        return -1;
    int64_t position = atomic_fetch_add(&c->next, 1);
    if (position >= c->total)
        return -1;
    int64_t read = c->order[position];
    int32_t job = (int32_t)(read / c->stride);
    int64_t index = read % c->stride, first = index - index % c->slots;
    if (atomic_load(&c->released[job]) < first) { /* the job's previous batch is still being read */
        pthread_mutex_lock(&c->lock);
        while (atomic_load(&c->released[job]) < first && !atomic_load(&c->stopped))
            pthread_cond_wait(&c->released_cv[job], &c->lock);
        pthread_mutex_unlock(&c->lock);
    }
    return atomic_load(&c->stopped) ? -1 : read;
}

/* Reads the whole block, as posix.py's _pread_full: again after a short read, until EOF; again after EINTR.
   Returns the bytes read, or -errno. */
static int64_t pread_full(int fd, char *buffer, int64_t size, int64_t offset) {
    int64_t got = 0;
    while (got < size) {
        ssize_t count = pread(fd, buffer + got, (size_t)(size - got), (off_t)(offset + got));
        if (count < 0 && errno == EINTR)
            continue;
        if (count < 0)
            return -errno;
        if (count == 0)
            break;
        got += count;
    }
    return got;
}

/* Counts a read of `job` done; where that ends its batch, has the batch checked, then lets its next batch go. */
static void finish(struct cell *c, int32_t job) {
    int64_t count = atomic_fetch_add(&c->done[job], 1) + 1;
    if (count % c->slots && count != c->counts[job])
        return;
    int64_t first = (count - 1) / c->slots * c->slots;
    if (c->batch_done && c->batch_done(job, first, count)) {
        stop(c, CHECK_FAILED, job, c->offsets[job * c->stride + first], 0, 0);
        return;
    }
    pthread_mutex_lock(&c->lock);
    c->result->verified += c->batch_done ? count - first : 0;
    atomic_store(&c->released[job], count);
    pthread_cond_broadcast(&c->released_cv[job]);
    pthread_mutex_unlock(&c->lock);
}

static void *work(void *arg) {
    struct cell *c = arg;
    pthread_mutex_lock(&c->lock); /* the common start: the last worker ready notes the time and lets all go */
    if (++c->ready == c->threads) {
        c->result->started_ns = now_ns();
        c->go = 1;
        pthread_cond_broadcast(&c->start);
    }
    while (!c->go)
        pthread_cond_wait(&c->start, &c->lock);
    pthread_mutex_unlock(&c->lock);

    int64_t read;
    while ((read = take(c)) >= 0) {
        int32_t job = (int32_t)(read / c->stride);
        int64_t index = read % c->stride, offset = c->offsets[read];
        char *buffer = c->buffers + ((int64_t)job * c->slots + index % c->slots) * c->block;
        int64_t issued = now_ns();
        int64_t got = pread_full(c->fds[job], buffer, c->block, offset);
        if (got < 0) {
            stop(c, READ_FAILED, job, offset, -got, 0);
            break;
        }
        c->latencies[read] = now_ns() - issued;
        c->issued[read] = issued;
        atomic_fetch_add(&c->bytes[job], got);
        if (got != c->block) {
            stop(c, SHORT_READ, job, offset, 0, got);
            break;
        }
        finish(c, job);
    }
    int64_t finished = now_ns(); /* the cell ends when its last worker does */
    pthread_mutex_lock(&c->lock);
    if (finished > c->result->finished_ns)
        c->result->finished_ns = finished;
    pthread_mutex_unlock(&c->lock);
    return NULL;
}

const char *ckptqual_psync_source(void) { return CKPTQUAL_PSYNC_SOURCE; }

/* Reads one cell (see the top of this file). `offsets` is jobs x stride, job j's first counts[j] used; its reads'
   latencies and issue times go to `latencies` and `issued` (same shape), its bytes to bytes_per_job[j]. Returns 0
   once the cell ran, whether or not a read failed (see result->stopped_by), or an errno where it could not start
   its threads. `batch_done` may be NULL (no checks); `stop_asked` is polled before each read. */
int ckptqual_psync_cell(const int32_t *fds, const int64_t *offsets, const int64_t *counts, int32_t jobs,
                        int64_t stride, int32_t slots, int64_t block, void *buffers, int32_t threads,
                        int64_t *latencies, int64_t *issued, int64_t *bytes_per_job, batch_done_fn batch_done,
                        const volatile int32_t *stop_asked, struct psync_result *result) {
    struct cell c = {.fds = fds, .offsets = offsets, .counts = counts, .stride = stride, .block = block,
                     .jobs = jobs, .slots = slots, .threads = threads, .buffers = buffers, .latencies = latencies,
                     .issued = issued, .stop_asked = stop_asked, .batch_done = batch_done, .result = result};
    *result = (struct psync_result){0};
    int64_t most = 0;
    for (int32_t j = 0; j < jobs; j++) {
        c.total += counts[j];
        most = counts[j] > most ? counts[j] : most;
    }
    if (jobs < 1 || slots < 1 || threads < 1 || most > stride)
        return EINVAL;
    c.order = malloc(sizeof(int64_t) * (size_t)(c.total ? c.total : 1));
    c.done = calloc((size_t)jobs, sizeof(_Atomic int64_t));
    c.bytes = calloc((size_t)jobs, sizeof(_Atomic int64_t));
    c.released = calloc((size_t)jobs, sizeof(_Atomic int64_t));
    c.released_cv = calloc((size_t)jobs, sizeof(pthread_cond_t));
    pthread_t *workers = calloc((size_t)threads, sizeof(pthread_t));
    int error = 0;
    if (!c.order || !c.done || !c.bytes || !c.released || !c.released_cv || !workers) {
        error = ENOMEM;
        goto out;
    }
    int64_t position = 0;
    for (int64_t index = 0; index < most; index++)
        for (int32_t j = 0; j < jobs; j++)
            if (index < counts[j])
                c.order[position++] = (int64_t)j * stride + index;
    pthread_mutex_init(&c.lock, NULL);
    pthread_cond_init(&c.start, NULL);
    for (int32_t j = 0; j < jobs; j++)
        pthread_cond_init(&c.released_cv[j], NULL);

    /* The workers start with every signal blocked, so that the kernel hands a signal (Ctrl-C) to a thread of the
       caller's, whose handler can stop the cell (stop_asked), never to a worker in the middle of a read. */
    sigset_t all, before;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &before);
    int32_t started = 0;
    for (; started < threads; started++) {
        if ((error = pthread_create(&workers[started], NULL, work, &c)))
            break;
    }
    pthread_sigmask(SIG_SETMASK, &before, NULL);
    if (error) { /* the workers that did start must not wait for the others: stop them at the start */
        atomic_store(&c.stopped, 1);
        pthread_mutex_lock(&c.lock);
        c.go = 1;
        pthread_cond_broadcast(&c.start);
        pthread_mutex_unlock(&c.lock);
    }
    for (int32_t n = 0; n < started; n++)
        pthread_join(workers[n], NULL);
    for (int32_t j = 0; j < jobs; j++) {
        bytes_per_job[j] = atomic_load(&c.bytes[j]);
        pthread_cond_destroy(&c.released_cv[j]);
    }
    pthread_cond_destroy(&c.start);
    pthread_mutex_destroy(&c.lock);
out:
    free(workers);
    free(c.released_cv);
    free(c.released);
    free(c.bytes);
    free(c.done);
    free(c.order);
    return error;
}
