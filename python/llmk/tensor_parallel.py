"""llmk.patch on a model that transformers loaded tensor-parallel: the decoder layers' two
all-reduces fused with the residual adds and RMSNorms after them.

Transformers' plan makes attention's o_proj and the MLP's down_proj row-parallel: each rank
multiplies its shard and the projection's forward all-reduces the partial sums (NCCL), after
which the layer adds the residual and normalizes. At inference (no gradient), a patched
Llama-like layer instead has the two projections return their partial sums and runs
:func:`llmk.distributed.all_reduce_add_rmsnorm` on them: after attention with the layer's
post_attention_layernorm, after the MLP with the next layer's input_layernorm (the next layer
takes the normalized input from it instead of normalizing again; the last layer all-reduces
and adds). On CUDA over NCCL that is one llmk kernel per all-reduce where the message fits
(decode), else NCCL's all-reduce and llmk's add_rmsnorm_. With gradients the layers run
transformers' own TP forward (its DTensor autograd).
"""

from typing import Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F

from . import distributed

__all__ = ["row_parallel_group", "patch_layers", "layer_forward"]


def row_parallel_group(linear: torch.nn.Module) -> Optional[dist.ProcessGroup]:
    """The process group of an nn.Linear that a tensor-parallel plan made row-parallel (its
    weight sharded on the input dim over a one-dimensional mesh, no bias, the plan's forward
    installed on the module), else None."""
    if not isinstance(linear, torch.nn.Linear) or "forward" not in linear.__dict__ or linear.bias is not None:
        return None
    from torch.distributed.tensor import DTensor
    w = linear.weight
    if not isinstance(w, DTensor) or w.device_mesh.ndim != 1 or len(w.placements) != 1:
        return None
    placement = w.placements[0]
    if not placement.is_shard() or placement.dim not in (1, -1):
        return None
    return w.device_mesh.get_group()


def _deferred_forward(self, x):
    """A row-parallel projection that a patched layer reduces itself: while the layer runs it
    (``_llmk_defer``), the rank's partial sum; otherwise the plan's forward."""
    if not self._llmk_defer:
        return self._llmk_previous_forward(x)
    return F.linear(x.to_local() if hasattr(x, "to_local") else x, self.weight.to_local())


def patch_layers(model: torch.nn.Module, layers: list, replace_forward, norm_eps) -> int:
    """Marks the Llama-like decoder ``layers`` of a tensor-parallel model whose o_proj and
    down_proj are row-parallel over one group (their forwards replaced through
    ``replace_forward``, which keeps the plan's for unpatch; the next layer's input_layernorm
    eps read once through ``norm_eps``) and sets that group's peer buffers up on CUDA (a
    collective step: every rank patches). Returns how many layers were marked."""
    marked = []
    for layer in layers:
        down_proj = getattr(layer.mlp, "down_proj", None)
        if not isinstance(down_proj, torch.nn.Module):  # a mixture of experts (gpt-oss): the plan's own path
            continue
        projections = (layer.self_attn.o_proj, down_proj)
        groups = {row_parallel_group(p) for p in projections}
        if len(groups) != 1 or None in groups:
            continue
        for p in projections:
            p._llmk_defer = False
            replace_forward(p, _deferred_forward)
        marked.append((layer, groups.pop()))
    for i, (layer, group) in enumerate(marked):
        following = marked[i + 1][0] if i + 1 < len(marked) else None
        layer._llmk_tp = (group, following, norm_eps(following.input_layernorm) if following is not None else None)
    if marked:  # the fused kernel's buffers (2-8 ranks of NCCL on GPUs); else the layers take NCCL's path
        group, device = marked[0][1], next(model.parameters()).device
        if device.type == "cuda" and dist.get_backend(group) == "nccl" and 2 <= dist.get_world_size(group) <= 8:
            distributed.setup_peer_group(group, device)
    return len(marked)


def _partial(projection: torch.nn.Module, run, *args, **kwargs):
    projection._llmk_defer = True
    try:
        return run(*args, **kwargs)
    finally:
        projection._llmk_defer = False


def layer_forward(layer: torch.nn.Module, hidden_states: torch.Tensor, kwargs: dict, eps: float,
                  offset: float) -> torch.Tensor:
    """A marked layer at inference: input_layernorm (or the previous layer's fused one),
    attention's partial sums reduced with the residual add and post_attention_layernorm, the
    MLP's reduced with the next layer's input_layernorm (or all-reduced and added)."""
    group, following, following_eps = layer._llmk_tp
    handed = layer.__dict__.pop("_llmk_normed_input", None)
    normed = handed[1] if handed is not None and handed[0] is hidden_states else layer.input_layernorm(hidden_states)
    attn, _ = _partial(layer.self_attn.o_proj, layer.self_attn, hidden_states=normed, **kwargs)
    attn = attn.contiguous()
    residual = hidden_states.clone(memory_format=torch.contiguous_format)  # the caller's tensor stays
    distributed.all_reduce_add_rmsnorm(attn, residual, layer.post_attention_layernorm.weight, eps, group, offset)
    out = _partial(layer.mlp.down_proj, layer.mlp, attn).contiguous()
    if following is None:
        dist.all_reduce(out, group=group)
        return residual + out
    distributed.all_reduce_add_rmsnorm(out, residual, following.input_layernorm.weight, following_eps, group, offset)
    following._llmk_normed_input = (residual, out)
    return residual
