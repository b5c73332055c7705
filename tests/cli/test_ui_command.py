"""`stagetrail ui` as a user starts it: the host it is given, a busy port, when it says "serving".

The viewer itself (pages, API, the browser) is tested in tests/ui/; here the
command line: it listens before it says so, and what it cannot do is one line.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine import Engine
from engine.cli.ui import allowed_hosts
from tests._helpers import REVIEW

pytest.importorskip("uvicorn", reason="the viewer needs the ui extra")
from engine.ui.app import LOOPBACK_HOSTS


def _command(*args: str) -> list[str]:
    """The installed console script with `args` (the interpreter when there is none)."""
    script = Path(sys.executable).with_name("stagetrail")
    if script.exists():
        return [str(script), *args]
    return [sys.executable, "-c", "from engine.cli import main; main()", *args]


def _free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def store(tmp_path: Path) -> str:
    """A SQLite store holding one run."""
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    with Engine(url) as engine:
        engine.start_run(REVIEW)
    return url


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[str]]]:
    """The viewers a test starts, stopped after it."""
    processes: list[subprocess.Popen[str]] = []
    yield processes
    for process in processes:
        process.terminate()
        try:
            process.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()


def _serve(started: list[subprocess.Popen[str]], *args: str) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        _command("ui", *args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    started.append(process)
    return process


def _status(url: str, host: str | None = None) -> int:
    request = urllib.request.Request(url, headers={} if host is None else {"Host": host})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as error:
        return error.code


class TestServing:
    def test_it_listens_before_it_says_serving(
        self, store: str, started: list[subprocess.Popen[str]]
    ) -> None:
        """Once "serving" is printed, a connection is accepted at once: no retry, no wait."""
        port = _free_port()
        process = _serve(started, "--store", store, "--port", str(port))
        assert process.stdout is not None
        assert process.stdout.readline().startswith("stagetrail ui: serving ")
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
        assert _status(f"http://127.0.0.1:{port}/api/runs") == 200

    def test_another_loopback_address_is_answered(
        self, store: str, started: list[subprocess.Popen[str]]
    ) -> None:
        """--host 127.0.0.2 answers requests for 127.0.0.2, and still refuses another Host."""
        port = _free_port("127.0.0.2")
        process = _serve(started, "--store", store, "--host", "127.0.0.2", "--port", str(port))
        assert process.stdout is not None
        assert "http://127.0.0.2:" in process.stdout.readline()
        assert _status(f"http://127.0.0.2:{port}/api/runs") == 200
        assert _status(f"http://127.0.0.2:{port}/api/runs", host="evil.example") == 400


class TestRefused:
    def test_a_busy_port_is_one_line_and_no_serving(self, store: str) -> None:
        """A port another program listens on: exit 2, one line naming it, "serving" never said."""
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            done = subprocess.run(
                _command("ui", "--store", store, "--port", str(port)),
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
        assert done.returncode == 2
        assert done.stdout == ""
        assert done.stderr == (
            f"stagetrail: error: --port {port}: 127.0.0.1:{port} is in use by another program;"
            " choose another --port\n"
        )

    @pytest.mark.parametrize(
        ("host", "words"),
        [
            ("192.0.2.1", "--host '192.0.2.1': is not an address of this machine"),
            ("no-such-host.invalid", "--host 'no-such-host.invalid': not a host name or address"),
        ],
        ids=["not-here", "no-such-name"],
    )
    def test_an_address_it_cannot_listen_on_is_one_line(
        self, store: str, host: str, words: str
    ) -> None:
        """A host that is not this machine's: exit 2, one line naming it, nothing served."""
        done = subprocess.run(
            _command("ui", "--store", store, "--host", host, "--port", str(_free_port())),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 2
        assert done.stdout == ""
        assert done.stderr.count("\n") == 1
        assert words in done.stderr


class TestAllowedHosts:
    @pytest.mark.parametrize(
        ("host", "extra"),
        [("127.0.0.1", None), ("127.0.0.2", "127.0.0.2"), ("::1", None), ("localhost", None)],
    )
    def test_a_loopback_host_adds_itself_to_the_loopback_names(
        self, host: str, extra: str | None
    ) -> None:
        """A loopback host is answered under its own name too, and no other name is."""
        assert allowed_hosts(host, LOOPBACK_HOSTS) == (
            LOOPBACK_HOSTS if extra is None else (*LOOPBACK_HOSTS, extra)
        )

    def test_an_ipv6_loopback_is_written_in_brackets(self) -> None:
        """Browsers send an IPv6 host in brackets (``[::2]``): that is the name allowed."""
        assert allowed_hosts("::2", ()) == ("*",)  # ::2 is not loopback: any host
        assert allowed_hosts("0:0:0:0:0:0:0:1", ()) == ("[0:0:0:0:0:0:0:1]",)

    def test_a_public_host_answers_any_name(self) -> None:
        """Bound beyond loopback, the viewer answers any Host (and the command warns)."""
        assert allowed_hosts("0.0.0.0", LOOPBACK_HOSTS) == ("*",)
