"""What the processes at the edge share: forwarding to servers of ours, never a model of their own.

The router (children on loopback ports), the `--upstreams` front (any of our servers) and the
Ray ingress all relay requests and merge `/metrics`. `proxy.py` forwards one request to a base
URL and streams the answer back (knowing nothing of children or members), `app.py` is the app
shell of the router and the front (keys, site guard, CORS, access log, error envelopes),
`metrics.py` merges several servers' `/metrics` under one label. Kept apart from `router/` so
the front and Ray need nothing of the router's own parts.
"""
