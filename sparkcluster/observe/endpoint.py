"""An endpoint's address as the user gives it (`bench --url`, `top --url`): `host:8000`, `http://host:8000/v1/`.

Only scheme://host:port/path is kept, since the address is shown and written everywhere (results, receipts, the
CSV's receipt, a plot's title, an error). A user and password before the host (`http://alice:PASS@host/v1`) are
refused rather than sent: the clients send the API key as `Authorization: Bearer`, which a Basic authorization
from the URL would have to replace (aiohttp refuses both at once), and the password would be one more secret to
keep out of every output."""

from __future__ import annotations

from urllib.parse import SplitResult, urlsplit

from ..engine.errors import UsageError

EXAMPLE = "e.g. --url http://192.168.1.50:8000/v1"


def shown(parts: SplitResult) -> str:
    """The address without what stands before its host: what may be shown and recorded."""
    host = parts.netloc.rpartition("@")[2]
    return f"{parts.scheme}://{host}{parts.path}"


def endpoint_address(text: str) -> str:
    """`text` as scheme://host[:port]/path, without a trailing slash; UsageError (exit 2, before anything
    connects) for no http(s) address, or one that holds a user or password. Neither message repeats a password."""
    full = text.strip().rstrip("/")
    if "@" in full.partition("?")[0]:  # any form (`http:/alice:PASS@h`, `//alice:PASS@h`): refused, never repeated
        raise UsageError("--url holds a user name or password (an `@` before its path), which would be written into "
                         "every result, receipt and message",
                         "give the address alone, e.g. --url http://HOST:8000/v1; an endpoint that wants a key reads "
                         "it from VLLM_API_KEY in this machine's environment, sent as `Authorization: Bearer`")
    full = full if "://" in full else "http://" + full
    try:
        parts = urlsplit(full)
    except ValueError:  # an unclosed IPv6 bracket
        raise UsageError("--url is not an http(s) address (its host does not parse)", EXAMPLE) from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"--url {shown(parts)!r} is not an http(s) address", EXAMPLE)
    return shown(parts).rstrip("/")
