# The retraining worker's image: the handler (functions/) and its dependencies only.
# Build from the repository root:
#
#   docker build -f deploy/worker.Dockerfile --build-arg VARIANT=cpu -t driftline-worker:cpu .
#   docker build -f deploy/worker.Dockerfile --build-arg VARIANT=gpu -t driftline-worker:gpu .
#
# VARIANT=cpu (the default) is an AWS Lambda container image: awslambdaric is its entry
# point and the handler setting is its CMD, functions.handler.handler (the zip that
# `driftline package-function` builds names the same function lambda_function.handler).
# Try it with the Lambda runtime interface emulator (aws-lambda-rie) before deploying.
#
# VARIANT=gpu is the worker image of a Ray cluster's GPU nodes (RETRAIN_RUNTIME=ray,
# docs/operations.md "Retraining on Ray"): Ray, and torch built with CUDA (the PyPI
# wheel for Linux x86-64 brings the CUDA libraries; the node needs only the NVIDIA
# driver and container toolkit), for the torch worker, functions.gpu:handler. Ray on the
# nodes must be the version of the service that submits the tasks: RAY_VERSION below.
# Without a GPU it runs the same tasks on the CPU, so it also serves CPU nodes.
ARG VARIANT=cpu
ARG PYTHON_VERSION=3.11.10

FROM python:${PYTHON_VERSION}-slim AS worker-base
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    LAMBDA_TASK_ROOT=/var/task \
    PYTHONPATH=/var/task
WORKDIR /var/task
COPY deploy/worker-requirements.txt /tmp/worker-requirements.txt
RUN pip install --no-cache-dir -r /tmp/worker-requirements.txt
# The whole package: the Ray runtime's task function lives in functions/runtimes/ray.py
# and the torch worker in functions/gpu.py. It imports numpy, boto3 and the standard
# library only (tests/functions/test_boundaries.py), torch and ray where they are asked for.
COPY functions ./functions

FROM worker-base AS worker-cpu
ARG AWSLAMBDARIC_VERSION=4.2.2
RUN pip install --no-cache-dir "awslambdaric==${AWSLAMBDARIC_VERSION}"
# Lambda runs the container as an unprivileged user with a read-only root file system.
ENTRYPOINT ["python", "-m", "awslambdaric"]
CMD ["functions.handler.handler"]

FROM worker-base AS worker-gpu
ARG RAY_VERSION=2.60.0
ARG TORCH_VERSION=2.13.0
RUN pip install --no-cache-dir "ray[default]==${RAY_VERSION}" "torch==${TORCH_VERSION}" \
    && useradd --create-home --uid 1000 ray
USER ray
# The cluster (KubeRay, or Ray's cluster launcher) starts the node's processes itself,
# `ray start ... --block`; this command is for a look inside.
CMD ["python", "-c", "import functions.gpu, ray, torch; print(ray.__version__, torch.__version__, torch.cuda.is_available())"]

FROM worker-${VARIANT}
