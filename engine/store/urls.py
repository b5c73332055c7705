"""Parsing and masking of store URLs."""

from __future__ import annotations

import getpass
import os
import re
from urllib.parse import parse_qs, unquote, urlsplit

import attrs

from engine.store.errors import StoreError
from events.storable import DEFAULT_MAX_EVENT_BYTES

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


DEFAULT_STORE = "sqlite:///stagetrail.db"
SCHEMES = (
    "memory://",
    "sqlite:///path",
    "postgresql://user:password@host:5432/db",
    "eventsourcing://persistence.module?SETTING=value",
)


@attrs.frozen
class StoreURL:
    """A parsed store URL; `masked` is safe to print."""

    scheme: str
    masked: str
    path: str = ""
    host: str = ""
    port: int = 5432
    user: str = ""
    password: str = attrs.field(default="", repr=False)
    dbname: str = ""
    options: dict[str, str] = attrs.field(factory=dict)

    @property
    def max_event_bytes(self) -> int:
        """The URL's ``max_event_bytes`` option, else the default of 1 MiB.

        Raises:
            StoreError: the option is not a positive whole number.
        """
        text = self.options.get("max_event_bytes")
        if text is None:
            return DEFAULT_MAX_EVENT_BYTES
        if not text.isdigit() or len(text) > 18 or int(text) < 1:
            raise StoreError(
                self.masked, f"max_event_bytes={text!r} must be a number of bytes >= 1"
            )
        return int(text)


def default_url() -> str:
    """`$STAGETRAIL_STORE`, else the SQLite file ./stagetrail.db."""
    return os.environ.get("STAGETRAIL_STORE") or DEFAULT_STORE


def parse(url: str) -> StoreURL:
    """Parse a store URL.

    Raises:
        StoreError: the URL is not one of the supported forms.
    """
    if not isinstance(url, str):
        raise StoreError(repr(url), f"a store URL must be a str; use one of {', '.join(SCHEMES)}")
    masked = mask(url)
    scheme = url.split("://", 1)[0] if "://" in url else ""
    if scheme == "memory":
        options = _options(urlsplit(url).query, masked, _KNOWN["memory"])
        return StoreURL(scheme="memory", masked=masked, options=options)
    if scheme == "sqlite":
        return _sqlite(url, masked)
    if scheme in ("postgresql", "postgres"):
        return _postgres(url, masked)
    if scheme == "eventsourcing":
        return _module(url, masked)
    if url.startswith("shards:"):
        raise StoreError(
            masked, "a shards: URL names several stores: open it with engine.sharded.ShardedEngine"
        )
    hint = f" (did you mean sqlite:///{masked}?)" if not scheme else ""
    raise StoreError(masked, f"unsupported store URL{hint}; use one of {', '.join(SCHEMES)}")


LIBPQ_OPTIONS = (
    "application_name",
    "sslcert",
    "sslkey",
    "sslmode",
    "sslrootcert",
    "target_session_attrs",
)
"""libpq connection settings a PostgreSQL URL may carry."""

_KNOWN = {
    "memory": ("compress", "max_event_bytes"),
    "sqlite": ("compress", "layout", "max_event_bytes"),
    "postgresql": ("compress", "connect_timeout", "max_event_bytes", "schema", *LIBPQ_OPTIONS),
}


def _options(query: str, masked: str, known: tuple[str, ...]) -> dict[str, str]:
    options = {key: values[-1] for key, values in parse_qs(query).items()}
    if "password" in options:
        raise StoreError(masked, "give the password in the URL's authority (user:pw@host)")
    for key in options:
        if key not in known:
            raise StoreError(masked, f"unknown option {key!r}; this kind of store takes {known}")
    return options


def _sqlite(url: str, masked: str) -> StoreURL:
    parts = urlsplit(url)
    path = unquote(parts.path[1:]) if parts.path.startswith("/") else ""
    if parts.netloc or not path:
        raise StoreError(
            masked, "a SQLite URL is sqlite:///relative/file.db or sqlite:////absolute/file.db"
        )
    return StoreURL(
        scheme="sqlite",
        masked=masked,
        path=path,
        options=_options(parts.query, masked, _KNOWN["sqlite"]),
    )


def _postgres(url: str, masked: str) -> StoreURL:
    try:
        parts = urlsplit(url)
        port = parts.port or 5432
    except ValueError:
        # The parser's message may quote a piece of the password: say what to check.
        raise StoreError(
            masked,
            "malformed PostgreSQL URL: check the port, and percent-encode special "
            "characters (/ ? # @ :) in the user name and password",
        ) from None
    dbname = unquote(parts.path.lstrip("/"))
    if not dbname:
        raise StoreError(masked, "the PostgreSQL URL names no database (postgresql://host/db)")
    return StoreURL(
        scheme="postgresql",
        masked=masked,
        host=parts.hostname or "localhost",
        port=port,
        user=unquote(parts.username or "") or getpass.getuser(),
        password=unquote(parts.password or ""),
        dbname=dbname,
        options=_options(parts.query, masked, _KNOWN["postgresql"]),
    )


def _module(url: str, masked: str) -> StoreURL:
    """``eventsourcing://TOPIC?SETTING=value&...``: any eventsourcing persistence module.

    TOPIC is what eventsourcing's ``PERSISTENCE_MODULE`` takes (a module such as
    ``eventsourcing.sqlite``, or ``package.module:FactoryClass``); the settings are
    that module's own (``SQLITE_DBNAME``, ``POSTGRES_HOST``, ...). ``compress``
    stays stagetrail's.
    """
    head, _, query = url.partition("?")
    topic = unquote(head.removeprefix("eventsourcing://").rstrip("/"))
    if not topic:
        raise StoreError(
            masked, "name the persistence module: eventsourcing://eventsourcing.sqlite?..."
        )
    pairs = parse_qs(query, keep_blank_values=True)  # an empty password is a setting too
    options = {key: values[-1] for key, values in pairs.items()}
    return StoreURL(scheme="eventsourcing", masked=masked, path=topic, options=options)
