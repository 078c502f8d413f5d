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

/* The route's stamp made for MSEC (>= 0), as Sink._set_stamp makes the sink's: within the second of the
   one kept, its three digits written here; a new second (or none kept) by _set_stamp itself, for its
   strftime, and read back (the set moves the sink's count). The sink's own stamp is left as it was where
   the digits are written here: emit makes its own when it next writes a line. 0, or -1 with an exception. */
static int new_stamp(Hook *self, long long msec) {
    Route *route = &self->route;
    if (route->prefix_size && route->msec >= 0 && route->msec / 1000 == msec / 1000) {
        char *digits = route->prefix + route->prefix_size - 5; /* "mmm] " */
        int part = (int)(msec % 1000);
        digits[0] = (char)('0' + part / 100);
        digits[1] = (char)('0' + part / 10 % 10);
        digits[2] = (char)('0' + part % 10);
        route->msec = msec;
        return 0;
    }
    PyObject *number = PyLong_FromLongLong(msec);
    PyObject *answer = number == NULL ? NULL : PyObject_CallMethodOneArg(self->sink, s_set_stamp, number);
    Py_XDECREF(number);
    Py_XDECREF(answer);
    route->kept = 0; /* read again: a sink that counts nothing has changed too */
    return answer == NULL || route_fresh(self) < 0 ? -1 : 0;
}

/* Sink.emit(KIND, BODY) for one of the hook's lines (END: 0 its start, 1 its end), BODY being DEPTH indents,
   MARK, SHOWN and TAIL, formatted and written here when the case is the common one: the main thread, a text
   log or none, the program's last stderr line ended; the watcher's feed gets it in its ring
   (_speedups_ring.h). What emit reads of the sink is the route (_speedups_route.h). 1: written (or nowhere
   to go); 0: not the common case, nothing done (Sink.emit does it); -1: an exception, as emit would raise. */
static int fast_emit(Hook *self, int end, Py_ssize_t depth, const char *mark, PyObject *shown, const char *tail) {
    Route *route = &self->route;
    if (route_fresh(self) < 0) {
        return -1;
    }
    int loud_kind = route->loud[end], log_on = 0, feed_on = 0, stderr_on = 0;
    if (loud_kind < 0) {
        return 0; /* a kind `_loud` has not answered yet: emit asks it */
    }
    if (route->nowhere[end]) {
        return 1; /* this line goes nowhere: Sink.emit's first test */
    }
    if (!PyUnicode_IS_ASCII(shown)) {
        return 0; /* escape() gives ASCII: a broken escape is emit's */
    }
    if (route->main_thread != PyThread_get_thread_ident()) {
        return 0; /* another thread's name goes in its lines */
    }
    /* Held to the end: a new stamp (Python's, for a new second) or a write's signal handler may change the
       sink, and the route with it; this line goes where the sink said when it began, as in emit. */
    PyObject *log = route->log, *feed = route->feed, *stderr_channel = route->stderr_channel, *value = NULL;
    Py_INCREF(log);
    Py_INCREF(feed);
    Py_INCREF(stderr_channel);
    int result = -1;
    char small[512], *text = small;
    if (log != Py_None) {
        int broken = as_truth(slot_get(log, s_broken));
        int json = broken ? 0 : as_truth(slot_get(log, s_json));
        if (broken < 0 || json < 0 || json) {
            result = json > 0 ? 0 : -1;
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
        if (broken < 0) {
            goto done;
        }
        if (!broken && route->partial) {
            result = 0; /* our line starts on a line of its own */
            goto done;
        }
        stderr_on = !broken;
    }

    /* The stamp, made anew by the sink (_set_stamp) once a millisecond; then the line. */
    double now = route->wall_builtin ? seconds_of(CLOCK_REALTIME) : -1.0; /* time.time: read here as it reads it */
    if (now < 0.0) {
        PyObject *wall = route->wall; /* held through the call: what it runs may read the route again */
        Py_INCREF(wall);
        value = PyObject_CallNoArgs(wall);
        Py_DECREF(wall);
        now = value == NULL ? -1.0 : PyFloat_AsDouble(value);
        Py_CLEAR(value);
        if (now == -1.0 && PyErr_Occurred()) {
            goto done;
        }
    }
    double scaled = now * 1000.0;
    if (!(scaled >= 0.0 && scaled < 9e18)) {
        result = 0; /* a clock no int() of ours should meet: emit's own */
        goto done;
    }
    long long msec = (long long)scaled; /* int(now * 1000) */
    if (route->msec != msec && new_stamp(self, msec) < 0) {
        goto done;
    }
    size_t prefix_size = route->msec == msec ? route->prefix_size : 0;
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
    memcpy(out, route->prefix, prefix_size);
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
    Py_XDECREF(log);
    Py_XDECREF(feed);
    Py_XDECREF(stderr_channel);
    return result;
}
