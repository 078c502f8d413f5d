"""`python -m importwatch`: the command line (cli.py), which execs the program's python or runs it here."""

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
runner.execute(_launch)
