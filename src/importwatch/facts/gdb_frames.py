"""Run inside gdb (`gdb -x` this file), never imported by importwatch: print every Python thread's frames.

It walks the thread states from _PyRuntime through the debug information of
libpython (3.9 to 3.13 name their fields differently) and prints one line per
thread and per frame: the function, the file and, for importlib's lock and load
functions, the module name they were called with. The line markers are the ones
stacks.py parses (THREAD, FRAME, END there).
"""

import gdb

_THREAD, _FRAME, _END = "@@importwatch-thread", "@@importwatch-frame", "@@importwatch-end"
_NAMED = ("_find_and_load", "_find_and_load_unlocked", "_lock_unlock_module")
_MAX_FRAMES = 512


def _value(expression):
    try:
        return gdb.parse_and_eval(expression)
    except gdb.error:
        return None


def _text(obj):
    """An ASCII str object's text; '?' for another kind, None when it cannot be read."""
    try:
        if obj is None or int(obj) == 0:
            return None
        ascii_obj = obj.cast(gdb.lookup_type("PyASCIIObject").pointer())
        state = ascii_obj["state"]
        if not int(state["compact"]) or not int(state["ascii"]):
            return "?"
        data = (ascii_obj + 1).cast(gdb.lookup_type("char").pointer())
        return data.string(length=min(int(ascii_obj["length"]), 1024))
    except (gdb.error, gdb.MemoryError):
        return None


def _field(value, *names):
    for name in names:
        try:
            return value[name]
        except gdb.error:
            continue
    return None


def _top_frame(tstate):
    """The innermost frame, and whether it is an _PyInterpreterFrame (3.11+) or a PyFrameObject."""
    cframe = _field(tstate, "cframe")  # 3.10 has one too, without current_frame
    frame = _field(cframe, "current_frame") if cframe is not None else None
    if frame is not None:
        return frame, True
    if _field(tstate, "current_frame") is not None:
        return tstate["current_frame"], True
    return tstate["frame"], False


def _frames(tstate):
    frame, new = _top_frame(tstate)
    code_type = gdb.lookup_type("PyCodeObject").pointer()
    count = 0
    while frame is not None and int(frame) != 0 and count < _MAX_FRAMES:
        count += 1
        try:
            if new:
                code = _field(frame, "f_code", "f_executable").cast(code_type)
                first, following = frame["localsplus"][0], frame["previous"]
            else:
                code, first, following = frame["f_code"], frame["f_localsplus"][0], frame["f_back"]
            name, filename = _text(code["co_name"]), _text(code["co_filename"])
            # The interpreter's own entry frames: a shim code object (3.12) or none at all (3.13).
            if filename not in (None, "<shim>"):
                argument = (_text(first) or "") if name in _NAMED else ""
                print(_FRAME, name, filename, argument, sep="\t")
        except (gdb.error, gdb.MemoryError):
            print(_FRAME, "?", "?", "", sep="\t")
            return
        frame = following


def _lwps():
    """Thread id (pthread_t, as Python's thread_id holds it) -> the LWP the kernel knows it by."""
    found = {}
    for thread in gdb.selected_inferior().threads():
        try:
            found[int.from_bytes(thread.handle(), "little")] = thread.ptid[1]
        except Exception:
            pass
    return found


def _main():
    lwps = _lwps()
    interpreter = _value("_PyRuntime.interpreters.head")
    if interpreter is None:
        raise RuntimeError("no debug symbols for _PyRuntime")
    while interpreter is not None and int(interpreter) != 0:
        threads = _field(interpreter, "threads")  # 3.11+; 3.9 and 3.10 have tstate_head
        tstate = threads["head"] if threads is not None else interpreter["tstate_head"]
        while int(tstate) != 0:
            print(_THREAD, lwps.get(int(tstate["thread_id"]), 0), sep="\t")
            _frames(tstate)
            tstate = tstate["next"]
        interpreter = interpreter["next"]


try:
    _main()
except Exception as error:
    print(_END, "error", str(error).replace("\n", " "), sep="\t")
else:
    print(_END, "ok", sep="\t")
