"""A real Prometheus (the distribution's binary) scraping mock engines that serve recorded
vLLM payloads: for the Prometheus source's tests and its benchmark.

:func:`scaled` derives a payload whose counters and histograms moved (every cumulative
value times ``factor``; gauges kept), so two phases of one recorded payload give a window
with known increases.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from pdctl.sdk.freeports import free_ports
from pdctl.sdk.observability.yamltext import dump

PROMETHEUS = shutil.which("prometheus")
CUMULATIVE = ("_total", "_bucket", "_sum", "_count")


def scaled(text: str, factor: float) -> str:
    """``text`` with every counter and histogram value multiplied by ``factor``."""
    out = []
    for line in text.split("\n"):
        if line and line[0] != "#":
            brace = line.find("{")
            name = line[:brace] if brace >= 0 else line.split(" ", 1)[0]
            if name.endswith(CUMULATIVE) and not name.endswith("_created"):
                head, _, value = line.rpartition(" ")
                line = f"{head} {float(value) * factor!r}"
        out.append(line)
    return "\n".join(out)


def _ts(rfc3339: str) -> float:
    return datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp()


@contextmanager
def prometheus(targets: list[tuple[str, dict[str, str]]], interval: str = "1s") -> Iterator[str]:
    """A Prometheus scraping ``targets`` (``host:port``, labels) every ``interval``;
    yields its URL and stops it (and removes its data) on exit."""
    assert PROMETHEUS, "prometheus is not installed (scripts/install-prometheus.sh)"
    (port,) = free_ports(1)
    with tempfile.TemporaryDirectory(prefix="pdctl-prom-") as d:
        cfg = {
            "global": {"scrape_interval": interval, "evaluation_interval": interval},
            "scrape_configs": [
                {
                    "job_name": "pdctl-test",
                    "scrape_interval": interval,
                    "scrape_timeout": interval,
                    "static_configs": [{"targets": [a], "labels": lab} for a, lab in targets],
                }
            ],
        }
        conf = Path(d) / "prometheus.yml"
        conf.write_text(dump(cfg))
        proc = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={conf}",
                f"--storage.tsdb.path={Path(d) / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if httpx.get(url + "/-/ready", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert proc.poll() is None, "prometheus exited at start"
                assert time.monotonic() < deadline, "prometheus not ready in 60 s"
                time.sleep(0.2)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def wait_scraped(url: str, after: float, count: int, timeout_s: float = 60) -> None:
    """Until each of the ``count`` targets has been scraped successfully since ``after``
    (a scrape that started after it)."""
    deadline = time.monotonic() + timeout_s
    while True:
        active: list[dict[str, Any]] = httpx.get(url + "/api/v1/targets", timeout=10).json()[
            "data"
        ]["activeTargets"]
        fresh = [t for t in active if t["health"] == "up" and _ts(t["lastScrape"]) > after]
        if len(active) == count and len(fresh) == count:
            return
        assert time.monotonic() < deadline, f"{len(fresh)}/{count} targets scraped since"
        time.sleep(0.25)
