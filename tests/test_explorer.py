"""`hwgptbench explore`: the page's data against the shipped tables, the page self-contained
(no script or style from elsewhere), its output policy; and, marked e2e, the page in headless
Chromium (Debian's package, driven by selenium through /usr/bin/chromedriver): no console
errors, one point per row of a device's table, the plot changes with the device and the metric,
a hover shows the arch id."""

from __future__ import annotations

import html
import json
import re
import shutil
import time
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from hwgptbench import published
from hwgptbench.cli import main
from hwgptbench.figures.explorer import explore, page_marker, points
from hwgptbench.outputs import OutputPathError, marker

H100 = "cuda-nvidia-h100-80gb-hbm3"
CPU = "cpu-amd-epyc-1t"
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


def page_data(path: Path) -> dict[str, Any]:
    text = path.read_text(encoding="utf-8")
    found = re.search(r'<script id="explorer-data" type="application/json">(.*?)</script>',
                      text, re.S)
    assert found
    return json.loads(found.group(1).replace("<\\/", "</"))


@pytest.fixture(scope="module")
def explorer_page(published_s: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The page of the shipped s tables (their surrogates fitted once per run)."""
    results = tmp_path_factory.mktemp("explore") / "results"
    shutil.copytree(published_s, results, symlinks=True)
    return explore(["s"], results, results / "explorer.html")


def table_rows(scale: str, device: str) -> dict[str, int]:
    """The ok rows of a shipped device table per condition."""
    table = published.device_tables(scale)[device].filter(pl.col("status") == "ok")
    table = table.with_columns(condition=pl.format("b{}-t{}-{}-{}", "batch_size", "seq_len",
                                                   "dtype", "launch"))
    return dict(table.group_by("condition").len().iter_rows())


def test_every_row_of_each_device_table_is_one_measured_point(explorer_page: Path) -> None:
    scale = page_data(explorer_page)["scales"]["s"]
    columns = {(c["device"], c["condition"]): c for c in scale["columns"]}
    for device in published.device_tables("s"):
        for condition, rows in table_rows("s", device).items():
            column = columns[device, condition]
            assert column["rows"] == rows
            latency = column["metrics"]["latency_ms"]
            assert sum(latency["m"]) == rows  # measured, marked so
            assert all(m == 1 for m in latency["m"][:rows])
            predicted = [k for k, m in enumerate(latency["m"]) if not m]
            # the others are predicted, each inside its interval
            assert predicted and all(latency["lo"][k] <= latency["v"][k] <= latency["hi"][k]
                                     for k in predicted)
            assert points(column, "latency_ms") == len(column["ids"])
    # the CPU measured no energy and has no energy surrogate: the page offers none there
    assert "energy_mj" not in columns[CPU, "b1-t128-fp32-eager"]["metrics"]
    assert columns[H100, "b8-t1024-bf16-cuda_graph"]["default"]


def test_the_tau_heatmap_counts_the_archs_both_measured(explorer_page: Path) -> None:
    scale = page_data(explorer_page)["scales"]["s"]
    tau = scale["tau"]["latency_ms"]
    labels = tau["labels"]
    cpu, h100 = labels.index(f"{CPU} b1-t128-fp32-eager"), labels.index(
        f"{H100} b8-t1024-bf16-cuda_graph")
    cpu_ids = set(published.device_tables("s")[CPU]["arch_id"])
    h100_ids = set(published.device_tables("s")[H100]["arch_id"])
    assert tau["n"][cpu][cpu] == len(cpu_ids) and tau["n"][h100][h100] == len(h100_ids) == 500
    assert tau["n"][cpu][h100] == len(cpu_ids & h100_ids)
    assert tau["tau"][h100][h100] == 1.0


def test_the_page_is_self_contained_and_says_which_command_wrote_it(explorer_page: Path
                                                                    ) -> None:
    text = explorer_page.read_text(encoding="utf-8")
    assert not re.search(r"<script[^>]*\bsrc=", text)  # every script inlined
    assert not re.search(r"<link[^>]*\bhref=\"?https?:", text)  # no style from elsewhere
    assert page_marker(explorer_page) == marker("explore")
    size = explorer_page.stat().st_size
    assert 4e6 < size < 8e6, size  # Plotly's bundle (4.8 MB) and the data


def test_explore_writes_its_page_again_and_refuses_a_file_of_another(
        published_s: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    shutil.copytree(published_s, tmp_path / "results", symlinks=True)
    out = tmp_path / "results" / "explorer.html"
    for _ in range(2):  # the second run replaces its own page
        assert main(["explore", "--scale", "s", "--predicted", "20"]) in (0, None)
        assert page_data(out)["scales"]["s"]["predicted"] == 20
    assert "wrote results/explorer.html" in capsys.readouterr().out
    mine = tmp_path / "mine.html"
    mine.write_text("<html>my page</html>")
    with pytest.raises(OutputPathError, match="not written by hwgptbench explore"):
        explore(["s"], "results", mine, 5)
    assert mine.read_text() == "<html>my page</html>"
    with pytest.raises(OutputPathError, match="suffix"):
        explore(["s"], "results", tmp_path / "page.htm", 5)


def browser_missing() -> str | None:
    """Why the browser test cannot run here (None: it can)."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (`make test` installs the test extra)"
    for path, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not Path(path).exists():
            return (f"{path} is missing: install Debian's {package} (`apt-get install -y "
                    "chromium chromium-driver`; `make test` does it as root)")
    return None


@pytest.mark.e2e
@pytest.mark.timeout(120)
def test_the_page_in_headless_chromium(explorer_page: Path) -> None:
    why = browser_missing()
    if why:
        pytest.skip(why)
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--window-size=1400,1000"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    started = time.monotonic()
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        driver.get(explorer_page.resolve().as_uri())
        run = driver.execute_script

        def choose(select: str, value: str) -> None:
            run("const s = document.getElementById(arguments[0]); s.value = arguments[1];"
                "s.dispatchEvent(new Event('change'));", select, value)

        def traces() -> dict[str, list[float]]:
            return run("return Object.fromEntries(document.getElementById('scatter').data"
                       ".map((t) => [t.name.replace(/ \\(.*/, ''), t.x]));")

        rows = table_rows("s", H100)["b8-t1024-bf16-cuda_graph"]
        choose("device", H100)
        assert run("return document.getElementById('condition').value") == \
            "b8-t1024-bf16-cuda_graph"  # the device's default condition
        shown = traces()
        assert len(shown["measured"]) == rows == 500
        run("const c = document.getElementById('predicted'); c.checked = false;"
            "c.dispatchEvent(new Event('change'));")
        alone = traces()
        assert len(alone["measured"]) == rows and not alone["predicted"]
        assert run("return document.getElementById('status').dataset.points") == str(rows)
        # another metric, another device: another plot
        choose("metric", "energy_mj")
        energy = traces()
        assert len(energy["measured"]) == rows and energy["measured"] != alone["measured"]
        choose("device", CPU)
        cpu = traces()
        assert len(cpu["measured"]) == table_rows("s", CPU)["b1-t128-fp32-eager"] == len(
            set(published.device_tables("s")[CPU]["arch_id"]))
        assert run("return document.getElementById('metric').value") == "latency_ms"
        # compare: τ over the archs both measured, with n
        choose("compare", f"{H100} b8-t1024-bf16-cuda_graph")
        info = run("return document.getElementById('compare-info').textContent")
        assert "Kendall τ" in info and "n = " in info
        # a hover shows the arch id and its metrics
        arch_id, hover = run(
            "const gd = document.getElementById('scatter');"
            "Plotly.Fx.hover(gd, [{curveNumber: 0, pointNumber: 0}]);"
            "return [gd.data[0].customdata[0],"
            " document.querySelector('.hoverlayer').textContent];")
        assert arch_id.startswith("e") and arch_id in hover
        assert "latency" in hover and "ms (measured)" in hover and "layers" in hover
        front = run("return document.querySelectorAll('#front tbody tr').length")
        assert front == len(traces()["Pareto front"]) > 0
        errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        assert not errors, errors
    finally:
        driver.quit()
    assert time.monotonic() - started < 60


def test_the_marker_is_read_from_the_head_only(tmp_path: Path) -> None:
    path = tmp_path / "page.html"
    meta = html.escape(json.dumps(marker("explore"), sort_keys=True), quote=True)
    path.write_text(f'<head><meta name="hwgptbench-output" content="{meta}"></head>')
    assert page_marker(path) == marker("explore")
    path.write_text("x" * 5000 + f'<meta name="hwgptbench-output" content="{meta}">')
    assert page_marker(path) is None
