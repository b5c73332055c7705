"""`stagetrail ui` and `stagetrail report`: the local viewer and the offline HTML report."""

from __future__ import annotations

import ipaddress
import sys
from typing import Any

from engine.cli.common import BadOption, Output, open_engine, print_json, resolve_run, short

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

    Raises:
        StoreError: the store does not exist (it is never created) or cannot be opened.
    """
    ui = _ui_module()
    import uvicorn

    allowed = ("*",) if not is_loopback(host) else (*ui.app.LOOPBACK_HOSTS,)
    app = ui.create_app(store, allowed_hosts=allowed)
    shown = f"[{host}]" if ":" in host else host
    out = Output()
    out.line(f"stagetrail ui: serving {app_store(app)} on http://{shown}:{port}/ (Ctrl-C stops it)")
    if not is_loopback(host):
        out.line(f"warning: {host} is not a loopback address: anyone who reaches it can read runs")
    sys.stdout.flush()
    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False)


def app_store(app: Any) -> str:
    """The (masked) URL of the store the app reads."""
    return str(app.state.store_url)


def report(store: str | None, run: str, path: str, *, as_json: bool) -> None:
    """Write the self-contained HTML report of `run` (an id or a prefix) to `path`."""
    ui = _ui_module()
    with open_engine(store) as engine:
        run_id = resolve_run(engine, run)
        written = ui.write_report(engine, run_id, path)
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
