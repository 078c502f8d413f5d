/* Part of _speedups.c: a thread's chain of steps, where the hook begins one and takes a step out of one.
 *
 * A thread's first step makes its chain, reads its kernel id once, looks at our descriptors and
 * tells the watchdog (Tracer.on_deadline) unless a deadline already covers it; a step is taken
 * out by identity, wherever a re-entrant import or a fork may have moved it.
 *
 * Included once by _speedups.c, after its helpers: one translation unit. Not compiled on its own. */

/* This thread's kernel id: a system call (gettid) the first time on each thread, then kept. Only a fork
   changes it, for the one thread the child has: the child forgets it (forget_tid, from pthread_atfork). */
#if defined(__GNUC__)
static __thread unsigned long own_tid;
static void forget_tid(void) {
    own_tid = 0;
}
static unsigned long native_tid(void) {
    if (own_tid == 0) {
        own_tid = PyThread_get_thread_native_id();
    }
    return own_tid;
}
#else
#define native_tid PyThread_get_thread_native_id
#endif

/* A thread's first step: its chain, its kernel id, a look at our descriptors, and the watchdog told. */
RARE static PyObject *first_stack(Hook *self, PyObject *key) {
    PyObject *stack = PyList_New(0);
    if (stack == NULL || PyDict_SetItem(self->stacks, key, stack) < 0) {
        Py_XDECREF(stack);
        return NULL;
    }
    PyObject *native = PyLong_FromUnsignedLong(native_tid());
    int failed = native == NULL || PyDict_SetItem(self->native_ids, key, native) < 0;
    Py_XDECREF(native);
    int hold = failed ? -1 : guards_hold(self);
    PyObject *result = NULL;
    if (hold > 0) {
        result = Py_None;
        Py_INCREF(result);
    } else if (hold == 0) {
        result = PyObject_CallMethodNoArgs(self->sink, s_check_descriptors);
    }
    if (result == NULL) {
        Py_DECREF(stack);
        return NULL;
    }
    Py_DECREF(result);
    PyObject *on_deadline = tracer_get(self, s_on_deadline);
    if (on_deadline == NULL) {
        Py_DECREF(stack);
        return NULL;
    }
    if (on_deadline != Py_None && !deadline_covered(self)) {
        result = PyObject_CallOneArg(on_deadline, Py_None);
        if (result == NULL) {
            Py_DECREF(on_deadline);
            Py_DECREF(stack);
            return NULL;
        }
        Py_DECREF(result);
    }
    Py_DECREF(on_deadline);
    return stack;
}

/* FRAME out of STACK, by identity, wherever it is (a re-entrant import or a fork may have moved it). */
RARE static int take_out(PyObject *stack, PyObject *frame) {
    for (Py_ssize_t i = PyList_GET_SIZE(stack) - 1; i >= 0; i--) {
        if (PyList_GET_ITEM(stack, i) == frame) {
            return PyList_SetSlice(stack, i, i + 1, NULL);
        }
    }
    return 0;
}
