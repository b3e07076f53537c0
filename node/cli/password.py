"""The node key's password in the CLI: SWARMNODE_PASSWORD, taken out of the environment once, or a prompt.

The rule: a `swarmnode` process reads SWARMNODE_PASSWORD once, as its command starts (the `swarmnode` group
and the standalone `python -m swarmnode.node.cli.run` group call `take_env_password` before any command
runs), and removes it from the environment (`crypto.keystore.take_password_from_env`), so no process the
node starts afterwards (torchrun ranks, anvil, the code grader, ...) inherits it, even in a command that
never opens the key. A command called without those groups (a test's stand-in group) takes it on its first
`key_password()`.

What was taken is remembered in the command's click context (`ctx.meta`, shared by a group and its
sub-commands, gone when the command ends), not in a module global: a command that opens the key twice reads
the same password (or prompts once), and a second command in the same process (click's test runner) reads
its own environment again.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import click

from swarmnode.crypto.keystore import PASSWORD_ENV, take_password_from_env

_TAKEN = "swarmnode.password"  # ctx.meta key: the password this command took (None: none in the environment)


def take_env_password(ctx: click.Context) -> None:
    """Move SWARMNODE_PASSWORD from the environment into the command's context (once: later calls keep it)."""
    if _TAKEN not in ctx.meta:
        ctx.meta[_TAKEN] = take_password_from_env()


def key_password(*, confirm: bool = False, prompt: str = "Key password", tty_only: bool = True) -> str:
    """The key password of this command: SWARMNODE_PASSWORD as taken at its start, else a prompt (once).

    `confirm` asks twice (a new key). With `tty_only`, a command without a terminal stops with a usage error
    rather than reading the password from a pipe.
    """
    ctx = click.get_current_context()
    take_env_password(ctx)
    password: str | None = ctx.meta[_TAKEN]
    if password is None:
        if tty_only and not sys.stdin.isatty():
            raise click.UsageError(f"no terminal to prompt for the key password; set {PASSWORD_ENV}")
        password = str(click.prompt(prompt, hide_input=True, confirmation_prompt=confirm))
        ctx.meta[_TAKEN] = password
    return password


@contextmanager
def password_for_children(password: str) -> Iterator[None]:
    """SWARMNODE_PASSWORD back in the environment while the block starts the node's own processes.

    Only for launchers that start more of this node from `os.environ` and cannot be handed an env (torchrun's
    agent starting trainer ranks); each of them takes it out again as it starts (`take_env_password`). It is
    removed when the block ends.
    """
    os.environ[PASSWORD_ENV] = password
    try:
        yield
    finally:
        os.environ.pop(PASSWORD_ENV, None)
