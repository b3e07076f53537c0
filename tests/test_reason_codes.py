"""Every typed ledger error carries a code the protocol defines, in the ledger class."""

from swarmnode.ledger.errors import ERRORS_BY_CODE
from swarmnode.protocol.errors import Reason


def test_ledger_error_codes_are_protocol_reasons():
    for code, cls in ERRORS_BY_CODE.items():
        reason = Reason(code)
        assert reason.error_class == "ledger", (cls, reason)
