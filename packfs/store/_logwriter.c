/* The volume log's writer thread, in C: it never takes the GIL (see logwriter.py).
 *
 * Python submits batches of operations on the event loop; a POSIX thread takes every
 * batch queued so far, executes them in order (contiguous writes to one file as one
 * pwritev), flushes what they wrote if any of them asked for durability, queues one
 * result per batch and signals an eventfd the event loop waits on. The buffers stay
 * referenced (Py_buffer) until Python collects the results.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define MAX_FDS 16 /* distinct files one take flushes at its end; more are flushed in between */

typedef struct {
    int fd;
    long long offset; /* -1: fdatasync(fd) here, in order */
    Py_buffer buf;
} Op;

typedef struct Batch {
    struct Batch *next;
    long long tag;
    int sync_fd; /* >= 0: flush this file and every file written, at the end of the take */
    Py_ssize_t nops;
    Op *ops;
    int err;
    long long write_ns, flush_ns, writes, flushes;
} Batch;

typedef struct {
    PyObject_HEAD
    pthread_mutex_t lock;
    pthread_cond_t wake;
    pthread_t thread;
    int started, stopping, efd, failed;
    Batch *queued, **queued_tail; /* submitted, not taken */
    Batch *done, **done_tail;     /* executed, not collected */
    long long in_hand;            /* batches submitted and not yet collected */
} Writer;

static long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int write_all(int fd, struct iovec *iov, int n, long long off) {
    while (n > 0) {
        ssize_t w = pwritev(fd, iov, n, off);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return errno ? errno : EIO;
        }
        off += w;
        while (n > 0 && (size_t)w >= iov->iov_len) {
            w -= iov->iov_len;
            iov++;
            n--;
        }
        if (n > 0) {
            iov->iov_base = (char *)iov->iov_base + w;
            iov->iov_len -= w;
        }
    }
    return 0;
}

static int flush(int fd, Batch *acct) {
    long long t0 = now_ns();
    int r = fdatasync(fd);
    acct->flush_ns += now_ns() - t0;
    acct->flushes++;
    return r < 0 ? (errno ? errno : EIO) : 0;
}

/* Execute a chain of batches as one take; the first error stops it and is kept in every
 * batch of the chain. Timings and counts are charged to the last batch. Runs without
 * the GIL. */
static int execute(Batch *first, int err) {
    struct iovec iov[IOV_MAX];
    int niov = 0, run_fd = -1, nfds = 0, sync = 0, fds[MAX_FDS];
    long long run_off = 0, run_end = 0;
    Batch *b, *last = first;
    for (b = first; b; b = b->next)
        last = b;

#define WRITE_RUN()                                                   \
    do {                                                              \
        if (niov && !err) {                                           \
            long long t0 = now_ns();                                  \
            err = write_all(run_fd, iov, niov, run_off);              \
            last->write_ns += now_ns() - t0;                          \
            last->writes++;                                           \
        }                                                             \
        niov = 0;                                                     \
    } while (0)

    for (b = first; b && !err; b = b->next) {
        if (b->sync_fd >= 0) {
            sync = 1;
            int seen = 0;
            for (int i = 0; i < nfds; i++)
                seen |= fds[i] == b->sync_fd;
            if (!seen && nfds < MAX_FDS)
                fds[nfds++] = b->sync_fd;
        }
        for (Py_ssize_t i = 0; i < b->nops && !err; i++) {
            Op *op = &b->ops[i];
            if (op->offset < 0) {
                WRITE_RUN();
                if (!err)
                    err = flush(op->fd, last);
                continue;
            }
            if (niov && (op->fd != run_fd || op->offset != run_end || niov == IOV_MAX))
                WRITE_RUN();
            if (!niov) {
                run_fd = op->fd;
                run_off = run_end = op->offset;
                int seen = 0;
                for (int k = 0; k < nfds; k++)
                    seen |= fds[k] == op->fd;
                if (!seen) {
                    if (nfds == MAX_FDS) { /* flush one now to make room: never skip a flush */
                        if ((err = flush(fds[0], last)))
                            break;
                        memmove(fds, fds + 1, sizeof(int) * (MAX_FDS - 1));
                        nfds--;
                    }
                    fds[nfds++] = op->fd;
                }
            }
            iov[niov].iov_base = op->buf.buf;
            iov[niov].iov_len = op->buf.len;
            niov++;
            run_end += op->buf.len;
        }
    }
    WRITE_RUN();
    if (sync)
        for (int i = 0; i < nfds && !err; i++)
            err = flush(fds[i], last);
#undef WRITE_RUN
    for (b = first; b; b = b->next)
        b->err = err;
    return err;
}

static void *run(void *arg) {
    Writer *w = arg;
    pthread_mutex_lock(&w->lock);
    for (;;) {
        while (!w->queued && !w->stopping)
            pthread_cond_wait(&w->wake, &w->lock);
        if (w->stopping)
            break;
        Batch *take = w->queued;
        w->queued = NULL;
        w->queued_tail = &w->queued;
        int failed = w->failed;
        pthread_mutex_unlock(&w->lock);
        failed = execute(take, failed);
        pthread_mutex_lock(&w->lock);
        w->failed = failed;
        *w->done_tail = take;
        while (take->next)
            take = take->next;
        w->done_tail = &take->next;
        uint64_t one = 1;
        if (write(w->efd, &one, sizeof one) < 0) {
            /* the counter cannot overflow here; nothing to do */
        }
    }
    pthread_mutex_unlock(&w->lock);
    return NULL;
}

static void free_batch(Batch *b) {
    for (Py_ssize_t i = 0; i < b->nops; i++)
        if (b->ops[i].offset >= 0)
            PyBuffer_Release(&b->ops[i].buf);
    PyMem_Free(b->ops);
    PyMem_Free(b);
}

static void free_chain(Batch *b) {
    while (b) {
        Batch *next = b->next;
        free_batch(b);
        b = next;
    }
}

/* A batch of ops, a list of (fd, offset, data) writes and (fd, -1, None) flushes, with
 * the buffers of its writes held; NULL with an exception set if ops are malformed. */
static Batch *new_batch(PyObject *ops, int sync_fd) {
    Py_ssize_t n = PyList_GET_SIZE(ops);
    Batch *b = PyMem_Calloc(1, sizeof *b);
    if (!b || !(b->ops = PyMem_Calloc(n ? n : 1, sizeof(Op)))) {
        PyMem_Free(b);
        PyErr_NoMemory();
        return NULL;
    }
    b->sync_fd = sync_fd;
    for (Py_ssize_t i = 0; i < n; i++) {
        Op *op = &b->ops[i];
        PyObject *data;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(ops, i), "iLO", &op->fd, &op->offset, &data) ||
            (op->offset >= 0 && PyObject_GetBuffer(data, &op->buf, PyBUF_SIMPLE) < 0)) {
            free_batch(b); /* releases the buffers of the first b->nops ops, those it holds */
            return NULL;
        }
        b->nops = i + 1;
    }
    return b;
}

static int Writer_init(Writer *w, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "", kwlist))
        return -1;
    if (w->started) {
        PyErr_SetString(PyExc_RuntimeError, "already started");
        return -1;
    }
    w->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (w->efd < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    pthread_mutex_init(&w->lock, NULL);
    pthread_cond_init(&w->wake, NULL);
    w->queued_tail = &w->queued;
    w->done_tail = &w->done;
    int r = pthread_create(&w->thread, NULL, run, w);
    if (r) {
        close(w->efd);
        w->efd = -1;
        errno = r;
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    w->started = 1;
    return 0;
}

/* submit(tag, ops, sync_fd): ops is a list of (fd, offset, data) writes and (fd, -1,
 * None) flushes, executed in order after everything submitted before. */
static PyObject *Writer_submit(Writer *w, PyObject *args) {
    long long tag;
    PyObject *ops;
    int sync_fd;
    if (!PyArg_ParseTuple(args, "LO!i", &tag, &PyList_Type, &ops, &sync_fd))
        return NULL;
    if (!w->started || w->stopping) {
        PyErr_SetString(PyExc_RuntimeError, "the writer is stopped");
        return NULL;
    }
    Batch *b = new_batch(ops, sync_fd);
    if (!b)
        return NULL;
    b->tag = tag;
    pthread_mutex_lock(&w->lock);
    *w->queued_tail = b;
    w->queued_tail = &b->next;
    w->in_hand++;
    pthread_mutex_unlock(&w->lock);
    pthread_cond_signal(&w->wake); /* after the unlock: the woken thread does not block on the lock we hold */
    Py_RETURN_NONE;
}

/* done(): [(tag, errno, write_ns, flush_ns, writes, flushes)] for the batches executed
 * since the last call, in order; their buffers are released. Out of memory, it raises
 * (the results are lost: the caller cannot go on without them). */
static PyObject *Writer_done(Writer *w, PyObject *Py_UNUSED(ignored)) {
    uint64_t count;
    if (read(w->efd, &count, sizeof count) < 0 && errno != EAGAIN)
        return PyErr_SetFromErrno(PyExc_OSError);
    PyObject *out = PyList_New(0);
    if (!out)
        return NULL; /* nothing taken: the next call returns them */
    pthread_mutex_lock(&w->lock);
    Batch *b = w->done;
    w->done = NULL;
    w->done_tail = &w->done;
    pthread_mutex_unlock(&w->lock);
    long long taken = 0;
    for (Batch *next; b; b = next, taken++) {
        next = b->next;
        PyObject *t = out ? Py_BuildValue("(LiLLLL)", b->tag, b->err, b->write_ns, b->flush_ns, b->writes,
                                          b->flushes)
                          : NULL;
        if (!t || PyList_Append(out, t) < 0)
            Py_CLEAR(out);
        Py_XDECREF(t);
        free_batch(b);
    }
    pthread_mutex_lock(&w->lock);
    w->in_hand -= taken;
    pthread_mutex_unlock(&w->lock);
    return out;
}

/* run_now(ops, sync_fd): execute ops in the calling thread (GIL released), if nothing
 * is in hand; returns (errno, write_ns, flush_ns, writes, flushes), or None when the
 * thread has batches in hand (submit instead). */
static PyObject *Writer_run_now(Writer *w, PyObject *args) {
    PyObject *ops;
    int sync_fd;
    if (!PyArg_ParseTuple(args, "O!i", &PyList_Type, &ops, &sync_fd))
        return NULL;
    pthread_mutex_lock(&w->lock);
    int busy = w->in_hand > 0 || w->stopping, failed = w->failed;
    pthread_mutex_unlock(&w->lock);
    if (busy)
        Py_RETURN_NONE;
    Batch *b = new_batch(ops, sync_fd);
    if (!b)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    failed = execute(b, failed);
    Py_END_ALLOW_THREADS
    pthread_mutex_lock(&w->lock);
    w->failed = failed;
    pthread_mutex_unlock(&w->lock);
    PyObject *result = Py_BuildValue("(iLLLL)", b->err, b->write_ns, b->flush_ns, b->writes, b->flushes);
    free_batch(b);
    return result;
}

static PyObject *Writer_fileno(Writer *w, PyObject *Py_UNUSED(ignored)) {
    return PyLong_FromLong(w->efd);
}

static void stop(Writer *w) {
    if (!w->started)
        return;
    pthread_mutex_lock(&w->lock);
    w->stopping = 1;
    pthread_cond_signal(&w->wake);
    pthread_mutex_unlock(&w->lock);
    Py_BEGIN_ALLOW_THREADS
    pthread_join(w->thread, NULL);
    Py_END_ALLOW_THREADS
    w->started = 0;
}

/* close(): wait for the take in hand and stop the thread. Batches it did not take are
 * dropped, unwritten; done() still returns those it executed. */
static PyObject *Writer_close(Writer *w, PyObject *Py_UNUSED(ignored)) {
    stop(w);
    for (Batch *b = w->queued; b; b = b->next)
        w->in_hand--;
    free_chain(w->queued);
    w->queued = NULL;
    w->queued_tail = &w->queued;
    Py_RETURN_NONE;
}

static void Writer_dealloc(Writer *w) {
    stop(w);
    free_chain(w->queued);
    free_chain(w->done);
    if (w->efd >= 0)
        close(w->efd);
    if (w->queued_tail) { /* set by init once the mutex and condition exist */
        pthread_mutex_destroy(&w->lock);
        pthread_cond_destroy(&w->wake);
    }
    Py_TYPE(w)->tp_free((PyObject *)w);
}

static PyObject *Writer_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    Writer *w = (Writer *)type->tp_alloc(type, 0);
    if (w)
        w->efd = -1;
    return (PyObject *)w;
}

static PyMethodDef Writer_methods[] = {
    {"submit", (PyCFunction)Writer_submit, METH_VARARGS, "Queue a batch: submit(tag, ops, sync_fd)."},
    {"done", (PyCFunction)Writer_done, METH_NOARGS, "Results of the batches executed since the last call."},
    {"run_now", (PyCFunction)Writer_run_now, METH_VARARGS, "Execute ops in this thread if nothing is in hand."},
    {"fileno", (PyCFunction)Writer_fileno, METH_NOARGS, "The eventfd signalled after each take."},
    {"close", (PyCFunction)Writer_close, METH_NOARGS, "Finish the take in hand and stop."},
    {NULL},
};

static PyTypeObject WriterType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "packfs.store._logwriter.Writer",
    .tp_basicsize = sizeof(Writer),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = Writer_new,
    .tp_init = (initproc)Writer_init,
    .tp_dealloc = (destructor)Writer_dealloc,
    .tp_methods = Writer_methods,
    .tp_doc = "A thread that writes and flushes the volume log without the GIL.",
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "packfs.store._logwriter", NULL, -1, NULL};

PyMODINIT_FUNC PyInit__logwriter(void) {
    if (PyType_Ready(&WriterType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m && PyModule_AddObjectRef(m, "Writer", (PyObject *)&WriterType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
