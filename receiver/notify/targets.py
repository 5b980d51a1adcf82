"""Sending one notification to one apprise URL, off the event loop, without leaking secrets.

    targets = Targets(timeout=10.0)
    await targets.send(url, title="Attention dropped", body="...", label="oncall[0]")
    targets.close()

`console://` is built in and only logs a line on "receiver.console". Every other URL
goes through apprise in a thread pool. A send that fails or outlives `timeout` raises
DeliveryError, whose message names the label and scheme but never the URL or its
secrets. Apprise, requests and urllib3 log URLs and tokens at DEBUG (and hosts at
WARNING), so every record from those loggers is redacted before any handler sees it.

A target's answer is read up to ANSWER_CAP bytes, never decompressed (requests, which
apprise sends through, would otherwise read a 300 MB answer whole into memory): see
_capped_adapter.

apprise is imported and its plugins loaded at the first send to a target other than
console:// (or by the rules' check of such a URL): 0.7 s of CPU that a receiver sending
to the console only never spends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import threading
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any, TypeVar

from receiver import tracing
from receiver.errors import ReceiverError
from receiver.notify.redaction import Redactor, private_tokens, redact, shown_url, url_secrets

if TYPE_CHECKING:
    import apprise

__all__ = [
    "CONSOLE_LOGGER",
    "DeliveryError",
    "Exchange",
    "Targets",
    "prepare_apprise",
    "redact",
    "url_secrets",
]

T = TypeVar("T")

CONSOLE_LOGGER = "receiver.console"

# Loggers of the libraries apprise sends through; each may print a URL, path or token.
_LIBRARY_LOGGERS = ("apprise", "requests", "urllib3")

_HTTP_STATUS_RE = re.compile(r"\berror=(\d{3})\b")

log = logging.getLogger(__name__)


class DeliveryError(ReceiverError):
    """A notification could not be delivered. The message is safe to log and store.

    .label names the target (e.g. "oncall[0]"); .timed_out is True when the send
    outlived the timeout, in which case the target may still have received it; .status is
    the HTTP status the target answered, when apprise said.
    """

    def __init__(
        self, message: str, *, label: str, timed_out: bool = False, status: int | None = None
    ) -> None:
        super().__init__(message)
        self.label = label
        self.timed_out = timed_out
        self.status = status


ANSWER_CAP = 64 * 1024  # bytes of a target's answer apprise gets to read, at most


class _CappedBody:
    """A target's answer as requests reads it: raw bytes (never inflated), ANSWER_CAP of
    them at most, and the connection dropped rather than drained past that. Everything
    else is urllib3's response."""

    def __init__(self, raw: Any) -> None:
        self._raw = raw

    def stream(self, amt: int | None = 2**16, decode_content: bool | None = None) -> Any:
        left = ANSWER_CAP
        while left > 0:
            chunk = self._raw.read(min(amt or left, left), decode_content=False)
            if not chunk:
                return
            left -= len(chunk)
            yield chunk
        self._raw.close()  # the rest is never read

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)


def _capped_adapter() -> type:
    """requests' adapter, asking for an answer as it is (identity) and reading it through
    _CappedBody. Apprise builds its own sessions in each plugin, so prepare_apprise puts
    this in place of the adapter every requests session mounts (only apprise sends
    through requests in this process)."""
    import requests.adapters

    class CappedAdapter(requests.adapters.HTTPAdapter):
        def send(self, request: Any, *args: Any, **kwargs: Any) -> Any:
            request.headers["Accept-Encoding"] = "identity"
            # The send's trace context (traceparent), set by its thread (_send): the
            # target's own tracing sees our span as the parent of its request.
            request.headers.update(getattr(_answered, "headers", None) or {})
            exchange: Exchange | None = getattr(_answered, "exchange", None)
            if exchange is None:
                return super().send(request, *args, **kwargs)
            exchange.method, exchange.error_type = request.method, None
            exchange.url = shown_url(request.url, getattr(_answered, "secrets", ()))
            try:
                return super().send(request, *args, **kwargs)
            except Exception as exc:
                exchange.error_type = tracing.error_type(exc)
                raise

        def build_response(self, req: Any, resp: Any) -> Any:
            response = super().build_response(req, resp)
            response.raw = _CappedBody(resp)
            _answered.status = response.status_code  # the send's thread reads it (_send)
            return response

    return CappedAdapter


_REDACTOR = Redactor()
# The HTTP status of the last answer a send's thread read (CappedAdapter writes it, _send
# reads it): apprise says only "sent" or "not sent", the attempt log wants the status. And
# the headers each of the send's requests gets besides apprise's own (_send sets them), and
# the Exchange to fill in for the send's span, with the secrets to keep out of its URL.
_answered = threading.local()


@dataclass
class Exchange:
    """What a send's last HTTP request was, for its trace span (receiver.tracing), filled in
    by the send's thread: its method (None: not sent over HTTP), its URL without secrets
    (redaction.shown_url; the notifier's URL until a request goes out), and the class of
    the exception that ended it before any answer."""

    method: str | None = None
    url: str | None = None
    error_type: str | None = None


_setup_lock = threading.Lock()
_setup_done = False


def loaded_apprise() -> ModuleType:
    """apprise, prepared (prepare_apprise)."""
    prepare_apprise()
    import apprise

    return apprise


def prepare_apprise() -> None:
    """Load apprise's plugins once, and put the redactor on every library logger.

    The first send through apprise calls it; call it yourself before any other use of
    apprise (checking URLs in rules.yaml, say), so its plugins load without the warning
    below.
    """
    global _setup_done
    with _setup_lock:
        if _setup_done:
            return
        # Loading the email plugin imports `imghdr` (for PGPy), deprecated in 3.11+;
        # nothing we can fix, and `filterwarnings = error` would turn it into a failure.
        import apprise
        import requests.sessions

        requests.sessions.HTTPAdapter = _capped_adapter()  # type: ignore[attr-defined,assignment]
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*imghdr.*", category=DeprecationWarning)
            apprise.Apprise.instantiate("json://localhost")
        # A logger's filters only see records created on that logger, so attach to
        # every module logger that exists now (all are created at import time).
        names = [
            name
            for name in list(logging.root.manager.loggerDict)
            if name.split(".")[0] in _LIBRARY_LOGGERS
        ]
        for name in {*_LIBRARY_LOGGERS, *names}:
            logger = logging.getLogger(name)
            if _REDACTOR not in logger.filters:
                logger.addFilter(_REDACTOR)
        _setup_done = True


# -- sending ---------------------------------------------------------------------------


def _scheme(url: str) -> str:
    head, sep, _ = url.partition("://")
    head = head.strip().lower()
    return head if sep and re.fullmatch(r"[a-z][a-z0-9+.\-]*", head) else "apprise"


class Targets:
    """Sends one notification to one apprise URL, off the event loop.

    Each send runs in a thread of its own, a daemon thread: one that a target keeps
    waiting (a socket that never answers) holds up no other send, and never holds up
    the process's exit. Its sockets time out a second after `timeout`, so it ends soon
    after the send was given up on.

    A fresh apprise plugin is built for every send: parsing costs ~0.1-0.3 ms, far
    less than any network call, and apprise plugins keep per-instance state
    (throttle clock, mode caches) that isn't meant to be shared between threads.
    """

    def __init__(self, *, timeout: float = 10.0) -> None:
        self.timeout = timeout
        self._asset: apprise.AppriseAsset | None = None  # at the first send through apprise
        self._secrets: dict[str, frozenset[str]] = {}
        self._threads: set[threading.Thread] = set()
        self._closed = False

    async def send(
        self,
        url: str,
        *,
        title: str,
        body: str,
        label: str,
        headers: Mapping[str, str] | None = None,
        exchange: Exchange | None = None,
    ) -> int | None:
        """Deliver title and body to url; raise DeliveryError on failure or timeout. The
        HTTP status the target answered, when the target is reached over HTTP.

        label is a name safe for logs, e.g. "oncall[0]" (notifier name and index);
        headers go with each HTTP request of the send (the trace context: traceparent);
        exchange, when given, is filled in with the send's last request (for its span).
        Cancelling the caller abandons the send: the thread finishes (or times out)
        on its own and its outcome is dropped.
        """
        if exchange is not None:
            exchange.url = shown_url(url, self._register(url))
        if _scheme(url) == "console":
            _log_console(label, title, body)
            return None
        if self._closed:
            raise DeliveryError(f"{label}: not sent, notifier is closed", label=label)
        if not _setup_done:
            # apprise's first load (0.5 s of CPU, more on a busy machine) is no part of a
            # send's time: it is done here, off the event loop, before the clock starts.
            await asyncio.to_thread(prepare_apprise)
        secrets = self._register(url)
        job = self._start(self._send, url, title, body, label, secrets, headers, exchange)
        try:
            # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation.
            async with asyncio.timeout(self.timeout):
                return await job
        except TimeoutError:
            raise DeliveryError(
                f"{label}: {_scheme(url)} target timed out after {self.timeout:g}s",
                label=label,
                timed_out=True,
            ) from None

    def close(self, *, wait: bool = False) -> None:
        """Refuse further sends. Running sends can't be interrupted; their socket
        timeouts (`timeout` plus a second) bound how long they linger. wait=True joins them.
        """
        self._closed = True
        if wait:
            for thread in list(self._threads):
                thread.join()

    def _start(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """Run fn(*args) in a new daemon thread; a future of the loop for its outcome."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        outcome: list[T] = []

        def settle(error: BaseException | None) -> None:
            if future.done():  # the caller gave up (timeout or cancel)
                return
            if error is None:
                future.set_result(outcome[0])
            else:
                future.set_exception(error)

        def run() -> None:
            error: BaseException | None = None
            try:
                outcome.append(fn(*args))
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task
                error = exc
            finally:
                self._threads.discard(threading.current_thread())
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                loop.call_soon_threadsafe(settle, error)

        thread = threading.Thread(target=run, name="notify", daemon=True)
        self._threads.add(thread)
        thread.start()
        return future

    def _register(self, url: str) -> frozenset[str]:
        secrets = self._secrets.get(url)
        if secrets is None:
            secrets = url_secrets(url)
            self._secrets[url] = secrets
            _REDACTOR.add(secrets)
        return secrets

    def _send(
        self,
        url: str,
        title: str,
        body: str,
        label: str,
        secrets: frozenset[str],
        headers: Any,
        exchange: Exchange | None,
    ) -> int | None:
        """Runs in its own thread: build the plugin, notify, explain any failure; the last
        HTTP status the target answered, if it answered over HTTP."""
        scheme = _scheme(url)
        apprise = loaded_apprise()
        if self._asset is None:
            # service_timeout=0 keeps apprise from handing each send to its own shared
            # thread pool: the send runs in our thread, under our timeout.
            self._asset = apprise.AppriseAsset(service_timeout=0)
        plugin = apprise.Apprise.instantiate(url, asset=self._asset)
        if plugin is None:
            message = f"{label}: invalid {scheme} URL, apprise could not load it"
            raise DeliveryError(message, label=label)
        private = private_tokens(plugin)
        _REDACTOR.add(private)
        secrets |= private
        # apprise sleeps between requests of one instance (request_rate_per_sec, up to
        # 5.5 s); our outbox paces retries itself, so that must never delay a send.
        plugin.request_rate_per_sec = 0
        # Bound each socket wait so a thread we stopped waiting for still ends soon;
        # a little beyond our timeout, so a slow target reliably reports as timed out.
        plugin.socket_connect_timeout = self.timeout + 1.0
        plugin.socket_read_timeout = self.timeout + 1.0

        notifier = apprise.Apprise(asset=self._asset)
        notifier.add(plugin)
        log.debug("sending %s notification to %s", scheme, label)
        _answered.status = None
        _answered.headers = headers
        _answered.exchange, _answered.secrets = exchange, secrets
        if exchange is not None and private:  # a token in the host: not shown either
            exchange.url = shown_url(url, secrets)
        try:
            result = notifier.notify(body=body, title=title, body_format=_body_format(plugin))
        except Exception as exc:
            reason = redact(f"{type(exc).__name__}: {exc}", secrets)
            raise DeliveryError(f"{label}: {scheme} target failed: {reason}", label=label) from None
        status: int | None = getattr(_answered, "status", None)
        try:
            if result:
                return status
            reasons = [
                redact(entry.message, secrets)
                for entry in result.logs()
                if entry.level not in ("DEBUG", "INFO", "TRACE")
            ]
        finally:
            result.close()
        raise DeliveryError(
            _failure_message(label, scheme, reasons),
            label=label,
            status=_status(reasons) or status,
        )


def _body_format(plugin: Any) -> apprise.NotifyFormat | None:
    """TEXT for a target that would show the body as HTML, so that apprise escapes it.

    Titles and bodies are plain text (templates render with HTML escaping off), but a
    body of no declared format goes into an HTML target as it is: an event value such as
    `<img src=x onerror=...>` would be markup in the mail. Declared as text, it is escaped
    in any HTML part, and email goes as text only unless its URL asks for `format=html`.
    Other targets (Markdown chats) get the body as written, Markdown a rule may use included.
    """
    import apprise

    resolve = getattr(plugin, "resolve_format", None)  # apprise 2; before, notify_format
    shown = resolve(None) if callable(resolve) else getattr(plugin, "notify_format", None)
    return apprise.NotifyFormat.TEXT if shown == apprise.NotifyFormat.HTML else None


def _status(reasons: list[str]) -> int | None:
    """The HTTP status apprise last reported in its failure reasons ("error=500"), if any."""
    for reason in reversed(reasons):
        if match := _HTTP_STATUS_RE.search(reason):
            return int(match.group(1))
    return None


def _failure_message(label: str, scheme: str, reasons: list[str]) -> str:
    """oncall[0]: json target answered HTTP 500"""
    if (status := _status(reasons)) is not None:
        return f"{label}: {scheme} target answered HTTP {status}"
    if not reasons:
        return f"{label}: {scheme} target failed, apprise gave no reason"
    unique = list(dict.fromkeys(r.strip() for r in reasons))
    detail = "; ".join(unique)
    if len(detail) > 300:
        detail = detail[:297] + "..."
    return f"{label}: {scheme} target failed: {detail}"


def _log_console(label: str, title: str, body: str) -> None:
    """[oncall[0]] Attention dropped: user_42 | Session sess_1 at 20 (threshold 40)"""
    lines = [line.strip() for line in f"{title}\n{body}".splitlines() if line.strip()]
    logging.getLogger(CONSOLE_LOGGER).info("[%s] %s", label, " | ".join(lines))
