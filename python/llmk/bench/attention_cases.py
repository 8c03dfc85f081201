"""Benchmark cases of the attention forward: FlashAttention 2's protocol. 16k tokens per
batch (batch = 16384 / seqlen), hidden 2048 (heads = 2048 / head_dim), bf16, q/k/v
[batch, seq, heads, head_dim] contiguous; `tokens` is the sequence length and `hidden` the
head dim. Peers: torch.nn.functional.scaled_dot_product_attention on the same tensors
(transposed views, PyTorch's [batch, heads, seq, dim]) with each backend pinned through
torch.nn.attention.sdpa_kernel: flash (FlashAttention 2), cudnn, efficient (xformers'
memory-efficient kernel). FLOPs: 4 * batch * heads * seq^2 * head_dim, halved when causal.
The error column compares the last 256 query rows of head 0 with a float64 reference."""

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import llmk

TOKENS_PER_BATCH = 16384
HIDDEN = 2048
SEQLENS = [512, 1024, 2048, 4096, 8192, 16384]
HEAD_DIMS = [64, 128]
PEERS = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
         "efficient": SDPBackend.EFFICIENT_ATTENTION}
CHECK_ROWS = 256


def _sdpa(backend, causal):
    def run(q, k, v):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                  is_causal=causal).transpose(1, 2)
    return run


def _works(fn, sample):
    try:
        fn(*sample)
        torch.cuda.synchronize()
        return True
    except RuntimeError:
        return False


def attention_case(causal):
    def case(seqlen, head_dim, dtype):
        batch, heads = TOKENS_PER_BATCH // seqlen, HIDDEN // head_dim
        elt = torch.tensor([], dtype=dtype).element_size()
        flops = 4 * batch * heads * seqlen * seqlen * head_dim // (2 if causal else 1)

        def make():
            return tuple(torch.randn(batch, seqlen, heads, head_dim, device="cuda", dtype=dtype) for _ in range(3))

        sample = make()
        impls = {"llmk": lambda q, k, v: llmk.attention(q, k, v, causal=causal)}
        for name, backend in PEERS.items():
            fn = _sdpa(backend, causal)
            if _works(fn, sample):
                impls[name] = fn
        del sample

        def reference(q, k, v):
            rows = slice(seqlen - CHECK_ROWS, seqlen)
            qd, kd, vd = q[0, rows, 0].double(), k[0, :, 0].double(), v[0, :, 0].double()
            s = qd @ kd.T / head_dim**0.5
            if causal:  # row i of the square sees keys j <= i
                i = torch.arange(seqlen - CHECK_ROWS, seqlen, device=q.device)[:, None]
                s = s.masked_fill(torch.arange(seqlen, device=q.device)[None, :] > i, float("-inf"))
            return torch.softmax(s, -1) @ vd, lambda out: out[0, rows, 0]

        return 4 * batch * seqlen * heads * head_dim * elt, make, impls, reference, flops

    return case


OPS = {"attention": attention_case(False), "attention_causal": attention_case(True)}
SWEEPS = {op: (SEQLENS, HEAD_DIMS) for op in OPS}
