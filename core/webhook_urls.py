"""Webhook URL rules, shared by the API (vetting at submission) and the workers (again at each delivery).

SSRF guard: only http(s) URLs without credentials; metadata host names, link-local (169.254.0.0/16, fe80::/10),
unspecified, multicast and reserved addresses are always refused; loopback and private ranges only when
H3BATCH_WEBHOOK_ALLOW_LOOPBACK / H3BATCH_WEBHOOK_ALLOW_PRIVATE say so. IPv6 addresses that embed an IPv4 one (mapped
::ffff:0:0/96, 6to4 2002::/16, Teredo 2001::/32, NAT64 64:ff9b::/96) are judged by what they embed, and an embedding
of anything but a public address is refused whatever the flags say: a relay or NAT64 gateway would deliver it to
that address, and no legitimate receiver is reached that way. Every address a name resolves to must pass,
and the delivery connects to the vetted address itself (worker/webhook_delivery.py), so a DNS answer that changes
between check and connect (rebinding) cannot redirect the request.
"""
from __future__ import annotations

import ipaddress
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from h3batch.settings import Settings

METADATA_HOSTS = frozenset({
    "metadata", "metadata.google.internal", "metadata.goog", "instance-data", "instance-data.ec2.internal",
    "metadata.azure.com", "metadata.platformequinix.com", "metadata.tencentyun.com", "100.100.100.200",
})
"""Cloud instance-metadata host names, refused whatever they resolve to."""

MAX_URL_CHARS = 2048
@dataclass(frozen=True)
class WebhookSettings:
    """Webhook configuration from H3BATCH_WEBHOOK_* env vars (read by the API and by every worker)."""

    secret: str | None = None
    allow_loopback: bool = False
    allow_private: bool = False
    max_attempts: int = 9
    retry_base_s: float = 5.0
    retry_cap_s: float = 36_000.0
    timeout_s: float = 10.0
    poll_s: float = 0.5

    @property
    def enabled(self) -> bool:
        return bool(self.secret)

    def backoff_s(self, attempt: int) -> float:
        """Delay before attempt `attempt + 1`: base × 4^(attempt-1), capped. Defaults give 5 s, 20 s, 80 s, …, 10 h;
        9 attempts span about 27 h, like the Standard Webhooks schedule."""
        return min(self.retry_cap_s, self.retry_base_s * 4 ** (attempt - 1))

    @classmethod
    def from_settings(cls, settings: Settings) -> WebhookSettings:
        return cls(secret=settings.webhook_secret, allow_loopback=settings.webhook_allow_loopback,
                   allow_private=settings.webhook_allow_private, max_attempts=settings.webhook_max_attempts,
                   retry_base_s=settings.webhook_retry_base_s, timeout_s=settings.webhook_timeout_s)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> WebhookSettings:
        return cls.from_settings(Settings.from_env(env))


class WebhookRefused(ValueError):
    """A webhook URL the service will not call; the message says what was expected and what arrived."""


# --- URL and address checks ---

_NAT64 = ipaddress.ip_network("64:ff9b::/96")


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> tuple[str, list[ipaddress.IPv4Address]]:
    """(kind, the IPv4 addresses `ip` carries) for 6to4, Teredo (server and client) and NAT64; ("", []) if none."""
    if ip.sixtofour is not None:
        return "6to4", [ip.sixtofour]
    if ip.teredo is not None:
        return "Teredo", list(ip.teredo)
    if ip in _NAT64:
        return "NAT64", [ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)]
    return "", []


def _check_address(address: str, host: str, settings: WebhookSettings) -> None:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if isinstance(ip, ipaddress.IPv6Address):
        kind, inner = _embedded_ipv4(ip)
        for embedded in inner:
            if not embedded.is_global:
                raise WebhookRefused(f"webhook_url: {host!r} resolves to {ip}, a {kind} address embedding non-public "
                                     f"{embedded}; expected a public http(s) endpoint")
    # ::1 sits inside the reserved ::/8, so loopback is decided first: it is refused or allowed by its own flag.
    if not ip.is_loopback and (ip.is_link_local or ip.is_unspecified or ip.is_multicast or ip.is_reserved):
        raise WebhookRefused(f"webhook_url: {host!r} resolves to {ip}, a link-local/unspecified/multicast/reserved "
                             f"address; expected a public http(s) endpoint")
    if ip.is_loopback:
        if not settings.allow_loopback:
            raise WebhookRefused(f"webhook_url: {host!r} resolves to loopback {ip}; loopback targets are refused "
                                 f"unless H3BATCH_WEBHOOK_ALLOW_LOOPBACK=1")
        return
    if not ip.is_global and not settings.allow_private:  # RFC 1918, CGNAT 100.64/10, ULA fc00::/7, ...
        raise WebhookRefused(f"webhook_url: {host!r} resolves to non-public address {ip}; private targets are "
                             f"refused unless H3BATCH_WEBHOOK_ALLOW_PRIVATE=1")


@dataclass(frozen=True)
class Target:
    """A vetted webhook URL: where to connect (a checked IP) and what to ask for."""

    scheme: str
    host: str
    port: int
    path: str
    addresses: tuple[str, ...]


def check_url(url: Any, settings: WebhookSettings) -> Target:
    """Parse, resolve and vet `url`; raises WebhookRefused naming the problem. Resolves DNS (both at submit and at
    delivery time)."""
    if not isinstance(url, str) or not url:
        raise WebhookRefused(f"webhook_url: expected an http(s) URL string, found {url!r}")
    if len(url) > MAX_URL_CHARS:
        raise WebhookRefused(f"webhook_url: expected at most {MAX_URL_CHARS} characters, found {len(url)}")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise WebhookRefused(f"webhook_url: not a valid URL ({exc})") from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise WebhookRefused(f"webhook_url: expected an http:// or https:// URL, found scheme {parts.scheme!r}")
    host = (parts.hostname or "").rstrip(".").lower()
    if not host:
        raise WebhookRefused("webhook_url: expected a host name, found none")
    if parts.username is not None or parts.password is not None:
        raise WebhookRefused("webhook_url: credentials in the URL are not accepted; authenticate with the signature")
    if host in METADATA_HOSTS:
        raise WebhookRefused(f"webhook_url: {host!r} is a cloud metadata host; refused")
    port = port or (443 if scheme == "https" else 80)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise WebhookRefused(f"webhook_url: host {host!r} does not resolve ({exc})") from None
    addresses = tuple(dict.fromkeys(info[4][0] for info in infos))
    for address in addresses:  # every answer must pass: a mixed answer is how rebinding attacks start
        _check_address(address, host, settings)
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    return Target(scheme, host, port, path, addresses)
