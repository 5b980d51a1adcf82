"""The webhook channel: signed POSTs of events to subscribers, with the service's schedule.

A delivery is an outbox row (notifier "@subscriber", subscription_id and target the
subscription's id, delivery_id its stable id, body the exact JSON to send), claimed, retried
and recorded as a notification is: WebhookChannel is a receiver.notify.channel Channel. This
module signs and sends one, and says how it went.

Safety: a subscriber's address is checked when it registers and again at every send,
on the address actually connected to (the connection goes to the address that passed
the check, so a DNS answer that changes in between cannot swap it): loopback, private,
link-local (cloud metadata), multicast and other non-global addresses are refused, and
so is plain http, unless RECEIVER_WEBHOOK_ALLOW_PRIVATE / _ALLOW_HTTP say otherwise.
Redirects are not followed.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import ipaddress
import logging
import secrets
import socket
import ssl
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import quote, urlsplit

import anyio
import httpcore
import httpx
from httpcore._utils import is_socket_readable

from receiver import __version__, signature, tracing
from receiver.events import SENDER_RETRIES
from receiver.notify import answers
from receiver.notify.backoff import Delays
from receiver.notify.channel import Kind, Result, excerpt
from receiver.notify.health import Outcome, judge, lane_caps, pace
from receiver.notify.redaction import shown_url, url_secrets
from receiver.signature import SIGNATURE_HEADER
from receiver.store import OutboxRow, Store
from receiver.store.records import WEBHOOK_CHANNEL, WEBHOOK_NOTIFIER, Webhook
from receiver.store.webhook_health import HealthPolicy

log = logging.getLogger("receiver.webhooks")

EVENT_ID_HEADER = "X-Service-Event-Id"
REFRESH = 2.0  # seconds a replica may go on using a subscription it read (a new secret...)


class UnsafeURLError(ValueError):
    """A subscriber URL this receiver refuses to send to; the message says why."""


def new_secret(format: str) -> str:
    """A signing secret: Standard Webhooks' whsec_<base64> form for "standard" subscribers,
    64 hex characters (used as the HMAC key text, as the service does) otherwise."""
    if format == "standard":
        return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()
    return secrets.token_hex(32)


# Printable ASCII but "%": what a header value that needs encoding keeps as it is.
_HEADER_SAFE = "".join(chr(c) for c in range(0x20, 0x7F) if chr(c) != "%")


def header_value(value: str) -> str:
    """value as an HTTP header may carry it: as it is when it is printable ASCII; else its
    UTF-8 percent-encoded (RFC 3986), every byte outside printable ASCII and every "%".

    >>> header_value("evt_1"), header_value("évt 1"), header_value("a%b\\nc")
    ('evt_1', '%C3%A9vt 1', 'a%25b%0Ac')
    """
    if value.isascii() and value.isprintable():
        return value
    return quote(value, safe=_HEADER_SAFE)


def control_character(text: str) -> str | None:
    """The first control character (C0, DEL or C1) in text, as an escape, or None."""
    for char in text:
        if ord(char) < 0x20 or 0x7F <= ord(char) <= 0x9F:
            return f"\\x{ord(char):02x}"
    return None


def sign(sub: Webhook, delivery_id: str, body: bytes, now: float) -> dict[str, str]:
    """The headers that let the subscriber check this body came from us. The delivery id
    goes out through header_value, and a Standard Webhooks signature covers that form,
    the one the subscriber reads from webhook-id."""
    delivery_id = header_value(delivery_id)
    if sub.format == "standard":
        stamp = str(int(now))
        signed = f"{delivery_id}.{stamp}.".encode() + body
        keys = [sub.secret]
        if sub.previous_secret and sub.previous_until is not None and now < sub.previous_until:
            keys.append(sub.previous_secret)  # a rotation's overlap: both, the new one first
        raw = [base64.b64decode(k.removeprefix("whsec_")) for k in keys]
        digests = [hmac.new(k, signed, hashlib.sha256).digest() for k in raw]
        return {
            "webhook-id": delivery_id,
            "webhook-timestamp": stamp,
            "webhook-signature": " ".join(f"v1,{base64.b64encode(d).decode()}" for d in digests),
        }
    # The service's own form, made as the receiver checks it (receiver.signature).
    return {
        SIGNATURE_HEADER: signature.sign(sub.secret.encode(), body),
        EVENT_ID_HEADER: delivery_id,
    }


# IPv6 prefixes that carry an IPv4 address, which a translator or relay on the way may
# deliver to: the well-known NAT64 prefix and 6to4 are judged by the address they carry;
# the rest (local-use NAT64, Teredo, IPv4-compatible, SIIT's IPv4-translated) are refused.
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_6TO4 = ipaddress.ip_network("2002::/16")
_EMBEDDING = {
    ipaddress.ip_network("64:ff9b:1::/48"): "local-use NAT64 (64:ff9b:1::/48)",
    ipaddress.ip_network("2001::/32"): "Teredo (2001::/32)",
    ipaddress.ip_network("::/96"): "IPv4-compatible (::/96)",
    ipaddress.ip_network("::ffff:0:0:0/96"): "IPv4-translated (::ffff:0:0:0/96)",
}


def _refused(address: str) -> str | None:
    """Why an IP address is no place to send a webhook, or None if it is a public one."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        else:
            carried = None
            if ip in _NAT64:
                carried = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
            elif ip in _6TO4:
                carried = ip.sixtofour
            if carried is not None:
                why = _refused(str(carried))
                if why is not None:
                    return f"{address} carries {carried}, which{why.split(str(carried), 1)[1]}"
                return None
            for network, what in _EMBEDDING.items():
                if ip in network and not ip.is_loopback and not ip.is_unspecified:
                    return f"{address} is {what}, which carries an IPv4 address"
    for test, what in (
        (ip.is_loopback, "loopback"),
        (ip.is_link_local, "link-local (cloud metadata lives there)"),
        (ip.is_multicast, "multicast"),
        (ip.is_private, "private"),
        (ip.is_unspecified, "unspecified"),
        (not ip.is_global, "not a public address"),
    ):
        if test:
            return f"{address} is {what}"
    return None


def check_url(url: str, *, allow_http: bool) -> tuple[str, int]:
    """The host and port of a subscriber URL; UnsafeURLError if its form is refused."""
    bad = control_character(url)
    if bad is not None:
        raise UnsafeURLError(f"url must not contain control characters; found {bad}")
    parts = urlsplit(url)
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise UnsafeURLError(f"url must be an absolute https:// URL; got {url[:200]!r}")
    if parts.scheme == "http" and not allow_http:
        raise UnsafeURLError(
            "url must use https (RECEIVER_WEBHOOK_ALLOW_HTTP=1 allows http on closed networks)"
        )
    if parts.username or parts.password:
        raise UnsafeURLError("url must not carry a user name or password")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise UnsafeURLError(f"url has an invalid port: {url[:200]!r}") from None
    return parts.hostname, port


async def resolve(host: str, port: int, *, allow_private: bool) -> list[str]:
    """The addresses of host that may be sent to (all of them, with allow_private);
    UnsafeURLError if none may, or it does not resolve."""
    try:
        infos = await anyio.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise UnsafeURLError(f"{host} does not resolve: {exc.strerror or exc}") from None
    addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
    if allow_private:
        return addresses
    refused = [why for a in addresses if (why := _refused(a)) is not None]
    if refused:  # one bad answer is enough to refuse: the next lookup might pick it
        raise UnsafeURLError(
            f"{host} resolves to a refused address ({refused[0]}); subscribers must be public"
            " (RECEIVER_WEBHOOK_ALLOW_PRIVATE=1 allows private ones on closed networks)"
        )
    return addresses


async def check_subscriber(url: str, *, allow_private: bool, allow_http: bool) -> None:
    """Registration's check of a subscriber URL; UnsafeURLError saying what is wrong."""
    host, port = check_url(url, allow_http=allow_http)
    await resolve(host, port, allow_private=allow_private)


class _Stream(httpcore.AsyncNetworkStream):
    """anyio's stream with the socket looked up once. httpcore asks every idle connection
    of the pool whether it is readable before each request, and anyio answers each ask by
    building all its socket attributes (a getpeername() system call, an import): that was
    a third of a delivery's CPU."""

    def __init__(self, inner: httpcore.AsyncNetworkStream) -> None:
        self.inner = inner
        self.sock: socket.socket | None = inner.get_extra_info("socket")

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return await self.inner.read(max_bytes, timeout)

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        await self.inner.write(buffer, timeout)

    async def aclose(self) -> None:
        await self.inner.aclose()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.AsyncNetworkStream:
        return _Stream(await self.inner.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> Any:
        if info == "socket":
            return self.sock
        if info == "is_readable":
            return is_socket_readable(self.sock)  # what httpcore's own stream does
        return self.inner.get_extra_info(info)


class _CheckedBackend(httpcore.AsyncNetworkBackend):
    """Connects only to addresses that pass the check, to the very address checked."""

    def __init__(self, allow_private: bool) -> None:
        self.allow_private = allow_private
        self.inner = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Any = None,
    ) -> httpcore.AsyncNetworkStream:
        addresses = await resolve(host, port, allow_private=self.allow_private)
        # Each checked address in turn, as a plain connect would: a host's IPv6 address
        # first is no use where IPv6 does not route (or localhost's ::1 to an IPv4 server).
        for address in addresses[:-1]:
            try:
                return _Stream(
                    await self.inner.connect_tcp(
                        address, port, timeout, local_address, socket_options
                    )
                )
            except httpcore.ConnectError:
                continue
        return _Stream(
            await self.inner.connect_tcp(
                addresses[-1], port, timeout, local_address, socket_options
            )
        )

    async def sleep(self, seconds: float) -> None:
        await self.inner.sleep(seconds)


class WebhookChannel:
    """The subscribers' channel: sends deliveries, one lane a subscription; knows the
    active subscriptions (re-read every REFRESH seconds); retries on the service's schedule
    (delays); a 410 Gone disables the subscription."""

    name = WEBHOOK_CHANNEL

    def __init__(
        self,
        store: Store,
        *,
        timeout: float = 10.0,
        delays: tuple[float, ...] = SENDER_RETRIES,
        allow_private: bool = False,
        allow_http: bool = False,
        connections: int = 8,
        clock: Callable[[], float] = time.time,
        health: HealthPolicy | None = None,
        max_rate: float = 1000.0,
    ) -> None:
        self.store = store
        self.health = health or HealthPolicy()
        self.max_rate = max_rate  # the highest rateLimit a registration may ask
        self.connections = connections  # per subscriber: its lane's sends in flight
        self.timeout = timeout
        self.schedule = Delays(delays)
        self.allow_private = allow_private
        self.allow_http = allow_http
        self.clock = clock
        self._subs: dict[int, Webhook] = {}
        self._read_at = float("-inf")
        # A connection pool per subscriber, as small as its lane: httpcore scans every
        # connection of a pool for each request, so one shared pool of hundreds made each
        # send cost O(subscribers), and a hanging subscriber's sockets were everyone's.
        self._clients: dict[int, httpx.AsyncClient] = {}
        # One TLS context for every subscriber: building one loads the CA bundle (43 ms
        # on the event loop), and a client built two; with hundreds of subscribers that
        # stalled ingest and /healthz for seconds after every start.
        self._ssl: ssl.SSLContext | None = None
        self._reading = asyncio.Lock()

    async def subscriptions(self) -> dict[int, Webhook]:
        if time.monotonic() - self._read_at < REFRESH:
            return self._subs
        # One read at a time: every delivery in flight asks, and each asking while a read
        # was under way read all the subscriptions again (1,000 sends after a start, each
        # parsing 1,000 rows on the event loop, stalled /healthz for 47 s).
        async with self._reading:
            if self._ssl is None:  # built once, off the event loop
                self._ssl = await anyio.to_thread.run_sync(httpx.create_ssl_context)
            if time.monotonic() - self._read_at >= REFRESH:
                self._subs = {w.id: w for w in await self.store.webhooks.all(active_only=True)}
                self._read_at = time.monotonic()
                for gone in self._clients.keys() - self._subs.keys():
                    await self._clients.pop(gone).aclose()
        return self._subs

    def forget(self) -> None:
        """Read the subscriptions again before the next claim (one just changed here)."""
        self._read_at = float("-inf")

    def _http(self, sub: Webhook) -> httpx.AsyncClient:
        client = self._clients.get(sub.id)
        if client is None:
            client = self._clients[sub.id] = self._client()
        return client

    def _client(self) -> httpx.AsyncClient:
        if self._ssl is None:
            self._ssl = httpx.create_ssl_context()
        transport = httpx.AsyncHTTPTransport(retries=0, verify=self._ssl)
        # Every connection through the checking backend (httpx has no option for it).
        transport._pool = httpcore.AsyncConnectionPool(
            ssl_context=self._ssl,
            max_connections=self.connections,
            network_backend=_CheckedBackend(self.allow_private),
        )
        return httpx.AsyncClient(
            transport=transport,
            follow_redirects=False,
            trust_env=False,  # no proxy from the environment: it would skip the check
            timeout=self.timeout,
            headers={"User-Agent": f"attention-receiver/{__version__}"},
        )

    async def post_once(self, sub: Webhook, row: OutboxRow) -> Outcome:
        """post, on a client of its own: a test delivery, often to a subscription that is
        not active, whose pooled client the next read of the subscriptions would close
        under it (the send then failed with no status)."""
        async with self._client() as client:
            return await self.post(sub, row, client)

    async def close(self) -> None:
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            await client.aclose()

    async def lanes(self) -> list[tuple[str, int]]:
        return [(WEBHOOK_NOTIFIER, hook) for hook in await self.subscriptions()]

    def describe(self, row: OutboxRow) -> str:
        hook = self._subs.get(row.target)
        who = hook.public_id if hook is not None else f"#{row.target}"
        return f"event {row.delivery_id} to subscriber {who}"

    def capped(self) -> dict[tuple[str, int], int]:
        """The lanes with fewer sends at once than the others (receiver.notify.health)."""
        return lane_caps(self._subs, self.connections)

    async def send(self, row: OutboxRow) -> Result:
        """One delivery to its subscriber, counted towards its health (410 Gone disables)."""
        hook = (await self.subscriptions()).get(row.target)
        if hook is None:
            # Perhaps added since the last read (by `receiver webhooks add`, another
            # replica): its row can be claimed among the other targets' before then.
            self.forget()
            hook = (await self.subscriptions()).get(row.target)
        if hook is None:
            return Result.give_up("subscription deleted or disabled")
        await pace(self.store, hook)
        out = await self.post(hook, row)
        if out.delivered:
            if hook.failures or hook.health != "healthy":  # else nothing to reset
                await self._judge(hook, out)
            return Result.delivered(status=out.status, excerpt=out.excerpt)
        error = out.error or "failed"
        await self._judge(hook, out)
        if out.gone:
            log.warning("subscriber %s answered 410 Gone: subscription disabled", hook.public_id)
            return Result.give_up(error, status=410, excerpt=out.excerpt, counted="gone")
        return Result.retry(
            error, status=out.status, excerpt=out.excerpt, retry_after=out.retry_after
        )

    async def _judge(self, hook: Webhook, out: Outcome) -> None:
        now, policy = self.clock(), self.health
        after = await judge(self.store, hook, out, now=now, schedule=self.schedule, policy=policy)
        if after is None:
            self.forget()
        else:
            self._subs[after.id] = after

    async def post(
        self, sub: Webhook, row: OutboxRow, client: httpx.AsyncClient | None = None
    ) -> Outcome:
        """Sign and POST row's body to sub, once (on sub's pooled client unless given one);
        how it went."""
        body = row.body.encode()
        try:
            check_url(sub.url, allow_http=self.allow_http)
            # identity: the excerpt is read raw, and no answer is inflated here
            headers = {"Content-Type": "application/json", "Accept-Encoding": "identity"}
            headers.update(sign(sub, row.delivery_id or "", body, self.clock()))
            if tracing.on:  # the subscriber's tracing sees our send as its parent
                if tracing.recording():
                    shown = shown_url(sub.url, url_secrets(sub.url))
                    attributes = tracing.client_request("POST", shown)
                    tracing.describe(
                        f"webhook {sub.public_id}",
                        {tracing.SUBSCRIBER: sub.public_id, **attributes},
                    )
                headers.update(tracing.current_headers())
            async with asyncio.timeout(self.timeout):  # the whole exchange, not each read
                async with (client or self._http(sub)).stream(
                    "POST", sub.url, content=body, headers=headers
                ) as response:
                    answer = await answers.read_excerpt(response)
        except UnsafeURLError as exc:
            tracing.describe(None, {tracing.ERROR_TYPE: "refused"})
            return Outcome(False, f"refused: {exc}")
        except (TimeoutError, httpx.TimeoutException):
            tracing.describe(None, {tracing.ERROR_TYPE: "timeout"})
            return Outcome(False, f"no answer within {self.timeout:g}s")
        except httpx.HTTPError as exc:
            tracing.describe(None, {tracing.ERROR_TYPE: tracing.error_type(exc)})
            return Outcome(False, f"{type(exc).__name__}: {str(exc)[:200] or 'connection failed'}")
        if sub.secret:  # a subscriber echoing its signing secret: not into our logs
            answer = answer.replace(sub.secret, "***")
        kept = excerpt(answer)
        if 200 <= response.status_code < 300:
            return Outcome(True, status=response.status_code, excerpt=kept)
        retry_after = None
        if response.status_code in (429, 503):
            retry_after = answers.retry_after(response.headers.get("retry-after"), self.clock())
        error = f"HTTP {response.status_code} {response.reason_phrase}".strip()
        if answer:
            error += ": " + answer
        return Outcome(
            False, error, status=response.status_code, retry_after=retry_after, excerpt=kept
        )


# Subscribers register with POST /v1/webhooks, not in rules.yaml: no scheme is its.
KIND = Kind(
    WEBHOOK_CHANNEL,
    frozenset(),
    lambda parts: parts.webhooks,
    takes="subscribers of POST /v1/webhooks, no notifier url",
)
