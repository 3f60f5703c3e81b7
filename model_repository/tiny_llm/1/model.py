"""tiny_llm: a small decoder-only transformer with random weights, seeded by its config
(nothing downloaded, no weight file), over a byte-level tokenizer (tokenizer.json).

``TinyLlm`` is the generative model shoal's engine drives (config parameter
``generative_model: "TinyLlm"``): paged attention over the engine's KV-cache blocks,
the decode step batched across sequences. ``TinyLlm.generate`` is the model's own
generation loop (a private cache, one sequence, greedy). ``TritonPythonModel`` serves
that loop as a plain decoupled Python model, one request at a time (the config without
``generative_model``): the request-level baseline of bench/run_llm.py.

Parameters (strings): seed, d_model, layers, heads, max_positions, dtype ("float32" or
"float64"), torch_threads; tensor_parallel_rank and tensor_parallel_size (shoal's engine
sets them for each rank of a tensor-parallel instance: the heads and the MLP are split
over the ranks, their outputs summed with torch.distributed's all-reduce).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

VOCAB, BOS, EOS = 258, 256, 257


def _param(params: dict[str, Any], key: str, default: str) -> str:
    value = params.get(key, default)
    if isinstance(value, dict):  # (Triton's JSON form: {"string_value": ...})
        value = value.get("string_value", default)
    return str(value)


class _Layer(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, d // heads
        self.sharded = False  # (tensor parallelism: its outputs are summed over ranks)
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def split(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)
        shape = (x.shape[0], self.heads, self.head_dim)
        return q.reshape(shape), k.reshape(shape), v.reshape(shape)

    def finish(self, x: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        x = x + self._reduced(self.out(attended.reshape(x.shape[0], -1)))
        return x + self._reduced(self.mlp(self.ln2(x)))

    def _reduced(self, partial: torch.Tensor) -> torch.Tensor:
        if self.sharded:
            torch.distributed.all_reduce(partial)
        return partial

    def shard(self, rank: int, size: int) -> None:
        """Keep this rank's heads and MLP slice (Megatron-style: the first linear of each
        pair split by rows, the second by columns, its bias on rank 0 alone)."""
        d = self.qkv.in_features
        part = d // size
        mine = torch.arange(rank * part, (rank + 1) * part)
        self.qkv = _rows(self.qkv, torch.cat([mine, mine + d, mine + 2 * d]))
        self.out = _columns(self.out, mine, rank == 0)
        hidden = self.mlp[0].out_features // size
        cols = torch.arange(rank * hidden, (rank + 1) * hidden)
        self.mlp[0] = _rows(self.mlp[0], cols)
        self.mlp[2] = _columns(self.mlp[2], cols, rank == 0)
        self.heads //= size
        self.sharded = True


def _rows(linear: nn.Linear, rows: torch.Tensor) -> nn.Linear:
    out = nn.Linear(linear.in_features, len(rows))
    with torch.no_grad():
        out.weight.copy_(linear.weight[rows])
        out.bias.copy_(linear.bias[rows])
    return out


def _columns(linear: nn.Linear, cols: torch.Tensor, bias: bool) -> nn.Linear:
    out = nn.Linear(len(cols), linear.out_features, bias=bias)
    with torch.no_grad():
        out.weight.copy_(linear.weight[:, cols])
        if bias:
            out.bias.copy_(linear.bias)
    return out


class TinyLlm(nn.Module):
    def __init__(self, params: dict[str, Any], device: str = "cpu") -> None:
        super().__init__()
        threads = int(_param(params, "torch_threads", "0"))
        if threads > 0:
            torch.set_num_threads(threads)
        d = int(_param(params, "d_model", "64"))
        self.heads = int(_param(params, "heads", "4"))
        self.max_positions = int(_param(params, "max_positions", "1024"))
        self.dtype = getattr(torch, _param(params, "dtype", "float32"))
        self.eos_token_id = EOS
        self.embed = nn.Embedding(VOCAB, d)
        self.pos = nn.Embedding(self.max_positions, d)
        self.layers = nn.ModuleList(
            _Layer(d, self.heads) for _ in range(int(_param(params, "layers", "2")))
        )
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, VOCAB, bias=False)
        # Printable ASCII and newlines, now and then the end: what a random model says.
        bias = torch.full((VOCAB,), -30.0)
        bias[32:127] = 0.0
        bias[10] = -1.0
        bias[EOS] = -2.0
        self.register_buffer("bias", bias)
        self._seed(int(_param(params, "seed", "0")))
        size = int(_param(params, "tensor_parallel_size", "1"))
        if size > 1:
            if self.heads % size:
                raise ValueError(f"heads ({self.heads}) must divide by tensor_parallel_size")
            rank = int(_param(params, "tensor_parallel_rank", "0"))
            for layer in self.layers:
                layer.shard(rank, size)
        self.to(device=device, dtype=self.dtype).eval()
        self.device = device

    def _seed(self, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        for name, p in self.named_parameters():
            with torch.no_grad():
                if ".ln" in name or name.startswith("ln_"):
                    continue  # (LayerNorm starts at ones and zeros)
                if name.endswith("bias"):
                    p.zero_()
                    continue
                std = {"embed.weight": 1.0, "pos.weight": 1.0, "head.weight": 0.5}.get(
                    name, 1 / math.sqrt(p.shape[-1])
                )
                p.copy_(torch.randn(p.shape, generator=g) * std)

    # -- shoal's generative-model interface ---------------------------------------------

    def kv_layout(self) -> Any:
        from shoal.workers.generative.interface import KvLayout

        first = self.layers[0]
        return KvLayout(len(self.layers), first.heads, first.head_dim, self.dtype)

    def decode_step(self, batch: Any, kv: Any) -> torch.Tensor:
        """Every sequence's one new token, batched: paged attention over the sequences'
        cache slots, padded to the longest and the padding masked out."""
        b, n = kv.block_size, len(batch)
        starts = torch.tensor(batch.starts, device=self.device)
        width = int(starts.max()) + 1
        blocks = -(-width // b)
        tables = torch.tensor(
            [t[:blocks] + [0] * (blocks - len(t[:blocks])) for t in batch.block_tables],
            device=self.device,
        )
        pos = torch.arange(width, device=self.device)
        slots = (tables[:, pos // b] * b + pos % b).reshape(-1)  # [n * width]
        new = tables.gather(1, (starts // b)[:, None])[:, 0] * b + starts % b  # [n]
        seen = (pos[None, :] <= starts[:, None])[:, None, None, :]  # [n, 1, 1, width]
        x = self.embed(torch.tensor([t[0] for t in batch.tokens], device=self.device))
        x = x + self.pos(starts)
        for li, layer in enumerate(self.layers):
            q, k, v = layer.split(x)
            keys, values = self._cached(kv, li, new, k, v, slots)
            keys, values = keys.view(n, width, *k.shape[1:]), values.view(n, width, *k.shape[1:])
            attended = F.scaled_dot_product_attention(
                q[:, :, None, :], keys.transpose(1, 2), values.transpose(1, 2), attn_mask=seen
            )  # [n, h, 1, dh]
            x = layer.finish(x, attended[:, :, 0, :])
        return self._logits(x)

    @staticmethod
    def _cached(
        kv: Any,
        layer: int,
        new: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        slots: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the new tokens' K and V at their slots; read K and V at ``slots``."""
        flat_k = kv.k[layer].view(-1, *k.shape[1:])
        flat_v = kv.v[layer].view(-1, *v.shape[1:])
        flat_k.index_copy_(0, new, k)
        flat_v.index_copy_(0, new, v)
        return flat_k.index_select(0, slots), flat_v.index_select(0, slots)

    def prefill(self, batch: Any, kv: Any) -> torch.Tensor:
        """Each sequence's chunk in turn, causal over its whole context."""
        rows = [
            self._chunk(tokens, start, table, kv)
            for tokens, start, table in zip(
                batch.tokens, batch.starts, batch.block_tables, strict=True
            )
        ]
        return torch.stack(rows)

    def _chunk(self, tokens: list[int], start: int, table: list[int], kv: Any) -> torch.Tensor:
        b, end = kv.block_size, start + len(tokens)
        pos = torch.arange(end, device=self.device)
        slots = torch.tensor(table, device=self.device)[pos // b] * b + pos % b
        new = pos[start:]
        x = self.embed(torch.tensor(tokens, device=self.device)) + self.pos(new)
        seen = pos[None, :] <= new[:, None]  # [t, end]: causal
        for li, layer in enumerate(self.layers):
            q, k, v = layer.split(x)
            keys, values = self._cached(kv, li, slots[start:], k, v, slots)  # [end, h, dh]
            attended = F.scaled_dot_product_attention(
                q.transpose(0, 1), keys.transpose(0, 1), values.transpose(0, 1), attn_mask=seen
            )  # [h, t, dh]
            x = layer.finish(x, attended.transpose(0, 1))
        return self._logits(x[-1:])[0]

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.ln_f(x)) + self.bias

    # -- the model's own loop -----------------------------------------------------------

    def generate(self, prompt: list[int], max_tokens: int, ignore_eos: bool = False) -> Any:
        """Greedy tokens for one prompt, one by one, on a private cache."""
        from shoal.workers.generative.interface import KvCache, StepBatch

        block = 16
        total = min(len(prompt) + max_tokens, self.max_positions)
        table = list(range(-(-total // block)))
        kv = KvCache.allocate(self.kv_layout(), len(table), block, self.device)
        step, start = prompt, 0
        with torch.inference_mode():
            for _ in range(total - len(prompt)):
                batch = StepBatch([step], [start], [table])
                logits = (self.prefill if len(step) > 1 else self.decode_step)(batch, kv)
                token = int(logits[0].argmax())
                yield token
                if token == EOS and not ignore_eos:
                    return
                start, step = start + len(step), [token]


def tokenizer_path(model_dir: Path, version: str, name: str) -> Path:
    """The tokenizer file, beside the version's files or else in the model's folder."""
    here = model_dir / version / name
    return here if here.exists() else model_dir / name


class TritonPythonModel:
    """Request-level serving of ``TinyLlm.generate`` (greedy), the vLLM backend's inputs
    and outputs (text_input, stream, sampling_parameters' max_tokens and ignore_eos,
    exclude_input_in_output; text_output)."""

    def initialize(self, args: dict[str, Any]) -> None:
        import triton_python_backend_utils as pb_utils
        from tokenizers import Tokenizer

        self.pb = pb_utils
        config = json.loads(args["model_config"])
        params = config.get("parameters", {})
        gpu = args.get("model_instance_kind") == "GPU"
        device = f"cuda:{args.get('model_instance_device_id', '0')}" if gpu else "cpu"
        self.model = TinyLlm(params, device)
        folder = Path(args["model_repository"])
        name = _param(params, "tokenizer", "tokenizer.json")
        self.tokenizer = Tokenizer.from_file(
            str(tokenizer_path(folder, args["model_version"], name))
        )

    def execute(self, requests: list[Any]) -> None:
        for request in requests:
            self._generate(request)

    def _input(self, request: Any, name: str, default: Any) -> Any:
        tensor = self.pb.get_input_tensor_by_name(request, name)
        return default if tensor is None else tensor.as_numpy().reshape(-1)[0]

    def _generate(self, request: Any) -> None:
        sender = request.get_response_sender()
        prompt = self._input(request, "text_input", b"").decode()
        stream = bool(self._input(request, "stream", False))
        exclude = bool(self._input(request, "exclude_input_in_output", False))
        sampling = json.loads(self._input(request, "sampling_parameters", b"{}") or b"{}")
        ids = self.tokenizer.encode(prompt).ids
        outs: list[int] = []
        sent = ""
        for token in self.model.generate(
            ids, int(sampling.get("max_tokens", 16)), bool(sampling.get("ignore_eos", False))
        ):
            outs.append(token)
            text = self.tokenizer.decode(outs)
            if stream and not text.endswith("\ufffd") and len(text) > len(sent):
                sender.send(self._response(text[len(sent) :]))
                sent = text
            if sender.is_cancelled():
                break
        text = self.tokenizer.decode(outs)
        if stream:
            sender.send(
                self._response(text[len(sent) :]), self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL
            )
        else:
            full = text if exclude else prompt + text
            sender.send(self._response(full), self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def _response(self, text: str) -> Any:
        out = self.pb.Tensor("text_output", np.array([text.encode()], dtype=np.object_))
        return self.pb.InferenceResponse(output_tensors=[out])
