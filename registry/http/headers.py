"""Values that go into HTTP request headers, checked before use.

A token comes from outside (a token service's answer, an environment variable, a docker config):
one holding CR, LF or another control character would make ``http.client`` and httpx raise a raw
``ValueError`` deep inside a request, or (worse, in a client that does not check) split the
header. Callers turn a refusal into their own typed error, naming where the value came from and
never echoing it (it may be a credential).
"""

from __future__ import annotations

import re

MAX_HEADER_VALUE = 16 * 2**10
# Visible ASCII with inner spaces (RFC 9110 field-value, without obs-text).
_VALUE = re.compile(r"[\x21-\x7e](?:[\x20-\x7e]*[\x21-\x7e])?")


def why_not_header_value(value: object) -> str | None:
    """None when ``value`` can be sent as a header value; else why not (without the value)."""
    if not isinstance(value, str) or not value:
        return "it is empty or not text"
    if len(value) > MAX_HEADER_VALUE:
        return f"it is {len(value)} characters long, over {MAX_HEADER_VALUE}"
    if _VALUE.fullmatch(value) is None:
        return ("it holds a control character (CR, LF, ...), a non-ASCII character or "
                "surrounding spaces")
    return None
