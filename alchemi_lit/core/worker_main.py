"""A worker of :mod:`~alchemi_lit.core.workers`, run as a script (``python
worker_main.py``): for each length-prefixed pickle ``(file, name, args)`` on stdin it
calls ``name(*args)`` of the module in ``file`` and answers ``(ok, value)`` in kind on
stdout.

It imports nothing of alchemi_lit (so no torch: a worker starts in the time numpy and
the called library take to import), and the called module must be standalone too.
What the called code prints goes to stderr (the protocol keeps stdout to itself), so a
chatty library cannot corrupt an answer.  The worker exits when stdin closes.
"""

from __future__ import annotations

import os
import sys

if sys.path and sys.path[0] == os.path.dirname(os.path.abspath(__file__)):
    del sys.path[0]  # this folder holds core/random.py, which would shadow the stdlib's

import importlib.util
import pickle
import struct
import traceback
from typing import Any

_modules: dict[str, Any] = {}


def load(path: str) -> Any:
    """The module in file ``path``, loaded once under a private name."""
    if path not in _modules:
        name = f"_alchemi_lit_worker_{len(_modules)}"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        sys.modules[name] = module
        spec.loader.exec_module(module)  # type: ignore[union-attr]
        _modules[path] = module
    return _modules[path]


def send(pipe: Any, message: Any) -> None:
    """One message: its pickle's length (8 bytes) then the pickle."""
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    pipe.write(struct.pack("<Q", len(data)))
    pipe.write(data)
    pipe.flush()


def receive(pipe: Any) -> Any:
    head = pipe.read(8)
    if len(head) < 8:
        raise EOFError("the other side closed its pipe")
    (size,) = struct.unpack("<Q", head)
    data = pipe.read(size)
    if len(data) < size:
        raise EOFError("the other side closed its pipe mid-message")
    return pickle.loads(data)


def main() -> None:
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # stray prints of the called code go to stderr
    sys.stdout = sys.stderr
    requests = sys.stdin.buffer
    while True:
        try:
            path, name, args = receive(requests)
        except EOFError:
            return
        try:
            ok, value = True, getattr(load(path), name)(*args)
        except Exception as exc:  # the exception travels, its traceback as text beside it
            ok, value = False, (exc, "".join(traceback.format_exception(exc)))
        try:
            send(answers, (ok, value))
        except Exception as exc:  # a result or an exception that cannot be pickled
            why = value[1] if not ok else f"the result of {name} cannot be pickled: {exc}"
            send(answers, (False, (None, why)))


if __name__ == "__main__":
    main()
