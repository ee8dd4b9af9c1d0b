# syntax=docker/dockerfile:1
# The gateway image: the `gateway` package with its core dependencies and nothing else. No torch and
# no CUDA: generation happens in Triton, and tokenizers are read from a Hugging Face model directory
# mounted at run time (see deploy/compose.yaml and deploy/k8s/).
#
#   docker build -t trtllm-gateway:dev .
#   docker run -p 9000:9000 -v /path/to/hf-model:/models/hf:ro trtllm-gateway:dev \
#     serve --triton-url triton:8001 --model name=my-model,tokenizer=/models/hf
#
# The base image is a build argument so a mirror or a pinned digest can replace it.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
WORKDIR /src
COPY pyproject.toml README.md ./
# Dependencies first, from [project].dependencies only (never the `engine` extra, which holds torch),
# so this layer is rebuilt when the pins change, not on every code change.
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" \
        > /tmp/requirements.txt \
    && /opt/venv/bin/pip install --no-cache-dir -r /tmp/requirements.txt
COPY gateway ./gateway
RUN /opt/venv/bin/pip install --no-cache-dir --no-deps . \
    && /opt/venv/bin/python -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is not None)"

FROM ${PYTHON_IMAGE} AS runtime
# A fixed numeric UID lets Kubernetes' runAsNonRoot verify the user without a passwd lookup.
RUN useradd --system --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin gateway
COPY --from=builder /opt/venv /opt/venv
# DL3064 flags any name containing TOKEN; TOKENIZERS_PARALLELISM is a switch, not a secret.
# hadolint ignore=DL3064
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HF_HOME=/tmp/huggingface \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    TOKENIZERS_PARALLELISM=false \
    GATEWAY_HOST=0.0.0.0 \
    GATEWAY_PORT=9000
USER 10001:10001
EXPOSE 9000
# /health is liveness only (the process answers); /health/ready follows Triton and is for load balancers.
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/health' % os.environ.get('GATEWAY_PORT', '9000'), timeout=4)"]
ENTRYPOINT ["gateway"]
CMD ["serve"]
