"""Final states and the job's counts, written together: every execution that becomes final is
one item (``x#<device id>``, put only while none is there) in the same TransactWriteItems as
the counter that counts it, so a count moves exactly when an execution first becomes final,
however often the processor's batch is delivered, a sweep runs again, or an answer is lost.
Whoever judges first (the stream processor, the runner's sweep, a cancel) wins; the others'
parts are refused and dropped."""

from __future__ import annotations

import uuid
from collections import Counter
from dataclasses import dataclass

from ..errors import StorageUnavailable
from ..item import schema
from ..write.expressions import Expression
from ..write.outcomes import Refusals
from ..write.pipeline import WritePipeline
from . import items
from .executions import Verdict


MAX_FINALS_PER_TRANSACTION = 99  # and the counter: DynamoDB's 100 items
ATTEMPTS = 8
_COUNTS = "~counts"  # (no device id holds a ~) the part of a finals transaction that is the job's counter


@dataclass(frozen=True)
class Final:
    """An execution's final state: its device, the verdict, the version the job's write made
    there (0: none) and whether that write applied."""

    device_id: str
    verdict: Verdict
    version: int = 0
    written: bool = False

    def execution(self) -> items.Execution:
        verdict = self.verdict
        return items.Execution(self.device_id, verdict.state, self.version, verdict.at_ms, verdict.code,
                               verdict.reason, self.written)


class Finals:
    def __init__(self, pipeline: WritePipeline):
        self._pipeline = pipeline

    def record(self, job_id: str, expires: int, finals: list[Final]) -> list[Final]:
        """Writes each final whose execution is not final yet, with the counts, in transactions
        of up to ``MAX_FINALS_PER_TRANSACTION``; returns those written now. ``StorageUnavailable``
        (or ``AnswerLost``) when they could not be written: sending them again is safe."""
        pending = list({final.device_id: final for final in reversed(finals)}.values())[::-1]  # the first of each
        written: list[Final] = []
        while pending:
            chunk, pending = pending[:MAX_FINALS_PER_TRANSACTION], pending[MAX_FINALS_PER_TRANSACTION:]
            written += self._send(job_id, expires, chunk)
        return written

    def _send(self, job_id: str, expires: int, chunk: list[Final]) -> list[Final]:
        runtime = self._pipeline.runtime
        for attempt in range(1, ATTEMPTS + 1):
            if not chunk:
                return []
            parts = {final.device_id: [self._execution(job_id, expires, final)] for final in chunk}
            parts[_COUNTS] = [self._counts(job_id, expires, chunk)]
            try:
                self._pipeline.send_together(self._pipeline.planner(), [], parts, uuid.uuid4().hex)
                return chunk
            except Refusals as refused:  # final already (another judge was first): dropped
                chunk = [final for final in chunk if final.device_id not in refused.refused]
                if refused.refused:
                    continue
            except StorageUnavailable:
                if attempt == ATTEMPTS:
                    raise
            runtime.pause(attempt)
        raise StorageUnavailable(f"finals of job {job_id} kept meeting other writes")

    def _execution(self, job_id: str, expires: int, final: Final) -> dict:
        expr = Expression()
        return {"Put": {"TableName": self._pipeline.store.table_name,
                        "Item": final.execution().item(job_id, expires),
                        "ConditionExpression": f"attribute_not_exists({expr.name(items.STATE)})",
                        **expr.attributes()}}

    def _counts(self, job_id: str, expires: int, chunk: list[Final]) -> dict:
        by_state = Counter(final.verdict.state for final in chunk)
        expr = Expression()
        adds = [f"{expr.name(items.FINAL_PREFIX + state)} {expr.number(count)}" for state, count in by_state.items()]
        written = sum(final.written for final in chunk)
        if written:
            adds.append(f"{expr.name(items.FINAL_WRITTEN)} {expr.number(written)}")
        shard = self._pipeline.runtime.rng.randrange(items.COUNTER_SHARDS)  # any counter: the counts are their sum
        return {"Update": {
            "TableName": self._pipeline.store.table_name, "Key": items.counter_key(job_id, shard),
            "UpdateExpression": f"ADD {', '.join(adds)} SET {expr.name(schema.TTL_ATTRIBUTE)} = "
                                f"{expr.number(expires)}", **expr.attributes()}}
