"""Field types shared by every message module."""

from __future__ import annotations

from typing import Annotated

from swarmnode.protocol.codec import MaxLen, Pattern, Size

Digest = Annotated[bytes, Size(32)]
Address = Annotated[bytes, Size(20)]
RunId = Annotated[str, Pattern(r"[a-z0-9][a-z0-9._-]{0,63}"), MaxLen(64)]
Role = Annotated[str, Pattern(r"trainer|relay|worker|validator")]
Url = Annotated[str, MaxLen(512)]

KIB = 1024
MIB = 1024 * KIB
