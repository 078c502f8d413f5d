"""`python -m importwatch`: the command line; the program then runs from this module's own frame.

Run here at module level rather than in a function, the program has below its
first frame only what `python -m runpy` puts there: runpy's two frames and this one.
"""

from importwatch.tracing import handback

handback.mark()  # what runpy and the interpreter loaded is not ours (see tracing/handback.py)
from importwatch.tracing import runner  # noqa: E402

# python -m put the working folder first on sys.path: off it goes before our own imports (a json.py
# there must not replace ours); the program still gets exactly its own sys.path[0] (runner.launch).
_path0_taken = runner.take_path0()
from importwatch import cli  # noqa: E402

_launch = cli.prepare(path0_taken=_path0_taken)
if not isinstance(_launch, runner.Launch):
    raise SystemExit(_launch)
# runner.execute's lines, inline rather than called: a call would add its frame below the
# program's first frame (see the docstring). Change both alike.
try:
    if _launch.code is None:
        _launch.run_module(_launch.module, _launch.alter_argv)
    else:
        exec(_launch.code, _launch.namespace)
except SystemExit:
    raise
except BaseException as _error:
    runner.report_uncaught(_error)
