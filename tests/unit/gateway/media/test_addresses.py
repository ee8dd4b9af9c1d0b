from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.media.addresses import parse_address, refusal

REFUSED = [
    "127.0.0.1",
    "127.8.9.10",
    "10.0.0.1",
    "172.16.5.4",
    "192.168.1.1",
    "169.254.169.254",
    "100.100.100.200",
    "100.64.0.1",
    "0.0.0.0",
    "224.0.0.1",
    "239.255.255.250",
    "255.255.255.255",
    "240.0.0.1",
    "192.0.2.10",
    "::1",
    "::",
    "fe80::1",
    "fc00::1",
    "fd00:ec2::254",
    "ff02::1",
    "fec0::1",
    "::ffff:127.0.0.1",
    "::ffff:169.254.169.254",
    "::ffff:10.0.0.1",
    "::127.0.0.1",
    "2002:7f00:1::",
    "2002:a9fe:a9fe::",
    "64:ff9b::a9fe:a9fe",
    "64:ff9b::7f00:1",
    "2001:0:4136:e378:8000:63bf:80ff:fffe",
    "2001:db8::1",
]
ALLOWED = [
    "8.8.8.8",
    "1.1.1.1",
    "93.184.216.34",
    "2606:4700:4700::1111",
    "::ffff:8.8.8.8",
    "64:ff9b::808:808",
]


@pytest.mark.parametrize("address", REFUSED)
def test_non_public_addresses_are_refused(address: str) -> None:
    parsed = parse_address(address)
    assert parsed is not None
    assert refusal(parsed) is not None


@pytest.mark.parametrize("address", ALLOWED)
def test_public_addresses_are_allowed(address: str) -> None:
    parsed = parse_address(address)
    assert parsed is not None
    assert refusal(parsed) is None


@pytest.mark.parametrize(
    ("address", "trusted_ok"),
    [
        ("127.0.0.1", True),
        ("10.1.2.3", True),
        ("::ffff:192.168.0.1", True),
        ("169.254.169.254", False),
        ("fd00:ec2::254", False),
        ("100.100.100.200", False),
        ("0.0.0.0", False),
        ("224.0.0.1", False),
        ("::ffff:169.254.169.254", False),
    ],
)
def test_a_host_the_operator_named_may_be_private_but_never_metadata(address: str, trusted_ok: bool) -> None:
    parsed = parse_address(address)
    assert parsed is not None
    assert (refusal(parsed, trusted=True) is None) is trusted_ok


def test_bracketed_and_zoned_literals_parse() -> None:
    assert parse_address("[::1]") == ipaddress.ip_address("::1")
    assert parse_address("fe80::1%eth0") == ipaddress.ip_address("fe80::1")
    assert parse_address("example.com") is None


@given(st.ip_addresses(v=4))
def test_an_ipv4_address_and_its_mapped_ipv6_form_get_the_same_answer(address: ipaddress.IPv4Address) -> None:
    mapped = ipaddress.IPv6Address(f"::ffff:{address}")
    assert (refusal(address) is None) == (refusal(mapped) is None)
    assert (refusal(address, trusted=True) is None) == (refusal(mapped, trusted=True) is None)


@given(st.ip_addresses())
def test_only_global_unicast_addresses_are_allowed(
    address: ipaddress.IPv4Address | ipaddress.IPv6Address,
) -> None:
    if refusal(address) is None:
        assert address.is_global and not address.is_multicast
