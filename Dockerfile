# brim in a virtualenv (/opt/brim) on a Python 3.11+ base, run as an unprivileged user.
#   docker build -t brim .                         # on the official python:3.11-slim
#   deploy/build-image.sh                          # where no image registry is reachable: a local
#                                                  # Debian base (debootstrap), built with podman
# Any base with python3 (3.11 or newer), its venv module and useradd will do (--build-arg BASE=…).
ARG BASE=python:3.11-slim
FROM ${BASE}

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    LITELLM_LOCAL_MODEL_COST_MAP=True \
    VIRTUAL_ENV=/opt/brim \
    PATH=/opt/brim/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

RUN useradd --create-home --uid 10001 brim
WORKDIR /app
COPY pyproject.toml README.md LICENSE ./
COPY proxy ./proxy
COPY middleware ./middleware
COPY adapters ./adapters
COPY policies ./policies
RUN python3 -m venv /opt/brim && /opt/brim/bin/pip install . && rm -rf /app/build /root/.cache
COPY proxy.toml /etc/brim/proxy.toml

USER brim
ENV BRIM_CONFIG=/etc/brim/proxy.toml
# Inside the container brim listens on 0.0.0.0, reachable only where you publish the port.
# Publishing it beyond this machine? Set BRIM_SERVER__API_KEYS_ENV and drop this line.
ENV BRIM_SERVER__ALLOW_UNAUTHENTICATED=true
EXPOSE 8787
HEALTHCHECK --interval=30s --timeout=5s --start-period=10s --retries=3 \
    CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8787/healthz', timeout=4)"
CMD ["brim", "serve", "--host", "0.0.0.0"]
