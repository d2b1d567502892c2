"""Named API keys with limits, and the usage counted per key and model (--api-keys-config).

Plain data and bookkeeping, no HTTP: `policy.py` reads the file, `limits.py` decides admission,
`usage.py` keeps the counts (memory, SQLite, /metrics text), `report.py` is how a server tells
the edge in front of it what a request used. The ASGI side is api/quota.py (enforcement) and
api/usage_report.py (the server's report)."""
