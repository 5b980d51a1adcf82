# attention-receiver: one process, SQLite on a volume at /data.
# Not built in this project's CI (no Docker engine there); see README "Deploying".
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md rules.yaml ./
COPY receiver ./receiver
RUN pip install --no-cache-dir . && useradd --system --home /data receiver \
    && mkdir -p /data && chown receiver /data
USER receiver
ENV RECEIVER_HOST=0.0.0.0 RECEIVER_DB=/data/receiver.db RECEIVER_RULES=/app/rules.yaml
VOLUME /data
EXPOSE 4000
HEALTHCHECK CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:4000/readyz')"
CMD ["receiver", "serve"]
