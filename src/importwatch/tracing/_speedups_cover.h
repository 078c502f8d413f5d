/* Part of _speedups.c: whether a thread's first step needs the watchdog's step_begins.
 *
 * A step that begins with nothing in flight on its thread calls tracer.on_deadline(None), so that the
 * watchdog covers it: its heartbeat may have left, or the deadline armed may be too late or too early
 * for this step, or the heartbeat may sleep past this step's threshold. In a run of top-level imports
 * (a script's, or importlib.import_module in a loop) that call almost always does nothing, and it is
 * a Python call: about 3,500 instructions, more than the rest of an import's tracing. The watchdog
 * publishes tracer.cover, the times between which it would do nothing (Watchdog._tell_due, after each
 * change of what step_begins reads), and the hook calls only outside them, as the closure does.
 *
 * Included once by _speedups.c, after _speedups_attrs.h and _speedups_clocks.h: one translation unit.
 * Not compiled on its own. */

/* Whether the call of on_deadline(None) may be left out now: tracer.cover is two floats, LOW and HIGH, and
   LOW <= now < HIGH on the hook's clock, time.monotonic (the watchdog's, read here). 1 or 0, no exception:
   anything else means the call, which is never wrong. */
static int deadline_covered(Hook *self) {
    if (!self->monotonic) {
        return 0;
    }
    PyObject *cover = tracer_get(self, s_cover);
    if (cover == NULL) {
        PyErr_Clear();
        return 0;
    }
    int covered = 0;
    if (PyTuple_CheckExact(cover) && PyTuple_GET_SIZE(cover) == 2 &&
        PyFloat_CheckExact(PyTuple_GET_ITEM(cover, 0)) && PyFloat_CheckExact(PyTuple_GET_ITEM(cover, 1))) {
        double now = seconds_of(CLOCK_MONOTONIC);
        covered = now >= 0.0 && PyFloat_AS_DOUBLE(PyTuple_GET_ITEM(cover, 0)) <= now &&
                  now < PyFloat_AS_DOUBLE(PyTuple_GET_ITEM(cover, 1));
    }
    Py_DECREF(cover);
    return covered;
}
