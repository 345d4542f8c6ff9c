"""mlx-vlm's own greedy answer on a checkpoint, image and prompt: the oracle of the vision
tests through real nodes (docs/models.md#vision-models)."""

from __future__ import annotations

import io
from pathlib import Path

from exo_p2p.types import ChatMessage, GenerationParams, ImageRef

QUESTION = "What is this?"


def vlm_answer(model_dir: Path, image: bytes, max_tokens: int, question: str = QUESTION) -> str:
    """mlx-vlm's greedy tokens for ``question`` about ``image`` (one user message, rendered as
    the node renders it: ``worker.vision.rows.render_prompt``), spelled as the node's
    detokenizer spells them (end-of-sequence tokens left out)."""
    from mlx_lm.tokenizer_utils import load as load_tokenizer
    from mlx_vlm import generate
    from mlx_vlm.utils import load as load_vlm
    from PIL import Image

    from worker.vision.rows import render_prompt

    vlm, processor = load_vlm(str(model_dir))
    ref = ImageRef(digest="0" * 64, media_type="image/png", width=1, height=1, size=1)
    params = GenerationParams(messages=(ChatMessage("user", question, images=(ref,)),))
    tokenizer = load_tokenizer(model_dir)
    result = generate(vlm, processor, render_prompt(params, tokenizer), image=[Image.open(io.BytesIO(image))],
                      max_tokens=max_tokens, temperature=0.0, verbose=False)
    detokenizer = tokenizer.detokenizer
    detokenizer.reset()
    for token in result.token_ids:
        if token not in tokenizer.eos_token_ids:
            detokenizer.add_token(token)
    detokenizer.finalize()
    return detokenizer.text
