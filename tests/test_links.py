"""receiver.links: a token names its alert, episode and action, is refused when tampered
with, signed under another key or salt, or naming an unknown action, and expires after the
TTL (a settable clock); templates see every link name, empty without them."""

from __future__ import annotations

import re
import time

import pytest
from click.testing import CliRunner
from itsdangerous import URLSafeTimedSerializer
from pydantic import ValidationError

from receiver.cli import cli
from receiver.links import SALT, Claim, LinkError, LinkExpiredError, Links
from receiver.rules import templates
from receiver.settings import Settings

BASE = "https://alerts.example.com/receiver"


class Clock:
    def __init__(self) -> None:
        self.now = time.time()  # as the tokens signed here without it see it

    def __call__(self) -> float:
        return self.now


def make(clock: Clock | None = None, key: str = "k" * 32) -> Links:
    return Links(key, base=BASE + "/", ttl=3600, clock=clock or Clock())


def test_a_link_names_its_alert_episode_and_action() -> None:
    links = make()
    url = links.url("session:sess_42", "ack", 3)
    assert url.startswith(f"{BASE}/act/")
    token = url.rsplit("/", 1)[1]
    assert links.read(token) == Claim("session:sess_42", "ack", 3)
    assert links.read(links.token("session:s", "snooze")) == Claim("session:s", "snooze", None)


def test_for_alert_gives_every_action_and_the_alert_page() -> None:
    found = make().for_alert("intervention:s1:i 1")
    assert set(found) == {"ack", "resolve", "snooze", "alert"}
    assert found["alert"] == f"{BASE}/admin/alerts/intervention:s1:i%201"
    assert make().for_alert(None) == templates.NO_LINKS


def _first_of_signature(token: str) -> str:
    head, signature = token.rsplit(".", 1)
    return f"{head}.{'A' if signature[0] != 'A' else 'B'}{signature[1:]}"


@pytest.mark.parametrize(
    "change",
    [
        # The signature's first character: all six of its bits count (the last one's low
        # bits are padding, so changing it may decode to the same signature).
        pytest.param(_first_of_signature, id="signature"),
        pytest.param(lambda t: "x" + t, id="payload"),
        pytest.param(lambda t: t[: len(t) // 2], id="cut-short"),
        pytest.param(lambda t: "", id="empty"),
    ],
)
def test_a_tampered_token_is_refused(change: object) -> None:
    links = make()
    token = links.token("session:s", "resolve")
    with pytest.raises(LinkError, match="not valid") as caught:
        links.read(change(token))  # type: ignore[operator]
    assert not isinstance(caught.value, LinkExpiredError)
    assert token not in str(caught.value)


def test_another_key_or_salt_is_refused() -> None:
    token = make(key="a" * 32).token("session:s", "ack")
    with pytest.raises(LinkError):
        make(key="b" * 32).read(token)
    cookie = URLSafeTimedSerializer("k" * 32, salt="receiver-admin").dumps({"a": "x", "x": "ack"})
    with pytest.raises(LinkError):
        make().read(str(cookie))


def test_a_token_naming_an_unknown_action_is_refused() -> None:
    forged = URLSafeTimedSerializer("k" * 32, salt=SALT).dumps({"a": "session:s", "x": "delete"})
    with pytest.raises(LinkError, match="not valid"):
        make().read(str(forged))
    with pytest.raises(ValueError, match='unknown action "delete"'):
        make().token("session:s", "delete")


def test_a_token_expires_after_the_ttl() -> None:
    clock = Clock()
    links = make(clock)
    token = links.token("session:s", "ack")
    clock.now += 3600
    assert links.read(token).action == "ack"
    clock.now += 2
    with pytest.raises(LinkExpiredError, match="expired"):
        links.read(token)


def test_templates_can_test_links_that_are_off() -> None:
    template = templates.compile_template(
        "{% if links.ack %}Ack: {{ links.ack }}{% else %}-{% endif %}"
    )
    assert templates.render(template, templates.context({"type": "x"}, "r")) == "-"
    on = templates.context({"type": "x", "links": make().for_alert("session:s")}, "r")
    assert templates.render(template, on).startswith(f"Ack: {BASE}/act/")


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        pytest.param("alerts.example.com", "http(s) URL", id="no-scheme"),
        pytest.param("ftp://alerts.example.com", "http(s) URL", id="ftp"),
        pytest.param("https://", "http(s) URL", id="no-host"),
        pytest.param("https://alerts.example.com/?a=1", "no query or fragment", id="query"),
        pytest.param("https://alerts.example.com/#x", "no query or fragment", id="fragment"),
    ],
)
def test_the_public_url_is_checked(value: str, problem: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(problem)):
        Settings(public_url=value)


@pytest.mark.parametrize(
    ("value", "problem", "shown"),
    [
        pytest.param("https://ops:s3cret-pw@alerts.example.com", "no user name or password",
                     "https://***@alerts.example.com", id="user-and-password"),
        pytest.param("https://ops@alerts.example.com/r", "no user name or password",
                     "https://***@alerts.example.com/r", id="user"),
        pytest.param("https://ops:s3cret#pw@alerts.example.com", "no user name or password",
                     "https://***@alerts.example.com", id="password-with-a-hash"),
        pytest.param("ftp://ops:s3cret-pw@alerts.example.com", "http(s) URL",
                     "ftp://***@alerts.example.com", id="another-scheme-too"),
        pytest.param("https://alerts.example.com/on call", "no space or control character",
                     "https://alerts.example.com/on call", id="space"),
        pytest.param("https://alerts .example.com", "no space or control character",
                     "https://alerts .example.com", id="space-in-the-host"),
        pytest.param("https://alerts.example.com/\tx", "no space or control character",
                     "https://alerts.example.com/\tx", id="tab"),
    ],
)  # fmt: skip
def test_a_public_url_with_credentials_or_spaces_is_refused_without_the_password(
    value: str, problem: str, shown: str
) -> None:
    with pytest.raises(ValidationError) as refused:
        Settings(public_url=value)
    message = str(refused.value.errors()[0]["msg"])
    assert problem in message and repr(shown) in message
    assert "s3cret" not in message


def test_receiver_serve_names_the_refused_public_url_without_the_password() -> None:
    # RECEIVER_WORKERS=0 too, so that a server never starts here: serve lists every problem
    env = {"RECEIVER_PUBLIC_URL": "https://ops:s3cret-pw@alerts.example.com",
           "RECEIVER_WORKERS": "0"}  # fmt: skip
    result = CliRunner().invoke(cli, ["serve"], env=env)
    assert result.exit_code == 1
    [line] = result.output.splitlines()
    assert line.startswith("Error: invalid settings: ")
    assert "RECEIVER_PUBLIC_URL (--public-url): must carry no user name or password" in line
    assert "'https://***@alerts.example.com'" in line and "s3cret" not in line


def test_the_public_url_and_link_ttl_read_as_users_write_them() -> None:
    found = Settings(public_url=" https://alerts.example.com/receiver/ ", link_ttl="2h")
    assert (found.public_url, found.link_ttl) == ("https://alerts.example.com/receiver", 7200)
    assert Settings(public_url="").public_url is None
    assert Settings().link_ttl == 86400
