"""``meshrun fleet --serve``: the fleet view as a small read-only web page.

The server is the standard library's ``http.server`` (threaded), bound to
127.0.0.1 unless ``--host`` says otherwise; it answers GET only, and only
to a request whose Host header names the address it is bound to (a page
from another site that renames itself to 127.0.0.1, DNS rebinding, gets
421), and only to a request showing the server's token (printed once, in the
URL, at start; then a cookie): other users of a shared login node can reach
127.0.0.1 too. A GET reads and writes nothing in the runs root: goodput is computed
in memory, a finished run's kept in memory. Charts are
SVG drawn by matplotlib (a meshrun dependency already, imported only here),
so the page needs no internet (no CDN, no JavaScript library); the table's
sorting and filtering is a few lines of inline JavaScript. The page shows
what ``meshrun fleet --json`` shows, never the environment or a credential.

    /                 runs table (sort: click a header; filter: the box),
                      pending jobs, totals per QOS vs preset, team GPU-hours per day
    /run/<id>         a run: loss, tokens/s and goodput-bucket charts
    /run/<id>.svg     those charts
    /team.svg         GPU-hours per day per account
    /api/fleet.json   the view as JSON
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import html
import io
import json
import secrets
import socket
import sys
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from http.cookies import CookieError, SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from launcher.views.fleetrows import FleetView, RunRow, Scheduler, collect, tail_records
from launcher.views.fleettext import step_text
from launcher.views.goodput import BUCKETS

COOKIE = "meshrun_fleet_token"

VIEW_TTL_S = 2.0  # a page load and its images share one collected view

COLUMNS = [  # (header, key, kind)
    ("Run", "run", "text"), ("Model", "model", "text"), ("Cluster", "cluster", "text"),
    ("Program", "program", "text"), ("Job", "job_id", "text"), ("State", "state", "text"),
    ("Step", "step", "num"), ("Tokens", "tokens", "num"), ("Loss", "loss", "num"),
    ("Tok/s", "tokens_per_s", "num"), ("GPU-h", "gpu_hours", "num"), ("Cost $", "cost_usd", "num"),
    ("Proj. $", "projected_usd", "num"), ("Finish P50 / P90", "finish", "text"), ("ETTR", "ettr", "num"), ("Restarts", "restarts", "num"),
    ("Faults", "faults", "num"), ("Redone", "redone", "num"),
]  # fmt: skip

SCRIPT = """
function sortBy(th){
  const t=document.getElementById('runs'), i=[...th.parentNode.children].indexOf(th);
  const asc = th.dataset.dir !== 'asc'; th.parentNode.querySelectorAll('th').forEach(h=>delete h.dataset.dir);
  th.dataset.dir = asc ? 'asc' : 'desc';
  const num = th.dataset.kind === 'num', rows=[...t.tBodies[0].rows];
  const v = r => { const c=r.cells[i].dataset.v; return num ? (c===''? -Infinity : parseFloat(c)) : c; };
  rows.sort((a,b)=>{ const x=v(a), y=v(b); return (x<y?-1:x>y?1:0)*(asc?1:-1); });
  rows.forEach(r=>t.tBodies[0].appendChild(r));
}
function filterRuns(q){
  q=q.toLowerCase();
  for (const r of document.getElementById('runs').tBodies[0].rows)
    r.style.display = r.textContent.toLowerCase().includes(q) ? '' : 'none';
}
"""

STYLE = """
body{font:14px system-ui,sans-serif;margin:1.2em;color:#222}
table{border-collapse:collapse;margin:.5em 0}
th,td{padding:3px 8px;border-bottom:1px solid #ddd;text-align:right}
th{background:#f3f3f3;cursor:pointer;user-select:none}
td:first-child,th:first-child,td.t{text-align:left}
th[data-dir=asc]::after{content:' \\25B2'} th[data-dir=desc]::after{content:' \\25BC'}
.err{color:#b00} .muted{color:#777} img{max-width:100%}
"""


def run_id(row: RunRow) -> str:
    return hashlib.sha1(row.run_dir.encode()).hexdigest()[:12]


def _fmt(key: str, v: Any) -> str:
    if v is None:
        return "-"
    if key == "ettr":
        return f"{100 * v:.1f}%"
    if key in ("gpu_hours",):
        return f"{v:.3f}"
    if key in ("cost_usd", "projected_usd"):
        return f"{v:,.2f}"
    if key == "loss":
        return f"{v:.4f}"
    if key in ("tokens", "tokens_per_s"):
        return f"{v:,.0f}"
    return str(v)


def _page(title: str, body: str) -> bytes:
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>{STYLE}</style></head>"
        f"<body>{body}<script>{SCRIPT}</script></body></html>"
    ).encode()


def index_page(view: FleetView) -> bytes:
    e = html.escape
    head = "".join(
        f"<th data-kind='{kind}' data-key='{key}' onclick='sortBy(this)'>{e(h)}</th>"
        for h, key, kind in COLUMNS
    )
    rows = []
    for r in view.runs:
        cells = []
        for _, key, kind in COLUMNS:
            v = getattr(r, key)
            text = e(_fmt(key, v))
            if key == "run":
                text = f"<a href='/run/{run_id(r)}'>{text}</a>"
            elif key == "step":
                text = e(step_text(r.step, r.steps))
            sort_v = "" if v is None else e(str(v))
            cells.append(f"<td class='{'t' if kind == 'text' else ''}' data-v='{sort_v}'>{text}</td>")
        rows.append(f"<tr data-run='{e(r.run)}'>{''.join(cells)}</tr>")
    parts = [
        f"<h1>meshrun fleet</h1><p class='muted'>{e(view.root)} &middot; {len(view.runs)} runs &middot; "
        f"updated {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(view.updated))}</p>"
    ]
    if view.scheduler_error:
        parts.append(f"<p class='err'>Slurm not read: {e(view.scheduler_error)}</p>")
    if view.budget:
        b = view.budget
        parts.append(
            f"<p id='budget'>Budget ${b['budget_usd']:,.2f}: spent ${b['spent_usd']:,.2f}, left "
            f"${b['left_usd']:,.2f}, projected at completion ${b['projected_usd']:,.2f}</p>"
        )
    parts.append("<input id='filter' placeholder='filter runs' oninput='filterRuns(this.value)'>")
    parts.append(f"<table id='runs'><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>")
    pending = [r for r in view.runs if r.state == "PENDING"]
    if pending:
        items = "".join(
            f"<tr><td class='t'>{e(r.run)}</td><td>{e(r.job_id or '-')}</td><td class='t'>{e(r.reason or '-')}</td>"
            f"<td>{e(time.strftime('%Y-%m-%d %H:%M', time.localtime(r.expected_start)) if r.expected_start else 'unknown')}</td></tr>"
            for r in pending
        )
        parts.append(
            "<h2>Pending</h2><table id='pending'><tr><th>Run</th><th>Job</th><th>Reason</th>"
            f"<th>Expected start</th></tr>{items}</table>"
        )
    q_rows = "".join(
        f"<tr><td class='t'>{e(g['qos'])}</td><td>{g['runs']}</td><td>{g['gpu_hours']:.3f}</td>"
        f"<td>{g['cost_usd']:,.2f}</td><td>{g['gpus_now']}</td><td>{g['share_gpus'] if g.get('share_gpus') else '-'}</td>"
        f"<td>{'-' if g.get('in_use_pct') is None else format(g['in_use_pct'], '.0f') + '%'}</td></tr>"
        for g in view.totals["qos"]
    )
    parts.append(
        "<h2>Per QOS (vs preset share)</h2><table id='qos'><tr><th>QOS</th><th>Runs</th><th>GPU-h</th>"
        f"<th>Cost $</th><th>GPUs now</th><th>Preset share (GPUs)</th><th>In use</th></tr>{q_rows}</table>"
    )
    if view.bad_nodes:
        items = "".join(
            f"<tr><td class='t'>{e(n['node'])}</td><td>{n['faults']}</td><td class='t'>{e(', '.join(n['causes']))}</td>"
            f"<td>{'yes' if n['excluded'] else 'no'}</td></tr>"
            for n in view.bad_nodes
        )
        parts.append(
            "<h2>Bad-node ledger</h2><table id='nodes'><tr><th>Node</th><th>Faults</th><th>Causes</th>"
            f"<th>Excluded</th></tr>{items}</table>"
        )
    parts.append("<h2>Team GPU-hours per day</h2>")
    if view.totals.get("per_day"):
        parts.append("<img id='team' src='/team.svg' alt='GPU-hours per day'>")
    else:
        parts.append(
            "<p id='team-empty' class='muted'>No GPU-hours to chart: no run under this root has used "
            "a GPU yet (local CPU runs use none; a Slurm run counts from its start).</p>"
        )
    return _page("meshrun fleet", "".join(parts))


def run_page(view: FleetView, row: RunRow) -> bytes:
    e = html.escape
    g = row.goodput or {}
    unit, b, alloc = _buckets(g)
    items = "".join(
        f"<tr><td class='t'>{k}</td><td>{b.get(k, 0.0):.1f}</td>"
        f"<td>{100 * b.get(k, 0.0) / alloc if alloc else 0:.1f}%</td></tr>"
        for k in BUCKETS
    )
    table = (
        f"<h2>Goodput ({unit})</h2><table id='buckets'><tr><th>Bucket</th><th>{unit}</th><th>Share</th></tr>"
        f"{items}<tr><td class='t'>allocated</td><td>{alloc:.1f}</td><td></td></tr></table>"
        if g
        else "<h2>Goodput</h2><p id='buckets-empty' class='muted'>No goodput yet: the run has logged no step.</p>"
    )
    body = (
        f"<p><a href='/'>&larr; fleet</a></p><h1>{e(row.run)}</h1>"
        f"<p class='muted'>{e(row.run_dir)} &middot; {e(row.model or row.program or '-')} on {e(row.cluster or '-')}"
        + (f", {e(row.program)}" if row.model and row.program else "")
        + f" &middot; job {e(', '.join(row.job_ids) or row.job_id or '-')} &middot; {e(row.state)} &middot; "
        f"step {e(step_text(row.step, row.steps))} &middot; restarts {e(_fmt('restarts', row.restarts))} &middot; "
        f"faults {row.faults} &middot; redone {e(_fmt('redone', row.redone))} &middot; "
        f"GPU-h {e(_fmt('gpu_hours', row.gpu_hours))} &middot; ETTR {e(_fmt('ettr', row.ettr))}</p>"
        f"<img id='charts' src='/run/{run_id(row)}.svg' alt='loss, tokens/s and goodput'>{table}"
    )
    return _page(row.run, body)


def _buckets(g: dict[str, Any]) -> tuple[str, dict[str, float], float]:
    """The unit and goodput buckets to show: GPU-seconds, or wall seconds
    for a run that used no GPU (a local CPU run)."""
    if g.get("allocated_gpu_s"):
        return "GPU-seconds", g.get("buckets_gpu_s", {}), float(g["allocated_gpu_s"])
    return "seconds", g.get("buckets_s", {}), float(g.get("allocated_s") or 0.0)


def _empty(ax: Any, title: str, why: str) -> None:
    """An axis with nothing to plot says so, instead of an empty 0-1 plot."""
    ax.set(title=title, xticks=[], yticks=[])
    ax.text(0.5, 0.5, why, ha="center", va="center", transform=ax.transAxes, color="#777")


def _svg(fig: Any) -> bytes:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


Records = Callable[[str], list[dict[str, Any]]]  # a run dir's step records (its charts)


def run_svg(row: RunRow, records: Records = tail_records) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    recs = records(row.run_dir)
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.4))
    # Only what the run reported: a script that prints no loss or tokens/s has no such curve (never 0s).
    losses = [(r["step"], r["loss"]) for r in recs if isinstance(r.get("loss"), (int, float))]
    tps = [(r["step"], r["tokens_per_s"]) for r in recs if isinstance(r.get("tokens_per_s"), (int, float))]
    if losses:
        axes[0].plot(*zip(*losses, strict=True), ".-", ms=2)
        axes[0].set(title="loss", xlabel="step")
    else:
        _empty(axes[0], "loss", "no loss reported" if recs else "no step logged yet")
    if tps:
        axes[1].plot(*zip(*tps, strict=True), ".-", ms=2, color="tab:green")
        axes[1].set(title="tokens/s", xlabel="step")
    else:
        _empty(axes[1], "tokens/s", "no tokens/s reported" if recs else "no step logged yet")
    unit, b, _ = _buckets(row.goodput or {})
    if any(b.values()):
        axes[2].barh(list(BUCKETS), [b.get(k, 0.0) for k in BUCKETS], color="tab:orange")
        axes[2].invert_yaxis()
        axes[2].set(title=f"goodput ({unit}), ETTR {_fmt('ettr', row.ettr)}", xlabel=unit)
    else:
        _empty(axes[2], "goodput", "no allocation time recorded yet")
    fig.tight_layout()
    return _svg(fig)


def team_svg(view: FleetView) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    days = view.totals.get("per_day", [])
    teams = sorted({k for d in days for k in d if k != "day"})
    fig, ax = plt.subplots(figsize=(7, 3))
    if not days:
        _empty(ax, "GPU-hours per day", "no GPU-hours yet")
        return _svg(fig)
    bottom = [0.0] * len(days)
    for t in teams:
        vals = [d.get(t, 0.0) for d in days]
        ax.bar([d["day"] for d in days], vals, bottom=bottom, label=t)
        bottom = [x + y for x, y in zip(bottom, vals, strict=True)]
    ax.set(title="GPU-hours per day", ylabel="GPU-hours")
    if teams:
        ax.legend()
    fig.tight_layout()
    return _svg(fig)


class _State:
    """The collected view, shared by a page load and its images, and the
    finished runs' goodput, kept in memory (a GET never writes)."""

    def __init__(
        self,
        root: Path,
        scheduler: Scheduler,
        budget_usd: float | None,
        source: Callable[[], FleetView] | None = None,
        ttl: float = VIEW_TTL_S,
    ) -> None:
        self.root, self.scheduler, self.budget_usd = root, scheduler, budget_usd
        # source: a view made elsewhere (the login node's: launcher/views/remotefleet.py), kept ttl seconds.
        self.source, self.ttl = source, ttl
        self.lock = threading.Lock()
        self.view: FleetView | None = None
        self.at = 0.0
        self.final: dict = {}

    def get(self) -> FleetView:
        with self.lock:  # one collect at a time
            if self.view is None or time.monotonic() - self.at > self.ttl:
                self.view = (
                    self.source()
                    if self.source
                    else collect(
                        self.root, self.scheduler, budget_usd=self.budget_usd, write=False, cache=self.final
                    )
                )
                self.at = time.monotonic()
            return self.view


def allowed_hosts(host: str, port: int) -> set[str]:
    """Host header values that name this server (lower case, with the
    port): the bound address and the name it was given; for a loopback
    bind, localhost; for a wildcard bind, this machine's names too."""
    names = {host}
    if host in ("127.0.0.1", "::1", "localhost"):
        names |= {"127.0.0.1", "localhost", "::1"}
    if host in ("", "0.0.0.0", "::"):
        names |= {"127.0.0.1", "localhost", "::1", socket.gethostname(), socket.getfqdn()}
    return {f"[{n}]:{port}" if ":" in n else f"{n}:{port}" for n in names if n}


def answer(view: FleetView, path: str, records: Records = tail_records) -> tuple[bytes, str, HTTPStatus]:
    """(body, content type, status) of a GET of ``path``."""
    html_type = "text/html; charset=utf-8"
    if path in ("/", "/index.html"):
        return index_page(view), html_type, HTTPStatus.OK
    if path == "/api/fleet.json":
        return json.dumps(view.to_json()).encode(), "application/json", HTTPStatus.OK
    if path == "/favicon.ico":
        return b"", "image/x-icon", HTTPStatus.NO_CONTENT
    if path == "/team.svg":
        return team_svg(view), "image/svg+xml", HTTPStatus.OK
    if path.startswith("/run/"):
        rid = path[len("/run/") :]
        row = next((r for r in view.runs if run_id(r) == rid.removesuffix(".svg")), None)
        if row is not None and rid.endswith(".svg"):
            return run_svg(row, records), "image/svg+xml", HTTPStatus.OK
        if row is not None:
            return run_page(view, row), html_type, HTTPStatus.OK
    return b"not found", "text/plain", HTTPStatus.NOT_FOUND


def token_shown(path: str, cookie_header: str | None, secret: str) -> tuple[bool, bool]:
    """(the request shows the token, it came in the URL: set the cookie).
    Constant-time: a comparison says nothing of how much of a guess matched."""
    query = parse_qs(urlsplit(path).query).get("token", [""])[-1]
    cookies: SimpleCookie = SimpleCookie()
    with contextlib.suppress(CookieError):  # a malformed Cookie header: no cookie
        cookies.load(cookie_header or "")
    cookie = cookies[COOKIE].value if COOKIE in cookies else ""
    in_url = hmac.compare_digest(query.encode(), secret.encode())
    return in_url or hmac.compare_digest(cookie.encode(), secret.encode()), in_url


def make_server(
    root: Path,
    host: str,
    port: int,
    scheduler: Scheduler,
    *,
    budget_usd: float | None = None,
    token: str | None = None,
    source: Callable[[], FleetView] | None = None,
    records: Records = tail_records,
    ttl: float = VIEW_TTL_S,
) -> ThreadingHTTPServer:
    """The page's server; ``source`` / ``records``: the view and a run's
    step records from elsewhere than ``root`` here (the login node's)."""
    state = _State(root, scheduler, budget_usd, source, ttl)
    allowed: set[str] = set()
    # Every request shows this token (the printed URL's ?token=, then a cookie
    # the first answer sets): other users of a shared login node can reach
    # 127.0.0.1 too, and the page names every run, user and cost.
    secret = token or secrets.token_urlsafe(24)

    class Handler(BaseHTTPRequestHandler):
        server_version = "meshrun-fleet"

        def log_message(self, fmt: str, *args: Any) -> None:  # quiet: one line per error only
            if args and str(args[1] if len(args) > 1 else "").startswith(("4", "5")):
                sys.stderr.write(f"meshrun fleet: {self.address_string()} {fmt % args}\n")

        def _send(self, body: bytes, ctype: str, status: HTTPStatus = HTTPStatus.OK) -> None:
            self.send_response(status)
            if getattr(self, "set_cookie", False):  # came with ?token=: the page's links and images need none
                self.send_header("Set-Cookie", f"{COOKIE}={secret}; Path=/; HttpOnly; SameSite=Strict")
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.send_header(
                "Content-Security-Policy",
                "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src 'self'",
            )
            self.end_headers()
            self.wfile.write(body)

        def _foreign_host(self) -> bool:
            """Refuse (421) a request whose Host is not this server's."""
            host = (self.headers.get("Host") or "").strip().lower()
            if host in allowed:
                return False
            body = (
                f"meshrun fleet: Host {host!r} is not this server's address; open "
                f"http://{sorted(allowed)[0]}/ (a page of another site cannot read this one)\n"
            )
            self._send(body.encode(), "text/plain; charset=utf-8", HTTPStatus.MISDIRECTED_REQUEST)
            return True

        def _refused_token(self) -> bool:
            """Refuse (403) a request that shows neither the token nor its cookie."""
            shown, self.set_cookie = token_shown(self.path, self.headers.get("Cookie"), secret)
            if shown:
                return False
            body = b"meshrun fleet: open the URL with ?token= that the server printed when it started\n"
            self._send(body, "text/plain; charset=utf-8", HTTPStatus.FORBIDDEN)
            return True

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            if self._foreign_host() or self._refused_token():
                return
            self._send(*answer(state.get(), self.path.split("?", 1)[0], records))

        def do_POST(self) -> None:  # noqa: N802
            self._send(b"read-only", "text/plain", HTTPStatus.METHOD_NOT_ALLOWED)

        do_PUT = do_DELETE = do_PATCH = do_POST  # noqa: N815

    server = ThreadingHTTPServer((host, port), Handler)
    allowed |= allowed_hosts(host.lower(), server.server_address[1])
    server.token = secret  # type: ignore[attr-defined]
    return server


def serve(
    root: Path,
    host: str,
    port: int,
    scheduler: Scheduler,
    *,
    budget_usd: float | None = None,
    source: Callable[[], FleetView] | None = None,
    records: Records = tail_records,
    ttl: float = VIEW_TTL_S,
    label: str = "",
) -> int:
    server = make_server(
        root, host, port, scheduler, budget_usd=budget_usd, source=source, records=records, ttl=ttl
    )
    h, p = server.server_address[:2]
    print(
        f"meshrun fleet: serving {label or root} on http://{h}:{p}/?token={server.token} "  # type: ignore[attr-defined]
        "(read-only; the token is asked of every request; Ctrl-C stops)",
        flush=True,
    )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        return 130
    finally:
        server.server_close()
    return 0
