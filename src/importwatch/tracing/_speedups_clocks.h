/* Part of _speedups.c: the clocks the hook and its writer read, read in C where they are the time
 * module's own functions.
 *
 * time.monotonic() (a step's start and end) and time.time() (a line's stamp) cost a call and a float
 * each through Python; they are clock_gettime and one conversion. Only the time module's own functions
 * are read this way: where the sink or the tracer holds another clock (a test's), it is called.
 *
 * Included once by _speedups.c, after its Hook: one translation unit. Not compiled on its own. */

#include <time.h>

/* Whether CLOCK is the time module's own function NAME (not whatever the program may have put in its place). */
static int is_time_builtin(PyObject *clock, const char *name) {
    if (!PyCFunction_Check(clock) || strcmp(((PyCFunctionObject *)clock)->m_ml->ml_name, name) != 0) {
        return 0;
    }
    PyObject *owner = PyCFunction_GET_SELF(clock);
    const char *owner_name = owner != NULL && PyModule_Check(owner) ? PyModule_GetName(owner) : NULL;
    if (owner_name == NULL) {
        PyErr_Clear();
        return 0;
    }
    return strcmp(owner_name, "time") == 0;
}

/* What time.monotonic() or time.time() returns, read here as they read it: clock_gettime's nanoseconds
   as seconds, rounded as _PyTime_AsSecondsDouble rounds them. -1.0 when the clock cannot be read. */
static double seconds_of(clockid_t which) {
    struct timespec now;
    if (clock_gettime(which, &now) != 0) {
        return -1.0;
    }
    long long nanoseconds = (long long)now.tv_sec * 1000000000LL + now.tv_nsec;
    volatile double seconds; /* as CPython's: no change to how it rounds */
    if (nanoseconds % 1000000000LL == 0) {
        seconds = (double)(nanoseconds / 1000000000LL);
    } else {
        seconds = (double)nanoseconds;
        seconds /= 1e9;
    }
    return seconds;
}

/* The hook's clock as a float: time.monotonic's value made here, or the clock called. */
static PyObject *clock_now(Hook *self) {
    double seconds = self->monotonic ? seconds_of(CLOCK_MONOTONIC) : -1.0;
    return seconds >= 0.0 ? PyFloat_FromDouble(seconds) : PyObject_CallNoArgs(self->clock);
}
