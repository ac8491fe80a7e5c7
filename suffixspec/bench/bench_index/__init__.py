"""Benchmark of the suffix index (suffixspec/index/): append, speculate, memory, corpora up to 200M tokens, history growth.

Run: ``python -m suffixspec.bench.bench_index [--tokens 5000000] [--tokenizer NAME_OR_PATH] [--json out.json]``

Sections:

1. **micro** — on ~311k tokens of standard-library source: appending tokens (one per
   call and in runs of 16), speculating from 64-token contexts (per call and per drafted token,
   path and tree), bytes per indexed token. suffixspec's incremental index (request / history) and
   its static suffix array (documents) side by side with ArcticInference's C++ suffix tree when
   ``--arctic-python`` names the Python of an environment where it is installed; it runs there in a
   subprocess on the same token data, same machine, same moment.
2. **corpus** — the Python standard library tokenized to ``--tokens`` tokens: time to index through
   the SQLite store (tokenize + store + suffix array + save), the longest wait of another writer
   (a thread writing every 50 ms, as a server's history does) meanwhile, to load (memory-map), the median
   lookup time; bytes per token on disk and in memory.
3. **history** — a repetitive workload (similar templated requests in sequence): the mean accepted
   length per request, with a perfect-oracle verifier (the "target" output is known), grows as the
   output history fills.

4. **lookup** — speculate latency at ``--tokens`` (5M): today's single suffix array (the code in
   ``--main-root``), the same corpus as segments, and as one array here, interleaved.
5. **scale** — the standard library's and every installed package's ``.py`` sources, repeated, streamed
   through ``IndexStore.add_documents`` in cumulative stages (``--scale-tokens``, default 25M..200M):
   time, peak RSS of the process (``ru_maxrss``), disk per text byte, speculate latency, adding one
   document until a reader drafts from it, deleting it. Tokenizing 200M tokens takes most of an hour
   on 2 shared cores: run it once, niced, in the background, with ``--workdir`` and a log::

       nohup nice -n 5 python -m suffixspec.bench.bench_index --sections scale --workdir scale-work > scale.log &

6. **reopen** — on the database a scale run left: the merges the policy plans now, speculate of the
   segment set vs its largest segment, add/delete one document (medians).
7. **concurrent** — listing documents and a 16-token generation (embedded models) alone and while
   another thread adds ~3x ``--tokens`` characters of documents, alternating; the add in a thread of
   this process (as before), in a writer process at this priority, and as ``SuffixSpec`` does it now
   (a writer process at nice 19), interleaved. About a minute at ``--tokens 3000000`` on an idle
   2-core machine::

       python -m suffixspec.bench.bench_index --sections concurrent --tokens 3000000

8. **add** — adding one small document (``DocumentIndex.add_documents``, what ``SuffixSpec.add_documents``,
   the POST route and ``index add`` run) to stores already holding 100 and 20,000 documents, interleaved:
   CPU and wall time per add, and the cost of the whole-table read adds made before::

       python -m suffixspec.bench.bench_index --sections add --tokenizer smollm2-135m-instruct

9. **busy-add** — ``suffixspec index add`` of one small file against ``suffixspec index stats``, fresh
   processes, alternating, on a store of ~100 MB of source text indexed for ``--busy-model``, while another
   process generates with that model (one torch thread). Indexing the corpus takes most of the time:
   keep it with ``--workdir``::

       python -m suffixspec.bench.bench_index --sections busy-add --workdir busy-work --rounds 7

Tokenizer: ``--tokenizer`` (a hub id, a local directory, or the embedded ``suffixspec/demo-target``,
the default when present); otherwise a byte-level BPE (8k entries) is trained on a slice of the corpus.

Modules: ``__main__`` (the command line), ``corpus`` (the text indexed and the contexts looked up),
``lookups`` (sections 1-4 and retrieval), ``scale`` (5 and 6), ``writes`` (7-9), ``probes`` (a writer's lock
wait, a process' peak memory), ``children`` (other processes and another checkout's code: ``--main-root``,
``--arctic-python``, the compaction child, busy-add's generator) and ``report`` (the tables).
"""
