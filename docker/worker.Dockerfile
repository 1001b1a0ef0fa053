# h3batch GPU worker image: CUDA runtime + the full project (torch with CUDA). One container per node, 4 GPUs.
FROM nvidia/cuda:12.8.1-cudnn-runtime-ubuntu22.04

ENV DEBIAN_FRONTEND=noninteractive PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3.11 python3.11-venv ca-certificates \
    && rm -rf /var/lib/apt/lists/*
RUN python3.11 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /app

# torch from the CUDA 12.8 wheel index first, so the project's `torch==2.13.0` pin is already satisfied.
RUN pip install --upgrade pip \
    && pip install torch==2.13.0 triton==3.9.0 --index-url https://download.pytorch.org/whl/cu128
COPY pyproject.toml README.md ./
COPY h3batch ./h3batch
COPY core ./core
COPY api ./api
COPY worker ./worker
COPY kernels ./kernels
COPY loadrunner ./loadrunner
COPY docker/worker_healthcheck.py ./docker/worker_healthcheck.py
RUN pip install .

RUN useradd --uid 10001 --create-home h3batch && mkdir -p /artifacts /models && chown h3batch /artifacts /models
USER h3batch
# Warm stop: SIGTERM acts as SIGQUIT for Celery, so the unacked render message is restored instead of waiting out
# the visibility timeout; compose gives it stop_grace_period to do so.
ENV REMAP_SIGTERM=SIGQUIT
# No --queues: the worker consumes the render queues of its capability (docs/service.md "Routing").
CMD ["h3batch", "worker"]
