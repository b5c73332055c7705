"""`stagetrail verify`: check a run's hash chain, re-fold it through its stored table and the
projections; `--all` for every run of the store."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any
from uuid import UUID

from engine.cli.common import BadOption, Output, ProgressBar, print_json, short

if TYPE_CHECKING:
    from engine.engine import Engine
    from engine.verify import VerifyReport

_EVERY_RUN = 1_000_000_000
LISTED = 50
"""Runs with problems `--all` lists by name, problems of one run listed (the rest are counted)."""
LISTED_JSON = 1000
"""Runs with problems `--all --json` lists, problems of one run with --json (the rest counted)."""


def verify_run(
    engine: Engine,
    run_id: UUID,
    *,
    as_json: bool,
    chain_only: bool = False,
    timeout: float | None = None,
) -> bool:
    """Verify the run (its chain alone with `chain_only`, workers waited for up to `timeout`
    seconds); print the report; return whether it is sound."""
    report = engine.verify(
        run_id, chain_only=chain_only, workers=_workers(), worker_timeout=timeout
    )
    if as_json:
        problems = _problems(report, LISTED_JSON)
        print_json(
            {**_summary(report), "problems": problems, "problem_count": len(report.problems)}
        )
        return report.ok
    out = Output()
    chain = _chain_text(report)
    if report.ok:
        out.line(f"run {short(run_id)}: {report.events} events, no problems; {chain}", "green")
        return True
    out.line(
        f"run {short(run_id)}: {report.events} events, {len(report.problems)} problem(s); {chain}",
        "red",
    )
    rows = [[str(p.version), p.check, p.message] for p in report.problems[:LISTED]]
    out.table(["v", "check", "problem"], rows, right=(0,))
    if len(report.problems) > LISTED:
        more = len(report.problems) - LISTED
        out.line(f"and {more:,} more problem(s); --json lists the first {LISTED_JSON:,}")
    return False


def verify_all(
    engine: Engine, *, as_json: bool, chain_only: bool = False, timeout: float | None = None
) -> bool:
    """Verify every run of the store (their chains alone with `chain_only`, workers waited for
    up to `timeout` seconds), oldest first; print a summary and the runs with problems. A
    run a compaction erases (or has begun to) before it is checked is left out: it is no
    longer the store's."""
    from engine.errors import RunErased, RunNotFound

    listed = list(reversed(engine.runs(limit=_EVERY_RUN)))
    chains: Counter[str] = Counter()
    bad: list[VerifyReport] = []
    events, summaries = 0, []
    progress = ProgressBar("verify", len(listed))
    try:
        for summary in listed:
            try:
                report = engine.verify(
                    summary.run_id,
                    chain_only=chain_only,
                    workers=_workers(),
                    worker_timeout=timeout,
                )
            except (RunErased, RunNotFound):
                progress.advance(1)
                continue
            summaries.append(summary)
            chains[report.chain] += 1
            events += report.events
            if not report.ok:
                bad.append(report)
            progress.advance(1)
    finally:
        progress.close()
    if as_json:
        print_json(
            {
                "ok": not bad,
                "runs": len(summaries),
                "events": events,
                "chains": dict(sorted(chains.items())),
                "with_problems": len(bad),
                "problems": [
                    {**_summary(r), "first": _problems(r, 1)[0], "count": len(r.problems)}
                    for r in bad[:LISTED_JSON]
                ],
            }
        )
        return not bad
    _print_all(len(summaries), events, chains, bad)
    return not bad


def _print_all(runs: int, events: int, chains: Counter[str], bad: list[VerifyReport]) -> None:
    out = Output()
    counted = ", ".join(f"{count} {chain}" for chain, count in sorted(chains.items()))
    verdict = "no problems" if not bad else f"{len(bad)} run(s) with problems"
    out.line(f"{runs} runs, {events} events: {verdict}; chains: {counted or 'none'}",
             "red" if bad else "green")  # fmt: skip
    if not bad:
        return
    rows = [
        [short(r.run_id), str(r.problems[0].version), r.problems[0].check,
         r.problems[0].message, str(len(r.problems))]
        for r in bad[:LISTED]
    ]  # fmt: skip
    out.table(["run", "v", "check", "first problem", "problems"], rows, right=(1, 4), wrap=(3,))
    if len(bad) > LISTED:
        out.line(f"and {len(bad) - LISTED} more run(s) with problems")


def _chain_text(report: VerifyReport) -> str:
    if report.chain == "partial":
        return f"chain partial (linked from version {report.chained_from})"
    if report.chain == "unchecked":
        return "chain keyed, not checked (no chain key given)"
    if report.chain == "unchained":
        return "chain: none (written before chaining)"
    if report.head is None:
        return f"chain {report.chain}"
    return f"chain {report.chain}, head {report.head[:13]}"


def _summary(report: VerifyReport) -> dict[str, Any]:
    return {
        "run_id": str(report.run_id),
        "ok": report.ok,
        "events": report.events,
        "chain": report.chain,
        "head": report.head,
        "chained_from": report.chained_from,
    }


def _problems(report: VerifyReport, limit: int) -> list[dict[str, Any]]:
    """The first `limit` problems of `report` as JSON."""
    return [
        {"version": p.version, "check": p.check, "message": p.message}
        for p in report.problems[:limit]
    ]


def timeout_option(text: str | None) -> float | None:
    """``--worker-timeout``'s text as seconds (None: not given, the API's default), by the
    API's rule (`engine.verify.worker_seconds`).

    Raises:
        BadOption: not a number of seconds above 0, or past the longest wait a thread can
            make (`MAX_WORKER_TIMEOUT`).
    """
    from engine.errors import InvalidArgument
    from engine.store.chain_workers import MAX_WORKER_TIMEOUT
    from engine.verify import worker_seconds

    if text is None:
        return None
    try:
        return worker_seconds(float(text))
    except (ValueError, InvalidArgument):
        raise BadOption(
            "--worker-timeout",
            text,
            f"give a number of seconds above 0, such as 60 or 2.5 "
            f"(at most {MAX_WORKER_TIMEOUT:.0f})",
        ) from None


def _workers() -> int:
    """The chain check's worker processes for a long run: ``$STAGETRAIL_VERIFY_WORKERS``, else
    none (on two cores they made the check slower; this command's entry is guarded, as
    ``spawn`` needs)."""
    from engine.verify import workers_setting

    return workers_setting() or 0
