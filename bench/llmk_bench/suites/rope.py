"""Benchmark cases of RoPE and their peers, all bf16, on q and k as head slices of one
fused qkv projection [tokens, (heads_q + 2 heads_kv) * head_dim] (vLLM's layout). llmk
rotates in place (one launch for q and k); the peers are vLLM's native PyTorch rotary
(gather cos/sin by position, rotate halves, write new q and k) in eager mode and under
torch.compile (per shape, dynamic=False). `hidden` names the attention config: 4096 is
Llama-3-8B (32 q heads, 8 kv heads of 128), 896 Qwen2-0.5B (14 / 2 of 64). Bytes count the
rotated q and k read and written once; the cos/sin rows (rot_dim floats per token) and the
positions add ~3% and are not counted. The backward (llmk.rope_backward_) applies the inverse
rotation in place to the gradients. rope_train is the functional, differentiable form as a
training step runs it: llmk.rope (new q and k) and its backward through autograd on separate
[tokens, heads, dim] q and k, against the peers' autograd. Liger-Kernel (``liger``, where it
imports: liger_peers.py) takes q and k as [1, heads, tokens, dim] views with Hugging Face's
per-token cos/sin (gathered once per position set, as a model does once per forward). Each
case is case(tokens, hidden, dtype, device) -> (bytes moved, make, impls, reference)."""

import torch

import llmk
from .. import liger_peers

CONFIGS = {4096: (32, 8, 128), 896: (14, 2, 64)}
TOKENS = [1, 16, 2048, 8192]
MAX_POSITION = 16384
THETA = 500000.0


def _split(qkv, heads_q, heads_kv, dim):
    tokens = qkv.shape[0]
    q = qkv[:, : heads_q * dim].view(tokens, heads_q, dim)
    k = qkv[:, heads_q * dim: (heads_q + heads_kv) * dim].view(tokens, heads_kv, dim)
    return q, k


def _rotate(x, cos, sin):
    """vLLM's _apply_rotary_emb_torch (NeoX style) on [tokens, heads, dim] with [tokens, dim/2] cos/sin."""
    cos, sin = cos[:, None, :].to(x.dtype), sin[:, None, :].to(x.dtype)
    x1, x2 = torch.chunk(x, 2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def torch_rope_cache(q, k, positions, cache):
    cos, sin = cache.index_select(0, positions).chunk(2, dim=-1)
    return _rotate(q, cos, sin), _rotate(k, cos, sin)


def torch_rope_theta(q, k, positions):
    """Hugging Face's LlamaRotaryEmbedding: inv_freq and the angles recomputed per call in fp32."""
    dim = q.shape[-1]
    inv_freq = 1.0 / THETA ** (torch.arange(0, dim, 2, device=q.device, dtype=torch.float32) / dim)
    angles = positions.float()[:, None] * inv_freq[None, :]
    return _rotate(q, angles.cos(), angles.sin()), _rotate(k, angles.cos(), angles.sin())


def _reference(q, positions, inv_freq):
    angles = positions.double()[:, None, None] * inv_freq.double()
    x1, x2 = q.double().chunk(2, dim=-1)
    return torch.cat((x1 * angles.cos() - x2 * angles.sin(), x2 * angles.cos() + x1 * angles.sin()), dim=-1)


def _two_output_grad(forward):
    """The backward of forward(q, k, positions) -> (q_out, k_out) alone: the graph is built
    once per input set; the timed call is autograd.grad through it."""
    graphs = {}

    def run(q, k, positions, dq, dk):
        key = (q.data_ptr(), k.data_ptr())
        if key not in graphs:
            leaves = [q.detach().requires_grad_(), k.detach().requires_grad_()]
            graphs[key] = (forward(*leaves, positions), leaves)
        outs, leaves = graphs[key]
        return torch.autograd.grad(outs, leaves, (dq, dk), retain_graph=True)

    return run


def _liger_rope(cache):
    """Liger's RoPE on [tokens, heads, dim] q and k (head slices or whole tensors), or None."""
    rope = liger_peers.rope()
    if rope is None:
        return None
    cos_sin = {}

    def run(q, k, positions):
        key = positions.data_ptr()
        if key not in cos_sin:
            cos, sin = cache.index_select(0, positions).chunk(2, dim=-1)
            cos_sin[key] = tuple(torch.cat((t, t), dim=-1)[None].to(q.dtype) for t in (cos, sin))
        q_out, k_out = rope(q[None].transpose(1, 2), k[None].transpose(1, 2), *cos_sin[key])
        return q_out[0].transpose(0, 1), k_out[0].transpose(0, 1)

    return run


def rope_case(source, backward=False):
    """rope (cache), rope_theta (angles from theta) or rope_backward (cache, inverse rotation)."""
    def case(tokens, hidden, dtype, device):
        heads_q, heads_kv, dim = CONFIGS[hidden]
        elt = torch.tensor([], dtype=dtype).element_size()
        cache = llmk.rope_cos_sin_cache(MAX_POSITION, dim, THETA, device=device) if source == "cache" else None
        inv_freq = 1.0 / THETA ** (torch.arange(0, dim, 2, device=device, dtype=torch.float64) / dim)
        if source == "cache":
            def peer(q, k, positions):
                return torch_rope_cache(q, k, positions, cache)
        else:
            peer = torch_rope_theta
        compiled = torch.compile(peer, dynamic=False)

        def make():
            qkv = torch.randn(tokens, (heads_q + 2 * heads_kv) * dim, device=device, dtype=dtype)
            return qkv, torch.randint(0, MAX_POSITION, (tokens,), device=device)

        rotate = llmk.rope_backward_ if backward else llmk.rope_
        angles = {} if cache is not None else {"theta": THETA}  # the cache holds the angles: theta only without it

        def ours(qkv, positions):  # qkv holds q and k, or their gradients (backward)
            q, k = _split(qkv, heads_q, heads_kv, dim)
            rotate(q, k, positions, cache, **angles)
            return q

        if backward:  # the gradient of the fused qkv's q and k slices; the peers' saved inputs are qkv's
            eager_grad, compile_grad = _two_output_grad(peer), _two_output_grad(compiled)

            def peer_impl(grad):
                return lambda dqkv, positions: grad(*_split(dqkv, heads_q, heads_kv, dim), positions,
                                                    *_split(dqkv, heads_q, heads_kv, dim))

            impls = {"llmk": ours, "eager": peer_impl(eager_grad), "compile": peer_impl(compile_grad)}
        else:
            impls = {"llmk": ours,
                     "eager": lambda qkv, positions: peer(*_split(qkv, heads_q, heads_kv, dim), positions),
                     "compile": lambda qkv, positions: compiled(*_split(qkv, heads_q, heads_kv, dim), positions)}
            liger = _liger_rope(cache) if cache is not None else None
            if liger is not None:
                impls["liger"] = lambda qkv, positions: liger(*_split(qkv, heads_q, heads_kv, dim), positions)

        def reference(qkv, positions):
            q, _ = _split(qkv, heads_q, heads_kv, dim)
            return _reference(q, positions, -inv_freq if backward else inv_freq)

        return 2 * tokens * (heads_q + heads_kv) * dim * elt, make, impls, reference

    return case


def rope_train_case(tokens, hidden, dtype, device):
    """The functional rope's forward and backward through autograd (cos/sin cache)."""
    heads_q, heads_kv, dim = CONFIGS[hidden]
    elt = torch.tensor([], dtype=dtype).element_size()
    cache = llmk.rope_cos_sin_cache(MAX_POSITION, dim, THETA, device=device)
    inv_freq = 1.0 / THETA ** (torch.arange(0, dim, 2, device=device, dtype=torch.float64) / dim)

    def make():
        q, k, dq, dk = (torch.randn(tokens, h, dim, device=device, dtype=dtype)
                        for h in (heads_q, heads_kv, heads_q, heads_kv))
        return q, k, torch.randint(0, MAX_POSITION, (tokens,), device=device), dq, dk

    def train(forward):
        def run(q, k, positions, dq, dk):
            leaves = [q.detach().requires_grad_(), k.detach().requires_grad_()]
            return torch.autograd.grad(forward(*leaves, positions), leaves, (dq, dk))

        return run

    def peer(q, k, positions):
        return torch_rope_cache(q, k, positions, cache)

    impls = {"llmk": train(lambda q, k, positions: llmk.rope(q, k, positions, cache)),
             "eager": train(peer), "compile": train(torch.compile(peer, dynamic=False))}
    liger = _liger_rope(cache)
    liger_peers.add(impls, "liger", liger and train(liger))

    def reference(q, k, positions, dq, dk):
        return _reference(dq, positions, -inv_freq)

    return 4 * tokens * (heads_q + heads_kv) * dim * elt, make, impls, reference


OPS = {
    "rope": rope_case("cache"),
    "rope_theta": rope_case("theta"),
    "rope_backward": rope_case("cache", backward=True),
    "rope_train": rope_train_case,
}
SWEEPS = {op: (TOKENS, list(CONFIGS)) for op in OPS}
CPU_SWEEPS = {op: ([1, 64], list(CONFIGS)) for op in OPS}  # without a GPU: the CPU backend at small shapes
