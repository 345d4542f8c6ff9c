"""Test helpers: a tiny llama GGUF, an Ollama models dir and an LM Studio models dir laid out as
those programs leave them (docs/models.md#model-stores), and a snapshot of a tree to prove a
node never wrote into one."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _byte_alphabet() -> list[str]:
    """GPT-2's byte -> printable character table (the alphabet of byte-level BPE)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    out, extra = [], 0
    for b in range(256):
        if b in keep:
            out.append(chr(b))
        else:
            out.append(chr(256 + extra))
            extra += 1
    return out


def tiny_gguf(path: Path, *, seed: int = 0, architecture: str = "llama", tokenizer_model: str = "gpt2") -> Path:
    """A 2-layer untied llama GGUF (float16 weights, 260-token byte-level BPE vocabulary, a
    ChatML template) at ``path``, written by MLX's GGUF writer; its bytes depend on ``seed`` only."""
    import mlx.core as mx

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tokens = specials + _byte_alphabet() + ["Ġt"]
    hidden, ffn, vocab, kv = 64, 128, len(tokens), 2
    rng = np.random.default_rng(seed)

    def w(*shape: int) -> mx.array:
        return mx.array((rng.standard_normal(shape) * 0.05).astype(np.float16))

    tensors = {"token_embd.weight": w(vocab, hidden), "output.weight": w(vocab, hidden),
               "output_norm.weight": mx.ones((hidden,))}
    for i in range(2):
        tensors.update({
            f"blk.{i}.attn_norm.weight": mx.ones((hidden,)), f"blk.{i}.ffn_norm.weight": mx.ones((hidden,)),
            f"blk.{i}.attn_q.weight": w(hidden, hidden), f"blk.{i}.attn_k.weight": w(kv * 16, hidden),
            f"blk.{i}.attn_v.weight": w(kv * 16, hidden), f"blk.{i}.attn_output.weight": w(hidden, hidden),
            f"blk.{i}.ffn_gate.weight": w(ffn, hidden), f"blk.{i}.ffn_up.weight": w(ffn, hidden),
            f"blk.{i}.ffn_down.weight": w(hidden, ffn),
        })
    u32 = lambda v: mx.array(v, dtype=mx.uint32)  # noqa: E731
    metadata = {
        "general.architecture": architecture,
        f"{architecture}.embedding_length": u32(hidden), f"{architecture}.block_count": u32(2),
        f"{architecture}.feed_forward_length": u32(ffn), f"{architecture}.attention.head_count": u32(4),
        f"{architecture}.attention.head_count_kv": u32(kv), f"{architecture}.context_length": u32(512),
        f"{architecture}.attention.layer_norm_rms_epsilon": mx.array(1e-5),
        "tokenizer.ggml.model": tokenizer_model, "tokenizer.ggml.pre": "gpt-2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": mx.array([3] * 3 + [1] * (vocab - 3), dtype=mx.int32),
        "tokenizer.ggml.merges": ["Ġ t"], "tokenizer.ggml.eos_token_id": u32(2),
        "tokenizer.chat_template": CHATML,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    mx.save_gguf(str(path), tensors, metadata)
    return path


def _blob(root: Path, data: bytes) -> dict:
    """Store ``data`` as an Ollama blob under ``root``; its layer entry (without media type)."""
    digest = hashlib.sha256(data).hexdigest()
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    (root / "blobs" / f"sha256-{digest}").write_bytes(data)
    return {"digest": f"sha256:{digest}", "size": len(data)}


def ollama_model(root: Path, gguf: Path | None, name: str = "tiny", tag: str = "latest", *,
                 namespace: str = "library", host: str = "registry.ollama.ai", extra_layers: tuple = ()) -> Path:
    """An Ollama model as ``ollama pull`` leaves it under the models dir ``root``: the GGUF
    (None: no model layer) and a template, params and license layer as blobs, and the manifest
    at ``manifests/<host>/<namespace>/<name>/<tag>``, returned. ``extra_layers``: more
    ``(media type, bytes)`` layers."""
    layers = []
    if gguf is not None:
        data = gguf.read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        (root / "blobs").mkdir(parents=True, exist_ok=True)
        blob = root / "blobs" / f"sha256-{digest}"
        if not blob.exists():
            shutil.copyfile(gguf, blob)
        layers.append({"mediaType": "application/vnd.ollama.image.model", "digest": f"sha256:{digest}", "size": len(data)})
    for media, data in (("application/vnd.ollama.image.template", b"{{ .Prompt }}"),
                        ("application/vnd.ollama.image.params", b'{"stop": ["<|im_end|>"]}'),
                        ("application/vnd.ollama.image.license", b"MIT"), *extra_layers):
        layers.append({"mediaType": media, **_blob(root, data)})
    config = _blob(root, b'{"model_format": "gguf", "model_family": "llama"}')
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
                "config": {"mediaType": "application/vnd.docker.container.image.v1+json", **config},
                "layers": layers}
    path = root / "manifests" / host / namespace / name / tag
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest))
    return path


def tree_snapshot(root: Path) -> dict[str, tuple]:
    """Every entry under ``root`` (relative path -> kind, size, mtime in ns, mode): equal
    before and after means nothing was written, added, removed or chmod-ed there."""
    out = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        out[path.relative_to(root).as_posix()] = (path.is_dir(), st.st_size, st.st_mtime_ns, st.st_mode)
    return out
