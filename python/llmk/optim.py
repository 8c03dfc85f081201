"""llmk.optim.AdamW: torch.optim.AdamW's update in one fused multi-tensor kernel launch per
256 tensors of a dtype (torch.ops.llmk.adamw_step_)."""

from typing import Optional

import torch

from . import ops  # noqa: F401  (registers torch.ops.llmk.adamw_step_)


class AdamW(torch.optim.Optimizer):
    """AdamW with decoupled weight decay, as ``torch.optim.AdamW`` (no amsgrad).

    The moments ``exp_avg`` / ``exp_avg_sq`` are float32 for every parameter dtype (bf16 and
    fp16 parameters keep fp32 optimizer state; torch keeps them in the parameter's dtype).
    ``step`` is a float32 tensor on the parameter's device and ``lr`` may be a tensor, so
    ``step()`` can be captured in a CUDA graph and replayed with a changing learning rate.
    Parameters without a gradient are skipped (their step count does not advance)."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 1e-2, *,
                 maximize: bool = False):
        if not isinstance(lr, torch.Tensor) and not 0.0 <= lr:
            raise ValueError(f"Invalid learning rate: {lr}")
        if not 0.0 <= eps:
            raise ValueError(f"Invalid epsilon value: {eps}")
        if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ValueError(f"Invalid beta parameters: {betas}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, maximize=maximize))

    def _lists(self, group):
        """The group's parameters that have gradients, with their state, by device."""
        by_device = {}
        for p in group["params"]:
            if p.grad is None:
                continue
            if p.grad.is_sparse:
                raise RuntimeError("llmk.optim.AdamW does not support sparse gradients")
            state = self.state[p]
            if not state:
                state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
                state["exp_avg"] = torch.zeros_like(p, dtype=torch.float32, memory_format=torch.contiguous_format)
                state["exp_avg_sq"] = torch.zeros_like(p, dtype=torch.float32, memory_format=torch.contiguous_format)
            lists = by_device.setdefault(p.device, ([], [], [], [], []))
            for lst, t in zip(lists, (p, p.grad, state["exp_avg"], state["exp_avg_sq"], state["step"])):
                lst.append(t)
        return by_device.values()

    @torch.no_grad()
    def step(self, closure=None) -> Optional[float]:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            lr = group["lr"]
            lr_tensor = lr if isinstance(lr, torch.Tensor) else None
            for params, grads, exp_avgs, exp_avg_sqs, steps in self._lists(group):
                torch._foreach_add_(steps, 1)
                torch.ops.llmk.adamw_step_(params, grads, exp_avgs, exp_avg_sqs, steps,
                                           0.0 if lr_tensor is not None else float(lr), lr_tensor, beta1, beta2,
                                           float(group["eps"]), float(group["weight_decay"]), bool(group["maximize"]))
        return loss
