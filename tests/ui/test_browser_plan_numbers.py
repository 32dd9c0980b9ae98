"""One plan, the same numbers on every page, in a real browser: a plan opened from a Plan review card, from a
copied link, and from a search row shows the same memory per GPU and step time on Topology, Activation
memory, TP scaling, Long context and Plan review (the plan form's headline, ui.loaders.plan_numbers, beside
the review's cards, ui.review_charts.plan_cards: one report, one format). And a job whose model is unknown
(an uploaded set) shows no plan's numbers at all until its model is picked.

Uses tests/ui/test_browser.py's server and Chromium (Debian's, through Playwright's Python API).

    .venv/bin/python -m pytest tests/ui/test_browser_plan_numbers.py -m slow
"""

from __future__ import annotations

import re

import pytest

from tests.support.upload_sets import write_upload
from tests.ui import test_browser as tb

pytestmark = pytest.mark.slow

browser = tb.browser  # the module-scoped headless Chromium fixture
PLAN_PAGES = {  # the plan pages a review card links to: title -> URL path
    "Topology": "topology",
    "Activation memory": "activation_memory",
    "TP scaling": "tp_scaling",
    "Long context": "long_context",
}
MEMORY = re.compile(r"^[\d,]+\.\d GiB$")
STEP = re.compile(r"^[\d,]+\.\d{3} s$")


@pytest.fixture(scope="module")
def uploads(tmp_path_factory):
    return tmp_path_factory.mktemp("plan-numbers") / "uploads"


@pytest.fixture(scope="module")
def server(tmp_path_factory, uploads):
    root = uploads.parent
    env = {"PARASCOPE_RUNS": str(root / "runs"), "PARASCOPE_UPLOADS": str(uploads), "PARASCOPE_DATA": str(root)}
    with tb._streamlit(tmp_path_factory, env=env) as url:
        yield url


def _open(page, url: str) -> None:
    page.goto(url, timeout=tb.PAGE_TIMEOUT_MS)
    tb._wait_for_script(page)
    _no_exception(page)


def _no_exception(page) -> None:
    exceptions = page.locator('[data-testid="stException"]')
    assert exceptions.count() == 0, exceptions.first.inner_text()


def _metric(where, label: str) -> str:
    """The value of the metric labelled exactly `label` (case-insensitive) inside `where`."""
    root = getattr(where, "page", where)  # a locator's page, or the page itself
    metric = where.locator('[data-testid="stMetric"]').filter(
        has=root.locator('[data-testid="stMetricLabel"]', has_text=re.compile(f"^{re.escape(label)}$", re.I))
    )
    assert metric.count() == 1, f"{metric.count()} metrics labelled {label!r}"
    return metric.locator('[data-testid="stMetricValue"]').inner_text().strip()


def _numbers(where) -> tuple[str, str]:
    """(memory per GPU, step time) as the page shows them, checked for their shared format."""
    memory, step = _metric(where, "memory per GPU"), _metric(where, "step time")
    assert MEMORY.match(memory) and STEP.match(step), (memory, step)
    return memory, step


def _cards(page):
    """Plan review's plan cards, in order: the columns that hold the links to the plan pages."""
    cards = page.locator('[data-testid="stColumn"]').filter(has=page.locator('[data-testid="stPageLink"]'))
    assert cards.count() >= 1, "no plan card with page links"
    return cards


def _card(page, index: int):
    return _cards(page).nth(index)


def _links(card) -> dict[str, str]:
    """The card's page links: title -> href."""
    out = {}
    for title in PLAN_PAGES:
        link = card.get_by_role("link", name=title).first
        assert link.count() == 1, f"the card has no {title} link"
        out[title] = link.get_attribute("href")
    return out


def _click_through(page, review_url: str, card_index: int, want: tuple[str, str]) -> None:
    """From the review, click the card's link to each plan page and read the plan's numbers there."""
    for title, path in PLAN_PAGES.items():
        _open(page, review_url)
        _card(page, card_index).get_by_role("link", name=title).first.click()
        page.wait_for_function(f"() => location.pathname.endsWith('/{path}')", timeout=tb.PAGE_TIMEOUT_MS)
        tb._wait_for_script(page)
        _no_exception(page)
        assert _numbers(page) == want, f"{title} opened from Plan review"


def _new_page(browser):
    """A page in a fresh browser context: a new Streamlit session, as a colleague opening a link has."""
    context = browser.new_context(viewport={"width": 1500, "height": 1100})
    return context, context.new_page()


def test_a_review_card_and_its_links_show_the_same_numbers(server, browser):
    """Card B of the opening review (interleaved, ZeRO-1, selective recompute, every overlap: the plan
    with the most settings away from their defaults) on each plan page, clicked and copied."""
    context, page = _new_page(browser)
    try:
        _open(page, f"{server}/plan_review")
        review_url = page.url
        want = _numbers(_card(page, 1))
        links = _links(_card(page, 1))
        assert all("vpp=2" in href and "tpo=1" in href for href in links.values()), links
        _click_through(page, review_url, 1, want)
    finally:
        context.close()
    context, page = _new_page(browser)  # the links and the review itself, copied to a new session
    try:
        for title, href in links.items():
            _open(page, f"{server}/{href.lstrip('/')}")
            assert _numbers(page) == want, f"{title} opened from a link"
        _open(page, review_url)
        assert _numbers(_card(page, 1)) == want, "Plan review opened from a link"
    finally:
        context.close()


def test_a_search_row_sent_to_compare_shows_the_same_numbers(server, browser):
    """Plan review → Search → Add to compare: the searched plan's card, then each page from its links."""
    context, page = _new_page(browser)
    try:
        _open(page, f"{server}/plan_review?view=search")
        page.get_by_role("button", name="Add to compare").click()
        page.wait_for_function("() => location.search.includes('search+%231')", timeout=tb.PAGE_TIMEOUT_MS)
        tb._wait_for_script(page)
        review_url = page.url
        last = _cards(page).count() - 1
        assert "search #1" in _card(page, last).inner_text()
        want = _numbers(_card(page, last))
        links = _links(_card(page, last))
        _click_through(page, review_url, last, want)
        for title, href in links.items():
            _open(page, f"{server}/{href.lstrip('/')}")
            assert _numbers(page) == want, f"{title} opened from the search row's link"
    finally:
        context.close()


@pytest.mark.parametrize("path", ["topology", "activation_memory", "tp_scaling"])
def test_an_upload_of_an_unknown_model_asks_for_it_before_any_number(server, browser, uploads, path):
    """Eight V100 ranks of a job that names no model (a DLRM): the page's first words ask for the model,
    no memory, step time or memory error of a stand-in appears; picking one brings the plan's numbers."""
    if not (uploads / "dlrm").exists():
        write_upload(uploads, "dlrm")
    context, page = _new_page(browser)
    try:
        _open(page, f"{server}/{path}?run=upload:dlrm")
        main = page.locator('[data-testid="stMain"]').inner_text()
        _, first = [line for line in main.splitlines() if line.strip()][:2]
        assert first.startswith("Which model did this job train? dlrm names no model ParaScope knows"), first
        assert "model=" not in page.url and "dp=8" in page.url  # the job's layout, no stand-in model
        assert page.locator('[data-testid="stAlertContentError"]').count() == 0
        assert "exceeds the GPU" not in main and "gpt3-175b" not in main
        assert (
            page.locator('[data-testid="stMetricLabel"]', has_text=re.compile("memory|step time|MFU", re.I)).count()
            == 0
        )
        if path != "tp_scaling":
            return
        page.locator('[data-testid="stSelectbox"]', has_text="The job's model").click()
        page.get_by_role("option", name="llama3-8b").first.click()
        page.wait_for_function("() => location.search.includes('model=llama3-8b')", timeout=tb.PAGE_TIMEOUT_MS)
        tb._wait_for_script(page)
        _no_exception(page)
        _numbers(page)  # the picked model's memory per GPU and step time, in their format
        assert "Which model did this job train?" not in page.locator('[data-testid="stMain"]').inner_text()
    finally:
        context.close()
