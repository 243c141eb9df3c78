"""``meshrun fleet --serve`` in a real headless browser (Debian's chromium,
driven by Playwright): the page of a real finished sweep on the local Slurm
test cluster shows every run, sorts by cost, filters and opens a run's charts.

MESHRUN_FLEET_SCREENSHOT=PATH also saves the page's screenshot there
(docs/figures/fleet.png was made so)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from testcluster_util import require_test_cluster

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"  # scripts/setup.sh --test-cluster installs Debian's chromium
pytestmark = pytest.mark.slurm


def test_fleet_page_shows_a_sweep_sorts_by_cost_and_opens_charts(tmp_path: Path) -> None:
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install -e .[test] (playwright)")
    if not os.path.exists(CHROMIUM):
        pytest.skip("no /usr/bin/chromium: bash scripts/setup.sh --test-cluster installs it")
    env = {**os.environ, "SLURM_CONF": require_test_cluster()}
    runs = tmp_path / "runs"
    out = subprocess.run(
        [sys.executable, "-m", "launcher", "-m", "cluster=testcluster", "model=tiny", "launcher.exclusive=false",
         "qos.time_limit_min=10", "cluster.nodes=1", "cluster.gpus_per_node=2", "train.log_every_steps=1",
         "cluster.price_on_demand_usd_per_node_hour=98.32", "train.steps=4,8,16", f"hydra.sweep.dir={runs / 'sweep'}"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    points = json.loads((runs / "sweep" / "manifest.json").read_text())["points"]
    ids = [p["job_id"] for p in points]
    assert len(ids) == 3, points
    sys.path.insert(0, str(ROOT))
    from launcher.slurm.cluster import jobs

    os.environ["SLURM_CONF"] = env["SLURM_CONF"]
    deadline = time.monotonic() + 300
    while True:
        recs = jobs(ids)  # one answer per check: sacct may not list a just-submitted job yet
        if len(recs) == 3 and all(r.state == "COMPLETED" for r in recs.values()):
            break
        assert time.monotonic() < deadline, recs
        assert not any(r.state in ("FAILED", "CANCELLED", "TIMEOUT") for r in recs.values()), recs
        time.sleep(3)
    server = subprocess.Popen(
        [sys.executable, "-m", "launcher.cli", "fleet", str(runs), "--serve", "--port", "0", "--budget-usd", "50"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
    )  # fmt: skip
    try:
        line = server.stdout.readline()  # type: ignore[union-attr]
        m = re.search(r"on (http://127\.0\.0\.1:\d+/)\?token=(\S+)", line)
        assert m, line + server.stderr.read()  # type: ignore[union-attr]
        url, token = m.group(1), m.group(2)
        assert subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", url + "api/fleet.json"],
                              capture_output=True, text=True, timeout=60).stdout == "403"  # fmt: skip
        api = json.loads(subprocess.run(["curl", "-s", f"{url}api/fleet.json?token={token}"], capture_output=True,
                                        text=True, timeout=60, check=True).stdout)  # fmt: skip
        costs = {r["run"]: r["cost_usd"] for r in api["runs"]}
        assert len(costs) == 3 and all(c > 0 for c in costs.values()), costs
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.goto(f"{url}?token={token}")  # then the cookie it sets carries the page's links
            names = page.locator("#runs tbody tr").evaluate_all("rs => rs.map(r => r.dataset.run)")
            assert sorted(names) == sorted(costs), (names, costs)
            # Each point named by its swept value.
            assert all(f"sweep/train.steps={n}" in names for n in (4, 8, 16)), names
            assert page.locator("#budget").inner_text().startswith("Budget $50.00: spent $")
            # Sort by cost: first click ascending, second descending.
            header = page.locator("#runs th[data-key=cost_usd]")
            header.click()
            header.click()
            shown = page.locator("#runs tbody tr").evaluate_all("rs => rs.map(r => r.dataset.run)")
            assert shown == sorted(costs, key=lambda k: -costs[k]), (shown, costs)
            # The filter hides every run but the one typed.
            page.fill("#filter", shown[-1])
            visible = page.locator("#runs tbody tr:visible").evaluate_all("rs => rs.map(r => r.dataset.run)")
            assert visible == [shown[-1]], visible
            page.fill("#filter", "")
            team = page.locator("#team")
            assert team.evaluate("img => img.complete && img.naturalWidth > 0")
            if os.environ.get("MESHRUN_FLEET_SCREENSHOT"):
                page.screenshot(path=os.environ["MESHRUN_FLEET_SCREENSHOT"], full_page=True)
            # A run's charts: loss, tokens/s and goodput buckets.
            page.locator("#runs tbody tr").first.locator("a").click()
            page.wait_for_selector("#charts")
            charts = page.locator("#charts")
            charts.wait_for()
            # (the page's CSP forbids eval: poll from here, not with wait_for_function)
            deadline = time.monotonic() + 60
            while not charts.evaluate("img => img.complete && img.naturalWidth > 0"):
                assert time.monotonic() < deadline, "the run's charts did not load"
                time.sleep(0.2)
            buckets = page.locator("#buckets tr").all_inner_texts()
            assert any(b.startswith("productive") for b in buckets), buckets
            assert shown[0] in page.locator("h1").inner_text()
            browser.close()
    finally:
        server.terminate()
        server.wait(timeout=30)
