"""Large index writes in a writer process at the lowest CPU priority, out of the readers' way.

An add spends its time tokenizing (the tokenizer's threads take every core) and sorting the new
segment; a merge, sorting. Run in a thread of a serving process they slow its generations down
(measured: a 16-token generation 56 ms alone, 164 ms median and 1.5 s worst while a 9 MB add ran in
another thread; the adding thread itself held the interpreter lock for ~4% of the add, the rest was
its tokenizer's threads taking the cores; see the README's "Document index at scale"). Here the same
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
tokenizer is sent as its Rust backend, not the ``transformers`` object), so small adds stay in-process
(``SuffixSpec.add_documents`` below ``WRITER_PROCESS_CHARS``).

Example::

    from suffixspec.index.writer import add_documents
    summary = add_documents("index.db", docs, tokenizer, progress=lambda d, t, b: None)
"""

from __future__ import annotations

import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from .store import TOKENIZE_BATCH_CHARS, TOKENIZE_BATCH_DOCS, AddSummary, DocInput, ProgressFn, StoreError

WRITER_NICE = 19  # the child's niceness (and its autogroup's): it runs on what nothing else wants
WRITER_PROCESS_CHARS = 1 << 20  # SuffixSpec.add_documents: adds of at least this much text go to a child
_ROOT = str(Path(sys.modules[__package__.rpartition(".")[0]].__file__).resolve().parents[1])  # holds ``suffixspec``


class WriterError(StoreError):
    """The writer process died before answering (killed, out of memory): the index keeps its previous state."""


@dataclass
class BackendTokenizer:
    """What the writer needs of a fast tokenizer: its Rust backend, fingerprint and name (pickled to the
    child without importing ``transformers`` there; same ids and fingerprint as the full tokenizer)."""

    backend_tokenizer: Any  # tokenizers.Tokenizer
    fingerprint: str  # tokenizer_fingerprint of the full tokenizer (its special tokens included)
    name_or_path: str


def portable_tokenizer(tokenizer: Any) -> Any:
    """``tokenizer`` as sent to the child: a :class:`BackendTokenizer` for a fast tokenizer, else itself
    (it must then be picklable, its class importable)."""
    from .fingerprint import tokenizer_fingerprint, tokenizer_name

    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or not hasattr(backend, "encode_batch_fast") or isinstance(tokenizer, BackendTokenizer):
        return tokenizer
    return BackendTokenizer(backend, tokenizer_fingerprint(tokenizer), tokenizer_name(tokenizer))


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
                  merge: bool = False, nice: int = WRITER_NICE, own_group: bool = False, idle: bool = True,
                  **store_kw: Any) -> AddSummary:
    """:meth:`IndexStore.add_documents` of ``docs`` into the database at ``path``, run by a writer
    process at low priority (see the module docstring); with ``merge``, the pending merges after it.
    ``nice``: its niceness (0: as this process); ``idle`` (with ``nice`` > 0): also the ``SCHED_IDLE``
    policy; ``own_group``: in a scheduler autogroup of its own, whose niceness it sets. ``store_kw``: ``IndexStore`` options (``flush_tokens``, ``policy``, ``sort_depth``)."""
    job = {"kind": "add", "path": str(path), "store": store_kw, "tokenizer": portable_tokenizer(tokenizer),
           "merge": merge}
    return _run(job, nice, own_group, idle, docs=docs, progress=progress, status=status)


def merge(path: str | os.PathLike, compact: bool = False, progress: Callable[[int], None] | None = None,
          status: Callable[[str], None] | None = None, stop: threading.Event | None = None,
          nice: int = WRITER_NICE, own_group: bool = False, **store_kw: Any) -> int:
    """:meth:`IndexStore.merge_pending` (then, with ``compact``, :meth:`IndexStore.compact`) in a writer
    process; returns the merges done. ``stop`` set: the child is interrupted (its merge rolls back)."""
    job = {"kind": "merge", "path": str(path), "store": store_kw, "compact": compact}
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
    answers (its result) or fails (its exception, re-raised here; :class:`WriterError` if it died)."""
    new_session = own_group and nice > 0 and _own_autogroup()
    job["nice"], job["autogroup"], job["idle"] = nice, new_session, nice > 0 and idle
    ours, theirs = socket.socketpair()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (_ROOT, os.environ.get("PYTHONPATH")) if p)}
    try:
        proc = subprocess.Popen([sys.executable, "-m", __name__, str(theirs.fileno())],
                                pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, env=env,
                                start_new_session=new_session)
    finally:
        theirs.close()
    conn = Connection(ours.detach())
    chunks = _chunks(docs if docs is not None else [])

    def died(_e: BaseException) -> WriterError:
        code = proc.wait()
        return WriterError(f"the index writer process exited ({_exit_text(code)}) before finishing: "
                           "the index keeps what it committed before")

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


# ----- child side ----------------------------------------------------------------------------------------
def _lower_priority(nice: int, autogroup: bool, idle: bool) -> None:
    if idle and hasattr(os, "SCHED_IDLE"):
        # SCHED_IDLE: a thread waking in the same group preempts this process at once (a niced one may
        # finish its time slice first: torch's threads wake hundreds of times per generation); the
        # tokenizer's threads, started later, inherit it
        try:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        except OSError:
            pass
    if nice <= 0:
        return
    if autogroup:  # alone in a new session: its autogroup is this process
        try:
            with open("/proc/self/autogroup", "w") as f:
                f.write(str(nice))
        except OSError:
            pass
    try:
        os.nice(max(0, nice - os.nice(0)))
    except OSError:
        pass


def _child(fd: int) -> int:
    conn = Connection(fd)
    try:
        job = conn.recv()
    except EOFError:
        return 1
    _lower_priority(job["nice"], job["autogroup"], job["idle"])
    from .store import IndexStore

    def docs() -> Iterator[DocInput]:
        while True:
            conn.send(("more",))
            chunk = conn.recv()  # EOFError when the parent died: the add aborts, nothing is committed
            if chunk is None:
                return
            yield from chunk

    def progress(*counts: int) -> None:  # an add's (docs, tokens, bytes), a merge's tokens
        conn.send(("progress", *counts))

    def status(text: str) -> None:
        conn.send(("status", text))

    try:
        with IndexStore(job["path"], auto_merge=False, **job["store"]) as store:
            if job["kind"] == "add":
                result: Any = store.add_documents(docs(), job["tokenizer"], progress=progress, status=status)
                if job["merge"]:
                    store.merge_pending()
            else:
                result = store.merge_pending(progress=progress, status=status)
                if job["compact"]:
                    result += store.compact(progress=progress, status=status)
        conn.send(("done", result))
        return 0
    except BaseException as e:  # the parent re-raises it (KeyboardInterrupt included)
        try:
            pickle.dumps(e)
        except Exception:
            e = StoreError(f"{type(e).__name__}: {e}\n{traceback.format_exc()}")
        try:
            conn.send(("error", e))
        except OSError:
            pass
        return 130 if isinstance(e, KeyboardInterrupt) else 1


if __name__ == "__main__":
    sys.exit(_child(int(sys.argv[1])))
