"""What a failed console test leaves for whoever reads the failure: each page still open (its
address and the text of its main region, as a reader of the page sees it) and the end of make
serve's output. A wait that timed out says only what it waited for; this says what was shown."""

from __future__ import annotations

import pytest

SHOWN_CHARACTERS = 2_000
LOG_CHARACTERS = 4_000


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.when == "call" and report.failed:
        for number, page in enumerate(page for context in getattr(item, "browser_contexts", ())
                                      for page in context.pages):
            report.sections.append((f"page {number + 1}", shown(page)))
        served = item.funcargs.get("served")
        if served is not None:
            report.sections.append(("make serve's output, its end", served.output[-LOG_CHARACTERS:]))
    return report


def shown(page) -> str:
    try:
        text = page.evaluate("() => (document.querySelector('main') || document.body)?.innerText ?? ''")
    except Exception as error:  # a page closed or crashed: say so rather than hide the failure
        text = f"(unreadable: {error})"
    return f"{page.url}\n{text[:SHOWN_CHARACTERS]}"
