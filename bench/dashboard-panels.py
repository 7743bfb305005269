"""The Grafana dashboard's panels over a bench run, drawn from Prometheus.

No Grafana installs here (not in Debian; PyPI's `grafana` is a placeholder), so
this runs the dashboard's own queries (deploy/grafana/settled.json) against a
real Prometheus that scraped settled during the run, and draws each panel as a
small chart on one page, laid out as the dashboard lays them out; Chromium
takes the screenshot.

    python3 bench/dashboard-panels.py target/release/settled target/release/settled-bench \
        docs/images/dashboard-panels.png

Needs Debian's `prometheus` and `chromium`.
"""

from __future__ import annotations

import html
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SETTLED_PORT, PROM_PORT = 18480, 19490
COLORS = ["#3b82f6", "#ef4444", "#10b981", "#f59e0b", "#8b5cf6", "#14b8a6", "#ec4899", "#64748b"]


def get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as answer:
        return json.load(answer)


def wait_up(url: str) -> None:
    for _ in range(200):
        try:
            urllib.request.urlopen(url, timeout=2).read()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"{url} did not answer")


def query_range(expr: str, start: float, end: float, step: float) -> list[dict]:
    params = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": step})
    answer = get(f"http://127.0.0.1:{PROM_PORT}/api/v1/query_range?{params}")
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


def legend(template: str, labels: dict) -> str:
    out = template
    for key, value in labels.items():
        out = out.replace("{{" + key + "}}", value or '""')
    return out


def chart(panel: dict, series: list[tuple[str, list[tuple[float, float]]]], start: float, end: float) -> str:
    # As wide as the panel's share of Grafana's 24 columns.
    w, h, pad = int(1740 * panel["gridPos"]["w"] / 24) - 26, 190, 50
    values = [v for _, points in series for _, v in points if v == v]
    top = max(values, default=1.0) or 1.0
    svg = [f'<svg width="{w}" height="{h}" xmlns="http://www.w3.org/2000/svg">']
    svg.append(f'<rect x="{pad}" y="6" width="{w - pad - 6}" height="{h - pad - 6}" fill="#111827"/>')
    for i in range(5):
        y = 6 + (h - pad - 6) * i / 4
        svg.append(f'<line x1="{pad}" x2="{w - 6}" y1="{y:.1f}" y2="{y:.1f}" stroke="#374151"/>')
        label = top * (4 - i) / 4
        svg.append(f'<text x="{pad - 4}" y="{y + 4:.1f}" fill="#9ca3af" font-size="10" text-anchor="end">{label:.3g}</text>')
    for n, (name, points) in enumerate(series[:8]):
        coords = [
            (pad + (w - pad - 6) * (t - start) / max(end - start, 1), 6 + (h - pad - 6) * (1 - v / top))
            for t, v in points
            if v == v
        ]
        if coords:
            path = " ".join(f"{x:.1f},{y:.1f}" for x, y in coords)
            svg.append(f'<polyline points="{path}" fill="none" stroke="{COLORS[n % 8]}" stroke-width="1.6"/>')
    svg.append("</svg>")
    keys = "".join(
        f'<span style="color:{COLORS[n % 8]}">&#9632; {html.escape(name)}</span> ' for n, (name, _) in enumerate(series[:8])
    )
    unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "")
    return (
        f'<div class="panel" style="width:{w}px"><div class="title">{html.escape(panel["title"])}'
        f'<span class="unit">{html.escape(unit)}</span></div>{"".join(svg)}<div class="keys">{keys}</div></div>'
    )


def main() -> int:
    settled, bench, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    dashboard = json.loads((ROOT / "deploy/grafana/settled.json").read_text())
    with tempfile.TemporaryDirectory() as tmp:
        server = subprocess.Popen(
            [settled, "--listen", f"127.0.0.1:{SETTLED_PORT}", "--database-url", f"sqlite:{tmp}/s.db"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "RUST_LOG": "warn"},
        )
        config = Path(tmp) / "prometheus.yml"
        config.write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            f"rule_files: ['{ROOT}/deploy/prometheus/settled-rules.yml']\n"
            f"scrape_configs: [{{job_name: settled, static_configs: [{{targets: ['127.0.0.1:{SETTLED_PORT}']}}]}}]\n"
        )
        prom = subprocess.Popen(
            ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={tmp}/tsdb",
             f"--web.listen-address=127.0.0.1:{PROM_PORT}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        try:
            wait_up(f"http://127.0.0.1:{SETTLED_PORT}/healthz")
            wait_up(f"http://127.0.0.1:{PROM_PORT}/-/ready")
            start = time.time()
            # Bursts of the batched cycle with retries and dead letters, a pause between.
            for _ in range(6):
                subprocess.run(
                    [bench, "--url", f"http://127.0.0.1:{SETTLED_PORT}", "--receipts", "20000", "--workers", "8",
                     "--batch", "256", "--no-inprocess", "--mix", "accepted=85,retryable=10,permanent=5"],
                    check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                )
                time.sleep(4)
            time.sleep(3)
            end = time.time()
            panels = []
            for panel in dashboard["panels"]:
                if panel["type"] == "row":
                    panels.append(f'<div class="row">{html.escape(panel["title"])}</div>')
                    continue
                series = []
                for target in panel["targets"]:
                    expr = target["expr"].replace("$__rate_interval", "15s").replace("$group", ".*")
                    for result in query_range(expr, start, end, 1):
                        points = [(float(t), float(v)) for t, v in result["values"]]
                        series.append((legend(target["legendFormat"], result["metric"]), points))
                panels.append(chart(panel, series, start, end))
        finally:
            for proc in (prom, server):
                proc.terminate()
                proc.wait()
        page = Path(tmp) / "panels.html"
        page.write_text(
            "<html><head><style>body{background:#0b0f19;color:#e5e7eb;font:12px sans-serif;margin:12px;"
            "display:flex;flex-wrap:wrap;gap:10px;width:1760px}"
            ".row{width:100%;font-size:15px;font-weight:bold;margin-top:6px}"
            ".panel{background:#161b26;padding:8px;border-radius:4px}.title{font-weight:bold;margin-bottom:4px}"
            ".unit{color:#9ca3af;font-weight:normal;margin-left:8px}.keys{font-size:11px}</style></head>"
            f"<body><div class='row'>settled — the dashboard's queries over a bench run "
            f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(start))}, {end - start:.0f} s, Prometheus)</div>"
            + "".join(panels) + "</body></html>"
        )
        out.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             f"--screenshot={out.resolve()}", "--window-size=1790,1720", page.as_uri()],
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
