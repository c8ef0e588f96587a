/* The no-op check's stat comparison loop in C: the optional accelerator of noop._compare.
 *
 * A cold no-op build is one stat per source and output (docs/benchmarks.md).  In Python,
 * os.stat spends more time building its stat_result (three times per call: a float, an
 * int of seconds and an int of nanoseconds) than in the system call; this loop makes the
 * same calls and compares the same four fields without building any object.  It must
 * answer exactly as noop._compare does (tests/test_statcmp.py checks both on the same
 * files); where it is not built (no C compiler at install time), noop._compare runs.
 *
 * changed(fd, paths, a, b, lo, sizes, mtimes, inos, ctimes, missing) -> list[int]
 *   The positions k, a <= k < b, of ``paths`` (a list of str, relative to the open
 *   directory ``fd`` or absolute) whose file's stat (following links, as os.stat) differs
 *   from row lo + k of the four int64 columns: size, mtime in ns, inode, ctime in ns.  A
 *   file that cannot be stat'ed differs unless its size column is ``missing``.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <fcntl.h>
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

/* Row ``i`` of a column.  The snapshot's columns start wherever its body ends, so they are
 * not 8-byte aligned: read through memcpy (one plain load where the CPU allows it). */
static inline int64_t at(const Py_buffer *col, Py_ssize_t i) {
    int64_t v;
    memcpy(&v, (const char *)col->buf + i * 8, 8);
    return v;
}

/* Whether the file at ``path`` differs from the stored row. */
static int differs(int fd, const char *path, int64_t size, int64_t mtime, int64_t ino, int64_t ctime,
                   long long missing) {
    struct stat st;
    int r;
    Py_BEGIN_ALLOW_THREADS
    r = fstatat(fd, path, &st, 0);
    Py_END_ALLOW_THREADS
    if (r != 0)
        return size != missing;
    int64_t m, c;
    if (!to_ns(&st.st_mtim, &m) || !to_ns(&st.st_ctim, &c))
        return 1;
    return size != (int64_t)st.st_size || mtime != m || (uint64_t)ino != (uint64_t)st.st_ino || ctime != c;
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

static PyObject *changed(PyObject *Py_UNUSED(self), PyObject *args) {
    int fd;
    PyObject *paths, *objs[4];
    Py_ssize_t a, b, lo;
    long long missing;
    if (!PyArg_ParseTuple(args, "iO!nnnOOOOL:changed", &fd, &PyList_Type, &paths, &a, &b, &lo, &objs[0], &objs[1],
                          &objs[2], &objs[3], &missing))
        return NULL;
    if (a < 0 || b < a || b > PyList_GET_SIZE(paths) || lo < 0 || lo > PY_SSIZE_T_MAX - b) {
        PyErr_SetString(PyExc_ValueError, "positions out of range");
        return NULL;
    }
    Py_buffer col[4];
    int got = 0;
    PyObject *out = NULL;
    for (; got < 4; got++) {
        if (column(objs[got], &col[got], lo + b) < 0)
            goto done;
    }
    out = PyList_New(0);
    if (out == NULL)
        goto done;
    for (Py_ssize_t k = a; k < b; k++) {
        if (k >= PyList_GET_SIZE(paths)) { /* another thread shortened it while a stat ran */
            PyErr_SetString(PyExc_RuntimeError, "the list of paths changed during the check");
            Py_CLEAR(out);
            goto done;
        }
        PyObject *p = PyList_GET_ITEM(paths, k);
        PyObject *encoded = NULL;
        const char *s;
        Py_ssize_t n;
        if (!PyUnicode_Check(p)) {
            PyErr_SetString(PyExc_TypeError, "paths must be str");
            Py_CLEAR(out);
            goto done;
        }
        Py_INCREF(p); /* ``s`` may point into it while the GIL is released */
        if (PyUnicode_IS_ASCII(p)) { /* ASCII is the same bytes in every file system encoding */
            s = (const char *)PyUnicode_DATA(p);
            n = PyUnicode_GET_LENGTH(p);
        } else { /* as os.stat encodes it (surrogateescape included) */
            encoded = PyUnicode_EncodeFSDefault(p);
            if (encoded == NULL) {
                Py_DECREF(p);
                Py_CLEAR(out);
                goto done;
            }
            s = PyBytes_AS_STRING(encoded);
            n = PyBytes_GET_SIZE(encoded);
        }
        Py_ssize_t i = lo + k;
        /* A NUL inside the path (os.stat raises ValueError): no file has that name, so it
         * is a file that cannot be stat'ed. */
        int64_t size = at(&col[0], i);
        int d = (Py_ssize_t)strlen(s) != n
                    ? size != missing
                    : differs(fd, s, size, at(&col[1], i), at(&col[2], i), at(&col[3], i), missing);
        Py_XDECREF(encoded);
        Py_DECREF(p);
        if (d) {
            PyObject *v = PyLong_FromSsize_t(k);
            if (v == NULL || PyList_Append(out, v) < 0) {
                Py_XDECREF(v);
                Py_CLEAR(out);
                goto done;
            }
            Py_DECREF(v);
        }
    }
done:
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

PyMODINIT_FUNC PyInit__statcmp(void) { return PyModule_Create(&module); }
