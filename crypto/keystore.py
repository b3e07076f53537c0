"""The node key on disk: an Ethereum keystore v3 JSON file, mode 0600.

The same file opens in any Ethereum wallet, so an operator can move stake with familiar tools.
The password comes from SWARMNODE_PASSWORD or is asked for by the CLI; this module never prompts.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from eth_account import Account

from swarmnode.crypto.identity import NodeIdentity

PASSWORD_ENV = "SWARMNODE_PASSWORD"


class KeystoreError(Exception):
    """The keystore is missing, unreadable, or the password is wrong."""


def save_keystore(
    identity: NodeIdentity, path: Path, password: str, *, kdf_iterations: int | None = None
) -> None:
    """Write the key encrypted; refuses to overwrite an existing file so no key is ever lost."""
    if path.exists():
        raise KeystoreError(f"{path} already exists; refusing to overwrite a key")
    kwargs = {"kdf": "scrypt"} if kdf_iterations is None else {"kdf": "pbkdf2", "iterations": kdf_iterations}
    document = Account.encrypt(identity.private_key, password, **kwargs)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(document, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def load_keystore(path: Path, password: str) -> NodeIdentity:
    try:
        document = json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise KeystoreError(f"no keystore at {path}; create one with `swarmnode keys new`") from exc
    except (OSError, json.JSONDecodeError) as exc:
        raise KeystoreError(f"cannot read keystore {path}: {exc}") from exc
    try:
        private_key = bytes(Account.decrypt(document, password))
    except ValueError as exc:
        raise KeystoreError(f"cannot decrypt {path}: wrong password or corrupt file") from exc
    return NodeIdentity(private_key)
