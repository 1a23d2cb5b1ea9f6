"""The server's side of password authentication: SCRAM-SHA-256, and cleartext over TLS.

With ``--auth-token T`` the token is the password (any user name), as it is
for Flight's Basic auth. On a plain TCP connection the server asks for
SCRAM-SHA-256 (RFC 5802 with SHA-256, RFC 7677; PostgreSQL's
"SASL Authentication" section): the password never crosses the wire and
the client checks that the server knows it too. Over TLS it asks for the
cleartext password (AuthenticationCleartextPassword): the channel is
encrypted, and clients without SCRAM can connect. A cleartext password is
never accepted on a plain connection.

The exchange (``n,,`` gs2 header: no channel binding, so only
``SCRAM-SHA-256`` is offered, not ``-PLUS``)::

    client-first  n,,n=<user>,r=<client nonce>
    server-first  r=<client nonce><server nonce>,s=<base64 salt>,i=<iterations>
    client-final  c=biws,r=<nonce>,p=<base64 ClientProof>
    server-final  v=<base64 ServerSignature>

    SaltedPassword  = PBKDF2-HMAC-SHA-256(password, salt, i)
    ClientKey       = HMAC(SaltedPassword, "Client Key");  StoredKey = SHA-256(ClientKey)
    AuthMessage     = client-first-bare "," server-first "," client-final-without-proof
    ClientProof     = ClientKey XOR HMAC(StoredKey, AuthMessage)
    ServerSignature = HMAC(HMAC(SaltedPassword, "Server Key"), AuthMessage)

The salted password is derived once per server (one salt), so a connection
costs two HMACs, not 4096 PBKDF2 rounds.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

MECHANISM = "SCRAM-SHA-256"
ITERATIONS = 4096


def _hmac(key: bytes, message: bytes) -> bytes:
    return hmac.new(key, message, hashlib.sha256).digest()


class AuthFailed(Exception):
    """The password (or the SCRAM exchange) is wrong."""


class Scram:
    """Keys derived from the token once; ``exchange`` per connection."""

    def __init__(self, password: str, salt: bytes | None = None):
        self.password = password
        self.salt = salt or secrets.token_bytes(16)
        salted = hashlib.pbkdf2_hmac("sha256", password.encode("utf-8"), self.salt, ITERATIONS)
        self.stored_key = hashlib.sha256(_hmac(salted, b"Client Key")).digest()
        self.server_key = _hmac(salted, b"Server Key")

    def check_cleartext(self, given: str) -> None:
        if not hmac.compare_digest(given.encode("utf-8"), self.password.encode("utf-8")):
            raise AuthFailed()

    def exchange(self, server_nonce: str | None = None) -> "Exchange":
        return Exchange(self, server_nonce or base64.b64encode(secrets.token_bytes(18)).decode())


class Exchange:
    """One connection's SCRAM conversation: ``first`` then ``final``."""

    def __init__(self, keys: Scram, server_nonce: str):
        self.keys = keys
        self.server_nonce = server_nonce
        self.nonce = ""
        self.first_bare = ""
        self.server_first = ""

    def first(self, client_first: bytes) -> bytes:
        """The server-first-message for the client-first-message."""
        text = _text(client_first)
        header, _, rest = text.partition(",")
        if header not in ("n", "y"):  # "p=...": channel binding, which is not offered
            raise AuthFailed("channel binding is not supported")
        authzid, _, bare = rest.partition(",")
        attributes = _attributes(bare)
        client_nonce = attributes.get("r")
        if not client_nonce or authzid:
            raise AuthFailed("malformed SCRAM client-first-message")
        self.gs2 = f"{header},{authzid},"
        self.first_bare = bare
        self.nonce = client_nonce + self.server_nonce
        salt = base64.b64encode(self.keys.salt).decode()
        self.server_first = f"r={self.nonce},s={salt},i={ITERATIONS}"
        return self.server_first.encode()

    def final(self, client_final: bytes) -> bytes:
        """Check the client's proof; return the server-final-message."""
        text = _text(client_final)
        without_proof, _, proof_part = text.rpartition(",p=")
        attributes = _attributes(without_proof)
        expected_binding = base64.b64encode(self.gs2.encode()).decode()
        if attributes.get("c") != expected_binding or attributes.get("r") != self.nonce or not proof_part:
            raise AuthFailed("malformed SCRAM client-final-message")
        try:
            proof = base64.b64decode(proof_part, validate=True)
        except ValueError:
            raise AuthFailed("malformed SCRAM proof") from None
        message = f"{self.first_bare},{self.server_first},{without_proof}".encode()
        signature = _hmac(self.keys.stored_key, message)
        if len(proof) != len(signature):
            raise AuthFailed()
        client_key = bytes(a ^ b for a, b in zip(proof, signature))
        if not hmac.compare_digest(hashlib.sha256(client_key).digest(), self.keys.stored_key):
            raise AuthFailed()
        return b"v=" + base64.b64encode(_hmac(self.keys.server_key, message))


def _text(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise AuthFailed("SCRAM messages are UTF-8") from None


def _attributes(text: str) -> dict[str, str]:
    out = {}
    for part in text.split(","):
        key, eq, value = part.partition("=")
        if eq and len(key) == 1:
            out.setdefault(key, value)
    return out
