"""llamaserve's own server flags, which llama-server has no equivalent of: the body limit, the
stored Responses and batches, the prompt cache kept across restarts, queue limits, allowed
hosts, the agent tools' header, prefix sharing, the inter-token bound and tracing. `--help`
lists them after llama-server's server flags, in the same group (`options_server.py` appends
them)."""

from __future__ import annotations

from llamaserve.cli import values as v
from llamaserve.cli.opt import SERVER, Opt, row

OWN_OPTIONS: tuple[Opt, ...] = (
    row(
        "--body-limit",
        "body_limit_mib",
        type=v.integer,
        metavar="MiB",
        env="LLAMA_ARG_BODY_LIMIT",
        group=SERVER,
        help="largest request body in MiB; larger ones get 413",
    ),
    row(
        "--responses-db",
        "responses_db",
        metavar="FILE",
        env="LLAMA_ARG_RESPONSES_DB",
        group=SERVER,
        help="SQLite file for stored /v1/responses (default: in the user cache folder)",
    ),
    row(
        "--batch-dir",
        "batch_dir",
        metavar="PATH",
        env="LLAMA_ARG_BATCH_DIR",
        group=SERVER,
        help="folder for the Batch API's files and state (default: llamaserve/batches in the user cache folder)",
    ),
    row(
        "--batch-concurrency",
        "batch_concurrency",
        type=v.integer,
        metavar="N",
        env="LLAMA_ARG_BATCH_CONCURRENCY",
        group=SERVER,
        help="most lines of a batch running at once, always fewer than the slots (0: auto, half the slots, at most 8)",
    ),
    row(
        "--cache-persist",
        "cache_persist",
        "flag",
        env="LLAMA_ARG_CACHE_PERSIST",
        group=SERVER,
        help="save slot caches to --slot-save-path on shutdown and reload them on start",
    ),
    row(
        "--max-queue",
        "max_queue",
        type=v.integer,
        metavar="N",
        env="LLAMA_ARG_MAX_QUEUE",
        group=SERVER,
        help="most requests waiting for a slot; past it a request gets 429 with Retry-After (-1: no limit)",
    ),
    row(
        "--max-queue-tokens",
        "max_queue_tokens",
        type=v.integer,
        metavar="N",
        env="LLAMA_ARG_MAX_QUEUE_TOKENS",
        group=SERVER,
        help="most prompt tokens waiting for slots; past it a request gets 429 with Retry-After (-1: no limit)",
    ),
    row(
        "--allowed-hosts",
        "allowed_hosts",
        metavar="HOST1,HOST2,...",
        env="LLAMA_ARG_ALLOWED_HOSTS",
        group=SERVER,
        help="without an API key, the routes that act on the machine (/tools, /cors-proxy, slot files, LoRA, "
        "models) answer only requests whose Host is a loopback name, an IP address or one of these names "
        "(DNS rebinding); '*' allows any",
    ),
    row(
        "--tools-runtime-header",
        "tools_runtime_header",
        "flag",
        env="LLAMA_ARG_TOOLS_RUNTIME_HEADER",
        group=SERVER,
        help="let a request's x-tool-runtime header choose where the agent tools run (default: it is refused "
        "and --tools-runtime stands)",
    ),
    row(
        "--prefix-sharing",
        "prefix_sharing",
        "pair",
        neg="--no-prefix-sharing",
        env="LLAMA_ARG_PREFIX_SHARING",
        group=SERVER,
        help="requests sharing a prompt prefix share its KV cells across slots, and requests arriving "
        "together compute it once (unified KV, no SWA or recurrent model; default: enabled)",
    ),
    row(
        "--max-itl-ms",
        "max_itl_ms",
        type=v.integer,
        metavar="MS",
        env="LLAMA_ARG_MAX_ITL_MS",
        group=SERVER,
        help="limit prompt work per step so generating slots get a token at least this often (0: off)",
    ),
    # Ours (llama-server has no tracing): OpenTelemetry's own OTEL_* variables configure it, so
    # these flags have no LLAMA_ARG_ variable.
    row(
        "--otel",
        "otel",
        "flag",
        group=SERVER,
        help="OpenTelemetry traces of every request, exported as the OTEL_* variables say (default: "
        "OTLP over HTTP to localhost:4318); needs the 'otel' extra. The OTEL_* variables alone turn them on too",
    ),
    row(
        "--otlp-endpoint",
        "otlp_endpoint",
        metavar="URL",
        group=SERVER,
        help="OpenTelemetry traces exported over OTLP/HTTP to this collector (http://host:4318, or a full "
        ".../v1/traces URL); implies --otel",
    ),
)
