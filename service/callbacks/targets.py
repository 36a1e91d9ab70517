"""Where a decision's status may be POSTed: http(s) URLs whose host resolves only to public
addresses, unless FLIPGATE_CALLBACK_ALLOWLIST names the host or a network holding it.

Checked when the gate is asked and again at delivery, where the POST goes to the address
that was just checked (so a DNS answer that changes in between cannot redirect it). A URL's
credentials (a password, query values) are kept sealed with the server's key and shown
redacted."""

import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import SplitResult, parse_qsl, urlsplit, urlunsplit

from service.config import Settings
from service.errors import InvalidInput
from service.sealing import cipher, seal, unseal

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True)
class Target:
    """A checked callback: the URL to connect to (host replaced by the checked address),
    the original host name for TLS (SNI, certificate) and the Host header to send."""

    url: str
    host: str
    host_header: str


def check_callback_url(url: str, allowlist: list[str]) -> Target:
    """The callback's checked target; 422 `callback_url_refused` when it may not be used."""
    parts = urlsplit(url)
    if parts.scheme not in DEFAULT_PORTS or not parts.hostname:
        raise _refused(url, "it is not an http(s) URL with a host")
    address = _allowed_address(parts.hostname, _port(url, parts), allowlist)
    if address is None:
        raise _refused(url, "its host resolves to a loopback, private, link-local, "
                       "multicast or reserved address (see FLIPGATE_CALLBACK_ALLOWLIST)")
    literal = f"[{address}]" if address.version == 6 else str(address)
    userinfo, _, host_header = parts.netloc.rpartition("@")
    netloc = (f"{userinfo}@" if userinfo else "") + literal + (
        f":{parts.port}" if parts.port else "")
    return Target(url=parts._replace(netloc=netloc).geturl(), host=parts.hostname,
                  host_header=host_header)


def _port(url: str, parts: SplitResult) -> int:
    try:
        return parts.port or DEFAULT_PORTS[parts.scheme]
    except ValueError as error:
        raise _refused(url, "its port is not a number from 0 to 65535") from error


def _allowed_address(host: str, port: int, allowlist: list[str]) -> Address | None:
    """The first address of `host`, if every one of them may be reached."""
    addresses = _resolve(host, port)
    networks = _networks(allowlist)
    named = host.lower() in {entry.lower() for entry in allowlist}
    if not addresses or not all(named or _public(address) or
                                any(address in network for network in networks)
                                for address in addresses):
        return None
    return addresses[0]


def _resolve(host: str, port: int) -> list[Address]:
    try:
        answers = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        return []
    return [_unmapped(ipaddress.ip_address(answer[4][0].split("%")[0])) for answer in answers]


def _unmapped(address: Address) -> Address:
    """An IPv4-mapped IPv6 address as the IPv4 address it stands for."""
    mapped = getattr(address, "ipv4_mapped", None)
    return mapped or address


def stored_callback_url(settings: Settings, url: str | None) -> tuple[str | None, str | None]:
    """What a decision keeps of its callback URL: the form readers see (no password, no
    query values) and, when that differs, the whole URL sealed with the server's key."""
    if url is None:
        return None, None
    shown = redacted_url(url)
    return shown, None if shown == url else seal(cipher(settings), url)


def full_callback_url(settings: Settings, shown: str | None, sealed: str | None) -> str | None:
    """The callback URL as it was given, from what `stored_callback_url` kept (None when no
    server key opens its sealed form)."""
    if sealed is None:
        return shown
    return unseal(cipher(settings), sealed)


def redacted_url(url: str) -> str:
    """The URL as readers see it: the password and every query value replaced by ***."""
    parts = urlsplit(url)
    userinfo, at, host = parts.netloc.rpartition("@")
    user, colon, _ = userinfo.partition(":")
    netloc = f"{user}{':***' if colon else ''}{at}{host}"
    query = "&".join(f"{name}=***" for name, _ in parse_qsl(parts.query, keep_blank_values=True))
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def _public(address: Address) -> bool:
    """A global unicast address outside the IPv6 prefixes Python calls global but are not
    (NON_PUBLIC_IPV6), and so is every IPv4 address an IPv6 one carries (IPv4-compatible,
    SIIT, 6to4, Teredo, NAT64): those reach the IPv4 address they embed."""
    embedded = _embedded_ipv4(address)
    return (address.is_global and not address.is_multicast
            and not any(address in network for network in NON_PUBLIC_IPV6)
            and all(inner.is_global and not inner.is_multicast for inner in embedded))


NAT64 = ipaddress.ip_network("64:ff9b::/96")
# Python 3.11's is_global says True for these: IPv4-compatible (::a.b.c.d), SIIT
# (::ffff:0:a.b.c.d), deprecated site-local, and local-use NAT64 (RFC 8215)
IPV4_COMPATIBLE, SIIT = ipaddress.ip_network("::/96"), ipaddress.ip_network("::ffff:0:0:0/96")
NON_PUBLIC_IPV6 = (IPV4_COMPATIBLE, SIIT, ipaddress.ip_network("fec0::/10"),
                   ipaddress.ip_network("64:ff9b:1::/48"))


def _embedded_ipv4(address: Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 address embeds by a translation scheme."""
    if address.version == 4:
        return []
    embedded = [address.sixtofour] if address.sixtofour else []
    embedded += list(address.teredo or ())
    if any(address in network for network in (NAT64, IPV4_COMPATIBLE, SIIT)):
        embedded.append(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
    return embedded


def _networks(allowlist: list[str]) -> list[Network]:
    """The allowlist's entries that are addresses or networks (the rest are host names)."""
    networks = []
    for entry in allowlist:
        try:
            networks.append(ipaddress.ip_network(entry, strict=False))
        except ValueError:
            continue
    return networks


def _refused(url: str, why: str) -> InvalidInput:
    return InvalidInput("callback_url_refused", f"callback_url {url[:200]!r} is refused: {why}")
