/* Part of _speedups.c: what Sink.emit reads of the sink for the hook's two lines, read once per change of
 * the sink rather than once per line: the route.
 *
 * Where a line goes and how it starts depends on ten of the sink's attributes (`_loud`, `log`, `feed`,
 * `stderr`, `structured`, `partial`, `main_thread`, `_now`, `_msec`, `_prefix`): read per line through
 * the sink's dictionary, twenty lookups an import, about 2,800 instructions, more than all else a quiet
 * import costs. The sink is a Counted where this module is built (accelerator.py): every set or
 * deletion of one of its attributes, from anywhere, adds one to its count, so what was read at one
 * count is what getattr gives while the count stays. Two things are not attributes set on the sink and
 * are looked at as before: the channels' own state (a log's `broken`, a feed's `closed`, read per line
 * from their slots), and the `_loud` map's answers, which never change once given (sink.py,
 * _LoudKinds; a kind not answered yet is asked again, the route kept only once both kinds are). The
 * stamp's milliseconds within a second are the hook's own (new_stamp in _speedups_emit.h): written
 * into the route's copy of `_prefix`, never stored in the sink, whose stamp emit makes for its lines.
 * A sink that is not a Counted is read again at every line.
 *
 * Included once by _speedups.c, after _speedups_attrs.h and _speedups_clocks.h. */

/* The base of the sink's class where this module is built: counts the sets and deletions of its
   attributes, for the hook's kept reading of them. */
typedef struct {
    PyObject_HEAD
    unsigned long long changes;
} Counted;

static int counted_setattro(PyObject *object, PyObject *name, PyObject *value) {
    ((Counted *)object)->changes++;
    return PyObject_GenericSetAttr(object, name, value);
}

static PyTypeObject CountedType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "importwatch.tracing._speedups.Counted",
    .tp_basicsize = sizeof(Counted),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_setattro = counted_setattro,
    .tp_new = PyType_GenericNew,
    .tp_doc = "A base whose instances count every set of their attributes: the sink's, where the C hook keeps "
              "what it read of it (_speedups_route.h).",
};

/* What the sink's `_loud` says of a line of KIND: 1 to stderr, 0 not, -1 not known yet (not a dict, or
   it has not answered for KIND: emit asks); -2 with an exception. */
static int loud_now(PyObject *loud, PyObject *kind) {
    if (loud == Py_None) { /* --stderr all */
        return 1;
    }
    PyObject *answer = PyDict_Check(loud) ? PyDict_GetItemWithError(loud, kind) : NULL;
    return answer != NULL ? answer == Py_True : PyErr_Occurred() ? -2 : -1;
}

static void route_drop(Route *route) {
    Py_CLEAR(route->log);
    Py_CLEAR(route->feed);
    Py_CLEAR(route->stderr_channel);
    Py_CLEAR(route->wall);
    route->kept = 0;
}

/* Everything Sink.emit reads of the sink for the hook's two lines, read now and kept at its count (where
   the sink is a Counted and `_loud` has answered for both kinds). 0, or -1 with an exception. */
RARE static int route_read(Hook *self) {
    Route *route = &self->route;
    route_drop(route);
    PyObject *loud = sink_get(self, s_loud), *value = NULL;
    int result = -1;
    if (loud == NULL || (route->log = sink_get(self, s_log)) == NULL ||
        (route->feed = sink_get(self, s_feed)) == NULL ||
        (route->stderr_channel = sink_get(self, s_stderr)) == NULL || (route->wall = sink_get(self, s_now)) == NULL ||
        (route->structured = as_truth(sink_get(self, s_structured))) < 0 ||
        (route->partial = as_truth(sink_get(self, s_partial))) < 0 || (value = sink_get(self, s_main_thread)) == NULL ||
        ((route->main_thread = PyLong_AsUnsignedLong(value)) == (unsigned long)-1 && PyErr_Occurred())) {
        goto done;
    }
    Py_CLEAR(value);
    if ((value = sink_get(self, s_msec)) == NULL || ((route->msec = as_wide(value)) == -1 && PyErr_Occurred())) {
        goto done;
    }
    Py_SETREF(value, sink_get(self, s_prefix));
    if (value == NULL) {
        goto done;
    }
    route->prefix_size = 0; /* none usable: emit writes the line */
    Py_ssize_t size = PyUnicode_Check(value) && PyUnicode_IS_ASCII(value) ? PyUnicode_GET_LENGTH(value) : 0;
    const char *text = size ? (const char *)PyUnicode_DATA(value) : NULL;
    if (size >= 5 && (size_t)size <= sizeof route->prefix && memcmp(text + size - 2, "] ", 2) == 0) {
        memcpy(route->prefix, text, (size_t)size);
        route->prefix_size = (size_t)size;
    }
    Py_CLEAR(value);
    int quiet = PyDict_Check(loud) && route->log == Py_None && route->feed == Py_None, known = 1;
    for (int end = 0; end < 2; end++) {
        int answer = loud_now(loud, end ? s_import_end : s_import);
        if (answer == -2) {
            goto done;
        }
        route->loud[end] = (signed char)answer;
        route->nowhere[end] = quiet && answer == 0;
        known = known && answer >= 0;
    }
    route->wall_builtin = is_time_builtin(route->wall, "time");
    route->kept = self->counted && known;
    route->at = self->counted ? ((Counted *)self->sink)->changes : 0;
    result = 0;
done:
    Py_XDECREF(loud);
    Py_XDECREF(value);
    if (result < 0) {
        route_drop(route);
    }
    return result;
}

/* The route, read again unless the kept one still holds. 0, or -1 with an exception. */
static int route_fresh(Hook *self) {
    if (self->route.kept && ((Counted *)self->sink)->changes == self->route.at) {
        return 0;
    }
    return route_read(self);
}

/* Whether the sink's log is JSON (its `structured`): 1 or 0, -1 with an exception. */
static int route_structured(Hook *self) {
    return route_fresh(self) < 0 ? -1 : self->route.structured;
}

/* Whether an import's START (END: 1) line goes nowhere: 1; 0 where it goes somewhere or emit must decide
   (a kind `_loud` has not answered); -1 with an exception. Sink.emit's first test. */
static int route_nowhere(Hook *self, int end) {
    return route_fresh(self) < 0 ? -1 : self->route.nowhere[end];
}
