"""Sealing at rest: AES-GCM bound to column and run id, the key ring and its rotation, the
embedded key file, and secret references."""

from __future__ import annotations

import multiprocessing
import os
import stat
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from runq.errors import ConfigError, SealError
from runq.seal import (
    HEADER_BYTES,
    KEY_BYTES,
    MAGIC,
    KeyRing,
    PlainSealer,
    decode_key,
    ensure_key_file,
    generate_key,
    key_file_for,
    key_id_of,
    load_key_ring,
    read_secret,
    sealed_key_id,
)

OLD = bytes(range(32))
NEW = bytes(range(32, 64))
RUN = "0190c3c5-0000-7000-8000-000000000001"
OTHER_RUN = "0190c3c5-0000-7000-8000-000000000002"
SECRET = b'{"prompt":"the launch code is 0000"}'


# -- round trip ----------------------------------------------------------------------------


def test_round_trip() -> None:
    ring = KeyRing([OLD])
    sealed = ring.seal("payload", RUN, SECRET)
    assert sealed.startswith(MAGIC)
    assert sealed_key_id(sealed) == key_id_of(OLD) == ring.sealing_key_id
    assert SECRET not in sealed
    assert b"launch code" not in sealed
    assert len(sealed) == HEADER_BYTES + len(SECRET) + 16  # GCM tag
    assert ring.open("payload", RUN, sealed) == SECRET


def test_empty_plaintext_round_trips() -> None:
    ring = KeyRing([OLD])
    assert ring.open("answer", RUN, ring.seal("answer", RUN, b"")) == b""


def test_each_seal_uses_a_fresh_nonce() -> None:
    ring = KeyRing([OLD])
    a, b = ring.seal("payload", RUN, SECRET), ring.seal("payload", RUN, SECRET)
    assert a != b
    assert a[len(MAGIC) + 8 : HEADER_BYTES] != b[len(MAGIC) + 8 : HEADER_BYTES]


# -- binding and tampering -----------------------------------------------------------------


@pytest.mark.parametrize("position", [HEADER_BYTES - 1, HEADER_BYTES, HEADER_BYTES + 5, -1])
def test_tampering_is_detected(position: int) -> None:
    ring = KeyRing([OLD])
    sealed = bytearray(ring.seal("payload", RUN, SECRET))
    sealed[position] ^= 0x01
    with pytest.raises(SealError, match="failed to open"):
        ring.open("payload", RUN, bytes(sealed))


def test_truncated_value_is_refused() -> None:
    ring = KeyRing([OLD])
    sealed = ring.seal("payload", RUN, SECRET)
    with pytest.raises(SealError):
        ring.open("payload", RUN, sealed[:-1])
    with pytest.raises(SealError, match="not a sealed value"):
        ring.open("payload", RUN, sealed[: HEADER_BYTES - 1])


def test_cleartext_is_refused_never_passed_through() -> None:
    ring = KeyRing([OLD])
    with pytest.raises(SealError, match="not a sealed value"):
        ring.open("payload", RUN, SECRET)
    with pytest.raises(SealError):
        ring.open("payload", RUN, b"")


@pytest.mark.parametrize("other_column", ["answer", "resume_state", "decision"])
def test_a_value_moved_to_another_column_does_not_open(other_column: str) -> None:
    ring = KeyRing([OLD])
    sealed = ring.seal("payload", RUN, SECRET)
    with pytest.raises(SealError) as excinfo:
        ring.open(other_column, RUN, sealed)
    assert RUN in str(excinfo.value)
    assert other_column in str(excinfo.value)


def test_a_value_moved_to_another_run_does_not_open() -> None:
    ring = KeyRing([OLD])
    sealed = ring.seal("payload", RUN, SECRET)
    with pytest.raises(SealError) as excinfo:
        ring.open("payload", OTHER_RUN, sealed)
    assert OTHER_RUN in str(excinfo.value)


def test_unknown_key_id_names_the_key() -> None:
    sealed = KeyRing([NEW]).seal("payload", RUN, SECRET)
    with pytest.raises(SealError) as excinfo:
        KeyRing([OLD]).open("payload", RUN, sealed)
    assert key_id_of(NEW).hex() in str(excinfo.value)
    assert "seal.keys" in str(excinfo.value)


def test_a_forged_header_with_a_known_key_id_still_fails() -> None:
    ring = KeyRing([OLD, NEW])
    sealed = ring.seal("payload", RUN, SECRET)
    forged = MAGIC + key_id_of(NEW) + sealed[len(MAGIC) + 8 :]
    with pytest.raises(SealError, match="failed to open"):
        ring.open("payload", RUN, forged)


# -- key ring and rotation -----------------------------------------------------------------


def test_rotation_old_key_opens_new_key_seals() -> None:
    old_ring = KeyRing([OLD])
    before = old_ring.seal("payload", RUN, SECRET)
    rotated = KeyRing([NEW, OLD])
    assert rotated.sealing_key_id == key_id_of(NEW)
    assert rotated.open("payload", RUN, before) == SECRET
    after = rotated.seal("payload", RUN, SECRET)
    assert sealed_key_id(after) == key_id_of(NEW)
    assert KeyRing([NEW]).open("payload", RUN, after) == SECRET
    with pytest.raises(SealError):
        old_ring.open("payload", RUN, after)
    with pytest.raises(SealError):
        KeyRing([NEW]).open("payload", RUN, before)


def test_key_ring_refuses_bad_keys() -> None:
    with pytest.raises(SealError):
        KeyRing([])
    with pytest.raises(SealError, match="32 bytes"):
        KeyRing([b"short"])
    with pytest.raises(SealError):
        KeyRing([OLD, bytes(33)])


def test_key_ids_differ_per_key_and_are_stable() -> None:
    assert key_id_of(OLD) == key_id_of(bytes(range(32)))
    assert key_id_of(OLD) != key_id_of(NEW)
    assert len(key_id_of(OLD)) == 8


def test_sealed_key_id_of_something_else_is_none() -> None:
    assert sealed_key_id(b"") is None
    assert sealed_key_id(b"rq1") is None
    assert sealed_key_id(b"xx1" + bytes(HEADER_BYTES)) is None


def test_plain_sealer_is_the_identity() -> None:
    plain = PlainSealer()
    assert plain.seal("payload", RUN, SECRET) == SECRET
    assert plain.open("payload", RUN, SECRET) == SECRET


# -- key text ------------------------------------------------------------------------------


def test_generated_keys_decode_to_32_random_bytes() -> None:
    texts = {generate_key() for _ in range(20)}
    assert len(texts) == 20
    for text in texts:
        assert len(decode_key(text, key_name="k")) == KEY_BYTES
        assert "=" not in text


def test_decode_key_errors_name_the_key() -> None:
    with pytest.raises(ConfigError) as excinfo:
        decode_key("dG9vIHNob3J0", key_name="seal.keys[0]")  # "too short"
    assert excinfo.value.key == "seal.keys[0]"
    assert "bytes" in str(excinfo.value)
    with pytest.raises(ConfigError) as excinfo:
        decode_key("!!!! not base64 ****", key_name="seal.keys[1]")
    assert excinfo.value.key == "seal.keys[1]"


# -- secret references ---------------------------------------------------------------------


def test_read_secret_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNQ_TEST_SECRET", "  value\n")
    assert read_secret("env:RUNQ_TEST_SECRET", key_name="http.key") == "value"


@pytest.mark.parametrize("value", [None, "", "   "])
def test_read_secret_env_unset_or_empty(monkeypatch: pytest.MonkeyPatch, value: str | None) -> None:
    if value is None:
        monkeypatch.delenv("RUNQ_TEST_SECRET", raising=False)
    else:
        monkeypatch.setenv("RUNQ_TEST_SECRET", value)
    with pytest.raises(ConfigError) as excinfo:
        read_secret("env:RUNQ_TEST_SECRET", key_name="http.key")
    assert excinfo.value.key == "http.key"
    assert "RUNQ_TEST_SECRET" in str(excinfo.value)


def test_read_secret_from_file(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_text("from-file\n")
    assert read_secret(f"file:{path}", key_name="k") == "from-file"


def test_read_secret_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    with pytest.raises(ConfigError) as excinfo:
        read_secret(f"file:{missing}", key_name="http.jwt.secret")
    assert excinfo.value.key == "http.jwt.secret"
    assert str(missing) in str(excinfo.value)


@pytest.mark.parametrize("reference", ["hunter2", "env:", "file:", "vault:secret/x", ":x"])
def test_read_secret_refuses_inline_or_unknown_references(reference: str) -> None:
    with pytest.raises(ConfigError) as excinfo:
        read_secret(reference, key_name="seal.keys[0]")
    assert excinfo.value.key == "seal.keys[0]"


def test_load_key_ring_names_the_failing_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNQ_TEST_K0", generate_key())
    monkeypatch.delenv("RUNQ_TEST_K1", raising=False)
    with pytest.raises(ConfigError) as excinfo:
        load_key_ring(["env:RUNQ_TEST_K0", "env:RUNQ_TEST_K1"])
    assert excinfo.value.key == "seal.keys[1]"
    monkeypatch.setenv("RUNQ_TEST_K1", "bad")
    with pytest.raises(ConfigError) as excinfo:
        load_key_ring(["env:RUNQ_TEST_K0", "env:RUNQ_TEST_K1"])
    assert excinfo.value.key == "seal.keys[1]"


def test_load_key_ring_first_key_seals(monkeypatch: pytest.MonkeyPatch) -> None:
    first, second = generate_key(), generate_key()
    monkeypatch.setenv("RUNQ_TEST_K0", first)
    monkeypatch.setenv("RUNQ_TEST_K1", second)
    ring = load_key_ring(["env:RUNQ_TEST_K0", "env:RUNQ_TEST_K1"])
    assert ring.sealing_key_id == key_id_of(decode_key(first, key_name="k"))
    old_value = KeyRing([decode_key(second, key_name="k")]).seal("payload", RUN, SECRET)
    assert ring.open("payload", RUN, old_value) == SECRET


# -- the embedded key file -----------------------------------------------------------------


def test_key_file_sits_beside_the_database(tmp_path: Path) -> None:
    assert key_file_for(tmp_path / "runq.db") == tmp_path / "runq.db.key"


def test_key_file_is_created_once_with_mode_0600(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "runq.db.key"
    ring = ensure_key_file(path)
    mode = stat.S_IMODE(path.stat().st_mode)
    assert mode == 0o600, oct(mode)
    sealed = ring.seal("payload", RUN, SECRET)
    again = ensure_key_file(path)
    assert again.sealing_key_id == ring.sealing_key_id
    assert again.open("payload", RUN, sealed) == SECRET
    assert [p.name for p in path.parent.iterdir()] == ["runq.db.key"], "no temp files left"


def test_key_file_mode_ignores_a_permissive_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        ensure_key_file(tmp_path / "k.key")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "k.key").stat().st_mode) == 0o600


def test_a_corrupt_key_file_is_an_error_not_a_new_key(tmp_path: Path) -> None:
    path = tmp_path / "runq.db.key"
    path.write_text("garbage\n")
    with pytest.raises(ConfigError):
        ensure_key_file(path)
    assert path.read_text() == "garbage\n"


def test_threads_racing_to_create_the_key_file_agree(tmp_path: Path) -> None:
    path = tmp_path / "race.key"
    start = threading.Barrier(16)

    def make() -> bytes:
        start.wait(10)
        return ensure_key_file(path).sealing_key_id

    with ThreadPoolExecutor(16) as pool:
        ids = list(pool.map(lambda _: make(), range(16)))
    assert len(set(ids)) == 1
    assert [p.name for p in tmp_path.iterdir()] == ["race.key"]


def _key_id_in_process(path: str, barrier: object, out: object) -> None:
    barrier.wait(30)  # type: ignore[attr-defined]
    out.put(ensure_key_file(Path(path)).sealing_key_id.hex())  # type: ignore[attr-defined]


@pytest.mark.timeout(120)
def test_processes_racing_to_create_the_key_file_agree(tmp_path: Path) -> None:
    path = tmp_path / "race.key"
    ctx = multiprocessing.get_context("spawn")
    barrier, out = ctx.Barrier(4), ctx.Queue()
    procs = [
        ctx.Process(target=_key_id_in_process, args=(str(path), barrier, out)) for _ in range(4)
    ]
    for p in procs:
        p.start()
    ids = {out.get(timeout=60) for _ in procs}
    for p in procs:
        p.join(30)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    assert len(ids) == 1
    assert ids == {ensure_key_file(path).sealing_key_id.hex()}
    assert [p.name for p in tmp_path.iterdir()] == ["race.key"]


def test_seal_many_seals_each_value_as_seal_does() -> None:
    ring = KeyRing([OLD])
    runs = [RUN, OTHER_RUN, RUN]
    values = [SECRET, b"", b'{"i":2}']
    sealed = ring.seal_many("payload", runs, values)
    assert [ring.open("payload", r, s) for r, s in zip(runs, sealed, strict=True)] == values
    assert len({s[len(MAGIC) + 8 : HEADER_BYTES] for s in sealed}) == 3  # a nonce each
    with pytest.raises(SealError):
        ring.open("payload", OTHER_RUN, sealed[0])  # still bound to its run
    with pytest.raises(SealError):
        ring.open("answer", RUN, sealed[0])  # and to its column
    assert ring.seal_many("payload", [], []) == []
    assert PlainSealer().seal_many("payload", runs, values) == values
