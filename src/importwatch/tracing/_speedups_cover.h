/* Part of _speedups.c: whether a thread's first step needs the watchdog's step_begins, asked in C.
 *
 * A step that begins with nothing in flight on its thread calls tracer.on_deadline(None), so that the
 * watchdog covers it: its heartbeat may have left, or the deadline armed may be too late or too early
 * for this step, or the heartbeat may sleep past this step's threshold. In a run of top-level imports
 * (a script's, or importlib.import_module in a loop) that call almost always does nothing, and it is
 * a Python call: about 3,500 instructions, more than the rest of an import's tracing. Where
 * on_deadline is the step_begins of tracer.watchdog, the same test is made here on the watchdog's
 * own attributes, and the call is made only where it would do something. A value of a type the test
 * does not expect means the call, which is never wrong.
 *
 * Included once by _speedups.c, after _speedups_attrs.h and _speedups_clocks.h: one translation unit.
 * Not compiled on its own. */

/* The watchdog's attributes the test reads (watchdog.py): held_dict checks that none is a property. */
enum { W_TIMEOUT, W_GRACE, W_LONGEST, W_INTERVAL, W_ARMED, W_NEXT_LOOK, W_DORMANT, W_NAMES };
static PyObject **const watchdog_names[W_NAMES] = {&s_timeout,  &s_grace,     &s_longest, &s_interval,
                                                   &s_armed_for, &s_next_look, &s_dormant};

/* VALUE as a double, when it is an exact float or int: 0, or -1 (no exception left). */
static int as_double(PyObject *value, double *number) {
    if (value != NULL && PyFloat_CheckExact(value)) {
        *number = PyFloat_AS_DOUBLE(value);
        return 0;
    }
    if (value != NULL && PyLong_CheckExact(value)) {
        *number = PyLong_AsDouble(value);
        if (*number == -1.0 && PyErr_Occurred()) {
            PyErr_Clear();
            return -1;
        }
        return 0;
    }
    return -1;
}

/* Whether WATCHDOG.step_begins(None) would do nothing for a step that begins at NOW (Watchdog.step_begins
   and _cover, the same comparisons in the same order): awake; the deadline armed may stand, no later than
   this step's own and less than `longest` earlier; and the heartbeat's next look comes in time for it.
   1 yes, 0 no or not known; never an exception. */
static int watchdog_covers(PyObject *watchdog, double now) {
    PyObject *dict = held_dict(watchdog, watchdog_names, W_NAMES);
    if (dict == NULL) {
        PyErr_Clear();
        return 0;
    }
    PyObject *values[W_NAMES];
    for (int i = 0; i < W_NAMES; i++) {
        values[i] = PyDict_GetItemWithError(dict, *watchdog_names[i]); /* borrowed, while DICT is held */
    }
    double limit, grace, longest, interval, armed, next_look;
    int known = !PyErr_Occurred() && as_double(values[W_TIMEOUT], &limit) == 0 &&
                (values[W_DORMANT] == Py_False || values[W_DORMANT] == Py_True);
    int covered = 0;
    if (known && limit <= 0) {
        covered = values[W_DORMANT] == Py_False; /* only a dormant watchdog is woken */
    } else if (known && values[W_DORMANT] == Py_False && as_double(values[W_GRACE], &grace) == 0 &&
               as_double(values[W_LONGEST], &longest) == 0 && as_double(values[W_INTERVAL], &interval) == 0 &&
               as_double(values[W_ARMED], &armed) == 0 && as_double(values[W_NEXT_LOOK], &next_look) == 0) {
        double deadline = now + limit + grace;
        covered = !(armed > deadline || armed <= deadline - longest) && !(now + limit < next_look + interval);
    }
    PyErr_Clear();
    Py_DECREF(dict);
    return covered;
}

/* Whether the call of ON_DEADLINE(None) may be left out: it is tracer.watchdog's own step_begins, the
   clock is time.monotonic (the watchdog's, read here), and watchdog_covers says so. 1 or 0, no exception. */
static int deadline_covered(Hook *self, PyObject *on_deadline) {
    if (!self->monotonic || !PyMethod_Check(on_deadline)) {
        return 0;
    }
    PyObject *watchdog = tracer_get(self, s_watchdog);
    if (watchdog == NULL) {
        PyErr_Clear();
        return 0;
    }
    int covered = 0;
    if (PyMethod_GET_SELF(on_deadline) == watchdog &&
        PyMethod_GET_FUNCTION(on_deadline) == _PyType_Lookup(Py_TYPE(watchdog), s_step_begins)) {
        double now = seconds_of(CLOCK_MONOTONIC);
        covered = now >= 0.0 && watchdog_covers(watchdog, now);
    }
    Py_DECREF(watchdog);
    return covered;
}

/* watchdog_covers(watchdog, now): the test above, so that a test can hold it to step_begins itself. */
static PyObject *covers(PyObject *module, PyObject *args) {
    (void)module;
    PyObject *watchdog;
    double now;
    if (!PyArg_ParseTuple(args, "Od:watchdog_covers", &watchdog, &now)) {
        return NULL;
    }
    return PyBool_FromLong(watchdog_covers(watchdog, now));
}
