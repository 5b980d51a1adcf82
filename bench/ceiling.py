"""The ceiling for `make bench`: the least a correct receiver must do, on the receiver's uvicorn.

Read the body, verify the HMAC (the receiver's own signature.verify), parse the
JSON, answer 202. No validation, no storage, no routing. Same uvicorn settings
as `receiver serve` (receiver.cli.server_config), so the gap to the receiver is the
cost of what the receiver adds.

    RECEIVER_SECRETS=s3cret python bench/ceiling.py --port 4100
"""

from __future__ import annotations

import argparse
import json
import os

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from receiver import signature
from receiver.cli import server_config
from receiver.errors import SignatureError
from receiver.settings import Settings

SECRETS = [
    s.strip().encode() for s in os.environ.get("RECEIVER_SECRETS", "").split(",") if s.strip()
]


async def events(request: Request) -> Response:
    body = await request.body()
    try:
        signature.verify(SECRETS, body, request.headers.get(signature.SIGNATURE_HEADER))
    except SignatureError as exc:
        return JSONResponse({"error": {"code": exc.code, "message": exc.message}}, 401)
    event = json.loads(body)
    return JSONResponse({"id": event.get("id"), "status": "accepted"}, status_code=202)


async def healthz(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


app = Starlette(routes=[Route("/v1/events", events, methods=["POST"]), Route("/healthz", healthz)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=4100)
    args = parser.parse_args()
    if not SECRETS:
        parser.error("set RECEIVER_SECRETS")
    settings = Settings(host=args.host, port=args.port)
    uvicorn.Server(server_config(app, settings)).run()


if __name__ == "__main__":
    main()
