"""Benchmark cases of the attention forward: FlashAttention 2's protocol. 16k tokens per
batch (batch = 16384 / seqlen), hidden 2048 (heads = 2048 / head_dim), bf16, q/k/v
[batch, seq, heads, head_dim] contiguous; `tokens` is the sequence length and `hidden` the
head dim. Peers: torch.nn.functional.scaled_dot_product_attention on the same tensors
(transposed views, PyTorch's [batch, heads, seq, dim]) with each backend pinned through
torch.nn.attention.sdpa_kernel: flash (FlashAttention 2), cudnn, efficient (xformers'
memory-efficient kernel). FLOPs: 4 * batch * heads * seq^2 * head_dim, halved when causal.
The error column compares the last 256 query rows of head 0 with a float64 reference.

llmk's impls: ``llmk`` is the default dispatch (LLMK_ATTENTION_PATH=auto: the Hopper TMA +
wgmma kernel where it takes the call, the sm_80 mma.sync kernel otherwise); ``llmk_sm80`` is
the same call with LLMK_ATTENTION_PATH=sm80 set around it (the library reads the variable on
every call, so a CUDA graph captures the sm_80 kernel). llmk_sm80 runs only where the Hopper
kernel takes the case (probed once per case with LLMK_ATTENTION_PATH=sm90); elsewhere llmk
is the sm_80 kernel already, and the reason is printed once.

Runtime: every impl costs about 160 calls per case (warm-up, capture, 7 replays of 20), and
a case's time grows with its seqlen (16k tokens each); the default sweep (2 ops x 6 seqlens x
3 head dims, 5 impls with llmk_sm80) is estimated at about a minute and a half of timing on
the H100, most of it at seqlen 16384 and in the slowest peer (efficient).
Ops attention_gqa / attention_gqa_causal: one sequence of 4k-32k tokens, 32 query heads over
8 KV heads, head dim 128 (Llama-3-8B's attention), the SDPA peers with enable_gqa=True.
Trim with the harness's --tokens / --hidden, or pick the peers with
LLMK_BENCH_ATTENTION_PEERS (comma-separated, of llmk_sm80 flash cudnn efficient; llmk always
runs).

The backward (ops attention_backward, attention_backward_causal; FlashAttention 2's protocol:
the same 16k tokens x hidden 2048, head dims 64, 128 and 256): each input set holds q, k, v,
dout and the llmk forward's out and lse; ``llmk`` is llmk.attention_backward (dq by fp32
atomics; the Hopper main kernel where it takes the call), ``llmk_sm80`` the same on the sm_80
kernels (as the forward's), ``llmk_deterministic`` the default path with deterministic=True (dq
from its own kernel); the peers are autograd through SDPA with the backend pinned (flash,
cudnn), the forward graph built once per input set and only torch.autograd.grad timed. FLOPs: 2.5x the forward's (5 GEMMs), halved when
causal; bytes: q, k, v, out, dout read and dq, dk, dv written. The error column compares dq of
the last 256 query rows of head 0 with a float64 reference. Peers picked by
LLMK_BENCH_ATTENTION_PEERS as the forward's (of llmk_sm80 flash cudnn efficient llmk_deterministic).
Ops attention_train, attention_train_causal: one training step's attention, the forward and
the backward through autograd timed together (llmk.attention, also with deterministic=True,
against SDPA with flash or cudnn pinned) on the backward's shapes; FLOPs 3.5x the forward's;
the error column is dq's, as the backward's.

Without a GPU (the CPU backend): one batch of `seqlen` tokens, hidden 256; the SDPA backends
that do not run on the CPU (cudnn, efficient) are skipped with a note, and so is llmk_sm80.
Each case is case(seqlen, head_dim, dtype, device) -> (bytes moved, make, impls, reference,
flops)."""

import os

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import llmk
from .. import timing
from .activation import grad_peer

TOKENS_PER_BATCH = 16384
HIDDEN = {"cuda": 2048, "cpu": 256}
SEQLENS = [512, 1024, 2048, 4096, 8192, 16384]
HEAD_DIMS = [64, 128, 256]
PEERS = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
         "efficient": SDPBackend.EFFICIENT_ATTENTION}
CHECK_ROWS = 256
PATH_VARIABLE = "LLMK_ATTENTION_PATH"
PEERS_VARIABLE = "LLMK_BENCH_ATTENTION_PEERS"
_SKIPPED = set()  # (peer, device, op family) already reported as not running
_NOTED = set()  # reasons already printed for leaving llmk_sm80 out


def _on_path(path, fn):
    """fn with LLMK_ATTENTION_PATH = path around each call (the previous value restored after)."""
    return timing.with_env(PATH_VARIABLE, path, fn)


def _sm90_declines(fn, sample):
    """None when the Hopper kernel takes fn's call on `sample`, else its reason."""
    try:
        _on_path("sm90", fn)(*sample)
        torch.cuda.synchronize()
        return None
    except RuntimeError as e:
        if "cannot take this call" in str(e):
            return str(e)
        raise


def _add_sm80(impls, sample, device, what, seqlen, head_dim):
    """impls["llmk_sm80"]: impls["llmk"] on the sm_80 kernels, where the Hopper kernel takes the
    case (else llmk is the sm_80 kernel already: the reason is printed once)."""
    if device != "cuda" or not _wanted("llmk_sm80"):
        return
    why = _sm90_declines(impls["llmk"], sample)
    if why is None:
        impls["llmk_sm80"] = _on_path("sm80", impls["llmk"])
    elif why not in _NOTED:
        _NOTED.add(why)
        print(f"{what}: llmk_sm80 left out where llmk is the sm_80 kernel already ({seqlen} x {head_dim}"
              f" and others): {why}")


def _wanted(name):
    names = [n.strip() for n in os.environ.get(PEERS_VARIABLE, "").split(",") if n.strip()]
    return not names or name in names


def _sdpa(backend, causal, gqa=False):
    def run(q, k, v):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                  is_causal=causal, enable_gqa=gqa).transpose(1, 2)
    return run


def _works(fn, sample):
    try:
        fn(*sample)
        if sample[0].is_cuda:
            torch.cuda.synchronize()
        return True
    except RuntimeError:
        return False


def _geometry(seqlen, head_dim, dtype, device, causal):
    """(batch, heads, rows checked, element bytes, forward FLOPs) of a case: 16k tokens (one batch
    entry on the CPU), the hidden size over the head dim; 4 * batch * heads * seq^2 * D FLOPs,
    halved when causal."""
    batch = TOKENS_PER_BATCH // seqlen if device == "cuda" else 1
    heads = HIDDEN[device] // head_dim
    flops = 4 * batch * heads * seqlen * seqlen * head_dim // (2 if causal else 1)
    return batch, heads, min(CHECK_ROWS, seqlen), torch.tensor([], dtype=dtype).element_size(), flops


def _scores(qd, kd, seqlen, causal):
    """float64 scores of the last rows of a seqlen x seqlen problem, qd . kd^T / sqrt(head dim),
    -inf above the causal diagonal (row i sees keys j <= i): the references' first step."""
    s = qd @ kd.T / qd.shape[-1]**0.5
    if causal:
        i = torch.arange(seqlen - qd.shape[0], seqlen, device=qd.device)[:, None]
        s = s.masked_fill(torch.arange(seqlen, device=qd.device)[None, :] > i, float("-inf"))
    return s


def attention_case(causal):
    def case(seqlen, head_dim, dtype, device):
        batch, heads, check_rows, elt, flops = _geometry(seqlen, head_dim, dtype, device, causal)

        def make():
            return tuple(torch.randn(batch, seqlen, heads, head_dim, device=device, dtype=dtype) for _ in range(3))

        sample = make()
        impls = {"llmk": lambda q, k, v: llmk.attention(q, k, v, causal=causal)}
        _add_sm80(impls, sample, device, "attention", seqlen, head_dim)
        _peers(impls, PEERS, causal, sample, device, "attention")
        del sample

        def reference(q, k, v):
            rows = slice(seqlen - check_rows, seqlen)
            qd, kd, vd = q[0, rows, 0].double(), k[0, :, 0].double(), v[0, :, 0].double()
            s = _scores(qd, kd, seqlen, causal)
            return torch.softmax(s, -1) @ vd, lambda out: out[0, rows, 0]

        return 4 * batch * seqlen * heads * head_dim * elt, make, impls, reference, flops

    return case


BACKWARD_HEAD_DIMS = [64, 128, 256]
BACKWARD_PEERS = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}


def _peers(impls, peers, causal, sample, device, what, wrap=lambda fn: fn, gqa=False):
    """Adds each wanted SDPA backend that runs `sample` (else says once that it is skipped)."""
    for name, backend in peers.items():
        if not _wanted(name):
            continue
        fn = wrap(_sdpa(backend, causal, gqa))
        if _works(fn, sample):
            impls[name] = fn
        elif (name, device, what) not in _SKIPPED:
            _SKIPPED.add((name, device, what))
            print(f"{what} on {device}: SDPA's {name} backend does not run ({sample[0].shape[1]} x "
                  f"{sample[0].shape[-1]}); skipped")


def _backward_peer(forward):
    """Autograd through `forward` (q, k, v) for the set's dout, as grad_peer times it."""
    peer = grad_peer(forward)
    return lambda q, k, v, out, lse, dout: peer(q, k, v, dout)


def attention_backward_case(causal):
    def case(seqlen, head_dim, dtype, device):
        batch, heads, check_rows, elt, forward_flops = _geometry(seqlen, head_dim, dtype, device, causal)
        flops = forward_flops * 5 // 2  # 5 GEMMs to the forward's 2

        def make():
            q, k, v = (torch.randn(batch, seqlen, heads, head_dim, device=device, dtype=dtype) for _ in range(3))
            out, lse = llmk.attention(q, k, v, causal=causal, return_lse=True)
            return q, k, v, out, lse, torch.randn_like(out)

        sample = make()
        impls = {"llmk": lambda q, k, v, out, lse, dout: llmk.attention_backward(dout, q, k, v, out, lse, causal)}
        _add_sm80(impls, sample, device, "attention backward", seqlen, head_dim)
        if _wanted("llmk_deterministic"):
            impls["llmk_deterministic"] = lambda q, k, v, out, lse, dout: llmk.attention_backward(
                dout, q, k, v, out, lse, causal, None, True)
        _peers(impls, BACKWARD_PEERS, causal, sample, device, "attention backward", _backward_peer)
        del sample

        dq_reference = _dq_reference(seqlen, check_rows, causal)
        return 8 * batch * seqlen * heads * head_dim * elt, make, impls, \
            lambda q, k, v, out, lse, dout: dq_reference(q, k, v, dout), flops

    return case


def _dq_reference(seqlen, check_rows, causal):
    """(q, k, v, dout) -> (dq of the last rows of head 0, batch entry 0, from float64 math;
    the selection of those rows from an impl's dq)."""
    def reference(q, k, v, dout):
        rows = slice(seqlen - check_rows, seqlen)
        qd, kd, vd, dod = q[0, rows, 0].double(), k[0, :, 0].double(), v[0, :, 0].double(), dout[0, rows, 0].double()
        s = _scores(qd, kd, seqlen, causal)
        p = torch.softmax(s, -1)
        ds = p * (dod @ vd.T - (dod * (p @ vd)).sum(-1, keepdim=True))
        return ds @ kd * qd.shape[-1]**-0.5, lambda dq: dq[0, rows, 0]
    return reference


def attention_train_case(causal):
    """One training step's attention (ops attention_train, attention_train_causal): the forward
    and the backward through autograd, timed together, for llmk.attention (and with
    deterministic=True) and SDPA's pinned backends. FLOPs 3.5x the forward's (2 GEMMs + 5)."""
    def case(seqlen, head_dim, dtype, device):
        batch, heads, check_rows, elt, forward_flops = _geometry(seqlen, head_dim, dtype, device, causal)

        def make():
            q, k, v = (torch.randn(batch, seqlen, heads, head_dim, device=device, dtype=dtype, requires_grad=True)
                       for _ in range(3))
            return q, k, v, torch.randn(batch, seqlen, heads, head_dim, device=device, dtype=dtype)

        def step(forward):
            return lambda q, k, v, dout: torch.autograd.grad(forward(q, k, v), (q, k, v), dout)

        sample = make()
        impls = {"llmk": step(lambda q, k, v: llmk.attention(q, k, v, causal=causal))}
        if _wanted("llmk_deterministic"):
            impls["llmk_deterministic"] = step(lambda q, k, v: llmk.attention(q, k, v, causal=causal,
                                                                              deterministic=True))
        _peers(impls, BACKWARD_PEERS, causal, sample, device, "attention training step", step)
        del sample
        # Bytes: the forward's q, k, v, out and the backward's q, k, v, out, dout, dq, dk, dv.
        return 12 * batch * seqlen * heads * head_dim * elt, make, impls, \
            _dq_reference(seqlen, check_rows, causal), forward_flops * 7 // 2

    return case


GQA_SEQLENS = [4096, 8192, 16384, 32768]
GQA_HEADS = {"cuda": (32, 8), "cpu": (4, 1)}  # (query heads, kv heads): Llama-3-8B's on the GPU


def attention_gqa_case(causal):
    """Grouped-query attention of one sequence (batch 1): q [1, seqlen, 32, D], k and v
    [1, seqlen, 8, D]; llmk reads each KV head for its group of 4 query heads, the SDPA peers
    get the same tensors with enable_gqa=True (a backend that refuses it is skipped)."""
    def case(seqlen, head_dim, dtype, device):
        heads_q, heads_kv = GQA_HEADS[device]
        group = heads_q // heads_kv
        elt = torch.tensor([], dtype=dtype).element_size()
        flops = 4 * heads_q * seqlen * seqlen * head_dim // (2 if causal else 1)
        check_rows = min(CHECK_ROWS, seqlen)

        def make():
            q = torch.randn(1, seqlen, heads_q, head_dim, device=device, dtype=dtype)
            k, v = (torch.randn(1, seqlen, heads_kv, head_dim, device=device, dtype=dtype) for _ in range(2))
            return q, k, v

        sample = make()
        impls = {"llmk": lambda q, k, v: llmk.attention(q, k, v, causal=causal)}
        _add_sm80(impls, sample, device, "attention_gqa", seqlen, head_dim)
        _peers(impls, PEERS, causal, sample, device, "attention_gqa", gqa=True)
        del sample

        def reference(q, k, v):
            """The last rows of query head group - 1 (the first group's last head, KV head 0)."""
            rows = slice(seqlen - check_rows, seqlen)
            qd, kd, vd = q[0, rows, group - 1].double(), k[0, :, 0].double(), v[0, :, 0].double()
            s = _scores(qd, kd, seqlen, causal)
            return torch.softmax(s, -1) @ vd, lambda out: out[0, rows, group - 1]

        return 2 * (heads_q + heads_kv) * seqlen * head_dim * elt, make, impls, reference, flops

    return case


OPS = {"attention": attention_case(False), "attention_causal": attention_case(True),
       "attention_gqa": attention_gqa_case(False), "attention_gqa_causal": attention_gqa_case(True),
       "attention_backward": attention_backward_case(False), "attention_backward_causal": attention_backward_case(True),
       "attention_train": attention_train_case(False), "attention_train_causal": attention_train_case(True)}
SWEEPS = {op: (SEQLENS, BACKWARD_HEAD_DIMS if "backward" in op or "train" in op else HEAD_DIMS) for op in OPS}
SWEEPS.update({op: (GQA_SEQLENS, [128]) for op in ("attention_gqa", "attention_gqa_causal")})
CPU_SWEEPS = {op: ([64, 256], HEAD_DIMS) for op in OPS}  # without a GPU: the CPU backend at small shapes
CPU_SWEEPS.update({op: ([64, 256], [64]) for op in ("attention_gqa", "attention_gqa_causal")})
