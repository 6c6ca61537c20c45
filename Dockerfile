# The one gpuaas image: every component is a verb of the `gpuaas` command (extender, autoscaler, metrics-api,
# nodescaler, gangs); the manifests in deploy/ pass the verb and its flags as args.
#   docker build -t gpuaas:0.1.0 .
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Only what the package is built from (tests/deploy/test_image.py builds the wheel from these same paths).
WORKDIR /src
COPY pyproject.toml ./
COPY scoring/ scoring/
COPY runtime/ runtime/
COPY extender/ extender/
COPY autoscaler/ autoscaler/
COPY nodescaler/ nodescaler/
COPY gangs/ gangs/
COPY gpuaas/ gpuaas/
# The package and its runtime dependencies only: no extras (`test`: pytest, ruff, mypy; `plot`: matplotlib), which
# tests/deploy/test_image.py checks.
RUN pip install . && rm -rf /src

# Non-root, numeric so that the kubelet can verify runAsNonRoot; the manifests run as the same uid.
RUN useradd --system --uid 65532 --user-group --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin gpuaas
USER 65532:65532
WORKDIR /

ENTRYPOINT ["gpuaas"]
CMD ["--help"]
