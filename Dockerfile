# syntax=docker/dockerfile:1.7
#
# One image for both latency-predictor servers; the command picks the server:
#   docker run IMAGE latency-training-server   --host 0.0.0.0 --port 8000 --data-dir /var/lib/latency-predictor
#   docker run IMAGE latency-prediction-server --host 0.0.0.0 --port 8001 --training-server-url http://HOST:8000
# (the Helm chart in charts/latency-predictor sets exactly these commands).
#
# Build from the repository root:  docker build -t latency-predictor:0.1.0 .
# Every version is pinned: the base image, pip/setuptools, and every Python package
# (constraints below); bump them together and rebuild.

ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm
# LightGBM links the system OpenMP runtime (the slim image does not ship it).
ARG LIBGOMP_VERSION=12.2.0-14+deb12u1

FROM ${PYTHON_IMAGE} AS base
ARG LIBGOMP_VERSION
RUN apt-get update \
 && apt-get install -y --no-install-recommends "libgomp1=${LIBGOMP_VERSION}" \
 && rm -rf /var/lib/apt/lists/*

# ---------------------------------------------------------------- build stage
FROM base AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
RUN pip install pip==25.1.1 setuptools==80.9.0 wheel==0.45.1

COPY <<'EOF' /build/constraints.txt
annotated-doc==0.0.7
annotated-types==0.7.0
anyio==4.16.0
certifi==2026.5.20
click==8.4.0
cloudpickle==3.1.3
contourpy==1.3.3
cycler==0.12.1
fastapi==0.165.0
fonttools==4.68.0
h11==0.16.0
httpcore==1.0.9
httptools==0.9.0
httpx==0.29.0
idna==3.13
joblib==1.6.0
kiwisolver==1.5.1
lightgbm==4.7.0
matplotlib==3.11.2
narwhals==2.29.0
numpy==2.4.6
opentelemetry-api==1.45.2
orjson==3.13.0
packaging==26.2
pandas==3.1.1
pillow==13.0.0
prometheus-client==0.26.0
pydantic==2.13.4
pydantic-core==2.46.4
pyparsing==3.3.2
python-dateutil==2.9.0.post0
python-dotenv==1.2.2
pyyaml==6.0.3
scikit-learn==1.9.1
scipy==1.17.1
six==1.17.0
starlette==1.10.0
threadpoolctl==3.8.0
typing-extensions==4.16.0
typing-inspection==0.4.2
uvicorn==0.55.0
uvloop==0.23.0
watchfiles==1.3.0
websockets==17.4
xgboost-cpu==3.2.0
EOF

WORKDIR /build/src
# Only what the package needs (see .dockerignore): no tests or VCS files (the data sets the
# simulator replays ship inside the load package, load/data).
COPY pyproject.toml README.md ./
COPY features ./features
COPY training_server ./training_server
COPY prediction_server ./prediction_server
COPY epp_client ./epp_client
COPY gateway ./gateway
COPY load ./load
COPY latency_cli ./latency_cli
# The package depends on xgboost-cpu (no NCCL wheel); prove both servers' imports and both
# model libraries work in this venv.
RUN pip install --no-build-isolation --constraint /build/constraints.txt . \
 && python -c "import training_server.__main__, prediction_server.__main__, xgboost, lightgbm" \
 && latency-training-server --help >/dev/null \
 && latency-prediction-server --help >/dev/null \
 && find /opt/venv -name '__pycache__' -prune -exec rm -rf {} +

# -------------------------------------------------------------- runtime stage
FROM base AS runtime
RUN groupadd --system --gid 10001 latency \
 && useradd --system --uid 10001 --gid 10001 --no-create-home \
      --home-dir /nonexistent --shell /usr/sbin/nologin latency \
 && install -d -o 10001 -g 10001 -m 0750 /var/lib/latency-predictor /var/cache/latency-predictor
COPY --from=build /opt/venv /opt/venv
# The root filesystem may be read-only (the chart mounts /tmp and the data dir), so
# nothing writes outside them; one OpenMP thread per server (scale by processes).
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/tmp \
    MPLCONFIGDIR=/tmp/matplotlib \
    OMP_NUM_THREADS=1 \
    LATENCY_DATA_DIR=/var/lib/latency-predictor
USER 10001:10001
WORKDIR /var/lib/latency-predictor
EXPOSE 8000 8001
# No ENTRYPOINT: the command names the server. Default: the training server,
# reachable from outside the container.
CMD ["latency-training-server", "--host", "0.0.0.0", "--port", "8000", "--data-dir", "/var/lib/latency-predictor"]
