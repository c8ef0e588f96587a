/* The no-op check's stat comparison loop in C: the optional accelerator of noop._compare.
 *
 * A cold no-op build is one stat per source and output (docs/benchmarks.md).  In Python,
 * os.stat spends more time building its stat_result (three times per call: a float, an
 * int of seconds and an int of nanoseconds) than in the system call; this loop makes the
 * same calls and compares the same four fields without building any object.  It must
 * answer exactly as noop._compare_py does (tests/test_statcmp.py checks both on the same
 * files); where it is not built (no C compiler at install time), noop._compare_py runs.
 *
 * changed(fd, paths, a, b, lo, sizes, mtimes, inos, ctimes, missing, threads=1) -> list[int]
 *   The positions k, a <= k < b, of ``paths`` (a list of str, relative to the open
 *   directory ``fd`` or absolute) whose file's stat (following links, as os.stat) differs
 *   from row lo + k of the four int64 columns: size, mtime in ns, inode, ctime in ns.  A
 *   file that cannot be stat'ed differs unless its size column is ``missing``.  The paths
 *   are encoded first; then, without the GIL, ``threads`` threads (this one included,
 *   at most MAX_THREADS) take CHUNK positions at a time until none are left.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>

#define NS_PER_S 1000000000LL

/* A timestamp in nanoseconds, as os.stat's st_*_ns; 0 if it does not fit in int64 (then
 * it cannot equal a stored value either: the snapshot stores int64). */
static int to_ns(const struct timespec *ts, int64_t *out) {
    int64_t s;
    return !__builtin_mul_overflow((int64_t)ts->tv_sec, NS_PER_S, &s) && !__builtin_add_overflow(s, ts->tv_nsec, out);
}

/* One call: the stored columns and the paths, read by its threads, and the next position
 * not yet taken.  Threads take CHUNK positions at a time, so one that runs late (its CPU
 * busy with another process) leaves the rest to the others. */
struct rows {
    int fd;
    const char **paths; /* NULL: a path no file can have (a NUL inside it) */
    const char *cols[4];
    Py_ssize_t lo; /* row of position 0 */
    Py_ssize_t n;
    long long missing;
    Py_ssize_t next; /* atomic */
    unsigned char *differs; /* out, one byte per position */
};

#define CHUNK 256 /* ~0.35 ms of stats */

/* Row ``i`` of a column.  The snapshot's columns start wherever its body ends, so they are
 * not 8-byte aligned: read through memcpy (one plain load where the CPU allows it). */
static inline int64_t at(const char *col, Py_ssize_t i) {
    int64_t v;
    memcpy(&v, col + i * 8, 8);
    return v;
}

/* Whether position ``k``'s file differs from its stored row.  Touches no Python object. */
static int differs(const struct rows *r, Py_ssize_t k) {
    Py_ssize_t i = r->lo + k;
    int64_t size = at(r->cols[0], i);
    struct stat st;
    if (r->paths[k] == NULL || fstatat(r->fd, r->paths[k], &st, 0) != 0)
        return size != r->missing;
    int64_t m, c;
    if (!to_ns(&st.st_mtim, &m) || !to_ns(&st.st_ctim, &c))
        return 1;
    return size != (int64_t)st.st_size || at(r->cols[1], i) != m || (uint64_t)at(r->cols[2], i) != (uint64_t)st.st_ino ||
           at(r->cols[3], i) != c;
}

static void *run(void *arg) {
    struct rows *r = arg;
    for (;;) {
        Py_ssize_t a = __atomic_fetch_add(&r->next, CHUNK, __ATOMIC_RELAXED);
        if (a >= r->n)
            return NULL;
        Py_ssize_t b = a + CHUNK < r->n ? a + CHUNK : r->n;
        for (Py_ssize_t k = a; k < b; k++)
            r->differs[k] = (unsigned char)differs(r, k);
    }
}

/* Start a thread on ``r``, on another CPU than the caller's where the C library lets us say
 * so (glibc: musl has no affinity in thread attributes): a new thread is queued on its
 * creator's CPU, and with the other core idle the two would share one until a
 * load-balancing tick (~4 ms on the 2-core VMs measured). */
static int start(pthread_t *t, struct rows *r) {
#if defined(__linux__) && defined(__GLIBC__)
    cpu_set_t allowed;
    int cpu = sched_getcpu();
    if (cpu >= 0 && cpu < CPU_SETSIZE && sched_getaffinity(0, sizeof allowed, &allowed) == 0 &&
        CPU_ISSET(cpu, &allowed) && CPU_COUNT(&allowed) > 1) {
        CPU_CLR(cpu, &allowed);
        pthread_attr_t attr;
        if (pthread_attr_init(&attr) == 0) {
            int ok = pthread_attr_setaffinity_np(&attr, sizeof allowed, &allowed) == 0 &&
                     pthread_create(t, &attr, run, r) == 0;
            pthread_attr_destroy(&attr);
            if (ok)
                return 0;
        }
    }
#endif
    return pthread_create(t, NULL, run, r);
}

#define MAX_THREADS 16

/* Stat every position of ``r`` on up to ``threads`` threads (this one included), without
 * the GIL.  Threads that cannot be started leave their part to the others. */
static void stat_all(struct rows *r, int threads) {
    pthread_t ids[MAX_THREADS];
    int started = 0;
    while (started < threads - 1 && start(&ids[started], r) == 0)
        started++;
    run(r);
    for (int t = 0; t < started; t++)
        pthread_join(ids[t], NULL);
}

/* The buffer of an int64 column, or -1 with an exception set. */
static int column(PyObject *obj, Py_buffer *view, Py_ssize_t need) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return -1;
    const char *f = view->format ? view->format : "B";
    if (view->itemsize != 8 || strcmp(f, "q") != 0 || view->len / 8 < need) {
        PyBuffer_Release(view);
        PyErr_SetString(PyExc_ValueError, "a column must be a contiguous int64 ('q') buffer covering the rows");
        return -1;
    }
    return 0;
}

/* The file system bytes of every path of ``items`` (a list no one else holds), into
 * ``r->paths``; ``held`` keeps the encoded ones alive.  -1 with an exception set. */
static int encode(PyObject *items, struct rows *r, PyObject *held) {
    Py_ssize_t n = PyList_GET_SIZE(items);
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *p = PyList_GET_ITEM(items, k);
        const char *s;
        Py_ssize_t len;
        if (!PyUnicode_Check(p)) {
            PyErr_SetString(PyExc_TypeError, "paths must be str");
            return -1;
        }
        if (PyUnicode_IS_ASCII(p)) { /* ASCII is the same bytes in every file system encoding */
            s = (const char *)PyUnicode_DATA(p);
            len = PyUnicode_GET_LENGTH(p);
        } else { /* as os.stat encodes it (surrogateescape included) */
            PyObject *encoded = PyUnicode_EncodeFSDefault(p);
            if (encoded == NULL || PyList_Append(held, encoded) < 0) {
                Py_XDECREF(encoded);
                return -1;
            }
            Py_DECREF(encoded);
            s = PyBytes_AS_STRING(encoded);
            len = PyBytes_GET_SIZE(encoded);
        }
        /* A NUL inside the path (os.stat raises ValueError): no file has that name, so it
         * is a file that cannot be stat'ed. */
        r->paths[k] = (Py_ssize_t)strlen(s) == len ? s : NULL;
    }
    return 0;
}

static PyObject *changed(PyObject *Py_UNUSED(self), PyObject *args) {
    int fd, threads = 1;
    PyObject *paths, *objs[4];
    Py_ssize_t a, b, lo;
    long long missing;
    if (!PyArg_ParseTuple(args, "iO!nnnOOOOL|i:changed", &fd, &PyList_Type, &paths, &a, &b, &lo, &objs[0], &objs[1],
                          &objs[2], &objs[3], &missing, &threads))
        return NULL;
    if (a < 0 || b < a || b > PyList_GET_SIZE(paths) || lo < 0 || lo > PY_SSIZE_T_MAX - b) {
        PyErr_SetString(PyExc_ValueError, "positions out of range");
        return NULL;
    }
    Py_ssize_t n = b - a;
    threads = threads < 1 ? 1 : threads > MAX_THREADS ? MAX_THREADS : threads;
    if (threads > 1 + n / CHUNK) /* (more would find nothing left to take) */
        threads = (int)(1 + n / CHUNK);
    Py_buffer col[4];
    int got = 0;
    PyObject *out = NULL, *items = NULL, *held = NULL;
    struct rows r = {.fd = fd, .lo = lo + a, .n = n, .missing = missing, .next = 0, .paths = NULL, .differs = NULL};
    for (; got < 4; got++) {
        if (column(objs[got], &col[got], lo + b) < 0)
            goto done;
        r.cols[got] = col[got].buf;
    }
    items = PyList_GetSlice(paths, a, b); /* a list of our own: ``paths`` may change while the GIL is released */
    held = PyList_New(0);
    if (items == NULL || held == NULL)
        goto done;
    r.paths = PyMem_Calloc(n ? n : 1, sizeof *r.paths);
    r.differs = PyMem_Calloc(n ? n : 1, 1);
    if (r.paths == NULL || r.differs == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (encode(items, &r, held) < 0)
        goto done;
    Py_BEGIN_ALLOW_THREADS
    stat_all(&r, threads);
    Py_END_ALLOW_THREADS
    out = PyList_New(0);
    for (Py_ssize_t k = 0; out != NULL && k < n; k++) {
        if (!r.differs[k])
            continue;
        PyObject *v = PyLong_FromSsize_t(a + k);
        if (v == NULL || PyList_Append(out, v) < 0)
            Py_CLEAR(out);
        Py_XDECREF(v);
    }
done:
    PyMem_Free(r.paths);
    PyMem_Free(r.differs);
    Py_XDECREF(items);
    Py_XDECREF(held);
    for (int c = 0; c < got; c++)
        PyBuffer_Release(&col[c]);
    return out;
}

static PyMethodDef methods[] = {
    {"changed", changed, METH_VARARGS, "The positions whose file's stat differs from the stored columns."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "buildtool._statcmp",
    .m_doc = "The no-op check's stat comparison loop in C.",
    .m_size = -1,
    .m_methods = methods,
};

/* API: the version of ``changed``'s arguments, which noop._accelerator checks: an editable
 * install keeps a module compiled before an edit of this file (2: ``threads``). */
PyMODINIT_FUNC PyInit__statcmp(void) {
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddIntConstant(m, "API", 2) < 0)
        Py_CLEAR(m);
    return m;
}
