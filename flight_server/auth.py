"""Optional authentication: one shared token, as a bearer token or a password.

With ``--auth-token T`` every call must carry ``authorization: Bearer T``,
or Basic credentials whose password is ``T`` (any user name). A Basic call,
typically the Handshake the ADBC driver and ``pyarrow.flight``'s
``authenticate_basic_token`` send when given a user name and password, is
answered with an ``authorization: Bearer T`` header, which those clients then
send on every call. Anything else is rejected with UNAUTHENTICATED.
"""

from __future__ import annotations

import base64
import binascii
import hmac

import pyarrow.flight as fl

REJECTED = (
    "authentication required: send 'authorization: Bearer <token>', or user name and password "
    "with the server's token as the password"
)


def _same(given: str, token: str) -> bool:
    return hmac.compare_digest(given.encode("utf-8"), token.encode("utf-8"))


def _basic_password(credentials: str) -> str | None:
    try:
        decoded = base64.b64decode(credentials + "=" * (-len(credentials) % 4), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
    user, colon, password = decoded.partition(":")
    return password if colon else None


class TokenAuth(fl.ServerMiddlewareFactory):
    def __init__(self, token: str):
        super().__init__()
        if not token:
            raise ValueError("the auth token must not be empty")
        self.token = token

    def start_call(self, info: fl.CallInfo, headers: dict) -> fl.ServerMiddleware | None:
        for value in headers.get("authorization", []):
            scheme, _, credentials = value.strip().partition(" ")
            scheme = scheme.lower()
            if scheme == "bearer" and _same(credentials.strip(), self.token):
                return None
            if scheme == "basic":
                password = _basic_password(credentials.strip())
                if password is not None and _same(password, self.token):
                    return _AnswerBearer(self.token)
        raise fl.FlightUnauthenticatedError(REJECTED)


class _AnswerBearer(fl.ServerMiddleware):
    def __init__(self, token: str):
        super().__init__()
        self.token = token

    def sending_headers(self) -> dict:
        return {"authorization": f"Bearer {self.token}"}


class Handshake(fl.ServerAuthHandler):
    """Accepts the Handshake call; TokenAuth has already checked its headers.

    pyarrow answers Handshake with UNIMPLEMENTED unless an auth handler is
    set. Its per-call check (``is_valid``) passes everything: the middleware
    is the one gate, for every call alike.
    """

    def authenticate(self, outgoing: fl.ServerAuthSender, incoming: fl.ServerAuthReader) -> None:
        return None

    def is_valid(self, token: bytes) -> str:
        return ""
