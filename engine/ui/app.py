"""The viewer's ASGI application (Starlette): pages and a read-only JSON API.

Routes:
    ``/`` the runs (filters ``status``, ``pipeline``, ``label``; ``page``);
    ``/runs/{id}`` a run's page (``page`` of its events, the slider ``at`` a version);
    ``/api/runs`` the runs as JSON; ``/api/runs/{id}`` one run's summary;
    ``/api/runs/{id}/state?at=N`` the slider's view after event N;
    ``/api/runs/{id}/events?after=N&limit=M`` a page of events;
    ``/api/runs/{id}/timeline?at=N`` the timeline of the events around version N.

Every route only reads: the store is opened with ``create=False`` (a missing one
is refused), no route appends an event, and only GET is served. Each request is
served in a worker thread, side by side with the others, and every answer is
bounded whatever the run's length: a page draws the window of `pages.WINDOW`
events around its slider and lists one page of events.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any
from urllib.parse import urlencode
from uuid import UUID

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from engine import run_ids
from engine.engine import Engine
from engine.errors import InvalidArgument, RunErased, RunNotFound
from engine.sharded import open_engine
from engine.ui import pages, snapshot
from engine.ui.diagram import warm_up
from events import RUN_STATUSES, StagetrailError, encode
from projections import PAUSED_STATUSES, RUNNING

RUNS_PER_PAGE = 50
"""Runs listed per page of the runs page."""

MAX_EVENTS = 1000
"""The most events one answer of the events API holds."""

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]", "::1")
"""Host names a loopback-bound viewer answers to (a guard against DNS rebinding)."""

HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:;"
        " connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
"""Sent with every page and API answer: no inline script may run, nothing leaves the origin."""


class Viewer:
    """The engine behind the routes, shared by the worker threads that serve them.

    Requests are served side by side, each in a worker thread (off the event loop);
    the engine's store, snapshots and run index take their own locks. The state
    answers (folds from the nearest snapshot, in Python) go one at a time: Python
    runs one thread at a time, so two of them side by side finish no sooner, and
    the other answers (the runs, a run's summary, its events, its page, a
    timeline's window, none of which folds the run) wait for no more than one of
    them. The timeline's windows drawn lately are kept (`windows`).
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.windows = pages.WindowCache()
        self._folding = threading.Semaphore(1)

    def __call__(self, work: Callable[[Engine], Any], *, folds: bool = False) -> Any:
        """Run `work` with the engine (after the folding work before it, if it `folds`)."""
        if not folds:
            return work(self.engine)
        with self._folding:
            return work(self.engine)


def create_app(
    url: str | None = None, *, allowed_hosts: tuple[str, ...] = LOOPBACK_HOSTS
) -> Starlette:
    """The viewer over the store `url` (default store if None).

    Args:
        allowed_hosts: the Host headers answered (``("*",)`` for any).

    Raises:
        StoreError: the store does not exist or cannot be opened (never created).
    """
    viewer = Viewer(open_engine(url, read_only=True))  # a shards: URL reads every shard

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await run_in_threadpool(warm_up)
        yield
        viewer.engine.close()

    routes = [
        Route("/", _endpoint(viewer, _runs_page)),
        Route("/runs/{run_id}", _endpoint(viewer, _run_page)),
        Route("/api/runs", _endpoint(viewer, _api_runs)),
        Route("/api/runs/{run_id}", _endpoint(viewer, _api_run)),
        Route("/api/runs/{run_id}/state", _endpoint(viewer, _api_state, folds=True)),
        Route("/api/runs/{run_id}/events", _endpoint(viewer, _api_events)),
        Route("/api/runs/{run_id}/timeline", _endpoint(viewer, _api_timeline)),
        Mount("/static", StaticFiles(packages=[("engine.ui", "static")]), name="static"),
    ]
    middleware = [Middleware(TrustedHostMiddleware, allowed_hosts=list(allowed_hosts))]
    app = Starlette(routes=routes, middleware=middleware, lifespan=lifespan)
    app.state.store_url = viewer.engine.url
    app.state.windows = viewer.windows
    return app


Handler = Callable[[Engine, Request], Response]


def _endpoint(
    viewer: Viewer, handler: Handler, *, folds: bool = False
) -> Callable[[Request], Response]:
    """A sync endpoint (Starlette runs it in a worker thread) turning errors into answers."""

    def endpoint(request: Request) -> Response:
        try:
            response: Response = viewer(lambda engine: handler(engine, request), folds=folds)
        except RunNotFound as error:
            response = _problem(request, 404, str(error))
        except RunErased as error:  # a run being erased (a stale view of an erased one)
            response = _problem(request, 410, str(error))
        except (StagetrailError, ValueError) as error:
            response = _problem(request, 400, str(error))
        response.headers.update(HEADERS)
        return response

    return endpoint


def _problem(request: Request, status: int, message: str) -> Response:
    if request.url.path.startswith("/api/"):
        return JSONResponse({"error": message}, status_code=status)
    html = pages.render("error.html", message=message, status=status, home="/")
    return HTMLResponse(html, status_code=status)


def _run_id(engine: Engine, request: Request) -> UUID:
    """The run the path names: a full id or a unique prefix, as every CLI command takes."""
    text = request.path_params["run_id"]
    if not _RUN_ID.fullmatch(text):
        shown = text if len(text) <= 40 else text[:40] + "…"
        raise InvalidArgument("run_id", f"{shown!r} is not a run id (a UUID or a prefix of one)")
    return run_ids.resolve_run(engine, text)


_RUN_ID = re.compile(r"[0-9a-fA-F-]{1,36}")
_INTEGER = re.compile(r"-?[0-9]{1,20}")

MAX_PAGE = 1_000_000
"""The highest page number asked for (a bound for the database's integers)."""


def _int(request: Request, name: str, default: int, minimum: int, maximum: int) -> int:
    """The integer query parameter `name`, from `minimum` to `maximum`, else one clear error."""
    text = request.query_params.get(name, "").strip()
    if text == "":
        return default
    if not _INTEGER.fullmatch(text) or not minimum <= int(text) <= maximum:
        shown = text if len(text) <= 40 else text[:40] + "…"
        raise InvalidArgument(
            name, f"must be an integer from {minimum} to {maximum}, got {shown!r}"
        )
    return int(text)


def _filters(request: Request) -> dict[str, str]:
    return {
        key: request.query_params.get(key, "").strip() for key in ("status", "pipeline", "label")
    }


def _matching(engine: Engine, filters: Mapping[str, str], page: int) -> tuple[list[Any], bool]:
    """The runs of `page` (newest first), and whether older ones follow."""
    found = engine.runs(
        status=filters["status"] or None,
        pipeline=filters["pipeline"] or None,
        label=filters["label"] or None,
        limit=RUNS_PER_PAGE + 1,
        offset=(page - 1) * RUNS_PER_PAGE,  # the earlier pages are never read
    )
    return found[:RUNS_PER_PAGE], len(found) > RUNS_PER_PAGE


def _runs_page(engine: Engine, request: Request) -> Response:
    filters = _filters(request)
    page = _int(request, "page", 1, 1, MAX_PAGE)
    error, runs, more = "", list[Any](), False
    try:
        runs, more = _matching(engine, filters, page)
    except InvalidArgument as problem:
        error = str(problem)

    def query(number: int) -> str:
        return urlencode({**{k: v for k, v in filters.items() if v}, "page": number})

    html = pages.render(
        "runs.html",
        store=engine.url,
        runs=runs,
        page=page,
        more=more,
        query=query,
        statuses=[RUNNING, *sorted(PAUSED_STATUSES), *sorted(RUN_STATUSES)],
        pipelines=sorted({run.pipeline for run in runs}),
        error=error,
        home="/",
        **filters,
    )
    return HTMLResponse(html, status_code=400 if error else 200)


def _run_page(engine: Engine, request: Request) -> Response:
    run_id = _run_id(engine, request)
    if request.path_params["run_id"] != str(run_id):  # a prefix: the page's own address
        query = f"?{request.url.query}" if request.url.query else ""
        return RedirectResponse(f"/runs/{run_id}{query}", status_code=302)
    data = pages.read_run(engine, run_id)
    last = data.last_version
    at = _int(request, "at", last, 1, last)
    page = min(_int(request, "page", pages.page_of(at), 1, MAX_PAGE), pages.page_of(last))
    window = _window(engine, request, data, at)
    html = pages.run_page(
        data,
        window,
        start=at,
        listed=pages.read_page(engine, run_id, page),
        page=page,
        api=f"/api/runs/{run_id}",
    )
    return HTMLResponse(html)


def _api_runs(engine: Engine, request: Request) -> Response:
    page = _int(request, "page", 1, 1, MAX_PAGE)
    runs, more = _matching(engine, _filters(request), page)
    return JSONResponse({"runs": [run.to_json() for run in runs], "page": page, "more": more})


def _api_run(engine: Engine, request: Request) -> Response:
    run_id = _run_id(engine, request)
    last = _last_version(engine, run_id)
    summary = pages.run_summary(engine, run_id)
    shown = None if summary is None else summary.to_json()
    return JSONResponse({"run_id": str(run_id), "last_version": last, "summary": shown})


def _api_state(engine: Engine, request: Request) -> Response:
    run_id = _run_id(engine, request)
    last = _last_version(engine, run_id)
    version = _int(request, "at", last, 1, last)
    return JSONResponse(
        {"run_id": str(run_id), **snapshot.at_version(engine, run_id, version, last)}
    )


def _api_events(engine: Engine, request: Request) -> Response:
    run_id = _run_id(engine, request)
    last = _last_version(engine, run_id)
    after = _int(request, "after", 0, 0, last)
    limit = _int(request, "limit", pages.EVENTS_PER_PAGE, 1, MAX_EVENTS)
    events = engine.store.read(run_id, gt=after, limit=limit)
    rows = []
    for event in events:
        _, state = encode(event)
        state.pop("class_version", None)
        rows.append({"version": event.version, "event": type(event).__name__, **state})
    following = events[-1].version if events and events[-1].version < last else None
    return JSONResponse(
        {"run_id": str(run_id), "last_version": last, "events": rows, "next_after": following}
    )


def _api_timeline(engine: Engine, request: Request) -> Response:
    run_id = _run_id(engine, request)
    data = pages.read_run(engine, run_id, with_summary=False)
    at = _int(request, "at", data.last_version, 1, data.last_version)
    window = _window(engine, request, data, at)
    return JSONResponse({"run_id": str(run_id), **window.to_json()})


def _window(engine: Engine, request: Request, data: pages.RunData, at: int) -> pages.Window:
    """The timeline's window around `at`, from the viewer's `WindowCache`."""
    cache: pages.WindowCache = request.app.state.windows
    return cache.window(engine, data, *pages.window_span(at, data.last_version))


def _last_version(engine: Engine, run_id: UUID) -> int:
    last = engine.store.last(run_id)
    if last is None:
        raise RunNotFound(run_id, engine.url)
    return last.version
