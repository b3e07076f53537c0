"""Identity, signatures, keystore and Merkle trees."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest
from eth_account import Account
from eth_utils import is_checksum_address
from hypothesis import given, settings
from hypothesis import strategies as st
from libp2p.crypto.secp256k1 import create_new_key_pair
from libp2p.peer.id import ID

from swarmnode.crypto.hashing import keccak256
from swarmnode.crypto.identity import NodeIdentity, format_address, parse_address
from swarmnode.crypto.keystore import (
    PASSWORD_ENV,
    KeystoreError,
    load_keystore,
    save_keystore,
    take_password_from_env,
)
from swarmnode.crypto.merkle import inclusion_proof, is_included, merkle_root, root_from_inclusion_proof
from swarmnode.crypto.signing import InvalidSignature, recover_address

KEY = bytes(range(1, 33))


def test_peer_id_matches_libp2p_and_address_matches_eth_account():
    identity = NodeIdentity(KEY)
    assert identity.peer_id == ID.from_pubkey(create_new_key_pair(KEY).public_key).to_base58()
    assert identity.checksum_address == Account.from_key(KEY).address
    assert is_checksum_address(identity.checksum_address)


def test_known_address_of_private_key_one():
    identity = NodeIdentity((1).to_bytes(32, "big"))
    assert identity.checksum_address == "0x7E5F4552091A69125d5DfCb7b8C2659029395Bdf"


@pytest.mark.parametrize("bad", [b"\x00" * 32, b"\xff" * 32, b"\x01" * 31])
def test_invalid_private_keys_are_refused(bad):
    with pytest.raises(ValueError):
        NodeIdentity(bad)


def test_sign_recover_and_tamper():
    identity = NodeIdentity(KEY)
    digest = keccak256(b"hello")
    sig = identity.sign(digest)
    assert recover_address(digest, sig) == identity.address
    assert recover_address(keccak256(b"other"), sig) != identity.address
    with pytest.raises(InvalidSignature):
        recover_address(digest, sig[:64] + b"\x1d")
    with pytest.raises(InvalidSignature):
        recover_address(digest, b"\x00" * 65)


def test_address_parsing_checks_checksum():
    identity = NodeIdentity(KEY)
    text = identity.checksum_address
    assert parse_address(text) == identity.address
    assert parse_address(text.lower()) == identity.address
    broken = text[:-1] + (text[-1].lower() if text[-1].isupper() else text[-1].upper())
    if broken != text and any(c.isalpha() for c in text[-1]):
        with pytest.raises(ValueError):
            parse_address(broken)
    assert format_address(identity.address) == text


def test_keystore_roundtrip_mode_0600_and_no_overwrite(tmp_path):
    identity = NodeIdentity(KEY)
    path = tmp_path / "node.key"
    save_keystore(identity, path, "pw", kdf_iterations=2)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert load_keystore(path, "pw").address == identity.address
    with pytest.raises(KeystoreError, match="wrong password"):
        load_keystore(path, "nope")
    with pytest.raises(KeystoreError, match="refusing to overwrite"):
        save_keystore(identity, path, "pw", kdf_iterations=2)
    with pytest.raises(KeystoreError, match="keys new"):
        load_keystore(tmp_path / "missing.key", "pw")


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=20, max_size=20))
def test_format_address_is_eth_utils_eip55(address):
    from eth_utils import to_checksum_address

    assert format_address(address) == to_checksum_address(address)


@pytest.mark.parametrize("kdf", ["pbkdf2", "scrypt"])
def test_the_v3_decoder_is_eth_accounts_and_other_keystores_go_to_eth_account(tmp_path, kdf):
    """`load_keystore` decrypts a v3 keystore itself (no eth_account import: `swarmnode keys show` starts
    fast); it must agree with eth_account on every key, password and KDF, and hand anything else to it."""
    import json

    from swarmnode.crypto.keystore import decrypt_v3

    for index in range(4):
        private_key = bytes([index + 1]) * 32
        password = ["pw", "", "pässwörd 🔑", "x" * 100][index]
        document = Account.encrypt(private_key, password, kdf=kdf, iterations=2 if kdf == "pbkdf2" else 2**4)
        assert decrypt_v3(document, password) == bytes(Account.decrypt(document, password)) == private_key
        with pytest.raises(ValueError):
            decrypt_v3(document, password + "!")
        path = tmp_path / f"{kdf}-{index}.key"
        path.write_text(json.dumps(document))
        assert load_keystore(path, password).private_key == private_key
    upper = json.loads(json.dumps(document).replace('"crypto"', '"Crypto"'))  # geth's spelling: eth_account's
    assert decrypt_v3(upper, password) is None
    assert bytes(Account.decrypt(upper, password)) == private_key
    for broken in ({}, {"version": 4}, {"version": 3, "crypto": {"cipher": "aes-128-cbc"}}, []):
        assert decrypt_v3(broken, password) is None


def test_keystore_is_0600_whatever_the_umask_or_a_leftover_and_its_new_directory_0700(tmp_path):
    path = tmp_path / "new-dir" / "node.key"
    existing = tmp_path / "existing"
    existing.mkdir()
    existing.chmod(0o755)
    leftover = existing / "node.key.tmp"  # a crash's leftover, world-readable: never reused as is
    leftover.write_text("stale")
    leftover.chmod(0o644)
    old = os.umask(0)
    try:
        save_keystore(NodeIdentity(KEY), path, "pw", kdf_iterations=2)
        save_keystore(NodeIdentity(KEY), existing / "node.key", "pw", kdf_iterations=2)
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700  # created here: only the owner may list it
    assert stat.S_IMODE(os.stat(existing / "node.key").st_mode) == 0o600 and not leftover.exists()
    assert stat.S_IMODE(os.stat(existing).st_mode) == 0o755  # an existing directory is the operator's
    assert load_keystore(existing / "node.key", "pw").address == NodeIdentity(KEY).address


SECRET = "correct-horse-7f3a-not-in-any-child"
# a child of the process that took the password: its own environment and its parent's /proc view
CHILD = (
    "import os; print(os.environ.get('SWARMNODE_PASSWORD'));"
    "print(open(f'/proc/{os.getppid()}/environ', 'rb').read().hex())"
)


def test_take_password_from_env_takes_it_once_and_a_child_started_after_never_sees_it(monkeypatch):
    monkeypatch.setenv(PASSWORD_ENV, SECRET)
    assert take_password_from_env() == SECRET
    assert PASSWORD_ENV not in os.environ and take_password_from_env() is None
    child = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=True)
    assert child.stdout.splitlines()[0] == "None"
    mapping = {PASSWORD_ENV: "x", "OTHER": "y"}
    assert take_password_from_env(mapping) == "x" and mapping == {"OTHER": "y"}


def test_a_node_started_with_the_password_shows_it_to_no_child_nor_in_its_own_proc_environ():
    """The node process got the password in its initial environment (as devnet nodes and trainer ranks do):
    after taking it, neither a child's environment nor the node's /proc/<pid>/environ holds it."""
    node = f"""
import os, subprocess, sys
from swarmnode.crypto.keystore import take_password_from_env
before = open("/proc/self/environ", "rb").read()
assert {SECRET!r}.encode() in before
print(take_password_from_env() == {SECRET!r}, take_password_from_env() is None)
child = subprocess.run([sys.executable, "-c", {CHILD!r}], capture_output=True, text=True, check=True)
print(child.stdout, end="")
after = open("/proc/self/environ", "rb").read()
print(len(after) == len(before), {PASSWORD_ENV!r}.encode() in after, b"HOME=" in after)
"""
    env = {**os.environ, PASSWORD_ENV: SECRET}
    argv = [sys.executable, "-c", node]
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    took, child_env, child_proc, after = result.stdout.splitlines()[:4]
    assert took == "True True" and child_env == "None"
    # the password's variable, by name (other SWARMNODE_ settings of the environment are the operator's)
    assert SECRET.encode() not in bytes.fromhex(child_proc)
    assert PASSWORD_ENV.encode() not in bytes.fromhex(child_proc)
    assert after == "True False True"  # the block keeps its size; only that entry is wiped


@settings(max_examples=60, deadline=None)
@given(st.lists(st.binary(max_size=8), min_size=1, max_size=40), st.data())
def test_merkle_inclusion_proofs_verify_and_bind_index(leaves, data):
    root = merkle_root(leaves)
    index = data.draw(st.integers(0, len(leaves) - 1))
    proof = inclusion_proof(leaves, index)
    assert is_included(leaves[index], index, len(leaves), proof, root)
    assert not is_included(leaves[index] + b"x", index, len(leaves), proof, root)
    if len(leaves) > 1:
        other = (index + 1) % len(leaves)
        assert root_from_inclusion_proof(leaves[index], index, len(leaves), proof) == root
        wrong_index_ok = is_included(leaves[index], other, len(leaves), proof, root)
        assert not wrong_index_ok or leaves[other] == leaves[index]


def test_merkle_malformed_paths_are_refused():
    leaves = [b"a", b"b", b"c"]
    root = merkle_root(leaves)
    proof = inclusion_proof(leaves, 0)
    assert not is_included(b"a", 0, 3, proof + [root], root)
    assert not is_included(b"a", 0, 3, proof[:-1], root)
    assert not is_included(b"a", 5, 3, proof, root)


def test_the_address_a_peer_id_embeds_is_the_keys_address():
    from libp2p.peer.id import ID

    from swarmnode.crypto.identity import address_of_peer_id

    one, other = NodeIdentity(b"\x01" * 32), NodeIdentity(b"\x02" * 32)
    raw = ID.from_base58(one.peer_id).to_bytes()
    assert address_of_peer_id(raw) == one.address != other.address
    assert address_of_peer_id(raw[:-1]) is None  # truncated
    assert address_of_peer_id(b"\x12\x20" + bytes(32)) is None  # a hashed (non-secp256k1) peer id
    assert address_of_peer_id(raw[:6] + b"\x05" + bytes(32)) is None  # not a point on the curve
