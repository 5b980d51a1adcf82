"""The HTTP edge: the app class and its error handlers (asgi), the uvicorn protocol that
guards each connection (http), ingest (POST /v1/events) and ops (/healthz /readyz /metrics)."""
