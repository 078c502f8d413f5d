/* The C hook's helpers: the import's exception kept across our own calls, the two lines' text,
 * the step objects the tracer's stacks hold, and a failure's words.
 *
 * Included once by _speedups.c, after its Hook: one translation unit, so every function here
 * stays static. Not compiled on its own. */

#include <float.h> /* LDBL_MANT_DIG */

/* -- exceptions, the same way on every version (PyErr_Fetch is deprecated from 3.12) ----------- */
typedef struct {
    PyObject *type, *value, *traceback;
} Saved;

RARE static void save_error(Saved *saved) {
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

RARE static void restore_error(Saved *saved) {
#if PY_VERSION_HEX >= 0x030C0000
    PyErr_SetRaisedException(saved->value);
#else
    PyErr_Restore(saved->type, saved->value, saved->traceback);
#endif
    saved->type = saved->value = saved->traceback = NULL;
}

RARE static void drop_error(Saved *saved) {
    Py_CLEAR(saved->type);
    Py_CLEAR(saved->value);
    Py_CLEAR(saved->traceback);
}

/* An exception of ours is set. An Exception is said through tracer.internal_error("writing a line", error)
   and cleared, as the closure's `except Exception` does (a failure to say it is dropped too): 0. Anything
   else (KeyboardInterrupt) stays set, to propagate as it would from the closure: -1. */
RARE static int said(Hook *self) {
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

/* TAIL, an end line's " 1.234 ms", as f" {ms:.3f} ms" makes it: 0, or -1 with an exception.

   That format rounds the double's exact value to three decimals, a tie to the even digit. Where a long
   double holds 64 bits of mantissa (x86), ms * 1000 is exact in one (53 bits times 10), so its fraction
   tells the rounding exactly, and the digits are written here; elsewhere, and for the odd value, Python's
   own conversion writes them. */
static int ms_tail(double ms, char tail[64]) {
#if LDBL_MANT_DIG >= 64
    if (ms >= 0.0 && ms < 1e12) {
        long double scaled = (long double)ms * 1000.0L;
        unsigned long long whole = (unsigned long long)scaled; /* below 2^50: exact */
        long double fraction = scaled - (long double)whole;
        whole += fraction > 0.5L || (fraction == 0.5L && (whole & 1));
        char digits[32], *out = digits + sizeof digits;
        for (int place = 0; place <= 3 || whole > 0; place++) {
            if (place == 3) {
                *--out = '.';
            }
            *--out = (char)('0' + whole % 10);
            whole /= 10;
        }
        size_t size = (size_t)(digits + sizeof digits - out);
        tail[0] = ' ';
        memcpy(tail + 1, out, size);
        memcpy(tail + 1 + size, " ms", 4); /* with its NUL */
        return 0;
    }
#endif
    char *digits = PyOS_double_to_string(ms, 'f', 3, 0, NULL);
    if (digits == NULL) {
        return -1;
    }
    PyOS_snprintf(tail, 64, " %s ms", digits);
    PyMem_Free(digits);
    return 0;
}

/* duration_text(ms): ms_tail's text, so that a test can hold it to Python's own format. */
static PyObject *duration_text(PyObject *module, PyObject *value) {
    (void)module;
    double ms = PyFloat_AsDouble(value);
    char tail[64];
    if ((ms == -1.0 && PyErr_Occurred()) || ms_tail(ms, tail) < 0) {
        return NULL;
    }
    return PyUnicode_FromString(tail);
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

/* A new TracedStep for an import: the closure's TracedStep(name, start), without running __init__. The
   last one ended that nothing but the hook held is used again (see keep_spare): no allocation. */
static PyObject *new_step(Hook *self, PyObject *name, PyObject *start) {
    PyTypeObject *type = (PyTypeObject *)self->step_type;
    PyObject *step = self->spare;
    self->spare = NULL;
    if (step == NULL && (step = type->tp_alloc(type, 0)) == NULL) {
        return NULL;
    }
    PyObject *values[SLOTS] = {name, s_import, start, start, Py_None, Py_None};
    for (int i = 0; i < SLOTS; i++) {
        Py_ssize_t offset = self->slot_offsets[i];
        if (offset >= 0) { /* an object slot: member_set's store, at the offset read once (make_hook) */
            PyObject **address = (PyObject **)((char *)step + offset);
            Py_INCREF(values[i]);
            Py_XSETREF(*address, values[i]);
        } else if (Py_TYPE(self->slots[i])->tp_descr_set(self->slots[i], step, values[i]) < 0) {
            Py_DECREF(step);
            return NULL;
        }
    }
    return step;
}

/* Where STEP's slot INDEX (SLOT_NAME...) is when STEP is a TracedStep itself and the slot an object slot,
   at the offset the hook read once from its member descriptor: no type lookup. NULL otherwise (getattr's way). */
static PyObject **step_slot(Hook *self, PyObject *step, int index) {
    Py_ssize_t offset = self->slot_offsets[index];
    if (Py_TYPE(step) != (PyTypeObject *)self->step_type || offset < 0) {
        return NULL;
    }
    return (PyObject **)((char *)step + offset);
}

/* STEP.name (a new reference), as slot_get reads it. */
static PyObject *step_name(Hook *self, PyObject *step) {
    PyObject **address = step_slot(self, step, SLOT_NAME);
    if (address != NULL && *address != NULL) {
        Py_INCREF(*address);
        return *address;
    }
    return slot_get(step, s_name);
}

/* STEP.progress = VALUE, as slot_set stores it: 0, or -1 with an exception. */
static int set_progress(Hook *self, PyObject *step, PyObject *value) {
    PyObject **address = step_slot(self, step, SLOT_PROGRESS);
    if (address == NULL) {
        return slot_set(step, s_progress, value);
    }
    Py_INCREF(value);
    Py_XSETREF(*address, value);
    return 0;
}

/* This thread's ident as an int (a new reference), made again only when another thread imports. */
static PyObject *thread_key(Hook *self) {
    unsigned long ident = PyThread_get_thread_ident();
    if (self->key == NULL || PyLong_AsUnsignedLong(self->key) != ident) {
        Py_XSETREF(self->key, PyLong_FromUnsignedLong(ident));
    }
    Py_XINCREF(self->key);
    return self->key;
}

/* The hook's last reference to an ended STEP: kept for the next new_step when nothing else holds it
   (nobody can tell it from a new one then), dropped otherwise. */
static void keep_spare(Hook *self, PyObject *step) {
    if (step != NULL && self->spare == NULL && Py_REFCNT(step) == 1 && Py_TYPE(step) == (PyTypeObject *)self->step_type) {
        self->spare = step;
    } else {
        Py_XDECREF(step);
    }
}

/* "TypeName: message", as the closure's f"{type(error).__name__}: {error}". */
RARE static PyObject *failure_text(PyObject *error) {
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
