/* The C twin of Tracer._make_find_and_load (hook.py): the per-import hook with no Python frame of its own.

   An optional accelerator: hook.py uses it when it imports, and its pure-Python
   closure otherwise (or under IMPORTWATCH_PURE=1). It does what the closure does,
   in the same order and under the same conditions, on the same objects (the
   tracer's stacks, TracedStep instances, the sink's emit); read the closure first.

   Why C: a Python function in place of importlib's _find_and_load puts one frame
   of ours below every module body (tracebacks, inspect.stack(), recursion room).
   This object is called by the import machinery through vectorcall, calls the
   original _find_and_load itself, and is no frame: the module body sees the
   stack plain python gives it. It is not a builtin function on purpose: calling
   one counts against the recursion limit on 3.9 to 3.11, a vectorcall type does not.

   The two lines are formatted and written here, byte for byte as Sink.emit
   (sink.py) would, in the common case (fast_emit); the rest goes through emit.
   The rare paths call back into the tracer's Python helpers (an on_start hook, a
   thread's first step, the end line of a failed import, our own failures); none
   of them runs while the module body does. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <stddef.h>
#include <string.h>
#include <unistd.h>

#ifndef Py_TPFLAGS_HAVE_VECTORCALL
#define Py_TPFLAGS_HAVE_VECTORCALL _Py_TPFLAGS_HAVE_VECTORCALL /* 3.9 to 3.11 */
#endif

/* Strings made once: attribute names, the kinds of the two lines, the dictionaries' keys. */
static PyObject *s_import, *s_import_end, *s_structured, *s_progress_due, *s_on_progress, *s_on_deadline,
    *s_check_descriptors, *s_safely, *s_internal_error, *s_event, *s_name, *s_parent, *s_ms, *s_error,
    *s_writing_a_line, *s_dunder_name, *s_progress, *s_loud, *s_log, *s_feed, *s_stderr, *s_partial,
    *s_main_thread, *s_msec, *s_prefix, *s_now, *s_set_stamp, *s_json, *s_broken, *s_closed, *s_lost, *s_fd,
    *s_stderr_again, *s_log_lost, *s_warn;

static const struct {
    PyObject **slot;
    const char *text;
} strings[] = {
    {&s_import, "import"}, {&s_import_end, "import_end"}, {&s_structured, "structured"},
    {&s_progress_due, "progress_due"}, {&s_on_progress, "on_progress"}, {&s_on_deadline, "on_deadline"},
    {&s_check_descriptors, "check_descriptors"}, {&s_safely, "safely"}, {&s_internal_error, "internal_error"},
    {&s_event, "event"}, {&s_name, "name"}, {&s_parent, "parent"}, {&s_ms, "ms"}, {&s_error, "error"},
    {&s_writing_a_line, "writing a line"}, {&s_dunder_name, "__name__"}, {&s_progress, "progress"},
    {&s_loud, "_loud"}, {&s_log, "log"}, {&s_feed, "feed"}, {&s_stderr, "stderr"}, {&s_partial, "partial"},
    {&s_main_thread, "main_thread"}, {&s_msec, "_msec"}, {&s_prefix, "_prefix"}, {&s_now, "_now"},
    {&s_set_stamp, "_set_stamp"}, {&s_json, "json"}, {&s_broken, "broken"}, {&s_closed, "closed"},
    {&s_lost, "lost"}, {&s_fd, "fd"}, {&s_stderr_again, "_stderr_again"}, {&s_log_lost, "_log_lost"},
    {&s_warn, "warn"},
};

/* The six slots of a TracedStep, set through their member descriptors: no __init__ runs. */
enum { SLOT_NAME, SLOT_KIND, SLOT_START, SLOT_PROGRESS, SLOT_TIMEOUT, SLOT_CONTEXT, SLOTS };
static const char *const slot_names[SLOTS] = {"name", "kind", "start", "progress", "timeout", "context"};

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *original;   /* importlib's own _find_and_load */
    PyObject *tracer;     /* the Tracer: its helpers and its settings, read per call as the closure does */
    PyObject *stacks;     /* tracer.stacks: thread ident -> list of TracedStep */
    PyObject *native_ids; /* tracer.native_ids */
    PyObject *on_start;   /* tracer.on_start: name -> callback */
    PyObject *on_end;     /* tracer.on_end */
    PyObject *sink;
    PyObject *emit;       /* sink.emit, bound once as the closure binds it */
    PyObject *clock;      /* CLOCKS.monotonic */
    PyObject *step_type;  /* TracedStep */
    PyObject *escape;     /* events.escape, for a name that is not printable ASCII */
    PyObject *slots[SLOTS];
} Hook;

/* -- exceptions, the same way on every version (PyErr_Fetch is deprecated from 3.12) ----------- */
typedef struct {
    PyObject *type, *value, *traceback;
} Saved;

static void save_error(Saved *saved) {
#if PY_VERSION_HEX >= 0x030C0000
    saved->value = PyErr_GetRaisedException();
    saved->type = saved->traceback = NULL;
#else
    PyErr_Fetch(&saved->type, &saved->value, &saved->traceback);
    PyErr_NormalizeException(&saved->type, &saved->value, &saved->traceback);
    if (saved->traceback != NULL && saved->value != NULL) {
        PyException_SetTraceback(saved->value, saved->traceback);
    }
#endif
}

static void restore_error(Saved *saved) {
#if PY_VERSION_HEX >= 0x030C0000
    PyErr_SetRaisedException(saved->value);
#else
    PyErr_Restore(saved->type, saved->value, saved->traceback);
#endif
    saved->type = saved->value = saved->traceback = NULL;
}

static void drop_error(Saved *saved) {
    Py_CLEAR(saved->type);
    Py_CLEAR(saved->value);
    Py_CLEAR(saved->traceback);
}

/* An exception of ours is set. An Exception is said through tracer.internal_error("writing a line", error)
   and cleared, as the closure's `except Exception` does (a failure to say it is dropped too): 0. Anything
   else (KeyboardInterrupt) stays set, to propagate as it would from the closure: -1. */
static int said(Hook *self) {
    if (!PyErr_ExceptionMatches(PyExc_Exception)) {
        return -1;
    }
    Saved error;
    save_error(&error);
    PyObject *result =
        PyObject_CallMethodObjArgs(self->tracer, s_internal_error, s_writing_a_line, error.value, NULL);
    drop_error(&error);
    if (result != NULL) {
        Py_DECREF(result);
        return 0;
    }
    if (PyErr_ExceptionMatches(PyExc_Exception)) {
        PyErr_Clear();
        return 0;
    }
    return -1;
}

/* -- the lines ------------------------------------------------------------------------------- */
/* DEPTH times two spaces, MARK ("> " or "< "), SHOWN (printable ASCII), then TAIL (or nothing). */
static PyObject *line(Py_ssize_t depth, const char *mark, PyObject *shown, const char *tail) {
    if (!PyUnicode_IS_ASCII(shown)) { /* escape() gives ASCII; this is for a broken escape only */
        PyObject *head = PyUnicode_FromFormat("%*s%s", (int)(2 * depth), "", mark);
        PyObject *result = head == NULL ? NULL : PyUnicode_FromFormat("%U%U%s", head, shown, tail ? tail : "");
        Py_XDECREF(head);
        return result;
    }
    Py_ssize_t size = PyUnicode_GET_LENGTH(shown), tail_size = tail ? (Py_ssize_t)strlen(tail) : 0;
    PyObject *text = PyUnicode_New(2 * depth + 2 + size + tail_size, 127);
    if (text == NULL) {
        return NULL;
    }
    char *out = (char *)PyUnicode_DATA(text);
    memset(out, ' ', (size_t)(2 * depth));
    out += 2 * depth;
    memcpy(out, mark, 2);
    memcpy(out + 2, PyUnicode_DATA(shown), (size_t)size);
    if (tail_size) {
        memcpy(out + 2 + size, tail, (size_t)tail_size);
    }
    return text;
}

/* NAME as the lines show it: itself when printable ASCII (str.isascii() and str.isprintable()), else escaped. */
static PyObject *shown_name(Hook *self, PyObject *name) {
    if (PyUnicode_IS_ASCII(name)) {
        const unsigned char *data = (const unsigned char *)PyUnicode_DATA(name);
        Py_ssize_t size = PyUnicode_GET_LENGTH(name), i = 0;
        while (i < size && data[i] >= 0x20 && data[i] < 0x7f) {
            i++;
        }
        if (i == size) {
            Py_INCREF(name);
            return name;
        }
    }
    return PyObject_CallOneArg(self->escape, name);
}

/* A new TracedStep for an import: the closure's TracedStep(name, start), without running __init__. */
static PyObject *new_step(Hook *self, PyObject *name, PyObject *start) {
    PyTypeObject *type = (PyTypeObject *)self->step_type;
    PyObject *step = type->tp_alloc(type, 0);
    if (step == NULL) {
        return NULL;
    }
    PyObject *values[SLOTS] = {name, s_import, start, start, Py_None, Py_None};
    for (int i = 0; i < SLOTS; i++) {
        PyObject *slot = self->slots[i];
        if (Py_TYPE(slot)->tp_descr_set(slot, step, values[i]) < 0) {
            Py_DECREF(step);
            return NULL;
        }
    }
    return step;
}

/* "TypeName: message", as the closure's f"{type(error).__name__}: {error}". */
static PyObject *failure_text(PyObject *error) {
    PyObject *type_name = PyObject_GetAttr((PyObject *)Py_TYPE(error), s_dunder_name);
    if (type_name == NULL) {
        return NULL;
    }
    PyObject *empty = PyUnicode_FromStringAndSize("", 0);
    PyObject *message = empty == NULL ? NULL : PyObject_Format(error, empty);
    Py_XDECREF(empty);
    PyObject *text = message == NULL ? NULL : PyUnicode_FromFormat("%S: %S", type_name, message);
    Py_DECREF(type_name);
    Py_XDECREF(message);
    return text;
}

/* -- writing a line as Sink.emit does (sink.py), in the common case -------------------------- */
/* write(2) as os.write does it: without the GIL, again after a signal whose handler did not raise.
   Returns what write returned (-1 with errno set), or -2 when a signal handler raised. */
static Py_ssize_t write_once(int fd, const char *data, size_t size) {
    Py_ssize_t written;
    for (;;) {
        Py_BEGIN_ALLOW_THREADS
        written = write(fd, data, size);
        Py_END_ALLOW_THREADS
        if (written >= 0 || errno != EINTR) {
            return written;
        }
        if (PyErr_CheckSignals() < 0) {
            return -2;
        }
    }
}

static int set_true(PyObject *object, PyObject *attribute) {
    return PyObject_SetAttr(object, attribute, Py_True);
}

/* An attribute of OBJECT as a C long / truth value; -1 with an exception on failure. */
static long long_attr(PyObject *object, PyObject *attribute) {
    PyObject *value = PyObject_GetAttr(object, attribute);
    if (value == NULL) {
        return -1;
    }
    long result = PyLong_AsLong(value);
    Py_DECREF(value);
    return result;
}

static int true_attr(PyObject *object, PyObject *attribute) {
    PyObject *value = PyObject_GetAttr(object, attribute);
    if (value == NULL) {
        return -1;
    }
    int result = PyObject_IsTrue(value);
    Py_DECREF(value);
    return result;
}

/* Channel.write: all of DATA to CHANNEL unless it is broken; a failure breaks it. 0, or -1 with an
   exception (a signal handler's, or one of ours). */
static int channel_write(PyObject *channel, const char *data, size_t size) {
    int broken = true_attr(channel, s_broken);
    long fd = broken ? -1 : long_attr(channel, s_fd);
    if (broken < 0 || (fd == -1 && PyErr_Occurred())) {
        return -1;
    }
    while (!broken && size > 0) {
        Py_ssize_t written = write_once((int)fd, data, size);
        if (written == -2) {
            return -1;
        }
        if (written < 0) {
            return set_true(channel, s_broken);
        }
        data += written;
        size -= (size_t)written;
    }
    return 0;
}

/* The stderr part of Sink.emit for TEXT: one write; the rest, a failure and a copy of stderr made
   anew as its Channel.write and _stderr_again do. */
static int stderr_write(Hook *self, PyObject *stderr_channel, const char *text, size_t size) {
    long fd = long_attr(stderr_channel, s_fd);
    if (fd == -1 && PyErr_Occurred()) {
        return -1;
    }
    Py_ssize_t written = write_once((int)fd, text, size);
    if (written == -2) {
        return -1;
    }
    if (written >= 0) {
        return (size_t)written == size ? 0 : channel_write(stderr_channel, text + written, size - (size_t)written);
    }
    PyErr_SetFromErrno(PyExc_OSError);
    Saved error;
    save_error(&error);
    PyObject *again = PyObject_CallMethodOneArg(self->sink, s_stderr_again, error.value);
    drop_error(&error);
    int renewed = again == NULL ? -1 : PyObject_IsTrue(again);
    Py_XDECREF(again);
    if (renewed < 0) {
        return -1;
    }
    if (!renewed) {
        return set_true(stderr_channel, s_broken);
    }
    return channel_write(stderr_channel, text, size); /* breaks the channel itself on failure */
}

/* The feed part of Sink.emit (Feed.send, nothing lost before): EAGAIN loses the line, counted; another
   failure closes the feed. */
static int feed_write(PyObject *feed, const char *text, size_t size) {
    long fd = long_attr(feed, s_fd);
    if (fd == -1 && PyErr_Occurred()) {
        return -1;
    }
    Py_ssize_t written = write_once((int)fd, text, size);
    if (written == -2) {
        return -1;
    }
    if (written >= 0) {
        return 0;
    }
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
        PyObject *one = PyLong_FromLong(1);
        int result = one == NULL ? -1 : PyObject_SetAttr(feed, s_lost, one);
        Py_XDECREF(one);
        return result;
    }
    return set_true(feed, s_closed);
}

/* The log part of Sink.emit for a text log: a short write is a full disk; EBADF, a descriptor the
   program closed; any other failure breaks the log, said once. */
static int log_write(Hook *self, PyObject *log, const char *text, size_t size) {
    long fd = long_attr(log, s_fd);
    if (fd == -1 && PyErr_Occurred()) {
        return -1;
    }
    Py_ssize_t written = write_once((int)fd, text, size);
    if (written == -2) {
        return -1;
    }
    if (written >= 0 && (size_t)written == size) {
        return 0;
    }
    int number = written < 0 ? errno : ENOSPC;
    PyObject *result;
    if (number == EBADF) {
        result = PyObject_CallMethodOneArg(self->sink, s_log_lost, log);
    } else {
        PyObject *name = PyObject_GetAttr(log, s_name);
        PyObject *message = name == NULL || set_true(log, s_broken) < 0
                                ? NULL
                                : PyUnicode_FromFormat("cannot write log file %U: %s; logging to stderr only",
                                                       name, strerror(number));
        Py_XDECREF(name);
        result = message == NULL ? NULL : PyObject_CallMethodOneArg(self->sink, s_warn, message);
        Py_XDECREF(message);
    }
    Py_XDECREF(result);
    return result == NULL ? -1 : 0;
}

/* Sink.emit(KIND, BODY) for one of the hook's lines, BODY being DEPTH indents, MARK, SHOWN and TAIL,
   formatted and written here when the case is the common one: the main thread, a text log or none, the
   watcher's feed with nothing lost, the program's last stderr line ended. 1: written (or nowhere to go);
   0: not the common case, nothing done (Sink.emit does it); -1: an exception, as emit would raise. */
static int fast_emit(Hook *self, PyObject *kind, Py_ssize_t depth, const char *mark, PyObject *shown,
                     const char *tail) {
    PyObject *sink = self->sink, *loud = NULL, *log = NULL, *feed = NULL, *stderr_channel = NULL, *value = NULL;
    int result = -1, loud_kind = 1, log_on = 0, feed_on = 0, stderr_on = 0;
    char small[512], *text = small;
    if (!PyUnicode_IS_ASCII(shown)) {
        return 0;
    }
    if ((loud = PyObject_GetAttr(sink, s_loud)) == NULL || (log = PyObject_GetAttr(sink, s_log)) == NULL ||
        (feed = PyObject_GetAttr(sink, s_feed)) == NULL ||
        (stderr_channel = PyObject_GetAttr(sink, s_stderr)) == NULL) {
        goto done;
    }
    if (loud != Py_None) { /* --stderr stalls or none: whether this kind goes to stderr, decided already */
        PyObject *answer = PyDict_Check(loud) ? PyDict_GetItemWithError(loud, kind) : NULL;
        if (answer == NULL) {
            result = PyErr_Occurred() ? -1 : 0;
            goto done;
        }
        loud_kind = answer == Py_True;
        if (!loud_kind && log == Py_None && feed == Py_None) {
            result = 1; /* this line goes nowhere */
            goto done;
        }
    }
    unsigned long main_thread = 0;
    if ((value = PyObject_GetAttr(sink, s_main_thread)) == NULL ||
        ((main_thread = PyLong_AsUnsignedLong(value)) == (unsigned long)-1 && PyErr_Occurred())) {
        goto done;
    }
    Py_CLEAR(value);
    if (main_thread != PyThread_get_thread_ident()) {
        result = 0; /* another thread's name goes in its lines */
        goto done;
    }
    if (log != Py_None) {
        int broken = true_attr(log, s_broken);
        int json = broken ? 0 : true_attr(log, s_json);
        if (broken < 0 || json < 0) {
            goto done;
        }
        if (json) {
            result = 0;
            goto done;
        }
        log_on = !broken;
    }
    if (feed != Py_None) {
        int closed = true_attr(feed, s_closed);
        long lost = closed ? 0 : long_attr(feed, s_lost);
        if (closed < 0 || (lost == -1 && PyErr_Occurred())) {
            goto done;
        }
        if (lost) {
            result = 0; /* a `#lost N` line goes first */
            goto done;
        }
        feed_on = !closed;
    }
    if (loud_kind) {
        int broken = true_attr(stderr_channel, s_broken);
        int partial = broken ? 0 : true_attr(sink, s_partial);
        if (broken < 0 || partial < 0) {
            goto done;
        }
        if (partial) {
            result = 0; /* our line starts on a line of its own */
            goto done;
        }
        stderr_on = !broken;
    }

    /* The stamp, made anew by the sink (_set_stamp) once a millisecond; then the line. */
    PyObject *clock = PyObject_GetAttr(sink, s_now);
    value = clock == NULL ? NULL : PyObject_CallNoArgs(clock);
    Py_XDECREF(clock);
    double now = value == NULL ? -1.0 : PyFloat_AsDouble(value);
    if (value == NULL || (now == -1.0 && PyErr_Occurred())) {
        goto done;
    }
    Py_CLEAR(value);
    double scaled = now * 1000.0;
    if (!(scaled >= 0.0 && scaled < 9e18)) {
        result = 0; /* a clock no int() of ours should meet: emit's own */
        goto done;
    }
    long long msec = (long long)scaled, stamped; /* int(now * 1000) */
    if ((value = PyObject_GetAttr(sink, s_msec)) == NULL ||
        ((stamped = PyLong_AsLongLong(value)) == -1 && PyErr_Occurred())) {
        goto done;
    }
    Py_CLEAR(value);
    if (stamped != msec) {
        PyObject *number = PyLong_FromLongLong(msec);
        value = number == NULL ? NULL : PyObject_CallMethodOneArg(sink, s_set_stamp, number);
        Py_XDECREF(number);
        if (value == NULL) {
            goto done;
        }
        Py_CLEAR(value);
    }
    if ((value = PyObject_GetAttr(sink, s_prefix)) == NULL) {
        goto done;
    }
    size_t prefix_size = PyUnicode_Check(value) && PyUnicode_IS_ASCII(value) ? (size_t)PyUnicode_GET_LENGTH(value) : 0;
    size_t shown_size = (size_t)PyUnicode_GET_LENGTH(shown), tail_size = tail ? strlen(tail) : 0;
    size_t size = prefix_size + 2 * (size_t)depth + 2 + shown_size + tail_size + 1;
    if (prefix_size == 0 || (feed_on && size > 4096)) {
        result = 0; /* the feed cuts a long line: Feed.send's */
        goto done;
    }
    if (size > sizeof small && (text = PyMem_Malloc(size)) == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    char *out = text;
    memcpy(out, PyUnicode_DATA(value), prefix_size);
    out += prefix_size;
    memset(out, ' ', 2 * (size_t)depth);
    out += 2 * depth;
    memcpy(out, mark, 2);
    memcpy(out + 2, PyUnicode_DATA(shown), shown_size);
    out += 2 + shown_size;
    if (tail_size) {
        memcpy(out, tail, tail_size);
        out += tail_size;
    }
    *out = '\n';
    if ((stderr_on && stderr_write(self, stderr_channel, text, size) < 0) ||
        (feed_on && feed_write(feed, text, size) < 0) || (log_on && log_write(self, log, text, size) < 0)) {
        goto done;
    }
    result = 1;
done:
    if (text != small) {
        PyMem_Free(text);
    }
    Py_XDECREF(value);
    Py_XDECREF(loud);
    Py_XDECREF(log);
    Py_XDECREF(feed);
    Py_XDECREF(stderr_channel);
    return result;
}

/* -- the hook -------------------------------------------------------------------------------- */
static PyObject *call_original(Hook *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    return PyObject_Vectorcall(self->original, args, nargsf, kwnames);
}

/* A thread's first step: its chain, its kernel id, a look at our descriptors, and the watchdog told. */
static PyObject *first_stack(Hook *self, PyObject *key) {
    PyObject *stack = PyList_New(0);
    if (stack == NULL || PyDict_SetItem(self->stacks, key, stack) < 0) {
        Py_XDECREF(stack);
        return NULL;
    }
    PyObject *native = PyLong_FromUnsignedLong(PyThread_get_thread_native_id());
    int failed = native == NULL || PyDict_SetItem(self->native_ids, key, native) < 0;
    Py_XDECREF(native);
    PyObject *result = failed ? NULL : PyObject_CallMethodNoArgs(self->sink, s_check_descriptors);
    if (result == NULL) {
        Py_DECREF(stack);
        return NULL;
    }
    Py_DECREF(result);
    PyObject *on_deadline = PyObject_GetAttr(self->tracer, s_on_deadline);
    if (on_deadline == NULL) {
        Py_DECREF(stack);
        return NULL;
    }
    if (on_deadline != Py_None) {
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

/* The fields of a JSON log's line, made only when the sink writes them (sink.structured). */
static int structured(Hook *self) {
    PyObject *value = PyObject_GetAttr(self->sink, s_structured);
    if (value == NULL) {
        return -1;
    }
    int truth = PyObject_IsTrue(value);
    Py_DECREF(value);
    return truth;
}

/* FRAME out of STACK, by identity, wherever it is (a re-entrant import or a fork may have moved it). */
static int take_out(PyObject *stack, PyObject *frame) {
    for (Py_ssize_t i = PyList_GET_SIZE(stack) - 1; i >= 0; i--) {
        if (PyList_GET_ITEM(stack, i) == frame) {
            return PyList_SetSlice(stack, i, i + 1, NULL);
        }
    }
    return 0;
}

/* The end of the import: its line (the failure's through sink.event), then on_progress when due. */
static int end_line(Hook *self, PyObject *name, PyObject *parent, PyObject *shown, Py_ssize_t depth,
                    double ms, PyObject *now, PyObject *failure) {
    PyObject *ms_value = PyFloat_FromDouble(ms), *fields = NULL, *text = NULL, *result = NULL;
    if (ms_value == NULL) {
        return -1;
    }
    if (failure == NULL) {
        int wanted = structured(self);
        if (wanted < 0) {
            goto done;
        }
        if (wanted) {
            fields = Py_BuildValue("{OOOOOO}", s_name, name, s_parent, parent, s_ms, ms_value);
            if (fields == NULL) {
                goto done;
            }
        }
        char *digits = PyOS_double_to_string(ms, 'f', 3, 0, NULL); /* as f"{ms:.3f}" */
        if (digits == NULL) {
            goto done;
        }
        char tail[64];
        PyOS_snprintf(tail, sizeof tail, " %s ms", digits);
        PyMem_Free(digits);
        int fast = wanted ? 0 : fast_emit(self, s_import_end, depth, "< ", shown, tail);
        if (fast < 0) {
            goto done;
        }
        if (fast > 0) {
            result = Py_None;
            Py_INCREF(result);
        } else {
            text = line(depth, "< ", shown, tail);
            if (text == NULL) {
                goto done;
            }
            PyObject *args[3] = {s_import_end, text, fields ? fields : Py_None};
            result = PyObject_Vectorcall(self->emit, args, 3, NULL);
        }
    } else {
        fields = Py_BuildValue("{OOOOOOOO}", s_name, name, s_parent, parent, s_ms, ms_value, s_error, failure);
        if (fields == NULL) {
            goto done;
        }
        PyObject *level = PyLong_FromSsize_t(depth);
        if (level == NULL) {
            goto done;
        }
        result = PyObject_CallMethodObjArgs(self->sink, s_event, s_import_end, fields, level, NULL);
        Py_DECREF(level);
    }
    if (result == NULL) {
        goto done;
    }
    Py_CLEAR(result);
    PyObject *due = PyObject_GetAttr(self->tracer, s_progress_due);
    int late = due == NULL ? -1 : PyObject_RichCompareBool(now, due, Py_GE);
    Py_XDECREF(due);
    if (late <= 0) {
        result = late < 0 ? NULL : Py_None;
        Py_XINCREF(result);
        goto done;
    }
    PyObject *on_progress = PyObject_GetAttr(self->tracer, s_on_progress);
    if (on_progress == NULL) {
        goto done;
    }
    if (on_progress == Py_None) {
        result = on_progress;
    } else {
        result = PyObject_CallFunctionObjArgs(on_progress, now, failure ? failure : Py_None, NULL);
        Py_DECREF(on_progress);
    }
done:
    Py_DECREF(ms_value);
    Py_XDECREF(fields);
    Py_XDECREF(text);
    if (result == NULL) {
        return -1;
    }
    Py_DECREF(result);
    return 0;
}

/* A BaseException of ours propagates in place of the import's outcome; the import's own error, if
   any, becomes its __context__, as Python's implicit chaining would make it. */
static void chain(Saved *import_error) {
    if (import_error->value == NULL) {
        return;
    }
    Saved ours;
    save_error(&ours);
    if (ours.value != NULL && ours.value != import_error->value) {
        PyObject *context = PyException_GetContext(ours.value); /* a new reference */
        if (context == NULL) {
            PyException_SetContext(ours.value, import_error->value); /* steals the reference */
            import_error->value = NULL;
        }
        Py_XDECREF(context);
    }
    drop_error(import_error);
    restore_error(&ours);
}

static PyObject *hook_call(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Hook *self = (Hook *)callable;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs != 2 || kwnames != NULL || !PyUnicode_Check(args[0])) {
        return call_original(self, args, nargsf, kwnames); /* not a call the import machinery makes */
    }
    PyObject *name = args[0];
    PyObject *modules = PySys_GetObject("modules"); /* borrowed */
    if (modules == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "lost sys.modules");
        return NULL;
    }
    int loaded = PySequence_Contains(modules, name);
    if (loaded != 0) { /* importlib.import_module of a loaded module, or a lock wait */
        return loaded < 0 ? NULL : call_original(self, args, nargsf, NULL);
    }
    PyObject *shown = shown_name(self, name);
    if (shown == NULL) {
        return NULL;
    }
    PyObject *hook = PyDict_GetItemWithError(self->on_start, name);
    if (hook != NULL) { /* before the stack is taken: it may import; True leaves this import out */
        Py_INCREF(hook);
        PyObject *answer = PyObject_CallMethodObjArgs(self->tracer, s_safely, hook, name, NULL);
        Py_DECREF(hook);
        if (answer == NULL) {
            Py_DECREF(shown);
            return NULL;
        }
        int skip = answer == Py_True;
        Py_DECREF(answer);
        if (skip) {
            Py_DECREF(shown);
            return call_original(self, args, nargsf, NULL);
        }
    } else if (PyErr_Occurred()) {
        Py_DECREF(shown);
        return NULL;
    }

    PyObject *key = PyLong_FromUnsignedLong(PyThread_get_thread_ident());
    PyObject *stack = NULL, *parent = NULL, *start = NULL, *frame = NULL, *module = NULL, *failure = NULL;
    Saved import_error = {NULL, NULL, NULL};
    if (key == NULL) {
        goto fail;
    }
    stack = PyDict_GetItemWithError(self->stacks, key);
    if (stack != NULL) {
        Py_INCREF(stack);
    } else if (PyErr_Occurred() || (stack = first_stack(self, key)) == NULL) {
        goto fail;
    }
    if (!PyList_Check(stack)) {
        PyErr_SetString(PyExc_TypeError, "a thread's chain is not a list");
        goto fail;
    }
    Py_ssize_t depth = PyList_GET_SIZE(stack);
    parent = depth ? PyObject_GetAttr(PyList_GET_ITEM(stack, depth - 1), s_name) : (Py_INCREF(Py_None), Py_None);
    if (parent == NULL || (start = PyObject_CallNoArgs(self->clock)) == NULL) {
        goto fail;
    }
    double started = PyFloat_AsDouble(start);
    if ((started == -1.0 && PyErr_Occurred()) || (frame = new_step(self, name, start)) == NULL ||
        PyList_Append(stack, frame) < 0) {
        goto fail;
    }

    /* From the push on: whatever fails, ours or the import, the step is popped and its end written. */
    {
        int wanted = structured(self), fast = 0;
        PyObject *fields = NULL, *text = NULL, *result = NULL;
        if (wanted == 0) { /* a text log or none: written here in the common case */
            fast = fast_emit(self, s_import, depth, "> ", shown, NULL);
            if (fast != 0) {
                result = fast > 0 ? Py_None : NULL;
                Py_XINCREF(result);
                wanted = -2; /* done, one way or the other */
            }
        }
        if (wanted > 0) {
            fields = Py_BuildValue("{OOOO}", s_name, name, s_parent, parent);
        }
        if (wanted >= 0 && (wanted == 0 || fields != NULL)) {
            text = line(depth, "> ", shown, NULL);
        }
        if (text != NULL) {
            PyObject *emit_args[3] = {s_import, text, fields ? fields : Py_None};
            result = PyObject_Vectorcall(self->emit, emit_args, 3, NULL);
        }
        Py_XDECREF(fields);
        Py_XDECREF(text);
        if (result != NULL) {
            Py_DECREF(result);
        } else if (said(self) < 0) { /* a KeyboardInterrupt: the import ends with it, never started */
            goto ended;
        }
    }
    module = call_original(self, args, nargsf, NULL);

ended:
    if (module == NULL) {
        save_error(&import_error);
        failure = import_error.value ? failure_text(import_error.value) : NULL;
        if (failure == NULL) {
            PyErr_Clear();
            failure = PyUnicode_FromString("BaseException: ?");
        }
    }
    /* Our own frame, by identity, and the thread's entry only while it is still this list. */
    {
        int ours_failed = 0;
        Py_ssize_t size = PyList_GET_SIZE(stack);
        if (size && PyList_GET_ITEM(stack, size - 1) == frame) {
            ours_failed = PyList_SetSlice(stack, size - 1, size, NULL) < 0;
        } else {
            ours_failed = take_out(stack, frame) < 0;
        }
        PyObject *now = ours_failed ? NULL : PyObject_CallNoArgs(self->clock);
        double ended_at = now ? PyFloat_AsDouble(now) : -1.0;
        if (now != NULL && !PyErr_Occurred()) {
            size = PyList_GET_SIZE(stack);
            if (size) {
                ours_failed = PyObject_SetAttr(PyList_GET_ITEM(stack, size - 1), s_progress, now) < 0;
            } else {
                PyObject *current = PyDict_GetItemWithError(self->stacks, key);
                if (current == stack) {
                    ours_failed = PyDict_DelItem(self->stacks, key) < 0;
                }
            }
            if (!ours_failed && !PyErr_Occurred()) {
                ours_failed = end_line(self, name, parent, shown, depth, (ended_at - started) * 1000.0, now,
                                       module == NULL ? failure : NULL) < 0;
            }
        }
        Py_XDECREF(now);
        if (PyErr_Occurred() && said(self) < 0) { /* a BaseException of ours wins, chained */
            chain(&import_error);
            Py_CLEAR(module);
            goto done;
        }
    }
    if (module == NULL) {
        restore_error(&import_error);
        goto done;
    }
    hook = PyDict_GetItemWithError(self->on_end, name);
    if (hook != NULL) {
        Py_INCREF(hook);
        PyObject *answer = PyObject_CallMethodObjArgs(self->tracer, s_safely, hook, module, NULL);
        Py_DECREF(hook);
        if (answer == NULL) {
            Py_CLEAR(module);
        }
        Py_XDECREF(answer);
    } else if (PyErr_Occurred()) {
        Py_CLEAR(module);
    }
    goto done;

fail: /* before the push: the exception propagates, as the closure's would */
    Py_CLEAR(module);
done:
    Py_DECREF(shown);
    Py_XDECREF(key);
    Py_XDECREF(stack);
    Py_XDECREF(parent);
    Py_XDECREF(start);
    Py_XDECREF(frame);
    Py_XDECREF(failure);
    return module;
}

/* -- the type -------------------------------------------------------------------------------- */
static int hook_traverse(Hook *self, visitproc visit, void *arg) {
    Py_VISIT(self->original);
    Py_VISIT(self->tracer);
    Py_VISIT(self->stacks);
    Py_VISIT(self->native_ids);
    Py_VISIT(self->on_start);
    Py_VISIT(self->on_end);
    Py_VISIT(self->sink);
    Py_VISIT(self->emit);
    Py_VISIT(self->clock);
    Py_VISIT(self->step_type);
    Py_VISIT(self->escape);
    for (int i = 0; i < SLOTS; i++) {
        Py_VISIT(self->slots[i]);
    }
    return 0;
}

static int hook_clear(Hook *self) {
    Py_CLEAR(self->original);
    Py_CLEAR(self->tracer);
    Py_CLEAR(self->stacks);
    Py_CLEAR(self->native_ids);
    Py_CLEAR(self->on_start);
    Py_CLEAR(self->on_end);
    Py_CLEAR(self->sink);
    Py_CLEAR(self->emit);
    Py_CLEAR(self->clock);
    Py_CLEAR(self->step_type);
    Py_CLEAR(self->escape);
    for (int i = 0; i < SLOTS; i++) {
        Py_CLEAR(self->slots[i]);
    }
    return 0;
}

static void hook_dealloc(Hook *self) {
    PyObject_GC_UnTrack(self);
    hook_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *hook_repr(Hook *self) {
    return PyUnicode_FromFormat("<importwatch's _find_and_load around %R>", self->original);
}

static PyTypeObject HookType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "importwatch.tracing._speedups.FindAndLoad",
    .tp_basicsize = sizeof(Hook),
    .tp_dealloc = (destructor)hook_dealloc,
    .tp_vectorcall_offset = offsetof(Hook, vectorcall),
    .tp_repr = (reprfunc)hook_repr,
    .tp_call = PyVectorcall_Call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "importlib's _find_and_load with importwatch's start and end lines (see hook.py).",
    .tp_traverse = (traverseproc)hook_traverse,
    .tp_clear = (inquiry)hook_clear,
};

/* find_and_load(original, tracer, sink, emit, clock, step_type, escape): the hook for TRACER. */
static PyObject *make_hook(PyObject *module, PyObject *args) {
    (void)module;
    PyObject *original, *tracer, *sink, *emit, *clock, *step_type, *escape;
    if (!PyArg_ParseTuple(args, "OOOOOO!O:find_and_load", &original, &tracer, &sink, &emit, &clock, &PyType_Type,
                          &step_type, &escape)) {
        return NULL;
    }
    Hook *self = PyObject_GC_New(Hook, &HookType);
    if (self == NULL) {
        return NULL;
    }
    self->vectorcall = hook_call;
    Py_INCREF(original);
    self->original = original;
    Py_INCREF(tracer);
    self->tracer = tracer;
    Py_INCREF(sink);
    self->sink = sink;
    Py_INCREF(emit);
    self->emit = emit;
    Py_INCREF(clock);
    self->clock = clock;
    Py_INCREF(step_type);
    self->step_type = step_type;
    Py_INCREF(escape);
    self->escape = escape;
    self->stacks = self->native_ids = self->on_start = self->on_end = NULL;
    for (int i = 0; i < SLOTS; i++) {
        self->slots[i] = NULL;
    }
    PyObject_GC_Track(self);
    if ((self->stacks = PyObject_GetAttrString(tracer, "stacks")) == NULL ||
        (self->native_ids = PyObject_GetAttrString(tracer, "native_ids")) == NULL ||
        (self->on_start = PyObject_GetAttrString(tracer, "on_start")) == NULL ||
        (self->on_end = PyObject_GetAttrString(tracer, "on_end")) == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    for (int i = 0; i < SLOTS; i++) {
        if ((self->slots[i] = PyObject_GetAttrString(step_type, slot_names[i])) == NULL) {
            Py_DECREF(self);
            return NULL;
        }
    }
    if (!PyDict_CheckExact(self->stacks) || !PyDict_CheckExact(self->native_ids) || !PyDict_Check(self->on_start) ||
        !PyDict_Check(self->on_end)) {
        PyErr_SetString(PyExc_TypeError, "the tracer's stacks, native_ids, on_start and on_end must be dicts");
        Py_DECREF(self);
        return NULL;
    }
    for (int i = 0; i < SLOTS; i++) { /* __slots__ members, set without __init__ */
        if (!PyObject_TypeCheck(self->slots[i], &PyMemberDescr_Type)) {
            PyErr_Format(PyExc_TypeError, "%R.%s is not a slot", step_type, slot_names[i]);
            Py_DECREF(self);
            return NULL;
        }
    }
    return (PyObject *)self;
}

static PyMethodDef methods[] = {
    {"find_and_load", make_hook, METH_VARARGS,
     "find_and_load(original, tracer, sink, emit, clock, step_type, escape): importlib's ORIGINAL "
     "_find_and_load, traced for TRACER as Tracer._make_find_and_load's closure does, with no frame."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_speedups", "importwatch's optional C accelerator for the per-import hook (hook.py).",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__speedups(void) {
    for (size_t i = 0; i < sizeof strings / sizeof strings[0]; i++) {
        if ((*strings[i].slot = PyUnicode_InternFromString(strings[i].text)) == NULL) {
            return NULL;
        }
    }
    if (PyType_Ready(&HookType) < 0) {
        return NULL;
    }
    return PyModule_Create(&module_def);
}
