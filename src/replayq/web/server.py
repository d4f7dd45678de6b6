"""The dashboard's routes: server-rendered pages, plain HTML forms, no JavaScript.

Why no htmx or build step: every page is a GET that renders from the database
and every action a POST form that redirects to its result, so the pages work
with JavaScript off and the Content-Security-Policy forbids scripts outright
(``script-src 'none'``): a payload that smuggles ``<script>`` into a job can
neither run nor load anything, on top of Jinja's escaping of every string.
Endpoints that touch the database are plain ``def`` (Starlette runs them in
its thread pool; storage connections are per thread).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import jinja2
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

import replayq
from replayq.web import timeline
from replayq.web.auth import SESSION_COOKIE, Guard

HERE = Path(__file__).parent
STATES = ("queued", "running", "succeeded", "dead", "cancelled")
CSP = (
    "default-src 'none'; script-src 'none'; style-src 'self'; img-src 'self' data:; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _when(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) if ts else "-"


def _json(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, default=str)


def _whole(value: str | None, name: str) -> int | None:
    """A positive whole number from the query string, or a 400 naming the parameter."""
    if not value:
        return None
    if not value.isdigit() or int(value) < 1:
        raise HTTPException(400, f"{name} must be a positive whole number")
    return int(value)


def _local(target: str | None) -> str:
    """A redirect target on this site only (never ``//host`` or ``https://...``)."""
    if not target or not target.startswith("/") or target.startswith("//"):
        return "/"
    return target


def make_environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,  # every user string: payloads, errors, keys, resource names
        undefined=jinja2.StrictUndefined,
    )
    env.filters["age"] = _age
    env.filters["when"] = _when
    env.filters["pretty"] = _json
    env.globals["describe"] = timeline.describe
    env.filters["resource_href"] = timeline.resource_href
    return env


class Dashboard:
    """The pages over one ``App``; ``guard`` decides who may act."""

    def __init__(self, app: replayq.App, guard: Guard) -> None:
        self.app = app
        self.guard = guard
        self.env = make_environment()

    # -- rendering --------------------------------------------------------------------------

    def page(self, request: Request, template: str, status: int = 200, **values: Any) -> Response:
        session = request.cookies.get(SESSION_COOKIE)
        signed_in = self.guard.session_valid(session)
        body = self.env.get_template(template).render(
            request_path=request.url.path,
            signed_in=signed_in,
            actions_enabled=self.guard.enabled,
            csrf=self.guard.csrf_for(session) if signed_in and session else "",
            **values,
        )
        return HTMLResponse(body, status_code=status)

    # -- pages ------------------------------------------------------------------------------

    def overview(self, request: Request) -> Response:
        now = time.time()
        rows = self.app.queue_overview()
        groups: dict[tuple[str, str, str], dict[str, Any]] = {}
        for row in rows:
            key = (row["queue"], row["job_type"], row["version"] or "-")
            group = groups.setdefault(
                key, {"queued": 0, "running": 0, "dead": 0, "oldest": None, "longest": None}
            )
            group[row["state"]] = int(row["count"])
            if row["oldest_ready"] is not None:
                group["oldest"] = now - float(row["oldest_ready"])
            if row["oldest_leased"] is not None:
                group["longest"] = now - float(row["oldest_leased"])
        totals = {s: sum(g[s] for g in groups.values()) for s in ("queued", "running", "dead")}
        return self.page(request, "overview.html", groups=sorted(groups.items()), totals=totals)

    def jobs(self, request: Request) -> Response:
        query = request.query_params
        state = query.get("state") or None
        job_type = query.get("type") or None
        version = query.get("version") or None
        limit = min(_whole(query.get("limit"), "limit") or 100, 1000)
        before = _whole(query.get("before"), "before")
        if state and state not in STATES:
            raise HTTPException(400, f"unknown state {state!r}")
        # Every filter is in the query, so a page holds `limit` matches and the count is
        # of matches; filtering a fetched page would show short pages and a wrong count.
        filters: dict[str, Any] = {
            "states": [state] if state else None,
            "job_type": job_type,
            "version": version,
        }
        found = self.app.list_jobs(**filters, limit=limit, before=before)
        # A short first page holds every match: no second scan to count them.
        short = before is None and len(found) < limit
        matched = len(found) if short else self.app.count_jobs(**filters)
        older = None
        if len(found) == limit:
            params = {k: v for k, v in query.items() if k != "before" and v}
            older = "/jobs?" + urlencode({**params, "before": found[-1].id})
        return self.page(
            request,
            "jobs.html",
            jobs=found,
            matched=matched,
            paged=before is not None,
            older=older,
            states=STATES,
            state=state or "",
            job_type=job_type or "",
            version=version or "",
            job_types=self.app.job_types(),
        )

    def job(self, request: Request) -> Response:
        job_id = int(request.path_params["job_id"])
        job = self._job(job_id)
        events = self.app.trace(job_id)
        versions = sorted(
            {h.contract.version for h in self.app.handlers() if h.contract.name == job.job_type}
        )
        steps = list(
            dict.fromkeys(str(e.data.get("step_name")) for e in events if e.name == "step.started")
        )
        # A job's result is stored as returned (docs/secrets.md); reading the dashboard
        # needs no sign-in, so its secrets are shown as markers, by the type's rules.
        result = self.app.runtime.redactor_for(job.job_type).value(job.result)
        return self.page(
            request,
            "job.html",
            job=job,
            result=result,
            events=events,
            picture=timeline.job_picture(events),
            versions=versions,
            steps=steps,
            resources=sorted({e.resource for e in events if e.resource}),
            in_doubt=self._in_doubt(job_id),
        )

    def resource(self, request: Request) -> Response:
        # Named as the trace stores it (redacted by the app's rules): a card number typed
        # into the address finds its timeline, and the page does not show it back.
        asked = request.path_params["resource"]
        resource = self.app.runtime.redactor.resource(asked)
        events = self.app.resource_trace(asked, leases=True)
        ordered = sorted(events, key=lambda e: (e.hlc, e.id or 0))
        return self.page(
            request,
            "resource.html",
            resource=resource,
            events=ordered,
            picture=timeline.resource_picture(ordered),
        )

    def dead(self, request: Request) -> Response:
        found = self.app.list_jobs(states=["dead"], limit=200)
        return self.page(request, "dead.html", jobs=found)

    def diff(self, request: Request) -> Response:
        a, b = request.query_params.get("a", ""), request.query_params.get("b", "")
        if not a or not b:
            raise HTTPException(400, "diff needs ?a=JOB_OR_TRACE&b=JOB_OR_TRACE")
        try:
            result = replayq.diff_traces(self.app, a, b)
        except replayq.ReplayqError as exc:
            raise HTTPException(404, str(exc)) from exc
        return self.page(request, "diff.html", diff=result, a=a, b=b)

    def rollout(self, request: Request) -> Response:
        """Per job type: the routing, both versions' gates side by side, the shadow and
        dual-run comparisons, the stored verify reports and the routing history."""
        panels: list[dict[str, Any]] = []
        for job_type in self.app.job_types():
            control = self.app.rollout(job_type)
            routing = control.routing()
            runs = control.verify_runs(limit=10)
            if routing is None and not runs:
                panels.append({"job_type": job_type, "routing": None, "runs": []})
                continue
            gates = None
            if routing is not None and routing.candidate is not None:
                gates = control.gates()
            panels.append(
                {
                    "job_type": job_type,
                    "routing": routing,
                    "shares": (
                        [(v, routing.share_of(v)) for v in routing.versions()] if routing else []
                    ),
                    "gates": gates,
                    "figures": (
                        [
                            (name, gates.baseline.to_dict()[name], gates.candidate.to_dict()[name])
                            for name in replayq.GateReport.FIGURES
                        ]
                        if gates
                        else []
                    ),
                    "comparisons": control.comparison_summary(),
                    "runs": runs,
                    "history": control.history()[-10:],
                }
            )
        return self.page(
            request, "rollout.html", panels=panels, classes=replayq.VerifyReport.CLASSES
        )

    # -- signing in -------------------------------------------------------------------------

    def login_form(self, request: Request) -> Response:
        return self.page(
            request, "login.html", error="", next=_local(request.query_params.get("next"))
        )

    async def login(self, request: Request) -> Response:
        form = await request.form()
        offered = str(form.get("token") or "")
        if not self.guard.token_matches(offered):
            return self.page(request, "login.html", status=403, error="wrong token", next="/")
        response = RedirectResponse(_local(str(form.get("next") or "/")), status_code=303)
        response.set_cookie(
            SESSION_COOKIE, self.guard.start_session(), httponly=True, samesite="strict"
        )
        return response

    async def logout(self, request: Request) -> Response:
        self.guard.end_session(request.cookies.get(SESSION_COOKIE))
        response = RedirectResponse("/", status_code=303)
        response.delete_cookie(SESSION_COOKIE)
        return response

    # -- actions ----------------------------------------------------------------------------

    async def act(self, request: Request) -> Response:
        form = await request.form()
        bearer = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
        if not self.guard.may_act(
            bearer=bearer or None,
            session=request.cookies.get(SESSION_COOKIE),
            csrf=str(form.get("csrf") or "") or None,
        ):
            why = (
                "actions are disabled: set REPLAYQ_WEB_TOKEN"
                if not self.guard.enabled
                else "sign in with the token first (and post from the dashboard's own forms)"
            )
            return self.page(request, "refused.html", status=403, why=why)
        job_id = int(request.path_params["job_id"])
        action = request.path_params["action"]
        fields = {k: str(v) for k, v in form.items()}
        handlers: dict[str, Callable[[Request, int, dict[str, str]], Response]] = {
            "dry-run": self._dry_run,
            "fork": self._fork,
            "requeue": self._requeue,
            "cancel": self._cancel,
            "resolve": self._resolve,
        }
        if action not in handlers:
            raise HTTPException(404, f"no action {action!r}")
        return await run_in_threadpool(self._refusing, handlers[action], request, job_id, fields)

    def _refusing(
        self,
        action: Callable[[Request, int, dict[str, str]], Response],
        request: Request,
        job_id: int,
        form: dict[str, str],
    ) -> Response:
        """``action`` on job ``job_id``, what replayq refuses shown as the reason it gave.

        Before, an unknown step or version, a job with no attempt to replay, a job type
        this dashboard has no handler for, or a job gone meanwhile ended in a bare 500
        ``Internal Server Error`` (sent outside every header this dashboard sets).
        """
        self._job(job_id)  # 404 when it does not exist
        try:
            return action(request, job_id, form)
        except replayq.StorageError as exc:
            raise HTTPException(503, f"the database refused: {exc}") from exc
        except replayq.ReplayqError as exc:
            raise HTTPException(409, f"job {job_id}: {exc}") from exc

    def _dry_run(self, request: Request, job_id: int, form: dict[str, str]) -> Response:
        report = replayq.dry_run(self.app, job_id, version=form.get("version") or None)
        job = self._job(job_id)
        # The recorded outcome holds the job's result as stored, the new one what the
        # handler returned now: both shown with their secrets as markers, as the job page.
        redact = self.app.runtime.redactor_for(job.job_type).value
        divergence = report.first_divergence
        shown = {
            "recorded": redact(_plain(report.outcome_recorded)),
            "now": redact(_plain(report.outcome_now)),
            "diverged_recorded": redact(divergence.recorded) if divergence else None,
            "diverged_now": redact(divergence.now) if divergence else None,
        }
        return self.page(request, "report.html", job=job, report=report, shown=shown)

    def _fork(self, request: Request, job_id: int, form: dict[str, str]) -> Response:
        from_step = form.get("from_step") or ""
        if not from_step:
            raise HTTPException(400, "a fork needs the step to branch before")
        report = replayq.fork(
            self.app,
            job_id,
            from_step=from_step,
            version=form.get("version") or None,
            stubs=_stubs(form.get("stubs") or ""),
        )
        return RedirectResponse(f"/diff?a={job_id}&b={report.trace_id}", status_code=303)

    def _requeue(self, request: Request, job_id: int, form: dict[str, str]) -> Response:
        reason = form.get("reason") or "requeued from the dashboard"
        if not self.app.requeue(job_id, reason=reason):
            raise HTTPException(409, f"job {job_id} is not dead")
        return RedirectResponse(f"/jobs/{job_id}", status_code=303)

    def _cancel(self, request: Request, job_id: int, form: dict[str, str]) -> Response:
        if not self.app.cancel(job_id):
            raise HTTPException(409, f"job {job_id} is not queued")
        return RedirectResponse(f"/jobs/{job_id}", status_code=303)

    def _resolve(self, request: Request, job_id: int, form: dict[str, str]) -> Response:
        """Settle one of this job's in-doubt effects: it happened (with its result) or not."""
        key = form.get("key", "")
        if key not in {e.key for e in self._in_doubt(job_id)}:
            raise HTTPException(409, f"job {job_id} has no effect in doubt under {key!r}")
        reason = form.get("reason", "").strip()
        if not reason:
            raise HTTPException(400, "resolving an effect needs a reason")
        happened = form.get("outcome") == "happened"
        result: Any = None
        raw = form.get("result", "").strip()
        if happened and raw:
            try:
                result = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise HTTPException(400, f"result is not JSON: {exc}") from exc
        self.app.resolve_effect(key, succeeded=happened, result=result, reason=reason, by="web")
        return RedirectResponse(f"/jobs/{job_id}", status_code=303)

    def _in_doubt(self, job_id: int) -> list[replayq.EffectRecord]:
        return [e for e in self.app.effects_in_doubt() if e.job_id == job_id]

    def _job(self, job_id: int) -> replayq.Job:
        try:
            return self.app.get_job(job_id)
        except replayq.ReplayqError as exc:
            raise HTTPException(404, str(exc)) from exc


def _plain(value: Any) -> Any:
    """A dataclass (a report's ``Outcome``) as the JSON object the redactor reads."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return value


def _stubs(text: str) -> dict[str, Any]:
    """``name=JSON`` per line: what an effect or call the recording lacks returns in a fork."""
    stubs: dict[str, Any] = {}
    for line in text.splitlines():
        name, sep, raw = line.strip().partition("=")
        if not line.strip():
            continue
        if not sep or not name:
            raise HTTPException(400, f"stub {line.strip()!r}: use name=JSON")
        try:
            stubs[name.strip()] = json.loads(raw)
        except json.JSONDecodeError:
            stubs[name.strip()] = raw
    return stubs


def create_app(app: replayq.App, *, token: str | None = None) -> Starlette:
    """The dashboard over ``app``; actions need ``token`` (none: read-only)."""
    dashboard = Dashboard(app, Guard(token))

    async def on_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        return dashboard.page(request, "refused.html", status=exc.status_code, why=str(exc.detail))

    web = _Starlette(
        routes=[
            Route("/", dashboard.overview),
            Route("/jobs", dashboard.jobs),
            Route("/jobs/{job_id:int}", dashboard.job),
            Route("/jobs/{job_id:int}/{action}", dashboard.act, methods=["POST"]),
            Route("/resources/{resource:path}", dashboard.resource),
            Route("/dead", dashboard.dead),
            Route("/diff", dashboard.diff),
            Route("/rollout", dashboard.rollout),
            Route("/login", dashboard.login_form, methods=["GET"]),
            Route("/login", dashboard.login, methods=["POST"]),
            Route("/logout", dashboard.logout, methods=["POST"]),
            Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
        ],
        exception_handlers={HTTPException: on_error},
    )
    return web


class _Starlette(Starlette):
    """Starlette with the security headers outermost: ``add_middleware`` puts them inside
    Starlette's error middleware, so an unexpected error's 500 went out without them."""

    def build_middleware_stack(self) -> Any:
        return _HeadersMiddleware(super().build_middleware_stack())


class _HeadersMiddleware:
    """Adds the security headers (CSP without scripts, nosniff, no referrer) to every response."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Any) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers += [
                    (b"content-security-policy", CSP.encode()),
                    (b"x-content-type-options", b"nosniff"),
                    (b"referrer-policy", b"no-referrer"),
                ]
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, send_with_headers)
