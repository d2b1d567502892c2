#!/bin/sh
# The image's entry point: llama-server with the image's defaults.
#
# A default applies only where the user set nothing: a variable given with
# `docker run -e` (or compose's `environment:`) is kept, and a flag on the command
# line beats any variable, as in llama-server. Like llama.cpp's server image, the
# container listens on every interface, port 8080. With no -m, -hf or -mu (nor
# LLAMA_ARG_MODEL / LLAMA_ARG_HF_REPO / LLAMA_ARG_MODEL_URL), llama-server serves
# the embedded SmolLM2-135M, so `docker run -p 8080:8080 IMAGE` answers at once.
set -eu

: "${LLAMA_ARG_HOST:=0.0.0.0}"
: "${LLAMA_ARG_PORT:=8080}"
export LLAMA_ARG_HOST LLAMA_ARG_PORT

# exec: llama-server becomes PID 1's process, so `docker stop` (SIGTERM) reaches it and it drains.
exec llama-server "$@"
