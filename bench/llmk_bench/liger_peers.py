"""Liger-Kernel (pure Triton, GPU only) as the benchmark peer ``liger`` wherever it has the op.

Each function returns the peer's callable in the case's argument order, or None where
liger_kernel does not import (not installed, or no GPU): the case then runs without the row,
and the run says once why. Liger-Kernel installs from PyPI (``pip install liger-kernel``; the
device machine takes it as a wheel). The peers are Liger's autograd functions with their
module defaults, except ``in_place=False`` where Liger's RMSNorm would otherwise write its
input gradient over dy: the timed buffers are reused call after call.
"""

import importlib

_STATE = {}


def _import(module):
    """liger_kernel.<module>, or None (said once) where it does not import."""
    if "error" in _STATE:
        return None
    try:
        return importlib.import_module(f"liger_kernel.{module}")
    except Exception as e:  # noqa: BLE001 - any import failure leaves the peer out
        _STATE["error"] = f"{type(e).__name__}: {e}"
        print(f"liger: peer skipped, liger_kernel does not import ({_STATE['error']})", flush=True)
        return None


def functional(name):
    """liger_kernel.transformers.functional.<name>, or None."""
    module = _import("transformers.functional")
    return getattr(module, name) if module is not None else None


def autograd_function(module, name):
    """The autograd Function liger_kernel.ops.<module>.<name>'s apply, or None."""
    ops = _import(f"ops.{module}")
    return getattr(ops, name).apply if ops is not None else None


def rms_norm(eps):
    f = functional("liger_rms_norm")
    return None if f is None else (lambda x, w: f(x, w, eps, in_place=False))


def fused_add_rms_norm(eps):
    f = functional("liger_fused_add_rms_norm")
    return None if f is None else (lambda x, r, w: f(x, r, w, eps, in_place=False))


def layer_norm(eps):
    f = functional("liger_layer_norm")
    return None if f is None else (lambda x, w, b: f(x, w, b, eps))


def swiglu():
    """silu(gate) * up on two tensors."""
    return functional("liger_swiglu")


def silu_and_mul():
    """silu(x[:, :d]) * x[:, d:] on one [tokens, 2d] tensor (Liger's fused gate-up form)."""
    return autograd_function("swiglu", "LigerFusedGateUpSiLUMulFunction")


def gelu_tanh_and_mul():
    """gelu_tanh(x[:, :d]) * x[:, d:]: Liger's GEGLU takes the two halves as tensors."""
    f = functional("liger_geglu")
    if f is None:
        return None

    def run(x):
        gate, up = x.chunk(2, dim=-1)
        return f(gate, up)

    return run


def softmax():
    return functional("liger_softmax")


def rope():
    """Liger's RoPE (Hugging Face's rotate-half) on q, k as [batch, heads, seq, dim] views with
    per-token cos/sin [1, seq, dim] (each half repeated, as Hugging Face builds them)."""
    return functional("liger_rope")


def add(impls, name, peer):
    """impls[name] = peer where the peer exists."""
    if peer is not None:
        impls[name] = peer
    return impls
