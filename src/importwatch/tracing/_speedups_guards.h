/* Part of _speedups.c: whether the descriptors of ours are still ours, looked at in C.

   The hook looks at each step that begins with nothing in flight on its thread
   (the program's own code may have closed, dup2'd or opened meanwhile). */

#include <sys/stat.h>

/* Whether each descriptor of ours still refers to what Sink.check_descriptors last found there: the
   (fd, device, inode) triples of sink.guards, each looked at with one fstat. 0 when one does not, or
   when a descriptor of ours has changed since (guards is None): then the sink's own check runs, and
   sets guards anew. The closure calls that check each time; its stat_result alone costs more than
   all of this. */
static int guards_hold(Hook *self) {
    PyObject *guards = sink_get(self, s_guards);
    if (guards == NULL) { /* a sink without them: its own check says */
        if (!PyErr_ExceptionMatches(PyExc_AttributeError)) {
            return -1;
        }
        PyErr_Clear();
        return 0;
    }
    int hold = PyTuple_Check(guards);
    for (Py_ssize_t i = 0; hold && i < PyTuple_GET_SIZE(guards); i++) {
        PyObject *entry = PyTuple_GET_ITEM(guards, i);
        if (!PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) != 3) {
            hold = 0;
            break;
        }
        long fd = PyLong_AsLong(PyTuple_GET_ITEM(entry, 0));
        unsigned long long device = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(entry, 1));
        unsigned long long inode = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(entry, 2));
        struct stat seen;
        if (PyErr_Occurred()) {
            PyErr_Clear(); /* not ours to judge: the sink's check says */
            hold = 0;
        } else if (fd < 0 || fd > 0x7fffffffL || fstat((int)fd, &seen) != 0) {
            hold = 0;
        } else {
            hold = (unsigned long long)seen.st_dev == device && (unsigned long long)seen.st_ino == inode;
        }
    }
    Py_DECREF(guards);
    return hold;
}
