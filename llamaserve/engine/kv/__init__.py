"""A slot's KV sequence through its life, one module per concern: `slot.py` (the sequence and
its cached tokens), `assign.py` (which slot a request gets), `prepare.py` (its cells made
ready for a prompt: prefix kept, host-cache restore, chunks moved, context shifted),
`reuse.py` (the arithmetic of those moves), `host_cache.py` (the host-memory cache) with
`blocks.py` (its prefix index), `sharing.py` (prompt prefixes' cells shared across sequences),
`room.py` (whether a request fits the unified pool),
`files.py` (slot files and `--cache-persist`), `policy.py` (the flags)."""
