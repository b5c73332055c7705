"""`stagetrail verify` and `verify --all` on tampered, keyed and old stores."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
from concurrent.futures import Future
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest

from engine import Engine
from engine.store.event_store import PAGE
from tests._helpers import REVIEW
from tests.audit.tampering import Rows
from tests.audit.test_chain import DATA, recorded
from tests.cli._helpers import as_json, fails, invoke, ok


class TestVerifyCommand:
    def test_a_tampered_run_exits_1_naming_the_version(self, shared_url: str) -> None:
        """An edited payload is a chain problem at its version; the exit code is 1."""
        with Engine(shared_url) as engine:
            run_id = recorded(engine)
        assert "chain intact" in ok("verify", str(run_id), "--store", shared_url)
        Rows(shared_url).edit(run_id, 2, b'"python"', b'"rustc_"')
        result = invoke("verify", str(run_id), "--store", shared_url)
        assert result.exit_code == 1
        assert "chain broken" in result.stdout
        data = json.loads(invoke("verify", str(run_id), "--store", shared_url, "--json").stdout)
        assert (data["ok"], data["chain"]) == (False, "broken")
        assert data["problems"][0]["version"] == 2
        assert data["problems"][0]["check"] == "chain"

    def test_the_chain_alone_names_the_same_version(self, sqlite_url: str) -> None:
        """--chain-only checks the links alone and names the edited version, exit code 1."""
        with Engine(sqlite_url) as engine:
            run_id = recorded(engine)
        assert "8 events, no problems; chain intact" in ok(
            "verify", str(run_id), "--chain-only", "--store", sqlite_url
        )
        Rows(sqlite_url).edit(run_id, 2, b'"python"', b'"rustc_"')
        result = invoke("verify", str(run_id), "--chain-only", "--store", sqlite_url, "--json")
        assert result.exit_code == 1
        data = json.loads(result.stdout)
        assert [(p["version"], p["check"]) for p in data["problems"]] == [(2, "chain")]
        assert (
            "chains: 1 broken"
            in invoke("verify", "--all", "--chain-only", "--store", sqlite_url).stdout
        )

    def test_a_bad_worker_variable_is_one_error_naming_it(
        self, sqlite_url: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A `$STAGETRAIL_VERIFY_WORKERS` that is no whole number up to 64 is one error that
        names the variable, exit code 2."""
        with Engine(sqlite_url) as engine:
            run_id = recorded(engine)
        for setting in ("two", "65"):
            monkeypatch.setenv("STAGETRAIL_VERIFY_WORKERS", setting)
            assert "STAGETRAIL_VERIFY_WORKERS" in fails(
                "verify", str(run_id), "--chain-only", "--store", sqlite_url
            )

    def test_all_lists_only_the_runs_with_problems(self, shared_url: str) -> None:
        """--all verifies every run, counts their chains and names each broken run's first
        problem."""
        with Engine(shared_url) as engine:
            sound, tampered = recorded(engine), recorded(engine)
        assert "2 runs, 16 events: no problems; chains: 2 intact" in ok(
            "verify", "--all", "--store", shared_url
        )
        Rows(shared_url).delete(tampered, 6)
        result = invoke("verify", "--all", "--store", shared_url)
        assert result.exit_code == 1
        assert "1 run(s) with problems" in result.stdout
        assert "event 6 is missing" in result.stdout
        assert str(sound)[:8] not in result.stdout
        data = json.loads(invoke("verify", "--all", "--store", shared_url, "--json").stdout)
        assert (data["runs"], data["with_problems"], data["chains"]) == (
            2, 1, {"broken": 1, "intact": 1},
        )  # fmt: skip
        (listed,) = data["problems"]
        assert (listed["run_id"], listed["first"]["version"]) == (str(tampered), 6)

    def test_a_run_and_all_together_are_refused(self, sqlite_url: str) -> None:
        """verify takes a RUN or --all, not both and not neither."""
        with Engine(sqlite_url) as engine:
            run_id = recorded(engine)
        assert "RUN or --all" in invoke("verify", "--store", sqlite_url).stderr
        both = invoke("verify", str(run_id), "--all", "--store", sqlite_url)
        assert "RUN or --all" in both.stderr

    def test_an_old_store_is_unchained_and_sound(self, tmp_path: Path) -> None:
        """The first released schema's runs verify with exit 0, reported unchained."""
        copy = tmp_path / "v1.db"
        shutil.copy(DATA / "v1_store.db", copy)
        data = as_json("verify", "--all", "--store", f"sqlite:///{copy}")
        assert data["ok"] is True
        assert set(data["chains"]) == {"unchained"}

    def test_the_chain_key_comes_from_the_environment(
        self, sqlite_url: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """STAGETRAIL_CHAIN_KEY keys the links; without it they are reported unchecked."""
        monkeypatch.setenv("STAGETRAIL_CHAIN_KEY", "secret")
        with Engine(sqlite_url) as engine:
            run_id = recorded(engine)
        assert as_json("verify", str(run_id), "--store", sqlite_url)["chain"] == "intact"
        monkeypatch.delenv("STAGETRAIL_CHAIN_KEY")
        assert as_json("verify", str(run_id), "--store", sqlite_url)["chain"] == "unchecked"
        assert "not checked" in ok("verify", str(run_id), "--store", sqlite_url)
        assert fails("verify", "nope", "--store", sqlite_url)


def long_recorded(url: str, events: int) -> UUID:
    """A run of `events` events (a few pages) in the store at `url`."""
    with Engine(url) as engine:
        run = engine.start_run(REVIEW)
        with run.batch():
            for index in range(events - 1):
                run.note("step", f"s{index}")
        return run.id


class TestWorkerTimeoutOption:
    @pytest.mark.parametrize("command", [("RUN",), ("--all",)])
    def test_a_stopped_worker_is_given_up_after_the_seconds_given(
        self,
        shared_url: str,
        monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture,
        command: tuple[str, ...],
    ) -> None:
        """--worker-timeout 1 waits one second for a worker stopped before it answers (SIGSTOP:
        alive, answering nothing), not the default 60: the worker is killed and the run is
        checked here, intact, the warning naming the seconds given."""
        from engine import verify as verify_module
        from engine.store.chain_workers import ChainWorkers

        run_id = long_recorded(shared_url, 3 * PAGE + 10)
        monkeypatch.setattr(verify_module, "PARALLEL_FROM", 1)
        monkeypatch.setattr(verify_module, "RANGE", PAGE)  # PostgreSQL: ranges from 2 pages
        waited = ChainWorkers.wait

        def stopped_first(workers: ChainWorkers, future: Future[Any]) -> bool:
            for worker in workers._started:
                if worker.pid is not None and worker.is_alive():
                    os.kill(worker.pid, signal.SIGSTOP)
            return waited(workers, future)

        monkeypatch.setattr(ChainWorkers, "wait", stopped_first)
        target = str(run_id) if command == ("RUN",) else "--all"
        with caplog.at_level(logging.WARNING, "engine.store.chain_workers"):
            result = invoke(
                "verify", target, "--chain-only", "--worker-timeout", "1", "--json",
                "--store", shared_url, env={"STAGETRAIL_VERIFY_WORKERS": "1"},
            )  # fmt: skip
        assert result.exit_code == 0, (result.stdout, result.stderr)
        data = json.loads(result.stdout)
        chain = data["chain"] if command == ("RUN",) else data["chains"]
        assert chain in ("intact", {"intact": 1})
        assert "did not answer within 1.0 s" in caplog.text

    @pytest.mark.parametrize("bad", ["0", "-2", "abc", "nan", "inf", "", "1e10"])
    def test_a_bad_number_of_seconds_is_one_error_naming_the_option(
        self, shared_url: str, bad: str
    ) -> None:
        """--worker-timeout that is not a finite number of seconds above 0 (nor one past what a
        wait can take: 1e10 crashed with OverflowError once a worker was waited for) is refused
        before the store is read: exit code 2, one error naming the option and the value."""
        run_id = long_recorded(shared_url, 3)
        for target in (str(run_id), "--all"):
            result = invoke("verify", target, "--worker-timeout", bad, "--store", shared_url)
            assert result.exit_code == 2, result.output
            assert f"--worker-timeout {bad!r}: give a number of seconds above 0" in (result.stderr)
            assert result.stdout == ""
