"""A small on-disk corpus and a ``suffixspec serve`` for the framework integration tests.

The embedded demo target copies text it has seen in its context (an induction circuit, see its
README), so asked the first line of a function that a retrieved file holds, it goes on quoting that
file: the answer quotes a retrieved chunk, which is what the reference drafter is for.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tiny import start_server_process

CORPUS = {
    "config.py": ("import json\n\n\ndef read_config(path):\n    with open(path) as f:\n        return json.load(f)\n\n\n"
                  "def write_config(path, config):\n    with open(path, 'w') as f:\n"
                  "        json.dump(config, f, indent=2)\n"),
    "cache.py": ("class Cache:\n    def __init__(self, size):\n        self.size = size\n        self.items = {}\n\n"
                 "    def get(self, key):\n        return self.items.get(key)\n"),
    "fib.py": "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n",
}
QUESTION = "def write_config(path, config):"  # retrieves config.py; the answer quotes it
QUOTED = "json.dump(config, f, indent=2)"  # a line of the retrieved chunk the answer repeats
MAX_TOKENS = 48
# Every accepted draft token then comes from the references; not adaptive, so that the cost gates
# (which learn from measured forward times: a loaded machine changes them) never skip a draft and
# the statistics are the same on every run.
REFS_ONLY = {"drafters": ["references"], "adaptive": False}
VARIANTS = {"on": None, "refs": REFS_ONLY, "off": False}  # the speculation settings each test compares


def demo_spec(one_torch_thread):  # noqa: ANN001, ANN201 - a fixture body: spec = pytest.fixture(...)(demo_spec)
    """The demo target without a draft model or history (the ``spec`` fixture of the integration tests)."""
    from suffixspec import SuffixSpec

    with SuffixSpec("suffixspec/demo-target", draft_model=None, db=False, history=False) as s:
        yield s


def write_corpus(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in CORPUS.items():
        (folder / name).write_text(text)
    return folder


@contextmanager
def served(db: Path) -> Iterator[str]:
    """``suffixspec serve`` on the demo target without a draft model, one request at a time; its /v1 URL."""
    cmd = [sys.executable, "-m", "suffixspec", "serve", "--model", "suffixspec/demo-target", "--draft-model", "none",
           "--db", str(db), "--port", "0", "--max-num-seqs", "1", "--http-threads", "4"]
    proc, url = start_server_process(cmd, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    try:
        yield url + "/v1"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except Exception:
            proc.kill()
            proc.wait()
