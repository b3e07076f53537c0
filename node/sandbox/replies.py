"""Replies of a sandboxed program that speaks in nonce-prefixed JSON lines.

A program the node runs for a library (reasoning-gym's scorers, a verifiers environment) writes each result
as a line "<nonce> <json object>" on stdout; the nonce comes on its stdin, so text the library prints, or
text a completion makes it print, cannot pass for a result without first finding the nonce.
"""

from __future__ import annotations

import json
from typing import Any

# The program's side: it reads its request (a JSON object with "nonce") from stdin, keeps the real stdout for
# `reply(body)` and sends everything else printed to /dev/null. A program starts with this text.
PROGRAM_PREAMBLE = r'''
import json, os, sys
request = json.loads(sys.stdin.read())
nonce = request.pop("nonce")
out = os.fdopen(os.dup(1), "w", encoding="utf-8")
os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
def reply(body):
    out.write(nonce + " " + json.dumps(body, ensure_ascii=False) + "\n")
    out.flush()
'''


def nonced_replies(stdout: str, nonce: str) -> list[dict[str, Any]]:
    """The program's reply lines, in order (any other output is not the program's)."""
    prefix = nonce + " "
    replies = []
    for line in stdout.splitlines():
        if line.startswith(prefix):
            try:
                body = json.loads(line[len(prefix):])
            except ValueError:
                continue
            if isinstance(body, dict):
                replies.append(body)
    return replies
