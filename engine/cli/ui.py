"""`stagetrail ui` and `stagetrail report`: the local viewer and the offline HTML report."""

from __future__ import annotations

import errno
import ipaddress
import socket
import sys
from typing import Any

from engine.cli.common import BadOption, Output, open_engine, print_json, resolve_run, short
from engine.cli.output_file import written_file

EXTRA_HINT = "the viewer needs the ui extra: pip install 'stagetrail[ui]'"


def _ui_module() -> Any:
    """`engine.ui`, or a clear error when its extra is not installed."""
    try:
        import engine.ui
    except ImportError as error:
        raise BadOption("ui", error.name or "", EXTRA_HINT) from None
    return engine.ui


def is_loopback(host: str) -> bool:
    """Whether `host` names this machine only (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def serve(store: str | None, host: str, port: int) -> None:
    """Serve the viewer over `store` on `host`:`port` until interrupted.

    The socket is bound and listening before "serving" is printed, so a busy port
    or an address this machine does not have is one error line and nothing else.

    Raises:
        StoreError: the store does not exist (it is never created) or cannot be opened.
        BadOption: `host`:`port` cannot be listened on (busy, not an address here).
    """
    ui = _ui_module()
    import uvicorn

    app = ui.create_app(store, allowed_hosts=allowed_hosts(host, ui.app.LOOPBACK_HOSTS))
    listening = listen(host, port)
    shown = f"[{host}]" if ":" in host else host
    out = Output()
    out.line(f"stagetrail ui: serving {app_store(app)} on http://{shown}:{port}/ (Ctrl-C stops it)")
    if not is_loopback(host):
        out.line(f"warning: {host} is not a loopback address: anyone who reaches it can read runs")
    sys.stdout.flush()
    from engine.ui.collector import IdleCollector

    collector = IdleCollector()  # the viewer process's collector policy (docs/ui.md)
    config = uvicorn.Config(collector.wrap(app), log_level="warning", access_log=False)
    with listening, collector.serving():
        uvicorn.Server(config).run(sockets=[listening])


def allowed_hosts(host: str, loopback: tuple[str, ...]) -> tuple[str, ...]:
    """The Host headers the viewer on `host` answers: any when it is not loopback, else the
    loopback names and `host` itself as a browser writes it (``[::2]``, ``127.0.0.2``)."""
    if not is_loopback(host):
        return ("*",)
    bare = host.strip("[]")
    written = f"[{bare}]" if ":" in bare else bare
    return tuple(dict.fromkeys((*loopback, written)))


def listen(host: str, port: int) -> socket.socket:
    """A TCP socket bound to `host`:`port` and listening, as uvicorn would make it.

    Raises:
        BadOption: the port is taken, or `host` is not an address of this machine.
    """
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host.strip("[]"), port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as error:
        raise BadOption("--host", host, f"not a host name or address ({error.strerror})") from None
    listening = socket.socket(family, kind, proto)
    try:
        listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listening.bind(address)
        listening.listen(2048)
    except OSError as error:
        listening.close()
        raise _not_listening(host, port, error) from None
    listening.set_inheritable(True)
    return listening


def _not_listening(host: str, port: int, error: OSError) -> BadOption:
    if error.errno == errno.EADDRINUSE:
        return BadOption(
            "--port", port, f"{host}:{port} is in use by another program; choose another --port"
        )
    if error.errno == errno.EADDRNOTAVAIL:
        return BadOption("--host", host, "is not an address of this machine")
    return BadOption("--host", f"{host}:{port}", f"cannot listen there: {error.strerror}")


def app_store(app: Any) -> str:
    """The (masked) URL of the store the app reads."""
    return str(app.state.store_url)


def report(
    store: str | None,
    run: str,
    path: str,
    *,
    as_json: bool,
    force: bool = False,
    full: bool = False,
    full_limit: int = 10_000,
) -> None:
    """Write the self-contained HTML report of `run` (an id or a prefix) to `path`.

    An existing `path` is replaced only with `force`; the store's own files never.
    With `full`, every event and state, for a run of up to `full_limit` events.
    """
    ui = _ui_module()
    with (
        written_file("--html", path, store, force=force) as temporary,
        open_engine(store) as engine,
    ):
        run_id = resolve_run(engine, run)
        written = ui.write_report(engine, run_id, temporary, full=full, limit=full_limit)
    if as_json:
        print_json(
            {
                "run_id": str(run_id),
                "file": path,
                "events": written.events,
                "embedded_versions": written.embedded,
            }
        )
        return
    out = Output()
    out.line(f"wrote the report of run {short(run_id)} to {path}: {written.events} events")
    if not written.every_version:
        out.line(
            f"it holds events {written.first_listed}-{written.events} whole and the states of"
            f" {written.embedded - (written.events - written.first_listed + 1)} evenly spaced"
            " earlier versions, as for every run this long (`stagetrail ui` shows every event)"
        )
