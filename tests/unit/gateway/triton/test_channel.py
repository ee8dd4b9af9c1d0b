"""The gateway's gRPC channel stays within the keepalive policy of a default tritonserver, read from
the real binary's own help: a channel that pings more often gets GOAWAY "too_many_pings", which
closes the connection and fails every stream on it."""

from __future__ import annotations

import re
import subprocess

from deploy import devstack
from gateway.triton.connection import CHANNEL_OPTIONS


def triton_default(help_text: str, flag: str) -> int:
    section = help_text.split(flag, 1)[1].split("\n  --", 1)[0]
    match = re.search(r"Default is (\d+)", section)
    assert match is not None, f"no default for {flag} in tritonserver --help"
    return int(match.group(1))


def test_keepalive_pings_stay_within_what_a_default_triton_accepts() -> None:
    triton = devstack.find_triton()
    result = subprocess.run(
        [str(triton.binary), "--help"],
        env=devstack.server_environment(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    help_text = result.stdout + result.stderr
    options = dict(CHANNEL_OPTIONS)
    # At most one ping per interval while no data flows, or it is a strike.
    assert options["grpc.keepalive_time_ms"] >= triton_default(
        help_text, "--grpc-http2-min-recv-ping-interval-without-data"
    )
    # A server that does not permit pings without calls must not get any.
    if triton_default(help_text, "--grpc-keepalive-permit-without-calls") == 0:
        assert options["grpc.keepalive_permit_without_calls"] == 0
