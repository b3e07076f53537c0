"""The errors an operator causes and can fix: a wrong model folder or task file, a run id someone else
owns, a key without stake, a data directory from another run.

Each subclass's message names the file, key or peer and the fix. The CLI prints such an error as one
`Error:` line, wherever in the node it was raised (`node.cli.run.operator_error` finds it inside the
exception groups a trio node raises); any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations


class OperatorError(Exception):
    """An error whose message tells the operator what to change (see the module docstring)."""


class RunMismatch(OperatorError, RuntimeError):
    """This node cannot take part in the run it was pointed at: another dataset, model, base weights or
    DiLoCo plan, or a run id another key owns. The message names what differs."""
