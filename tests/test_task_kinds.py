"""Kinds of work end to end (docs/architecture.md#how-to-add-a-kind-of-work): which kinds a
model does (``exo_p2p.types.kinds``), the master's admission and routing per kind
(``master.commands``, ``master.task_kinds``), the wire and the event log (old tags and cards
still decode), and the runner's seam parts (``worker.runner.rounds``, ``worker.runner.outbox``,
``worker.engine.text``) with the engine faked."""

from __future__ import annotations

import os

import msgspec
import numpy as np
import pytest

from exo_p2p.types import (
    ChatMessage,
    Embedding,
    EmbeddingChunk,
    EmbeddingParams,
    ErrorChunk,
    ErrorInfo,
    FinishChunk,
    GenerationParams,
    IndexedEvent,
    MasterElected,
    NodeModelsUpdated,
    NodeProfile,
    NodeProfileUpdated,
    PlaceInstance,
    Rerank,
    RerankParams,
    RunnerReady,
    RunnerStatusUpdated,
    State,
    SubmitTask,
    TaskCreated,
    TextGeneration,
    TokenChunk,
)
from exo_p2p.types.kinds import card_tasks, context_tokens, model_kind, model_tasks
from exo_p2p.types.models import ModelCard
from master.commands import handle_command
from master.in_flight import TOKEN_ID_BYTES, params_bytes
from master.task_kinds import split_refusal
from tests.support.rules.strategies import CARD
from tests.support.rules.master_run import GIB, run
from worker.engine.text import TextEngine
from worker.runner.main import RunnerProcess
from worker.runner.outbox import Outbox
from worker.runner.protocol import FrameReader, to_supervisor_decoder
from worker.runner.rounds import Rounds

pytestmark = pytest.mark.unit

DECODER = msgspec.structs.replace(CARD, tasks=("generate", "embed", "rerank"))
ENCODER = msgspec.structs.replace(CARD, model_id="enc", tasks=("embed", "rerank"))


# --- which kinds a model does ------------------------------------------------------------

@pytest.mark.parametrize(("config", "files", "kind", "tasks"), [
    ({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}, (), "decoder", ("generate", "embed", "rerank")),
    ({"model_type": "qwen2"}, (), "decoder", ("generate", "embed", "rerank")),  # no architectures: mlx-lm's default
    ({"architectures": ["Qwen3ForCausalLM"]}, ("modules.json",), "decoder", ("generate", "embed", "rerank")),  # an embedding decoder
    ({"architectures": ["BertModel"], "model_type": "bert"}, ("modules.json",), "encoder", ("embed", "rerank")),
    ({"model_type": "xlm-roberta"}, (), "encoder", ("embed", "rerank")),
    ({"architectures": ["XLMRobertaForSequenceClassification"]}, (), "encoder", ("rerank",)),  # a cross-encoder
    ({"architectures": ["SomethingModel"]}, ("modules.json",), "encoder", ("embed", "rerank")),
])
def test_kinds_come_from_the_model_files(config, files, kind, tasks):  # type: ignore[no-untyped-def]
    assert model_kind(config, files) == kind
    assert model_tasks(config, files) == tasks


@pytest.mark.parametrize(("config", "tokens"), [
    ({"model_type": "xlm-roberta", "max_position_embeddings": 514}, 512),  # positions start at 2
    ({"model_type": "roberta", "max_position_embeddings": 514}, 512),
    ({"model_type": "bert", "max_position_embeddings": 512}, 512),
    ({"model_type": "llama", "max_position_embeddings": 2048}, 2048),
    ({"model_type": "xlm-roberta"}, 4096),  # none given: the default
])
def test_context_is_the_positions_less_the_roberta_families_offset(config, tokens):  # type: ignore[no-untyped-def]
    assert context_tokens(config, 4096) == tokens


def test_a_card_from_before_kinds_generates_only_and_decodes_unchanged():
    old = msgspec.msgpack.encode(CARD)  # no ``tasks`` key: what an older log holds
    fields = msgspec.msgpack.decode(old)
    fields.pop("tasks", None)
    card = msgspec.msgpack.decode(msgspec.msgpack.encode(fields), type=ModelCard)
    assert card.tasks == () and card_tasks(card) == ("generate",)
    assert card_tasks(ENCODER) == ("embed", "rerank")


# --- the wire and the log ----------------------------------------------------------------

def test_an_old_text_generation_event_and_every_kind_decode_from_the_log():
    gen = TextGeneration("t1", "i1", CARD.model_id, GenerationParams((ChatMessage("user", "hi"),)), "n1")  # type: ignore[arg-type]
    raw = msgspec.msgpack.encode(IndexedEvent(1, 1, TaskCreated(gen)))
    assert b"text_generation" in raw  # the tag a log written before kinds holds
    for task in (gen, Embedding("t2", "i1", "m", EmbeddingParams(((1, 2), (3,))), "n1"),  # type: ignore[arg-type]
                 Rerank("t3", "i1", "m", RerankParams((1,), ((2,), (3, 4))), "n1")):  # type: ignore[arg-type]
        event = msgspec.msgpack.decode(msgspec.msgpack.encode(IndexedEvent(1, 1, TaskCreated(task))), type=IndexedEvent)
        assert event.event == TaskCreated(task)


def test_an_embedding_chunk_holds_float32_rows_and_refuses_a_wrong_size():
    vectors = np.array([[1.0, -2.5], [0.25, 3.0]], dtype="<f4")
    chunk = EmbeddingChunk("t1", vectors.tobytes(), count=2, dimensions=2, prompt_tokens=5)
    again = msgspec.msgpack.decode(msgspec.msgpack.encode(chunk), type=EmbeddingChunk)
    assert again.rows() == [[1.0, -2.5], [0.25, 3.0]]
    with pytest.raises(ValueError, match="not 3 x 2 float32"):
        EmbeddingChunk("t1", vectors.tobytes(), count=3, dimensions=2).rows()


# --- the master: admission and routing per kind --------------------------------------------

def ready_cluster(*cards: ModelCard) -> State:
    """node-a with a ready 1-node instance of each card."""
    s = run(State(), [MasterElected("node-a", 1),
                      NodeProfileUpdated(NodeProfile("node-a", "b1", "node-a", memory_total=64 * GIB, memory_available=64 * GIB)),
                      NodeModelsUpdated("node-a", cards)])  # type: ignore[arg-type]
    for card in cards:
        d = handle_command(s, PlaceInstance(f"place-{card.model_id}", card.model_id, nodes=("node-a",)))
        assert d.result.error is None, d.result.error
        s = run(s, d.events)
        shard = d.result.instance.shards[0]
        s = run(s, [RunnerStatusUpdated(shard.runner_id, d.result.instance.instance_id, shard.node_id, RunnerReady())])
    return s


def embed(model: str, inputs: tuple[tuple[int, ...], ...] = ((1, 2, 3),), task_id: str = "e1") -> SubmitTask:
    return SubmitTask("c-" + task_id, Embedding(task_id, "", model, EmbeddingParams(inputs), "node-a"))  # type: ignore[arg-type]


def rerank(model: str, task_id: str = "r1") -> SubmitTask:
    return SubmitTask("c-" + task_id, Rerank(task_id, "", model, RerankParams((1, 2), ((3,), (4, 5))), "node-a"))  # type: ignore[arg-type]


def generate(model: str, task_id: str = "g1") -> SubmitTask:
    return SubmitTask.generation("c-" + task_id, task_id, model, GenerationParams((ChatMessage("user", "hi"),)), "node-a")  # type: ignore[arg-type]


def test_each_kind_reaches_an_instance_whose_card_does_it():
    s = ready_cluster(DECODER, ENCODER)
    by_model = {i.model_id: i.instance_id for i in s.instances.values()}
    for command, model in ((generate(DECODER.model_id), DECODER.model_id), (embed(DECODER.model_id), DECODER.model_id),
                           (embed(ENCODER.model_id, task_id="e2"), ENCODER.model_id),
                           (rerank(ENCODER.model_id), ENCODER.model_id)):
        d = handle_command(s, command)
        assert d.result.error is None, d.result.error
        (created,) = d.events
        assert isinstance(created, TaskCreated) and type(created.task) is type(command.task)
        assert created.task.instance_id == by_model[model] == d.result.instance_id
        assert created.task.params == command.task.params


@pytest.mark.parametrize(("card", "command", "can"), [
    (ENCODER, generate, "embed, rerank"),
    (msgspec.structs.replace(CARD, model_id="ce", tasks=("rerank",)), embed, "rerank"),  # a cross-encoder
    (CARD, embed, "generate"),  # a card from before kinds: generation only
])
def test_a_kind_the_model_does_not_do_is_a_400_naming_what_it_does(card, command, can):  # type: ignore[no-untyped-def]
    s = ready_cluster(card)
    d = handle_command(s, command(card.model_id))
    assert d.events == ()
    error = d.result.error
    assert error is not None and error.status == 400 and error.code == "unsupported_task" and error.param == "model"
    assert error.message.endswith(f"it can: {can}")


def test_an_input_over_the_context_is_a_400_naming_it():
    s = ready_cluster(DECODER)
    long = tuple(range(DECODER.context_length + 1))
    d = handle_command(s, embed(DECODER.model_id, ((1,), long)))
    error = d.result.error
    assert d.events == () and error is not None and error.status == 400 and error.code == "context_length_exceeded"
    assert error.param == "input" and error.prompt_tokens == len(long) and "input 1 " in error.message
    fits = handle_command(s, embed(DECODER.model_id, ((1,), long[:-1])))
    assert fits.result.error is None


def test_embeddings_and_reranks_count_their_token_ids_in_flight():
    assert params_bytes(EmbeddingParams(((1, 2), (3,)))) == 3 * TOKEN_ID_BYTES
    assert params_bytes(RerankParams((1, 2), ((3,), (4, 5, 6)))) == 6 * TOKEN_ID_BYTES


# --- the runner's parts over the seam ------------------------------------------------------

class FakeEngine:
    """A seam ``Engine`` that records what the rounds tell it."""

    warmup_rate = 10.0

    def __init__(self) -> None:
        self.submitted: list[str] = []
        self.cancelled: list[str] = []
        self.held: list[bool] = []
        self.prefilling = False

    def submit(self, task):  # type: ignore[no-untyped-def]
        self.submitted.append(task.task_id)

    def cancel(self, task_id):  # type: ignore[no-untyped-def]
        self.cancelled.append(task_id)

    def has_work(self) -> bool:
        return bool(self.submitted)

    def must_agree(self) -> bool:
        return self.prefilling

    def hold_proposal(self) -> bool:
        return True

    def agreed_hold(self, hold: bool) -> None:
        self.held.append(hold)


def one_rank(row: np.ndarray) -> np.ndarray:
    return row[None, :]


def test_rounds_start_every_kind_and_drop_what_was_cancelled_before_it_started():
    engine, rounds = FakeEngine(), Rounds.agreed(one_rank, max_batch=4, rate=10.0)
    assert rounds.check_every >= 1
    assert rounds.due(engine)  # idle: a round at every turn
    rounds.add(Embedding("e1", "i", "m", EmbeddingParams(((1,),)), "n", created_idx=2))  # type: ignore[arg-type]
    rounds.add(TextGeneration("g1", "i", "m", GenerationParams(()), "n", created_idx=1))  # type: ignore[arg-type]
    rounds.add(Rerank("r1", "i", "m", RerankParams((1,), ((2,),)), "n", created_idx=3))  # type: ignore[arg-type]
    rounds.want_cancel("r1")
    outcome = rounds.round(engine)
    assert engine.submitted == ["g1", "e1"] and outcome.dropped == ["r1"] and not outcome.shutdown
    assert engine.held == [True]  # the rank's proposal, agreed by the one rank
    # a task that arrives after a round cancelled it is refused (the runner ends it Cancelled)
    assert not rounds.add(Rerank("r1", "i", "m", RerankParams((1,), ((2,),)), "n"))  # type: ignore[arg-type]
    assert not rounds.due(engine)  # working, not prefilling, pace not reached
    for _ in range(rounds.check_every):
        rounds.stepped(0.01, decoding=True)
    assert rounds.due(engine)
    rounds.want_shutdown()
    assert rounds.round(engine).shutdown


class IdleScheduler:
    """The scheduler's surface ``TextEngine.step`` reads, with nothing to do."""

    def has_work(self) -> bool:
        return False


def test_a_text_engine_answers_a_kind_it_does_not_do_with_a_400_chunk():
    engine = TextEngine(IdleScheduler())  # type: ignore[arg-type]
    engine.submit(Rerank("r1", "i", "m", RerankParams((1,), ((2,),)), "n"))  # type: ignore[arg-type]
    assert engine.has_work()
    (chunk,) = engine.step()
    assert isinstance(chunk, ErrorChunk) and chunk.error.status == 400 and chunk.error.code == "unsupported_task"
    assert not engine.has_work() and engine.step() == []


def test_the_outbox_reports_each_task_running_then_ended():
    read_fd, write_fd = os.pipe()
    try:
        out = Outbox(write_fd)
        ended = out.chunks([TokenChunk("g1", "a", 1), EmbeddingChunk("e1", b"\0" * 4, 1, 1),
                            FinishChunk("e1", "stop", 1, 0), ErrorChunk("g1", error=ErrorInfo(500, "x"))])
        os.close(write_fd)
        write_fd = -1
        data = b""
        while chunk := os.read(read_fd, 65536):
            data += chunk
        messages = [to_supervisor_decoder.decode(p) for p in FrameReader().feed(data)]
    finally:
        os.close(read_fd)
        if write_fd >= 0:
            os.close(write_fd)
    statuses = [(m.task_id, m.status) for m in messages if type(m).__name__ == "TaskStatusMsg"]
    assert statuses == [("g1", "running"), ("e1", "running"), ("e1", "complete"), ("g1", "failed")]
    assert ended == ["e1", "g1"]
    assert [type(m.chunk).__name__ for m in messages if type(m).__name__ == "ChunkMsg"] == [
        "TokenChunk", "EmbeddingChunk", "FinishChunk", "ErrorChunk"]


def test_an_encoder_is_placed_on_one_node_only():
    s = ready_cluster(ENCODER, DECODER)
    one = next(i for i in s.instances.values() if i.model_id == ENCODER.model_id)
    assert split_refusal(ENCODER, one) is None
    two = msgspec.structs.replace(one, shards=(one.shards[0], msgspec.structs.replace(one.shards[0], rank=1)))
    assert "runs on one node" in (split_refusal(ENCODER, two) or "")
    assert split_refusal(DECODER, two) is None  # a decoder may be a pipeline


def test_the_runner_holds_its_io_pulse_status_and_what_it_runs_only():
    runner = RunnerProcess(in_fd=0, out_fd=1)
    assert sorted(vars(runner)) == ["builder", "engine", "faults", "in_fd", "out", "pulse", "rounds", "setup", "status", "tasks"]
