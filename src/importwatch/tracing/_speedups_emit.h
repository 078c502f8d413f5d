/* Writing a line as Sink.emit does (sink.py), in the common case: the part of the C hook that
 * formats its two lines and writes each with one write(2) per channel.
 *
 * Included once by _speedups.c, after its Hook and its error helpers: one translation unit, so
 * every function here stays static. Not compiled on its own. */

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
    return slot_set(object, attribute, Py_True);
}

/* One write_once to the descriptor CHANNEL names (its `fd`): what write returned (-1 with errno set),
   or -2 with an exception (no fd to read, or a signal handler raised). */
static Py_ssize_t write_to(PyObject *channel, const char *data, size_t size) {
    long fd = as_long(slot_get(channel, s_fd));
    if (fd == -1 && PyErr_Occurred()) {
        return -2;
    }
    return write_once((int)fd, data, size);
}

/* Channel.write: all of DATA to CHANNEL unless it is broken; a failure breaks it. 0, or -1 with an
   exception (a signal handler's, or one of ours). */
static int channel_write(PyObject *channel, const char *data, size_t size) {
    int broken = as_truth(slot_get(channel, s_broken));
    long fd = broken ? -1 : as_long(slot_get(channel, s_fd));
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
    Py_ssize_t written = write_to(stderr_channel, text, size);
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

/* The log part of Sink.emit for a text log: a short write is a full disk; EBADF, a descriptor the
   program closed; any other failure breaks the log, said once. */
static int log_write(Hook *self, PyObject *log, const char *text, size_t size) {
    Py_ssize_t written = write_to(log, text, size);
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
        PyObject *name = slot_get(log, s_name);
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

/* An int as a long long; -1 with an exception when it is none or too large. A 64-bit long's conversion
   where there is one: PyLong_AsLongLong takes a slower road for a number of more than one digit. */
static long long as_wide(PyObject *value) {
#if LONG_MAX >= 0x7fffffffffffffffL
    return PyLong_AsLong(value);
#else
    return PyLong_AsLongLong(value);
#endif
}

/* A str of ASCII text joined from A and B (either may be NULL: empty), then THREE digits of MSEC's
   milliseconds when asked: a new reference, or NULL with an exception. */
static PyObject *joined(PyObject *a, const char *b, size_t b_size, int digits, long long msec) {
    Py_ssize_t a_size = a ? PyUnicode_GET_LENGTH(a) : 0;
    PyObject *text = PyUnicode_New(a_size + (Py_ssize_t)b_size + (digits ? 3 : 0), 127);
    if (text == NULL) {
        return NULL;
    }
    char *out = (char *)PyUnicode_DATA(text);
    if (a_size) {
        memcpy(out, PyUnicode_DATA(a), (size_t)a_size);
    }
    memcpy(out + a_size, b, b_size);
    if (digits) {
        int part = (int)(msec % 1000);
        out[a_size + b_size] = (char)('0' + part / 100);
        out[a_size + b_size + 1] = (char)('0' + part / 10 % 10);
        out[a_size + b_size + 2] = (char)('0' + part % 10);
    }
    return text;
}

static int is_ascii_str(PyObject *value) {
    return value != NULL && PyUnicode_CheckExact(value) && PyUnicode_IS_ASCII(value);
}

/* Sink._set_stamp(MSEC) (MSEC >= 0): within the second of the last stamp, done here as it does it,
   its HH:MM:SS. and the milliseconds; a new second is its own, for the strftime. 0, or -1 with an
   exception. */
static int new_stamp(Hook *self, long long msec) {
    PyObject *number = PyLong_FromLongLong(msec), *second = NULL, *clock = NULL, *head = NULL, *stamp = NULL,
             *prefix = NULL;
    int result = -1;
    if (number == NULL || (second = sink_get(self, s_second)) == NULL) {
        goto done;
    }
    long long last = PyLong_Check(second) ? as_wide(second) : -1;
    if (last == -1 && PyErr_Occurred()) {
        goto done;
    }
    if (last != msec / 1000 || (clock = sink_get(self, s_clock)) == NULL || !is_ascii_str(clock) ||
        (head = sink_get(self, s_head)) == NULL || !is_ascii_str(head)) {
        if (PyErr_Occurred()) {
            goto done;
        }
        PyObject *answer = PyObject_CallMethodOneArg(self->sink, s_set_stamp, number);
        result = answer == NULL ? -1 : 0;
        Py_XDECREF(answer);
        goto done;
    }
    if ((stamp = joined(clock, "", 0, 1, msec)) == NULL ||
        (prefix = joined(head, (const char *)PyUnicode_DATA(stamp), (size_t)PyUnicode_GET_LENGTH(stamp), 0, 0)) ==
            NULL) {
        goto done;
    }
    PyObject *ended = joined(prefix, "] ", 2, 0, 0);
    Py_SETREF(prefix, ended);
    if (prefix != NULL && sink_set(self, s_msec, number) == 0 && sink_set(self, s_stamp, stamp) == 0 &&
        sink_set(self, s_prefix, prefix) == 0) {
        result = 0;
    }
done:
    Py_XDECREF(number);
    Py_XDECREF(second);
    Py_XDECREF(clock);
    Py_XDECREF(head);
    Py_XDECREF(stamp);
    Py_XDECREF(prefix);
    return result;
}

/* Whether a line of KIND goes nowhere, Sink.emit's first test: --stderr stalls or none, no log, no
   watcher, and KIND not one for stderr. 1 or 0, or -1 with an exception. The hook asks before it
   formats an import's end line, which then costs no formatting at all. */
static int goes_nowhere(Hook *self, PyObject *kind) {
    PyObject *loud = sink_get(self, s_loud);
    if (loud == NULL) {
        return -1;
    }
    int result = 0;
    if (PyDict_Check(loud)) { /* None: every line goes to stderr */
        PyObject *log = sink_get(self, s_log);
        PyObject *feed = log == NULL ? NULL : sink_get(self, s_feed);
        if (feed == NULL) {
            result = -1;
        } else if (log == Py_None && feed == Py_None) {
            PyObject *answer = PyDict_GetItemWithError(loud, kind); /* not yet decided: emit decides */
            result = answer == NULL ? (PyErr_Occurred() ? -1 : 0) : answer == Py_False;
        }
        Py_XDECREF(log);
        Py_XDECREF(feed);
    }
    Py_DECREF(loud);
    return result;
}

/* Sink.emit(KIND, BODY) for one of the hook's lines, BODY being DEPTH indents, MARK, SHOWN and TAIL,
   formatted and written here when the case is the common one: the main thread, a text log or none, the
   program's last stderr line ended; the watcher's feed gets it in its ring (_speedups_ring.h). 1: written (or nowhere to go);
   0: not the common case, nothing done (Sink.emit does it); -1: an exception, as emit would raise. */
static int fast_emit(Hook *self, PyObject *kind, Py_ssize_t depth, const char *mark, PyObject *shown,
                     const char *tail) {
    PyObject *loud = NULL, *log = NULL, *feed = NULL, *stderr_channel = NULL, *value = NULL;
    int result = -1, loud_kind = 1, log_on = 0, feed_on = 0, stderr_on = 0;
    char small[512], *text = small;
    if (!PyUnicode_IS_ASCII(shown)) {
        return 0;
    }
    if ((loud = sink_get(self, s_loud)) == NULL || (log = sink_get(self, s_log)) == NULL ||
        (feed = sink_get(self, s_feed)) == NULL) {
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
    if ((stderr_channel = sink_get(self, s_stderr)) == NULL || (value = sink_get(self, s_main_thread)) == NULL ||
        ((main_thread = PyLong_AsUnsignedLong(value)) == (unsigned long)-1 && PyErr_Occurred())) {
        goto done;
    }
    Py_CLEAR(value);
    if (main_thread != PyThread_get_thread_ident()) {
        result = 0; /* another thread's name goes in its lines */
        goto done;
    }
    if (log != Py_None) {
        int broken = as_truth(slot_get(log, s_broken));
        int json = broken ? 0 : as_truth(slot_get(log, s_json));
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
        int closed = as_truth(slot_get(feed, s_closed));
        if (closed < 0) {
            goto done;
        }
        feed_on = !closed;
    }
    if (loud_kind) {
        int broken = as_truth(slot_get(stderr_channel, s_broken));
        int partial = broken ? 0 : as_truth(sink_get(self, s_partial));
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
    PyObject *clock = sink_get(self, s_now); /* time.time: read here as it reads it */
    double now = clock != NULL && is_time_builtin(clock, "time") ? seconds_of(CLOCK_REALTIME) : -1.0;
    if (clock != NULL && now < 0.0) {
        value = PyObject_CallNoArgs(clock);
        now = value == NULL ? -1.0 : PyFloat_AsDouble(value);
    }
    Py_XDECREF(clock);
    if (clock == NULL || (now == -1.0 && PyErr_Occurred())) {
        goto done;
    }
    Py_CLEAR(value);
    double scaled = now * 1000.0;
    if (!(scaled >= 0.0 && scaled < 9e18)) {
        result = 0; /* a clock no int() of ours should meet: emit's own */
        goto done;
    }
    long long msec = (long long)scaled, stamped; /* int(now * 1000) */
    if ((value = sink_get(self, s_msec)) == NULL || ((stamped = as_wide(value)) == -1 && PyErr_Occurred())) {
        goto done;
    }
    Py_CLEAR(value);
    if (stamped != msec && new_stamp(self, msec) < 0) {
        goto done;
    }
    if ((value = sink_get(self, s_prefix)) == NULL) {
        goto done;
    }
    size_t prefix_size = PyUnicode_Check(value) && PyUnicode_IS_ASCII(value) ? (size_t)PyUnicode_GET_LENGTH(value) : 0;
    size_t shown_size = (size_t)PyUnicode_GET_LENGTH(shown), tail_size = tail ? strlen(tail) : 0;
    size_t size = prefix_size + 2 * (size_t)depth + 2 + shown_size + tail_size + 1;
    if (prefix_size == 0 || (feed_on && size > FEED_LONGEST)) {
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
        (feed_on && ring_put(feed, text, size) < 0) || (log_on && log_write(self, log, text, size) < 0)) {
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
