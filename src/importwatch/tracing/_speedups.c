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
   of them runs while the module body does, and the program's trace and profile
   functions see none of them (_speedups_untraced.h). */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <stddef.h>
#include <string.h>
#include <unistd.h>

/* Paths an import rarely takes (errors, a thread's first step, reading the sink's route again): compiled out
   of line, so that the common path's code stays on as few cache lines as can be. Each import's own work
   evicts the hook's code between two calls: what it costs is mostly those misses, not its instructions. */
#if defined(__GNUC__)
#define RARE __attribute__((cold, noinline))
#else
#define RARE
#endif

#ifndef Py_TPFLAGS_HAVE_VECTORCALL
#define Py_TPFLAGS_HAVE_VECTORCALL _Py_TPFLAGS_HAVE_VECTORCALL /* 3.9 to 3.11 */
#endif

/* Strings made once: attribute names, the kinds of the two lines, the dictionaries' keys. */
static PyObject *s_import, *s_import_end, *s_structured, *s_progress_due, *s_on_progress, *s_on_deadline,
    *s_check_descriptors, *s_safely, *s_internal_error, *s_event, *s_name, *s_parent, *s_ms, *s_error,
    *s_writing_a_line, *s_dunder_name, *s_progress, *s_loud, *s_log, *s_feed, *s_stderr, *s_partial,
    *s_main_thread, *s_msec, *s_prefix, *s_now, *s_set_stamp, *s_json, *s_broken, *s_closed, *s_ring, *s_mapping,
    *s_fd, *s_modules, *s_stderr_again, *s_log_lost, *s_warn, *s_guards, *s_cover, *s_dot;

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
    {&s_ring, "ring"}, {&s_mapping, "mapping"}, {&s_fd, "fd"}, {&s_modules, "modules"},
    {&s_stderr_again, "_stderr_again"}, {&s_log_lost, "_log_lost"}, {&s_warn, "warn"}, {&s_guards, "guards"},
    {&s_cover, "cover"}, {&s_dot, "."},
};

/* The sys module, held from the first hook made: sys.modules is read from it at each import (an attribute
   lookup with an interned name, where PySys_GetObject makes its key anew each time). */
static PyObject *the_sys;

/* The six slots of a TracedStep, set through their member descriptors: no __init__ runs. */
enum { SLOT_NAME, SLOT_KIND, SLOT_START, SLOT_PROGRESS, SLOT_TIMEOUT, SLOT_CONTEXT, SLOTS };
static const char *const slot_names[SLOTS] = {"name", "kind", "start", "progress", "timeout", "context"};

/* The sink as Sink.emit reads it for the hook's lines (_speedups_route.h: route_read). */
typedef struct {
    unsigned long long at; /* the sink's count when read: kept while it stays (kept) */
    int kept, structured, partial, wall_builtin;
    signed char loud[2], nowhere[2]; /* the start and end lines: to stderr, nowhere (1, 0; -1 not known) */
    PyObject *log, *feed, *stderr_channel, *wall; /* held: log, feed, stderr, _now */
    unsigned long main_thread;
    long long msec;     /* the millisecond of prefix's stamp: the sink's _msec, or newer (new_stamp) */
    char prefix[128];   /* the sink's _prefix ("[importwatch PID HH:MM:SS.mmm] "), its digits kept here */
    size_t prefix_size; /* 0: none usable, emit writes the line */
} Route;

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
    Py_ssize_t slot_offsets[SLOTS]; /* where each slot is in a step, or -1: not a plain object slot */
    int monotonic;         /* clock is time.monotonic itself: read here (clock_now) */
    PyObject *sink_dict;   /* the sink's __dict__, or NULL: see _speedups_attrs.h */
    PyObject *tracer_dict; /* the tracer's */
    int counted;           /* the sink is a Counted: the route read from it is kept (_speedups_route.h) */
    Route route;           /* what Sink.emit would read of the sink for the two lines, as read at route.at */
    PyObject *spare; /* an ended step nothing else holds, for the next import (new_step), or NULL */
    PyObject *key;   /* the last thread's ident as an int, the key of its chain in stacks, or NULL */
    PyObject *weakrefs; /* a function can be referred to weakly: so can what stands in its place */
} Hook;

static int counted_setattro(PyObject *object, PyObject *name, PyObject *value); /* _speedups_route.h */
#include "_speedups_attrs.h" /* the attributes read per import, read the short way */
#include "_speedups_clocks.h" /* time.monotonic and time.time, read in C */
#include "_speedups_route.h" /* where the lines go, read once per change of the sink */
#include "_speedups_lines.h" /* the import's error kept, the lines' text, new steps */
#include "_speedups_ring.h" /* the watcher's feed: its shared memory, and ring_put */
#include "_speedups_emit.h" /* fast_emit: the lines, written as Sink.emit would */
#include "_speedups_end.h" /* end_line: the import's end line, and progress told */
#include "_speedups_guards.h" /* guards_hold: our descriptors, looked at without the sink's check */
#include "_speedups_spawn.h" /* spawn_detached: the watcher started by a thread of ours, without a copy of the program */
#include "_speedups_cover.h" /* deadline_covered: a thread's first step within tracer.cover calls nothing */
#include "_speedups_untraced.h" /* our Python code unseen by the program's trace and profile functions */
#include "_speedups_stand_in.h" /* what the hook and a Door show of the function they stand for */
#include "_speedups_door.h" /* Door: doors.py's wrappers, no frame of theirs while the function runs */
#include "_speedups_follow.h" /* Follower: sys.stderr's write and flush, the sink's note of unended lines */
#include "_speedups_elf.h" /* read_dynamic and the loader's list: a native load's facts, read in C */
#include "_speedups_keep.h" /* keep_to_the_end: our functions out of the collector's passes at exit */
#include "_speedups_limits.h" /* open_files_limit: where our descriptors may be placed */
#include "_speedups_chain.h" /* a thread's chain: its first step, a step taken out */

/* -- the hook -------------------------------------------------------------------------------- */
static PyObject *hook_steps(Hook *self, PyThreadState *tstate, PyObject *const *args, size_t nargsf);

static PyObject *hook_call(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Hook *self = (Hook *)callable;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs != 2 || kwnames != NULL || !PyUnicode_Check(args[0])) {
        return PyObject_Vectorcall(self->original, args, nargsf, kwnames); /* not a call the import machinery makes */
    }
    PyObject *modules = sys_modules(the_sys); /* as the closure reads it, at each import */
    if (modules == NULL) {
        return NULL;
    }
    int loaded = PySequence_Contains(modules, args[0]);
    Py_DECREF(modules);
    if (loaded != 0) { /* importlib.import_module of a loaded module, or a lock wait */
        return loaded < 0 ? NULL : PyObject_Vectorcall(self->original, args, nargsf, NULL);
    }
    /* Ours, unseen by the program's trace functions, all but the import itself (_speedups_untraced.h). */
    PyThreadState *tstate = PyThreadState_Get();
    untraced_enter(tstate);
    PyObject *module = hook_steps(self, tstate, args, nargsf);
    untraced_leave(tstate);
    return module;
}

/* The import of ARGS[0], not loaded: its step pushed, its lines, the original called, its step popped. */
static PyObject *hook_steps(Hook *self, PyThreadState *tstate, PyObject *const *args, size_t nargsf) {
    PyObject *name = args[0];
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
            return traced_call(tstate, self->original, args, nargsf, NULL);
        }
    } else if (PyErr_Occurred()) {
        Py_DECREF(shown);
        return NULL;
    }

    PyObject *key = thread_key(self);
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
    parent = depth ? step_name(self, PyList_GET_ITEM(stack, depth - 1)) : (Py_INCREF(Py_None), Py_None);
    if (parent == NULL || (start = clock_now(self)) == NULL) {
        goto fail;
    }
    double started = PyFloat_AsDouble(start);
    if ((started == -1.0 && PyErr_Occurred()) || (frame = new_step(self, name, start)) == NULL ||
        PyList_Append(stack, frame) < 0) {
        goto fail;
    }

    /* From the push on: whatever fails, ours or the import, the step is popped and its end written. */
    {
        int wanted = route_structured(self), fast = 0;
        PyObject *fields = NULL, *text = NULL, *result = NULL;
        if (wanted == 0) { /* a text log or none: written here in the common case, or nowhere to go */
            fast = fast_emit(self, 0, depth, "> ", shown, NULL);
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
    module = traced_call(tstate, self->original, args, nargsf, NULL);

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
        if (size && PyList_GET_ITEM(stack, size - 1) == frame && PyList_CheckExact(stack)) {
            Py_SET_SIZE(stack, size - 1); /* list.pop()'s, less the shrink: the item is frame, still ours */
            Py_DECREF(frame);
        } else {
            ours_failed = take_out(stack, frame) < 0;
        }
        PyObject *now = ours_failed ? NULL : clock_now(self);
        double ended_at = now ? PyFloat_AsDouble(now) : -1.0;
        if (now != NULL && !PyErr_Occurred()) {
            size = PyList_GET_SIZE(stack);
            if (size) {
                ours_failed = set_progress(self, PyList_GET_ITEM(stack, size - 1), now) < 0;
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
    keep_spare(self, frame);
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
    Py_VISIT(self->sink_dict);
    Py_VISIT(self->tracer_dict);
    Py_VISIT(self->spare);
    Py_VISIT(self->route.log);
    Py_VISIT(self->route.feed);
    Py_VISIT(self->route.stderr_channel);
    Py_VISIT(self->route.wall);
    Py_VISIT(self->key);
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
    Py_CLEAR(self->sink_dict);
    Py_CLEAR(self->tracer_dict);
    Py_CLEAR(self->spare);
    route_drop(&self->route);
    Py_CLEAR(self->key);
    return 0;
}

static void hook_dealloc(Hook *self) {
    PyObject_GC_UnTrack(self);
    if (self->weakrefs != NULL) {
        PyObject_ClearWeakRefs((PyObject *)self);
    }
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
    .tp_getattro = stand_in_getattro, /* _speedups_stand_in.h: read, pickled and copied as _find_and_load */
    .tp_weaklistoffset = offsetof(Hook, weakrefs),
    .tp_descr_get = stand_in_get,
    .tp_getset = stand_in_getset,
    .tp_methods = stand_in_methods,
};

/* find_and_load(original, tracer, sink, emit, clock, step_type, escape): the hook for TRACER. */
static PyObject *make_hook(PyObject *module, PyObject *args) {
    (void)module;
    PyObject *original, *tracer, *sink, *emit, *clock, *step_type, *escape;
    if (!PyArg_ParseTuple(args, "OOOOOO!O:find_and_load", &original, &tracer, &sink, &emit, &clock, &PyType_Type,
                          &step_type, &escape)) {
        return NULL;
    }
    if (the_sys == NULL && (the_sys = PyImport_ImportModule("sys")) == NULL) {
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
    self->monotonic = is_time_builtin(clock, "monotonic");
    self->counted = PyObject_TypeCheck(sink, &CountedType);
    memset(&self->route, 0, sizeof self->route);
    self->spare = self->key = self->weakrefs = NULL;
    Py_INCREF(step_type);
    self->step_type = step_type;
    Py_INCREF(escape);
    self->escape = escape;
    self->stacks = self->native_ids = self->on_start = self->on_end = self->sink_dict = self->tracer_dict = NULL;
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
    /* The names read through the held dictionaries: a property of one of them would make getattr differ. */
    static PyObject **const sink_names[] = {&s_structured, &s_loud, &s_log, &s_feed, &s_stderr, &s_partial,
                                            &s_main_thread, &s_now, &s_msec, &s_prefix, &s_guards};
    static PyObject **const tracer_names[] = {&s_progress_due, &s_on_progress, &s_on_deadline, &s_cover};
    self->sink_dict = held_dict(sink, sink_names, sizeof sink_names / sizeof sink_names[0]);
    self->tracer_dict = held_dict(tracer, tracer_names, sizeof tracer_names / sizeof tracer_names[0]);
    if (PyErr_Occurred()) {
        Py_DECREF(self);
        return NULL;
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
        PyMemberDef *member = ((PyMemberDescrObject *)self->slots[i])->d_member;
        self->slot_offsets[i] = member->type == T_OBJECT_EX && member->flags == 0 ? member->offset : -1;
    }
    return (PyObject *)self;
}

static PyMethodDef methods[] = {
    {"find_and_load", make_hook, METH_VARARGS,
     "find_and_load(original, tracer, sink, emit, clock, step_type, escape): importlib's ORIGINAL "
     "_find_and_load, traced for TRACER as Tracer._make_find_and_load's closure does, with no frame."},
    {"spawn_detached", spawn_detached, METH_VARARGS,
     "spawn_detached(executable, argv, env, stderr_fd, keep, close): the watcher started by a thread of ours, "
     "orphaned at once, without a copy of this process (watcher_launch.launch); returns at once."},
    {"spawn_started", spawn_started, METH_O,
     "spawn_started(wait): the watcher's pid once spawn_detached has started it, None while it is under way "
     "(after waiting up to WAIT seconds); OSError where it failed."},
    {"child_subreaper", child_subreaper, METH_NOARGS, "child_subreaper(): whether this process adopts orphans."},
    {"follow", make_followers, METH_VARARGS,
     "follow(write, flush, sink, through, by_line): sys.stderr's WRITE and FLUSH with SINK's note of a line "
     "left unended after each, and no frame of their own (Sink.follow_partial_lines)."},
    {"door", make_door, METH_VARARGS,
     "door(original, enter, leave, stacks, binds=True, chooses=False): ORIGINAL with ENTER and LEAVE around it "
     "and no frame of its own while it runs (hook.door); STACKS, the tracer's, for a loader's exec_module, else "
     "None; where CHOOSES, ENTER returns (token, the function of ours to call in ORIGINAL's place)."},
    {"lock_if_ours", lock_if_ours, METH_VARARGS,
     "lock_if_ours(fd, device, inode): flock(fd, LOCK_EX | LOCK_NB) where fd still refers to that device and "
     "inode; True once taken, False while another process holds it, None where fd is no longer that."},
    {"duration_text", duration_text, METH_O,
     "duration_text(ms): an end line's tail, as the hook writes it (f\" {ms:.3f} ms\"): for the twins' test."},
    {"shared_memory", shared_memory, METH_VARARGS,
     "shared_memory(fd, size): SIZE bytes of FD mapped shared and writable, as a buffer (ring.create)."},
    ELF_METHODS KEEP_METHODS LIMITS_METHODS UNTRACED_METHODS{NULL, NULL, 0, NULL},
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
#if defined(__GNUC__)
    if (pthread_atfork(NULL, NULL, forget_tid) != 0) {
        return PyErr_NoMemory(); /* its one failure: ENOMEM */
    }
#endif
    /* Each stand-in's function where _speedups_stand_in.h reads it */
    Py_BUILD_ASSERT(offsetof(Hook, original) == offsetof(StandIn, original));
    Py_BUILD_ASSERT(offsetof(Door, original) == offsetof(StandIn, original));
    Py_BUILD_ASSERT(offsetof(Follower, original) == offsetof(StandIn, original));
    if (PyType_Ready(&HookType) < 0 || PyType_Ready(&SharedMemoryType) < 0 || PyType_Ready(&CountedType) < 0 ||
        PyType_Ready(&DoorType) < 0 || PyType_Ready(&BuiltinDoorType) < 0 || PyType_Ready(&FollowerType) < 0) {
        return NULL;
    }
    PyObject *module = PyModule_Create(&module_def);
    Py_INCREF(&CountedType);
    if (module != NULL && PyModule_AddObject(module, "Counted", (PyObject *)&CountedType) < 0) {
        Py_DECREF(&CountedType);
        Py_CLEAR(module);
    }
    return module;
}
