# attention-receiver: one process, SQLite on a volume at /data.
# Not built in this project's CI (no Docker engine there); see docs/operations.md, "Deploying".
#
# RECEIVER_SECRETS is required: the container listens on 0.0.0.0, where the public
# development secret is refused, so without it `receiver serve` exits with status 2:
#   docker run -p 4000:4000 -v receiver-data:/data -e RECEIVER_SECRETS=... attention-receiver
# Your own rules: mount them over /app/rules.yaml (-v "$PWD/rules.yaml:/app/rules.yaml:ro").
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md rules.yaml ./
COPY receiver ./receiver
# A fixed numeric user, so that Kubernetes' runAsNonRoot can check it without /etc/passwd
# (deploy/k8s/deployment.yaml runs as the same 10001).
RUN pip install --no-cache-dir . \
    && groupadd --system --gid 10001 receiver \
    && useradd --system --uid 10001 --gid 10001 --home /data --no-create-home receiver \
    && mkdir -p /data && chown 10001:10001 /data && chmod 0700 /data
USER 10001:10001
# No RECEIVER_SECRETS here on purpose: an image must not carry a signing secret.
ENV RECEIVER_HOST=0.0.0.0 RECEIVER_DB=/data/receiver.db RECEIVER_RULES=/app/rules.yaml
VOLUME /data
EXPOSE 4000
# Exec form: no shell in between, and a failed probe is the probe's own exit status.
HEALTHCHECK --interval=10s --timeout=3s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:4000/readyz', timeout=2)"]
CMD ["receiver", "serve"]
