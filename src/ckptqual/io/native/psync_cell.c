/* One cpu-only sweep cell read psync-style by `threads` POSIX threads, for ckptqual's POSIX engine (posix.py).

   The cell's rules, as the sweep's driver and posix.py's Python loop keep them: each job reads its offsets in
   order; a job's batch (`slots` reads) is all done, and checked, before any read of its next batch goes out; at
   most `threads` reads are in flight (each worker runs one pread at a time). Each worker takes the next read
   itself: the jobs in turn, one read each, as the Python loop's order (_Schedule) has it, except that a job held
   at a batch boundary is passed over, not waited for. The Python loop's worker instead waits, holding the read it
   took; here that made most of 16 workers on 2 cores sleep and wake at every batch boundary of every job (all
   jobs' boundaries fall together in that order), and 16-thread cells of 8K reads from tmpfs ran at 0.35 to 0.5
   of fio's psync (bench/read_sweep.py). A worker waits only where every job with reads left is held. Every read
   is timed (CLOCK_MONOTONIC, as Python's time.perf_counter_ns on Linux).

   Plain C and pthreads, no Python.h: posix.py calls ckptqual_psync_cell through ctypes (psync_kernel.py), which
   lets go of the GIL for the call. Only the optional batch callback (a ctypes callback, which takes the GIL) runs
   Python code. It is built into ckptqual's one native library (library.py). */

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

/* What stopped a cell (psync_result.stopped_by); 0: nothing, every read was done. */
enum { READ_FAILED = 1, SHORT_READ = 2, CHECK_FAILED = 3, STOP_ASKED = 4 };

/* Filled in for the caller; all int64 so that its ctypes mirror (psync_kernel.py) has no padding to get wrong. */
struct psync_result {
    int64_t started_ns, finished_ns; /* all workers ready; the last worker done */
    int64_t verified;                /* reads of the batches the callback checked */
    int64_t stopped_by;              /* the first problem, READ_FAILED ..., or 0 */
    int64_t job, offset, error, got; /* the read that stopped the cell: its errno, or the bytes it got */
};

/* Called once a batch of `job` (its reads [first, end)) is all done, before any read of its next batch goes out;
   nonzero stops the cell. */
typedef int (*batch_done_fn)(int32_t job, int64_t first, int64_t end);

/* One job's shared counters. What is written at every read sits on cache lines of its own (64 bytes), away from
   what every worker reads, so that the workers on different cores do not pull the lines back and forth. */
struct job {
    _Alignas(64) _Atomic int64_t next; /* its next read to hand out */
    _Atomic int64_t released;          /* its reads whose batches ended: the batch that starts there may go out */
    _Alignas(64) _Atomic int64_t done; /* its reads finished */
    _Atomic int64_t bytes;
};

struct cell {
    const int32_t *fds;
    const int64_t *offsets, *counts; /* offsets[job * stride + index]; reads per job */
    int64_t stride, block;
    int32_t jobs, slots, threads;
    char *buffers;               /* job j slot s at (j * slots + s) * block */
    int64_t *latencies, *issued; /* [job * stride + index], ns: each read's time and its start */
    struct job *job;             /* per job */
    const volatile int32_t *stop_asked; /* set by the caller to stop the cell (an interrupt) */
    batch_done_fn batch_done;
    struct psync_result *result;
    _Atomic int stopped;
    _Atomic int64_t turn; /* where each worker starts looking: worker n at job n, then the jobs in turn */
    _Alignas(64) _Atomic uint32_t progress; /* bumped when a batch ends or the cell stops */
    _Atomic uint32_t sleeping;              /* workers waiting for it to change (woken only if there are any) */
    _Atomic int64_t verified;               /* reads of the batches checked */
    pthread_mutex_t sleep_lock;             /* with `progressed`: where workers wait for `progress` */
    pthread_cond_t progressed;
    pthread_mutex_t lock; /* guards `ready`, `go`, the result's first problem and finish time */
    pthread_cond_t start;
    int32_t ready, go;
};

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* Something changed (a batch ended, the cell stopped): wakes the workers waiting in take(), if any; else no lock
   is taken. */
static void progressed(struct cell *c) {
    atomic_fetch_add(&c->progress, 1);
    if (atomic_load(&c->sleeping)) { /* read after the add: a worker that counts itself later sees the add */
        pthread_mutex_lock(&c->sleep_lock);
        pthread_cond_broadcast(&c->progressed);
        pthread_mutex_unlock(&c->sleep_lock);
    }
}

/* Stops the cell: no worker takes another read, and every sleeping worker wakes up to see it. The first problem
   is the one reported. */
static void stop(struct cell *c, int64_t why, int32_t job, int64_t offset, int64_t error, int64_t got) {
    pthread_mutex_lock(&c->lock);
    if (!c->result->stopped_by) {
        c->result->stopped_by = why;
        c->result->job = job;
        c->result->offset = offset;
        c->result->error = error;
        c->result->got = got;
        atomic_store(&c->stopped, 1);
        progressed(c);
    }
    pthread_mutex_unlock(&c->lock);
}

/* The next read (job * stride + index) that may go out, looking at the jobs in turn from job `turn`; -1 once no
   read is left to take or the cell stopped. Sleeps while every job with reads left waits for its last batch. */
static int64_t take(struct cell *c, int64_t turn) {
    for (;;) {
        if (c->stop_asked && *c->stop_asked)
            stop(c, STOP_ASKED, -1, -1, 0, 0);
        if (atomic_load(&c->stopped))
            return -1;
        uint32_t seen = atomic_load(&c->progress); /* before looking: what changes after it wakes us below */
        int left = 0;
        for (int32_t k = 0; k < c->jobs; k++) {
            int32_t j = (int32_t)((turn + k) % c->jobs);
            struct job *job = &c->job[j];
            int64_t index = atomic_load(&job->next);
            while (index < c->counts[j]) {
                left = 1;
                if (index - index % c->slots > atomic_load(&job->released))
                    break; /* its batch waits for the job's last one */
                if (atomic_compare_exchange_weak(&job->next, &index, index + 1))
                    return atomic_load(&c->stopped) ? -1 : (int64_t)j * c->stride + index;
            }
        }
        if (!left)
            return -1;
        pthread_mutex_lock(&c->sleep_lock);
        atomic_fetch_add(&c->sleeping, 1);
        while (atomic_load(&c->progress) == seen) /* else a batch ended meanwhile, maybe before we were counted */
            pthread_cond_wait(&c->progressed, &c->sleep_lock);
        atomic_fetch_sub(&c->sleeping, 1);
        pthread_mutex_unlock(&c->sleep_lock);
    }
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

/* Counts a read of job `j` done; where that ends its batch, has the batch checked, then lets its next batch go. */
static void finish(struct cell *c, int32_t j) {
    int64_t count = atomic_fetch_add(&c->job[j].done, 1) + 1;
    if (count % c->slots && count != c->counts[j])
        return;
    int64_t first = (count - 1) / c->slots * c->slots;
    if (c->batch_done) {
        if (c->batch_done(j, first, count)) {
            stop(c, CHECK_FAILED, j, c->offsets[j * c->stride + first], 0, 0);
            return;
        }
        atomic_fetch_add(&c->verified, count - first);
    }
    atomic_store(&c->job[j].released, count);
    progressed(c);
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

    int64_t read, turn = atomic_fetch_add(&c->turn, 1); /* this worker's own turn: no shared counter per read */
    while ((read = take(c, turn++)) >= 0) {
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
        atomic_fetch_add(&c->job[job].bytes, got);
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
    for (int32_t j = 0; j < jobs; j++)
        if (counts[j] < 0 || counts[j] > stride)
            return EINVAL;
    if (jobs < 1 || slots < 1 || threads < 1)
        return EINVAL;
    c.job = aligned_alloc(_Alignof(struct job), sizeof(struct job) * (size_t)jobs);
    pthread_t *workers = calloc((size_t)threads, sizeof(pthread_t));
    int error = 0;
    if (!c.job || !workers) {
        error = ENOMEM;
        goto out;
    }
    for (int32_t j = 0; j < jobs; j++)
        c.job[j] = (struct job){0};
    pthread_mutex_init(&c.lock, NULL);
    pthread_cond_init(&c.start, NULL);
    pthread_mutex_init(&c.sleep_lock, NULL);
    pthread_cond_init(&c.progressed, NULL);

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
    for (int32_t j = 0; j < jobs; j++)
        bytes_per_job[j] = atomic_load(&c.job[j].bytes);
    result->verified = atomic_load(&c.verified);
    pthread_cond_destroy(&c.start);
    pthread_mutex_destroy(&c.lock);
    pthread_cond_destroy(&c.progressed);
    pthread_mutex_destroy(&c.sleep_lock);
out:
    free(workers);
    free(c.job);
    return error;
}
