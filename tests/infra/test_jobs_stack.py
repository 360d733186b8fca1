"""The job runner as deployed (infra/jobs.py): a self-invoking function with only the table's
item actions and the right to invoke itself, woken every minute by a schedule, started at once by
the API function (which names it and may invoke it: the waiting function may not); its two
alarms watch metrics the code emits and have runbook entries."""

from __future__ import annotations

from functions import config
from functions.device_state import metrics as names
from infra import jobs as jobs_module
from tests.infra.test_push_stack import actions, statements_of
from tests.infra.test_stack import REPO_ROOT, alarm_named, api_function, only


def runner(template):
    return only(template, "AWS::Lambda::Function", {"Handler": jobs_module.HANDLER})


def test_the_runner_may_use_the_table_and_invoke_itself_and_nothing_else(template):
    logical, function = runner(template)
    assert function["Properties"]["Timeout"] == 900
    statements = statements_of(template, function)
    granted = {action for statement in statements for action in actions(statement)}
    assert granted == set(jobs_module.DYNAMODB_ACTIONS) | {"lambda:InvokeFunction", "logs:CreateLogStream",
                                                           "logs:PutLogEvents"}
    invoke = [statement for statement in statements if "lambda:InvokeFunction" in actions(statement)]
    assert [statement["Resource"] for statement in invoke] == [{"Fn::GetAtt": [logical, "Arn"]}]


def test_a_schedule_wakes_the_runner_every_minute(template):
    logical, _ = runner(template)
    _, rule = only(template, "AWS::Events::Rule")
    assert rule["Properties"]["ScheduleExpression"] == "rate(1 minute)"
    assert [target["Arn"] for target in rule["Properties"]["Targets"]] == [{"Fn::GetAtt": [logical, "Arn"]}]


def test_the_api_function_starts_a_jobs_run_and_the_waiting_function_may_not(template):
    logical, _ = runner(template)
    for construct, may in (("Function", True), ("WaitingFunction", False)):
        _, function = api_function(template, construct)
        assert function["Properties"]["Environment"]["Variables"][config.JOB_RUNNER_FUNCTION] == {"Ref": logical}
        statements = statements_of(template, function)
        invokes = [statement["Resource"] for statement in statements if "lambda:InvokeFunction" in actions(statement)]
        assert invokes == ([{"Fn::GetAtt": [logical, "Arn"]}] if may else [])


def test_the_job_alarms_watch_what_the_code_emits_and_have_runbook_entries(template):
    stuck = alarm_named(template, "JobStuckExecutions")
    assert stuck["MetricName"] == names.JOB_STUCK_EXECUTIONS and stuck["Threshold"] == 0
    # the schedule counts every minute: a period with no count is a schedule stopped or failing
    assert stuck["TreatMissingData"] == "breaching"
    errors = alarm_named(template, "JobErrors")
    expressions = [metric for metric in errors["Metrics"] if "MetricStat" in metric]
    assert {metric["MetricStat"]["Metric"]["MetricName"] for metric in expressions} == {"Errors", names.JOB_ERRORS}
    # either series alone raises it: a timeout emits the runner's Errors and no JobErrors
    [total] = [metric["Expression"] for metric in errors["Metrics"] if "Expression" in metric]
    terms = [term.strip() for term in total.split("+")]
    assert sorted(terms) == sorted(f"FILL({metric['Id']}, 0)" for metric in expressions)
    handler = (REPO_ROOT / "functions" / "jobs" / "handler.py").read_text()
    assert "names.JOB_ERRORS" in handler and "names.JOB_STUCK_EXECUTIONS" in handler
    runbook = (REPO_ROOT / "docs" / "operations.md").read_text()
    assert "`JobErrors`" in runbook and "`JobStuckExecutions`" in runbook
