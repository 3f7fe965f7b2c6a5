# triton-serve: the core plus the plugins named in PLUGINS, installed from this source tree.
#
#   docker build -t triton-serve:cpu .
#   docker run --rm -p 8000-8002:8000-8002 triton-serve:cpu        # serves the example repository
#
# Build arguments (docs/deploy.md shows a GPU build):
#   PLUGINS         plugin directories under plugins/, separated by spaces, each optionally with its
#                   extras in brackets ("storage[s3]"); default: the Python backend and the batchers
#   CORE_EXTRAS     extras of the core distribution, comma-separated: cuda, gpu-metrics
#   EXTRA_PACKAGES  further PyPI requirements, separated by spaces
#
# The build context must be the repository root; .dockerignore keeps it to what is copied here.

FROM python:3.11-slim AS build
ARG PLUGINS="python batching ensemble"
ARG CORE_EXTRAS=""
ARG EXTRA_PACKAGES=""
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/triton-serve/venv
WORKDIR /src
COPY pyproject.toml README.md ./
COPY core/ core/
COPY plugins/ plugins/
# set -f: a plugin's extras ("storage[s3]") must reach pip as written, not as a glob.
RUN set -euf; \
    targets="/src${CORE_EXTRAS:+[$CORE_EXTRAS]}"; \
    for plugin in $PLUGINS; do \
        directory="plugins/${plugin%%[*}"; \
        if [ ! -f "$directory/pyproject.toml" ]; then \
            echo "PLUGINS names '$plugin', but $directory/pyproject.toml does not exist" >&2; exit 1; \
        fi; \
        targets="$targets /src/plugins/$plugin"; \
    done; \
    /opt/triton-serve/venv/bin/pip install $targets $EXTRA_PACKAGES

FROM python:3.11-slim
COPY --from=build /opt/triton-serve/venv /opt/triton-serve/venv
ENV PATH=/opt/triton-serve/venv/bin:$PATH PYTHONUNBUFFERED=1
RUN useradd --uid 1000 --user-group --create-home triton-serve
USER 1000:1000
WORKDIR /home/triton-serve
EXPOSE 8000 8001 8002
# No arguments: the example repository inside the triton-serve package.
ENTRYPOINT ["triton-serve"]
