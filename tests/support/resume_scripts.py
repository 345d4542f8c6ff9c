"""Scripts of failing and moving tasks for the resume tests."""

from __future__ import annotations

from exo_p2p.api.generation.resume import MOVABLE_CODE
from exo_p2p.types import ErrorChunk, ErrorInfo, FinishChunk, PrefillProgressChunk, SubmitTask, TokenChunk


FAILED = ErrorInfo(503, "generation failed: node n2 is gone", "server_error", code=MOVABLE_CODE)
LOADING = ErrorInfo(503, "model is loading (1/4 layers); retry shortly", "server_error", code="loading")
WORDS = ["Paris", " is", " the", " capital", " of", " France", "."]


def failing_script(fail_after: dict[int, int], refusals: list[ErrorInfo] | None = None):
    """A script for FakeMaster: the k-th submitted task sends tokens (``token_id`` = position)
    from where its ``resume_tokens`` end, and fails with ``FAILED`` after ``fail_after[k]``
    of them; each continuation checks that it resumes exactly from the tokens sent."""
    calls: list[SubmitTask] = []

    def script(cmd: SubmitTask) -> list:
        k = len(calls)
        calls.append(cmd)
        start = len(cmd.params.resume_tokens)
        assert cmd.params.resume_tokens == tuple(range(start))
        if k:
            assert cmd.params.origin_task_id == calls[0].task_id
        out: list = [PrefillProgressChunk(task_id=cmd.task_id, processed=0, total=12)]
        for i in range(start, len(WORDS)):
            if k in fail_after and i - start >= fail_after[k]:
                return out + [0.01, ErrorChunk(task_id=cmd.task_id, error=FAILED)]
            out += [0.001, TokenChunk(task_id=cmd.task_id, text=WORDS[i], completion_tokens=i + 1, token_id=i)]
        return out + [FinishChunk(task_id=cmd.task_id, finish_reason="stop", prompt_tokens=12, completion_tokens=len(WORDS))]

    return script, calls
