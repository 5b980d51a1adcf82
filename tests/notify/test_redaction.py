"""receiver.notify.redaction.shown_url: a notifier's or subscriber's URL as a trace's
url.full shows it, and the attributes tracing.client_request makes of it."""

from __future__ import annotations

import pytest

from receiver import tracing
from receiver.notify.redaction import shown_url, url_secrets


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        pytest.param(
            "https://hooks.slack.com/services/T000/B000/XXXXXXXX",
            "https://hooks.slack.com/REDACTED/REDACTED/REDACTED/REDACTED",
            id="a token in the path",
        ),
        pytest.param(
            "json://user:pw-123@127.0.0.1:8080/notify?-key=val-1&+X-Token=tok-1&format=json",
            "json://REDACTED:REDACTED@127.0.0.1:8080/REDACTED?-key=REDACTED&+X-Token=REDACTED"
            "&format=json",
            id="a password, passed-through values, a behaviour switch",
        ),
        pytest.param(
            "mailto://ops:pw@smtp.example.com:2525?to=oncall@example.com",
            "mailto://REDACTED:REDACTED@smtp.example.com:2525?to=oncall@example.com",
            id="mail: no path",
        ),
        pytest.param("tgram://123456:ABCdef/987", "tgram://REDACTED", id="no port, a token"),
        pytest.param("https://h.example/abc123#frag", "https://h.example/REDACTED", id="fragment"),
        pytest.param("console://", "console://", id="console"),
    ],
)
def test_shown_url_keeps_where_and_drops_every_secret(url: str, shown: str) -> None:
    assert shown_url(url, url_secrets(url)) == shown
    hosts = {"127.0.0.1", "smtp.example.com", url}  # console:// is all shown, and no secret
    assert not {s for s in url_secrets(url) if s in shown} - hosts


def test_a_host_that_is_a_token_is_not_shown() -> None:
    assert shown_url("discord://tok3n:9000/x", {"tok3n"}) == "discord://REDACTED:9000/REDACTED"
    assert tracing.client_request(None, "discord://REDACTED:9000/REDACTED") == {
        tracing.URL_FULL: "discord://REDACTED:9000/REDACTED"
    }


def test_client_request_names_the_server_with_the_schemes_default_port() -> None:
    assert tracing.client_request("POST", "https://h.example/REDACTED", "timeout") == {
        "http.request.method": "POST",
        "url.full": "https://h.example/REDACTED",
        "server.address": "h.example",
        "server.port": 443,
        "error.type": "timeout",
    }
    mail = tracing.client_request(None, "mailto://REDACTED@smtp.example.com")
    assert mail == {
        "url.full": "mailto://REDACTED@smtp.example.com",
        "server.address": "smtp.example.com",
    }
