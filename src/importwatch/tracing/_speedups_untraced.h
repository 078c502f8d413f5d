/* Part of _speedups.c: our Python code out of sight of the program's trace and profile functions.
 *
 * A program's sys.settrace, sys.setprofile and (3.12 on) sys.monitoring see every Python
 * function its thread runs: a debugger's `step` over an import would stop in ours, `trace
 * --count` would count our lines, a coverage tool would pay for them. CPython runs a trace
 * function's own calls with the thread's tracing counter raised, which none of these look
 * past; ours run the same way. What the program runs in between (the import itself, a loader's
 * module body, a dlopen's constructors) is run with the counter as the program had it, traced
 * as under plain python.
 *
 * `ours` counts this thread's nested spans of ours, so that a call back into the program
 * (traced) lowers the counter by exactly what we added, however deep: our span, the program's
 * import inside it, our span again for that import. In a thread of ours (`whole`) nothing is the
 * program's: an import there stays unseen. Without thread-local storage (not GCC or Clang)
 * nothing is hidden, as with the pure-Python twin.
 *
 * Included once by _speedups.c, before the hook and the doors: one translation unit. Not
 * compiled on its own. */

#if defined(__GNUC__)
static __thread int ours;  /* this thread's spans of ours, nested */
static __thread int whole; /* this thread is ours, all of it (untraced) */

static void untraced_enter(PyThreadState *tstate) {
    if (ours++ > 0) {
        return;
    }
#if PY_VERSION_HEX >= 0x030B0000
    PyThreadState_EnterTracing(tstate);
#else
    tstate->tracing++;
#if PY_VERSION_HEX >= 0x030A0000
    tstate->cframe->use_tracing = 0;
#else
    tstate->use_tracing = 0;
#endif
#endif
}

static void untraced_leave(PyThreadState *tstate) {
    if (--ours > 0) {
        return;
    }
#if PY_VERSION_HEX >= 0x030B0000
    PyThreadState_LeaveTracing(tstate);
#else
    tstate->tracing--;
    int use_tracing = tstate->tracing == 0 && (tstate->c_tracefunc != NULL || tstate->c_profilefunc != NULL);
#if PY_VERSION_HEX >= 0x030A0000
    tstate->cframe->use_tracing = use_tracing;
#else
    tstate->use_tracing = use_tracing;
#endif
#endif
}

/* CALLABLE(ARGS) run as the program's code: the counter back where the program had it, then ours again. */
static PyObject *traced_call(PyThreadState *tstate, PyObject *callable, PyObject *const *args, size_t nargsf,
                             PyObject *kwnames) {
    int spans = whole ? 0 : ours;
    if (spans > 0) {
        ours = 1;
        untraced_leave(tstate);
    }
    PyObject *result = PyObject_Vectorcall(callable, args, nargsf, kwnames);
    if (spans > 0) {
        untraced_enter(tstate);
        ours = spans;
    }
    return result;
}
#define WHOLE(value) (whole = (value))
#else
#define WHOLE(value) ((void)0)
static void untraced_enter(PyThreadState *tstate) {
    (void)tstate;
}
static void untraced_leave(PyThreadState *tstate) {
    (void)tstate;
}
static PyObject *traced_call(PyThreadState *tstate, PyObject *callable, PyObject *const *args, size_t nargsf,
                             PyObject *kwnames) {
    (void)tstate;
    return PyObject_Vectorcall(callable, args, nargsf, kwnames);
}
#endif

/* untraced(function, *args): FUNCTION(*ARGS) as ours, all it calls included: the body of each thread of ours
   (threads.start). */
static PyObject *untraced(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs < 1) {
        PyErr_SetString(PyExc_TypeError, "untraced: a function to call is needed");
        return NULL;
    }
    PyThreadState *tstate = PyThreadState_Get();
    untraced_enter(tstate);
    WHOLE(1);
    PyObject *result = PyObject_Vectorcall(args[0], args + 1, (size_t)(nargs - 1), NULL);
    WHOLE(0);
    untraced_leave(tstate);
    return result;
}

/* traced(function, *args): FUNCTION(*ARGS) as the program's, from within ours (a native load's dlopen). */
static PyObject *traced(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs < 1) {
        PyErr_SetString(PyExc_TypeError, "traced: a function to call is needed");
        return NULL;
    }
    return traced_call(PyThreadState_Get(), args[0], args + 1, (size_t)(nargs - 1), NULL);
}

#define UNTRACED_METHODS                                                                                             \
    {"untraced", (PyCFunction)(void (*)(void))untraced, METH_FASTCALL,                                               \
     "untraced(function, *args): FUNCTION(*ARGS), a thread of ours, unseen by trace and profile functions."},            \
        {"traced", (PyCFunction)(void (*)(void))traced, METH_FASTCALL,                                               \
         "traced(function, *args): FUNCTION(*ARGS) seen by them again, from within untraced or a door."},
