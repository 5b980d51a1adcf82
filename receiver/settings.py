"""Settings, read once from RECEIVER_* environment variables (each also a `receiver serve` flag)."""

from __future__ import annotations

import ipaddress
import os
import re
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from receiver.durations import format_duration
from receiver.errors import ConfigError
from receiver.events import SENDER_RETRIES

# Used when RECEIVER_SECRETS is unset, so `make run` + `receiver send` work with no account.
# It is public (it is in the README), so it is accepted only on a loopback address.
DEV_SECRET = "dev-secret-not-for-production"
# Refused off loopback as well: every value this repository shows as a placeholder for
# RECEIVER_SECRETS (deploy/, the README, docs/, --help examples), compared ignoring case,
# and any secret shorter than MIN_SECRET_LENGTH. tests/test_exposure.py finds each
# placeholder shipped and checks that it is refused.
PLACEHOLDER_SECRETS = frozenset(
    {
        DEV_SECRET,
        "replace-with-the-webhook-signing-secret",  # deploy/k8s/secret.yaml until 2026-11
        "...",
        "4f1c...",
        "s3cret",
        "secret",
        "new",
        "old",
    }
)
MIN_SECRET_LENGTH = 16
# The rules file when RECEIVER_RULES is not set; without it, the built-in rules apply.
DEFAULT_RULES = Path("./rules.yaml")
# The sender retries a failed delivery after 1m, 5m, 30m, 2h and 8h: 10h36m in all.
SENDER_RETRY_SPAN = sum(SENDER_RETRIES)
# The service's schedule as RECEIVER_WEBHOOK_SCHEDULE writes it: 1m,5m,30m,2h,8h.
SENDER_SCHEDULE = ",".join(format_duration(delay) for delay in SENDER_RETRIES)
# The PostgreSQL driver's own default: a statement run this many times on one connection is
# prepared there.
DB_PREPARE_THRESHOLD = 5
# A URL's user part, "user:pw@" after the scheme: RECEIVER_PUBLIC_URL refuses one, and its
# error shows it as "***@".
_USERINFO = re.compile(r"(?<=://)[^/]*@")


def parse_secrets(text: str) -> list[str]:
    """RECEIVER_SECRETS: comma-separated signing secrets, blanks and spaces dropped.

    >>> parse_secrets(" new, old ,")
    ['new', 'old']
    """
    return [part.strip() for part in text.split(",") if part.strip()]


def signing_secret(given: str | None = None) -> bytes:
    """What `receiver send`, `sign` and `simulate` sign with: the given secret, else the
    first of RECEIVER_SECRETS, else the development secret."""
    if given:
        return given.encode()
    found = parse_secrets(os.environ.get("RECEIVER_SECRETS", ""))
    return (found[0] if found else DEV_SECRET).encode()


def webhook_delays(text: str) -> tuple[float, ...]:
    """RECEIVER_WEBHOOK_SCHEDULE: comma-separated delays (30s, 5m, 2h or seconds).

    >>> webhook_delays("1m, 5m, 30")
    (60.0, 300.0, 30.0)
    """
    from receiver.durations import parse_duration

    parts = [p.strip() for p in text.split(",")]
    if not all(parts):
        raise ValueError(f"must be comma-separated delays such as 1m,5m,30m; got {text!r}")
    return tuple(float(p) if p.replace(".", "", 1).isdigit() else parse_duration(p) for p in parts)


def prepare_threshold(text: str) -> int | None:
    """RECEIVER_DB_PREPARE_THRESHOLD: executions of one statement on one connection before
    the PostgreSQL driver prepares it there (0: at once), or off: never (None), as a pooler
    that does not keep prepared statements needs (PgBouncer in transaction mode before 1.21).

    >>> prepare_threshold("5"), prepare_threshold(" OFF ")
    (5, None)
    """
    word = text.strip().lower()
    if word == "off":
        return None
    if word.isdigit():
        return int(word)
    raise ValueError(
        "must be a whole number of executions, 0 or more, after which a statement is"
        " prepared, or off to never prepare (behind PgBouncer in transaction mode);"
        f" got {text[:40]!r}"
    )


def env_prepare_threshold() -> int | None:
    """What the commands beside `receiver serve` open PostgreSQL with:
    RECEIVER_DB_PREPARE_THRESHOLD, else the driver's default."""
    text = os.environ.get("RECEIVER_DB_PREPARE_THRESHOLD")
    try:
        return DB_PREPARE_THRESHOLD if text is None else prepare_threshold(text)
    except ValueError as exc:
        raise ConfigError(f"RECEIVER_DB_PREPARE_THRESHOLD: {exc}") from None


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="RECEIVER_", extra="ignore")

    host: str = "127.0.0.1"
    port: int = Field(default=4000, ge=0, le=65535)
    db: str = "./data/receiver.db"
    rules: Path = DEFAULT_RULES
    secrets: str = Field(default="", repr=False)
    max_body: int = Field(default=65536, gt=0)
    log_format: Literal["text", "json"] = "text"
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    synchronous: Literal["full", "normal"] = "full"
    # Longest a send may take before it counts as failed (and is retried).
    notify_timeout: float = Field(default=10.0, gt=0)
    # From SIGTERM/SIGINT to exit: requests in flight finish, then sends in flight get what
    # is left; a send still running at the end is abandoned and stays pending.
    shutdown_grace: float = Field(default=10.0, gt=0)
    notify_concurrency: int = Field(default=8, gt=0)
    retry_initial: float = Field(default=30.0, gt=0)
    retry_max: float = Field(default=3600.0, gt=0)
    retry_for: float = Field(default=86400.0, gt=0)
    # Replay protection: a signed event whose timestamp is older than this is refused
    # (0 disables). Must stay shorter than retention, which forgets ids after it.
    max_event_age: float = Field(default=7 * 86400.0, ge=0)
    # A signed event whose timestamp is further ahead of our clock than this is refused
    # (0 disables): one event dated in the future would otherwise make every later event
    # of its session look stale.
    max_clock_skew: float = Field(default=300.0, ge=0)
    # Slow clients: headers, then the body, not fully received within these are refused (408).
    header_timeout: float = Field(default=10.0, gt=0)
    body_timeout: float = Field(default=10.0, gt=0)
    # Connections plus requests in progress beyond which uvicorn answers 503 (0 = no limit).
    limit_concurrency: int = Field(default=1000, ge=0)
    # Events (and their finished notifications, and quarantined bodies) older than this are
    # pruned. An id pruned is new again, so it must outlast the sender's retries.
    retention: float = Field(default=30 * 86400.0, gt=0)
    # Deliveries to webhook subscribers (POST /v1/webhooks): the longest one may take, the
    # delays between attempts (the service's own: 1m, 5m, 30m, 2h, 8h; failed after the
    # last), and whether subscribers may be private addresses or plain http.
    webhook_timeout: float = Field(default=10.0, gt=0)
    webhook_schedule: str = SENDER_SCHEDULE
    webhook_allow_private: bool = False
    webhook_allow_http: bool = False
    # A subscriber failing (every delivery failed) for this long is disabled, and its owner
    # told (webhook.disabled); it is failing after 5 failures in a row or an hour of them.
    webhook_disable_after: float = Field(default=3 * 86400.0, gt=0)
    # The highest rateLimit (deliveries a second) a subscription may ask for.
    webhook_max_rate: float = Field(default=1000.0, ge=1)
    # Subscriptions one API key may have (not counting deleted ones); the CLI's are not
    # counted against any key.
    webhooks_per_key: int = Field(default=100, gt=0)
    # The admin page (/admin): "off" removes it entirely.
    admin: Literal["on", "off"] = "on"
    # The upstream service (receiver.upstream): its base URL (ending in /v1), our API key
    # there and its plan (60, 600 or unlimited requests a minute), and how long a
    # notification waits for enrichment before it goes out without. All optional: without
    # the URL and the key, nothing talks to the upstream.
    upstream_url: str | None = None
    upstream_key: str | None = Field(default=None, repr=False)
    upstream_plan: Literal["free", "pro", "enterprise"] = "free"
    upstream_timeout: float = Field(default=2.0, gt=0)
    # A background loop failing (receiver.supervisor) for longer than this makes /healthz
    # answer 503, so an orchestrator restarts the process (/readyz says so at once).
    unhealthy_after: float = Field(default=60.0, gt=0)
    # The receiver's address as users reach it (http(s), no query or fragment): turns on
    # the one-click action links in every message ({public_url}/act/<token>), valid for
    # link_ttl; unset, templates see links empty.
    public_url: str | None = None
    link_ttl: float = Field(default=86400.0, gt=0)
    # The Slack app channel (slack-app:// notifiers, receiver.notify.slack): the app's bot
    # token (xoxb-...) and signing secret, read only from the environment, never shown; and
    # the Web API's address (a proxy, or a stand-in in tests).
    slack_bot_token: str | None = Field(default=None, repr=False)
    slack_signing_secret: str | None = Field(default=None, repr=False)
    slack_api_url: str = "https://slack.com/api/"
    # PostgreSQL: a statement run this many times on one connection is prepared there;
    # None ("off") never prepares, for a pooler that does not keep prepared statements.
    db_prepare_threshold: int | None = DB_PREPARE_THRESHOLD
    # OpenTelemetry traces (receiver.tracing): auto is on when OTEL_EXPORTER_OTLP_ENDPOINT or
    # OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set; on exports to the OTLP default
    # (localhost:4318) without one; off never traces, whatever the OTEL_* variables say.
    tracing: Literal["auto", "on", "off"] = "auto"
    # Processes serving the one listening socket (receiver.cli._workers): 1 serves in this
    # process; more start that many workers on the same store, restarted if they die.
    workers: int = Field(default=1, ge=1, le=64)
    # The ntfy channel's sequence ids (receiver.notify.ntfy): on, one phone notification per
    # alert episode, replaced by each later message (ntfy 2.16+); off for older servers.
    ntfy_sequence: Literal["on", "off"] = "on"

    @field_validator(
        "notify_timeout",
        "shutdown_grace",
        "retry_initial",
        "retry_max",
        "retry_for",
        "max_event_age",
        "max_clock_skew",
        "header_timeout",
        "body_timeout",
        "retention",
        "webhook_timeout",
        "webhook_disable_after",
        "upstream_timeout",
        "unhealthy_after",
        "link_ttl",
        mode="before",
    )
    @classmethod
    def _duration(cls, value: object) -> object:
        """Seconds as a number, or a duration such as 30s, 15m, 1h30m, 1d."""
        if isinstance(value, str) and value.strip() and not value.strip()[-1].isdigit():
            from receiver.durations import parse_duration

            return parse_duration(value.strip())
        return value

    @field_validator("db_prepare_threshold", mode="before")
    @classmethod
    def _prepare_threshold(cls, value: object) -> object:
        """A whole number, 0 or more, or off (None)."""
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | str):
            raise ValueError(f"must be a whole number, 0 or more, or off; got {value!r}")
        return prepare_threshold(str(value))

    @field_validator("retention")
    @classmethod
    def _outlasts_retries(cls, value: float, info: ValidationInfo) -> float:
        """An id pruned is accepted as new again: keep it while the sender may still retry
        it, and while a replay of it would still pass the max-event-age check."""
        if value < SENDER_RETRY_SPAN:
            raise ValueError(
                f"must be at least 10h36m ({SENDER_RETRY_SPAN:g}s), the sender's retry span;"
                f" got {value:g}s"
            )
        max_age = info.data.get("max_event_age")
        if max_age and value <= max_age:
            raise ValueError(
                f"must be longer than the max event age ({max_age:g}s); got {value:g}s"
            )
        return value

    @field_validator("webhook_schedule")
    @classmethod
    def _schedule(cls, value: str) -> str:
        webhook_delays(value)  # raises ValueError saying what is wrong
        return value

    @field_validator("upstream_url")
    @classmethod
    def _upstream_url(cls, value: str | None) -> str | None:
        """Blank means unset; otherwise an http(s) URL ending in /v1, as the document's
        {base_url} does."""
        if value is None or not value.strip():
            return None
        url = value.strip().rstrip("/")
        if not url.startswith(("http://", "https://")) or not url.endswith("/v1"):
            raise ValueError(
                f"must be the service's base URL, http(s)://... ending in /v1; got {url[:80]!r}"
            )
        return url

    @field_validator("slack_bot_token", "slack_signing_secret")
    @classmethod
    def _blank_is_unset(cls, value: str | None) -> str | None:
        return value.strip() if value is not None and value.strip() else None

    @field_validator("slack_api_url")
    @classmethod
    def _slack_api_url(cls, value: str) -> str:
        """An http(s) URL; the Web API's methods are below it, so it ends in a slash."""
        url = value.strip()
        if not url.startswith(("http://", "https://")) or not urlsplit(url).hostname:
            raise ValueError(
                f"must be an http(s) URL such as https://slack.com/api/; got {url[:80]!r}"
            )
        return url if url.endswith("/") else url + "/"

    @field_validator("public_url")
    @classmethod
    def _public_url(cls, value: str | None) -> str | None:
        """Blank means unset; otherwise an http(s) URL with a host and no query or
        fragment (a path is kept: a receiver behind a prefix), no user name or password
        (every message would hand them out), no space or control character. An error
        never shows a password: the URL's user part is shown as ***."""
        if value is None or not value.strip():
            return None
        url = value.strip().rstrip("/")
        parts = urlsplit(url)
        # Up to the last "@" before the path: a password holding "#" or "?" would end
        # urlsplit's netloc early.
        shown, at = _USERINFO.subn("***@", url, count=1)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(
                f"must be an http(s) URL such as https://alerts.example.com; got {shown[:80]!r}"
            )
        if at:
            raise ValueError(
                "must carry no user name or password (every message's links would show"
                f" them); got {shown[:80]!r}"
            )
        if any(c.isspace() or not c.isprintable() for c in url):
            raise ValueError(
                f"must contain no space or control character (encode a space as %20); got"
                f" {shown[:80]!r}"
            )
        if parts.query or parts.fragment or "?" in url or "#" in url:
            raise ValueError(f"must have no query or fragment; got {shown[:80]!r}")
        return url

    @property
    def upstream_configured(self) -> bool:
        """Whether RECEIVER_UPSTREAM_URL and RECEIVER_UPSTREAM_KEY are both set."""
        return bool(self.upstream_url and self.upstream_key)

    @property
    def webhook_delays(self) -> tuple[float, ...]:
        return webhook_delays(self.webhook_schedule)

    @property
    def secret_list(self) -> list[bytes]:
        """The signing secrets, the development secret when none is configured."""
        found = [s.encode() for s in parse_secrets(self.secrets)]
        return found or [DEV_SECRET.encode()]

    @property
    def using_dev_secret(self) -> bool:
        return not parse_secrets(self.secrets)

    @property
    def rules_file(self) -> Path | None:
        """The rules file to load, or None for the built-in rules.

        A file named by RECEIVER_RULES (or --rules) must exist; without one,
        ./rules.yaml is used if it exists, else the built-in rules.
        """
        if "rules" in self.model_fields_set or self.rules.exists():
            return self.rules
        return None

    def check_exposure(self, exposed: str | None = None) -> None:
        """Raise ConfigError if a secret anyone could know would be accepted off loopback:
        the public development secret, a placeholder shipped in this repository, or one
        shorter than MIN_SECRET_LENGTH. The message never carries the secret itself.

        exposed says why the receiver is reachable from elsewhere whatever its address
        (the systemd unit: "behind a reverse proxy"); then the check applies on loopback too.
        """
        hint = ""
        if exposed is None:
            if is_loopback(self.host):
                return
            exposed = f'RECEIVER_HOST (--host) "{self.host}" is not a loopback address'
            hint = ", or listen on 127.0.0.1"
        if self.using_dev_secret:
            raise ConfigError(
                f"RECEIVER_SECRETS is not set and {exposed}: refusing to start, because"
                " anyone could sign deliveries with the public development secret; set"
                " RECEIVER_SECRETS to your signing secret (comma-separated during a"
                f" rotation){hint}"
            )
        found = parse_secrets(self.secrets)
        for position, secret in enumerate(found, 1):
            problem = weak_secret(secret)
            if problem is None:
                continue
            which = "RECEIVER_SECRETS"
            if len(found) > 1:
                which = f"secret {position} of RECEIVER_SECRETS"
            raise ConfigError(
                f"{which} {problem}, and {exposed}: refusing to start, because anyone could"
                " guess it and sign deliveries; set RECEIVER_SECRETS to the signing secret"
                f" the service gave you (at least {MIN_SECRET_LENGTH} characters, not an"
                f" example){hint}"
            )

    def check_workers(self) -> None:
        """Raise ConfigError if these settings cannot run as several worker processes."""
        if self.workers == 1:
            return
        db = self.db.strip().removeprefix("sqlite:///")
        if db == ":memory:" or db.startswith("file::memory:") or "mode=memory" in db:
            raise ConfigError(
                f"RECEIVER_WORKERS (--workers) {self.workers} needs a database file or a"
                f" postgresql:// URL; RECEIVER_DB {self.db!r} is in memory: each worker"
                " would have a database of its own"
            )
        if self.admin == "on":
            raise ConfigError(
                f"RECEIVER_WORKERS (--workers) {self.workers} needs RECEIVER_ADMIN (--admin)"
                " off: the admin page's bulk retries report their progress, and its header"
                " its receiving rate, from the one worker that serves the request; run the"
                " admin page in a receiver of its own on the same database (see Several"
                " worker processes in docs/operations.md)"
            )


def weak_secret(secret: str) -> str | None:
    """Why a signing secret must not be accepted off loopback, or None if it may be.

    >>> weak_secret("dev-secret-not-for-production"), weak_secret("a")
    ('is the public development secret', 'is shorter than 16 characters')
    """
    if secret == DEV_SECRET:
        return "is the public development secret"
    if secret.casefold() in PLACEHOLDER_SECRETS:
        return "is a placeholder shown in this project's files"
    if len(secret) < MIN_SECRET_LENGTH:
        return f"is shorter than {MIN_SECRET_LENGTH} characters"
    return None


def is_loopback(host: str) -> bool:
    """True for an address only this machine can reach: 127.0.0.0/8, ::1 or localhost.

    Every other address and name is not loopback: "0.0.0.0" and "::" (every
    interface), "10.0.0.5", "example.com", even a name that resolves to 127.0.0.1.
    """
    name = host.strip().removeprefix("[").removesuffix("]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def main() -> None:
    """`python -m receiver.settings`: exit 2, saying why, unless RECEIVER_SECRETS would be
    accepted off loopback. The systemd unit runs it before starting, because a receiver on
    127.0.0.1 behind a reverse proxy is just as exposed."""
    import sys

    try:
        Settings().check_exposure("it is served to the network (systemd unit, reverse proxy)")
    except ConfigError as exc:
        print(f"Error: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
