"""Large index writes in a writer process at the lowest CPU priority, out of the readers' way (the
parent's side; the child is :mod:`index.writer_child`).

An add spends its time tokenizing (the tokenizer's threads take every core) and sorting the new
segment; a merge, sorting. Run in a thread of a serving process they slow its generations down
(measured: a 16-token generation 56 ms alone, 164 ms median and 1.5 s worst while a 9 MB add ran in
another thread; the adding thread itself held the interpreter lock for ~4% of the add, the rest was
its tokenizer's threads taking the cores; see docs/index.md, "The writer process"). Here the same
work (:meth:`IndexStore.add_documents`, :meth:`IndexStore.merge_pending`, :meth:`IndexStore.compact`,
unchanged) runs in a child process:

- the child lowers its priority: ``SCHED_IDLE`` and nice 19 (Linux; elsewhere the niceness), so
  that inside the serving process' scheduler group it runs on what the generations leave (a waking
  generation thread preempts it at once), while the group keeps its share of a machine others use.
  On Linux the CPU is shared between *autogroups* (sessions) first, so a priority ranks a process only
  inside its own group: ``own_group`` (``index add``, typically in another terminal's session than
  the server) starts the child in a new session and sets its autogroup's niceness instead;
- it opens the same database and commits as any writer does: a new segment becomes visible when its
  transaction commits; a child killed at any point leaves the previous state (its uncommitted files
  are collected by the next writer), an interrupted parent (Ctrl-C) interrupts the child, which rolls
  back and deletes its files; a parent that dies closes the pipe and the child aborts the same way;
- documents are streamed to it over a pipe in chunks of ``TOKENIZE_BATCH_CHARS`` (one chunk in
  flight: memory stays bounded), progress and status come back, then the :class:`AddSummary`.

Starting the child costs ~0.4 s of CPU (importing numpy, sqlite-utils and ``tokenizers``; a fast
tokenizer is sent as its Rust backend, not the ``transformers`` object), and at the lowest priority on a
busy machine it may wait seconds for a core: small adds stay in-process, at the caller's priority
(:class:`~index.document_index.DocumentIndex` decides, below ``WRITER_PROCESS_CHARS``).

Example::

    from .writer import add_documents
    summary = add_documents("index.db", docs, tokenizer, progress=lambda d, t, b: None)
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from .errors import WriterDied
from .fingerprint import TOKENIZE_BATCH_CHARS, TOKENIZE_BATCH_DOCS, backend_only
from .records import AddSummary, DocInput, ProgressFn

WRITER_NICE = 19  # the child's niceness (and its autogroup's): it runs on what nothing else wants
WRITER_PROCESS_CHARS = 1 << 20  # adds of less text than this run in the caller's process
_ROOT = str(Path(sys.modules[__package__.rpartition(".")[0]].__file__).resolve().parents[1])  # holds ``suffixspec``
_CHILD = f"{__package__}.writer_child"


def portable_tokenizer(tokenizer: Any) -> Any:
    """``tokenizer`` as sent to the child: a :class:`~index.fingerprint.BackendTokenizer` for a fast
    tokenizer, else itself (it must then be picklable, its class importable)."""
    return backend_only(tokenizer) or tokenizer


def available() -> bool:
    """Whether a writer process can be started here (POSIX, a Python executable)."""
    return os.name == "posix" and bool(sys.executable)


def _own_autogroup() -> bool:
    """Whether the child should start a session of its own and lower its autogroup's priority."""
    try:
        with open("/proc/sys/kernel/sched_autogroup_enabled") as f:
            return f.read().strip() == "1"
    except OSError:
        return False


def add_documents(path: str | os.PathLike, docs: Iterable[DocInput], tokenizer: Any,
                  progress: ProgressFn | None = None, status: Callable[[str], None] | None = None,
                  nice: int = WRITER_NICE, own_group: bool = False, idle: bool = True,
                  **store_kw: Any) -> AddSummary:
    """:meth:`IndexStore.add_documents` of ``docs`` into the database at ``path``, run by a writer
    process at low priority (see the module docstring).
    ``nice``: its niceness (0: as this process); ``idle`` (with ``nice`` > 0): also the ``SCHED_IDLE``
    policy; ``own_group``: in a scheduler autogroup of its own, whose niceness it sets. ``store_kw``: ``IndexStore`` options (``flush_tokens``, ``policy``, ``sort_depth``)."""
    job = {"kind": "add", "path": os.path.abspath(path), "store": store_kw, "tokenizer": portable_tokenizer(tokenizer)}
    return _run(job, nice, own_group, idle, docs=docs, progress=progress, status=status)


def merge(path: str | os.PathLike, compact: bool = False, progress: Callable[[int], None] | None = None,
          status: Callable[[str], None] | None = None, stop: threading.Event | None = None,
          nice: int = WRITER_NICE, own_group: bool = False, **store_kw: Any) -> int:
    """:meth:`IndexStore.merge_pending` (then, with ``compact``, :meth:`IndexStore.compact`) in a writer
    process; returns the merges done. ``stop`` set: the child is interrupted (its merge rolls back)."""
    job = {"kind": "merge", "path": os.path.abspath(path), "store": store_kw, "compact": compact}
    return _run(job, nice, own_group, progress=progress, status=status, stop=stop)


# ----- parent side ---------------------------------------------------------------------------------------
def _chunks(docs: Iterable[DocInput]) -> Iterator[list[DocInput]]:
    """``docs`` in lists of about ``TOKENIZE_BATCH_CHARS`` characters (what the child tokenizes at once)."""
    chunk: list[DocInput] = []
    size = 0
    for d in docs:
        chunk.append(d)
        size += len(d.text)
        if size >= TOKENIZE_BATCH_CHARS or len(chunk) >= TOKENIZE_BATCH_DOCS:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


def _run(job: dict, nice: int, own_group: bool, idle: bool = True, docs: Iterable[DocInput] | None = None,
         progress: Callable | None = None, status: Callable[[str], None] | None = None,
         stop: threading.Event | None = None) -> Any:
    """Start the child, send ``job``, serve its requests for documents and relay its messages until it
    answers (its result) or fails (its exception, re-raised here; :class:`WriterDied` if it died)."""
    new_session = own_group and nice > 0 and _own_autogroup()
    job["nice"], job["autogroup"], job["idle"] = nice, new_session, nice > 0 and idle
    ours, theirs = socket.socketpair()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (_ROOT, os.environ.get("PYTHONPATH")) if p)}
    try:
        # started in the folder that holds this very ``suffixspec``: ``-m`` looks in the working directory
        # first, where another checkout's could be
        proc = subprocess.Popen([sys.executable, "-m", _CHILD, str(theirs.fileno())],
                                pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, env=env, cwd=_ROOT,
                                start_new_session=new_session)
    finally:
        theirs.close()
    conn = Connection(ours.detach())
    chunks = _chunks(docs if docs is not None else [])

    def died(_e: BaseException) -> WriterDied:
        code = proc.wait()
        return WriterDied(f"the index writer process exited ({_exit_text(code)}) before finishing; the index "
                          "keeps what it committed before: retry (if it dies again, the machine may be short of "
                          "memory: add fewer documents at a time)")

    try:
        try:
            conn.send(job)
        except OSError as e:
            raise died(e) from e
        while True:
            try:
                if stop is not None:
                    while not conn.poll(0.2):
                        if stop.is_set():
                            _interrupt(proc, conn)
                            return 0
                msg = conn.recv()
            except (EOFError, OSError) as e:
                raise died(e) from e
            kind = msg[0]
            if kind == "more":
                chunk = next(chunks, None)  # reading the documents (files, for `index add`) happens here
                try:
                    conn.send(chunk)
                except OSError as e:
                    raise died(e) from e
            elif kind == "progress":
                if progress:
                    progress(*msg[1:])
            elif kind == "status":
                if status:
                    status(msg[1])
            elif kind == "done":
                return msg[1]
            elif kind == "error":
                proc.wait()
                raise msg[1]
    except BaseException:  # Ctrl-C, an error reading the documents, a callback's error: stop the child first
        _interrupt(proc, conn)
        raise
    finally:
        conn.close()
        if proc.poll() is None:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _interrupt(proc: subprocess.Popen, conn: Connection, timeout_s: float = 120.0) -> None:
    """SIGINT to the child (its own session does not get the terminal's), then wait until it has rolled
    back and deleted its uncommitted files (it answers with an error, or closes the pipe)."""
    if proc.poll() is not None:
        return
    try:
        proc.send_signal(signal.SIGINT)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            if conn.poll(min(1.0, max(0.0, deadline - time.monotonic()))):
                if conn.recv()[0] in ("error", "done"):
                    break
            elif proc.poll() is not None:
                break
    except (EOFError, OSError):
        pass
    try:
        proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _exit_text(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"status {code}"
