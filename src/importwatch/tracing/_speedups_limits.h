/* Part of _speedups.c: the open-files limit, read and set, for where our descriptors are placed.
 *
 * descriptors.py places ours above the program's soft limit where the hard limit leaves room, so that
 * they are outside every number the program can open or scan (`range(SC_OPEN_MAX)`); a descriptor can
 * only be made there while the soft limit is raised for that moment. Without the accelerator the
 * resource module does the same, imported at start-up only where it is needed.
 *
 * Included once by _speedups.c: one translation unit. Not compiled on its own. */

#include <sys/resource.h>

/* open_files_limit() -> (soft, hard); open_files_limit(soft) sets the soft limit, the hard one kept. */
static PyObject *open_files_limit(PyObject *module, PyObject *args) {
    long long soft = -1;
    if (!PyArg_ParseTuple(args, "|L:open_files_limit", &soft)) {
        return NULL;
    }
    struct rlimit limit;
    if (getrlimit(RLIMIT_NOFILE, &limit) != 0) {
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    if (soft < 0) {
        return Py_BuildValue("(LL)", (long long)limit.rlim_cur, (long long)limit.rlim_max);
    }
    limit.rlim_cur = (rlim_t)soft;
    if (setrlimit(RLIMIT_NOFILE, &limit) != 0) {
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    Py_RETURN_NONE;
}

#define LIMITS_METHODS                                                                                           \
    {"open_files_limit", open_files_limit, METH_VARARGS,                                                       \
     "open_files_limit([soft]): (soft, hard) of RLIMIT_NOFILE; with SOFT, sets the soft limit, the hard one "    \
     "kept (descriptors.high_descriptor)."},
