# attention-receiver: one process, SQLite on a volume at /data.
# Not built in this project's CI (no Docker engine there); see README "Deploying".
#
# RECEIVER_SECRETS is required: the container listens on 0.0.0.0, where the public
# development secret is refused, so without it `receiver serve` exits with status 2:
#   docker run -p 4000:4000 -v receiver-data:/data -e RECEIVER_SECRETS=... attention-receiver
# Your own rules: mount them over /app/rules.yaml (-v "$PWD/rules.yaml:/app/rules.yaml:ro").
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md rules.yaml ./
COPY receiver ./receiver
RUN pip install --no-cache-dir . && useradd --system --home /data receiver \
    && mkdir -p /data && chown receiver /data
USER receiver
# No RECEIVER_SECRETS here on purpose: an image must not carry a signing secret.
ENV RECEIVER_HOST=0.0.0.0 RECEIVER_DB=/data/receiver.db RECEIVER_RULES=/app/rules.yaml
VOLUME /data
EXPOSE 4000
HEALTHCHECK CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:4000/readyz')"
CMD ["receiver", "serve"]
