/* Part of _speedups.c: the end of an import, after the original _find_and_load has returned or
 * raised: its end line (a failure's through sink.event), the tracer told of progress when due, and
 * an exception of ours chained onto the import's own.
 *
 * Included once by _speedups.c, after _speedups_emit.h: one translation unit. Not compiled on its own. */

/* The end of the import: its line (the failure's through sink.event), then on_progress when due. */
static int end_line(Hook *self, PyObject *name, PyObject *parent, PyObject *shown, Py_ssize_t depth,
                    double ms, PyObject *now, PyObject *failure) {
    /* ms as a float for the fields of a JSON log's line or a failure's, made only for those */
    PyObject *ms_value = NULL, *fields = NULL, *text = NULL, *result = NULL;
    if (failure == NULL) {
        int wanted = route_structured(self); /* a JSON log: fields made only then */
        if (wanted < 0) {
            goto done;
        }
        if (wanted) {
            ms_value = PyFloat_FromDouble(ms);
            fields = ms_value == NULL ? NULL
                                      : Py_BuildValue("{OOOOOO}", s_name, name, s_parent, parent, s_ms, ms_value);
            if (fields == NULL) {
                goto done;
            }
        }
        int nowhere = wanted ? 0 : route_nowhere(self, 1); /* then not even formatted */
        char tail[64];
        if (nowhere < 0 || (!nowhere && ms_tail(ms, tail) < 0)) {
            goto done;
        }
        int fast = nowhere ? 1 : wanted ? 0 : fast_emit(self, 1, depth, "< ", shown, tail);
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
        ms_value = PyFloat_FromDouble(ms);
        fields = ms_value == NULL ? NULL
                                  : Py_BuildValue("{OOOOOOOO}", s_name, name, s_parent, parent, s_ms, ms_value,
                                                  s_error, failure);
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
    PyObject *due = tracer_get(self, s_progress_due); /* two floats, the common case: compared here */
    int late = due == NULL                                       ? -1
               : PyFloat_CheckExact(now) && PyFloat_CheckExact(due) ? PyFloat_AS_DOUBLE(now) >= PyFloat_AS_DOUBLE(due)
                                                                    : PyObject_RichCompareBool(now, due, Py_GE);
    Py_XDECREF(due);
    if (late <= 0) {
        result = late < 0 ? NULL : Py_None;
        Py_XINCREF(result);
        goto done;
    }
    PyObject *on_progress = tracer_get(self, s_on_progress);
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
    Py_XDECREF(ms_value);
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
RARE static void chain(Saved *import_error) {
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
