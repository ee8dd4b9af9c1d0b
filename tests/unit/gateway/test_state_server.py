"""The state server's start-up check: it says which server answers (never its password), and a
server that does not answer yet is a warning, not a failure."""

from __future__ import annotations

import logging

import pytest

from gateway.state_server import check, redacted
from tests.support.gateway_process import free_port


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://valkey:6379/0", "redis://valkey:6379/0"),
        ("redis://:s3cret@valkey:6379/0", "redis://:***@valkey:6379/0"),
        ("rediss://user:s3cret@valkey/2", "rediss://user:***@valkey/2"),
    ],
)
def test_logged_urls_hide_the_password(url: str, shown: str) -> None:
    assert redacted(url) == shown


async def test_the_check_names_the_server_that_answers(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="gateway.state_server"):
        assert await check(redis_url) is True
    assert "state server redis://127.0.0.1" in caplog.text
    assert " redis " in caplog.text or " valkey " in caplog.text


async def test_a_server_that_does_not_answer_is_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    url = f"redis://:pw@127.0.0.1:{free_port()}/0"
    with caplog.at_level(logging.WARNING, logger="gateway.state_server"):
        assert await check(url) is False
    assert "does not answer yet" in caplog.text and "pw@" not in caplog.text
