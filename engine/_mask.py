"""Hiding passwords in store URLs, whatever shape the URL is in.

Masking must not depend on the URL parsing cleanly: a malformed URL is exactly
the one that ends up in an error message. When in doubt, hide more.
"""

from __future__ import annotations

import re
from urllib.parse import unquote

_SCHEME_PREFIX = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:/*")
HIDDEN = "***"


def mask(url: str) -> str:
    """The URL with every password (in its authority or in any option) as ``***``."""
    at = url.rfind("@")
    if at >= 0:
        url = _mask_authority(url[:at]) + url[at:]
    return _mask_options(url)


def _mask_authority(head: str) -> str:
    """`head` is everything before the last '@': scheme, user and maybe a password."""
    if "://" in head:
        prefix, userinfo = head.split("://", 1)
        prefix += "://"
    else:
        match = _SCHEME_PREFIX.match(head)
        cut = match.end() if match and ":" in head[match.end() :] else 0
        prefix, userinfo = head[:cut], head[cut:]
    if ":" not in userinfo:
        return head
    user = userinfo.split(":", 1)[0]
    return f"{prefix}{user}:{HIDDEN}"


def _mask_options(url: str) -> str:
    if "?" not in url:
        return url
    base, query = url.split("?", 1)
    pairs = [_mask_pair(pair) for pair in re.split(r"([&;])", query)]
    return f"{base}?{''.join(pairs)}"


def _mask_pair(pair: str) -> str:
    key, sep, _ = pair.partition("=")
    if sep and "password" in unquote(key).lower():
        return f"{key}={HIDDEN}"
    return pair
