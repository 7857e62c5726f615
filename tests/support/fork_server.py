"""A process that has imported the heavy libraries a node needs (torch, transformers, sentence-transformers,
faiss, Flask) and forks node processes from itself on request: a node so started skips the ~4.5 s of CPU
those imports cost (tests start about sixty nodes on two cores). The node then runs its module as
`python -m <module>` would, in its own environment, working folder and log file.

Started and spoken to by tests/support/forked_nodes.py; one JSON line per message on stdin and stdout:
  in:  {"argv": ["-m", module, *args], "env": {...}, "cwd": ..., "log": path}
  out: {"pid": p}                 for each request, in order
       {"exited": n, "code": c}   when the child of request n (0, 1, ... in request order) exits
                                  (c as Popen.returncode: -signal when killed)
A child is named by its request's number, not its pid: the kernel gives a reaped child's pid to a later
process, and a long run forks enough to wrap it.
It exits when stdin closes (its parent died or let it go); its children then get SIGTERM
(PR_SET_PDEATHSIG), as nodes LocalCluster starts do when the launcher dies.

Single-threaded, so a fork never copies a lock another thread holds. Only third-party modules are
imported before forking; the project's own modules are imported fresh in each child, after its
environment is set. forked_nodes.py forks only nodes whose environment agrees with this process's on
the variables those libraries read when imported (PRELOAD_ENV_PREFIXES).
"""
from __future__ import annotations

import json
import os
import runpy
import select
import sys

PRELOAD = ("numpy", "torch", "transformers", "transformers.modeling_utils", "sentence_transformers", "faiss",
           "flask", "waitress", "requests")
# Variables the preloaded libraries may read when imported: a node whose values differ is not forked.
PRELOAD_ENV_PREFIXES = ("HF_", "HUGGINGFACE", "TRANSFORMERS", "SENTENCE_TRANSFORMERS", "TORCH", "PYTORCH", "OMP_",
                        "MKL_", "KMP_", "CUDA", "NVIDIA", "TOKENIZERS", "PYTHON", "FAISS", "LD_", "XDG_", "HOME")


def _child(request: dict) -> None:
    """In the forked child: become `python -m module args` with the request's environment; never returns."""
    code = 1
    try:
        # Signal dispositions are left as this process has them: a new Python's (SIGPIPE ignored).
        from tools.local import die_with_parent  # the project's code only after the fork
        die_with_parent()
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.close(null)
        sys.stdin = open(0, closefd=False)
        sys.stdout = open(1, "w", buffering=1, closefd=False)
        sys.stderr = open(2, "w", buffering=1, closefd=False)
        flag, module, *args = request["argv"]
        assert flag == "-m", request["argv"]
        sys.argv = [module, *args]
        sys.path[0] = request["cwd"]
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exit_:  # as the interpreter reads it: None is 0, a message is printed and 1
            if exit_.code is None or isinstance(exit_.code, int):
                code = exit_.code or 0
            else:
                print(exit_.code, file=sys.stderr)
                code = 1
        except BaseException:
            import traceback
            traceback.print_exc()
            code = 1
        import threading
        threading._shutdown()  # type: ignore[attr-defined]  # non-daemon threads end, as at interpreter exit
        import atexit
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def _send(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def _reap(children: dict[int, int]) -> None:
    """Report every child that has exited, by its request's number (`children`: pid -> number)."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _send({"exited": children.pop(pid), "code": os.waitstatus_to_exitcode(status)})


def main() -> None:
    for name in PRELOAD:
        __import__(name)
    _send({"ready": os.getpid()})
    stdin = sys.stdin.buffer
    pending = b""
    children: dict[int, int] = {}
    requests = 0
    while True:
        readable, _, _ = select.select([stdin], [], [], 0.05)
        _reap(children)
        if not readable:
            continue
        chunk = os.read(stdin.fileno(), 65536)
        if not chunk:
            return  # the parent is gone: children get SIGTERM from PR_SET_PDEATHSIG
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            request = json.loads(line)
            pid = os.fork()
            if pid == 0:
                _child(request)
            children[pid] = requests
            requests += 1
            _send({"pid": pid})


if __name__ == "__main__":
    main()
