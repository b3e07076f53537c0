"""`swarmnode ledger …`: the group, and the queries and audits anyone holding the ledger may run.

Reads only: nodes, stakes, contributions, batches, totals, slashes, prove (make or check a credit proof)
and verify (audit every record). The writes that govern the ledger (deploy, run, slash) are in
cli/ledger_admin.py; staking and registering a node in cli/stake.py; the options and printing they share in
cli/ledger_common.py. `register_commands` adds `stake`, `register` and `ledger` to a CLI group;
`python -m swarmnode.node.cli.ledger` runs those three alone.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import click

from swarmnode.crypto.identity import format_address
from swarmnode.ledger import LedgerError, SlashRecord, parse_ledger_url, verify_log
from swarmnode.ledger.proofs import ProofFormatError, dump_proof, load_proof, proof_to_json
from swarmnode.ledger.types import SLASH_PENDING
from swarmnode.node.cli.ledger_admin import ledger_deploy, run_group, slash_group
from swarmnode.node.cli.ledger_common import (
    CONTRACT_ENV,
    address_arg,
    emit_json,
    json_option,
    ledger_options,
    opened,
    print_table,
    short_hex,
)
from swarmnode.node.cli.stake import register_command, stake_group
from swarmnode.protocol.runs import step_counter, step_version

# --- ledger --------------------------------------------------------------------------------------


@click.group("ledger")
def ledger_group() -> None:
    """Query, audit and deploy the ledger.

    \b
    The flow:
      ledger deploy                once: a signed-log file, or the contract on a chain
      register, stake deposit      every node: its role and compute, then its stake
      ledger run register          the trainer: its run, the validators it trusts, the bounds of a credit
      (the node)                   validators commit credit batches and file slashes as they validate
      contributions, batches,      read the credited work; totals is what a reward split reads
      totals
      prove                        prove one credit is in its batch; check a saved proof
      slashes, slash void|finalize see and settle slashes after their challenge window
      verify                       audit every record
    """


# The writes that govern the ledger live in ledger_admin; they join the group here, explicitly.
ledger_group.add_command(ledger_deploy)
ledger_group.add_command(run_group)
ledger_group.add_command(slash_group)


@ledger_group.command("nodes")
@ledger_options
@json_option
def ledger_nodes(ledger_spec: str, contract: str | None, as_json: bool) -> None:
    """Registered nodes, in registration order."""
    with opened(ledger_spec, contract) as ledger:
        nodes = ledger.nodes()
    if as_json:
        emit_json({"nodes": nodes})
        return
    print_table(
        "nodes",
        ["address", "role", "compute", "peer id", "since epoch", "slashes", "ejected"],
        [
            [
                format_address(n.address),
                n.role,
                f"{n.compute.count}x {n.compute.accelerator} {n.compute.memory_gb} GB",
                n.peer_id,
                n.registered_epoch,
                n.slash_count,
                n.ejected,
            ]
            for n in nodes
        ],
    )


@ledger_group.command("stakes")
@ledger_options
@json_option
def ledger_stakes(ledger_spec: str, contract: str | None, as_json: bool) -> None:
    """Every registered node's stake."""
    with opened(ledger_spec, contract) as ledger:
        stakes = ledger.stakes()
        epoch = ledger.current_epoch()
    if as_json:
        emit_json({"epoch": epoch, "stakes": stakes})
        return
    print_table(
        f"stakes (epoch {epoch})",
        ["address", "bonded", "unbonding", "release", "required", "eligible"],
        [
            [
                format_address(s.address),
                s.bonded_gwei,
                s.unbonding_gwei,
                s.release_epoch,
                s.required_gwei,
                s.eligible,
            ]
            for s in stakes
        ],
    )


@ledger_group.command("contributions")
@click.option("--node", "node_text", default=None, metavar="ADDR", help="worker or validator")
@click.option("--run", default=None)
@ledger_options
@json_option
def ledger_contributions(
    node_text: str | None, run: str | None, ledger_spec: str, contract: str | None, as_json: bool
) -> None:
    """Credited contributions, optionally for one node or run, each with the batch that credited it.

    Each credits one assignment: a worker's COUNTER-th submission on checkpoint VERSION (the table shows
    version/n; --json keeps the packed step, version << 32 | counter).

    `swarmnode ledger prove --contribution N` proves one of them is in its batch's Merkle root.
    """
    node = address_arg(node_text)
    with opened(ledger_spec, contract) as ledger:
        records = ledger.contributions(node=node, run=run)
    if as_json:
        emit_json({"contributions": records, "total_tokens": sum(r.tokens for r in records)})
        return
    print_table(
        "contributions",
        ["#", "batch", "run", "version/n", "worker", "validator", "tokens", "flops", "rollout", "epoch"],
        [
            [
                r.index,
                r.batch,
                r.run,
                f"{step_version(r.step)}/{step_counter(r.step)}",  # the step packs both (protocol.runs)
                format_address(r.worker),
                format_address(r.validator),
                r.tokens,
                r.flops,
                short_hex(r.rollout_digest),
                r.epoch,
            ]
            for r in records
        ],
    )


@ledger_group.command("batches")
@click.option("--run", default=None, help="only this run's batches")
@ledger_options
@json_option
def ledger_batches(run: str | None, ledger_spec: str, contract: str | None, as_json: bool) -> None:
    """Committed credit batches: one validator's credits of one run as one entry (one transaction on chain).

    The ledger stores each batch's Merkle root over its credits and the per-worker totals; its contributions
    are numbered first..first+count-1.
    """
    with opened(ledger_spec, contract) as ledger:
        records = ledger.batches(run=run)
    if as_json:
        emit_json({"batches": records})
        return
    print_table(
        "batches",
        ["#", "run", "validator", "credits", "first contribution", "root", "epoch"],
        [
            [
                b.index,
                b.run,
                format_address(b.validator),
                b.count,
                b.first_contribution,
                short_hex(b.root),
                b.epoch,
            ]
            for b in records
        ],
    )


@ledger_group.command("totals")
@click.option("--run", default=None, help="only this run's workers")
@ledger_options
@json_option
def ledger_totals(run: str | None, ledger_spec: str, contract: str | None, as_json: bool) -> None:
    """Each worker's credited work per run: credits, tokens, flops. What a reward split reads."""
    with opened(ledger_spec, contract) as ledger:
        records = ledger.totals(run=run)
    if as_json:
        emit_json({"totals": records})
        return
    print_table(
        "totals",
        ["run", "worker", "credits", "tokens", "flops"],
        [[t.run, format_address(t.worker), t.credits, t.tokens, t.flops] for t in records],
    )


@ledger_group.command("slashes")
@click.option(
    "--node", "node_text", default=None, metavar="ADDR", help="as the slashed worker or the slasher"
)
@click.option("--run", default=None, help="only this run's slashes")
@click.option(
    "--pending", is_flag=True, help="only slashes still in their challenge window (or awaiting finalize)"
)
@ledger_options
@json_option
def ledger_slashes(
    node_text: str | None,
    run: str | None,
    pending: bool,
    ledger_spec: str,
    contract: str | None,
    as_json: bool,
) -> None:
    """Slashes with the submission each cites and where each stands.

    A slash is filed pending: nothing is taken during its run's challenge window, while the run's owner (at
    once) or a majority of the run's other validators (by vote) may void it, which costs the slasher what it
    asked (`swarmnode ledger slash void`). From its final epoch anyone may finalize it, which takes the
    worker's stake (`swarmnode ledger slash finalize`).
    """
    node = address_arg(node_text)
    with opened(ledger_spec, contract) as ledger:
        epoch = ledger.current_epoch()
        records = [
            r
            for r in ledger.slashes(node=node)
            if (run is None or r.run == run) and (not pending or r.status == SLASH_PENDING)
        ]
    if as_json:
        emit_json({"epoch": epoch, "slashes": records})
        return
    print_table(
        f"slashes (epoch {epoch})",
        [
            "#",
            "run",
            "worker",
            "validator",
            "status",
            "gwei asked/taken/penalty",
            "votes",
            "reason",
            "chunks",
        ],
        [
            [
                r.index,
                r.run,
                format_address(r.worker),
                format_address(r.validator),
                _slash_status(r),
                f"{r.requested_gwei}/{r.taken_gwei}/{r.penalty_gwei}",
                r.votes,
                r.reason_code,
                ",".join(map(str, r.failing_chunks)),
            ]
            for r in records
        ],
    )


def _slash_status(record: SlashRecord) -> str:
    ejected = ", ejected" if record.ejected else ""
    if record.status == SLASH_PENDING:
        return f"pending, final from epoch {record.final_epoch}"
    return f"{record.status}{ejected}"


# --- proofs --------------------------------------------------------------------------------------


@ledger_group.command("prove")
@click.option(
    "--contribution",
    type=click.IntRange(min=0),
    default=None,
    metavar="N",
    help="make the proof of contribution N (see `ledger contributions`)",
)
@click.option(
    "--check",
    "check_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    metavar="FILE",
    help="check a saved proof against this ledger instead",
)
@click.option(
    "--out",
    type=click.Path(dir_okay=False, writable=True, path_type=Path),
    default=None,
    metavar="FILE",
    help="write the proof here (default: stdout)",
)
@ledger_options
@json_option
def ledger_prove(
    contribution: int | None,
    check_path: Path | None,
    out: Path | None,
    ledger_spec: str,
    contract: str | None,
    as_json: bool,
) -> None:
    """Prove that a credited contribution is in its validator's committed batch, or check such a proof.

    A proof is the credit, its leaf index and the Merkle path to the batch's root (JSON, hex). It is checked
    twice: its path leads to its root, and the ledger holds that batch with that root, run, validator and
    count (on evm: the contract's own verify_credit view). Keep it: it shows your credit to anyone holding
    the ledger, without the validator's records. Exit status 1 when a proof does not verify.
    """
    if (contribution is None) == (check_path is None):
        raise click.UsageError("pass exactly one of --contribution N and --check FILE")
    if check_path is not None and out is not None:
        raise click.UsageError("--out writes a new proof; --check reads one")
    if check_path is not None:
        try:
            proof = load_proof(check_path.read_text())
        except (ProofFormatError, UnicodeDecodeError) as exc:
            raise click.ClickException(f"{check_path} is not a credit proof: {exc}") from None
    with opened(ledger_spec, contract) as ledger:
        if contribution is not None:
            try:
                proof = ledger.prove_credit(contribution)
            except IndexError:
                count = len(ledger.contributions())
                raise click.ClickException(
                    f"there is no contribution {contribution}; the ledger holds {count}"
                ) from None
        path_ok = proof.verify()
        on_ledger = ledger.check_credit_proof(proof)
    ok = path_ok and on_ledger
    if contribution is not None:
        if out is not None:
            out.write_text(dump_proof(proof))
        elif not as_json:
            click.echo(dump_proof(proof), nl=False)
    if as_json:
        emit_json(
            {"ok": ok, "path_leads_to_root": path_ok, "on_ledger": on_ledger, "proof": proof_to_json(proof)}
        )
    elif ok:
        where = f", written to {out}" if out is not None else ""
        click.echo(
            f"ok: contribution {proof.contribution} is leaf {proof.leaf_index} of batch {proof.batch} "
            f"(run {proof.run!r}, {proof.count} credits, root 0x{proof.root.hex()}){where}",
            err=contribution is not None and out is None,
        )
    if not path_ok:
        raise click.ClickException("the proof's path does not lead to its root")
    if not on_ledger:
        raise click.ClickException(
            f"this ledger holds no batch {proof.batch} with root 0x{proof.root.hex()}, run {proof.run!r}, "
            f"validator {format_address(proof.validator)} and {proof.count} credits"
        )


@ledger_group.command("verify")
@ledger_options
@json_option
def ledger_verify(ledger_spec: str, contract: str | None, as_json: bool) -> None:
    """Audit a ledger; exit status 1 naming the first failure.

    signed:PATH replays the log from genesis, re-checking every hash, signature and rule. evm:URL checks the
    contract runs the committed code, then re-derives its records from the transactions' calldata: every
    batch's root and count, credits within their run's bounds and never twice, the per-worker totals, every
    slash's cited signature recovering to the slashed worker, validators in their run's set, and the money
    (deposits - withdrawals = held + burned, covered by the balance). What the chain cannot show is printed
    as a note.
    """
    try:
        kind, target = parse_ledger_url(ledger_spec)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from exc
    if kind == "evm":
        _verify_contract(target, contract, as_json)
        return
    if not Path(target).exists():
        raise click.ClickException(f"no signed log at {target}")
    report = verify_log(Path(target))
    head = report.signed_head
    document = {
        "ok": report.ok,
        "entries": report.entries,
        "head": report.head,
        "merkle_root": report.root,
        "checkpoints": report.checkpoints,
        "first_bad_entry": report.first_bad,
        "truncated": report.truncated,
        "signed_head": None
        if head is None
        else {"entries": head.size, "head": head.head, "signer": head.signer},
        "error": None if report.error is None else str(report.error),
    }
    if as_json:
        emit_json(document)
    elif report.ok:
        signer = "" if head is None else f", head signed by {format_address(head.signer)}"
        click.echo(
            f"ok: {report.entries} entries, head 0x{report.head.hex()}, merkle root 0x{report.root.hex()}, "
            f"{report.checkpoints} epoch checkpoints{signer}"
        )
    if report.truncated:
        raise click.ClickException(f"log is truncated: {report.error}")
    if not report.ok:
        raise click.ClickException(f"log is corrupt: {report.error}")


def _verify_contract(url: str, contract: str | None, as_json: bool) -> None:
    from swarmnode.ledger.evm import EvmLedger
    from swarmnode.ledger.evm_audit import audit_chain

    if contract is None:
        raise click.ClickException(f"pass --contract (or set {CONTRACT_ENV})")
    try:
        evm = EvmLedger.connect(url, contract)
        report = audit_chain(evm)
    except LedgerError as exc:
        raise click.ClickException(str(exc)) from exc
    if as_json:
        emit_json({**dataclasses.asdict(report), "ok": report.ok, "first_failure": report.first_failure})
    else:
        for note in report.notes:
            click.echo(f"note: {note}", err=True)
    if not report.ok:
        more = f" (and {len(report.failures) - 1} more)" if len(report.failures) > 1 else ""
        raise click.ClickException(f"{report.contract} fails the audit: {report.first_failure}{more}")
    if not as_json:
        click.echo(
            f"ok: {report.contract} runs the committed SwarmLedger code; {report.runs} runs, "
            f"{report.batches} batches ({report.credits} credits), {report.slashes} slashes; "
            "the money checks out"
        )


def register_commands(group: click.Group) -> None:
    """Add `stake`, `register` and `ledger` to the main CLI group."""
    group.add_command(stake_group)
    group.add_command(register_command)
    group.add_command(ledger_group)


@click.group()
def standalone() -> None:
    """swarmnode ledger commands (standalone entry point: python -m swarmnode.node.cli.ledger)."""


register_commands(standalone)

if __name__ == "__main__":
    standalone()
