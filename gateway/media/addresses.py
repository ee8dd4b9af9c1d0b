"""Which network addresses an image URL may reach: public unicast only, unless its host is one the
operator allowed by name. Pure: the fetcher asks it about every address it is about to connect to."""

from __future__ import annotations

import ipaddress
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network

IPAddress = IPv4Address | IPv6Address

# Cloud providers' instance-metadata endpoints (AWS, GCP, Azure, OpenStack, Oracle: the
# link-local one; AWS's IPv6 one; Alibaba's; AWS ECS task metadata). Refused even for a host
# the operator allowed by name: no image lives there, and a DNS answer can change.
_METADATA: tuple[IPv4Network | IPv6Network, ...] = (
    IPv4Network("169.254.0.0/16"),
    IPv6Network("fe80::/10"),
    IPv6Network("fd00:ec2::254/128"),
    IPv4Network("100.100.100.200/32"),
)
# IPv6 prefixes that carry an IPv4 address in their low 32 bits (NAT64, the well-known and the
# local-use prefix): the IPv4 address is the one reached.
_NAT64 = (IPv6Network("64:ff9b::/96"), IPv6Network("64:ff9b:1::/48"))


def parse_address(text: str) -> IPAddress | None:
    """An IP address literal (IPv6 with or without brackets, a zone id dropped), or None."""
    text = text.strip("[]").split("%", 1)[0]
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def embedded_ipv4(address: IPv6Address) -> IPv4Address | None:
    """The IPv4 address an IPv6 one stands for (IPv4-mapped, IPv4-compatible, 6to4, Teredo's
    client, NAT64), or None."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]
    if any(address in net for net in _NAT64):
        return IPv4Address(int(address) & 0xFFFFFFFF)
    # ::a.b.c.d (deprecated IPv4-compatible); :: and ::1 are IPv6's own unspecified and loopback.
    if int(address) >> 32 == 0 and int(address) > 1:
        return IPv4Address(int(address))
    return None


def refusal(address: IPAddress, *, trusted: bool = False) -> str | None:
    """Why an image URL may not reach this address (a phrase for the error), or None if it may.
    `trusted`: its host is named in the allow-list, so private addresses are allowed (an
    internal image server), but never metadata, unspecified or multicast ones."""
    if isinstance(address, IPv6Address):
        inner = embedded_ipv4(address)
        if inner is not None:
            return refusal(inner, trusted=trusted)
    if address.is_unspecified:
        return "an unspecified address"
    if address.is_multicast:
        return "a multicast address"
    if any(address in net for net in _METADATA if net.version == address.version):
        return "a link-local or cloud metadata address"
    if trusted:
        return None
    if address.is_loopback:
        return "a loopback address"
    if address.is_private:
        return "a private address"
    if isinstance(address, IPv6Address) and address.is_site_local:
        return "a site-local address"
    if address.is_reserved:
        return "a reserved address"
    if not address.is_global:
        return "a non-public address"
    return None
