"""The node key on disk: an Ethereum keystore v3 JSON file, mode 0600.

The same file opens in any Ethereum wallet, so an operator can move stake with familiar tools.
The password comes from SWARMNODE_PASSWORD or is asked for by the CLI; this module never prompts.
`take_password_from_env` is the only way the node reads SWARMNODE_PASSWORD: it takes the variable out of
the environment, so no process the node starts afterwards inherits it.
"""

from __future__ import annotations

import ctypes
import hashlib
import hmac
import json
import os
from collections.abc import MutableMapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from Crypto.Cipher import AES
from Crypto.Util import Counter

from swarmnode.crypto.hashing import keccak256

if TYPE_CHECKING:
    from swarmnode.crypto.identity import NodeIdentity

PASSWORD_ENV = "SWARMNODE_PASSWORD"


class KeystoreError(Exception):
    """The keystore is missing, unreadable, or the password is wrong."""


def take_password_from_env(environ: MutableMapping[str, str] | None = None) -> str | None:
    """SWARMNODE_PASSWORD, removed from the environment as it is read (None when it is not set).

    Why: every process the node starts (torchrun ranks, anvil, the code grader, ...) inherits the node's
    environment, and the password next to the keystore file is the node's private key. Deleting from
    `os.environ` calls unsetenv(3), so a child started afterwards, whatever starts it, does not get the
    variable. A second read finds nothing: the caller keeps what it took (the CLI remembers it for the
    rest of its command, `swarmnode.node.cli.password`).

    The kernel still shows a process's initial environment block in /proc/<pid>/environ, which any
    process of the same user may read (Yama restricts ptrace attach, not this). When the variable came
    from that block, its bytes there are overwritten too (`_scrub_initial_environ`, Linux, best effort).
    `environ` is for tests; the default is this process's environment.
    """
    if environ is not None:
        return environ.pop(PASSWORD_ENV, None)
    password = os.environ.pop(PASSWORD_ENV, None)
    if password is not None:
        _scrub_initial_environ(PASSWORD_ENV)
    return password


def _scrub_initial_environ(name: str) -> int:
    """Overwrite `name=...` in this process's initial environment block with NULs; returns entries wiped.

    /proc/self/environ reads the memory between env_start and env_end (fields 50 and 51 of
    /proc/self/stat, proc(5)): the strings the process was started with. After unsetenv nothing points at the
    entry any more, so wiping it in place is safe; an entry is wiped only after the bytes at its
    computed address were read back and matched. Anything unexpected (not Linux, an old kernel, a block
    that changed size) wipes nothing.
    """
    try:
        block = Path("/proc/self/environ").read_bytes()
        stat = Path("/proc/self/stat").read_bytes()
    except OSError:
        return 0
    fields = stat[stat.rfind(b")") + 2 :].split()  # fields[0] is field 3: comm may hold spaces
    if len(fields) < 49:
        return 0
    env_start, env_end = int(fields[47]), int(fields[48])
    if env_start == 0 or env_end - env_start != len(block):
        return 0
    prefix = name.encode() + b"="
    wiped, offset = 0, 0
    for entry in block.split(b"\0"):
        address = env_start + offset
        offset += len(entry) + 1
        if entry.startswith(prefix) and ctypes.string_at(address, len(entry)) == entry:
            ctypes.memset(address, 0, len(entry))
            wiped += 1
    return wiped


def save_keystore(
    identity: NodeIdentity, path: Path, password: str, *, kdf_iterations: int | None = None
) -> None:
    """Write the key encrypted; refuses to overwrite an existing file so no key is ever lost.

    The file is mode 0600 whatever the umask, so no other user (the code grader runs as one) can read it;
    a directory this creates for it is 0700. An existing directory keeps its mode: it is the operator's.
    """
    from eth_account import Account  # here, not at the top: the CLI imports this module in every command

    if path.exists():
        raise KeystoreError(f"{path} already exists; refusing to overwrite a key")
    kwargs = {"kdf": "scrypt"} if kdf_iterations is None else {"kdf": "pbkdf2", "iterations": kdf_iterations}
    document = Account.encrypt(identity.private_key, password, **kwargs)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)  # a leftover of a crash: O_TRUNC would keep its mode (and follow a link)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.fchmod(fd, 0o600)  # the umask only takes bits away; this makes it exactly 0600
    with os.fdopen(fd, "w") as handle:
        json.dump(document, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def load_keystore(path: Path, password: str) -> NodeIdentity:
    from swarmnode.crypto.identity import NodeIdentity

    try:
        document = json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise KeystoreError(f"no keystore at {path}; create one with `swarmnode keys new`") from exc
    except (OSError, json.JSONDecodeError) as exc:
        raise KeystoreError(f"cannot read keystore {path}: {exc}") from exc
    try:
        private_key = decrypt_v3(document, password)
        if private_key is None:  # another kind of keystore: eth_account's decoder
            from eth_account import Account

            private_key = bytes(Account.decrypt(document, password))
    except ValueError as exc:
        raise KeystoreError(f"cannot decrypt {path}: wrong password or corrupt file") from exc
    return NodeIdentity(private_key)


def decrypt_v3(document: Any, password: str) -> bytes | None:
    """The private key in a keystore v3 `document` as `save_keystore` writes it (scrypt or PBKDF2-HMAC-SHA256,
    AES-128-CTR, Keccak-256 MAC); None for a document of any other form, which eth_account decrypts.

    The same steps as eth_keyfile's v3 decoder, without importing eth_account (about a second of start-up
    for `swarmnode keys show`, most of it BLS curves that a v3 keystore never uses); tests/test_crypto.py
    holds the two to each other. Raises ValueError for a wrong password (MAC mismatch).
    """
    try:
        if document["version"] != 3 or document["crypto"]["cipher"] != "aes-128-ctr":
            return None
        crypto = document["crypto"]
        kdf, params = crypto["kdf"], crypto["kdfparams"]
        salt, ciphertext, mac = _unhex(params["salt"]), _unhex(crypto["ciphertext"]), _unhex(crypto["mac"])
        iv = int.from_bytes(_unhex(crypto["cipherparams"]["iv"]), "big")
        dklen = int(params["dklen"])
        if kdf == "scrypt":
            n, r, p = int(params["n"]), int(params["r"]), int(params["p"])
            maxmem = 128 * r * (n + p + 2) + (1 << 20)  # what OpenSSL's scrypt needs for these parameters
            if maxmem > 2**31 - 1:
                return None
        elif kdf == "pbkdf2" and params["prf"] == "hmac-sha256":
            iterations = int(params["c"])
        else:
            return None
    except (KeyError, TypeError, ValueError, AttributeError):
        return None  # malformed: eth_account says how
    secret = password.encode()
    if kdf == "scrypt":
        derived = hashlib.scrypt(secret, salt=salt, n=n, r=r, p=p, maxmem=maxmem, dklen=dklen)
    else:
        derived = hashlib.pbkdf2_hmac("sha256", secret, salt, iterations, dklen)
    if not hmac.compare_digest(keccak256(derived[16:32] + ciphertext), mac):
        raise ValueError("MAC mismatch")
    counter = Counter.new(128, initial_value=iv, allow_wraparound=True)
    return bytes(AES.new(derived[:16], AES.MODE_CTR, counter=counter).decrypt(ciphertext))


def _unhex(text: str) -> bytes:
    return bytes.fromhex(text[2:] if text[:2] in ("0x", "0X") else text)
