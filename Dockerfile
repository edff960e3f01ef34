# The registry server image: `docker compose build registry`, or `docker build -t registry .`
# Stage 1 builds the release wheel, the same one `pip install torch-registry` gets; stage 2
# installs that wheel (not the source tree), so the image runs exactly what a user installs.
FROM python:3.12-slim AS wheel

ENV PIP_NO_CACHE_DIR=1
RUN pip install "build>=1.0"
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY registry ./registry
COPY server ./server
COPY migrations ./migrations
RUN python -m build --wheel --outdir /dist .

FROM python:3.12-slim

ENV PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1

# The server moves bytes and never runs a model: the CPU build of torch is enough and is a tenth
# of the size of the default CUDA wheel. Override TORCH_INDEX_URL to use another build.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
RUN pip install --index-url "${TORCH_INDEX_URL}" "torch>=2.4"

# The mlflow extra runs the mirror into MLflow's Model Registry (MLFLOW_TRACKING_URI).
COPY --from=wheel /dist /tmp/dist
RUN pip install "$(echo /tmp/dist/torch_registry-*.whl)[mlflow]" && rm -rf /tmp/dist

RUN useradd --system --uid 10001 --create-home --home-dir /var/lib/registry registry
USER registry
WORKDIR /var/lib/registry
ENV REGISTRY_HOME=/var/lib/registry
EXPOSE 8080

HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=10 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://localhost:8080/healthz', timeout=3)"]

# Migrate first, then serve: a catalog behind the code would refuse every request.
CMD ["sh", "-c", "registry db upgrade && exec registry serve --host 0.0.0.0 --port 8080"]
