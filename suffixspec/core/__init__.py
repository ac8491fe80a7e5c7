"""The decode core: one step loop over a batch of requests, and what it runs on.

- :mod:`.scheduler`: the caller-stepped loop; admits requests, plans each step's drafts, runs one target
  pass over every row, commits; a failing request ends alone.
- :mod:`.sequence`: one request's state (its tokens, drafters, statistics, stop rules).
- :mod:`.verify` and :mod:`.sampling`: lossless verification of a draft tree and the sampler it mirrors.
- :mod:`.runner`, :mod:`.lean`, :mod:`.kv`, :mod:`.prefix`: the target's forward pass (the lean forward
  or the model's own), its key/value cache, the prompt-prefix store.
- :mod:`.threads`, :mod:`.probe_cache`, :mod:`.stats`, :mod:`.detok`: the thread count, cached probes,
  per-step statistics, incremental detokenization.

It imports the drafting package's data types and policy (``suffixspec.drafting``); nothing here knows a
server, a CLI or a runtime.
"""
