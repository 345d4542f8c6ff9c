"""One image over a pipeline of ranks, a denoising step at a time (docs/images.md#pipeline).

Rank 0 (the *leader*) holds the text encoder, the VAE and the tokenizer: it encodes the prompt
(and an edit's reference image), makes the seeded latents, runs the scheduler and decodes the
partial and final images, which it alone sends (``worker.runner.outbox``). Every rank holds
its blocks of the transformer (``worker.image.stages``) and the transformer's small shared
modules. Per image and per step, over the ring group:

- at the image's first step, a header all-sum from rank 0 (``HEADER``), then the token ids
  (text, latent, reference) and the scheduler's timesteps, so every rank computes the same
  rotary embedding and time embedding; ``ok`` 0 (the leader could not encode the request) ends
  the task on every rank with the same error;
- each step: rank 0 embeds and runs its blocks, sends the state ``[1, T + I, D]`` to rank 1,
  which runs its blocks and sends it on (in the dtype the leader's blocks compute, named in
  the header); the last rank ends with the predicted noise of the latent tokens, all-summed
  to every rank in float32 with its dtype's code (the others add zeros; exact), so every
  rank finishes the step at the same collective and the leader's scheduler step, on the
  noise in the dtype it was computed in, is mflux's own.

After the last step the leader decodes the final image and every rank meets at a barrier
before it reports the task done: a rank that finished first would otherwise end the task in
the cluster's State while the leader still decodes, and the request would lose its image.

A failed collective (a rank gone) raises ``RankLost``: a runner failure, never a task error,
so the node ends the instance's requests with an error (``worker.image.work``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import mlx.core as mx

from worker.engine.ring_wait import NO_WAIT, RingWait, all_sum_length
from worker.image.stages import Stage
from worker.image.work import RankLost

HEADER = 8
"""``[ok, text tokens, image tokens (with an edit's reference), latent tokens, id columns,
state dtype, transformer input dtype, steps]`` (a dtype as its index in ``DTYPES``)."""

DTYPES = (mx.float32, mx.float16, mx.bfloat16)
"""The dtypes a state or noise travels in, by code (all exact in float32)."""


def broadcast(value: mx.array | None, shape: tuple[int, ...], dtype: Any, group: Any) -> mx.array:
    """``value`` (rank ``src``'s; None elsewhere: zeros of ``shape``/``dtype``) on every rank,
    by an all-sum padded so every ring segment carries data (``ring_wait.all_sum_length``)."""
    size = 1
    for n in shape:
        size *= n
    flat = mx.zeros((size,), dtype=dtype) if value is None else value.reshape(-1).astype(dtype)
    padding = all_sum_length(size, group.size()) - size
    if padding:
        flat = mx.concatenate([flat, mx.zeros((padding,), dtype=dtype)])
    return mx.distributed.all_sum(flat, group=group)[:size].reshape(shape)


def _collective(fn: Callable[[], mx.array]) -> mx.array:
    try:
        out = fn()
        mx.eval(out)
        return out
    except Exception as exc:  # noqa: BLE001 - MLX raises RuntimeError for a broken ring
        raise RankLost(f"the image pipeline's ring failed: {exc}") from exc


class RankPipeline:
    """This rank's part of the pipeline: ``stage`` (its blocks) over ``group``; ``wait``: how
    it waits for its neighbours' turns (``worker.engine.ring_wait``: asleep, not spinning in
    MLX's receive, so ranks on one host leave the cores to the rank computing)."""

    def __init__(self, stage: Stage, group: Any, wait: RingWait = NO_WAIT) -> None:
        self.stage, self.group, self.wait = stage, group, wait
        self.rank, self.world = group.rank(), group.size()

    def exchange(self, header: list[int] | None, ids: mx.array | None,
                 times: mx.array | None) -> tuple[list[int], mx.array | None, mx.array | None]:
        """The leader's header, token ids and timesteps on every rank (a collective; the
        others pass None); ids and timesteps None when the header says not ok."""
        mine = None if header is None else mx.array(header, dtype=mx.int32)
        got = [int(v) for v in _collective(lambda: broadcast(mine, (HEADER,), mx.int32, self.group)).tolist()]
        if not got[0]:
            return got, None, None
        ids = _collective(lambda: broadcast(ids, (got[1] + got[2], got[4]), mx.int32, self.group))
        return got, ids, _collective(lambda: broadcast(times, (got[7],), mx.float32, self.group))

    def noise(self, ids: mx.array, header: list[int], timestep: Any,
              leader_inputs: tuple[mx.array, mx.array] | None) -> mx.array:
        """One step's predicted noise of the latent tokens ``[1, latent tokens, C]`` on every
        rank (a collective). ``leader_inputs``: (hidden states, prompt embeddings), rank 0's."""
        text, image, latent, wire = header[1], header[2], header[3], DTYPES[header[5]]
        txt_ids, img_ids = ids[:text][None], ids[text:][None]
        like = mx.zeros((1, image, 1), dtype=DTYPES[header[6]])  # the context reads its dtype and batch only
        ctx = self.stage.context(like if leader_inputs is None else leader_inputs[0], timestep, img_ids, txt_ids)
        if self.stage.first:
            assert leader_inputs is not None
            state = self.stage.embed(*leader_inputs)
        else:
            width = self.stage.t.inner_dim
            self.wait.from_left()  # asleep until rank - 1's state comes
            state = mx.distributed.recv(shape=(1, text + image, width), dtype=wire, src=self.rank - 1,
                                        group=self.group)
        state = self.stage.run(state, ctx, text)
        channels = self.stage.t.out_channels
        size = latent * channels
        if self.stage.last:
            out = self.stage.finish(state, ctx, text)[:, :latent]
            flat = mx.concatenate([out.reshape(-1).astype(mx.float32), mx.array([DTYPES.index(out.dtype)], mx.float32)])
        else:
            _collective(lambda: mx.distributed.send(state.astype(wire), self.rank + 1, group=self.group))
            self.wait.from_either()  # asleep until the last rank's noise comes
            flat = None
        got = _collective(lambda: broadcast(flat, (size + 1,), mx.float32, self.group))
        return got[:size].reshape(1, latent, channels).astype(DTYPES[int(got[size].item())])

    def barrier(self) -> None:
        """Every rank has come here (a collective): the leader has made the final image, so
        no rank reports the image done before the leader's picture is on its way. The ranks
        after the leader wait for it asleep (it decodes meanwhile: a spinning rank on its host
        would take a core from the decode)."""
        if self.rank > 0:
            self.wait.from_either()
        _collective(lambda: broadcast(None, (self.world,), mx.int32, self.group))

    def state_dtype(self, hidden: mx.array, prompt: mx.array, ids: mx.array, text: int, timestep: Any) -> int:
        """The code of the dtype the leader's blocks compute in (the graph is built, not run)."""
        ctx = self.stage.context(hidden, timestep, ids[text:][None], ids[:text][None])
        return DTYPES.index(self.stage.run(self.stage.embed(hidden, prompt), ctx, text).dtype)
