"""A tiny random llama model in the MLX format, for tests and benchmarks (docs/architecture.md#testing).

``make_synthetic_model`` writes a directory that ``mlx_lm.utils.load`` and our engine's
loader both read: ``config.json``, ``model.safetensors`` (random weights from a seeded numpy
generator, scaled like a trained model so the logits are neither flat nor one-hot), a real
byte-level BPE ``tokenizer.json`` (built with the ``tokenizers`` library: specials
``<|endoftext|>`` = 0, ``<|im_start|>`` = 1, ``<|im_end|>`` = 2, the 256 byte tokens, then a
few merges), ``tokenizer_config.json``, ``generation_config.json`` and optionally a
``chat_template.jinja``. The same arguments always give byte-identical files.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten

SPECIAL_TOKENS: tuple[str, ...] = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
"""Special tokens with ids 0, 1, 2 (ChatML, as in SmolLM2)."""

EOS_TOKEN_IDS: tuple[int, ...] = (2, 0)
"""End-of-turn tokens the model's generation config names: ``<|im_end|>``, ``<|endoftext|>``."""

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
"""The ChatML template the synthetic model carries (when asked to)."""

# Merges in the byte-level alphabet ("Ġ" is the space byte). Later merges may use earlier ones.
_MERGES: tuple[tuple[str, str], ...] = (
    ("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("e", "r"), ("a", "n"), ("Ġ", "a"),
    ("o", "n"), ("r", "e"), ("Ġ", "s"), ("e", "d"), ("o", "u"), ("Ġ", "w"), ("in", "g"),
    ("Ġ", "c"), ("Ġ", "o"), ("a", "t"), ("e", "n"), ("Ġ", "b"), ("l", "l"), ("Ġ", "i"),
    ("Ġ", "p"), ("Ġ", "h"), ("o", "r"), ("Ġ", "f"), ("e", "s"), ("i", "t"), ("Ġ", "m"),
    ("a", "r"), ("Ġa", "n"), ("Ġan", "d"), ("Ġ", "d"), ("l", "e"), ("Ġo", "f"), ("Ġi", "s"),
    ("Ġ", "P"), ("Ġ", "F"), ("Ġ", "W"), ("Ġ", "C"), ("Ġw", "h"), ("Ġwh", "at"), ("Ġc", "an"),
    ("Ġs", "t"), ("Ġh", "e"), ("Ġhe", "ll"), ("Ġhell", "o"), ("Ġ", "y"), ("Ġy", "ou"),
)

ChatTemplateWhere = Literal["config", "jinja"] | None


def _build_tokenizer(added: tuple[str, ...] = ()):
    """The byte-level BPE tokenizer: specials, 256 byte tokens, ``_MERGES``, then ``added``
    (tokens that are not special: they appear in decoded text)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab: dict[str, int] = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in alphabet:
        vocab[ch] = len(vocab)
    merges: list[tuple[str, str]] = []
    for a, b in _MERGES:
        if a + b in vocab or a not in vocab or b not in vocab:
            continue
        vocab[a + b] = len(vocab)
        merges.append((a, b))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    if added:
        tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in added])
    return tok


def _model_config(
    *,
    vocab_size: int,
    n_layers: int,
    hidden_size: int,
    num_attention_heads: int,
    num_key_value_heads: int,
    intermediate_size: int,
    context_length: int,
    tie_word_embeddings: bool,
) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden_size,
        "num_hidden_layers": n_layers,
        "intermediate_size": intermediate_size,
        "num_attention_heads": num_attention_heads,
        "num_key_value_heads": num_key_value_heads,
        "rms_norm_eps": 1e-5,
        "vocab_size": vocab_size,
        "max_position_embeddings": context_length,
        "rope_theta": 10000.0,
        "rope_traditional": False,
        "tie_word_embeddings": tie_word_embeddings,
        "bos_token_id": None,
        "eos_token_id": list(EOS_TOKEN_IDS),
    }


def _random_weights(model: nn.Module, seed: int, hidden_size: int) -> dict[str, mx.array]:
    """Seeded normal weights: linears ~ N(0, 4/fan_in) (a gain of 2, so the residual stream
    depends on the whole context and greedy output does not collapse into one repeated
    token), the embedding ~ N(0, (2.5/sqrt(hidden))²) so tied logits have std ≈ 2.5, the
    special tokens' rows scaled by 0.2 so they are rarely generated (tests that need an
    end-of-turn token choose one), norms = 1."""
    rng = np.random.default_rng(seed)
    out: dict[str, mx.array] = {}
    for name, p in tree_flatten(model.parameters()):
        shape = tuple(p.shape)
        if name.endswith("norm.weight"):
            arr = np.ones(shape, dtype=np.float32)
        elif "embed_tokens" in name or name.startswith("lm_head"):
            arr = rng.standard_normal(shape, dtype=np.float32) * (2.5 / np.sqrt(hidden_size))
            arr[: len(SPECIAL_TOKENS)] *= 0.2
        else:
            arr = rng.standard_normal(shape, dtype=np.float32) * (2.0 / np.sqrt(shape[-1]))
        out[name] = mx.array(arr)
    return out


def _weights(config: dict, *, seed: int, dtype: str, quantize: bool) -> tuple[dict[str, mx.array], dict | None]:
    """The weights of the llama model ``config`` describes (``_random_weights``, cast to
    ``dtype``) and, with ``quantize``, its ``quantization`` entry: 4-bit affine group 32 for
    the linears, 8-bit for the embedding (else None)."""
    from mlx_lm.models.llama import Model, ModelArgs

    model = Model(ModelArgs.from_dict(config))
    weights = _random_weights(model, seed, config["hidden_size"])
    if dtype != "float32":
        weights = {k: v.astype(getattr(mx, dtype)) for k, v in weights.items()}
    if not quantize:
        return weights, None
    model.load_weights(list(weights.items()))
    overrides = {"model.embed_tokens": {"group_size": 32, "bits": 8}}
    nn.quantize(
        model,
        group_size=32,
        bits=4,
        class_predicate=lambda p, m: overrides.get(p, hasattr(m, "to_quantized")),
    )
    return dict(tree_flatten(model.parameters())), {"group_size": 32, "bits": 4, **overrides}


def write_tokenizer_files(out_dir: Path, tok, context_length: int, chat_template: ChatTemplateWhere,
                          template: str = CHATML_TEMPLATE) -> None:
    """Write ``tok`` (``_build_tokenizer``'s) as ``tokenizer.json`` with its
    ``tokenizer_config.json`` and ``generation_config.json`` into ``out_dir``; ``chat_template``
    as in ``make_synthetic_model``. Raises ``ValueError`` for another ``chat_template``."""
    (out_dir / "generation_config.json").write_text(
        json.dumps({"eos_token_id": list(EOS_TOKEN_IDS), "bos_token_id": None}, indent=2)
    )
    tok.save(str(out_dir / "tokenizer.json"))
    tok_config: dict = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "model_max_length": context_length,
        "clean_up_tokenization_spaces": False,
        "added_tokens_decoder": {
            str(i): {"content": t, "special": True, "lstrip": False, "rstrip": False,
                     "normalized": False, "single_word": False}
            for i, t in enumerate(SPECIAL_TOKENS)
        },
    }
    jinja_path = out_dir / "chat_template.jinja"
    if chat_template == "config":
        tok_config["chat_template"] = template
    elif chat_template == "jinja":
        jinja_path.write_text(template)
    elif chat_template is not None:
        raise ValueError(f"chat_template must be 'config', 'jinja' or None, not {chat_template!r}")
    if chat_template != "jinja" and jinja_path.exists():
        jinja_path.unlink()
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2))


def make_synthetic_model(
    out_dir: Path,
    *,
    n_layers: int = 4,
    hidden_size: int = 64,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    intermediate_size: int = 128,
    context_length: int = 2048,
    seed: int = 0,
    chat_template: ChatTemplateWhere = "config",
    tie_word_embeddings: bool = True,
    quantize: bool = False,
    dtype: str = "float32",
    agent: bool = False,
) -> Path:
    """Write a tiny random llama model in the MLX format into ``out_dir`` and return it.

    ``chat_template``: ``"config"`` puts the ChatML template in tokenizer_config.json,
    ``"jinja"`` in a separate chat_template.jinja, ``None`` leaves the model without one.
    ``quantize``: 4-bit affine group 32 for the linears and 8-bit for the embedding (a
    per-module override in config.json's ``quantization``, like the embedded SmolLM2).
    ``dtype``: the weights' dtype (``"float32"``, ``"float16"`` or ``"bfloat16"``; quantized
    weights then have scales and biases of that dtype, like a GGUF import's float16 ones).
    ``hidden_size`` and ``intermediate_size`` must be multiples of 32
    when quantizing. ``agent``: the vocabulary also has think and tool-call markers and the
    chat template is the agent layout (``tests.support.models.synthetic_agent``) instead of ChatML.
    Deterministic for a given set of arguments.
    """
    from tests.support.models.synthetic_agent import AGENT_TEMPLATE, AGENT_TOKENS

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok = _build_tokenizer(AGENT_TOKENS if agent else ())
    vocab_size = tok.get_vocab_size(with_added_tokens=True)
    config = _model_config(
        vocab_size=vocab_size,
        n_layers=n_layers,
        hidden_size=hidden_size,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        intermediate_size=intermediate_size,
        context_length=context_length,
        tie_word_embeddings=tie_word_embeddings,
    )
    weights, quantization = _weights(config, seed=seed, dtype=dtype, quantize=quantize)
    if quantization is not None:
        config["quantization"] = quantization
        config["quantization_config"] = config["quantization"]
    mx.save_safetensors(str(out_dir / "model.safetensors"), weights, metadata={"format": "mlx"})
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    write_tokenizer_files(out_dir, tok, context_length, chat_template, AGENT_TEMPLATE if agent else CHATML_TEMPLATE)
    return out_dir
