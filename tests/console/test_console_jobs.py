"""The console's jobs pages in a real browser (Debian's Chromium, Playwright) over `make serve`, its
job runner and stream processor included: a job created from the fleet page's filter (its count
shown first) and followed live to completion while simulated devices confirm or refuse it; its
executions by state with their reasons; cancel and force-cancel from the keyboard; the job's
documents and reasons shown as text only; axe-core and no sideways scroll at 390 and 1440 px.

With UPDATE_SCREENSHOTS=1 the tests also write the docs' screenshots (docs/images/console-job*.png)."""

from __future__ import annotations

import threading
import uuid
import time

import pytest

# The same make serve (one for this module), browser and pages as the console's other tests.
from tests.console.test_console import (HOSTILE, MERGE, NAIVE_DOM, NARROW, WIDE, axe_violations, browser,  # noqa: F401
                                        checkout_token, context, fleet_url, forwarded_then_lost, page, rendered_markup,
                                        screenshot, served, unique)

pytestmark = pytest.mark.dynamodb_local

JOB_SECONDS = 60_000  # ms: the longest a job may take to reach a state here (a loaded machine)


class Devices:
    """Simulated devices, each acting on what is asked of it as a device does: it reads itself with
    its own token and, once its delta holds something, confirms (reports the desired values) or
    refuses (acknowledges each leaf with a code of 400 or more and a reason). A silent one never acts."""

    def __init__(self, client, behaviour: dict[str, tuple]):
        # device -> ("confirm",) | ("refuse", code, reason) | ("silent",)
        self.client, self.behaviour = client, behaviour
        self.tokens = {device: checkout_token(device=device) for device in behaviour}
        self.acted: dict[str, int] = {}
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *_):
        self.stopped.set()
        self.thread.join(timeout=10)

    def run(self):
        pending = {device: act for device, act in self.behaviour.items() if act[0] != "silent"}
        while pending and not self.stopped.is_set():
            for device, act in list(pending.items()):
                token = self.tokens[device]
                status, body = self.client("GET", f"/devices/{device}?include=metadata", token=token)
                if status != 200 or not body.get("delta"):
                    continue
                if act[0] == "confirm":
                    status, _ = self.client("PATCH", f"/devices/{device}/reported", body["delta"], MERGE, token=token)
                else:
                    acks = [{"path": f"/{leaf}", "version": body["metadata"]["desired"][leaf]["version"],
                             "code": act[1], "reason": act[2]} for leaf in body["delta"]]
                    status, _ = self.client("POST", f"/devices/{device}/desired/acks", {"acks": acks}, token=token)
                self.acted[device] = status
                del pending[device]
            self.stopped.wait(0.2)


def fleet_of(served, behaviours: list[tuple]) -> tuple[str, dict[str, tuple]]:
    """Devices of a site of their own, one for each behaviour; the site's filter and the devices."""
    site = unique("site")
    devices = {f"{site}-{number}": act for number, act in enumerate(behaviours)}
    for device in devices:
        assert served.client("PUT", f"/devices/{device}",
                             {"state": {"site": site}, "reported": {"mode": "normal"}})[0] == 201
    return f'eq(state/site,"{site}")', devices


def job_url(served, job_id: str) -> str:
    return f"{served.url}#/jobs/{job_id}"


def count_of(page, state: str) -> int:
    return int(page.locator(f"#count-{state} strong").inner_text())


def wait_counts(page, **counts: int) -> None:
    """Until the job's page shows these counts (the rest of its states at zero)."""
    wanted = {state: counts.get(state, 0) for state in
              ("QUEUED", "IN_PROGRESS", "SUCCEEDED", "FAILED", "TIMED_OUT", "SUPERSEDED", "REMOVED", "CANCELED")}
    page.wait_for_function("""(wanted) => Object.entries(wanted).every(([state, n]) =>
        document.querySelector(`#count-${state} strong`)?.textContent === String(n))""",
                           arg=wanted, timeout=JOB_SECONDS)


def open_job_form(page, served, filter_text: str) -> None:
    """The fleet page of `filter_text` once its count is shown, then its job form opened. The count
    renders above the job panel and, on a narrow screen, wraps to more lines than "Counting…": a
    click while it was on its way landed where the button had been, and opened nothing."""
    page.goto(fleet_url(served, filter=filter_text))
    page.wait_for_function("""() => !['', 'Counting…'].includes(
        document.querySelector('#count-result')?.textContent.trim() ?? '')""")
    page.get_by_role("button", name="Create a job for these devices…").click()


def create_from_fleet(page, served, filter_text: str, desired: str, expected: int, shot: str = "",
                      **fields: str) -> str:
    """On the fleet page of `filter_text`: open the job form, see the count, create the job; its id."""
    open_job_form(page, served, filter_text)
    plural = "" if expected == 1 else "s"
    page.locator("#job-count", has_text=f"{expected} device{plural} match it now").wait_for()
    submit = page.locator("#job-submit")
    assert submit.inner_text() == f"Create job for {expected} device{plural}" and submit.is_enabled()
    assert page.evaluate("document.activeElement.id") == "job-desired"
    assert page.locator("#job-filter").inner_text() == filter_text
    page.get_by_label("Desired for every device (JSON merge patch)").fill(desired)
    for label, value in fields.items():
        page.get_by_label(label).fill(value)
    if shot:
        screenshot(page, shot)
    submit.click()
    page.wait_for_url("**/console/#/jobs/*")
    page.locator("#job-status").wait_for()
    return page.url.rsplit("#/jobs/", 1)[1]


def test_a_job_created_from_the_fleets_filter_counts_first_and_is_followed_live_to_completion(served, page):
    filter_text, devices = fleet_of(served, [("confirm",)] * 3
                                    + [("refuse", 409, "busy"), ("refuse", 400, "eco unknown")])
    sent = []
    page.on("request", lambda request: sent.append((request.method, request.url, request.headers)))
    with Devices(served.client, devices) as simulated:
        # The runner completes a job when it next wakes: at the first execution's deadline (the timeout).
        job_id = create_from_fleet(page, served, filter_text, '{"mode": "eco"}', expected=5, shot="job-create",
                                   **{"Timeout per device (seconds, optional)": "5"})
        wait_counts(page, SUCCEEDED=3, FAILED=2)  # as the devices answer, before the job completes
        page.locator("#job-status", has_text="completed").wait_for(timeout=JOB_SECONDS)
    assert set(simulated.acted.values()) == {200}
    bar = page.get_by_role("progressbar")
    assert (bar.get_attribute("aria-valuenow"), bar.get_attribute("aria-valuemax")) == ("5", "5")
    assert page.eval_on_selector(".progress .s-SUCCEEDED", "e => e.style.width") == "60%"
    assert page.eval_on_selector(".progress .s-FAILED", "e => e.style.width") == "40%"
    assert page.locator("#following").inner_text() == "ended"  # nothing left to change: no more reads

    status, job = served.client("GET", f"/jobs/{job_id}")
    assert status == 200 and job["filter"] == filter_text and job["desired"] == {"mode": "eco"} and job["total"] == 5
    assert job["counts"]["SUCCEEDED"] == 3 and job["counts"]["FAILED"] == 2
    # The count came first, then one create, sent with an Idempotency-Key.
    paths = [(method, url.split(str(served.port), 1)[1]) for method, url, _ in sent]
    count_at = next(index for index, (method, path) in enumerate(paths) if path.startswith("/devices/count?"))
    creates = [index for index, (method, path) in enumerate(paths) if method == "POST" and path == "/jobs"]
    assert len(creates) == 1 and count_at < creates[0]
    assert sent[creates[0]][2].get("idempotency-key")
    # Followed by waiting reads: each after the first names the ETag it has and waits.
    reads = [(path, headers) for (method, path), (_, _, headers) in zip(paths, sent)
             if method == "GET" and path.split("?")[0] == f"/jobs/{job_id}"]
    assert len(reads) >= 2 and "If-None-Match" not in reads[0][1] and "if-none-match" not in reads[0][1]
    assert all("waitSeconds=20" in path and headers.get("if-none-match") for path, headers in reads[1:])

    page.get_by_label("State", exact=True).select_option("FAILED")
    page.wait_for_function(
        "() => document.querySelector('#executions caption')?.textContent.startsWith('Executions failed')")
    page.wait_for_function("() => document.querySelectorAll('#executions tbody tr').length === 2")
    rows = page.locator("#executions tbody tr").all_inner_texts()
    shown = {cells[0]: cells[1:] for cells in (row.split("\t") for row in rows)}
    assert {device: (cells[0], cells[1], cells[3], cells[4]) for device, cells in shown.items()} == {
        device: ("failed", "2", str(act[1]), act[2]) for device, act in devices.items() if act[0] == "refuse"}
    assert page.url.endswith(f"#/jobs/{job_id}?state=FAILED")
    page.get_by_label("State", exact=True).select_option("")
    page.wait_for_function("() => document.querySelectorAll('#executions tbody tr').length === 5")
    assert {link for link in page.locator("#executions tbody th a").all_inner_texts()} == set(devices)
    screenshot(page, "job")
    assert page.evaluate("window.__violations") == [] and page.errors == []


def test_a_job_is_canceled_then_force_canceled_from_the_keyboard(served, page):
    """One write a minute: the first device is written and stays in progress (it never answers),
    the two others wait in the queue; cancel leaves those unwritten, force removes the first's leaf."""
    filter_text, devices = fleet_of(served, [("silent",)] * 3)
    job_id = create_from_fleet(page, served, filter_text, '{"mode": "away"}', expected=3,
                               **{"At most writes a minute (optional)": "1"})
    assert served.client("GET", f"/jobs/{job_id}")[1]["rollout"] == {"maxPerMinute": 1}
    wait_counts(page, IN_PROGRESS=1, QUEUED=2)
    assert page.locator("#job-status").inner_text() == "in progress"

    page.locator("#cancel-job").focus()
    page.keyboard.press("Enter")
    assert page.evaluate("document.activeElement.id") == "cancel-confirm"  # the step it opened
    assert "what is queued is never written" in page.locator("#cancel-ask").inner_text()
    page.keyboard.press("Enter")
    page.locator("#job-status", has_text="canceled").wait_for()
    wait_counts(page, IN_PROGRESS=1, CANCELED=2)
    assert page.locator("#cancel-job").is_hidden() and page.locator("#force-cancel").is_visible()
    written = [device for device in devices if served.client("GET", f"/devices/{device}")[1]["desired"]]
    assert len(written) == 1 and served.client("GET", f"/devices/{written[0]}")[1]["desired"] == {"mode": "away"}

    page.locator("#force-cancel").focus()
    page.keyboard.press("Enter")
    assert page.evaluate("document.activeElement.id") == "cancel-confirm"
    assert "from the 1 device still in progress" in page.locator("#cancel-ask").inner_text()
    page.keyboard.press("Enter")
    wait_counts(page, CANCELED=3)
    page.locator("#following", has_text="ended").wait_for(timeout=JOB_SECONDS)
    assert served.client("GET", f"/devices/{written[0]}")[1]["desired"] == {}  # the job's leaf is gone
    assert page.locator("#cancel-job").is_hidden() and page.locator("#force-cancel").is_hidden()
    assert "nothing to cancel" in page.locator("#cancel-help").inner_text()
    assert page.evaluate("window.__violations") == [] and page.errors == []


def jobs_of(served, filter_text: str) -> list[str]:
    return [job["jobId"] for job in served.client("GET", "/jobs?limit=100")[1]["items"] if job.get("filter") == filter_text]


def test_a_job_create_whose_answer_is_lost_says_so_and_pressing_again_answers_the_same_job(served, page):
    """A hostile probe lost the answer to a job's creation: the page showed nothing and left its
    button disabled for good. The page says so and the button works again; pressed again, the same
    form goes with the same Idempotency-Key and the service answers with the job it created."""
    filter_text, _ = fleet_of(served, [("silent",)] * 2)
    open_job_form(page, served, filter_text)
    page.locator("#job-count", has_text="2 devices match it now").wait_for()
    page.get_by_label("Desired for every device (JSON merge patch)").fill('{"mode": "eco"}')
    lose = forwarded_then_lost("connection")
    page.route("**/jobs", lambda route: lose(route) if route.request.method == "POST" else route.continue_())
    page.locator("#job-submit").click()
    page.locator("#job-outcome [role=alert]", has_text="No answer: press again (the same Idempotency-Key answers "
                 "the same job)").wait_for()
    assert page.locator("#job-submit").is_enabled()
    created = jobs_of(served, filter_text)
    assert len(created) == 1  # created, its answer lost
    page.locator("#job-submit").click()
    page.wait_for_url(f"**/console/#/jobs/{created[0]}")
    assert jobs_of(served, filter_text) == created  # the same job, once
    assert len(lose.seen) == 2 and lose.seen[0] and lose.seen[1] == lose.seen[0]
    assert served.client("POST", f"/jobs/{created[0]}/cancel")[0] == 200
    assert page.evaluate("window.__violations") == [] and page.errors == []


def test_a_count_a_cancel_and_a_list_of_jobs_that_get_no_answer_say_so_and_leave_nothing_busy(served, page):
    filter_text, _ = fleet_of(served, [("silent",)])
    page.route("**/devices/count?*", lambda route: route.abort())
    open_job_form(page, served, filter_text)
    page.locator("#job-count [role=alert]", has_text="No answer from the service").wait_for()

    status, job = served.client("POST", "/jobs", {"filter": filter_text, "desired": {"mode": "eco"}})
    assert status == 201, job
    page.route("**/cancel*", lambda route: route.abort())
    page.goto(job_url(served, job["jobId"]))
    page.get_by_role("button", name="Cancel job…").click()
    page.get_by_role("button", name="Cancel the job").click()
    page.locator("#cancel-outcome [role=alert]", has_text="No answer from the service").wait_for()
    assert page.get_by_role("button", name="Cancel job…").is_enabled()

    page.route("**/jobs?*", lambda route: route.abort())
    page.goto(f"{served.url}#/jobs")
    page.locator("main [role=alert]", has_text="No answer from the service").wait_for()
    assert page.locator("table.jobs[aria-busy]").count() == 0
    assert served.client("POST", f"/jobs/{job['jobId']}/cancel")[0] == 200
    assert page.evaluate("window.__violations") == [] and page.errors == []


def test_an_executions_read_that_gets_no_answer_says_so_and_the_next_change_reads_them_again(served, page):
    """A hostile probe lost one read of a job's executions: the table never changed again (the
    page took itself to be still reading). The page says so, and the job's next change reads them."""
    filter_text, devices = fleet_of(served, [("silent",)] * 2)
    status, job = served.client("POST", "/jobs", {"filter": filter_text, "desired": {"mode": "eco"}})
    assert status == 201, job
    page.goto(job_url(served, job["jobId"]))
    wait_counts(page, IN_PROGRESS=2)
    in_state = "(state) => [...document.querySelectorAll('#executions tbody tr')].filter((row) => row.textContent.includes(state)).length"
    page.wait_for_function(f"() => ({in_state})('in progress') === 2")
    dropped = []
    page.route("**/executions*", lambda route: route.continue_() if dropped else (dropped.append(1), route.abort()))
    first, second = devices
    assert served.client("PATCH", f"/devices/{first}/reported", {"mode": "eco"}, MERGE,
                         token=checkout_token(device=first))[0] == 200
    page.locator("section[aria-labelledby=executions-heading] [role=alert]", has_text="No answer from the service").wait_for()
    assert served.client("PATCH", f"/devices/{second}/reported", {"mode": "eco"}, MERGE,
                         token=checkout_token(device=second))[0] == 200
    page.wait_for_function(f"() => ({in_state})('succeeded') === 2", timeout=JOB_SECONDS)
    assert page.locator("section[aria-labelledby=executions-heading] [role=alert]").count() == 0
    assert page.evaluate("window.__violations") == [] and page.errors == []


def test_an_execution_never_written_shows_no_version(served, page):
    """The API answers version 0 for an execution whose device the job has not written (queued,
    or canceled before its turn): the page showed "0", a version no device has."""
    filter_text, _ = fleet_of(served, [("silent",)] * 2)
    status, job = served.client("POST", "/jobs", {"filter": filter_text, "desired": {"mode": "eco"},
                                                  "rollout": {"maxPerMinute": 1}})
    assert status == 201, job
    page.goto(job_url(served, job["jobId"]))
    wait_counts(page, IN_PROGRESS=1, QUEUED=1)
    page.wait_for_function("() => [...document.querySelectorAll('#executions tbody tr')].map((row) => row.cells[1]?.textContent)"
                           ".sort().join() === 'in progress,queued'")
    versions = {cells[1]: cells[2] for cells in (row.split("\t") for row in page.locator("#executions tbody tr").all_inner_texts())}
    assert versions == {"in progress": "2", "queued": "—"}, versions
    assert served.client("POST", f"/jobs/{job['jobId']}/cancel?force=true")[0] == 200


def test_a_jobs_documents_and_reasons_render_as_text_and_nothing_in_them_runs(served, context):
    """A job whose desired value is markup, refused by a device with markup as its reason: the job's
    page, its executions and the jobs list show them as text (the page's policy lifted, so the
    rendering alone is tested); the same pages with a naive dom.js (strings as HTML) run the script."""
    filter_text, devices = fleet_of(served, [("refuse", 400, HOSTILE[1])])
    status, job = served.client("POST", "/jobs", {"filter": filter_text, "desired": {"label": HOSTILE[0]}})
    assert status == 201, job
    with Devices(served.client, devices):
        deadline = time.monotonic() + JOB_SECONDS / 1000
        while served.client("GET", f"/jobs/{job['jobId']}")[1]["counts"]["FAILED"] != 1:
            assert time.monotonic() < deadline
            time.sleep(0.3)

    def visit(page):
        page.goto(job_url(served, job["jobId"]))
        page.locator("#executions tbody tr", has_text="failed").wait_for()
        assert HOSTILE[0] in page.locator("#job-desired-shown").inner_text()  # shown, as text
        assert page.locator("#executions td.reason").inner_text() == HOSTILE[1]
        found = rendered_markup(page)
        page.goto(f"{served.url}#/jobs")
        page.locator("table.jobs tbody tr", has_text=job["jobId"]).wait_for()
        return found + rendered_markup(page)

    page = context(bypass_csp=True).new_page()
    assert visit(page) == 0 and page.evaluate("window.__xss") is None

    naive = context(bypass_csp=True).new_page()
    naive.route("**/console/js/dom.js", lambda route: route.fulfill(body=NAIVE_DOM, content_type="text/javascript"))
    with pytest.raises(AssertionError):
        visit(naive)
    naive.goto(job_url(served, job["jobId"]))
    naive.wait_for_function("() => window.__xss > 0")
    assert rendered_markup(naive) > 0


@pytest.mark.parametrize("job_id, shown", [("no.such!job", "jobId"), ("no-such-job", "No such job")],
                         ids=["refused id", "no job"])
def test_a_job_read_refused_for_good_is_said_once_and_not_read_again(served, page, job_id, shown):
    """400 (an id no job can have) and 404 answer the same however often asked: the page says so,
    offers no cancel and reads the job no more (it had asked again with backoff for good: 1 s, 2 s, ...)."""
    reads = []
    page.on("request", lambda request: reads.append(request.url)
            if f"/jobs/{job_id}" in request.url and "/executions" not in request.url else None)
    page.goto(job_url(served, job_id))
    page.locator("#job-head", has_text=shown).wait_for()
    time.sleep(3.5)
    assert len(reads) == 1, reads
    assert page.locator("#cancel-section").is_hidden() and page.locator("#executions").is_hidden()


def test_a_job_with_a_long_unbroken_value_does_not_scroll_its_page_sideways(served, context):
    """A hostile probe's job desired a 2,000-character value with no space: its page scrolled sideways at 390 px."""
    filter_text, _ = fleet_of(served, [("silent",)])
    status, job = served.client("POST", "/jobs", {"filter": filter_text, "desired": {"m" * 100: "N" * 2000}})
    assert status == 201, job
    page = context(viewport=NARROW).new_page()
    page.goto(job_url(served, job["jobId"]))
    page.locator("#job-desired-shown").wait_for()
    assert page.evaluate("document.documentElement.scrollWidth") <= NARROW["width"]
    assert axe_violations(page) == []
    assert served.client("POST", f"/jobs/{job['jobId']}/cancel")[0] == 200


@pytest.mark.parametrize("viewport", [WIDE, NARROW], ids=["1440px", "390px"])
def test_axe_finds_no_serious_violation_and_nothing_overflows_on_the_jobs_pages(served, context, viewport):
    filter_text, devices = fleet_of(served, [("confirm",), ("refuse", 409, "busy"), ("silent",)])
    job_id = unique("job")
    with Devices(served.client, devices):
        assert served.client("POST", "/jobs", {"jobId": job_id, "filter": filter_text, "desired": {"mode": "eco"},
                                               "clearOnConfirm": True})[0] == 201
        page = context(viewport=viewport).new_page()
        page.goto(job_url(served, job_id))
        wait_counts(page, SUCCEEDED=1, FAILED=1, IN_PROGRESS=1)
    wide = viewport is WIDE
    page.wait_for_function("() => document.querySelectorAll('#executions tbody tr').length === 3")
    page.get_by_role("button", name="Cancel job…").click()
    assert axe_violations(page) == []
    assert page.evaluate("document.documentElement.scrollWidth") <= viewport["width"]  # no sideways page scroll
    if not wide:
        screenshot(page, "job-390")

    page.goto(f"{served.url}#/jobs?status=IN_PROGRESS")
    row = page.locator("table.jobs tbody tr", has_text=job_id)
    row.wait_for()
    assert "in progress" in row.inner_text() and "2 of 3 final" in row.inner_text()
    assert all(status == "in progress" for status in page.locator("table.jobs tbody td .badge").all_inner_texts())
    assert axe_violations(page) == []
    assert page.evaluate("document.documentElement.scrollWidth") <= viewport["width"]
    row.get_by_role("link", name=job_id).click()
    page.locator("#job-status").wait_for()
    assert page.locator("h1").inner_text() == job_id

    open_job_form(page, served, filter_text)
    page.locator("#job-count", has_text="3 devices match it now").wait_for()
    assert axe_violations(page) == []
    assert page.evaluate("document.documentElement.scrollWidth") <= viewport["width"]
    assert served.client("POST", f"/jobs/{job_id}/cancel?force=true")[0] == 200


def test_a_jobs_filter_with_bidi_and_zero_width_characters_is_shown_with_them_escaped(served, page):
    """A filter value holding U+202E drew "eq(reported/firmware,"0.2.1")" as "...1.2.0" on the job's
    page, and a zero-width space hid itself (a hostile review): the page shows what is stored,
    each such character as its escape, as it does for desired."""
    tag = f"lab\u200b-{uuid.uuid4().hex[:6]}"
    filter_text = f'eq(state/site,"{tag}\u202e0.2.1\u202c")'
    status, job = served.client("POST", "/jobs", {"filter": filter_text, "desired": {"mode": "eco"}})
    assert status == 201, job
    page.goto(job_url(served, job["jobId"]))
    shown = page.locator("dd.value code", has_text="eq(")
    shown.wait_for()
    assert shown.inner_text() == filter_text.replace("\u200b", "\\u200b").replace("\u202e", "\\u202e").replace(
        "\u202c", "\\u202c")
