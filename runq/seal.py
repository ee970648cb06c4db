"""Sealing of payload, answer, resume state and error detail at rest (AES-256-GCM), and the
key ring.

A sealed value is ``b"rq1" + key_id(8) + nonce(12) + ciphertext+tag``. The associated
data binds it to its column and run id, so a value copied into another column or
another row fails to open. The first key of the ring seals; every key opens.
There is no cleartext fallback anywhere: a value that does not open raises
``SealError`` naming the run and column.
"""

from __future__ import annotations

import base64
import hashlib
import os
import secrets
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from runq.errors import ConfigError, SealError

MAGIC = b"rq1"
KEY_ID_BYTES = 8
NONCE_BYTES = 12
HEADER_BYTES = len(MAGIC) + KEY_ID_BYTES + NONCE_BYTES
KEY_BYTES = 32

#: Columns that hold sealed values; the name is part of the associated data.
SEALED_COLUMNS = ("payload", "answer", "resume_state", "decision", "error_detail")


class Sealer(Protocol):
    """What the store needs: seal a value for (column, run), open it again."""

    @property
    def sealing_key_id(self) -> bytes: ...

    def seal(self, column: str, run_id: str, plaintext: bytes) -> bytes: ...

    def seal_many(
        self, column: str, run_ids: Sequence[str], plaintexts: Sequence[bytes]
    ) -> list[bytes]:
        """``seal`` of each (run id, plaintext) pair, in order."""
        ...

    def open(self, column: str, run_id: str, sealed: bytes) -> bytes: ...

    def has_key(self, key_id: bytes) -> bool:
        """True when values sealed under ``key_id`` open with this sealer."""
        ...


def key_id_of(key: bytes) -> bytes:
    return hashlib.sha256(b"runq-key-id:" + key).digest()[:KEY_ID_BYTES]


def sealed_key_id(sealed: bytes) -> bytes | None:
    """The key id a sealed value was sealed under, or None when it is not a sealed value."""
    if len(sealed) < HEADER_BYTES or not sealed.startswith(MAGIC):
        return None
    return sealed[len(MAGIC) : len(MAGIC) + KEY_ID_BYTES]


def _aad(column: str, run_id: str) -> bytes:
    return f"runq:{column}:{run_id}".encode()


class KeyRing:
    """AES-GCM key ring: ``keys[0]`` seals, every key opens (rotation keeps old ones)."""

    def __init__(self, keys: Sequence[bytes]) -> None:
        if not keys:
            raise SealError("a key ring needs at least one key")
        for key in keys:
            if len(key) != KEY_BYTES:
                raise SealError(f"a seal key must be {KEY_BYTES} bytes, got {len(key)}")
        self._by_id = {key_id_of(k): AESGCM(k) for k in keys}
        self._sealing_id = key_id_of(keys[0])
        self._sealing = self._by_id[self._sealing_id]

    @property
    def sealing_key_id(self) -> bytes:
        return self._sealing_id

    def has_key(self, key_id: bytes) -> bool:
        return key_id in self._by_id

    def seal(self, column: str, run_id: str, plaintext: bytes) -> bytes:
        nonce = os.urandom(NONCE_BYTES)
        body = self._sealing.encrypt(nonce, plaintext, _aad(column, run_id))
        return MAGIC + self._sealing_id + nonce + body

    def seal_many(
        self, column: str, run_ids: Sequence[str], plaintexts: Sequence[bytes]
    ) -> list[bytes]:
        # One read of the random source for every nonce and the lookups hoisted: a bulk
        # submit seals thousands of payloads. Each value is sealed exactly as by seal().
        nonces = os.urandom(NONCE_BYTES * len(run_ids))
        encrypt = self._sealing.encrypt
        head = MAGIC + self._sealing_id
        prefix = f"runq:{column}:"
        out: list[bytes] = []
        at = 0
        for run_id, plaintext in zip(run_ids, plaintexts, strict=True):
            nonce = nonces[at : at + NONCE_BYTES]
            at += NONCE_BYTES
            out.append(head + nonce + encrypt(nonce, plaintext, (prefix + run_id).encode()))
        return out

    def open(self, column: str, run_id: str, sealed: bytes) -> bytes:
        key_id = sealed_key_id(sealed)
        if key_id is None:
            raise SealError(f"run {run_id}: {column} is not a sealed value")
        aead = self._by_id.get(key_id)
        if aead is None:
            raise SealError(
                f"run {run_id}: {column} was sealed under key {key_id.hex()}, "
                "which is not in the key ring (seal.keys)"
            )
        nonce = sealed[len(MAGIC) + KEY_ID_BYTES : HEADER_BYTES]
        try:
            return aead.decrypt(nonce, sealed[HEADER_BYTES:], _aad(column, run_id))
        except InvalidTag as e:
            raise SealError(
                f"run {run_id}: {column} failed to open "
                "(tampered, or moved from another run or column)"
            ) from e


class PlainSealer:
    """No encryption. Only for benchmarks that measure the cost of sealing; never configurable."""

    sealing_key_id = b"plain\0\0\0"

    def seal(self, column: str, run_id: str, plaintext: bytes) -> bytes:
        return plaintext

    def seal_many(
        self, column: str, run_ids: Sequence[str], plaintexts: Sequence[bytes]
    ) -> list[bytes]:
        return list(plaintexts)

    def open(self, column: str, run_id: str, sealed: bytes) -> bytes:
        return sealed


def generate_key() -> str:
    """A new key as text (urlsafe base64 of 32 random bytes), for ``runq keys generate``."""
    return base64.urlsafe_b64encode(secrets.token_bytes(KEY_BYTES)).decode().rstrip("=")


def decode_key(text: str, *, key_name: str) -> bytes:
    raw = text.strip()
    try:
        key = base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4))
    except (ValueError, TypeError) as e:
        raise ConfigError(
            key_name, "is not urlsafe base64 (make one with `runq keys generate`)"
        ) from e
    if len(key) != KEY_BYTES:
        raise ConfigError(
            key_name, f"decodes to {len(key)} bytes; a key is {KEY_BYTES} (`runq keys generate`)"
        )
    return key


def read_secret(reference: str, *, key_name: str) -> str:
    """Resolve ``env:NAME`` or ``file:/path`` to its text. Never accepts an inline secret."""
    kind, sep, target = reference.partition(":")
    if not sep or not target:
        raise ConfigError(key_name, f"{reference!r} must be 'env:NAME' or 'file:/path'")
    if kind == "env":
        value = os.environ.get(target)
        if value is None or not value.strip():
            raise ConfigError(key_name, f"environment variable {target} is not set")
        return value.strip()
    if kind == "file":
        try:
            return Path(target).read_text().strip()
        except OSError as e:
            raise ConfigError(key_name, f"cannot read {target}: {e.strerror}") from e
    raise ConfigError(key_name, f"{reference!r} must start with 'env:' or 'file:'")


def load_key_ring(references: Sequence[str], *, key_name: str = "seal.keys") -> KeyRing:
    keys = [
        decode_key(read_secret(ref, key_name=f"{key_name}[{i}]"), key_name=f"{key_name}[{i}]")
        for i, ref in enumerate(references)
    ]
    return KeyRing(keys)


def key_file_for(sqlite_path: Path) -> Path:
    return sqlite_path.with_name(sqlite_path.name + ".key")


def ensure_key_file(path: Path) -> KeyRing:
    """The embedded default: a key file (mode 0600) beside the SQLite database, made once."""
    if not path.exists():
        # Write a private temp file, then hard-link it into place: the link is atomic and
        # fails if another process won the race, so nobody ever reads a half-written key.
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, (generate_key() + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
    return load_key_ring([f"file:{path}"], key_name=f"seal key file {path}")
