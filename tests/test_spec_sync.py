"""Generated spec files must match the code that generates them."""

from scripts.gen_messages_spec import OUT, render


def test_messages_spec_is_current():
    assert OUT.read_text() == render(), "spec/messages.md is stale: run scripts/gen_messages_spec.py"
