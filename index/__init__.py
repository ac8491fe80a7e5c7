"""Token-sequence suffix index and its SQLite store. numpy and sqlite-utils only: no torch, no flask."""
