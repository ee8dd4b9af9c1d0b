# syntax=docker/dockerfile:1
# The Triton image: NVIDIA's tritonserver:<yy.mm>-trtllm-python-py3 plus this project's deploy scripts,
# model repository renderer and templates, so one image builds engines, renders the repository and
# serves it (deploy/compose.yaml, deploy/k8s/). Build from the repository root:
#
#   docker build -f deploy/triton.Dockerfile \
#     --build-arg TRITON_BASE_IMAGE=nvcr.io/nvidia/tritonserver:25.06-trtllm-python-py3 \
#     -t trtllm-gateway-triton:25.06 .
#
# deploy/triton.Dockerfile.dockerignore selects the build context (BuildKit reads it instead of the
# root .dockerignore, which is the gateway image's).
ARG TRITON_BASE_IMAGE=nvcr.io/nvidia/tritonserver:25.06-trtllm-python-py3
FROM ${TRITON_BASE_IMAGE}

# The renderer validates config.pbtxt with tritonclient's ModelConfig protobuf. Its dependencies go to
# a private directory put on PYTHONPATH only for the renderer (DEPLOY_PYTHONPATH), so they never
# shadow the packages tensorrt_llm and the Python backend were built against.
ARG TRITONCLIENT_VERSION=2.73.0
RUN python3 -m pip install --no-cache-dir --target /opt/trtllm-gateway/pylib "tritonclient[grpc]==${TRITONCLIENT_VERSION}"

COPY deploy/__init__.py deploy/model_repo.py deploy/build_engine.sh deploy/launch_triton.sh deploy/launch_llmapi.sh deploy/common.sh /opt/trtllm-gateway/deploy/
COPY model_repo_templates /opt/trtllm-gateway/model_repo_templates

ENV DEPLOY_PYTHONPATH=/opt/trtllm-gateway/pylib:/opt/trtllm-gateway \
    PATH=/opt/trtllm-gateway/deploy:$PATH
WORKDIR /opt/trtllm-gateway
EXPOSE 8000 8001 8002
# The NGC entrypoint (CUDA compatibility set-up) stays in front; it execs this, which reads
# MODEL_REPO_DIR and the other settings from the environment.
CMD ["launch_triton.sh"]
